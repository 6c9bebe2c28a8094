"""What generate returns (vLLM's RequestOutput / CompletionOutput), n > 1 samples that fork one
prompt's KV blocks, and logprobs, against references nobody here wrote: transformers' generate with
output_scores, its forward's logits, and independent single-sample requests."""
import time
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import ref_path, small_engine_args
from minillm import LLM, SamplingParams
from minillm.outputs import CompletionOutput, Logprob, RequestOutput

PROMPTS = [[1, 2, 3, 4], [7, 8, 9, 10, 11, 12], [20, 21]]  # token ids of tiny-qwen3 (vocabulary 512)
LONG_PROMPT = [(7 * i + 3) % 500 for i in range(100)]  # 6 full blocks of 16 and a partial one
NEW_TOKENS = 10
LOGPROB_TOL = dict(atol=1e-4, rtol=1e-4)  # fp32 logits of two implementations of one model


@pytest.fixture(scope="module")
def hf_model():
    return AutoModelForCausalLM.from_pretrained(ref_path("tiny-qwen3"), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm():
    engine = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    yield engine
    engine.shutdown()


def test_a_vllm_users_snippet_runs_unchanged(llm):
    outs = llm.generate(PROMPTS, SamplingParams(n=2, logprobs=3, max_tokens=16))
    assert isinstance(outs, list) and len(outs) == len(PROMPTS) and isinstance(outs[0], RequestOutput)
    assert isinstance(outs[0].outputs[1].text, str) and [o.index for o in outs[0].outputs] == [0, 1]
    first = outs[0].outputs[0]
    assert isinstance(first, CompletionOutput) and len(first.logprobs) == len(first.token_ids) == 16
    for token, position in zip(first.token_ids, first.logprobs):
        assert next(iter(position)) == token and 3 <= len(position) <= 4  # the chosen one first, then the top 3
        assert all(isinstance(lp, Logprob) and lp.logprob <= 0 and lp.rank >= 1 for lp in position.values())
    assert first.cumulative_logprob == pytest.approx(sum(p[t].logprob for t, p in zip(first.token_ids, first.logprobs)))
    out = outs[1]
    assert out.prompt is None and out.prompt_token_ids == PROMPTS[1] and out.finished and out.prompt_logprobs is None
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    one = llm.generate([5, 6, 7], SamplingParams(max_tokens=3), use_tqdm=False)  # one prompt: still a list
    assert len(one) == 1 and one[0].prompt is None and len(one[0].outputs) == 1


def test_first_scheduled_is_stamped_before_the_prefill_is_launched(llm, monkeypatch):
    """vLLM's first_scheduled_time: when the scheduler picked the request, so the prefill's own launch
    falls between it and the first token (notebook 06 reads the gaps that way)."""
    runner, slow_s = llm.engine.model_runner, 0.5
    launch = runner.launch

    def slow_launch(*args, **kwargs):
        time.sleep(slow_s)
        return launch(*args, **kwargs)

    monkeypatch.setattr(runner, "launch", slow_launch)
    m = llm.generate([5, 6, 7], SamplingParams(max_tokens=2), use_tqdm=False)[0].metrics
    assert m.first_scheduled_time - m.arrival_time < slow_s <= m.first_token_time - m.first_scheduled_time


def test_generate_builds_each_output_when_its_request_finishes(llm, monkeypatch):
    """A short request's output (its text detokenized) is built at the step it finishes, while the longer
    ones still run (on a GPU, while the device runs the step just launched), not all after the last step."""
    engine, built_at = llm.engine, {}
    real = engine.request_output

    def spy(seq, prompt=None):
        built_at[seq.prompt_token_ids[0]] = engine.num_decode_tokens  # decode tokens computed so far
        return real(seq, prompt)
    monkeypatch.setattr(engine, "request_output", spy)
    outs = llm.generate(PROMPTS, [SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 12, 6)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 12, 6]
    assert all(o.finished and isinstance(o.outputs[0].text, str) for o in outs)
    at = [built_at[p[0]] for p in PROMPTS]
    assert at[0] < at[2] < at[1] == engine.num_decode_tokens, at


def test_the_old_dict_keys_still_read_with_a_deprecation_warning(llm):
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)[0]
    with pytest.warns(DeprecationWarning, match=r"use out.outputs\[0\].token_ids"):
        assert out["token_ids"] == out.outputs[0].token_ids
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert (out["text"], out["finish_reason"]) == (out.outputs[0].text, "length")
    with pytest.raises(KeyError, match="not a dict"):
        out["outputs"]


def test_unknown_and_bad_fields_raise_value_errors_that_list_the_fields():
    with pytest.raises(ValueError, match=r"no field best_of; its fields are temperature, .*, n, logprobs"):
        SamplingParams(best_of=2)
    for kwargs, phrase in [(dict(n=0), "SamplingParams.n must be"), (dict(logprobs=-1), "logprobs must be"),
                           (dict(prompt_logprobs=21), "prompt_logprobs must be"), (dict(n=True), "n must be")]:
        with pytest.raises(ValueError, match=phrase):
            SamplingParams(**kwargs)


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_logprobs_equal_transformers_generate_logits_and_scores(llm, hf_model, mode):
    """Greedy, batched, with async scheduling; also with a repetition penalty. vLLM's default logprobs_mode,
    raw_logprobs, is log_softmax of the model's own logits: transformers' generate returns them as
    output_logits; processed_logprobs is log_softmax after the processors: transformers' output_scores
    (a greedy request has no temperature, top-k or top-p to apply, in vLLM as here)."""
    engine = llm if mode == "raw_logprobs" else LLM(ref_path("tiny-qwen3"), logprobs_mode=mode, **small_engine_args())
    try:
        for extra in ({}, {"repetition_penalty": 1.8}):
            params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5, **extra)
            outs = engine.generate(PROMPTS, params, use_tqdm=False)
            for prompt, out in zip(PROMPTS, outs):
                hf = hf_model.generate(torch.tensor([prompt]),
                                       attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
                                       max_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None, output_scores=True,
                                       output_logits=True, return_dict_in_generate=True, **extra)
                got = out.outputs[0]
                assert got.token_ids == hf.sequences[0, len(prompt):].tolist()
                steps = hf.logits if mode == "raw_logprobs" else hf.scores
                for token, position, scores in zip(got.token_ids, got.logprobs, steps):
                    want = torch.log_softmax(scores[0].float(), dim=-1)
                    top = want.topk(5)
                    ids = [t for t in position if t != token or position[t].rank <= 5][:5]
                    assert sorted(ids) == sorted(top.indices.tolist())
                    torch.testing.assert_close(torch.tensor([position[t].logprob for t in top.indices.tolist()]),
                                               top.values, **LOGPROB_TOL)
                    torch.testing.assert_close(torch.tensor(position[token].logprob), want[token], **LOGPROB_TOL)
                    assert position[token].rank == int((want > want[token]).sum()) + 1
                    if not extra or mode == "processed_logprobs":
                        assert position[token].rank == 1  # greedy: the argmax of what it was picked from
                assert got.cumulative_logprob == pytest.approx(
                    sum(float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(steps, got.token_ids)), abs=1e-3)
    finally:
        if engine is not llm:
            engine.shutdown()


def test_prompt_logprobs_equal_transformers_forward(llm, hf_model):
    prompt = LONG_PROMPT[:40]
    out = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    with torch.no_grad():
        want = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0], dim=-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        entry, row, token = out.prompt_logprobs[pos], want[pos - 1], prompt[pos]
        assert next(iter(entry)) == token
        torch.testing.assert_close(torch.tensor(entry[token].logprob), row[token], **LOGPROB_TOL)
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        for t in row.topk(2).indices.tolist():
            torch.testing.assert_close(torch.tensor(entry[t].logprob), row[t], **LOGPROB_TOL)
    # the same prompt again: prompt_logprobs skips the prefix cache, so every position is scored again
    again = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    assert again.prompt_logprobs == out.prompt_logprobs and again.num_cached_tokens == 0


def used_blocks(llm) -> int:
    bm = llm.engine.scheduler.block_manager
    return len(bm.blocks) - bm.num_free_blocks


def test_n_samples_share_the_prompts_blocks_and_copy_the_last_on_write():
    """n=4 on a 100-token prompt (6 full blocks of 16 and a partial one): the prompt's blocks are
    allocated once; at the first decode step 3 samples copy the shared partial block (the 4th writes
    in place), so 7 + 3 blocks are in use, not 4 x 7."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(enable_prefix_caching=False, async_scheduling=False))
    engine = llm.engine
    # top_k=1 samples the greedy token: n greedy samples at temperature 0 are refused, as vLLM refuses them
    parent = engine.add_request(LONG_PROMPT, SamplingParams(n=4, top_k=1, max_tokens=8, ignore_eos=True))
    engine.step()  # the prefill: the prompt computed once, the 4 samples forked from it
    samples = parent.samples
    assert len(samples) == 4 and used_blocks(llm) == 7
    assert all(s.block_table == parent.block_table for s in samples)
    assert engine.num_prefill_tokens == len(LONG_PROMPT)
    engine.step()  # the first decode step: copy on write
    assert used_blocks(llm) == 10
    assert len({s.block_table[-1] for s in samples}) == 4 and all(s.block_table[:6] == parent.block_table[:6]
                                                                   for s in samples)
    while not engine.is_finished():
        engine.step()
    assert used_blocks(llm) == 0
    out = engine.request_output(parent)
    alone = llm.generate([LONG_PROMPT], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0]
    assert [o.token_ids for o in out.outputs] == [alone.token_ids] * 4
    llm.shutdown()


@pytest.mark.parametrize("settings", [{}, {"async_scheduling": False}, {"num_kvcache_blocks": 17}],
                         ids=["async", "sync", "preempting"])
def test_each_forked_sample_equals_its_own_request(settings):
    """Sample i of a seeded request samples with seed + i: it must give exactly what a request of its
    own with that seed gives (its first token comes from the shared prefill, its K/V from the copied
    block). With a small KV cache the samples are preempted and recomputed too."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(**settings))
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=24, ignore_eos=True)
    prompts = [LONG_PROMPT, PROMPTS[1]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    if "num_kvcache_blocks" in settings:
        assert llm.engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs):
        for i, sample in enumerate(out.outputs):
            alone = llm.generate([prompt], SamplingParams(temperature=1.0, seed=11 + i, max_tokens=24, ignore_eos=True),
                                 use_tqdm=False)[0].outputs[0]
            assert sample.token_ids == alone.token_ids and sample.index == i
        assert len({tuple(s.token_ids) for s in out.outputs}) > 1  # the samples differ
    assert used_blocks(llm) == 0
    llm.shutdown()


def test_more_samples_than_max_num_seqs_queue_as_their_own_sequences():
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(max_num_seqs=3))
    out = llm.generate([PROMPTS[0]], SamplingParams(n=5, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True),
                       use_tqdm=False)[0]
    for i, sample in enumerate(out.outputs):
        alone = llm.generate([PROMPTS[0]], SamplingParams(temperature=1.0, seed=3 + i, max_tokens=6, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0]
        assert sample.token_ids == alone.token_ids
    llm.shutdown()


def test_aborting_a_request_ends_all_its_samples(llm):
    engine = llm.engine
    parent = engine.add_request(PROMPTS[0], SamplingParams(n=3, max_tokens=50, ignore_eos=True))
    engine.abort(parent)  # before its prompt ran: the waiting samples end too
    assert all(s.finish_reason == "abort" for s in parent.samples) and engine.is_finished()
    parent = engine.add_request(PROMPTS[0], SamplingParams(n=3, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    for s in parent.samples:
        engine.abort(s)
    assert engine.request_output(parent).finished and used_blocks(llm) == 0
    while not engine.is_finished():
        engine.step()


def test_stop_reason_names_the_stop_string_or_token(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    full = llm.generate([PROMPTS[1]], greedy, use_tqdm=False)[0].outputs[0]
    token = full.token_ids[3]
    out = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                    stop_token_ids=[token]), use_tqdm=False)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", token)
    assert full.stop_reason is None and full.finish_reason == "length"
    qwen = LLM("qwen3-tiny", **small_engine_args())
    full = qwen.generate("Once upon a time", greedy, use_tqdm=False)
    assert len(full) == 1 and full[0].prompt == "Once upon a time"  # a text prompt is kept
    text = full[0].outputs[0].text
    stop = text[len(text) // 2:][:3]
    out = qwen.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                           stop=["zzzz", stop]), use_tqdm=False)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    qwen.shutdown()


def test_stream_refuses_several_samples(llm):
    with pytest.raises(ValueError, match="stream\\(\\) streams one sample; got SamplingParams.n=2"):
        llm.stream([1, 2, 3], SamplingParams(n=2))


@pytest.mark.gpu
def test_gpu_forked_samples_and_logprobs_in_graph_steps():
    """On CUDA: the fused sampler's seeded keys, graphs replaying decode steps after copy-on-write
    copies, and logprobs sampled outside the graph."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(device="cuda", attention_backend="triton"))
    assert llm.engine.model_runner.graphs is not None
    out = llm.generate([LONG_PROMPT], SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=20, ignore_eos=True),
                       use_tqdm=False)[0]
    for i, sample in enumerate(out.outputs):
        alone = llm.generate([LONG_PROMPT], SamplingParams(temperature=1.0, seed=5 + i, max_tokens=20,
                                                           ignore_eos=True), use_tqdm=False)[0].outputs[0]
        assert sample.token_ids == alone.token_ids
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2),
                          use_tqdm=False)
    plain = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True),
                         use_tqdm=False)
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in plain]
    assert all(p[t].rank == 1 for o in greedy for t, p in zip(o.outputs[0].token_ids, o.outputs[0].logprobs))
    llm.shutdown()


def test_samples_fork_after_the_last_chunk_and_prompt_logprobs_span_chunks():
    """With chunked prefill (a 100-token prompt in chunks of 32) the samples fork in the step of the
    prompt's last chunk, and prompt_logprobs gathers every chunk's positions: both as without chunks."""
    params = SamplingParams(n=3, temperature=1.0, seed=4, max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    outs = {}
    for budget in (512, 32):
        llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(max_num_batched_tokens=budget))
        outs[budget] = llm.generate([LONG_PROMPT, PROMPTS[0]], params, use_tqdm=False)
        assert used_blocks(llm) == 0
        llm.shutdown()
    for chunked, whole in zip(outs[32], outs[512]):
        assert [o.token_ids for o in chunked.outputs] == [o.token_ids for o in whole.outputs]
        assert len(chunked.prompt_logprobs) == len(chunked.prompt_token_ids)
        for a, b in zip(chunked.prompt_logprobs[1:], whole.prompt_logprobs[1:]):
            assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)
