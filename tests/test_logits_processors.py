"""The logits processors of SamplingParams (repetition, presence and frequency penalties, min_p,
min_tokens, logit_bias, allowed_token_ids, bad_words, include_stop_str_in_output) against references
nobody here wrote: transformers' own logits processors on the same logits, and transformers'
`generate` on the same checkpoint. Presence and frequency penalties have no transformers processor:
their reference is OpenAI's published formula, written out below. Also truncate_prompt_tokens, which
cuts the prompt before the request is queued: against generating from the cut ids."""
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor, MinPLogitsWarper,
                                                    NoBadWordsLogitsProcessor, PrefixConstrainedLogitsProcessor,
                                                    RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
                                                    TemperatureLogitsWarper)

from helpers import ref_path, small_engine_args
from minillm import LLM, SamplingParams
from minillm.engine.model_runner import logits_inputs
from minillm.engine.sequence import PLACEHOLDER_TOKEN, Sequence
from minillm.layers.logits_processors import apply_logits_processors, apply_min_p
from minillm.model_zoo import resolve_model

V, B = 64, 4
EXACT = dict(atol=0.0, rtol=0.0)
FP32 = dict(atol=1e-6, rtol=1e-6)
PROMPTS = [[1, 2, 3, 4], [7, 8, 9, 10, 11, 12], [20, 21]]  # token ids of tiny-qwen3 (vocabulary 512)
NEW_TOKENS = 12


def seqs_with(params: list[SamplingParams], histories: list[tuple[list[int], list[int]]], blocked=(),
              bad_words_ids=()) -> list:
    """Sequences with these (prompt, output) token histories (and these bad words' token sequences)."""
    out = []
    for p, (prompt, generated) in zip(params, histories):
        s = Sequence(prompt, p, 16, tuple(blocked), bad_words_ids=tuple(map(tuple, bad_words_ids)))
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


BAD_WORDS = [[5], [10, 20], [30, 31, 32], [40, 41], [50, 51, 52, 53]]


def test_bad_words_equal_transformers_processor():
    """Where each bad word's prefix fits in the output, vLLM's rule (only generated tokens count) and
    transformers' NoBadWordsLogitsProcessor (over the prompt and the output) agree: a one-token word is
    always banned, a longer word's last token right after the rest of it."""
    hist = [([1, 2], [9, 9, 10]),            # ends in [10]: bans 20 (and 5, as every row)
            ([3], [8, 30, 31]),              # ends in [30, 31]: bans 32
            ([30, 4], [29, 40, 31]),         # 40 and 31, not at the end: only 5
            ([6, 7], [50, 51, 52]),          # ends in [50, 51, 52]: bans 53
            ([8], [40, 41, 40])]             # ends in [40]: bans 41
    params = [SamplingParams(bad_words=["x"])] * len(hist)  # (the sequences' token ids are given directly)
    logits = torch.randn(len(hist), V, generator=torch.Generator().manual_seed(11))
    got = run(logits, seqs_with(params, hist, bad_words_ids=BAD_WORDS))
    proc = NoBadWordsLogitsProcessor(BAD_WORDS)
    for row, (prompt, gen) in enumerate(hist):
        want = proc(torch.tensor([prompt + gen]), logits[row:row + 1].clone())
        torch.testing.assert_close(got[row:row + 1], want, **EXACT)
    assert torch.isinf(got).sum(dim=1).tolist() == [2, 2, 1, 2, 2]


def test_bad_words_count_only_generated_tokens_as_vllm_does():
    """vLLM matches a bad word's prefix against the generated tokens only (its sampler passes
    output_token_ids; a prefix longer than the output bans nothing). transformers' processor reads the
    prompt too: these prompts end in a prefix, which bans the last token there and not here."""
    hist = [([1, 10], []), ([2, 30], [31]), ([30, 31], [])]
    logits = torch.randn(len(hist), V, generator=torch.Generator().manual_seed(12))
    got = run(logits, seqs_with([SamplingParams(bad_words=["x"])] * 3, hist, bad_words_ids=BAD_WORDS))
    assert torch.isinf(got).sum(dim=1).tolist() == [1, 1, 1]  # token 5 only
    proc = NoBadWordsLogitsProcessor(BAD_WORDS)
    hf = [proc(torch.tensor([p + g]), logits[r:r + 1].clone()) for r, (p, g) in enumerate(hist)]
    assert [int(torch.isinf(h).sum()) for h in hf] == [2, 2, 2]


def test_a_bad_word_ending_in_a_placeholder_is_matched_on_the_device():
    """Async scheduling: the newest output token is still on the device (PLACEHOLDER_TOKEN). A word's
    prefix is matched on the host up to it and on the device on it: the bans of the known tokens. Row 0:
    two words end in 20, after 10 and after 11; only the first matches."""
    words = [[10, 20], [11, 20], [3, 4, 5], [9, 4, 6], [7]]
    p = SamplingParams(bad_words=["x"])
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(13))
    pending = [([1], [3, PLACEHOLDER_TOKEN])] * 3 + [([2], [3, 4])]
    with_placeholder = run(logits, seqs_with([p] * 4, pending, bad_words_ids=words),
                           last_ids=torch.tensor([10, 11, 4, V]))
    known = run(logits, seqs_with([p] * 4, [([1], [3, 10]), ([1], [3, 11]), ([1], [3, 4]), ([2], [3, 4])],
                                  bad_words_ids=words))
    torch.testing.assert_close(with_placeholder, known, **EXACT)
    assert [torch.isinf(r).nonzero().flatten().tolist() for r in known] == [[7, 20], [7, 20], [5, 7], [5, 7]]


def test_bad_words_tokenize_as_vllm_does():
    """vLLM's SamplingParams.update_from_tokenizer, on Qwen's tokenizer (transformers' own): each word
    with its leading spaces stripped, then after one space, kept when that gives as many tokens and
    another first token; a repeated word once."""
    tok = AutoTokenizer.from_pretrained(resolve_model("qwen3-tiny"))
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert len(enc("freak")) == 2 and len(enc(" freak")) == 1  # the spaced form of another length: left out
    assert enc("Hello world")[1:] == enc(" Hello world")[1:] and enc("Hello world")[0] != enc(" Hello world")[0]
    for words, want in [(["Hello world"], [enc("Hello world"), enc(" Hello world")]),
                        (["  hello", "hello", "hello"], [enc("hello"), enc(" hello")] * 2),
                        ([" freak"], [enc("freak")])]:
        assert SamplingParams(bad_words=words).bad_words_token_ids(tok) == want, words


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


@pytest.fixture(scope="module")
def qwen_hf():
    """qwen3-tiny (a random Qwen3 with Qwen's vocabulary, for text) in transformers, fp32, and its tokenizer."""
    path = resolve_model("qwen3-tiny")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def contains(tokens: list[int], seq: list[int]) -> bool:
    return any(tokens[i:i + len(seq)] == seq for i in range(len(tokens)))


@pytest.mark.parametrize("engine", [
    {"async_scheduling": True}, {"async_scheduling": False},
    pytest.param({"device": "cuda", "attention_backend": "triton"}, marks=pytest.mark.gpu)],
    ids=["async", "sync", "cuda-graphs"])
def test_engine_bad_words_equal_transformers_generate(qwen_hf, engine):
    """Greedy with bad words, batched beside a request without them, equals transformers' generate with
    bad_words_ids = the same token sequences: a two-token word the unconstrained output holds (its last
    token banned right after its first: with async scheduling that first token is still on the device)
    and a one-token word. No sequence starts with a prompt token, so transformers (which reads the
    prompt too) and vLLM (the output only) agree by construction. On CUDA the decode steps replay
    graphs and the banned steps sample outside the fused sampler, the newest token from the last replay."""
    model, tok = qwen_hf
    llm = LLM("qwen3-tiny", **small_engine_args(**engine))
    assert engine.get("device") != "cuda" or llm.engine.model_runner.graphs is not None
    prompts = [tok.encode(p) for p in ("The capital of France is", "Once upon a time")]
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    free = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    in_prompts = {t for p in prompts for t in p}

    def word_for(tokens: list[int]) -> str | None:
        """The text of tokens, when vLLM's rule tokenizes it back to them and to no sequence that starts
        with a prompt token."""
        word = tok.decode(tokens)
        seqs = SamplingParams(bad_words=[word]).bad_words_token_ids(tok)
        return word if tokens in seqs and not in_prompts & {s[0] for s in seqs} else None

    two = next(w for i in range(NEW_TOKENS - 1) if (w := word_for(free[0][i:i + 2])))
    one = next(w for t in free[1] if (w := word_for([t])))
    bad = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, bad_words=[two, one])
    got = [o.outputs[0].token_ids for o in llm.generate(prompts + prompts[:1], [bad, bad, greedy], use_tqdm=False)]
    ids = bad.bad_words_token_ids(tok)
    assert got[:2] == [hf_generate(model, p, bad_words_ids=ids, eos_token_id=None) for p in prompts]
    assert got[0] != free[0] and got[1] != free[1] and got[2] == free[0]
    assert not any(contains(g, s) for g in got[:2] for s in ids)
    llm.shutdown()


def test_engine_bad_words_ignore_the_prompt_as_vllm_does(qwen_hf):
    """Where vLLM and transformers differ, minillm follows vLLM: a bad word's prefix is matched against
    the generated tokens only (vLLM's sampler passes output_token_ids; its V2 kernel returns when the
    prefix is longer than the output), while transformers' bad_words_ids read the prompt too. A word
    made of the prompt's last token and the first token greedy generates: minillm still generates that
    token, transformers bans it."""
    model, tok = qwen_hf
    prompt = tok.encode("The capital of France is")
    llm = LLM("qwen3-tiny", **small_engine_args())
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    free = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    bad = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                         bad_words=[tok.decode([prompt[-1], free[0]])])
    ids = bad.bad_words_token_ids(tok)
    assert [prompt[-1], free[0]] in ids and not any(contains(free, s) for s in ids)
    assert llm.generate([prompt], bad, use_tqdm=False)[0].outputs[0].token_ids == free
    assert hf_generate(model, prompt, bad_words_ids=ids, eos_token_id=None)[0] != free[0]
    llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_truncate_prompt_tokens_equals_generating_from_the_kept_ids(async_scheduling):
    """vLLM's left truncation, before the request is queued: the same tokens as a request for the
    prompt's last k ids, and RequestOutput.prompt_token_ids are those (the engine's prompt, as vLLM
    returns it). -1 keeps max_model_len - max_tokens, so a prompt longer than the context runs; n
    samples share the cut prompt."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(async_scheduling=async_scheduling))
    limit = llm.config.max_model_len
    long = [1 + i % 500 for i in range(limit + 40)]
    greedy = dict(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    sampled = dict(temperature=1.0, seed=3, n=2, max_tokens=NEW_TOKENS, ignore_eos=True)
    cases = [(PROMPTS[1], 3, greedy), (PROMPTS[0], 10, greedy), (long, -1, greedy), (PROMPTS[1], 4, sampled)]
    kept = [PROMPTS[1][-3:], PROMPTS[0], long[-(limit - NEW_TOKENS):], PROMPTS[1][-4:]]
    got = llm.generate([p for p, _, _ in cases], [SamplingParams(truncate_prompt_tokens=k, **kw) for _, k, kw in cases],
                       use_tqdm=False)
    want = llm.generate(kept, [SamplingParams(**kw) for _, _, kw in cases], use_tqdm=False)
    assert [o.prompt_token_ids for o in got] == kept
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in want]
    with pytest.raises(ValueError, match=rf"truncate_prompt_tokens must be at most max_model_len - max_tokens = "
                                         rf"{limit} - {NEW_TOKENS} = {limit - NEW_TOKENS} \(-1 keeps that many\), "
                                         rf"got {limit}"):
        llm.generate([long], SamplingParams(truncate_prompt_tokens=limit, **greedy), use_tqdm=False)
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
    ("allowed_token_ids", 5, "non-empty list"), ("bad_words", [""], "non-space character"),
    ("bad_words", "hello", "a list of"), ("truncate_prompt_tokens", 0, "an integer >= 1"),
    ("truncate_prompt_tokens", -2, "None, -1")])
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
