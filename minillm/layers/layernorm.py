"""RMSNorm, and the fused residual-add + RMSNorm that carries the residual between layers.

    rms_norm(x)            = x / sqrt(mean(x**2) + eps) * weight        (computed in fp32)
    add_rms_norm(x, res)   = rms_norm(x + res), x + res                 (normed, new residual)
"""
from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., d], weight: [d] -> [..., d] in x.dtype. Statistics in fp32, as transformers does."""
    orig_dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * x.to(orig_dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [N, d] -> (rms_norm(x + residual), x + residual), both in x.dtype."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)
