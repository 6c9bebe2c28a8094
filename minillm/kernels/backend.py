"""The `triton` attention backend: our own kernels for every step of the paged KV cache.

    store   -> store_kvcache            (this step's K/V rows into their slots)
    prefill -> prefill_attention         (packed varlen queries; keys from the cache pages on a prefix hit)
    decode  -> paged_decode_attention    (one query per sequence, split-K when the batch is small)

Decode does no host sync and no data-dependent Python, so chapter 5 can capture it in a CUDA graph.
"""
from __future__ import annotations

import torch
from triton.runtime.interpreter import InterpretedFunction

from minillm.config import EngineConfig
from minillm.context import Context
from minillm.kernels import paged_attention
from minillm.kernels.paged_attention import paged_decode_attention
from minillm.kernels.prefill_attention import prefill_attention
from minillm.kernels.store_kvcache import store_kvcache


class TritonBackend:
    name = "triton"

    @staticmethod
    def supports(config: EngineConfig) -> str | None:
        """Any dtype and block size: compiled on CUDA, in Triton's interpreter on a CPU. The interpreter is
        chosen when the kernels are defined (minillm.kernels turns it on where there is no CUDA); kernels
        compiled for a GPU cannot read CPU tensors."""
        if config.device == "cpu" and not isinstance(paged_attention.paged_decode_kernel, InterpretedFunction):
            return ("attention_backend='triton' on a CPU runs in Triton's interpreter, which is off in this "
                    "process (it has CUDA, so the kernels were compiled for the GPU): set TRITON_INTERPRET=1 "
                    "before importing minillm, or use attention_backend='torch' on the CPU")
        return None

    @staticmethod
    def store(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slot_mapping: torch.Tensor) -> None:
        store_kvcache(k, v, k_cache, v_cache, slot_mapping)

    @staticmethod
    def prefill(q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        if ctx.block_tables is None or k_cache.numel() == 0:  # no prefix-cache hit: keys are this step's
            return prefill_attention(q, k, v, ctx.cu_seqlens_q, ctx.cu_seqlens_q, ctx.max_seqlen_q, scale)
        return prefill_attention(q, k_cache, v_cache, ctx.cu_seqlens_q, ctx.cu_seqlens_k, ctx.max_seqlen_q, scale,
                                 block_tables=ctx.block_tables)

    @staticmethod
    def decode(q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)
