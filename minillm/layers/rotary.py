"""Rotary position embedding (RoPE), neox layout: the head is split in two halves that rotate together.

For position p and frequency index j < d/2:  theta_j = base ** (-2j / d),  angle = p * theta_j
    out[:d/2] = x1 * cos - x2 * sin,   out[d/2:] = x2 * cos + x1 * sin
Each pair (x1[j], x2[j]) is a 2-D vector turned by the angle p * theta_j, so the dot product of a
query at position p and a key at position s depends on p - s only: attention sees relative positions.
"""
from __future__ import annotations

import torch
from torch import nn


# >>> exercise 2.3 | notebooks/02_decoder_layer.ipynb | 4. Rotary position embedding
def rope_cos_sin(head_dim: int, max_position: int, base: float) -> torch.Tensor:
    """The cos/sin cache, computed once per model: row p holds position p's rotation.

    head_dim: d (even), max_position: P, base: rope theta (10,000 for Llama, 1,000,000 for Qwen3)
    -> [P, d] fp32: [cos(p * theta_j) for j < d/2 | sin(p * theta_j) for j < d/2] in row p,
    with theta_j = 1 / base ** (2j / d).

    Hints: compute inv_freq exactly as transformers does, in fp32, so the angles agree to the last bit
    (written as base ** (-2j / d), or in fp64, they differ by up to 3e-4 at 4,096 positions):
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).float() / d)); an outer product of the fp32
    positions and inv_freq gives the [P, d/2] angles; torch.cat the cos and sin halves.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate every head of every token by its own position (neox layout: halves, not pairs).

    x: [N, heads, d] queries or keys of a packed batch (several sequences back to back),
    positions: [N] int, each token's position in its own sequence (they restart at each sequence
    start, and start past the cached prefix in a decode or prefix-cached step),
    cos_sin: [P, d] from rope_cos_sin -> [N, heads, d] in x.dtype, math in fp32:
        x1, x2 = the first and second halves of x's last dim
        out = [x1 * cos - x2 * sin | x2 * cos + x1 * sin]   with cos, sin taken at each token's position

    Hints: index the cache with positions (cos_sin[positions]: [N, d]), then unsqueeze a heads axis
    so one row broadcasts over all heads; chunk(2, dim=-1) splits halves.
    """
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)  # [N, 1, d/2] each
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
# <<< exercise 2.3


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin cache (a buffer, not saved in checkpoints); forward rotates q and k."""

    def __init__(self, head_dim: int, max_position: int, base: float):
        super().__init__()
        self.register_buffer("cos_sin_cache", rope_cos_sin(head_dim, max_position, base), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return apply_rotary(q, positions, self.cos_sin_cache), apply_rotary(k, positions, self.cos_sin_cache)
