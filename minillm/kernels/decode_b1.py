"""Batch-1 decode attention in one kernel: QK-norm + RoPE + KV-cache store + paged attention.

At batch 1 a layer's attention moves about a megabyte, yet three kernels in a row (qk_norm_rope,
paged_decode_kernel, the split-K combine) cost ~7 us per layer on an H200: each one's time is a
chain of dependent loads (context length -> block table -> K/V tile), not bandwidth. Here one
program per (KV head, split) does the work of the first two, and most of its latency hides
behind the qkv projection still running:

* before `gdc_wait()` (programmatic dependent launch, minillm.kernels.gemv) it loads everything
  that does not depend on the qkv projection: the context length, the block table, the first tile
  of *cached* keys and values (positions < L - 1, written by earlier steps), the RoPE row and the
  QK-norm weights;
* after it, it reads its GROUP query heads and the new token's k and v straight out of qkv,
  normalizes and rotates them (the rounding points of qk_norm_rope), attends to the cached keys
  and to the new key in registers, and the split that owns the new key writes k and v to their
  cache slot for the next steps.

With several splits the partial results go to paged_decode_combine_kernel (PDL too). Merging them
in the kernel instead (the last split of a head, found with an atomic counter, merges) measured no
faster on the H200, within the run-to-run spread, so the simpler two-kernel form stays.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.gemv import pdl_args
from minillm.kernels.paged_attention import LOG2E, paged_decode_combine_kernel, paged_decode_config

# Launch shape on CUDA, from an H200 sweep of the whole batch-1 graph of Qwen3-0.6B (contexts 129-4000,
# max_model_len 4096): narrow 16-key tiles, 2 warps, one split per 64 keys of the longest context. A
# program's time is a chain of dependent loads, so the less each one does the sooner the layer goes
# on; splits past the context return at once and cost the combine little. Against exercise 3.5's
# tiles (64 keys, 4 warps, 16 splits): 0.634/0.639/0.727/0.839 ms vs 0.690/0.694/0.758/0.885 ms per
# token at contexts 129/384/2048/4000.
B1_CUDA_TILE = dict(BLOCK_N=16, num_warps=2, num_stages=1)
B1_KEYS_PER_SPLIT, B1_MAX_SPLITS = 64, 64


@triton.jit
def _attend(q, k, v, mask_n, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr):
    """One tile of the online softmax: q [BLOCK_H, D], k/v [BLOCK_N, D] -> updated (m, l, acc)."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    scores = tl.where(mask_n[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-masked tile: p = 0, not NaN
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(scores - m_ref[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _kv_tile(k_cache_ptr, v_cache_ptr, table_ptr, n0, end, head_offs, stride_cb, stride_ct, PAGE: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """K and V rows [BLOCK_N, D] of key positions n0 + [0, BLOCK_N) (< end; the rest masked) through the
    block table. n0 is a multiple of BLOCK_N: with PAGE % BLOCK_N == 0 the tile lies in one block, whose
    id is one load, not one per key (0.4 us less per layer on the H200 at batch 1)."""
    kpos = n0 + tl.arange(0, BLOCK_N)
    mask_n = kpos < end
    if PAGE % BLOCK_N == 0:
        rows = tl.load(table_ptr + n0 // PAGE, mask=n0 < end, other=0).to(tl.int64) * stride_cb + (
            n0 % PAGE + tl.arange(0, BLOCK_N)) * stride_ct
    else:
        rows = tl.load(table_ptr + kpos // PAGE, mask=mask_n, other=0).to(tl.int64) * stride_cb + (
            kpos % PAGE) * stride_ct
    offs = rows[:, None] + head_offs
    return (tl.load(k_cache_ptr + offs, mask=mask_n[:, None], other=0.0),
            tl.load(v_cache_ptr + offs, mask=mask_n[:, None], other=0.0), mask_n)


@triton.jit
def _norm_rope(row_ptr, w, wp, offs_d, partner, sign, cos, sin, eps, NORM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """QK-norm (weights w[d], wp = w[partner]; optional) then RoPE of head rows [R, D] at
    row_ptr[:, None] + d, in fp32. RoPE pairs d with partner = (d + D/2) % D:
    out = n * cos + sign * n[partner] * sin (sign -1 in the first half)."""
    x = tl.load(row_ptr + offs_d[None, :]).to(tl.float32)
    xp = tl.load(row_ptr + partner[None, :]).to(tl.float32)
    if NORM:  # as qk_norm_rope: round the normalized row, then the weighted row, to the model dtype
        dt = row_ptr.dtype.element_ty
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)
        x = ((x * r[:, None]).to(dt).to(tl.float32) * w[None, :]).to(dt).to(tl.float32)
        xp = ((xp * r[:, None]).to(dt).to(tl.float32) * wp[None, :]).to(dt).to(tl.float32)
    return x * cos[None, :] + sign[None, :] * xp * sin[None, :]


@triton.jit
def _decode_b1_kernel(qkv_ptr, q_w_ptr, k_w_ptr, cos_sin_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
                      table_ptr, context_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr, qk_scale, eps, num_splits,
                      stride_cb, stride_ct, NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr,
                      HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                      NORM: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, DIRECT: tl.constexpr,
                      USE_PDL: tl.constexpr):
    g, s = tl.program_id(0), tl.program_id(1)
    num_kv = tl.num_programs(0)
    L = tl.load(context_lens_ptr)  # keys including the new token (0: a padding row)
    cached = tl.maximum(L - 1, 0)  # keys already in the cache; the new one is key L - 1
    chunk = ((cached + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = s * chunk
    end = tl.minimum(start + chunk, cached)
    offs_d = tl.arange(0, HEAD_DIM)
    head_offs = g * HEAD_DIM + offs_d[None, :]

    # independent of the qkv projection (this step's inputs, earlier steps' cache): loaded while it still runs
    k0, v0, mask_n = _kv_tile(k_cache_ptr, v_cache_ptr, table_ptr, start, end, head_offs, stride_cb, stride_ct,
                              PAGE, BLOCK_N)
    pos = tl.load(pos_ptr)
    slot = tl.load(slot_ptr).to(tl.int64)
    half = offs_d % (HEAD_DIM // 2)
    cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + half)
    sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + half)
    partner = (offs_d + HEAD_DIM // 2) % HEAD_DIM
    sign = tl.where(offs_d < HEAD_DIM // 2, -1.0, 1.0)
    if NORM:
        qw, qwp = tl.load(q_w_ptr + offs_d).to(tl.float32), tl.load(q_w_ptr + partner).to(tl.float32)
        kw, kwp = tl.load(k_w_ptr + offs_d).to(tl.float32), tl.load(k_w_ptr + partner).to(tl.float32)
    else:
        qw, qwp, kw, kwp = cos, cos, cos, cos  # unused
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # qkv is complete from here on

    # this step's q (GROUP heads), k and v, normalized and rotated at position L - 1
    dt = qkv_ptr.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    heads = g * GROUP + tl.minimum(offs_h, GROUP - 1)  # rows past GROUP repeat a real head (never stored)
    q = _norm_rope(qkv_ptr + heads[:, None] * HEAD_DIM, qw, qwp, offs_d, partner, sign, cos, sin, eps,
                   NORM, HEAD_DIM).to(dt)
    k_row = qkv_ptr + (NUM_Q_HEADS + g) * HEAD_DIM + tl.zeros([1], tl.int32)[:, None]
    k_new = _norm_rope(k_row, kw, kwp, offs_d, partner, sign, cos, sin, eps, NORM, HEAD_DIM).to(dt)  # [1, D]
    v_new = tl.load(qkv_ptr + (NUM_Q_HEADS + num_kv + g) * HEAD_DIM + offs_d[None, :])  # [1, D]
    if UPCAST:
        q, k0, v0 = q.to(tl.float32), k0.to(tl.float32), v0.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    m_i, l_i, acc = _attend(q, k0, v0, mask_n, m_i, l_i, acc, qk_scale, PRECISION)
    for n0 in range(start + BLOCK_N, end, BLOCK_N):  # contexts longer than one tile per split
        k, v, mask_n = _kv_tile(k_cache_ptr, v_cache_ptr, table_ptr, n0, end, head_offs, stride_cb, stride_ct,
                                PAGE, BLOCK_N)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        m_i, l_i, acc = _attend(q, k, v, mask_n, m_i, l_i, acc, qk_scale, PRECISION)

    if (s == 0) & (L > 0):  # split 0 owns the new key: attend to it, and store k, v for later steps
        score = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * qk_scale  # [BLOCK_H]
        m_new = tl.maximum(m_i, score)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(score - m_new)
        # the tiles' p @ v multiplies p rounded to v's dtype: round this p the same way
        pv = p if UPCAST else p.to(v_new.dtype).to(tl.float32)
        acc = acc * alpha[:, None] + pv[:, None] * v_new.to(tl.float32)
        l_i = l_i * alpha + p
        m_i = m_new
        dst = (tl.maximum(slot, 0) // PAGE) * stride_cb + (tl.maximum(slot, 0) % PAGE) * stride_ct + head_offs
        keep = (slot >= 0) & (offs_d[None, :] < HEAD_DIM)
        tl.store(k_cache_ptr + dst, k_new.to(k_cache_ptr.dtype.element_ty), mask=keep)
        tl.store(v_cache_ptr + dst, v_new.to(v_cache_ptr.dtype.element_ty), mask=keep)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    out_heads = g * GROUP + offs_h
    mask_o = (offs_h < GROUP)[:, None] & (offs_d < HEAD_DIM)[None, :]
    if DIRECT:
        tl.store(out_ptr + out_heads[:, None] * HEAD_DIM + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=mask_o)
    else:
        rows = out_heads * num_splits + s
        tl.store(part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], o, mask=mask_o)
        tl.store(part_lse_ptr + rows, m_i + tl.log2(l_safe), mask=offs_h < GROUP)


def decode_attention_b1(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                        q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                        num_heads: int, num_kv_heads: int, head_dim: int, num_splits: int | None = None) -> torch.Tensor:
    """One decode token: qkv [1, (H + 2 Hkv) * D] (the packed projection), positions/slot_mapping/
    context_lens [1], block_tables [1, max_blocks], caches [num_blocks, block_size, Hkv, D] ->
    attention output [1, H, D]; this token's k (normalized, rotated) and v are written to the cache.
    The same result as qk_norm_rope(..., k_cache, v_cache, slot_mapping) then paged_decode_attention."""
    H, Hkv, D = num_heads, num_kv_heads, head_dim
    page = k_cache.shape[1]
    if qkv.shape != (1, (H + 2 * Hkv) * D) or qkv.stride(1) != 1 or D & (D - 1) or block_tables.shape[0] != 1:
        raise ValueError(f"decode_attention_b1: one token with a contiguous packed qkv row and a power-of-two "
                         f"head_dim; got qkv {tuple(qkv.shape)}, head_dim {D}, block_tables {tuple(block_tables.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(2) != D or k_cache.stride(3) != 1:
        raise ValueError("decode_attention_b1: caches must be [num_blocks, block_size, Hkv, D] with contiguous heads")
    max_context = block_tables.shape[1] * page
    cfg = paged_decode_config(1, Hkv, H // Hkv, D, max_context, page, qkv.device)
    if qkv.device.type == "cuda":
        cfg.update(B1_CUDA_TILE, num_splits=min(B1_MAX_SPLITS, triton.cdiv(max_context, B1_KEYS_PER_SPLIT)))
    splits = num_splits or cfg["num_splits"]
    upcast = qkv.device.type != "cuda"
    out = torch.empty(1, H, D, dtype=qkv.dtype, device=qkv.device)
    part_out = torch.empty(H, splits, D, dtype=torch.float32, device=qkv.device) if splits > 1 else out
    part_lse = torch.empty(H, splits, dtype=torch.float32, device=qkv.device) if splits > 1 else out
    norm = q_weight is not None
    _decode_b1_kernel[(Hkv, splits)](
        qkv, q_weight if norm else qkv, k_weight if norm else qkv, cos_sin, positions, slot_mapping, k_cache, v_cache,
        block_tables, context_lens, out, part_out, part_lse, scale * LOG2E, eps, splits,
        k_cache.stride(0), k_cache.stride(1), NUM_Q_HEADS=H, GROUP=H // Hkv, HEAD_DIM=D, PAGE=page,
        BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"], NORM=norm, UPCAST=upcast,
        PRECISION="ieee" if (upcast or qkv.dtype == torch.float32) else "tf32", DIRECT=splits == 1,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_args(qkv.device))
    if splits > 1:
        paged_decode_combine_kernel[(1, H)](
            part_out, part_lse, out, splits, out.stride(0), out.stride(1), HEAD_DIM=D,
            BLOCK_S=max(2, triton.next_power_of_2(splits)), BLOCK_D=D, **pdl_args(qkv.device))
    return out
