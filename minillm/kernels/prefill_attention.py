"""Prefill attention over packed variable-length sequences, in Triton (FlashAttention-2 style).

A prefill batch packs the new tokens of several sequences into one [Nq, H, D] tensor: sequence i
owns query rows cu_seqlens_q[i]:cu_seqlens_q[i+1]. Its keys are either this step's k/v (packed the
same way, cu_seqlens_k), or -- when the prefix cache supplied the first tokens -- read from the paged
KV cache through block_tables[i]: then it has more keys than queries, and query j sits at position
seqlen_k - seqlen_q + j (the causal mask is aligned to the end of the keys).

One program per (BLOCK_M queries, query head, sequence); keys stream BLOCK_N at a time with an fp32
online softmax. Keys that every query of the tile sees are processed without a mask, then the
few tiles on the diagonal with the causal mask.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.paged_attention import LOG2E

# Hand-picked configs by head_dim (no autotune: see paged_attention.py). (BLOCK_M, BLOCK_N, warps, stages)
# At head_dim 128 on an H200 a 128 x 64 tile with 8 warps and 3 stages is the usual Hopper choice for
# a Triton flash-attention forward (Q 32 KB + 3 x 32 KB of K/V in shared memory).
PREFILL_CONFIGS = {
    64: (128, 64, 4, 3),
    128: (128, 64, 8, 3),
    256: (64, 32, 8, 2),
}


def prefill_config(head_dim: int, device: torch.device) -> dict:
    """-> dict(BLOCK_M, BLOCK_N, BLOCK_D, num_warps, num_stages)."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    if device.type == "cuda":
        key = min((k for k in PREFILL_CONFIGS if k >= block_d), default=max(PREFILL_CONFIGS))
        block_m, block_n, num_warps, num_stages = PREFILL_CONFIGS[key]
    else:  # the interpreter
        block_m, block_n, num_warps, num_stages = 32, 32, 4, 1
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=num_warps, num_stages=num_stages)


@triton.jit
def _attend_keys(acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, table, k_row0, lo, hi, seqlen_k, k_head, v_head, mask_d,
                 qk_scale, stride_kt, stride_kb, stride_vt, stride_vb,
                 CAUSAL: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                 UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """Online softmax over key positions [lo, hi), BLOCK_N at a time. -> (acc, l_i, m_i)."""
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < seqlen_k
        if PAGED:  # key position p: row p % PAGE of block table[p // PAGE]
            block = tl.load(table + pos // PAGE, mask=mask_n, other=0).to(tl.int64)
            row = (pos % PAGE).to(tl.int64)
            k_rows = block * stride_kb + row * stride_kt
            v_rows = block * stride_vb + row * stride_vt
        else:
            row = (k_row0 + pos).to(tl.int64)
            k_rows = row * stride_kt
            v_rows = row * stride_vt
        mask_kv = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + k_rows[:, None] + k_head, mask=mask_kv, other=0.0)
        v = tl.load(v_ptr + v_rows[:, None] + v_head, mask=mask_kv, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if CAUSAL:
            visible = (pos[None, :] <= q_pos[:, None]) & mask_n[None, :]
            scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# stride_bt is the block-table width, which changes from batch to batch: not specialized on, so one
# compiled kernel serves every batch (a recompile costs ~0.5 s in the middle of serving)
@triton.jit(do_not_specialize=["stride_bt"])
def prefill_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cu_q_ptr, cu_k_ptr, block_tables_ptr, qk_scale,
                             stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                             stride_bt, stride_ot, stride_oh,
                             GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                             UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    mb, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    seqlen_q = tl.load(cu_q_ptr + b + 1) - q_start
    if mb * BLOCK_M >= seqlen_q:  # the grid covers the longest sequence
        return
    k_start = tl.load(cu_k_ptr + b)
    seqlen_k = tl.load(cu_k_ptr + b + 1) - k_start
    offset = seqlen_k - seqlen_q  # keys before the first query (the prefix-cached tokens)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < seqlen_q
    mask_d = offs_d < HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = offset + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    k_head = (h // GROUP) * stride_kh + offs_d[None, :]
    v_head = (h // GROUP) * stride_vh + offs_d[None, :]
    # keys [0, lo) are visible to every query of this tile; [lo, hi) need the causal mask
    lo = ((offset + mb * BLOCK_M) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(offset + (mb + 1) * BLOCK_M, seqlen_k)
    acc, l_i, m_i = _attend_keys(acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, table, k_start, 0, lo, seqlen_k,
                                 k_head, v_head, mask_d, qk_scale, stride_kt, stride_kb, stride_vt, stride_vb,
                                 False, PAGED, PAGE, BLOCK_N, UPCAST, PRECISION)
    acc, l_i, m_i = _attend_keys(acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, table, k_start, lo, hi, seqlen_k,
                                 k_head, v_head, mask_d, qk_scale, stride_kt, stride_kb, stride_vt, stride_vb,
                                 True, PAGED, PAGE, BLOCK_N, UPCAST, PRECISION)
    o = acc / l_i[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, scale: float,
                      block_tables: torch.Tensor | None = None, config: dict | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of packed sequences -> [Nq, H, D] in q.dtype (into `out` if given).

    q: [Nq, H, D]; cu_seqlens_q/cu_seqlens_k: [B+1] int32 on q's device; max_seqlen_q: host int.
    block_tables None: k/v are this step's packed keys [Nk, Hkv, D].
    block_tables [B, max_blocks] int32: k/v are the paged caches [num_blocks, block_size, Hkv, D] and
    sequence i's keys are its first cu_seqlens_k[i+1] - cu_seqlens_k[i] cached tokens.
    (The argument convention of flash_attn_varlen_func.)"""
    nq, H, D = q.shape
    paged = block_tables is not None
    hkv, d_k = (k.shape[2], k.shape[3]) if paged else (k.shape[1], k.shape[2])
    if d_k != D or v.shape != k.shape or H % hkv:
        raise ValueError(f"prefill_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         f"head_dim must match and H must be a multiple of Hkv")
    if q.dtype != k.dtype or v.dtype != k.dtype:
        raise ValueError(f"prefill_attention: q ({q.dtype}) and k/v ({k.dtype}) must share a dtype")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("prefill_attention: k and v need a contiguous head_dim (stride 1 in the last dim)")
    B = cu_seqlens_q.shape[0] - 1
    if cu_seqlens_k.shape != cu_seqlens_q.shape or (paged and block_tables.shape[0] != B):
        raise ValueError(f"prefill_attention: cu_seqlens_q {tuple(cu_seqlens_q.shape)}, cu_seqlens_k "
                         f"{tuple(cu_seqlens_k.shape)} and block_tables must describe the same {B} sequences")
    if q.stride(2) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if nq == 0 or B == 0:
        return out
    page = k.shape[1] if paged else 1
    cfg = {**prefill_config(D, q.device), **(config or {})}
    upcast = q.device.type != "cuda"
    precision = "ieee" if (upcast or q.dtype == torch.float32) else "tf32"
    if paged:  # [num_blocks, block_size, Hkv, D]
        k_strides, v_strides = k.stride()[:3], v.stride()[:3]
        bt, stride_bt = block_tables, block_tables.stride(0)
    else:  # [Nk, Hkv, D]: no block axis
        k_strides, v_strides = (0, *k.stride()[:2]), (0, *v.stride()[:2])
        bt, stride_bt = cu_seqlens_k, 0  # unused
    grid = (triton.cdiv(max_seqlen_q, cfg["BLOCK_M"]), H, B)
    prefill_attention_kernel[grid](
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, bt, scale * LOG2E,
        q.stride(0), q.stride(1), *k_strides, *v_strides, stride_bt, out.stride(0), out.stride(1),
        GROUP=H // hkv, HEAD_DIM=D, PAGE=page, PAGED=paged, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_D=cfg["BLOCK_D"], UPCAST=upcast, PRECISION=precision,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out
