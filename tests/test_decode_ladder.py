"""Version 2 of the primer's paged decode ladder (minillm/course/decode_ladder.py, notebook 02a section 7):
one program per query head, against SDPA run per sequence on contiguous K/V.

The reference never touches the paged layout: each sequence's K/V is drawn contiguous first, then
scattered into shuffled pages of a NaN-filled cache (rows nobody wrote are NaN, so a load that misses
its mask poisons the output), with guard blocks of NaN either side of the cache and -1 padding in the
block tables. CPU: the kernel runs in Triton's interpreter.
"""
import os

import pytest
import torch
import torch.nn.functional as F

from minillm.course.decode_ladder import paged_decode_per_head

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTINEL = 77.0  # what a guard region of the output holds
GUARD = 64  # output elements of guard on each side
TOL_FP32 = dict(atol=2e-5, rtol=2e-5)  # fp32 all through: only the summation order differs
TOL_HALF = {torch.float16: dict(atol=2e-3, rtol=2e-3),  # fp32 math, one rounding of the output
            torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def make_paged(lengths, num_kv_heads, head_dim, page, dtype, seed=0, spare_blocks=2):
    """-> (ks, vs, k_cache, v_cache, block_tables, context_lens): per-sequence contiguous K/V
    [L, Hkv, D], scattered into shuffled pages of NaN caches that are views between guard blocks."""
    g = torch.Generator().manual_seed(seed)
    ks = [torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype) for n in lengths]
    vs = [torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype) for n in lengths]
    need = [-(-n // page) for n in lengths]
    num_blocks = sum(need) + spare_blocks
    k_buf = torch.full((num_blocks + 2, page, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_buf = k_buf.clone()
    k_cache, v_cache = k_buf[1:-1], v_buf[1:-1]
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.full((len(lengths), max(need) + 1), -1, dtype=torch.int32)  # at least one -1 per row
    used = 0
    for i, n in enumerate(lengths):
        tables[i, :need[i]] = perm[used:used + need[i]].int()
        for j in range(need[i]):
            rows = slice(j * page, min((j + 1) * page, n))
            k_cache[tables[i, j], :rows.stop - rows.start] = ks[i][rows]
            v_cache[tables[i, j], :rows.stop - rows.start] = vs[i][rows]
        used += need[i]
    return ks, vs, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32)


def sdpa_reference(q, ks, vs, scale):
    """fp32 SDPA of each sequence's query [H, D] over its own contiguous K/V; zeros for no keys."""
    out = torch.zeros(q.shape, dtype=torch.float32)
    for i, (k, v) in enumerate(zip(ks, vs)):
        if len(k):
            out[i] = F.scaled_dot_product_attention(q[i, :, None].float(), k.float().transpose(0, 1),
                                                    v.float().transpose(0, 1), scale=scale, enable_gqa=True)[:, 0]
    return out


def guarded_out(shape, dtype):
    """-> (buffer, view): an output view between two regions of SENTINEL, itself SENTINEL-filled."""
    n = torch.Size(shape).numel()
    buf = torch.full((GUARD + n + GUARD,), SENTINEL, dtype=dtype)
    return buf, buf[GUARD:GUARD + n].view(shape)


CASES = [  # (lengths, H, Hkv, D, page): 0 keys, 1 key, exactly whole pages, a partial last page
    pytest.param([1, 16, 37], 2, 2, 32, 16, id="group1"),
    pytest.param([0, 32, 70], 4, 2, 24, 16, id="group2-d24"),
    pytest.param([130, 5, 64], 8, 2, 16, 8, id="group4-tiles-span-pages"),
    pytest.param([100, 1], 4, 2, 32, 128, id="group2-page-over-tile"),
]


@pytest.mark.parametrize("lengths, H, Hkv, D, page", CASES)
def test_matches_sdpa_on_contiguous_kv_and_keeps_its_guards(lengths, H, Hkv, D, page):
    ks, vs, k_cache, v_cache, tables, lens = make_paged(lengths, Hkv, D, page, torch.float32, seed=len(lengths) + D)
    q = torch.randn(len(lengths), H, D, generator=torch.Generator().manual_seed(D))
    buf, out = guarded_out(q.shape, torch.float32)
    got = paged_decode_per_head(q, k_cache, v_cache, tables, lens, D ** -0.5, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(torch.cat([buf[:GUARD], buf[-GUARD:]]), torch.full((2 * GUARD,), SENTINEL),
                               rtol=0, atol=0, msg="the guard regions around out changed: a store without its mask")
    torch.testing.assert_close(got, sdpa_reference(q, ks, vs, D ** -0.5), **TOL_FP32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_sdpa(dtype):
    lengths, H, Hkv, D = [0, 1, 48, 77], 4, 2, 32
    ks, vs, k_cache, v_cache, tables, lens = make_paged(lengths, Hkv, D, 16, dtype, seed=3)
    q = torch.randn(len(lengths), H, D, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = paged_decode_per_head(q, k_cache, v_cache, tables, lens, D ** -0.5)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), sdpa_reference(q, ks, vs, D ** -0.5), **TOL_HALF[dtype])


def test_no_keys_gives_zeros_not_nan():
    ks, vs, k_cache, v_cache, tables, lens = make_paged([0, 20, 0], 2, 16, 8, torch.float32, seed=5)
    q = torch.randn(3, 4, 16)
    _, out = guarded_out(q.shape, torch.float32)  # SENTINEL-filled: the empty rows must be written
    paged_decode_per_head(q, k_cache, v_cache, tables, lens, 0.25, out=out)
    assert torch.equal(out[0], torch.zeros(4, 16)) and torch.equal(out[2], torch.zeros(4, 16))
    assert torch.isfinite(out).all()


def test_strided_q_as_sliced_from_a_fused_qkv():
    lengths, H, Hkv, D = [9, 40], 4, 2, 32
    ks, vs, k_cache, v_cache, tables, lens = make_paged(lengths, Hkv, D, 16, torch.float32, seed=6)
    qkv = torch.randn(len(lengths), H + 2 * Hkv, D, generator=torch.Generator().manual_seed(7))
    q = qkv[:, :H]  # rows (H + 2 Hkv) * D apart, as the attention layer's q is
    got = paged_decode_per_head(q, k_cache, v_cache, tables, lens, D ** -0.5)
    torch.testing.assert_close(got, sdpa_reference(q, ks, vs, D ** -0.5), **TOL_FP32)


def test_rejects_mismatched_inputs():
    _, _, k_cache, v_cache, tables, lens = make_paged([5], 2, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="H divisible by Hkv"):
        paged_decode_per_head(torch.randn(1, 3, 16), k_cache, v_cache, tables, lens, 0.25)
    with pytest.raises(ValueError, match="one dtype"):
        paged_decode_per_head(torch.randn(1, 4, 16).half(), k_cache, v_cache, tables, lens, 0.25)
    with pytest.raises(ValueError, match="out must be"):
        paged_decode_per_head(torch.randn(1, 4, 16), k_cache, v_cache, tables, lens, 0.25, out=torch.empty(1, 4, 8))


def test_course_kernels_run_in_a_fresh_interpreter():
    """Triton reads TRITON_INTERPRET when triton.language is first imported: a module that imports triton
    before minillm.kernels sets it got compiled-mode helpers, and its first reduction in the interpreter
    raised "Cannot call @triton.jit'd outside of the scope of a kernel". Each module below, imported first
    in a fresh process, must run its kernel."""
    import subprocess
    import sys
    script = """
import torch
from {module} import {fn}
s, v = torch.randn(3, 20), torch.randn(20, 8)
want = torch.softmax(s, -1) @ v
torch.testing.assert_close({fn}(s, v), want, atol=1e-5, rtol=1e-5)
"""
    for module, fn in (("minillm.course.triton_primer", "softmax_weighted_sum"),
                       ("solutions.ch2", "softmax_weighted_sum")):
        # a machine without CUDA, as torch sees it (there minillm.kernels turns the interpreter on)
        env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "CUDA_VISIBLE_DEVICES": ""}
        done = subprocess.run([sys.executable, "-c", script.format(module=module, fn=fn)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, f"{module}: {done.stderr[-1500:]}"
