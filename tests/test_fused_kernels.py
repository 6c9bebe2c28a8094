"""Chapter 5's fused kernels (QK-norm + RoPE, SiLU-and-mul, batch-1 GEMVs) against the torch ops they replace.
On CPU they run in Triton's interpreter (fp32); on CUDA also in bf16."""
import math
import os

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from minillm.kernels.qk_norm_rope import qk_norm_rope
from minillm.kernels.silu_mul import silu_and_mul_triton
from minillm.layers.layernorm import rms_norm
from minillm.layers.rotary import apply_rotary, rope_cos_sin

# Triton runs on CPU tensors only in its interpreter (conftest turns it on for the CPU suite); the CUDA
# cases are gpu tests, which run where the kernels are compiled (`pytest -m gpu`)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")
DEVICES = (["cpu"] if INTERPRETED else []) + ([CUDA] if torch.cuda.is_available() else [])
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _cases():
    if INTERPRETED:
        yield "cpu", torch.float32
    if torch.cuda.is_available():
        for dtype in (torch.float32, torch.bfloat16):
            yield pytest.param("cuda", dtype, marks=pytest.mark.gpu, id=f"cuda-{dtype}")


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("H, Hkv, D", [(4, 2, 32), (16, 8, 128)])
@pytest.mark.parametrize("N", [9, 37])  # one block of tokens, and several with a partial last one
def test_qk_norm_rope_matches_torch_layers(device, dtype, norm, H, Hkv, D, N):
    g = torch.Generator().manual_seed(H * D + norm)
    qkv = torch.randn(N, (H + 2 * Hkv) * D, generator=g).to(device, dtype)
    pos = torch.tensor([0, 5, 3, 100, 2, 7, 9, 511, 64] * 5, device=device)[:N]
    cs = rope_cos_sin(D, 512, 1e6).to(device)
    qw = torch.randn(D, generator=g).to(device, dtype)
    kw = torch.randn(D, generator=g).to(device, dtype)
    q, k, v = qk_norm_rope(qkv, pos, cs, H, Hkv, D, qw if norm else None, kw if norm else None)
    rq, rk, rv = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    rq, rk = rq.reshape(N, H, D), rk.reshape(N, Hkv, D)
    if norm:
        rq, rk = rms_norm(rq, qw, 1e-6), rms_norm(rk, kw, 1e-6)
    rq, rk = apply_rotary(rq, pos, cs), apply_rotary(rk, pos, cs)
    tol = TOL[dtype]
    torch.testing.assert_close(q.float(), rq.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(k.float(), rk.float(), atol=tol, rtol=tol)
    assert torch.equal(v, rv.reshape(N, Hkv, D))


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("N, I", [(1, 64), (5, 1500), (3, 3072)])
def test_silu_and_mul_matches_torch(device, dtype, N, I):
    x = torch.randn(N, 2 * I, generator=torch.Generator().manual_seed(I)).to(device, dtype)
    gate, up = x.float().chunk(2, dim=-1)
    want = (F.silu(gate) * up).to(dtype)
    tol = TOL[dtype]
    torch.testing.assert_close(silu_and_mul_triton(x).float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_sampler_follows_softmax_and_is_greedy_at_temperature_0(device):
    from minillm.kernels.sampling import sample_triton
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n, T = (600 if device == "cpu" else 40000), 0.7  # one draw per row: the interpreter is slow
    rows = logits.expand(n, -1).contiguous().to(device)
    seeds = torch.randint(0, 2**31 - 1, (n,), generator=g).to(device)
    draws = sample_triton(rows, torch.full((n,), T, device=device), seeds, block=8)
    freq = torch.bincount(draws.cpu(), minlength=5).double() / n
    want = (logits / T).softmax(-1).double()
    tol = 0.06 if device == "cpu" else 0.01  # ~3 standard errors of a frequency near 0.5
    assert torch.allclose(freq, want, atol=tol), (freq, want)
    x = torch.randn(6, 3000, generator=g)
    x[0, [300, 1000, 2900]] = x[1, [7, 135]] = x[2, [200, 1100]] = 9.0  # ties: argmax takes the first column
    x = x.to(device)
    greedy = sample_triton(x, torch.zeros(6, device=device), seeds[:6], block=512)
    assert greedy.tolist() == x.argmax(-1).tolist() and greedy[:3].tolist() == [300, 7, 200]
    again = [sample_triton(x, torch.ones(6, device=device), seeds[:6], block=512).tolist() for _ in range(2)]
    assert again[0] == again[1]  # same keys, same draws


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("N", [5, 23])  # one block of tokens, and two
def test_qk_norm_rope_stores_k_and_v_in_their_slots(device, dtype, N):
    """With caches given, the kernel writes rotated k and raw v to slot_mapping's slots (-1: skip)
    and nothing else: the rest of the cache keeps its sentinel."""
    from minillm.kernels.store_kvcache import store_kvcache_ref
    g = torch.Generator().manual_seed(3)
    H, Hkv, D, page = 4, 2, 32, 16
    qkv = torch.randn(N, (H + 2 * Hkv) * D, generator=g).to(device, dtype)
    pos = torch.tensor([3, 0, 9, 15, 1] + list(range(20, 38)), device=device)[:N]
    cs = rope_cos_sin(D, 64, 1e4).to(device)
    qw, kw = torch.randn(D, generator=g).to(device, dtype), torch.randn(D, generator=g).to(device, dtype)
    slots = torch.tensor([17, -1, 3, 40, 0] + list(range(41, 58)) + [-1], device=device)[:N]
    kc = torch.full((4, page, Hkv, D), 7.0, device=device, dtype=dtype)
    vc = torch.full_like(kc, 7.0)
    q, k, v = qk_norm_rope(qkv, pos, cs, H, Hkv, D, qw, kw, 1e-6, kc, vc, slots)
    want_k, want_v = torch.full_like(kc, 7.0), torch.full_like(vc, 7.0)
    store_kvcache_ref(k, v, want_k, want_v, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    q2, k2, _ = qk_norm_rope(qkv, pos, cs, H, Hkv, D, qw, kw, 1e-6)
    assert torch.equal(q, q2) and torch.equal(k, k2)


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("N, K, bias", [(64, 128, False), (100, 600, True), (1024, 3072, False)])
def test_gemv_matches_linear(device, dtype, N, K, bias):
    from minillm.kernels.gemv import gemv
    g = torch.Generator().manual_seed(N + K)
    x = torch.randn(1, K, generator=g).to(device, dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(device, dtype)
    b = torch.randn(N, generator=g).to(device, dtype) if bias else None
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).to(dtype)
    torch.testing.assert_close(gemv(x, w, b).float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("N, K", [(100, 600), (64, 1024)])
def test_gemv_prologues_match_the_ops_they_fuse(device, dtype, N, K):
    """RMSNorm (with and without the residual add) and SiLU-and-mul computed inside the GEMV equal
    the separate ops followed by F.linear; the new residual comes back too."""
    from minillm.kernels.gemv import gemv_rms_norm, gemv_silu_mul
    from minillm.kernels.rmsnorm import add_rms_norm_ref
    g = torch.Generator().manual_seed(N * K)
    x, r = (torch.randn(1, K, generator=g).to(device, dtype) for _ in range(2))
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(device, dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(device, dtype)
    b = torch.randn(N, generator=g).to(device, dtype)
    lin = lambda v: F.linear(v.float(), w.float(), b.float()).to(dtype)  # noqa: E731
    normed, new_r = add_rms_norm_ref(x, nw, 1e-6, r)
    y, r_out = gemv_rms_norm(x, nw, 1e-6, w, b, r)
    torch.testing.assert_close(r_out, new_r, atol=0, rtol=0)
    torch.testing.assert_close(y.float(), lin(normed).float(), atol=TOL[dtype], rtol=TOL[dtype])
    y, r_out = gemv_rms_norm(x, nw, 1e-6, w, b)
    assert r_out is x
    torch.testing.assert_close(y.float(), lin(add_rms_norm_ref(x, nw, 1e-6)).float(), atol=TOL[dtype], rtol=TOL[dtype])
    gate_up = torch.randn(1, 2 * K, generator=g).to(device, dtype)
    want = lin(silu_and_mul_triton(gate_up))
    torch.testing.assert_close(gemv_silu_mul(gate_up, w, b).float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_gemv_loops_over_rows_longer_than_one_load(device):
    from minillm.kernels.gemv import MAX_ROW, gemv
    g = torch.Generator().manual_seed(0)
    K = MAX_ROW + 300
    x, w = torch.randn(1, K, generator=g).to(device), (torch.randn(8, K, generator=g) / K ** 0.5).to(device)
    torch.testing.assert_close(gemv(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="prologue needs K"):
        from minillm.kernels.gemv import gemv_silu_mul
        gemv_silu_mul(torch.randn(1, 2 * K).to(device), w)


# tokens per prompt generated through the interpreter, which interprets every kernel of every layer
# at each step: the stored reference has 24; the first 12 of them, at batch 5 and at batch 1, took
# 15.2 + 11.3 s on the 2-core CPU against 23.6 + 18.0 s for all 24
INTERPRETED_TOKENS = 12


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen2"])  # QK-norm; qkv bias without QK-norm
def test_fused_decoder_layer_gives_hf_greedy_tokens(name, monkeypatch):
    """The engine's CUDA layer path (decoder_layer_fused: fused QK-norm/RoPE/KV store, and at batch 1
    the GEMVs with RMSNorm and SiLU-and-mul inside) run here in the interpreter: greedy tokens equal
    the stored HF reference, batched and one prompt at a time (every decode step at batch 1)."""
    import minillm.models.qwen3 as qwen3
    from helpers import greedy_reference, ref_path, small_engine_args
    from minillm import LLM, SamplingParams
    if not INTERPRETED:
        pytest.skip("this test runs the CUDA path in Triton's interpreter on CPU: a CPU-suite test")
    import minillm.engine.model_runner as model_runner
    # the engine on CPU calls decoder_layer (eager_decoder_layer looks it up): make it the CUDA path,
    # with the weights as a CUDA engine keeps them (row-major: the GEMV kernels read contiguous rows)
    monkeypatch.setattr(qwen3, "decoder_layer", partial(qwen3.decoder_layer_fused_b1, attention_b1=True))
    monkeypatch.setattr(model_runner, "column_major_weights", lambda model: None)
    ref = greedy_reference()
    llm = LLM(ref_path(name), **small_engine_args(attention_backend="triton"))
    params = SamplingParams(temperature=0.0, max_tokens=INTERPRETED_TOKENS, ignore_eos=True)
    out = llm.generate(ref["prompts"], params, use_tqdm=False)
    want = [t[:INTERPRETED_TOKENS] for t in ref["tokens"][name]]  # greedy: the reference's first tokens
    assert [o.outputs[0].token_ids for o in out] == want
    assert llm.generate(ref["prompts"][:1], params, use_tqdm=False)[0].outputs[0].token_ids == want[0]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen2"])
def test_gpu_greedy_equals_hf_reference_fp32(name):
    """On the GPU (CUDA graphs, fused layers, batch-1 GEMVs with PDL): fp32 greedy tokens equal the
    stored HF reference, batched and one prompt at a time."""
    from helpers import greedy_reference, ref_path, small_engine_args
    from minillm import LLM, SamplingParams
    ref = greedy_reference()
    llm = LLM(ref_path(name), **small_engine_args(device="cuda", attention_backend="triton"))
    params = SamplingParams(temperature=0.0, max_tokens=ref["max_new_tokens"], ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(ref["prompts"], params, use_tqdm=False)] == ref["tokens"][name]
    for p, want in zip(ref["prompts"], ref["tokens"][name]):
        assert llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids == want


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("L, splits", [(1, 1), (2, 3), (37, 1), (37, 4), (150, 2), (150, 4), (0, 2), (150, None)])
@pytest.mark.parametrize("page", [16, 64])
def test_decode_b1_matches_qk_norm_rope_then_paged_decode(device, dtype, norm, L, splits, page):
    """The batch-1 kernel (QK-norm + RoPE + KV store + attention in one) gives the unfused path's
    output and leaves the same cache: context lengths of one token, one tile, several tiles per split,
    more splits than keys, a padding row (L = 0: zeros, nothing stored), and the device's own launch
    shape (splits=None; on CUDA the narrow tiles of B1_CUDA_TILE). Blocks of 64 keys hold whole key
    tiles (one block-table load per tile), blocks of 16 do not (in the interpreter's 64-key tiles)."""
    from minillm.kernels.decode_b1 import decode_attention_b1
    from minillm.kernels.paged_attention import paged_decode_attention
    g = torch.Generator().manual_seed(L * 7 + (splits or 0) + norm)
    H, Hkv, D, nblocks = 4, 2, 32, 16
    qkv = torch.randn(1, (H + 2 * Hkv) * D, generator=g).to(device, dtype)
    cs = rope_cos_sin(D, 256, 1e4).to(device)
    qw, kw = ((1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype) for _ in range(2))
    if not norm:
        qw = kw = None
    kc = torch.randn(nblocks, page, Hkv, D, generator=g).to(device, dtype)
    vc = torch.randn(nblocks, page, Hkv, D, generator=g).to(device, dtype)
    table = torch.randperm(nblocks, generator=g)[:12].to(torch.int32)
    table[math.ceil(max(L, 1) / page):] = -1  # blocks past the context: unused
    table = table[None].to(device)
    pos = torch.tensor([max(L - 1, 0)], device=device)
    slot = (table[0, max(L - 1, 0) // page].long() * page + max(L - 1, 0) % page).reshape(1)
    if L == 0:
        slot = torch.tensor([-1], device=device)
    lens = torch.tensor([L], dtype=torch.int32, device=device)
    want_k, want_v = kc.clone(), vc.clone()
    q, k, v = qk_norm_rope(qkv, pos, cs, H, Hkv, D, qw, kw, 1e-6, want_k, want_v, slot)
    want = paged_decode_attention(q, want_k, want_v, table, lens, D ** -0.5, num_splits=splits)
    got = decode_attention_b1(qkv, pos, cs, qw, kw, 1e-6, kc, vc, slot, table, lens, D ** -0.5, H, Hkv, D,
                              num_splits=splits)
    torch.testing.assert_close(kc, want_k, atol=TOL[dtype], rtol=TOL[dtype])  # the norm sums in another order
    assert torch.equal(vc, want_v)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])



@pytest.mark.parametrize("device", DEVICES)
def test_pick_input_ids_takes_async_rows_from_the_last_samples(device):
    from minillm.kernels.sampling import pick_input_ids
    ids = torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32, device=device)
    src = torch.tensor([-1, 2, 0, -1, 4], dtype=torch.int32, device=device)
    tokens = torch.tensor([100, 101, 102, 103, 104, 105], device=device)
    assert pick_input_ids(ids, src, tokens).tolist() == [5, 102, 100, 8, 104]


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [{}, {"top_k": 5}])  # the graph's own sampler; the sampler outside it
def test_gpu_graph_sampling_equals_eager(extra):
    """Seeded sampling at temperature 0.8 gives the same tokens with CUDA graphs (LM head and fused
    sampler inside the graph; with top-k the logits are sampled outside it) as without."""
    from helpers import greedy_reference, ref_path, small_engine_args
    from minillm import LLM, SamplingParams
    ref = greedy_reference()
    params = [SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=i, **extra) for i in range(3)]
    outs = []
    for eager in (False, True):
        with LLM(ref_path("tiny-qwen3"), **small_engine_args(device="cuda", attention_backend="triton",
                                                             enforce_eager=eager, kv_cache_memory=64 << 20)) as llm:
            outs.append([o.outputs[0].token_ids for o in llm.generate(ref["prompts"][:3], params, use_tqdm=False)])
            outs.append(llm.generate([ref["prompts"][0]], params[0], use_tqdm=False)[0].outputs[0].token_ids)
    assert outs[0] == outs[2], "batched: CUDA graphs sampled other tokens than eager"
    assert outs[1] == outs[3], "batch 1: CUDA graphs sampled other tokens than eager"


def test_importing_minillm_turns_the_interpreter_on_before_triton_loads():
    """`import minillm.kernels` (what notebooks do first) must set TRITON_INTERPRET=1 before any module
    imports triton: a triton loaded earlier keeps compiled-mode tl functions that fail in the interpreter."""
    import subprocess
    import sys
    # a machine without CUDA, as torch sees it: the switch is for those
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "CUDA_VISIBLE_DEVICES": ""}
    code = "import minillm.kernels, triton.language as tl; print(type(tl.sum).__name__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "InterpretedFunction", out.stdout + out.stderr
