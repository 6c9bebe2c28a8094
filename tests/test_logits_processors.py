"""The logits processors of SamplingParams (repetition, presence and frequency penalties, min_p,
min_tokens, logit_bias, include_stop_str_in_output) against references nobody here wrote:
transformers' own logits processors on the same logits, and transformers' `generate` on the same
checkpoint. Presence and frequency penalties have no transformers processor: their reference is
OpenAI's published formula, written out below."""
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor, MinPLogitsWarper,
                                                    PrefixConstrainedLogitsProcessor,
                                                    RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
                                                    TemperatureLogitsWarper)

from helpers import ref_path, small_engine_args
from minillm import LLM, SamplingParams
from minillm.engine.model_runner import logits_inputs
from minillm.engine.sequence import PLACEHOLDER_TOKEN, Sequence
from minillm.layers.logits_processors import apply_logits_processors, apply_min_p

V, B = 64, 4
EXACT = dict(atol=0.0, rtol=0.0)
FP32 = dict(atol=1e-6, rtol=1e-6)
PROMPTS = [[1, 2, 3, 4], [7, 8, 9, 10, 11, 12], [20, 21]]  # token ids of tiny-qwen3 (vocabulary 512)
NEW_TOKENS = 12


def seqs_with(params: list[SamplingParams], histories: list[tuple[list[int], list[int]]], blocked=()) -> list:
    """Sequences with these (prompt, output) token histories."""
    out = []
    for p, (prompt, generated) in zip(params, histories):
        s = Sequence(prompt, p, 16, tuple(blocked))
        s.token_ids += generated
        out.append(s)
    return out


def run(logits: torch.Tensor, seqs: list, **device) -> torch.Tensor:
    args = {k: torch.from_numpy(v) for k, v in logits_inputs(seqs, logits.shape[1]).items()}
    return apply_logits_processors(logits, **args, **device)


def random_histories(rng, n: int) -> list[tuple[list[int], list[int]]]:
    return [(rng.integers(0, V, rng.integers(1, 9)).tolist(), rng.integers(0, V, rng.integers(0, 12)).tolist())
            for _ in range(n)]


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_equals_transformers(penalty):
    """Over the prompt and the output, as transformers' processor over its input_ids."""
    rng = np.random.default_rng(0)
    hist = random_histories(rng, B)
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(1))
    got = run(logits, seqs_with([SamplingParams(repetition_penalty=penalty)] * B, hist))
    proc = RepetitionPenaltyLogitsProcessor(penalty)
    for row, (prompt, gen) in enumerate(hist):
        want = proc(torch.tensor([prompt + gen]), logits[row:row + 1].clone())
        torch.testing.assert_close(got[row:row + 1], want, **FP32)


def test_presence_and_frequency_penalties_follow_openais_formula():
    """OpenAI: mu[j] - c[j] * frequency_penalty - float(c[j] > 0) * presence_penalty, c[j] the times
    token j was generated (the prompt does not count)."""
    rng = np.random.default_rng(2)
    hist = random_histories(rng, B)
    params = [SamplingParams(presence_penalty=pp, frequency_penalty=fp)
              for pp, fp in [(0.7, 0.0), (0.0, 0.4), (-1.5, 2.0), (2.0, -0.3)]]
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(3))
    got = run(logits, seqs_with(params, hist))
    for row, ((_, gen), p) in enumerate(zip(hist, params)):
        c = torch.bincount(torch.tensor(gen, dtype=torch.long), minlength=V).float()
        want = logits[row] - c * p.frequency_penalty - (c > 0).float() * p.presence_penalty
        torch.testing.assert_close(got[row], want, **FP32)


@pytest.mark.parametrize("min_p, temperature", [(0.05, 1.0), (0.2, 0.7), (0.5, 1.5), (1.0, 1.0)])
def test_min_p_equals_transformers_after_temperature(min_p, temperature):
    """The same tokens survive as with transformers' temperature then min-p warpers."""
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(4)) * 3
    t = torch.full((B,), temperature)
    got = apply_min_p(logits, torch.full((B,), min_p), t) / temperature
    want = MinPLogitsWarper(min_p)(None, TemperatureLogitsWarper(temperature)(None, logits.clone()))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)], **FP32)


def test_min_p_zero_and_greedy_rows_keep_their_argmax():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    out = apply_min_p(logits, torch.tensor([0.0, 0.3, 0.3]), torch.tensor([1.0, 0.0, 1.0]))
    assert torch.equal(out[0], logits[0])
    assert torch.equal(out.argmax(-1), logits.argmax(-1))


def test_min_tokens_and_logit_bias_equal_transformers():
    """min_tokens bans the blocked tokens until that many are out, as transformers' min-new-tokens
    processor bans EOS; a logit bias adds as its sequence-bias processor does for one-token sequences."""
    eos, bias = 5, {5: 3.5, 17: -2.0, 40: 100.0}
    hist = [([1, 2, 3], []), ([1, 2, 3], [9, 9]), ([4, 4], [1, 2, 3])]
    params = SamplingParams(min_tokens=3, logit_bias=bias)
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(6))
    got = run(logits, seqs_with([params] * 3, hist, blocked=(eos,)))
    seq_bias = SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})
    for row, (prompt, gen) in enumerate(hist):
        ids = torch.tensor([prompt + gen])
        min_new = MinNewTokensLengthLogitsProcessor(len(prompt), 3, eos)
        want = min_new(ids, seq_bias(ids, logits[row:row + 1].clone()))
        torch.testing.assert_close(got[row:row + 1], want, **FP32)


def test_a_placeholder_token_is_taken_from_the_device():
    """Async scheduling: the newest output token is still on the device (PLACEHOLDER_TOKEN on the
    host); last_ids supplies it, and the penalties count it."""
    p = SamplingParams(presence_penalty=1.0, repetition_penalty=2.0)
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(7)).abs() + 1
    with_placeholder = run(logits, seqs_with([p, p], [([1], [2, PLACEHOLDER_TOKEN]), ([3], [])]),
                           last_ids=torch.tensor([30, V]))
    known = run(logits, seqs_with([p, p], [([1], [2, 30]), ([3], [])]))
    torch.testing.assert_close(with_placeholder, known, **EXACT)
    assert with_placeholder[0, 30] == logits[0, 30] / 2 - 1


def test_allowed_token_ids_equal_transformers_prefix_constraint():
    """vLLM's allowed_token_ids: every other token at -inf, as transformers' PrefixConstrainedLogitsProcessor
    does with the same list; a row without the field keeps every token; with a bias, the bias applies too."""
    allowed = [[3, 17, 40], [5], None, [0, 63, 9, 9]]
    params = [SamplingParams(allowed_token_ids=a, logit_bias={17: 2.5} if i == 0 else None)
              for i, a in enumerate(allowed)]
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(8))
    got = run(logits, seqs_with(params, [([1, 2], [])] * B))
    for row, a in enumerate(allowed):
        biased = logits[row:row + 1].clone()
        if row == 0:
            biased[0, 17] += 2.5
        want = biased if a is None else PrefixConstrainedLogitsProcessor(lambda b, ids, a=a: a, 1)(
            torch.tensor([[1, 2]]), biased)
        torch.testing.assert_close(got[row:row + 1], want, **EXACT)


@pytest.fixture(scope="module")
def hf_model():
    return AutoModelForCausalLM.from_pretrained(ref_path("tiny-qwen3"), dtype=torch.float32).eval()


def hf_generate(model, prompt: list[int], **kwargs) -> list[int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0, **kwargs)
    return out[0, len(prompt):].tolist()


def test_engine_repetition_penalty_equals_transformers_generate(hf_model):
    """Greedy, batched, with async scheduling (the newest token is read back a step late)."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, repetition_penalty=1.8)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    plain = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)]
    assert got != plain, "the penalty should change these greedy tokens"
    assert got == [hf_generate(hf_model, p, repetition_penalty=1.8, eos_token_id=None) for p in PROMPTS]
    llm.shutdown()


def test_engine_penalties_equal_a_transformers_loop(hf_model):
    """Presence and frequency penalties: transformers' model step by step, OpenAI's formula on its logits."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, presence_penalty=0.6,
                            frequency_penalty=0.9)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    for prompt, tokens in zip(PROMPTS, got):
        ids, out = list(prompt), []
        for _ in range(NEW_TOKENS):
            with torch.no_grad():
                logits = hf_model(torch.tensor([ids])).logits[0, -1]
            c = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float()
            out.append(int((logits - 0.9 * c - 0.6 * (c > 0).float()).argmax()))
            ids.append(out[-1])
        assert tokens == out
    llm.shutdown()


def test_engine_min_tokens_and_logit_bias_equal_transformers_generate(hf_model):
    """A large bias on EOS ends every request right after min_tokens, as transformers' min_new_tokens
    with the same sequence bias does; the EOS ends the request with finish_reason "stop"."""
    eos = hf_model.config.eos_token_id
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=4, logit_bias={eos: 30.0})
    out = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, o in zip(PROMPTS, out):
        want = hf_generate(hf_model, prompt, min_new_tokens=4, sequence_bias={(eos,): 30.0}, eos_token_id=eos)
        assert o.outputs[0].token_ids == want and len(want) == 5 and want[-1] == eos and o.outputs[0].finish_reason == "stop"
    llm.shutdown()


def test_engine_allowed_token_ids_equal_transformers_generate(hf_model):
    """Greedy within a list of tokens, as transformers' generate with prefix_allowed_tokens_fn; in a batch
    beside an unconstrained request, which keeps its own tokens."""
    allowed = [7, 99, 123, 300, 411]
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    free = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    held = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, allowed_token_ids=allowed)
    out = llm.generate(PROMPTS, [held, free, held], use_tqdm=False)
    for prompt, o, constrained in zip(PROMPTS, out, (True, False, True)):
        want = hf_generate(hf_model, prompt, eos_token_id=None,
                           **({"prefix_allowed_tokens_fn": lambda b, ids: allowed} if constrained else {}))
        assert o.outputs[0].token_ids == want
    assert set(out[0].outputs[0].token_ids) <= set(allowed) and not set(out[1].outputs[0].token_ids) <= set(allowed)
    with pytest.raises(ValueError, match=r"allowed_token_ids names token ids \[512\] outside the vocabulary"):
        llm.generate([PROMPTS[0]], SamplingParams(allowed_token_ids=[3, 512]), use_tqdm=False)
    llm.shutdown()


def test_include_stop_str_in_output():
    llm = LLM("qwen3-tiny", **small_engine_args(max_model_len=128))
    plain = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))[0].outputs[0].text
    stop = plain[5:8]
    start = plain.index(stop)
    for include, want in ((False, plain[:start]), (True, plain[:start + len(stop)])):
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=stop,
                                include_stop_str_in_output=include)
        assert llm.generate("Hello", params)[0].outputs[0].text == want
        assert "".join(llm.stream("Hello", params)) == want
    llm.shutdown()


@pytest.mark.parametrize("field, value, phrase", [
    ("repetition_penalty", 0.0, "a finite number > 0"), ("presence_penalty", 2.5, r"in \[-2, 2\]"),
    ("frequency_penalty", float("nan"), r"in \[-2, 2\]"), ("min_p", 1.5, r"in \[0, 1\]"),
    ("min_tokens", 100, r"in \[0, max_tokens=64\]"), ("logit_bias", {"a": 1.0}, "token id"),
    ("logit_bias", {3: float("inf")}, "finite"), ("include_stop_str_in_output", 1, "True or False"),
    ("allowed_token_ids", [], "non-empty list"), ("allowed_token_ids", [-1], "non-empty list"),
    ("allowed_token_ids", 5, "non-empty list")])
def test_bad_values_name_the_field(field, value, phrase):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be .*{phrase}"):
        SamplingParams(**{field: value})


def test_a_logit_bias_outside_the_vocabulary_is_refused():
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    with pytest.raises(ValueError, match=r"logit_bias names token ids \[512\] outside the vocabulary \[0, 512\)"):
        llm.generate([PROMPTS[0]], SamplingParams(logit_bias={512: 1.0}), use_tqdm=False)
    llm.shutdown()


@pytest.mark.gpu
def test_gpu_graph_steps_with_penalties_equal_transformers(hf_model):
    """On CUDA the decode steps replay graphs; with penalties they sample outside the fused sampler,
    the newest token filled in from the previous replay's samples before this replay overwrites them."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(device="cuda", attention_backend="triton"))
    assert llm.engine.model_runner.graphs is not None
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, repetition_penalty=1.8)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == [hf_generate(hf_model, p, repetition_penalty=1.8, eos_token_id=None) for p in PROMPTS]
    eos = hf_model.config.eos_token_id
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=4, logit_bias={eos: 30.0})
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == [hf_generate(hf_model, p, min_new_tokens=4, sequence_bias={(eos,): 30.0}, eos_token_id=eos)
                   for p in PROMPTS]
    allowed = [7, 99, 123, 300, 411]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, allowed_token_ids=allowed)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == [hf_generate(hf_model, p, eos_token_id=None, prefix_allowed_tokens_fn=lambda b, ids: allowed)
                   for p in PROMPTS]
    llm.shutdown()
