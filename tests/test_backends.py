"""The attention backends against each other: torch (reference), triton (our kernels), flash_attn.

CPU: triton runs in the interpreter; greedy tokens must equal the torch backend's token for token,
with prefix-cache hits and preemption in the mix. flash_attn is tested only where it imports (it is
not installed on the CPU machines nor on the reference H200; see the README's GPU notes).
"""
import sys
import types

import pytest
import torch

from helpers import ref_path, small_engine_args
from minillm import LLM, SamplingParams
from minillm.context import Context
from minillm.kernels.backend import TritonBackend
from minillm.layers.attention import TorchBackend, get_backend
from test_kernels import make_paged

try:
    import flash_attn  # noqa: F401
    FLASH = None
except ImportError as e:
    FLASH = f"flash_attn is not installed ({e})"


def _contexts(lengths_q, lengths_k, block_size, device):
    """Random Qwen-like inputs and the prefill/decode contexts the model runner would build."""
    H, hkv, d = 4, 2, 32
    ks, vs, k_cache, v_cache, _, _, tables = make_paged(lengths_k, hkv, d, block_size, torch.float32, device=device)
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)  # noqa: E731
    return H, d, ks, vs, k_cache, v_cache, tables, cu(lengths_q), cu(lengths_k)


def test_backends_agree_on_prefill_and_decode():
    lengths_k, cached = [40, 7, 33], [32, 0, 16]
    lengths_q = [k - c for k, c in zip(lengths_k, cached)]
    H, d, ks, vs, k_cache, v_cache, tables, cu_q, cu_k = _contexts(lengths_q, lengths_k, 16, "cpu")
    q = torch.randn(sum(lengths_q), H, d)
    hit = Context(is_prefill=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q),
                  max_seqlen_k=max(lengths_k), block_tables=tables, cu_seqlens_q_host=cu_q.tolist(),
                  cu_seqlens_k_host=cu_k.tolist())
    new_k = torch.cat([k[c:] for k, c in zip(ks, cached)])
    new_v = torch.cat([v[c:] for v, c in zip(vs, cached)])
    a = TorchBackend.prefill(q, new_k, new_v, k_cache, v_cache, hit, 0.2)
    b = TritonBackend.prefill(q, new_k, new_v, k_cache, v_cache, hit, 0.2)
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)

    no_hit = Context(is_prefill=True, cu_seqlens_q=cu_k, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_k),
                     max_seqlen_k=max(lengths_k), cu_seqlens_q_host=cu_k.tolist(), cu_seqlens_k_host=cu_k.tolist())
    q_full = torch.randn(sum(lengths_k), H, d)
    a = TorchBackend.prefill(q_full, torch.cat(ks), torch.cat(vs), k_cache, v_cache, no_hit, 0.2)
    b = TritonBackend.prefill(q_full, torch.cat(ks), torch.cat(vs), k_cache, v_cache, no_hit, 0.2)
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)

    lens = torch.tensor(lengths_k, dtype=torch.int32)
    dec = Context(is_prefill=False, context_lens=lens, block_tables=tables, context_lens_host=lengths_k)
    qd = torch.randn(len(lengths_k), H, d)
    torch.testing.assert_close(TorchBackend.decode(qd, k_cache, v_cache, dec, 0.2),
                               TritonBackend.decode(qd, k_cache, v_cache, dec, 0.2), atol=2e-5, rtol=2e-5)


def test_auto_backend_choice(monkeypatch):
    assert get_backend("auto", "cpu") is TorchBackend
    assert get_backend("triton", "cpu") is TritonBackend
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import fails as where it is not installed
    assert get_backend("auto", "cuda") is TritonBackend
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))  # installed ...
    assert get_backend("auto", "cuda", block_size=16) is TritonBackend  # ... but its paged KV needs 256-multiples
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("flash", "cpu")


def _run(backend: str, prompts, max_tokens: int, **engine_args):
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(attention_backend=backend, **engine_args))
    out = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                       use_tqdm=False)
    return [o["token_ids"] for o in out], llm.engine.scheduler


def test_triton_equals_torch_with_prefix_hits_and_preemption():
    """Shared 40-token system prompt (2 full blocks of 16: prefix-cache hits) and a KV cache of 10
    blocks for 4 sequences of ~50-60 tokens (preemption and recomputation)."""
    system = list(range(5, 45))
    prompts = [system + [100 + i] * (3 + 5 * i) for i in range(4)]
    want, _ = _run("torch", prompts, 10, num_kvcache_blocks=10, max_model_len=128)
    got, sched = _run("triton", prompts, 10, num_kvcache_blocks=10, max_model_len=128)
    assert got == want
    assert sched.block_manager.num_cached_tokens_total > 0, "the scenario should hit the prefix cache"
    assert sched.num_preemptions > 0, "the scenario should preempt"


@pytest.mark.gpu
def test_gpu_triton_equals_torch_in_fp32():
    from helpers import greedy_reference
    ref = greedy_reference()
    want, _ = _run("torch", ref["prompts"], ref["max_new_tokens"], device="cuda", dtype="float32")
    got, _ = _run("triton", ref["prompts"], ref["max_new_tokens"], device="cuda", dtype="float32")
    assert got == want


@pytest.mark.gpu
@pytest.mark.skipif(FLASH is not None, reason=FLASH or "")
def test_flash_attn_matches_triton_bf16():
    from minillm.kernels.flash_backend import FlashAttnBackend
    lengths_k, cached = [700, 300, 1024], [512, 0, 256]
    lengths_q = [k - c for k, c in zip(lengths_k, cached)]
    H, d, ks, vs, k_cache, v_cache, tables, cu_q, cu_k = _contexts(lengths_q, lengths_k, 256, "cuda")
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    q = torch.randn(sum(lengths_q), H, d, device="cuda", dtype=torch.bfloat16)
    ctx = Context(is_prefill=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q),
                  max_seqlen_k=max(lengths_k), block_tables=tables)
    new = torch.zeros(0)  # unused on a prefix hit: keys come from the cache
    a = FlashAttnBackend.prefill(q, new, new, k_cache, v_cache, ctx, d ** -0.5)
    b = TritonBackend.prefill(q, new, new, k_cache, v_cache, ctx, d ** -0.5)
    torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
    lens = torch.tensor(lengths_k, dtype=torch.int32, device="cuda")
    dec = Context(is_prefill=False, context_lens=lens, block_tables=tables)
    qd = torch.randn(len(lengths_k), H, d, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(FlashAttnBackend.decode(qd, k_cache, v_cache, dec, d ** -0.5).float(),
                               TritonBackend.decode(qd, k_cache, v_cache, dec, d ** -0.5).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(FLASH is not None, reason=FLASH or "")
def test_flash_attn_engine_runs_and_rejects_small_blocks():
    tokens, _ = _run("flash_attn", [[1, 2, 3] * 100, [7] * 50], 8, device="cuda", dtype="bfloat16",
                     kvcache_block_size=256, max_model_len=512)
    assert [len(t) for t in tokens] == [8, 8]
    with pytest.raises(ValueError, match="multiple of 256"):
        _run("flash_attn", [[1, 2, 3] * 10], 4, device="cuda", dtype="bfloat16", kvcache_block_size=16)
