"""Chapter 3 solutions. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand.

Exercise 3.1: slot_mapping_for  (notebooks/03_paged_kv_cache.ipynb, section '2. Block tables and slot mapping')
Exercise 3.2: compute_block_hash, match_prefix  (notebooks/03_paged_kv_cache.ipynb, section '3. Prefix caching: hashing full blocks')
Exercise 3.3: paged_decode_torch  (notebooks/03_paged_kv_cache.ipynb, section '4. Paged decode attention in torch')
Exercise 3.4: store_kvcache_kernel  (notebooks/03_paged_kv_cache.ipynb, section '5. The store kernel in Triton')
Exercise 3.5: paged_decode_kernel  (notebooks/03_paged_kv_cache.ipynb, section '6. The paged decode kernel in Triton')
Exercise 3.6: schedule_step  (notebooks/03_paged_kv_cache.ipynb, section '7. The scheduler: admission and preemption')
Exercise 3.7: fork_block_table, append_slot  (notebooks/03_paged_kv_cache.ipynb, section '10. n samples of one prompt: fork and copy on write')
"""
from __future__ import annotations

import minillm.kernels  # noqa: F401,I001  (sets TRITON_INTERPRET=1 without CUDA)
import hashlib
import numpy as np
import torch
import triton
import triton.language as tl
from collections import deque
from minillm.engine.block_manager import Block
from minillm.engine.block_manager import BlockManager
from minillm.engine.block_manager import NO_HASH
from minillm.engine.sequence import Sequence
from minillm.engine.sequence import SequenceStatus
from minillm.kernels.gemv import pdl_args
from minillm.kernels.paged_attention import LOG2E
from minillm.kernels.paged_attention import paged_decode_combine_kernel
from minillm.kernels.paged_attention import paged_decode_config
from minillm.kernels.paged_attention import paged_decode_inputs
from minillm.kernels.store_kvcache import check_kv_cache_layout
from minillm.kernels.store_kvcache import store_kvcache_config
from typing import Callable


# ---- Exercise 3.1 (notebooks/03_paged_kv_cache.ipynb, section '2. Block tables and slot mapping'), from minillm.engine.model_runner ----
def slot_mapping_for(block_table: np.ndarray, start: int, end: int, block_size: int) -> np.ndarray:
    """The flat cache slots of token positions start..end-1 of one sequence.

    The KV cache is num_blocks blocks of block_size token rows; flat slot s is row s % block_size of
    physical block s // block_size. A sequence's logical block i (its positions
    i*block_size .. i*block_size + block_size - 1) lives in physical block block_table[i].
    block_table: [>= ceil(end / block_size)] int physical block ids; 0 <= start <= end
    -> [end - start] int64: slot of position pos = block_table[pos // block_size] * block_size + pos % block_size.
    (start > 0 when the first tokens' K/V came from the prefix cache or were computed in an earlier step.)

    Hints: vectorize with numpy (np.arange of the positions, integer division and modulo, fancy
    indexing into block_table); cast to int64 before multiplying (block ids may be int32).
    """
    pos = np.arange(start, end, dtype=np.int64)
    return block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size


# ---- Exercise 3.2 (notebooks/03_paged_kv_cache.ipynb, section '3. Prefix caching: hashing full blocks'), from minillm.engine.block_manager ----
def compute_block_hash(token_ids: list[int], prefix_hash: int) -> int:
    """A 64-bit hash of one full block's tokens, chained to the hash of the block before.

    token_ids: the block_size token ids of one block; prefix_hash: compute_block_hash of the previous
    block of the same sequence, or NO_HASH for block 0 -> a Python int in [-2**63, 2**63).
    Two blocks get the same hash only if their tokens AND everything before them are the same, so
    a hash names a whole prefix, not just one block.

    Hints: hashlib.blake2b(digest_size=8) (Python's hash() of a tuple is salted per process for str
    and not meant for this); feed it the prefix hash and the token ids as bytes (int.to_bytes,
    numpy's tobytes), and turn the digest back into an int with int.from_bytes(..., signed=True).
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little", signed=True))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def match_prefix(token_ids: list[int], block_size: int, hash_to_block_id: dict[int, int],
                 block_tokens: Callable[[int], list[int]]) -> tuple[list[int], int]:
    """Which leading blocks of a new sequence are already in the KV cache.

    token_ids: the sequence's tokens (its logical block i is token_ids[i*block_size:(i+1)*block_size]);
    hash_to_block_id: chained block hash -> physical block id of the cached blocks;
    block_tokens(block_id): the tokens that block currently holds.
    -> (hashes, num_hits):
      hashes: one per logical block, compute_block_hash chained from block 0, NO_HASH for a last block
        that is not full (it cannot be shared: more tokens will be written into it);
      num_hits: how many leading blocks can be reused. Block i is a hit when its hash is in
        hash_to_block_id, that block holds exactly the same tokens (a hash collision must never hand
        a sequence someone else's K/V), every block before it was a hit, and it does not hold the
        sequence's last token (that token's K/V must be computed now to produce the next token's
        logits, and would be written into a block that others read).

    Hints: the last token sits in block (len(token_ids) - 1) // block_size; hashes of the blocks
    after the first miss are still needed (the block manager registers them).
    """
    hashes, num_hits, h = [], 0, NO_HASH
    num_cacheable = (len(token_ids) - 1) // block_size  # blocks before the one holding the last token
    for i in range(-(-len(token_ids) // block_size)):
        block = token_ids[i * block_size:(i + 1) * block_size]
        h = compute_block_hash(block, h) if len(block) == block_size else NO_HASH
        hashes.append(h)
        block_id = hash_to_block_id.get(h)  # a block before num_cacheable is full: it has a hash
        if num_hits == i and i < num_cacheable and block_id is not None and block_tokens(block_id) == block:
            num_hits += 1
    return hashes, num_hits


# ---- Exercise 3.3 (notebooks/03_paged_kv_cache.ipynb, section '4. Paged decode attention in torch'), from minillm.layers.attention ----
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


# ---- Exercise 3.4 (notebooks/03_paged_kv_cache.ipynb, section '5. The store kernel in Triton'), from minillm.kernels.store_kvcache ----
@triton.jit
def store_kvcache_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens,
                         key_stride, value_stride, cache_block_stride,
                         ROW: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr):
    """Scatter BLOCK_T token rows of key/value into their cache slots; program i handles tokens
    i*BLOCK_T .. i*BLOCK_T + BLOCK_T - 1.

    key_ptr/value_ptr: token t's row of ROW = Hkv*D elements starts at t * key_stride (value_stride)
    and is contiguous. slot_ptr: [num_tokens] slots (int32 or int64); -1 = skip the token.
    k_cache_ptr/v_cache_ptr: slot s lives in block s // PAGE, row s % PAGE: element j of it is at
    (s // PAGE) * cache_block_stride + (s % PAGE) * ROW + j. BLOCK_R = next power of two >= ROW.
    Store in the cache's element type (`.to(k_cache_ptr.dtype.element_ty)`).

    Hints: build a [BLOCK_T, BLOCK_R] tile of offsets (tokens x row elements); one mask covers the
    tokens past num_tokens, the skipped slots and the columns >= ROW, and is used by every load and
    store: nothing outside the kept slots may be written (the grader checks guard bytes around the
    cache). Do offset arithmetic in int64 (a large cache overflows int32).
    """
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    col = tl.arange(0, BLOCK_R)
    slot = tl.load(slot_ptr + tok, mask=tok < num_tokens, other=-1).to(tl.int64)
    mask = (slot >= 0)[:, None] & (col < ROW)[None, :]
    # a skipped slot (-1) must not form an address we use: clamp it, the mask keeps it unused
    slot = tl.maximum(slot, 0)
    dst = (slot // PAGE) * cache_block_stride + (slot % PAGE) * ROW
    tok = tok.to(tl.int64)
    # both loads before either store: the stores could alias the inputs, so a load after a store
    # would wait for it
    k = tl.load(key_ptr + tok[:, None] * key_stride + col[None, :], mask=mask)
    v = tl.load(value_ptr + tok[:, None] * value_stride + col[None, :], mask=mask)
    tl.store(k_cache_ptr + dst[:, None] + col[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst[:, None] + col[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# exercise: given
def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, config: dict | None = None) -> None:
    """The Triton store, same contract as store_kvcache_ref: key/value [N, Hkv, D] (rows may be
    strided, e.g. views into a fused QKV output), caches [num_blocks, block_size, Hkv, D],
    slot_mapping [N] int (-1: skip). config overrides store_kvcache_config (for tuning)."""
    n, hkv, d = key.shape
    row = hkv * d
    if value.shape != key.shape or slot_mapping.shape != (n,):
        raise ValueError(f"store_kvcache: key {tuple(key.shape)}, value {tuple(value.shape)} and slot_mapping "
                         f"{tuple(slot_mapping.shape)} must be [N, Hkv, D], [N, Hkv, D] and [N]")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_kv_cache_layout(name, c, row)
    if k_cache.stride(0) != v_cache.stride(0):
        raise ValueError("store_kvcache: k_cache and v_cache must have the same layout")
    if n == 0:
        return
    key, value = key.reshape(n, row), value.reshape(n, row)  # a view when the rows are contiguous
    if key.stride(1) != 1:
        key = key.contiguous()
    if value.stride(1) != 1:
        value = value.contiguous()
    cfg = {**store_kvcache_config(row), **(config or {})}
    grid = (triton.cdiv(n, cfg["BLOCK_T"]),)
    store_kvcache_kernel[grid](key, value, k_cache, v_cache, slot_mapping.contiguous(), n,
                               key.stride(0), value.stride(0), k_cache.stride(0),
                               ROW=row, PAGE=k_cache.shape[1], BLOCK_T=cfg["BLOCK_T"], BLOCK_R=cfg["BLOCK_R"],
                               num_warps=cfg["num_warps"])


# ---- Exercise 3.5 (notebooks/03_paged_kv_cache.ipynb, section '6. The paged decode kernel in Triton'), from minillm.kernels.paged_attention ----
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


# ---- Exercise 3.6 (notebooks/03_paged_kv_cache.ipynb, section '7. The scheduler: admission and preemption'), from minillm.engine.scheduler ----
def schedule_step(waiting: deque[Sequence], running: deque[Sequence], block_manager: BlockManager,
                  max_num_seqs: int, max_num_batched_tokens: int) -> tuple[list[Sequence], bool, list[Sequence]]:
    """Pick the sequences of the next step, updating the two queues in place.

    -> (scheduled, is_prefill, preempted).
    A sequence being prefilled in chunks (a prompt longer than the token budget) holds its blocks
    while it waits at the FRONT of `waiting`; every other waiting sequence holds none.
    seq.num_computed_tokens counts its tokens whose K/V is in the cache or computed by a step already
    scheduled (block_manager.allocate sets it to the prefix-cache hits; deallocate resets it to 0).

    0. Decodes first: if the front of `waiting` holds blocks (seq.block_table is not empty), its last
       chunk ran in the step before (its num_new_tokens > 0) and `running` is not empty, skip
       admission: set its num_new_tokens to 0 and go to 2. (Its next chunk comes in the step after.)
    1. Prefill. Take sequences from the FRONT of `waiting`, in order, while
       len(running) + taken < max_num_seqs, with len(running) as it was when the step began (a
       sequence taken now counts once, in `taken`: the ones that complete join `running` after the
       loop). `tokens` sums the tokens of the step so far.
       - One without blocks needs block_manager.can_allocate(seq) and, unless it is the first taken,
         tokens + len(seq) <= max_num_batched_tokens (prefix-cache hits are known only after allocate,
         so the check uses the whole len(seq)); then block_manager.allocate(seq).
         Stop at the first that does not fit (no skipping ahead: the queue stays fair).
       - It computes n = min(len(seq) - seq.num_computed_tokens, max_num_batched_tokens - tokens) tokens
         now: set seq.num_new_tokens = n, add n to seq.num_computed_tokens and to `tokens`.
       - If that reaches len(seq), its prefill is complete: status RUNNING, it leaves `waiting` and
         joins the END of `running`. Otherwise (a chunk: only the first taken can be one) it stays at
         the front of `waiting`, keeping its blocks, and admission stops.
       If any were taken, return them as a prefill step: (taken, True, []).
    2. Otherwise decode every running sequence, in `running` order. Before a sequence can take its
       next token, block_manager.can_append(seq) must hold; while it does not, preempt the sequence
       admitted LAST: the one at the front of `waiting` if it holds blocks (a prompt half prefilled:
       it stays at the front), else the end of `running`, else the sequence itself (then it is not
       scheduled). A preempted sequence: status WAITING, block_manager.deallocate(it), at the FRONT of
       `waiting` (it restarts from scratch, first, when room comes back), and in `preempted`, itself
       included. A sequence that stays gets block_manager.may_append(seq).
       At the end `running` holds the scheduled sequences, in order. -> (scheduled, False, preempted);
       with nothing to run, ([], False, []); with every sequence preempted, ([], False, preempted).

    Hints: pop sequences off the left of `running` one by one and put the scheduled ones back at the
    end; the victims come off its right. A step of only prompts that fit the budget is the same with
    and without the chunking rules.
    """
    scheduled, preempted, num_tokens = [], [], 0
    head = waiting[0] if waiting else None
    decode_first = head is not None and bool(head.block_table) and head.num_new_tokens > 0 and bool(running)
    if decode_first:
        head.num_new_tokens = 0
    while not decode_first and waiting and len(running) + len(scheduled) < max_num_seqs:
        seq = waiting[0]
        if not seq.block_table:
            if not block_manager.can_allocate(seq) or (scheduled and num_tokens + len(seq) > max_num_batched_tokens):
                break
            block_manager.allocate(seq)
        n = min(len(seq) - seq.num_computed_tokens, max_num_batched_tokens - num_tokens)
        seq.num_new_tokens = n
        seq.num_computed_tokens += n
        num_tokens += n
        scheduled.append(seq)
        if seq.num_computed_tokens < len(seq):  # a chunk: it keeps its place and its blocks
            break
        seq.status = SequenceStatus.RUNNING
        waiting.popleft()
    if scheduled:
        running.extend(s for s in scheduled if s.status == SequenceStatus.RUNNING)
        return scheduled, True, preempted

    while running:
        seq = running.popleft()
        while not block_manager.can_append(seq):
            if waiting and waiting[0].block_table:  # a prompt half prefilled: admitted after every running one
                victim = waiting.popleft()
            else:
                victim = running.pop() if running else seq
            victim.status = SequenceStatus.WAITING
            block_manager.deallocate(victim)
            waiting.appendleft(victim)
            preempted.append(victim)
            if victim is seq:
                break
        else:
            block_manager.may_append(seq)
            scheduled.append(seq)
    running.extend(scheduled)
    return scheduled, False, preempted


# ---- Exercise 3.7 (notebooks/03_paged_kv_cache.ipynb, section '10. n samples of one prompt: fork and copy on write'), from minillm.engine.block_manager ----
def fork_block_table(parent_table: list[int], blocks: list[Block]) -> list[int]:
    """A new sample's block table, sharing every block of its parent's (no K/V is copied).

    parent_table: the parent's physical block ids; blocks: every Block by id (block.ref_count = how
    many block tables hold it). -> a new list with the same ids; each shared block's ref_count + 1.
    """
    for block_id in parent_table:
        blocks[block_id].ref_count += 1
    return list(parent_table)


def append_slot(block_table: list[int], num_tokens: int, block_size: int, blocks: list[Block],
                take_block: Callable[[], Block]) -> tuple[int, int] | None:
    """Make room for the K/V of a sequence's newest token, position num_tokens - 1, before the decode
    step that writes it. Updates block_table (and ref counts) in place.

    - The position starts a new logical block (num_tokens % block_size == 1, or block_size 1):
      append take_block().block_id. -> None.
    - Otherwise the position lies in the last block. If that block is shared (ref_count > 1: another
      sample still reads it), copy on write: take a fresh block, put it in the table instead, and
      give up one reference to the shared one. -> (old block id, new block id): the device copies
      the old block's rows into the new one before the step writes.
    - Otherwise (the last block is this sequence's alone) -> None.
    take_block() hands out a free Block with ref_count already 1.

    Hints: only the last block can be shared and written: full blocks are never written again.
    """
    if (num_tokens - 1) % block_size == 0:
        block_table.append(take_block().block_id)
        return None
    old = blocks[block_table[-1]]
    if old.ref_count == 1:
        return None
    new = take_block()
    old.ref_count -= 1
    block_table[-1] = new.block_id
    return old.block_id, new.block_id
