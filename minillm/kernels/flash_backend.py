"""The `flash_attn` attention backend (used only where the flash-attn package imports).

flash-attn 2 reads a paged cache of the layout minillm uses, [num_blocks, block_size, Hkv, D], with
block tables of int32 block ids (-1 padding is never read):

    prefill: flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             causal=True[, block_table])  -- on a prefix hit k/v are the caches and block_table the tables
    decode:  flash_attn_with_kvcache(q[:, None], k_cache, v_cache, cache_seqlens=context_lens,
             block_table=block_tables, causal=True)

Its paged path needs block_size to be a multiple of 256 and fp16/bf16 tensors; the K/V store
stays our Triton kernel (flash_attn_with_kvcache could append k/v itself, but prefill could not).
"""
from __future__ import annotations

import torch
from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

from minillm.context import Context
from minillm.kernels.store_kvcache import store_kvcache


def _check(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"attention_backend='flash_attn' computes in float16/bfloat16, not {q.dtype}; "
                         f"use dtype='bfloat16' or attention_backend='triton'")
    if k_cache.numel() and k_cache.shape[1] % 256:
        raise ValueError(f"flash-attn's paged KV cache needs kvcache_block_size to be a multiple of 256, got "
                         f"{k_cache.shape[1]}; use kvcache_block_size=256 or attention_backend='triton'")


class FlashAttnBackend:
    name = "flash_attn"

    @staticmethod
    def store(k, v, k_cache, v_cache, slot_mapping) -> None:
        store_kvcache(k, v, k_cache, v_cache, slot_mapping)

    @staticmethod
    def prefill(q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
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
        _check(q, k_cache)
        out = flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=ctx.context_lens,
                                      block_table=ctx.block_tables, softmax_scale=scale, causal=True)
        return out.squeeze(1)
