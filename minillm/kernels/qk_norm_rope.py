"""Fused QK-norm + rotary embedding: one kernel from the qkv projection to rotated q and k.

In eager PyTorch, splitting q/k out of the packed qkv output, the per-head RMSNorm (Qwen3) and
RoPE take ~25 small kernels per layer; at decode sizes each is launch-bound. Here one program
handles one (token, head) row of q or k: load it once, normalize it (optional), rotate it at its
position, store it. v is left in place (a view of qkv).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, q_ptr, k_ptr, q_w_ptr, k_w_ptr, cos_sin_ptr, pos_ptr,
                         qkv_stride, num_q_heads, num_kv_heads, eps,
                         HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    token = tl.program_id(0)
    head = tl.program_id(1)  # 0 .. num_q_heads + num_kv_heads - 1: q heads first, then k heads
    half = tl.arange(0, HEAD_DIM // 2)
    row = qkv_ptr + token * qkv_stride + head * HEAD_DIM
    x1 = tl.load(row + half).to(tl.float32)
    x2 = tl.load(row + HEAD_DIM // 2 + half).to(tl.float32)
    is_q = head < num_q_heads
    if NORM:
        ms = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HEAD_DIM
        r = 1.0 / tl.sqrt(ms + eps)
        # transformers rounds the normalized row to the model dtype before the weight multiply
        x1 = (x1 * r).to(qkv_ptr.dtype.element_ty).to(tl.float32)
        x2 = (x2 * r).to(qkv_ptr.dtype.element_ty).to(tl.float32)
        if is_q:
            w1 = tl.load(q_w_ptr + half).to(tl.float32)
            w2 = tl.load(q_w_ptr + HEAD_DIM // 2 + half).to(tl.float32)
        else:
            w1 = tl.load(k_w_ptr + half).to(tl.float32)
            w2 = tl.load(k_w_ptr + HEAD_DIM // 2 + half).to(tl.float32)
        x1 = (x1 * w1).to(qkv_ptr.dtype.element_ty).to(tl.float32)
        x2 = (x2 * w2).to(qkv_ptr.dtype.element_ty).to(tl.float32)
    pos = tl.load(pos_ptr + token)
    cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + half)
    sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + half)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_q:
        out = q_ptr + (token * num_q_heads + head) * HEAD_DIM
    else:
        out = k_ptr + (token * num_kv_heads + head - num_q_heads) * HEAD_DIM
    tl.store(out + half, o1.to(q_ptr.dtype.element_ty))
    tl.store(out + HEAD_DIM // 2 + half, o2.to(q_ptr.dtype.element_ty))


def qk_norm_rope(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, num_heads: int,
                 num_kv_heads: int, head_dim: int, q_weight: torch.Tensor | None = None,
                 k_weight: torch.Tensor | None = None, eps: float = 1e-6):
    """qkv: [N, (H + 2 Hkv) * D] packed projection output; positions: [N]; cos_sin: [max_pos, D] fp32.
    -> q [N, H, D], k [N, Hkv, D] (normalized when weights are given, then rotated), v [N, Hkv, D] (a view)."""
    n = qkv.shape[0]
    q = torch.empty(n, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(n, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    norm = q_weight is not None
    dummy = cos_sin  # an unused pointer when there is no norm
    if n:
        _qk_norm_rope_kernel[(n, num_heads + num_kv_heads)](
            qkv, q, k, q_weight if norm else dummy, k_weight if norm else dummy, cos_sin, positions,
            qkv.stride(0), num_heads, num_kv_heads, eps, HEAD_DIM=head_dim, NORM=norm, num_warps=1)
    v = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(n, num_kv_heads, head_dim)
    return q, k, v
