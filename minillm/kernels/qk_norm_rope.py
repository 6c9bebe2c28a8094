"""Fused QK-norm + rotary embedding + KV-cache store: one kernel from the qkv projection to
rotated q and k, with this step's k and v already in their cache slots.

In eager PyTorch, splitting q/k out of the packed qkv output, the per-head RMSNorm (Qwen3), RoPE
and the cache store take ~25 small kernels per layer; at decode sizes each is launch-bound. Here
one program handles one head of q, k or v for a block of tokens: load the rows once, normalize
them (optional), rotate each at its position (q, k), store them (q, k), and write k and v to
slot_mapping[token] of the paged cache (slot -1: skip). v is otherwise left in place (a view of qkv).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.gemv import pdl_args

# Rows of one head that one program handles. One program per (token, head) row, as this kernel was
# first written, launched half a million tiny programs for a 16k-token prefill (612 us a call on the H200,
# more than that step's attention); blocks of 16 tokens keep every program's loads wide.
TOKENS_PER_PROGRAM = 16


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, q_ptr, k_ptr, q_w_ptr, k_w_ptr, cos_sin_ptr, pos_ptr,
                         k_cache_ptr, v_cache_ptr, slot_ptr, cache_block_stride,
                         n_tokens, qkv_stride, num_q_heads, num_kv_heads, eps,
                         HEAD_DIM: tl.constexpr, NORM: tl.constexpr, STORE: tl.constexpr, PAGE: tl.constexpr,
                         BLOCK_T: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:  # launched early (minillm.kernels.gemv explains PDL): wait for qkv before reading it
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    head = tl.program_id(1)  # q heads, then k heads, then (only when STORE) v heads: one kind per program
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    half = tl.arange(0, HEAD_DIM // 2)
    live = (tokens < n_tokens)[:, None] & (half < HEAD_DIM // 2)[None, :]  # [BLOCK_T, D/2]
    row = qkv_ptr + tokens[:, None].to(tl.int64) * qkv_stride + head * HEAD_DIM + half[None, :]
    x1 = tl.load(row, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row + HEAD_DIM // 2, mask=live, other=0.0).to(tl.float32)
    if STORE:  # slot -1: skip
        slot = tl.load(slot_ptr + tokens, mask=tokens < n_tokens, other=-1).to(tl.int64)[:, None]
        kv_head = (head - num_q_heads) % num_kv_heads
        dst = (tl.maximum(slot, 0) // PAGE) * cache_block_stride + (tl.maximum(slot, 0) % PAGE) * (
            num_kv_heads * HEAD_DIM) + kv_head * HEAD_DIM + half[None, :]
        keep = live & (slot >= 0)
    if head >= num_q_heads + num_kv_heads:  # a v head (there are v programs only with STORE): cached as is
        if STORE:
            tl.store(v_cache_ptr + dst, x1.to(v_cache_ptr.dtype.element_ty), mask=keep)
            tl.store(v_cache_ptr + dst + HEAD_DIM // 2, x2.to(v_cache_ptr.dtype.element_ty), mask=keep)
    else:
        is_q = head < num_q_heads
        if NORM:
            ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM
            r = (1.0 / tl.sqrt(ms + eps))[:, None]
            # transformers rounds the normalized row to the model dtype before the weight multiply
            n1 = (x1 * r).to(qkv_ptr.dtype.element_ty).to(tl.float32)
            n2 = (x2 * r).to(qkv_ptr.dtype.element_ty).to(tl.float32)
            if is_q:
                w1 = tl.load(q_w_ptr + half).to(tl.float32)
                w2 = tl.load(q_w_ptr + HEAD_DIM // 2 + half).to(tl.float32)
            else:
                w1 = tl.load(k_w_ptr + half).to(tl.float32)
                w2 = tl.load(k_w_ptr + HEAD_DIM // 2 + half).to(tl.float32)
            n1 = (n1 * w1[None, :]).to(qkv_ptr.dtype.element_ty).to(tl.float32)
            n2 = (n2 * w2[None, :]).to(qkv_ptr.dtype.element_ty).to(tl.float32)
        else:
            n1, n2 = x1, x2
        pos = tl.load(pos_ptr + tokens, mask=tokens < n_tokens, other=0)[:, None]
        cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + half[None, :], mask=live, other=0.0)
        sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + half[None, :], mask=live, other=0.0)
        o1 = n1 * cos - n2 * sin
        o2 = n2 * cos + n1 * sin
        if is_q:
            out = q_ptr + (tokens[:, None].to(tl.int64) * num_q_heads + head) * HEAD_DIM + half[None, :]
        else:
            out = k_ptr + (tokens[:, None].to(tl.int64) * num_kv_heads + head - num_q_heads) * HEAD_DIM + half[None, :]
        tl.store(out, o1.to(q_ptr.dtype.element_ty), mask=live)
        tl.store(out + HEAD_DIM // 2, o2.to(q_ptr.dtype.element_ty), mask=live)
        if STORE:
            if head >= num_q_heads:  # k (rotated) into its cache slot
                tl.store(k_cache_ptr + dst, o1.to(k_cache_ptr.dtype.element_ty), mask=keep)
                tl.store(k_cache_ptr + dst + HEAD_DIM // 2, o2.to(k_cache_ptr.dtype.element_ty), mask=keep)


def qk_norm_rope(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, num_heads: int,
                 num_kv_heads: int, head_dim: int, q_weight: torch.Tensor | None = None,
                 k_weight: torch.Tensor | None = None, eps: float = 1e-6, k_cache: torch.Tensor | None = None,
                 v_cache: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None):
    """qkv: [N, (H + 2 Hkv) * D] packed projection output; positions: [N]; cos_sin: [max_pos, D] fp32;
    k_cache/v_cache: [num_blocks, block_size, Hkv, D] and slot_mapping [N] (-1: skip) to store k and v.
    -> q [N, H, D], k [N, Hkv, D] (normalized when weights are given, then rotated), v [N, Hkv, D] (a view)."""
    n = qkv.shape[0]
    q = torch.empty(n, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(n, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    norm, store = q_weight is not None, k_cache is not None
    dummy = cos_sin  # an unused pointer
    if store and (k_cache.stride(1) != num_kv_heads * head_dim or k_cache.stride() != v_cache.stride()):
        raise ValueError("qk_norm_rope: caches must be [num_blocks, block_size, Hkv, D] with contiguous slots")
    if n:
        heads = num_heads + num_kv_heads * (2 if store else 1)
        block_t = min(TOKENS_PER_PROGRAM, triton.next_power_of_2(n))
        _qk_norm_rope_kernel[(triton.cdiv(n, block_t), heads)](
            qkv, q, k, q_weight if norm else dummy, k_weight if norm else dummy, cos_sin, positions,
            k_cache if store else dummy, v_cache if store else dummy, slot_mapping if store else positions,
            k_cache.stride(0) if store else 0, n, qkv.stride(0), num_heads, num_kv_heads, eps,
            HEAD_DIM=head_dim, NORM=norm, STORE=store, PAGE=k_cache.shape[1] if store else 1,
            BLOCK_T=block_t, num_warps=4 if block_t >= TOKENS_PER_PROGRAM else 1, **pdl_args(qkv.device))
    v = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(n, num_kv_heads, head_dim)
    return q, k, v
