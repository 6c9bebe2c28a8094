"""Fused residual-add + RMSNorm in one Triton kernel: one pass over each row.

    new_residual = x + residual                                   (rounded to x.dtype, as torch does)
    out          = (new_residual * rsqrt(mean(new_residual**2) + eps)).to(x.dtype) * weight

Eager PyTorch runs this as about eight kernels (add, cast, pow, mean, add eps, rsqrt, mul, cast,
mul), each reading and writing the whole [N, d] tensor. Normalizing a row needs only that row, so
one program per row can load x and residual once, keep the row in registers, and write the two
outputs once: 4 * N * d * itemsize bytes of traffic, the floor for this op. On an H200 that makes
it bandwidth-bound at the device's copy speed.

The torch reference beside it is `add_rms_norm_ref` (the same math as minillm.layers.layernorm's
rms_norm / add_rms_norm, which the engine runs on CPU). On a machine without CUDA the kernel runs
in Triton's interpreter (minillm/kernels/__init__.py sets TRITON_INTERPRET=1): there, compute in
fp32 (bf16 arithmetic is wrong in the interpreter) and mask every load (out-of-bounds reads return
junk silently).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.gemv import pdl_args


def add_rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """The torch reference: x [..., d] -> normed; with residual -> (normed, x + residual). Out in x.dtype."""
    if residual is not None:
        x = residual = x + residual
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out = (normed * weight).to(x.dtype)
    return out if residual is None else (out, residual)


# >>> exercise 2.12 | notebooks/02_decoder_layer.ipynb | 8. A Triton kernel for add+RMSNorm
@triton.jit
def add_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    n_cols, stride_x, stride_residual, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    """One program normalizes one row (program id = row index), in a single pass over memory.

    x_ptr, residual_ptr: [n_rows, n_cols] inputs, rows `stride_x` / `stride_residual` elements apart
    (columns contiguous); weight_ptr: [n_cols] (x's dtype); out_ptr, residual_out_ptr: [n_rows, n_cols]
    contiguous outputs (row stride n_cols). BLOCK_N: a power of two >= n_cols.
        h = x + residual                      (only when HAS_RESIDUAL; else h = x)
        residual_out = h                      (only when HAS_RESIDUAL: without a residual the launcher
                                               passes out itself as residual_out_ptr)
        out = (h * rsqrt(mean(h**2) + eps)) * weight
    Store outputs in the output tensors' dtype (residual_out_ptr.dtype.element_ty).
    USE_PDL (chapter 5's programmatic dependent launch; always False on a CPU): the launcher may start
    this kernel before the one writing x has finished. Begin with `if USE_PDL:` then
    `tl.extra.cuda.gdc_launch_dependents()` and `tl.extra.cuda.gdc_wait()`, which blocks until x is
    written (a kernel without the wait is launched the ordinary way).

    Hints: cols = tl.arange(0, BLOCK_N) and a mask cols < n_cols on every load and store (rows of
    576 columns leave 448 lanes of a 1024 block idle; the interpreter reads junk there silently).
    Load with other=0.0 so masked lanes add nothing to the sum. Compute in fp32 (.to(tl.float32)
    after each load). To match torch in bf16, round twice, each time to the output dtype and back
    (.to(dtype).to(tl.float32)): h, before storing it and before the statistics; and the normalized
    row h * rstd, before multiplying it (in fp32) by the weight.
    tl.sum(v, axis=0), tl.rsqrt. Divide by n_cols, not BLOCK_N.
    """
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride overflows int32 past 2 GiB
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype)  # the new residual, rounded as torch's `x + residual` is
        tl.store(residual_out_ptr + row * n_cols + cols, h, mask=mask)
        h = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (h * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * n_cols + cols, out.to(dtype), mask=mask)


# exercise: given
def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                    num_warps: int | None = None):
    """Launch add_rms_norm_kernel, one program per row. x: [..., d] -> normed [..., d] in x.dtype;
    with residual [..., d] -> (normed, x + residual). num_warps: None picks 16 bytes per thread."""
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected ({d},) to match x's last dimension")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)}; expected x's shape {tuple(x.shape)}")
    x2 = x.reshape(-1, d)  # a view when it can be (rows may be strided), else a copy
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    r2 = x2 if residual is None else residual.reshape(-1, d)
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    r_out = out if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n_rows = x2.shape[0]
    if n_rows == 0:
        return out if residual is None else (out, r_out)
    block = triton.next_power_of_2(d)
    if num_warps is None:  # a 16-byte vector per thread per load: bf16 x 1024 -> 4 warps
        num_warps = min(max(block * x.element_size() // (16 * 32), 1), 16)
    add_rms_norm_kernel[(n_rows,)](
        x2, r2, weight, out, r_out, d, x2.stride(0), r2.stride(0), eps,
        HAS_RESIDUAL=residual is not None, BLOCK_N=block, num_warps=num_warps,
        **pdl_args(x.device, add_rms_norm_kernel),
    )
    return out if residual is None else (out, r_out)
# <<< exercise 2.12
