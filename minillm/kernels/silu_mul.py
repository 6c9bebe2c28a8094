"""Fused SiLU-and-mul: [N, 2I] = [gate | up] -> silu(gate) * up, one read and one write per element
(eager PyTorch makes three passes: silu, multiply, and the strided read of each half)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.gemv import pdl_args


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inter, x_stride, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:  # launched early (minillm.kernels.gemv explains PDL): wait for gate_up before reading it
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + inter + cols, mask=mask, other=0.0).to(tl.float32)
    # transformers rounds silu(gate) to the model dtype before the multiply
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * inter + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x: [N, 2I] (rows contiguous) -> [N, I] in x.dtype."""
    n, two_i = x.shape
    inter = two_i // 2
    out = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    block = 1024
    if n:
        _silu_mul_kernel[(n, triton.cdiv(inter, block))](x, out, inter, x.stride(0), BLOCK=block, num_warps=4,
                                                            **pdl_args(x.device))
    return out
