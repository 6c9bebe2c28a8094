"""The batch-1 MLP in one kernel: add + RMSNorm, gate_up_proj, SiLU-and-mul and down_proj.

At batch 1 the MLP is two GEMVs (minillm.kernels.gemv): gate_up_proj with the RMSNorm as its
prologue, then down_proj with SiLU-and-mul as its. down_proj needs *every* unit of the
intermediate vector, so it has to wait for the whole gate_up kernel to end: one more kernel
boundary per layer, about 1.5-2 us of dependent latency on an H100/H200 (notebook 05, section 7).

Here the split runs the other way. Program p owns BLOCK_U units of the intermediate vector: it
loads their gate and up rows *and* their down_proj columns (all weights, before `gdc_wait()`, while
the kernel before it finishes), computes its units' silu(gate) * up from the normalized input,
multiplies them by its down_proj columns, and adds that partial output ([hidden], fp32) into `acc`
with atomic adds. No program waits for another; the sum of all partials is down_proj's output.

`acc` must hold zeros when the kernel starts: the engine's o_proj GEMV of the same layer writes
them (gemv(..., zero=acc)), so no memset kernel runs between the two. The output stays fp32; the
next kernel (the next layer's qkv GEMV, or the final norm) rounds it to the model's dtype where the
unfused path rounds down_proj's output. Atomic adds make the summation order vary from run to run:
the result moves by fp32 rounding (~1e-7 relative), below the bf16 rounding that follows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.gemv import pdl_args

MLP_B1_MAX_HIDDEN = 1024  # a program holds 3 x BLOCK_U x hidden weights in registers; measured at 1024
MLP_B1_CONFIG = dict(BLOCK_U=16, num_warps=8)  # units a program, warps (Qwen3-0.6B on an H100/H200)


@triton.jit
def _mlp_b1_kernel(x_ptr, r_ptr, nw_ptr, r_out_ptr, wgu_ptr, wd_ptr, acc_ptr, I, K, stride_gu, stride_dn,
                   stride_dk, eps, BLOCK_U: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
                   PARTS: tl.constexpr = 1):
    pid = tl.program_id(0)
    units = pid * BLOCK_U + tl.arange(0, BLOCK_U)
    cols = tl.arange(0, BLOCK_K)  # the hidden dimension: gate_up's input, down_proj's output
    mask_k = cols < K
    mask = (units < I)[:, None] & mask_k[None, :]
    gate_rows = wgu_ptr + units.to(tl.int64)[:, None] * stride_gu + cols[None, :]
    # weights depend on no earlier kernel: load all three slabs before waiting for it
    w_gate = tl.load(gate_rows, mask=mask, other=0.0)
    w_up = tl.load(gate_rows + I * stride_gu, mask=mask, other=0.0)
    # down_proj's columns `units`, as [BLOCK_U, hidden] (down_proj's weight is [hidden, I])
    w_down = tl.load(wd_ptr + units.to(tl.int64)[:, None] * stride_dk + cols[None, :] * stride_dn, mask=mask,
                     other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # from here on, o_proj's output (and its zeros in acc) are visible
    dtype = r_out_ptr.dtype.element_ty
    # the rounding points of the unfused path: add + RMSNorm, gate_up, SiLU-and-mul, each in dtype
    x = tl.load(x_ptr + cols, mask=mask_k, other=0.0).to(dtype).to(tl.float32)
    x = (x + tl.load(r_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(r_out_ptr + cols, x.to(dtype), mask=mask_k & (pid == 0))  # the new residual, once
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
    nw = tl.load(nw_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)
    x = ((x * rstd).to(dtype).to(tl.float32) * nw).to(dtype).to(tl.float32)
    gate = tl.sum(w_gate.to(tl.float32) * x[None, :], axis=1).to(dtype).to(tl.float32)
    up = tl.sum(w_up.to(tl.float32) * x[None, :], axis=1).to(dtype).to(tl.float32)
    a = ((gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up).to(dtype).to(tl.float32)  # [BLOCK_U]
    part = tl.sum(w_down.to(tl.float32) * a[:, None], axis=0)  # [hidden]: these units' share of down_proj
    # PARTS > 1 (tests/gpu/batch1_probes.py): the programs spread their adds over PARTS rows of acc
    tl.atomic_add(acc_ptr + (pid % PARTS) * K + cols, part, mask=mask_k, sem="relaxed")


def mlp_b1(h: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
           gate_up_weight: torch.Tensor, down_weight: torch.Tensor, acc: torch.Tensor,
           config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """down_proj(silu_and_mul(gate_up_proj(add_rms_norm(h, norm_weight, eps, residual)))) for one token.

    h: [1, hidden] (o_proj's output), residual: [1, hidden]; gate_up_weight: [2 * I, hidden] = [gate | up]
    (rows contiguous); down_weight: [hidden, I] (any strides: column-major reads a program's columns
    contiguous); acc: [1, hidden] fp32, all zeros. config: overrides of MLP_B1_CONFIG (tuning sweeps).
    -> (acc holding the MLP's output, the new residual h + residual in the weights' dtype)."""
    hidden, inter = h.shape[-1], down_weight.shape[1]
    if (h.shape != (1, hidden) or residual.shape != h.shape or gate_up_weight.shape != (2 * inter, hidden)
            or down_weight.shape != (hidden, inter)):
        raise ValueError(f"mlp_b1: h {tuple(h.shape)} and residual {tuple(residual.shape)} must be [1, hidden], "
                         f"gate_up {tuple(gate_up_weight.shape)} [2 * I, hidden], down {tuple(down_weight.shape)} "
                         f"[hidden, I]")
    if gate_up_weight.stride(1) != 1 or acc.dtype != torch.float32 or acc.shape != h.shape:
        raise ValueError("mlp_b1: gate_up_weight needs contiguous rows and acc must be [1, hidden] fp32")
    r_out = torch.empty(1, hidden, dtype=gate_up_weight.dtype, device=h.device)
    cfg = dict(MLP_B1_CONFIG, **(config or {}))
    block_u = cfg.pop("BLOCK_U")
    _mlp_b1_kernel[(triton.cdiv(inter, block_u),)](
        h, residual, norm_weight, r_out, gate_up_weight, down_weight, acc, inter, hidden, gate_up_weight.stride(0),
        down_weight.stride(0), down_weight.stride(1), eps, BLOCK_U=block_u, BLOCK_K=triton.next_power_of_2(hidden),
        num_stages=1, **cfg, **pdl_args(h.device))
    return acc, r_out
