"""Fused sampling: logits -> token ids in two small kernels, one read of the logits.

The torch sampler makes ~8 passes over a [B, vocab] fp32 matrix (cast, divide, uniform noise,
two logs, subtract, argmax): at batch 256 and Qwen's 151,936-token vocabulary that is ~2 GB of
traffic per decode step. Here each program reads one chunk of one row once, adds Gumbel noise
drawn in registers (Philox, keyed by a per-row seed: no noise tensor; four uniforms per Philox
call), and keeps the chunk's best;
a second kernel picks each row's best chunk. Rows with temperature 0 take the plain argmax.

    token = argmax_i ( logits_i / T - log(-log U_i) ),  U_i ~ Uniform(0, 1)   (Gumbel-max)

The noise, not the read, bounds the chunk kernel: at batch 256 it read 78 MB of logits (18 us at
the copy bandwidth) in 141 us, and without the two logs it took 63 us (H200). So on CUDA the logs
are the hardware's approximate log2 (one special-function instruction each, not libdevice's
accurate logf) and Philox runs 7 rounds (Philox4x32-7 passes the BigCrush tests), not 10:
    logits_i / T - ln 2 * log2(-log2 U_i)     (the same argmax: the two differ by a constant)

pick_input_ids feeds the samples back: with async scheduling the next step's input token of a
sequence may still be on the device, and the decode CUDA graph picks it out of the last samples.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


PHILOX_ROUNDS = tl.constexpr(7)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _log2(x, APPROX: tl.constexpr):
    """log2(x); APPROX (CUDA): lg2.approx, max relative error 2^-22 (the interpreter runs no PTX)."""
    if APPROX:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    return tl.log2(x)


@triton.jit
def _noisy_logits(logits_row, cols, vocab, inv_t, u, APPROX: tl.constexpr):
    """Logits at `cols` over the temperature, plus Gumbel noise from u (inv_t = 0: the logits as they are)."""
    mask = cols < vocab
    x = tl.load(logits_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
    if inv_t > 0:
        x = x * inv_t - LN2 * _log2(-_log2(u, APPROX), APPROX)  # U = 0 gives -inf: never chosen
    return tl.where(mask, x, float("-inf"))


@triton.jit
def _sample_chunk_kernel(logits_ptr, temps_ptr, seeds_ptr, part_val_ptr, part_idx_ptr, vocab, stride_row,
                         num_chunks, BLOCK: tl.constexpr, APPROX: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    QUARTER: tl.constexpr = BLOCK // 4
    lane = tl.arange(0, QUARTER)
    logits_row = logits_ptr + row.to(tl.int64) * stride_row
    t = tl.load(temps_ptr + row)
    inv_t = tl.where(t > 0, 1.0 / tl.where(t > 0, t, 1.0), 0.0)  # no 1/0 for greedy rows, even unused
    # One Philox call gives four uniforms, one for each quarter of the chunk's columns: Philox's
    # rounds, with the logs, bound this kernel (one call per column took 3x the read at batch 256).
    # The same (seed, chunk, column) always draws the same U.
    u0, u1, u2, u3 = tl.rand4x(tl.load(seeds_ptr + row), chunk * QUARTER + lane, PHILOX_ROUNDS)
    col = chunk * BLOCK + lane
    best = _noisy_logits(logits_row, col, vocab, inv_t, u0, APPROX)
    x = _noisy_logits(logits_row, col + QUARTER, vocab, inv_t, u1, APPROX)
    best_col = tl.where(x > best, col + QUARTER, col)  # strictly greater: a tie keeps the earlier column
    best = tl.maximum(best, x)
    x = _noisy_logits(logits_row, col + 2 * QUARTER, vocab, inv_t, u2, APPROX)
    best_col = tl.where(x > best, col + 2 * QUARTER, best_col)
    best = tl.maximum(best, x)
    x = _noisy_logits(logits_row, col + 3 * QUARTER, vocab, inv_t, u3, APPROX)
    best_col = tl.where(x > best, col + 3 * QUARTER, best_col)
    best = tl.maximum(best, x)
    # two reductions for the chunk: its best value, and the first column that holds it (argmax's rule)
    top = tl.max(best, 0)
    tl.store(part_val_ptr + row * num_chunks + chunk, top)
    first = tl.min(tl.where(best == top, best_col, vocab), 0)
    tl.store(part_idx_ptr + row * num_chunks + chunk, tl.minimum(first, vocab - 1))  # (NaN logits: a valid id)


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
    if block < 8 or block & (block - 1):
        raise ValueError(f"sample_triton: block must be a power of two >= 8 (four quarters), got {block}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    num_chunks = triton.cdiv(V, block)
    part_val = torch.empty(B, num_chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(B, num_chunks, dtype=torch.int32, device=logits.device)
    if out is None:
        out = torch.empty(B, dtype=torch.int64, device=logits.device)
    if B:
        _sample_chunk_kernel[(B, num_chunks)](logits, temperatures, seeds, part_val, part_idx, V, logits.stride(0),
                                             num_chunks, BLOCK=block, APPROX=logits.is_cuda, num_warps=8)
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
