"""Version 2 of the paged decode ladder in notebooks/02a_triton_primer.ipynb (section 7): paged decode
attention with one program per *query* head, the primer's page gather (2.9) joined to its online
softmax (2.11), and nothing more.

It is the step before the engine's kernel (minillm/kernels/paged_attention.py, exercise 3.5), kept
so the notebook can time what that kernel's two changes buy: program (b, h) reads KV head
h // GROUP for itself, so with GQA each K/V row is loaded GROUP times (once per query head that
shares it) where 3.5 loads it once for the group; and its two products are elementwise multiplies
and sums on the CUDA cores where 3.5 uses tl.dot. Course material, not engine code.
"""
from __future__ import annotations

import torch

import minillm.kernels  # noqa: F401,I001  (first: sets TRITON_INTERPRET=1 without CUDA before triton is imported)
import triton
import triton.language as tl
from minillm.kernels.paged_attention import LOG2E, paged_decode_inputs

# 64 keys per tile as in 3.5 (a [64, 128] bf16 K tile is 16 KB); 8 warps, not 3.5's 4, because here the
# K and V tiles live in registers as fp32: 32 values of each per thread instead of 64
BLOCK_N_CUDA, NUM_WARPS_CUDA, NUM_STAGES_CUDA = 64, 8, 2
BLOCK_N_CPU = 64  # the interpreter: fewer, bigger numpy ops are faster


@triton.jit
def paged_decode_per_head_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr,
                                 qk_scale, stride_qb, stride_qh, stride_cb, stride_ct, stride_ch, stride_bt,
                                 stride_ob, stride_oh, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                                 PAGE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[b, h] = softmax(q[b, h] . K^T * scale) V over the context_lens[b] keys of KV head h // GROUP,
    for (b, h) = program_id(0, 1). Key p is row p % PAGE of block block_tables[b, p // PAGE]."""
    b, h = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(context_lens_ptr + b)  # read on the device: the grid depends on shapes only
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    # fp32 right after every load: the products run on the CUDA cores in fp32 anyway, and the
    # interpreter computes half types wrongly
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)  # noqa: E741  (m, l, acc: the FlashAttention paper's names)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    head_offs = (h // GROUP) * stride_ch + offs_d[None, :]
    for n0 in range(0, seq_len, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < seq_len  # never follow the table's -1 padding, nor read rows nobody wrote
        block = tl.load(table + pos // PAGE, mask=mask_n, other=0).to(tl.int64)  # a big cache overflows int32
        offs = block[:, None] * stride_cb + (pos % PAGE)[:, None] * stride_ct + head_offs
        mask_kv = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + offs, mask=mask_kv, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_cache_ptr + offs, mask=mask_kv, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * qk_scale  # one dot product per key, no tl.dot
        s = tl.where(mask_n, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))  # finite: every tile holds at least one key
        alpha = tl.exp2(m - m_new)  # log2(e) is folded into qk_scale
        p = tl.exp2(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)  # noqa: E741
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    o = acc / tl.where(l > 0, l, 1.0)  # no key (L == 0): zeros, not 0 / 0
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=mask_d)


def paged_decode_per_head(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """q: [B, H, D]; k_cache/v_cache: [num_blocks, block_size, Hkv, D] (same strides, D contiguous);
    block_tables: [B, max_blocks] int32 (-1 padded); context_lens: [B] int32 -> [B, H, D] in q.dtype
    (written into `out` if given; a sequence with no keys gets zeros). One program per (sequence,
    query head): a grid of (B, H), from shapes only, so a CUDA graph can capture it."""
    q, out = paged_decode_inputs("paged_decode_per_head", q, k_cache, v_cache, block_tables, context_lens, out)
    B, H, D = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    if B == 0 or H == 0:
        return out
    cuda = q.device.type == "cuda"
    launch = dict(num_warps=NUM_WARPS_CUDA, num_stages=NUM_STAGES_CUDA) if cuda else {}
    paged_decode_per_head_kernel[(B, H)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), GROUP=H // hkv, HEAD_DIM=D, PAGE=page,
        BLOCK_N=BLOCK_N_CUDA if cuda else BLOCK_N_CPU, BLOCK_D=triton.next_power_of_2(D), **launch)
    return out
