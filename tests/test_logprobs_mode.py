"""vLLM's logprobs_mode engine argument (LLM(..., logprobs_mode=...), --logprobs-mode): what logprobs and
prompt_logprobs report. References nobody here wrote: transformers' forward on the same checkpoint for the
logits, transformers' own logits processors and warpers (repetition penalty, temperature, top-k, top-p,
min-p) and torch.nn.functional.log_softmax for what vLLM does with them.

vLLM (vllm/v1/sample/sampler.py, ModelConfig.logprobs_mode): raw_logprobs (the default) is log_softmax of
the model's logits before anything; raw_logits those logits; processed_* the same after the logits
processors and penalties, then (for a sampled request) temperature, min_p, top-k and top-p, the tokens
those drop at -inf; a greedy request (temperature 0) has its top-k, top-p and min_p turned off and no
temperature. Prompt tokens pass through no processor: raw and processed give the raw values for them.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from helpers import one_torch_thread, ref_path, small_engine_args  # noqa: F401 (one_torch_thread: autouse)
from minillm import LLM, SamplingParams
from minillm.sampling_params import LOGPROBS_MODES

PROMPTS = [[1, 2, 3, 4], [7, 8, 9, 10, 11, 12], [20, 21, 22]]  # token ids of tiny-qwen3 (vocabulary 512)
TOL = dict(atol=1e-4, rtol=1e-4)
BIAS = {5: 3.0, 17: -2.0}
# one sampled request per kind of processing, each with a single warper so that the warpers' order
# (transformers: top-k, top-p, min-p; vLLM: min-p first) cannot matter; penalties and a bias on all
SAMPLED = [dict(temperature=0.7, top_k=5, repetition_penalty=1.5, logit_bias=BIAS),
           dict(temperature=1.3, top_p=0.6, repetition_penalty=1.5),
           dict(temperature=0.9, min_p=0.05, repetition_penalty=0.8, logit_bias=BIAS)]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def hf_model():
    return AutoModelForCausalLM.from_pretrained(ref_path("tiny-qwen3"), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engines():
    out = {mode: LLM(ref_path("tiny-qwen3"), logprobs_mode=mode, **small_engine_args()) for mode in LOGPROBS_MODES}
    yield out
    for llm in out.values():
        llm.shutdown()


def reference(hf_model, prompt: list[int], generated: list[int], extra: dict, mode: str) -> list[torch.Tensor]:
    """Per generated token, the [V] values logprobs_mode reports, from transformers' logits of the same
    sequence and its own processors (the logit bias: an addition)."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = hf_model(ids).logits[0].float()
    out = []
    for i in range(len(generated)):
        x = logits[len(prompt) - 1 + i][None].clone()
        if mode.startswith("processed_"):
            for t, b in extra.get("logit_bias", {}).items():
                x[0, t] += b
            seen = ids[:, :len(prompt) + i]
            if extra.get("repetition_penalty", 1.0) != 1.0:
                x = RepetitionPenaltyLogitsProcessor(extra["repetition_penalty"])(seen, x)
            if extra.get("temperature", 1.0) > 0:
                x = TemperatureLogitsWarper(extra.get("temperature", 1.0))(seen, x)
                if extra.get("top_k"):
                    x = TopKLogitsWarper(extra["top_k"])(seen, x)
                if extra.get("top_p"):
                    x = TopPLogitsWarper(extra["top_p"])(seen, x)
                if extra.get("min_p"):
                    x = MinPLogitsWarper(extra["min_p"])(seen, x)
        out.append(x[0] if mode.endswith("_logits") else F.log_softmax(x[0], dim=-1))
    return out


def check_position(position: dict, token: int, want: torch.Tensor, k: int) -> None:
    """One position's {token id: Logprob} against the reference values `want` [V]."""
    assert next(iter(position)) == token  # the chosen token first, as vLLM orders them
    for t, lp in position.items():
        if math.isinf(want[t]):
            assert lp.logprob == float("-inf"), (t, lp)
        else:
            torch.testing.assert_close(torch.tensor(lp.logprob), want[t], **TOL)
    assert position[token].rank == int((want > want[token]).sum()) + 1
    top = want.topk(k)
    if torch.isfinite(top.values).all():  # past the tokens a warper kept, the order of the -inf ones is arbitrary
        assert {t for t, lp in position.items() if lp.rank <= k} >= set(top.indices.tolist())


@pytest.mark.parametrize("mode", LOGPROBS_MODES)
def test_sampled_logprobs_in_each_mode_equal_transformers_and_torch(engines, hf_model, mode):
    """Seeded sampled requests with penalties, a bias, temperature and top-k / top-p / min-p, batched with a
    greedy one: each mode's values are transformers' logits processed (or not) as vLLM's mode says."""
    params = [SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5, seed=11 + i, **extra)
              for i, extra in enumerate(SAMPLED)]
    outs = engines[mode].generate(PROMPTS, params, use_tqdm=False)
    for prompt, out, extra in zip(PROMPTS, outs, SAMPLED):
        got = out.outputs[0]
        want = reference(hf_model, prompt, got.token_ids, extra, mode)
        for token, position, w in zip(got.token_ids, got.logprobs, want):
            check_position(position, token, w, 5)
            assert math.isfinite(position[token].logprob)  # a sampled token was never dropped
        assert got.cumulative_logprob == pytest.approx(sum(float(w[t]) for w, t in zip(want, got.token_ids)),
                                                       abs=1e-3)


def test_the_tokens_do_not_depend_on_the_mode(engines):
    """logprobs_mode changes what is reported, never what is sampled."""
    params = [SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2, seed=5 + i, **extra)
              for i, extra in enumerate(SAMPLED)]
    tokens = {mode: [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
              for mode, llm in engines.items()}
    assert len({str(t) for t in tokens.values()}) == 1, tokens


def test_the_modes_differ_where_vllm_says_they_do(engines):
    """With a penalty, temperature and top-k the four modes give four different numbers; processed_logprobs
    holds -inf for what top-k dropped; raw_logprobs ignores all of it."""
    params = SamplingParams(max_tokens=1, logprobs=8, seed=3, **SAMPLED[0])
    first = {mode: llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
             for mode, llm in engines.items()}
    token = first["raw_logprobs"].token_ids[0]
    values = {mode: out.logprobs[0][token].logprob for mode, out in first.items()}
    assert len({round(v, 4) for v in values.values()}) == 4, values
    processed = first["processed_logprobs"].logprobs[0]
    assert sum(math.isinf(lp.logprob) for lp in processed.values()) >= 8 - 5  # top_k=5 leaves 5 finite
    assert all(math.isfinite(lp.logprob) for lp in first["raw_logprobs"].logprobs[0].values())


def test_a_greedy_request_is_processed_without_top_k_top_p_min_p_or_temperature(engines, hf_model):
    """vLLM turns top-k, top-p and min-p off for temperature 0 and divides by no temperature: processed
    logprobs of a greedy request are its logits after the processors only."""
    extra = dict(temperature=0.0, top_k=2, top_p=0.5, min_p=0.5, repetition_penalty=1.5)
    out = engines["processed_logprobs"].generate(
        [PROMPTS[1]], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=6, **extra),
        use_tqdm=False)[0].outputs[0]
    want = reference(hf_model, PROMPTS[1], out.token_ids, dict(temperature=0.0, repetition_penalty=1.5),
                     "processed_logprobs")
    for token, position, w in zip(out.token_ids, out.logprobs, want):
        check_position(position, token, w, 6)
        assert all(math.isfinite(lp.logprob) for lp in position.values())  # nothing dropped
        assert position[token].rank == 1


@pytest.mark.parametrize("mode", LOGPROBS_MODES)
def test_prompt_logprobs_are_the_raw_values_in_every_mode(engines, hf_model, mode):
    """Prompt tokens go through no processor (vLLM: raw and processed modes give the same for them); a
    logits mode reports the logits, a logprobs mode their log_softmax, whatever the request's sampling."""
    prompt = PROMPTS[1]
    out = engines[mode].generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=3, **SAMPLED[0]),
                                 use_tqdm=False)[0]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt])).logits[0].float()
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        want = logits[pos - 1] if mode.endswith("_logits") else F.log_softmax(logits[pos - 1], dim=-1)
        check_position(out.prompt_logprobs[pos], prompt[pos], want, 3)


def test_the_default_is_vllms_raw_logprobs(engines):
    llm = engines["raw_logprobs"]
    assert llm.config.logprobs_mode == "raw_logprobs"
    from minillm.config import EngineConfig
    assert EngineConfig().logprobs_mode == "raw_logprobs"


@pytest.mark.parametrize("bad", ["processed", "RAW_LOGPROBS", "", None, 1])
def test_a_bad_logprobs_mode_is_a_value_error_naming_the_allowed_values(bad):
    with pytest.raises(ValueError, match=r"logprobs_mode must be one of \['raw_logprobs', 'processed_logprobs', "
                                         r"'raw_logits', 'processed_logits'\]"):
        LLM(ref_path("tiny-qwen3"), logprobs_mode=bad, **small_engine_args())


def test_the_command_line_takes_vllms_flag():
    from minillm.cli import _llm_args, _parser
    args = _parser().parse_args(["serve", "qwen3-tiny", "--logprobs-mode", "processed_logits"])
    assert _llm_args(args)["logprobs_mode"] == "processed_logits"
    assert "logprobs_mode" not in _llm_args(_parser().parse_args(["serve", "qwen3-tiny"]))  # the engine's default
    choices = next(a.choices for a in _parser()._subparsers._group_actions[0].choices["serve"]._actions
                   if a.dest == "logprobs_mode")
    assert tuple(choices) == LOGPROBS_MODES
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["generate", "Hi", "--logprobs-mode", "bad"])
    assert e.value.code == 2
