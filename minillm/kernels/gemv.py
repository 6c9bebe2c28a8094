"""GEMV for batch-1 decode: y[1, N] = x[1, K] @ W[N, K]^T (+ bias), at memory speed.

At batch 1 a linear layer is a matrix-vector product: it reads all of W once and does 2 FLOPs per
weight, so it can only be as fast as memory. cuBLAS's general kernels leave much of the bandwidth
unused at this shape (an H200 profile of Qwen3-0.6B: 0.4-2.1 TB/s); here each program streams a
[BLOCK_N, K] slab of W in [BLOCK_N, BLOCK_K] tiles and keeps BLOCK_N fp32 dot products in registers.
Measured there (graph-timed, 8 rotating weights): 1.3-2.3 TB/s against cuBLAS's 0.4-2.1. Matrices of
4-12 MB are too small to reach the copy bandwidth: a kernel's ramp-up costs a few microseconds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl



def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages), picked by an H200 sweep at Qwen3-0.6B's shapes:
    few output rows (o_proj, down_proj: N = 1024, long K) want long K tiles and 8 warps per program;
    many rows (qkv, gate_up) want 4-row programs, enough of them to cover every SM twice."""
    return (8, 1024, 8, 3) if n <= 2048 else (4, 512, 8, 3)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask_k = cols < K
        x = tl.load(x_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=mask_n)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x: [1, K] (contiguous), weight: [N, K] (rows contiguous), bias: [N] or None -> [1, N] in x.dtype."""
    n, k = weight.shape
    if x.shape != (1, k) or weight.stride(1) != 1:
        raise ValueError(f"gemv: x {tuple(x.shape)} must be [1, {k}] and weight's rows contiguous")
    x = x.contiguous()
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = config or gemv_config(n, k)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, n, k, weight.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return y
