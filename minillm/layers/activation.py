"""SiLU-and-mul: the gate of a SwiGLU MLP, down_proj(silu(gate_proj(x)) * up_proj(x)).

The gate and up projections are packed into one matmul (MergedColumnParallelLinear), so the
activation receives [N, 2*I] = [gate | up] and returns [N, I].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# >>> exercise 2.5 | notebooks/02_decoder_layer.ipynb | 6. The MLP: SwiGLU
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The SwiGLU gate on the packed output of the gate_up projection.

    x: [..., 2*I] = [gate | up] (the first half is gate_proj's output, the second up_proj's)
    -> [..., I] in x.dtype: silu(gate) * up, where silu(g) = g * sigmoid(g).

    Hints: chunk(2, dim=-1); torch.nn.functional.silu.
    """
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
# <<< exercise 2.5


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
