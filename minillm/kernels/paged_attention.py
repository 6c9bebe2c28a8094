"""Paged decode attention: one query token per sequence, its keys and values read through the
block table, in Triton.

Decode reads the whole KV cache of every running sequence once per step and does almost no math
with it (2 FLOPs per byte), so the kernel is a streaming read: its speed is how close it gets to
the device's memory bandwidth. The design follows from that:

- one program per (sequence, KV head[, split]): the GROUP = H / Hkv query heads that share a KV
  head are a [BLOCK_H, D] tile of queries, so each K/V tile is loaded once for all of them
  (grouped-query attention saves bandwidth only if the kernel shares the loads);
- the keys are walked BLOCK_N at a time with an fp32 online softmax; key position p is row
  p % block_size of block block_tables[b, p // block_size] (a tile may span several blocks when
  block_size < BLOCK_N; each row of K/V is head_dim contiguous values, loaded 16 bytes at a time);
- split-K: when batch x KV heads is too few programs to fill the GPU (small batches), each
  sequence's keys are cut into num_splits chunks computed in parallel, and a second kernel
  combines the partial results by their log-sum-exp.

CUDA graphs (chapter 5) capture this kernel, so the launch depends on tensor *shapes* only: the grid
and the split count come from the batch size and block_tables.shape[1] * block_size (the longest
possible context); each program reads its real length from context_lens on the device.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minillm.kernels.gemv import pdl_args

LOG2E = 1.4426950408889634

# Hand-picked launch configs (no autotune: it fails under the interpreter, and a CUDA-graph capture
# must not start benchmarking). BLOCK_N keys per iteration, warps, pipeline stages. The kernel streams
# K and V and does two small dots per tile, far below the tensor-core limit: what matters is how many
# bytes each SM keeps in flight, and how evenly the programs' lengths fill the SMs to the end.
DECODE_CONFIGS = {
    # max head_dim: (BLOCK_N, num_warps, num_stages)
    64: (64, 4, 3),
    # 128: 128-key tiles, 4 warps, 2 stages deep (two [128, 128] bf16 K and V tiles: 128 KB of shared
    # memory, one program per SM, 64 KB of loads in flight each). On the bench's contexts (100-2,048
    # keys, paged) with the splits below: 43.2/75.2/108.3/145.4/203.1/263.8 us at batch 32/64/96/128/
    # 192/256, 80-101% of the KV read floor, against 47.7/83.3/127.9/154.2/211.7/276.2 us for the 64/4/3
    # tiles and 2-programs-per-SM splits before (tests/gpu/decode_sweep.py, one H200, graph-timed).
    128: (128, 4, 2),
    256: (32, 4, 2),
}
# split-K: while batch x KV heads is under SPLIT_TARGET_PROGRAMS_PER_SM programs per SM, cut each
# sequence's keys into chunks (at least MIN_SPLIT_KEYS keys each): with one program per SM, programs
# of very different lengths leave SMs idle at the end unless there are several per SM to even out.
SPLIT_TARGET_PROGRAMS_PER_SM = 6
MIN_SPLIT_KEYS = 256
MAX_SPLITS = 16


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; a nominal 4 on CPU (so the interpreter splits too)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def paged_decode_config(batch: int, num_kv_heads: int, group: int, head_dim: int, max_context: int,
                        block_size: int, device: torch.device) -> dict:
    """Launch parameters from shapes only (CUDA-graph safe). -> dict(BLOCK_H, BLOCK_D, BLOCK_N,
    num_warps, num_stages, num_splits)."""
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dim >= 16
    block_h = max(16, triton.next_power_of_2(group))
    cuda = device.type == "cuda"
    if cuda:
        key = min((k for k in DECODE_CONFIGS if k >= block_d), default=max(DECODE_CONFIGS))
        block_n, num_warps, num_stages = DECODE_CONFIGS[key]
        min_split = MIN_SPLIT_KEYS
    else:  # the interpreter: fewer, bigger numpy ops are faster; warps/stages mean nothing there
        block_n, num_warps, num_stages, min_split = 64, 4, 1, 64
    programs = batch * num_kv_heads
    target = SPLIT_TARGET_PROGRAMS_PER_SM * num_sms(device)
    num_splits = 1
    if programs < target:
        num_splits = max(1, min(triton.cdiv(target, programs), triton.cdiv(max_context, min_split), MAX_SPLITS))
    return dict(BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=num_warps,
                num_stages=num_stages, num_splits=num_splits)


@triton.jit
def paged_decode_combine_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_splits, stride_ob, stride_oh,
                                HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                                USE_PDL: tl.constexpr = False):
    """Split-K reduction, one program per (sequence, query head): out = sum_s w_s * o_s / sum_s w_s
    with w_s = 2^(lse_s - max lse). part_out: [B, H, S, HEAD_DIM] fp32 (each split's normalized
    output), part_lse: [B, H, S] fp32 (log2-sum-exp2 of its scores; -inf for an empty split).
    USE_PDL: let the next kernel (o_proj) start loading its weights now (minillm.kernels.gemv)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    b, h = tl.program_id(0), tl.program_id(1)
    row = b * tl.num_programs(1) + h
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_splits
    lse = tl.load(part_lse_ptr + row * num_splits + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no key at all (a padded row): output zeros, not NaN
    w = tl.exp2(lse - m)
    o = tl.load(part_out_ptr + (row * num_splits + offs_s[:, None]) * HEAD_DIM + offs_d[None, :],
                mask=mask_s[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    den = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


def paged_decode_inputs(who: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor,
                        out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Check a paged decode's arguments (shapes as in paged_decode_attention; ValueError names `who`).
    -> (q with a contiguous head_dim, out: the one given or a new one)."""
    B, H, D = q.shape
    if k_cache.shape[3] != D or v_cache.shape != k_cache.shape or H % k_cache.shape[2]:
        raise ValueError(f"{who}: q {tuple(q.shape)} and caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} "
                         f"need the same head_dim and H divisible by Hkv")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"{who}: q ({q.dtype}) and the caches ({k_cache.dtype}) need one dtype")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError(f"{who}: k_cache and v_cache need the same strides and a contiguous head_dim")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or context_lens.shape != (B,):
        raise ValueError(f"{who}: block_tables {tuple(block_tables.shape)} and context_lens "
                         f"{tuple(context_lens.shape)} must be [B, max_blocks] and [B] with B={B}")
    if q.stride(2) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"{who}: out must be {tuple(q.shape)} {q.dtype} with a contiguous head_dim")
    return q, out


# >>> exercise 3.5 | notebooks/03_paged_kv_cache.ipynb | 6. The paged decode kernel in Triton
@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
                        out_ptr, part_out_ptr, part_lse_ptr, qk_scale, num_splits,
                        stride_qb, stride_qh, stride_cb, stride_ct, stride_ch, stride_bt, stride_ob, stride_oh,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                        UPCAST: tl.constexpr, PRECISION: tl.constexpr, DIRECT: tl.constexpr,
                        USE_PDL: tl.constexpr = False):
    """Decode attention for one (sequence b, KV head g, split s) = program_id(0, 1, 2).

    The GROUP query heads g*GROUP .. g*GROUP+GROUP-1 of sequence b (rows of a [BLOCK_H, BLOCK_D]
    tile, BLOCK_H >= GROUP, BLOCK_D >= HEAD_DIM: mask the extra rows/columns) attend to the keys of
    KV head g at positions [start, end) of the sequence, where
        L = context_lens[b],  chunk = cdiv(cdiv(L, num_splits), BLOCK_N) * BLOCK_N,
        start = s * chunk,    end = min(start + chunk, L)        (empty when start >= L).
    Key position p lives in block block_tables[b, p // PAGE], row p % PAGE; element d of head g is at
    block * stride_cb + row * stride_ct + g * stride_ch + d (same offsets in v_cache). Entries of
    block_tables past the sequence's last block are -1: never use them.
    q element (b, h, d) is at b * stride_qb + h * stride_qh + d; block_tables row b at b * stride_bt.

    Online softmax in fp32 over BLOCK_N keys at a time. qk_scale = softmax scale * log2(e): use exp2.
    Outputs:
      DIRECT (num_splits == 1): out[b, h, :] = acc / l (0 when L == 0), at b*stride_ob + h*stride_oh + d,
        in out's element type;
      otherwise: part_out[b, h, s, :] = acc / l (0 when the split is empty) and part_lse[b, h, s] =
        m + log2(l) (-inf when the split is empty), contiguous fp32 [B, H, num_splits, HEAD_DIM] and [B, H, num_splits];
        H = GROUP * tl.num_programs(1). paged_decode_combine_kernel merges them.

    Hints: load q once, before the loop. Scores = tl.dot(q, tl.trans(k), input_precision=PRECISION),
    then -inf where the key is past `end`. If UPCAST, cast q, k and v to fp32 right after tl.load (the
    interpreter computes bf16 dots wrongly); otherwise cast p to v's type for the second tl.dot.
    Mask every load: masked-off rows must not be read, and nothing but the output row may be written.
    Cast the block id to int64 before multiplying by stride_cb (a big cache overflows int32).
    Faster: tiles start at multiples of BLOCK_N, so when PAGE % BLOCK_N == 0 (a constexpr test) a
    tile's keys all live in one block, and one scalar load of its id replaces a load per key.
    USE_PDL (chapter 5's programmatic dependent launch; always False on a CPU): the launcher may start
    this kernel before the one writing q and the cache has finished. Begin with `if USE_PDL:` then
    `tl.extra.cuda.gdc_launch_dependents()` and `tl.extra.cuda.gdc_wait()`, which blocks until they
    are written (a kernel without the wait is launched the ordinary way).
    """
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    b, g, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(context_lens_ptr + b)
    per_split = (seq_len + num_splits - 1) // num_splits
    chunk = (per_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = s * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = g * GROUP + offs_h
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    head_offs = g * stride_ch + offs_d[None, :]
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < end
        if PAGE % BLOCK_N == 0:  # the tile lies in one block: one block id, not BLOCK_N dependent loads
            rows = tl.load(table + n0 // PAGE).to(tl.int64) * stride_cb + (n0 % PAGE + offs_n) * stride_ct
        else:
            rows = tl.load(table + pos // PAGE, mask=mask_n, other=0).to(tl.int64) * stride_cb + (pos % PAGE) * stride_ct
        offs = rows[:, None] + head_offs
        mask_kv = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + offs, mask=mask_kv, other=0.0)
        v = tl.load(v_cache_ptr + offs, mask=mask_kv, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_H, BLOCK_N]
        scores = tl.where(mask_n[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # l == 0 only for an empty split (m == -inf there)
    o = acc / l_safe[:, None]
    mask_o = mask_h[:, None] & mask_d[None, :]
    if DIRECT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=mask_o)
    else:
        rows_out = (b * (GROUP * tl.num_programs(1)) + heads) * num_splits + s
        tl.store(part_out_ptr + rows_out[:, None] * HEAD_DIM + offs_d[None, :], o, mask=mask_o)
        tl.store(part_lse_ptr + rows_out, m_i + tl.log2(l_safe), mask=mask_h)


# exercise: given
def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           num_splits: int | None = None, config: dict | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """q: [B, H, D]; k_cache/v_cache: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks]
    int32 (-1 padded); context_lens: [B] int32 -> [B, H, D] in q.dtype (written into `out` if given).

    No host sync: the grid and split count come from shapes (paged_decode_config); num_splits or
    config (a dict like paged_decode_config's) override them, for tests and tuning."""
    q, out = paged_decode_inputs("paged_decode_attention", q, k_cache, v_cache, block_tables, context_lens, out)
    B, H, D = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    if B == 0:
        return out
    cfg = {**paged_decode_config(B, hkv, H // hkv, D, block_tables.shape[1] * page, page, q.device), **(config or {})}
    splits = num_splits or cfg["num_splits"]
    upcast = q.device.type != "cuda"  # the interpreter: half-precision math there is wrong
    precision = "ieee" if (upcast or q.dtype == torch.float32) else "tf32"  # fp32 stays fp32 on GPU
    direct = splits == 1
    if direct:
        part_out = part_lse = out  # unused
    else:
        part_out = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
    paged_decode_kernel[(B, hkv, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse, scale * LOG2E, splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=H // hkv, HEAD_DIM=D, PAGE=page, BLOCK_H=cfg["BLOCK_H"], BLOCK_D=cfg["BLOCK_D"],
        BLOCK_N=cfg["BLOCK_N"], UPCAST=upcast, PRECISION=precision, DIRECT=direct,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_args(q.device, paged_decode_kernel))
    if not direct:
        paged_decode_combine_kernel[(B, H)](
            part_out, part_lse, out, splits, out.stride(0), out.stride(1),
            HEAD_DIM=D, BLOCK_S=max(2, triton.next_power_of_2(splits)), BLOCK_D=cfg["BLOCK_D"],
            **pdl_args(q.device))
    return out
# <<< exercise 3.5
