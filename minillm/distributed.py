"""Tensor-parallel rank and size, and the collectives the parallel layers call.

With no process group (the single-process engine) rank is 0, size is 1 and the collectives are
no-ops, so the same layer code runs with and without tensor parallelism.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the ranks in place (Megatron's one all-reduce per attention or MLP block)."""
    if tp_size() > 1:
        dist.all_reduce(x)
    return x
