"""Fused sampling: logits -> token ids in two small kernels, one read of the logits.

The torch sampler makes ~8 passes over a [B, vocab] fp32 matrix (cast, divide, uniform noise,
two logs, subtract, argmax): at batch 256 and Qwen's 151,936-token vocabulary that is ~2 GB of
traffic per decode step. Here each program reads one chunk of one row once, adds Gumbel noise
drawn in registers (Philox, keyed by a per-row seed: no noise tensor), and keeps the chunk's best;
a second kernel picks each row's best chunk. Rows with temperature 0 take the plain argmax.

    token = argmax_i ( logits_i / T - log(-log U_i) ),  U_i ~ Uniform(0, 1)   (Gumbel-max)

pick_input_ids feeds the samples back: with async scheduling the next step's input token of a
sequence may still be on the device, and the decode CUDA graph picks it out of the last samples.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sample_chunk_kernel(logits_ptr, temps_ptr, seeds_ptr, part_val_ptr, part_idx_ptr, vocab, stride_row,
                         num_chunks, BLOCK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
    t = tl.load(temps_ptr + row)
    if t > 0:
        u = tl.rand(tl.load(seeds_ptr + row), cols)  # the same (seed, column) always draws the same U
        x = x / t - tl.log(-tl.log(u))  # U = 0 gives -inf: never chosen
    x = tl.where(mask, x, float("-inf"))
    best = tl.argmax(x, 0)
    tl.store(part_val_ptr + row * num_chunks + chunk, tl.max(x, 0))
    tl.store(part_idx_ptr + row * num_chunks + chunk, chunk * BLOCK + best)


@triton.jit
def _sample_reduce_kernel(part_val_ptr, part_idx_ptr, out_ptr, num_chunks, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_C)
    vals = tl.load(part_val_ptr + row * num_chunks + offs, mask=offs < num_chunks, other=float("-inf"))
    best = tl.argmax(vals, 0)
    tl.store(out_ptr + row, tl.load(part_idx_ptr + row * num_chunks + best).to(tl.int64))


def sample_triton(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor, block: int = 4096,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """logits: [B, V] (rows contiguous); temperatures: [B] fp32 (0 = greedy); seeds: [B] int32/int64,
    one Philox key per row (a new one each step). -> [B] int64 token ids (written into `out` if given)."""
    B, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    num_chunks = triton.cdiv(V, block)
    part_val = torch.empty(B, num_chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(B, num_chunks, dtype=torch.int32, device=logits.device)
    if out is None:
        out = torch.empty(B, dtype=torch.int64, device=logits.device)
    if B:
        _sample_chunk_kernel[(B, num_chunks)](logits, temperatures, seeds, part_val, part_idx, V, logits.stride(0),
                                             num_chunks, BLOCK=block, num_warps=8)
        _sample_reduce_kernel[(B,)](part_val, part_idx, out, num_chunks,
                                    BLOCK_C=max(2, triton.next_power_of_2(num_chunks)))
    return out


# ---- the samples as the next step's inputs (minillm.engine.cuda_graph) ----------------------------
@triton.jit
def _pick_input_ids_kernel(ids_ptr, src_ptr, tokens_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    mask = i < n
    src = tl.load(src_ptr + i, mask=mask, other=-1)
    prev = tl.load(tokens_ptr + tl.maximum(src, 0), mask=mask & (src >= 0), other=0).to(tl.int32)
    tl.store(out_ptr + i, tl.where(src >= 0, prev, tl.load(ids_ptr + i, mask=mask, other=0)), mask=mask)


def pick_input_ids(input_ids: torch.Tensor, src: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """input_ids, src: [B] int32, tokens: [>= B] int64 -> [B] int32: tokens[src[i]] where src[i] >= 0,
    else input_ids[i]. One kernel (the torch expression is five)."""
    out = torch.empty_like(input_ids)
    n = input_ids.shape[0]
    _pick_input_ids_kernel[(1,)](input_ids, src, tokens, out, n, BLOCK=max(16, triton.next_power_of_2(n)))
    return out
