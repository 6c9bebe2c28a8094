"""RMSNorm, and the fused residual-add + RMSNorm that carries the residual between layers.

    rms_norm(x)            = x / sqrt(mean(x**2) + eps) * weight        (statistics in fp32)
    add_rms_norm(x, res)   = rms_norm(x + res), x + res                 (normed, new residual)

The two functions below are the torch reference (and what runs on CPU). On CUDA the engine runs the
same math as one Triton kernel (minillm.kernels.rmsnorm, exercise 2.12): one read of x and residual, one write of
both outputs, instead of the ~8 passes over memory that the eager torch ops make.
"""
from __future__ import annotations

import torch
from torch import nn

from minillm.kernels.rmsnorm import rms_norm_triton


# >>> exercise 2.1 | notebooks/02_decoder_layer.ipynb | 2. RMSNorm
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square normalization over the last dimension, then a learned per-channel scale.

    x: [..., d] (any dtype), weight: [d], eps: float -> [..., d]:
        weight * (x / sqrt(mean(x**2 over the last dim) + eps))
    The statistics are computed in fp32 whatever x's dtype; the normalized x is cast back to
    x.dtype *before* the multiplication by weight, as transformers' Qwen3RMSNorm does (so bf16
    results round the same way). The result's dtype is then that of weight * x.

    Hints: x.float(), pow(2).mean(dim=-1, keepdim=True), torch.rsqrt. No centering (no mean
    subtraction) and no bias: that is the difference from LayerNorm.
    """
    orig_dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * x.to(orig_dtype)
# <<< exercise 2.1


# >>> exercise 2.2 | notebooks/02_decoder_layer.ipynb | 3. The residual stream and fused add+RMSNorm
def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add a block's output to the residual stream, then normalize the sum: the engine's
    `input_layernorm(hidden_states, residual)`.

    x: [N, d] (the previous block's output), residual: [N, d] (the stream so far), weight: [d]
    -> (normed, new_residual), both [N, d]:
        new_residual = x + residual          (as torch adds them, like the unfused `residual + hidden`:
                                              bf16 + bf16 stays bf16; fp32 with bf16 gives fp32)
        normed       = rms_norm(new_residual, weight, eps)

    Hints: two lines; reuse rms_norm. Return the new residual too: the next block adds to it.
    """
    residual = x + residual
    return rms_norm(residual, weight, eps), residual
# <<< exercise 2.2


def apply_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm in torch: rms_norm, or add_rms_norm when there is a residual.

    x: [..., d] -> normed [..., d]; with residual [..., d] -> (normed, x + residual).
    """
    if residual is None:
        return rms_norm(x, weight, eps)
    return add_rms_norm(x, residual, weight, eps)


def _torch_norm(x, weight, eps, residual=None):  # the names are looked up when called: a swapped-in
    return apply_rms_norm(x, weight, eps, residual)  # exercise runs in a model built before the swap


def _triton_norm(x, weight, eps, residual=None):
    return rms_norm_triton(x, weight, eps, residual)


class RMSNorm(nn.Module):
    """Holds the weight (named as in the checkpoint); forward(x) or forward(x, residual). The
    implementation is chosen when the layer is built, from the device its weight is made on: the
    Triton kernel on CUDA, the torch functions elsewhere (build under `with torch.device("cuda"):`,
    as the engine does; a module moved later with .cuda() keeps the torch functions)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.norm = _triton_norm if self.weight.is_cuda else _torch_norm

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.norm(x, self.weight, self.eps, residual)
