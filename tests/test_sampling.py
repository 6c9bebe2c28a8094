"""Sampler: greedy, temperature, top-k, top-p and seeds, against the distributions they define."""
import pytest
import torch

from helpers import ref_path, small_engine_args
from minillm import LLM, SamplingParams
from minillm.layers.sampler import Sampler, apply_top_k_top_p


def test_greedy_rows_take_the_argmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    out = Sampler()(logits, torch.zeros(4))
    assert out.tolist() == logits.argmax(-1).tolist()


def test_sampling_follows_softmax_of_logits_over_temperature():
    """Draw 40k samples from one row; the empirical frequencies must match softmax(logits / T)."""
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    T, n = 0.7, 40000
    draws = Sampler()(logits.expand(n, -1).clone(), torch.full((n,), T))
    freq = torch.bincount(draws, minlength=5).double() / n
    want = (logits / T).softmax(-1).double()
    assert torch.allclose(freq, want, atol=0.01), (freq, want)


def test_top_k_and_top_p_filtering():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    k = apply_top_k_top_p(logits, torch.tensor([2, 1]), None)
    assert torch.isinf(k).tolist() == [[False, False, True, True], [True, True, True, False]]
    probs = logits.softmax(-1)[0]  # 0.64, 0.24, 0.09, 0.03
    p = apply_top_k_top_p(logits, None, torch.tensor([0.7, 0.5]))
    assert torch.isinf(p[0]).tolist() == [False, False, True, True]  # 0.64 < 0.7 needs the 2nd token
    assert torch.isinf(p[1]).tolist() == [True, True, True, False]  # 0.64 >= 0.5: only the top token
    assert probs[0] < 0.7


def test_seeded_requests_are_reproducible_and_independent_of_the_batch():
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    p = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=1234)
    alone = llm.generate([5, 6, 7], p, use_tqdm=False)[0].outputs[0].token_ids
    noisy = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batch = llm.generate([[1, 2], [5, 6, 7], [9] * 20], [noisy, p, noisy], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone
    other = llm.generate([5, 6, 7], SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=99),
                         use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone


def test_vllm_spellings_top_k_0_and_negative_seeds():
    """vLLM's top_k=0 means off, as -1 does; its seeds are any int64, negative ones too, but -1 is no seed."""
    assert SamplingParams(top_k=0).top_k == -1
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=-2).seed == -2
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())

    def sample(**kw):
        p = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, **kw)
        return llm.generate([5, 6, 7], p, use_tqdm=False)[0].outputs[0].token_ids

    assert sample(top_k=0, seed=7) == sample(top_k=-1, seed=7)
    negative = sample(seed=-2)
    assert sample(seed=-2) == negative  # a negative seed is a seed: the same tokens twice
    assert sample(seed=-2**63) != negative
    assert len({tuple(sample(seed=-1)) for _ in range(4)}) > 1  # -1: no seed, so the tokens vary


def test_top_k_1_is_greedy():
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    greedy = llm.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    topk1 = llm.generate([5, 6, 7], SamplingParams(temperature=1.5, top_k=1, max_tokens=12, ignore_eos=True),
                         use_tqdm=False)[0]
    assert greedy.outputs[0].token_ids == topk1.outputs[0].token_ids


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2),
                                    dict(top_k=-3), dict(max_tokens=0), dict(seed="x"), dict(stop=[""])])
def test_bad_sampling_params_raise(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
