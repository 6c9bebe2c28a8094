"""The attention context: per-step batch metadata that every Attention layer reads.

The model runner sets it before a forward and resets it after, so the decoder layers keep the
plain `forward(positions, hidden_states)` signature of a Hugging Face model (nano-vLLM's design).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SKIP_SLOT = -1  # a slot_mapping entry whose row's K/V is not stored (a CUDA-graph padding row)
PAD_BLOCK = -1  # a block_tables entry past a sequence's last block (context_lens keeps its keys out)


@dataclass
class Context:
    is_prefill: bool = False
    # prefill: queries are packed sequences; sequence i owns rows cu_seqlens_q[i]:cu_seqlens_q[i+1]
    cu_seqlens_q: torch.Tensor | None = None  # [B+1] int32
    cu_seqlens_k: torch.Tensor | None = None  # [B+1] int32, keys include the prefix-cached tokens
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    # both phases: row r of this step's K/V goes to flat cache slot slot_mapping[r] (SKIP_SLOT: not stored)
    slot_mapping: torch.Tensor | None = None  # [N] int64 (int32 in the decode graphs' inputs)
    # decode: one query per sequence, context_lens[i] keys read through block_tables[i]
    context_lens: torch.Tensor | None = None  # [B] int32
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, padded with PAD_BLOCK
    # host copies the torch reference backend loops over (avoids a device sync per sequence)
    cu_seqlens_q_host: list[int] | None = None
    cu_seqlens_k_host: list[int] | None = None
    context_lens_host: list[int] | None = None


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(**kwargs) -> None:
    global _CONTEXT
    _CONTEXT = Context(**kwargs)


def reset_context() -> None:
    global _CONTEXT
    _CONTEXT = Context()
