"""LLM.beam_search (vLLM's API) against transformers' own beam search on the same tiny checkpoint."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import one_torch_thread, ref_path, small_engine_args  # noqa: F401 (a fixture)
from minillm import LLM
from minillm.beam_search import beam_score
from minillm.sampling_params import BeamSearchParams

LOGPROB_ATOL = 1e-4  # fp32 sums of a few logprobs, two implementations


@pytest.fixture(scope="module")
def tiny():
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    yield llm
    llm.shutdown()


def test_beam_search_equals_transformers_beam_search(tiny):
    prompts = [[(7 * i + 3) % 500 + 1 for i in range(37)], [(11 * i + 5) % 400 + 2 for i in range(21)]]
    width, steps = 3, 6
    before = tiny.engine.scheduler.block_manager.num_cached_tokens_total
    outs = tiny.beam_search([{"prompt_token_ids": p} for p in prompts],
                            BeamSearchParams(beam_width=width, max_tokens=steps, ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(ref_path("tiny-qwen3"), dtype=torch.float32)
    for prompt, out in zip(prompts, outs):
        # length_penalty 0: HF's sequences_scores are the beams' summed logprobs; all beams have one length,
        # so the ranking is the same as minillm's default (1.0)
        want = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
                           max_new_tokens=steps, min_new_tokens=steps, length_penalty=0.0, eos_token_id=None,
                           pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        assert [s.tokens for s in out.sequences] == want.sequences.tolist()
        got = torch.tensor([s.cum_logprob for s in out.sequences])
        torch.testing.assert_close(got, want.sequences_scores.float(), atol=LOGPROB_ATOL, rtol=0)
        for s in out.sequences:
            assert s.finish_reason == "length" and len(s.logprobs) == steps and s.text is None  # no tokenizer
    # every step after the first found each beam's full prompt blocks in the prefix cache
    assert tiny.engine.scheduler.block_manager.num_cached_tokens_total - before >= (steps - 1) * width * 16


def test_a_beam_ending_in_eos_is_finished_and_scored_without_it():
    llm = LLM("qwen3-tiny", **small_engine_args())
    prompt = "The cat sat on the"
    n = len(llm.get_tokenizer().encode(prompt))
    free = llm.beam_search(prompt, BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True))[0]
    eos = free.sequences[0].tokens[n]  # the best beam's first token: make it the EOS
    llm.engine.eos_token_ids = {eos}
    for include in (False, True):
        params = BeamSearchParams(beam_width=2, max_tokens=3, include_stop_str_in_output=include)
        seqs = llm.beam_search(prompt, params)[0].sequences
        stopped = [s for s in seqs if s.finish_reason == "stop"]
        assert stopped and all(s.tokens[-1] == eos == s.stop_reason for s in stopped)
        assert all(eos not in s.tokens[n:-1] for s in seqs)  # an EOS ends its beam: nothing follows it
        assert all(s.finish_reason == "length" and len(s.tokens) == n + 3 for s in seqs if s not in stopped)
        scores = [beam_score(s, {eos}, params.length_penalty) for s in seqs]
        assert scores == sorted(scores, reverse=True)
        s = stopped[0]
        assert scores[seqs.index(s)] == pytest.approx(s.cum_logprob / (len(s.tokens) - 1))  # the EOS not counted
        tok = llm.get_tokenizer()
        assert s.text == tok.decode(s.tokens if include else s.tokens[:-1], skip_special_tokens=False)
        assert s.text.startswith(prompt)
    llm.shutdown()


@pytest.mark.parametrize("kwargs, field", [
    (dict(beam_width=0, max_tokens=4), "beam_width"), (dict(beam_width=11, max_tokens=4), "beam_width"),
    (dict(beam_width=2, max_tokens=0), "max_tokens"), (dict(beam_width=2, max_tokens=4, temperature=-1), "temperature"),
    (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty"),
    (dict(beam_width=2, max_tokens=4, ignore_eos=1), "ignore_eos")])
def test_bad_beam_search_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"BeamSearchParams.{field} must be"):
        BeamSearchParams(**kwargs)


def test_beam_search_refuses_what_cannot_fit_before_any_work(tiny):
    with pytest.raises(ValueError, match="together more than max_model_len 256; lower max_tokens"):
        tiny.beam_search([1] * 250, BeamSearchParams(beam_width=2, max_tokens=7))
    with pytest.raises(ValueError, match="params must be a BeamSearchParams"):
        tiny.beam_search([1, 2, 3], {"beam_width": 2, "max_tokens": 4})
    with pytest.raises(ValueError, match=r"BeamSearchParams go to llm.beam_search\(prompts, params\)"):
        tiny.generate([1, 2, 3], BeamSearchParams(beam_width=2, max_tokens=4))
    assert not tiny.engine.requests


def test_concurrency_limit_searches_a_few_prompts_at_a_time_to_the_same_beams(tiny):
    """vLLM's concurrency_limit: the prompts go in groups of that many; each prompt's search is its own."""
    prompts = [{"prompt_token_ids": [(5 * i + j) % 300 + 1 for i in range(9 + j)]} for j in range(3)]
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    together = tiny.beam_search(prompts, params)
    calls = []
    generate = tiny._generate
    tiny._generate = lambda batch, step, **kw: calls.append(len(batch)) or generate(batch, step, **kw)
    try:
        apart = tiny.beam_search(prompts, params, concurrency_limit=2, lora_request=None)
    finally:
        del tiny._generate
    assert [[s.tokens for s in o.sequences] for o in apart] == [[s.tokens for s in o.sequences] for o in together]
    assert calls == [2, 4, 4, 1, 2, 2]  # two prompts' beams a step, then the third's
    with pytest.raises(ValueError, match="concurrency_limit must be an integer >= 1"):
        tiny.beam_search(prompts, params, concurrency_limit=0)
    with pytest.raises(ValueError, match="minillm serves no LoRA adapters"):
        tiny.beam_search(prompts, params, lora_request=object())
