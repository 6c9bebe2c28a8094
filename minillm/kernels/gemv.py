"""GEMV for batch-1 decode: y[1, N] = x[1, K] @ W[N, K]^T (+ bias), at memory speed.

At batch 1 a linear layer is a matrix-vector product: it reads all of W once and does 2 FLOPs per
weight, so it can only be as fast as memory. cuBLAS's general kernels leave much of the bandwidth
unused at this shape (an H200 profile of Qwen3-0.6B: 0.4-2.1 TB/s). Here each program loads a
[BLOCK_N, K] slab of W (whole rows, one load) and keeps BLOCK_N fp32 dot products in registers.

Matrices of 4-12 MB are too small to reach the copy bandwidth on their own: a kernel's first bytes
arrive a microsecond or more after it starts. Two things hide that:

* **Programmatic dependent launch** (PDL, Hopper and later). A kernel launched with it may start
  while the kernel before it is still running; `gdc_wait()` then blocks until that kernel is done
  and its writes are visible. W never depends on an earlier kernel, so each program loads its slab
  *before* waiting: the next layer's weights stream in while the previous kernel finishes.
  `gdc_launch_dependents()` lets the kernel after this one start early in the same way.
* **Prologues**, so fewer kernels run at all: the RMSNorm before qkv_proj and gate_up_proj (with
  its residual add) and the SiLU-and-mul before down_proj are computed by every program from the
  small input vector, instead of by a kernel of their own. Rounding points match the unfused ops.
"""
from __future__ import annotations

import ast
import functools
import inspect
import os
import textwrap

import torch
import triton
import triton.language as tl

MAX_ROW = 4096  # longest K loaded as one whole row; longer rows loop over K tiles (no prologue then)
NONE, RMSNORM, ADD_RMSNORM, SILU_MUL = 0, 1, 2, 3  # the kernel's PROLOGUE (literals in the kernel)
GEMV_CONFIGS: dict = {}  # (N, K) -> (BLOCK_N, num_warps): overrides gemv_config (tuning sweeps)


def gemv_config(n: int, k: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps), from H200 sweeps of the whole batch-1 forward of Qwen3-0.6B (each
    projection's choice timed inside the CUDA graph of all 28 layers, LM head and sampler included):
    16-row programs with 4 warps for 1k-long rows (qkv_proj, gate_up_proj, the LM head), 8 rows and
    8 warps for 2k-long ones (o_proj), 4 rows and 8 warps once a row is 3-4k long (down_proj).
    16 rows for 1k-long rows measured 640 -> 620 us per step at a 384-token context and 830 -> 804 us
    at 3,928 (8 rows before; the logits the same to the bit). 16 rows for o_proj and down_proj too
    were no faster (621 and 800 us), and with gate_up_proj left at 8 rows slower (659 and 833 us):
    the kernels' programs share the SMs while PDL runs them ahead (2026-12-03)."""
    if (n, k) in GEMV_CONFIGS:
        return GEMV_CONFIGS[(n, k)]
    block_k = min(triton.next_power_of_2(k), MAX_ROW)
    if block_k <= 1024:
        return 16, 4
    return (8 if block_k <= 2048 else 4), 8


@functools.lru_cache(maxsize=None)
def pdl_supported(device: torch.device) -> bool:
    """PDL needs compute capability 9.0+ (Hopper); MINILLM_PDL=0 turns it off."""
    if device.type != "cuda" or os.environ.get("MINILLM_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


@functools.lru_cache(maxsize=None)
def waits_for_previous_kernel(kernel) -> bool:
    """Whether a @triton.jit kernel's code (not its docstring) calls gdc_wait()."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn)))
    return any(isinstance(node, ast.Attribute) and node.attr == "gdc_wait" for node in ast.walk(tree))


def pdl_args(device: torch.device, kernel=None) -> dict:
    """Launch keywords for a kernel with a USE_PDL constexpr: the flag, and launch_pdl where it is on.
    kernel: an exercise's kernel (USE_PDL defaults to False), which a student may have written without
    the `gdc_wait()`. Launched early, such a kernel would read its input while the kernel before it
    still writes it, so it is launched the ordinary way, and USE_PDL is not passed at all (a kernel
    from an older stub does not declare it)."""
    if pdl_supported(device) and (kernel is None or waits_for_previous_kernel(kernel)):
        return {"USE_PDL": True, "launch_pdl": True}
    return {} if kernel is not None else {"USE_PDL": False}


@triton.jit
def _gemv_kernel(x_ptr, r_ptr, nw_ptr, r_out_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn, eps,
                 PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 USE_PDL: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    cols = tl.arange(0, BLOCK_K)
    mask_k = cols < K
    # the weights depend on no earlier kernel: load them before waiting for it
    w = tl.load(w_rows + cols[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # from here on, the previous kernel's outputs are visible
    dtype = y_ptr.dtype.element_ty
    if PROLOGUE == 3:  # SiLU-and-mul: x_ptr holds [gate | up], each K long
        gate = tl.load(x_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + K + cols, mask=mask_k, other=0.0).to(tl.float32)
        x = ((gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up).to(dtype).to(tl.float32)
    else:
        x = tl.load(x_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)
    if PROLOGUE == 2:  # residual add, then RMSNorm
        x = (x + tl.load(r_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        tl.store(r_out_ptr + cols, x.to(dtype), mask=mask_k & (pid == 0))  # the new residual, once
    if PROLOGUE == 1 or PROLOGUE == 2:  # RMSNorm
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
        nw = tl.load(nw_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)
        x = ((x * rstd).to(dtype).to(tl.float32) * nw).to(dtype).to(tl.float32)
    acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    for k0 in range(BLOCK_K, K, BLOCK_K):  # rows longer than MAX_ROW (no prologue)
        c = k0 + cols
        xk = tl.load(x_ptr + c, mask=c < K, other=0.0).to(tl.float32)
        wk = tl.load(w_rows + c[None, :], mask=mask_n[:, None] & (c < K)[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(wk * xk[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, acc.to(dtype), mask=mask_n)


def _launch(x, weight, bias, prologue, k, residual=None, norm_weight=None, eps=0.0, config=None):
    n = weight.shape[0]
    if weight.shape[1] != k or weight.stride(1) != 1 or x.shape[0] != 1:
        raise ValueError(f"gemv: x {tuple(x.shape)} must be one row and weight {tuple(weight.shape)} "
                         f"[N, {k}] with contiguous rows")
    if prologue != NONE and k > MAX_ROW:
        raise ValueError(f"gemv: a fused prologue needs K <= {MAX_ROW}, got {k}; run the op on its own")
    x = x.contiguous()
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    r_out = torch.empty(1, k, dtype=x.dtype, device=x.device) if prologue == ADD_RMSNORM else None
    block_n, warps = config or gemv_config(n, k)
    block_k = min(triton.next_power_of_2(k), MAX_ROW)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else x,
        r_out if r_out is not None else y, weight, bias if bias is not None else weight, y, n, k,
        weight.stride(0), eps, PROLOGUE=prologue, HAS_BIAS=bias is not None, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=warps, num_stages=1 if block_k >= k else 3, **pdl_args(x.device))
    return y, r_out


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: tuple[int, int] | None = None) -> torch.Tensor:
    """x: [1, K] (contiguous), weight: [N, K] (rows contiguous), bias: [N] or None -> [1, N] in x.dtype."""
    return _launch(x, weight, bias, NONE, weight.shape[1], config=config)[0]


def gemv_rms_norm(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                  bias: torch.Tensor | None = None, residual: torch.Tensor | None = None):
    """linear(add_rms_norm(x, norm_weight, eps, residual)) in one kernel. x, residual: [1, K] ->
    (y [1, N], the new residual x + residual [1, K]; x itself when residual is None)."""
    prologue = RMSNORM if residual is None else ADD_RMSNORM
    y, r_out = _launch(x, weight, bias, prologue, x.shape[1], residual, norm_weight, eps)
    return y, (x if residual is None else r_out)


def gemv_silu_mul(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu_and_mul(gate_up)) in one kernel. gate_up: [1, 2K] = [gate | up] -> [1, N]."""
    return _launch(gate_up, weight, bias, SILU_MUL, gate_up.shape[1] // 2)[0]
