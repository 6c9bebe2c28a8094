"""Attention: the math (a causal GQA reference), the paged KV cache it reads, and the backends.

Every Attention layer owns one slice of the KV cache, k_cache/v_cache: [num_blocks, block_size,
num_kv_heads, head_dim]. Each step it first stores this step's K/V rows into their slots
(context.slot_mapping), then attends:

- prefill: packed queries of several sequences (context.cu_seqlens_q); when a sequence's prefix
  came from the prefix cache its keys are longer than its queries and are read through
  context.block_tables;
- decode: one query per sequence, context.context_lens[i] keys read through context.block_tables[i].

Backends: `torch` (the reference below: gather pages, then plain attention), `triton` (our
kernels), `flash_attn` (when installed, on request). `auto` picks triton on CUDA, torch on CPU. Each
follows AttentionBackend; what a backend cannot run (a device, a dtype, a block size) it says in its
own `supports`, the one place that rule is written.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from minillm.config import EngineConfig
from minillm.context import Context, get_context
from minillm.kernels.store_kvcache import store_kvcache_ref


# >>> exercise 2.4 | notebooks/02_decoder_layer.ipynb | 5. Attention: GQA and the causal mask
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence of grouped-query attention, causal, queries aligned to the end of the keys.

    q: [Lq, H, D], k/v: [Lk, Hkv, D] with H % Hkv == 0 and Lq <= Lk, scale: usually D ** -0.5
    -> [Lq, H, D] in q.dtype, math in fp32:
        out[i, h] = softmax_j(q[i, h] . k[j, g] * scale) @ v[:, g]    with g = h // (H // Hkv)
    Query i sits at position Lk - Lq + i (the keys before the queries are a cached prefix) and sees
    keys 0 .. Lk - Lq + i; later keys are masked out. Lq == Lk is a plain prefill, Lq == 1 a decode.

    Hints: repeat_interleave the KV heads H // Hkv times along the head axis (query heads
    g*(H/Hkv) .. (g+1)*(H/Hkv)-1 share KV head g); torch.einsum for the two products; a boolean
    mask from torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=Lk - Lq) (on q's
    device: the engine calls this with GPU tensors); masked_fill with -inf before the softmax.
    """
    Lq, H, _ = q.shape
    Lk, Hkv, _ = k.shape
    k = k.float().repeat_interleave(H // Hkv, dim=1)  # query head h reads KV head h // (H / Hkv)
    v = v.float().repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    visible = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=Lk - Lq)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).to(q.dtype)
# <<< exercise 2.4


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """cache: [num_blocks, block_size, Hkv, D], block_table: [>= ceil(length/block_size)] -> [length, Hkv, D]."""
    block_size = cache.shape[1]
    n = -(-length // block_size)
    return cache[block_table[:n].long()].flatten(0, 1)[:length]


def varlen_attention(q, k, v, cu_seqlens_q: list[int], cu_seqlens_k: list[int], scale: float) -> torch.Tensor:
    """Packed sequences: q [Nq, H, D], k/v [Nk, Hkv, D]; sequence i owns rows cu_seqlens_*[i]:[i+1]."""
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = cu_seqlens_q[i], cu_seqlens_q[i + 1], cu_seqlens_k[i], cu_seqlens_k[i + 1]
        out[qs:qe] = causal_attention(q[qs:qe], k[ks:ke], v[ks:ke], scale)
    return out


def paged_attention_ref(q, k_cache, v_cache, cu_seqlens_q: list[int], seqlens_k: list[int],
                        block_tables: torch.Tensor, scale: float) -> torch.Tensor:
    """Packed queries whose keys live in pages: sequence i has seqlens_k[i] keys in block_tables[i].
    Decode is the case of one query per sequence (cu_seqlens_q = 0, 1, ..., B)."""
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, n = cu_seqlens_q[i], cu_seqlens_q[i + 1], seqlens_k[i]
        k = gather_kv(k_cache, block_tables[i], n)
        v = gather_kv(v_cache, block_tables[i], n)
        out[qs:qe] = causal_attention(q[qs:qe], k, v, scale)
    return out


# >>> exercise 3.3 | notebooks/03_paged_kv_cache.ipynb | 4. Paged decode attention in torch
def paged_decode_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                       context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention over a paged KV cache: one new query token per sequence.

    q: [B, H, D]; k_cache/v_cache: [num_blocks, block_size, Hkv, D] (H % Hkv == 0: query head h
    reads KV head h // (H // Hkv)); block_tables: [B, max_blocks] int32, row b lists the physical
    blocks of sequence b in order, padded with -1; context_lens: [B] int32, sequence b attends to its
    first context_lens[b] cached tokens (all of them: the query is the newest token, no causal mask
    needed) -> [B, H, D] in q.dtype. softmax(q k^T * scale) v.

    Hints: gather every sequence's blocks at once with advanced indexing (k_cache[table] is
    [B, max_blocks, block_size, Hkv, D]; a -1 entry must not crash: clamp it, its keys get masked),
    flatten blocks x block_size into one key axis, then mask the key positions >= context_lens[b].
    Cache rows nobody wrote hold garbage, possibly NaN, and a softmax weight of 0 times NaN is NaN:
    zero the K/V rows you mask out. torch.nn.functional.scaled_dot_product_attention takes a boolean
    attn_mask (True = attend) and enable_gqa=True for Hkv < H; it wants [B, heads, length, D].

    Speed, not graded: on a CPU minillm's version reads no table column past the longest context,
    masks only when the lengths differ, and reads one sequence on consecutive blocks in place
    (batch-1 decode of a short context: no copy at all); on a 2-core CPU that took a call in the
    engine's batch-1 decode of smollm2-135m from about 310 to 130 us (the median of 3,840 calls
    each). On a GPU it reads nothing back to the host, so a CUDA graph can hold it.
    """
    block_size = k_cache.shape[1]
    blocks = block_tables.long().clamp_min(0)  # -1 padding reads block 0; its keys are masked below
    longest, masked, k = blocks.shape[1] * block_size, True, None
    if q.device.type == "cpu":
        # On a CPU, reading a value out of a tensor costs nothing (on a GPU each read waits for the
        # device, and a CUDA graph cannot hold it): read no column past the longest context, mask only
        # when the lengths differ, and read one sequence on consecutive blocks in place (no copy).
        longest = int(context_lens.max())
        blocks = blocks[:, :-(-longest // block_size)]
        masked = int(context_lens.min()) < longest  # (one length for all, always so at batch 1: no mask)
        if len(blocks) == 1 and (blocks.shape[1] == 1 or bool((blocks[0].diff() == 1).all())):
            first, n = int(blocks[0, 0]), blocks.shape[1]
            k = k_cache[first:first + n].flatten(0, 1)[None, :longest]  # [1, L, Hkv, D], a view
            v = v_cache[first:first + n].flatten(0, 1)[None, :longest]
    if k is None:
        # index_select copies whole blocks (runs of contiguous rows); k_cache[blocks], the same
        # result, goes element by element and took 2.5x as long on a CPU
        rows = (len(blocks), -1, *k_cache.shape[2:])
        k = k_cache.index_select(0, blocks.flatten()).view(rows)[:, :longest]  # [B, L, Hkv, D]
        v = v_cache.index_select(0, blocks.flatten()).view(rows)[:, :longest]
    visible = None
    if masked:  # hide each sequence's keys past its length
        visible = torch.arange(longest, device=q.device) < context_lens[:, None].to(q.device)  # [B, L]
        hide = ~visible[:, :, None, None]
        k, v = k.masked_fill(hide, 0), v.masked_fill(hide, 0)  # unwritten rows may hold NaN: 0 * NaN = NaN
        visible = visible[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=visible, scale=scale, enable_gqa=True)
    return out.squeeze(2)
# <<< exercise 3.3


class AttentionBackend(Protocol):
    """An attention backend: four static methods over the paged KV cache (the shapes are Attention's)."""

    name: str

    @staticmethod
    def supports(config: EngineConfig) -> str | None:
        """None when an engine with this (validated) config can run it; else why not, and the fix."""

    @staticmethod
    def store(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slot_mapping: torch.Tensor) -> None:
        """This step's K/V rows [N, Hkv, D] into their cache slots (SKIP_SLOT rows are not stored)."""

    @staticmethod
    def prefill(q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        """Packed queries [N, H, D] of several sequences (ctx.cu_seqlens_q), causal -> [N, H, D]."""

    @staticmethod
    def decode(q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        """One query per sequence [B, H, D] over its ctx.context_lens keys -> [B, H, D]."""


class TorchBackend:
    """The reference: readable, slow (prefill loops over sequences; decode gathers every page)."""

    name = "torch"

    @staticmethod
    def supports(config: EngineConfig) -> str | None:
        return None  # plain torch: any device, dtype and block size

    @staticmethod
    def store(k, v, k_cache, v_cache, slot_mapping):
        store_kvcache_ref(k, v, k_cache, v_cache, slot_mapping)

    @staticmethod
    def prefill(q, k, v, k_cache, v_cache, ctx: Context, scale: float):
        if ctx.block_tables is None or k_cache.numel() == 0:  # no prefix-cache hit: keys are this step's
            return varlen_attention(q, k, v, ctx.cu_seqlens_q_host, ctx.cu_seqlens_q_host, scale)
        cu_k = ctx.cu_seqlens_k_host
        seqlens_k = [cu_k[i + 1] - cu_k[i] for i in range(len(cu_k) - 1)]
        return paged_attention_ref(q, k_cache, v_cache, ctx.cu_seqlens_q_host, seqlens_k, ctx.block_tables, scale)

    @staticmethod
    def decode(q, k_cache, v_cache, ctx: Context, scale: float):
        return paged_decode_torch(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)


def get_backend(name: str, device: str) -> AttentionBackend:
    """Resolve an attention_backend name ('auto' included) to a backend. 'auto' takes triton on CUDA
    and torch elsewhere. It never takes flash_attn, even where flash-attn imports: on the H200 the
    triton backend ran the bench workload faster (26,964 against 23,634 tok/s) and decoded at batch 1
    faster (0.625 against 0.993 ms/token) in one run (README, Performance: the run of 2026-12-03
    beside the peers)."""
    if name == "auto":
        name = "triton" if device == "cuda" else "torch"
    if name == "torch":
        return TorchBackend
    if name == "triton":
        from minillm.kernels.backend import TritonBackend
        return TritonBackend
    if name == "flash_attn":
        try:
            from minillm.kernels.flash_backend import FlashAttnBackend
        except ImportError:
            raise ValueError("attention_backend='flash_attn' but flash-attn 2 is not installed; "
                             "pip install flash-attn, or use 'triton'/'torch'") from None
        return FlashAttnBackend
    raise ValueError(f"unknown attention backend {name!r}; use auto, torch, triton or flash_attn")


def backend_for(config: EngineConfig) -> AttentionBackend:
    """The backend an engine with this validated config runs; ValueError when it cannot run it."""
    backend = get_backend(config.attention_backend, config.device)
    reason = backend.supports(config)
    if reason:
        raise ValueError(reason)
    return backend


class Attention(nn.Module):
    """q: [N, H, D], k/v: [N, Hkv, D] for this step's tokens -> [N, H, D]."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 backend: AttentionBackend = TorchBackend):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.k_cache = self.v_cache = torch.tensor([])  # set by the model runner once memory is measured
        self.backend = backend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_stored: bool = False) -> torch.Tensor:
        """kv_stored: this step's k/v are already in the cache (a fused kernel wrote them)."""
        ctx = get_context()
        k_cache, v_cache = self.k_cache, self.v_cache
        if k_cache.numel() and ctx.slot_mapping is not None and not kv_stored:
            self.backend.store(k, v, k_cache, v_cache, ctx.slot_mapping)
        if ctx.is_prefill:
            return self.backend.prefill(q, k, v, k_cache, v_cache, ctx, self.scale)
        return self.backend.decode(q, k_cache, v_cache, ctx, self.scale)
