"""store_kvcache: write this step's K/V rows into their slots of the paged cache.

Slot s is row s % block_size of block s // block_size; a slot of -1 means "do not store"
(padding rows of a CUDA-graph batch).
"""
from __future__ import annotations

import torch


def store_kvcache_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """key/value: [N, Hkv, D]; k_cache/v_cache: [num_blocks, block_size, Hkv, D]; slot_mapping: [N] int."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)
