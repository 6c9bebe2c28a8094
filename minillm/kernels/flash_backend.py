"""The `flash_attn` attention backend (used only where flash-attn 2 imports).

flash-attn 2 reads a paged cache of the layout minillm uses, [num_blocks, block_size, Hkv, D], with
block tables of int32 block ids (-1 padding is never read: a sequence's table is read only up to
its own key count):

    prefill: flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             causal=True[, block_table])  -- on a prefix hit k/v are the caches and block_table the tables
    decode:  flash_attn_with_kvcache(q[:, None], k_cache, v_cache, cache_seqlens=context_lens,
             block_table=block_tables, causal=True)

Checked against flash-attn 2.8.3's source (flash_attn_interface.py, csrc/flash_attn/flash_api.cpp):
both paged paths refuse a block_size that is not a multiple of 256 and anything but fp16/bf16;
cu_seqlens, cache_seqlens and block tables must be int32 (the model runner's are); only the last
dimension of q/k/v must be contiguous. Causal masks align to the end of the keys, as minillm's do.
A paged prefill always runs the split-KV kernel; a decode row with cache_seqlens 0 (a CUDA-graph
padding row) writes zeros. The K/V store stays our Triton kernel (flash_attn_with_kvcache could
append k/v itself, but prefill could not).
"""
from __future__ import annotations

import torch

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError as e:  # e.g. flash-attn-4 alone: it installs flash_attn.cute, not these two
    raise ImportError(f"attention_backend='flash_attn' needs flash-attn 2 (flash_attn_varlen_func and "
                      f"flash_attn_with_kvcache); importing them failed: {e}") from e

from minillm.config import EngineConfig
from minillm.context import Context
from minillm.kernels.store_kvcache import store_kvcache

FLASH_PAGE_MULTIPLE = 256  # flash-attn 2's paged KV: block_size % 256 == 0
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def unsupported(dtype: torch.dtype, block_size: int) -> str | None:
    """What flash-attn 2 cannot compute, and the fix; None when it can. The one statement of its rules:
    the engine checks its config with them before building anything, each call checks its tensors."""
    if dtype not in FLASH_DTYPES:
        return (f"attention_backend='flash_attn' computes in float16/bfloat16, not {dtype}; "
                f"use dtype='bfloat16' or attention_backend='triton'")
    if block_size % FLASH_PAGE_MULTIPLE:
        return (f"flash-attn's paged KV cache needs kvcache_block_size to be a multiple of "
                f"{FLASH_PAGE_MULTIPLE}, got {block_size}; use kvcache_block_size=256 or attention_backend='triton'")
    return None


def _check(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    reason = unsupported(q.dtype, k_cache.shape[1] if k_cache.numel() else FLASH_PAGE_MULTIPLE)
    if reason:
        raise ValueError(reason)


class FlashAttnBackend:
    name = "flash_attn"

    @staticmethod
    def supports(config: EngineConfig) -> str | None:
        if config.device != "cuda":
            return "attention_backend='flash_attn' needs device='cuda'"
        return unsupported(config.torch_dtype, config.kvcache_block_size)

    @staticmethod
    def store(k, v, k_cache, v_cache, slot_mapping) -> None:
        store_kvcache(k, v, k_cache, v_cache, slot_mapping)

    @staticmethod
    def prefill(q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        """q: [N, H, D] packed queries -> [N, H, D]."""
        _check(q, k_cache)
        if ctx.block_tables is None or k_cache.numel() == 0:  # no prefix-cache hit: keys are this step's
            return flash_attn_varlen_func(q, k, v, cu_seqlens_q=ctx.cu_seqlens_q, cu_seqlens_k=ctx.cu_seqlens_q,
                                          max_seqlen_q=ctx.max_seqlen_q, max_seqlen_k=ctx.max_seqlen_q,
                                          softmax_scale=scale, causal=True)
        return flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=ctx.cu_seqlens_q, cu_seqlens_k=ctx.cu_seqlens_k,
                                      max_seqlen_q=ctx.max_seqlen_q, max_seqlen_k=ctx.max_seqlen_k,
                                      softmax_scale=scale, causal=True, block_table=ctx.block_tables)

    @staticmethod
    def decode(q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        """q: [B, H, D], one query per sequence -> [B, H, D]."""
        _check(q, k_cache)
        out = flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=ctx.context_lens,
                                      block_table=ctx.block_tables, softmax_scale=scale, causal=True)
        return out.squeeze(1)
