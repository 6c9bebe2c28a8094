"""Rotary position embedding (RoPE), neox layout: the head is split in two halves that rotate together.

For position p and frequency index j < d/2:  theta_j = base ** (-2j / d),  angle = p * theta_j
    out[:d/2] = x1 * cos - x2 * sin,   out[d/2:] = x2 * cos + x1 * sin
"""
from __future__ import annotations

import torch
from torch import nn


def rope_cos_sin(head_dim: int, max_position: int, base: float) -> torch.Tensor:
    """-> [max_position, head_dim] fp32: cos of the angles in the first half, sin in the second."""
    # the same arithmetic as transformers' default rope init, so positions agree to the last bit
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, head_dim], positions: [N] int, cos_sin: [max_position, head_dim] -> x rotated, x.dtype."""
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)  # [N, 1, d/2] each
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float):
        super().__init__()
        self.register_buffer("cos_sin_cache", rope_cos_sin(head_dim, max_position, base), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return apply_rotary(q, positions, self.cos_sin_cache), apply_rotary(k, positions, self.cos_sin_cache)
