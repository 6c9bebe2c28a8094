"""Chapter 3's known wrong versions (see mistakes.py): the paged KV cache.

Each function below is an exercise function written the way students get it wrong. The two Triton
exercises (3.4, 3.5) are kernels launched by a given wrapper; their wrong versions are one copy of
the kernel with each bug behind a `BUG` switch, run through minillm's own wrapper.
"""
from __future__ import annotations

import functools
import hashlib
from collections import deque

import numpy as np
import torch
import triton
import triton.language as tl

import minillm.kernels.paged_attention as paged_attention_module
import minillm.kernels.store_kvcache as store_module
from minillm.engine.block_manager import compute_block_hash as right_block_hash
from minillm.engine.sequence import SequenceStatus
from mistakes import Mistake


# ---- 3.1 slot mapping ------------------------------------------------------------------------------
def slot_mapping_one_ahead(block_table, start, end, block_size):
    pos = np.arange(start, end, dtype=np.int64) + 1  # the bug: positions counted from 1
    return block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size


def slot_mapping_block_by_ceil(block_table, start, end, block_size):
    pos = np.arange(start, end, dtype=np.int64)
    # the bug: the logical block rounded up, ceil(pos / block_size): only a block's first position gets its own
    return block_table[-(-pos // block_size)].astype(np.int64) * block_size + pos % block_size


def slot_mapping_from_zero(block_table, start, end, block_size):
    pos = np.arange(end - start, dtype=np.int64)  # the bug: start ignored, positions from 0
    return block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size


def slot_mapping_block_id_as_row(block_table, start, end, block_size):
    pos = np.arange(start, end, dtype=np.int64)
    return block_table[pos // block_size].astype(np.int64) + pos % block_size  # the bug: no * block_size


def slot_mapping_position_as_row(block_table, start, end, block_size):
    pos = np.arange(start, end, dtype=np.int64)
    return block_table[pos // block_size].astype(np.int64) * block_size + pos  # the bug: pos, not pos % block_size


def slot_mapping_as_list(block_table, start, end, block_size):
    pos = np.arange(start, end, dtype=np.int64)
    return (block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size).tolist()  # the bug


# ---- 3.2 prefix caching ----------------------------------------------------------------------------
def block_hash_unchained(token_ids, prefix_hash):
    h = hashlib.blake2b(digest_size=8)  # the bug: prefix_hash never fed in
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def block_hash_unsigned(token_ids, prefix_hash):
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little", signed=True))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")  # the bug: unsigned, in [0, 2**64)


def block_hash_xor_chained(token_ids, prefix_hash):
    h = hashlib.blake2b(digest_size=8)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True) ^ prefix_hash  # the bug: the chain by XOR


def block_hash_int16_tokens(token_ids, prefix_hash):
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little", signed=True))
    h.update(np.asarray(token_ids).astype(np.int16).tobytes())  # the bug: ids past 32,767 wrap around
    return int.from_bytes(h.digest(), "little", signed=True)


def block_hash_digits_joined(token_ids, prefix_hash):
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little", signed=True))
    h.update("".join(str(t) for t in token_ids).encode())  # the bug: [1, 23] and [12, 3] give the same text
    return int.from_bytes(h.digest(), "little", signed=True)


def _match_prefix(token_ids, block_size, hash_to_block_id, block_tokens, *, last_block_counts=False,
                  check_tokens=True, stop_at_miss=False, last_block_unhashed=False, block_0_misses=False):
    """match_prefix with one rule switched off."""
    hashes, num_hits, h = [], 0, -1
    last = len(token_ids) // block_size if last_block_counts else (len(token_ids) - 1) // block_size
    for i in range(-(-len(token_ids) // block_size)):
        block = token_ids[i * block_size:(i + 1) * block_size]
        # the bug (last_block_unhashed): the last token's block gets no hash even when it is full
        hashable = len(block) == block_size and not (last_block_unhashed and i >= (len(token_ids) - 1) // block_size)
        h = right_block_hash(block, h) if hashable else -1
        hashes.append(h)
        block_id = hash_to_block_id.get(h, -1) if h != -1 else -1
        if block_0_misses and not block_id:  # the bug: `if block_id:` reads block 0 as no block
            block_id = -1
        same = not check_tokens or (block_id != -1 and block_tokens(block_id) == block)
        if num_hits == i and i < last and block_id != -1 and same:
            num_hits += 1
        elif stop_at_miss:  # the bug: no hashes for the blocks after the first miss
            break
    return hashes, num_hits


def match_prefix_last_block_hits(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix(token_ids, block_size, hash_to_block_id, block_tokens, last_block_counts=True)


def match_prefix_block_0_misses(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix(token_ids, block_size, hash_to_block_id, block_tokens, block_0_misses=True)


def match_prefix_last_block_unhashed(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix(token_ids, block_size, hash_to_block_id, block_tokens, last_block_unhashed=True)


def match_prefix_trusts_the_hash(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix(token_ids, block_size, hash_to_block_id, block_tokens, check_tokens=False)


def match_prefix_stops_hashing_at_a_miss(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix(token_ids, block_size, hash_to_block_id, block_tokens, stop_at_miss=True)


# ---- 3.3 paged decode attention in torch -------------------------------------------------------------
LARGE_LOGITS = "test_ch3.py::test_paged_decode_torch_large_logits_in_fp16"
FP32_LOGITS_PAST_88 = "test_ch3.py::test_paged_decode_torch_logits_past_88_in_fp32"
def _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, *, heads_tiled=False, zero_hidden=True,
                  key_count_error=0, clamp_in_place=False, float_mask=False):
    """paged_decode_torch with one bug switched on."""
    if clamp_in_place:  # the bug: the caller's block tables lose their -1 padding
        block_tables.clamp_min_(0)
    blocks = block_tables.long().clamp_min(0)
    visible = torch.arange(blocks.shape[1] * k_cache.shape[1]) < context_lens[:, None] + key_count_error
    k = k_cache[blocks].flatten(1, 2)  # [B, L, Hkv, D]
    v = v_cache[blocks].flatten(1, 2)
    if zero_hidden:
        k = k.masked_fill(~visible[:, :, None, None], 0)
        v = v.masked_fill(~visible[:, :, None, None], 0)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, L, D]
    group = q.shape[1] // k.shape[1]
    if heads_tiled:  # the bug: repeat tiles the KV heads, so query head h reads KV head h % Hkv
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    else:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = visible[:, None, None, :]
    if float_mask:  # the bug: 1.0 / 0.0, which SDPA ADDS to the scores (a hidden key gets score - 1, not -inf)
        mask = mask.to(q.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale)
    return out.squeeze(2)


def _manual_decode(q, k_cache, v_cache, block_tables, context_lens, scale, stable: bool):
    """Decode attention written out in q.dtype (no fp32): the scores, softmax (torch's, or exp / sum without
    the row max) and p @ v."""
    blocks = block_tables.long().clamp_min(0)
    visible = torch.arange(blocks.shape[1] * k_cache.shape[1]) < context_lens[:, None]
    k = k_cache[blocks].flatten(1, 2).masked_fill(~visible[:, :, None, None], 0)  # [B, L, Hkv, D]
    v = v_cache[blocks].flatten(1, 2).masked_fill(~visible[:, :, None, None], 0)
    heads = torch.arange(q.shape[1]) // (q.shape[1] // k.shape[2])
    s = torch.einsum("bhd,blhd->bhl", q, k[:, :, heads]) * scale
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    p = s.softmax(-1) if stable else s.exp() / s.exp().sum(-1, keepdim=True)
    return torch.einsum("bhl,blhd->bhd", p, v[:, :, heads]).to(q.dtype)


def paged_decode_naive_softmax_in_fp32(q, k_cache, v_cache, block_tables, context_lens, scale):
    """Decode attention in fp32, its softmax exp(s) / sum(exp(s)) without the row max: a logit past ~88.7
    overflows fp32's exp to inf (NaN after)."""
    return _manual_decode(q.float(), k_cache.float(), v_cache.float(), block_tables, context_lens, scale,
                          stable=False).to(q.dtype)


def paged_decode_naive_softmax_in_q_dtype(q, k_cache, v_cache, block_tables, context_lens, scale):
    """exp(s) / sum(exp(s)) in fp16: no max subtracted, so a logit past ~11 overflows to inf (NaN after)."""
    return _manual_decode(q, k_cache, v_cache, block_tables, context_lens, scale, stable=False)


def paged_decode_math_in_q_dtype(q, k_cache, v_cache, block_tables, context_lens, scale):
    """torch's softmax, but the scores, softmax and p @ v all in fp16."""
    return _manual_decode(q, k_cache, v_cache, block_tables, context_lens, scale, stable=True)


def paged_decode_in_place_unchecked(q, k_cache, v_cache, block_tables, context_lens, scale):
    """The batch-1 shortcut without its check: reads one sequence's keys in place from its first block on,
    as if its blocks were consecutive."""
    if len(block_tables) != 1:
        return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale)
    length, block_size = int(context_lens[0]), k_cache.shape[1]
    first, n = int(block_tables[0, 0]), -(-length // block_size)
    k = k_cache[first:first + n].flatten(0, 1)[:length].transpose(0, 1)  # [Hkv, L, D]: blocks first.. in order
    v = v_cache[first:first + n].flatten(0, 1)[:length].transpose(0, 1)
    group = q.shape[1] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    return torch.nn.functional.scaled_dot_product_attention(q[0][:, None], k, v, scale=scale).transpose(0, 1)


def paged_decode_heads_tiled(q, k_cache, v_cache, block_tables, context_lens, scale):
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, heads_tiled=True)


def paged_decode_masks_without_zeroing(q, k_cache, v_cache, block_tables, context_lens, scale):
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, zero_hidden=False)


def paged_decode_float_mask(q, k_cache, v_cache, block_tables, context_lens, scale):
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, float_mask=True)


def paged_decode_one_key_too_few(q, k_cache, v_cache, block_tables, context_lens, scale):
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, key_count_error=-1)


def paged_decode_clamps_the_table_in_place(q, k_cache, v_cache, block_tables, context_lens, scale):
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, clamp_in_place=True)


def paged_decode_one_key_too_many(q, k_cache, v_cache, block_tables, context_lens, scale):
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, key_count_error=1)


def paged_decode_scale_from_head_dim(q, k_cache, v_cache, block_tables, context_lens, scale):
    # the bug: the scale argument ignored, head_dim ** -0.5 used instead
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, q.shape[-1] ** -0.5)


def paged_decode_scaled_twice(q, k_cache, v_cache, block_tables, context_lens, scale):
    # the bug: q is scaled by hand (softmax(q k^T * scale)) and SDPA, given scale=, scales the scores again
    return _paged_decode(q * scale, k_cache, v_cache, block_tables, context_lens, scale)


# ---- running a buggy kernel through minillm's own launch wrapper -------------------------------------
class _BuggyKernel:
    """Stands in for a @triton.jit kernel inside a launch wrapper: kernel[grid](...) runs `kernel`
    with its BUG switch set."""

    def __init__(self, kernel, bug: int):
        self.kernel, self.bug = kernel, bug

    def __getitem__(self, grid):
        return functools.partial(self.kernel[grid], BUG=self.bug)


def _launched_by(wrapper, module, kernel_name: str, kernel, bug: int):
    """`wrapper` (a given launch function of `module`) running `kernel` with bug `bug` in place of
    the module's `kernel_name`."""
    @functools.wraps(wrapper)
    def run(*args, **kwargs):
        right = getattr(module, kernel_name)
        setattr(module, kernel_name, _BuggyKernel(kernel, bug))
        try:
            return wrapper(*args, **kwargs)
        finally:
            setattr(module, kernel_name, right)
    return run


# ---- 3.4 the store kernel ------------------------------------------------------------------------------
STORE_STORES_SKIPPED_SLOTS, STORE_ASSUMES_CONTIGUOUS_ROWS, STORE_WRITES_THE_PADDED_COLUMNS = 1, 2, 3
STORE_IGNORES_BLOCK_STRIDE = 4
STORE_VALUE_AT_KEY_STRIDE, STORE_VALUE_FROM_KEY = 5, 6
STORE_PROGRAM_IGNORED, STORE_TILES_NOT_SCALED, STORE_K_V_SWAPPED, STORE_SLOTS_IN_INT32 = 7, 8, 9, 10
STORE_THROUGH_FP16 = 11
STORE_STORES_WITHOUT_COLUMN_GUARD, STORE_LOADS_UNMASKED = 12, 13


@triton.jit
def buggy_store_kvcache_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens,
                               key_stride, value_stride, cache_block_stride,
                               ROW: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                               BUG: tl.constexpr):
    if BUG == STORE_PROGRAM_IGNORED:  # every program takes the first tile (or reads tl.program_id(1): 0)
        tok = tl.arange(0, BLOCK_T)
    elif BUG == STORE_TILES_NOT_SCALED:  # program p starts at token p, not p * BLOCK_T
        tok = tl.program_id(0) + tl.arange(0, BLOCK_T)
    else:
        tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    col = tl.arange(0, BLOCK_R)
    if BUG == STORE_SLOTS_IN_INT32:  # int32 slots (the mapping's own dtype, or cast to it): the offsets wrap past 2**31
        slot = tl.load(slot_ptr + tok, mask=tok < num_tokens, other=-1).to(tl.int32)
    else:
        slot = tl.load(slot_ptr + tok, mask=tok < num_tokens, other=-1).to(tl.int64)
    if BUG == STORE_STORES_SKIPPED_SLOTS:  # slot -1 passes the mask (and lands before the cache)
        mask = (tok < num_tokens)[:, None] & (col < ROW)[None, :]
    elif BUG == STORE_WRITES_THE_PADDED_COLUMNS:  # columns ROW..BLOCK_R-1 are written too
        mask = (slot >= 0)[:, None] & (col < BLOCK_R)[None, :]
    else:
        mask = (slot >= 0)[:, None] & (col < ROW)[None, :]
    if BUG == STORE_IGNORES_BLOCK_STRIDE:  # blocks taken as back to back: block b at b * PAGE * ROW (= slot * ROW)
        dst = (slot // PAGE) * (PAGE * ROW) + (slot % PAGE) * ROW
    else:
        dst = (slot // PAGE) * cache_block_stride + (slot % PAGE) * ROW
    tok = tok.to(tl.int64)
    if BUG == STORE_ASSUMES_CONTIGUOUS_ROWS:  # token t's row taken at t * ROW, not t * key_stride
        k = tl.load(key_ptr + tok[:, None] * ROW + col[None, :], mask=mask)
        v = tl.load(value_ptr + tok[:, None] * ROW + col[None, :], mask=mask)
    elif BUG == STORE_VALUE_AT_KEY_STRIDE:  # the value load copied from the key's: value rows at t * key_stride
        k = tl.load(key_ptr + tok[:, None] * key_stride + col[None, :], mask=mask)
        v = tl.load(value_ptr + tok[:, None] * key_stride + col[None, :], mask=mask)
    elif BUG == STORE_VALUE_FROM_KEY:  # the value load copied from the key's, pointer and all
        k = tl.load(key_ptr + tok[:, None] * key_stride + col[None, :], mask=mask)
        v = tl.load(key_ptr + tok[:, None] * key_stride + col[None, :], mask=mask)
    elif BUG == STORE_LOADS_UNMASKED:  # the key/value loads take no mask: every token and column of the tile is read
        k = tl.load(key_ptr + tok[:, None] * key_stride + col[None, :])
        v = tl.load(value_ptr + tok[:, None] * value_stride + col[None, :])
    else:
        k = tl.load(key_ptr + tok[:, None] * key_stride + col[None, :], mask=mask)
        v = tl.load(value_ptr + tok[:, None] * value_stride + col[None, :], mask=mask)
    if BUG == STORE_STORES_WITHOUT_COLUMN_GUARD:  # the stores' mask has only the slot condition (the loads' is whole)
        mask = (slot >= 0)[:, None]
    if BUG == STORE_K_V_SWAPPED:  # the key rows into v_cache, the value rows into k_cache
        k, v = v, k
    if BUG == STORE_THROUGH_FP16:  # rounded to a dtype written in, not the cache's
        k, v = k.to(tl.float16), v.to(tl.float16)
    tl.store(k_cache_ptr + dst[:, None] + col[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst[:, None] + col[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _store_with(bug: int):
    return _launched_by(store_module.store_kvcache, store_module, "store_kvcache_kernel",
                        buggy_store_kvcache_kernel, bug)


store_kvcache_stores_skipped_slots = _store_with(STORE_STORES_SKIPPED_SLOTS)
store_kvcache_assumes_contiguous_rows = _store_with(STORE_ASSUMES_CONTIGUOUS_ROWS)
store_kvcache_writes_the_padded_columns = _store_with(STORE_WRITES_THE_PADDED_COLUMNS)
store_kvcache_ignores_block_stride = _store_with(STORE_IGNORES_BLOCK_STRIDE)
store_kvcache_value_at_key_stride = _store_with(STORE_VALUE_AT_KEY_STRIDE)
store_kvcache_value_from_key = _store_with(STORE_VALUE_FROM_KEY)
store_kvcache_program_ignored = _store_with(STORE_PROGRAM_IGNORED)
store_kvcache_tiles_not_scaled = _store_with(STORE_TILES_NOT_SCALED)
store_kvcache_k_v_swapped = _store_with(STORE_K_V_SWAPPED)
store_kvcache_slots_in_int32 = _store_with(STORE_SLOTS_IN_INT32)
store_kvcache_through_fp16 = _store_with(STORE_THROUGH_FP16)
store_kvcache_stores_without_column_guard = _store_with(STORE_STORES_WITHOUT_COLUMN_GUARD)
store_kvcache_loads_unmasked = _store_with(STORE_LOADS_UNMASKED)


# ---- 3.5 the paged decode kernel -----------------------------------------------------------------------
DECODE_HEADS_MODULO, DECODE_NO_RESCALE, DECODE_LSE_NATURAL_LOG = 1, 2, 3
DECODE_MAX_FROM_ZERO, DECODE_EXP_NOT_EXP2, DECODE_UNMASKED_SCORES, DECODE_DIVIDES_BY_ZERO = 4, 5, 6, 7
DECODE_OUT_AT_Q_STRIDES, DECODE_CHUNK_UNROUNDED, DECODE_Q_PAST_HEAD_DIM, DECODE_CHUNK_FLOOR = 8, 9, 10, 11
DECODE_BLOCK_IDS_IN_INT32, DECODE_SUM_NOT_RESCALED, DECODE_END_UNCLAMPED = 12, 13, 14


@triton.jit
def buggy_paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
                              out_ptr, part_out_ptr, part_lse_ptr, qk_scale, num_splits,
                              stride_qb, stride_qh, stride_cb, stride_ct, stride_ch, stride_bt, stride_ob, stride_oh,
                              GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                              BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                              UPCAST: tl.constexpr, PRECISION: tl.constexpr, DIRECT: tl.constexpr,
                              BUG: tl.constexpr):
    b, g, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(context_lens_ptr + b)
    if BUG == DECODE_CHUNK_FLOOR:  # keys per split rounded down: a sequence shorter than num_splits gets none
        per_split = seq_len // num_splits
    else:
        per_split = (seq_len + num_splits - 1) // num_splits
    if BUG == DECODE_CHUNK_UNROUNDED:  # a split's keys not rounded up to whole tiles of BLOCK_N
        chunk = per_split
    else:
        chunk = (per_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = s * chunk
    if BUG == DECODE_END_UNCLAMPED:  # the split's end is not clamped to the context length
        end = start + chunk
    else:
        end = tl.minimum(start + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    if BUG == DECODE_HEADS_MODULO:  # KV head g serves the query heads h with h % Hkv == g
        heads = g + offs_h * tl.num_programs(1)
    else:
        heads = g * GROUP + offs_h
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    if BUG == DECODE_Q_PAST_HEAD_DIM:  # q's columns HEAD_DIM..BLOCK_D-1 (the next head's) are loaded too
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=mask_h[:, None],
                    other=0.0)
    else:
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    if BUG == DECODE_MAX_FROM_ZERO:  # the running maximum starts at 0
        m_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    head_offs = g * stride_ch + offs_d[None, :]
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < end
        if BUG == DECODE_CHUNK_UNROUNDED and PAGE % BLOCK_N == 0:  # one block id per tile (the fast path)
            offs = (tl.load(table + n0 // PAGE).to(tl.int64) * stride_cb + (n0 % PAGE + offs_n) * stride_ct)[:, None] \
                + head_offs
        elif BUG == DECODE_BLOCK_IDS_IN_INT32:  # the table's int32 ids times stride_cb: wraps past 2**31 elements
            block = tl.load(table + pos // PAGE, mask=mask_n, other=0)
            offs = block[:, None] * stride_cb + (pos % PAGE)[:, None] * stride_ct + head_offs
        else:
            block = tl.load(table + pos // PAGE, mask=mask_n, other=0).to(tl.int64)
            offs = block[:, None] * stride_cb + (pos % PAGE)[:, None] * stride_ct + head_offs
        mask_kv = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + offs, mask=mask_kv, other=0.0)
        v = tl.load(v_cache_ptr + offs, mask=mask_kv, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if BUG != DECODE_UNMASKED_SCORES:  # (the bug: keys past `end`, loaded as 0, keep their score 0)
            scores = tl.where(mask_n[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        if BUG == DECODE_EXP_NOT_EXP2:  # e^x of scores scaled by log2(e) for exp2
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
        else:
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(scores - m_new[:, None])
        if BUG == DECODE_NO_RESCALE:  # the sums so far stay scaled to the old maximum
            l_i = l_i + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        elif BUG == DECODE_SUM_NOT_RESCALED:  # acc is rescaled, the running sum l is not
            l_i = l_i + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    if BUG == DECODE_DIVIDES_BY_ZERO:  # l == 0 for an empty sequence or split: 0 / 0
        l_safe = l_i
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    mask_o = mask_h[:, None] & mask_d[None, :]
    if DIRECT and BUG == DECODE_OUT_AT_Q_STRIDES:  # out addressed with q's strides
        tl.store(out_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=mask_o)
    elif DIRECT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=mask_o)
    else:
        rows_out = (b * (GROUP * tl.num_programs(1)) + heads) * num_splits + s
        tl.store(part_out_ptr + rows_out[:, None] * HEAD_DIM + offs_d[None, :], o, mask=mask_o)
        if BUG == DECODE_LSE_NATURAL_LOG:  # m is in log2 units (exp2 of scores * log2(e)); tl.log is ln
            tl.store(part_lse_ptr + rows_out, m_i + tl.log(l_safe), mask=mask_h)
        else:
            tl.store(part_lse_ptr + rows_out, m_i + tl.log2(l_safe), mask=mask_h)


def _decode_with(bug: int):
    return _launched_by(paged_attention_module.paged_decode_attention, paged_attention_module, "paged_decode_kernel",
                        buggy_paged_decode_kernel, bug)


paged_decode_attention_heads_modulo = _decode_with(DECODE_HEADS_MODULO)
paged_decode_attention_no_rescale = _decode_with(DECODE_NO_RESCALE)
paged_decode_attention_lse_natural_log = _decode_with(DECODE_LSE_NATURAL_LOG)
paged_decode_attention_max_from_zero = _decode_with(DECODE_MAX_FROM_ZERO)
paged_decode_attention_exp_not_exp2 = _decode_with(DECODE_EXP_NOT_EXP2)
paged_decode_attention_unmasked_scores = _decode_with(DECODE_UNMASKED_SCORES)
paged_decode_attention_divides_by_zero = _decode_with(DECODE_DIVIDES_BY_ZERO)
paged_decode_attention_q_past_head_dim = _decode_with(DECODE_Q_PAST_HEAD_DIM)
paged_decode_attention_chunk_floor = _decode_with(DECODE_CHUNK_FLOOR)
paged_decode_attention_out_at_q_strides = _decode_with(DECODE_OUT_AT_Q_STRIDES)
paged_decode_attention_chunk_unrounded = _decode_with(DECODE_CHUNK_UNROUNDED)
paged_decode_attention_block_ids_in_int32 = _decode_with(DECODE_BLOCK_IDS_IN_INT32)
paged_decode_attention_sum_not_rescaled = _decode_with(DECODE_SUM_NOT_RESCALED)
paged_decode_attention_end_unclamped = _decode_with(DECODE_END_UNCLAMPED)


# ---- 3.6 one scheduler step -----------------------------------------------------------------------------
def _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, *,
                   skip_ahead=False, preempt_oldest=False, may_append=True, forget_computed=False,
                   no_decode_first=False, spare_half_prefilled=False, victim_at_the_back=False,
                   budget_for_the_first=False, one_seq_too_many=False, chunk_runs_at_once=False, chunk_in_both=False,
                   decode_first_every_step=False, victim_stays_running=False, preempts_itself=False,
                   budget_strict=False, never_chunks=False, victims_queued_last=False, joins_running_at_once=False,
                   tokens_not_summed=False, running_before_half_prefilled=False, status_not_set=False,
                   none_join_running=False, decode_first_without_running=False, victims_not_returned=False,
                   itself_not_returned=False):
    """schedule_step with one bug switched on."""
    scheduled, preempted, num_tokens = [], [], 0
    head = waiting[0] if waiting else None
    # the bug (decode_first_every_step): decodes first whenever a chunked prompt waits, not only right after its chunk
    # the bug (decode_first_without_running): decodes first with nothing running, so the step runs nothing
    decode_first = (not no_decode_first and head is not None and bool(head.block_table)
                    and (decode_first_every_step or head.num_new_tokens > 0)
                    and (decode_first_without_running or bool(running)))
    if decode_first:
        head.num_new_tokens = 0
    for seq in list(waiting):
        # the bug (one_seq_too_many): admits while len(running) + taken <= max_num_seqs
        if decode_first or len(running) + len(scheduled) >= max_num_seqs + one_seq_too_many:
            break
        if not seq.block_table:
            # the bug (budget_for_the_first): the first of the step must fit the token budget too
            # the bug (budget_strict): >= refuses a sequence that fills the budget exactly
            if not block_manager.can_allocate(seq) or ((scheduled or budget_for_the_first)
                                                       and num_tokens + len(seq) + budget_strict
                                                       > max_num_batched_tokens):
                if skip_ahead:  # the bug: try the next one instead of stopping
                    continue
                break
            block_manager.allocate(seq)
        # the bug (forget_computed): the chunk counts from the prompt's start, not from what is computed
        left = len(seq) if forget_computed else len(seq) - seq.num_computed_tokens
        n = left if never_chunks else min(left, max_num_batched_tokens - num_tokens)  # the bug: no cap
        seq.num_new_tokens = n
        seq.num_computed_tokens += n
        if not tokens_not_summed:  # (the bug: the step's token count stays 0)
            num_tokens += n
        scheduled.append(seq)
        if seq.num_computed_tokens < len(seq) and not chunk_runs_at_once:
            break
        # the bug (status_not_set, none_join_running): a completed prefill keeps status WAITING
        if not (status_not_set or none_join_running):
            seq.status = SequenceStatus.RUNNING  # the bug (chunk_runs_at_once): a chunk too, into `running`
        waiting.remove(seq)
        if joins_running_at_once:  # the bug: in `running` at once, so len(running) + taken counts it twice
            running.append(seq)
        if seq.num_computed_tokens < len(seq):
            break
    if scheduled:  # the bug (chunk_in_both): the chunked prompt joins `running` as well
        # (status_not_set: the completed prefills join by their count; none_join_running: by their status, WAITING)
        running.extend(s for s in scheduled if (chunk_in_both or s.status == SequenceStatus.RUNNING
                                                or (status_not_set and s.num_computed_tokens == len(s)))
                       and s not in running)
        return scheduled, True, preempted

    while running:
        seq = running.popleft()
        while not block_manager.can_append(seq):
            half_prefilled = bool(waiting and waiting[0].block_table)
            if half_prefilled and not (spare_half_prefilled or running_before_half_prefilled):
                victim = waiting.popleft()
            elif preempts_itself:  # the bug: the sequence that needs the block gives up its own
                victim = seq
            elif running:  # the bug (preempt_oldest): the victim comes off the left, the oldest
                victim = running.popleft() if preempt_oldest else running.pop()
            elif half_prefilled and running_before_half_prefilled:  # (the bug: the prompt only after `running`)
                victim = waiting.popleft()
            else:
                victim = seq
            if not victim_stays_running:  # (the bug: its status is left RUNNING)
                victim.status = SequenceStatus.WAITING
            block_manager.deallocate(victim)
            if victim_at_the_back:  # the bug: the victim queues behind every waiting sequence
                waiting.append(victim)
            elif not victims_queued_last:  # (the bug: the step's victims go back together, below)
                waiting.appendleft(victim)
            # the bug (victims_not_returned): no victim in `preempted`; (itself_not_returned): not the sequence itself
            if not (victims_not_returned or (itself_not_returned and victim is seq)):
                preempted.append(victim)
            if victim is seq:
                break
        else:
            if may_append:
                block_manager.may_append(seq)
            scheduled.append(seq)
    if victims_queued_last:  # the bug: all at once at the end, in an order that puts the newest first
        waiting.extendleft(reversed(preempted))
    running.extend(scheduled)
    return scheduled, False, preempted


def schedule_step_skips_ahead(waiting: deque, running: deque, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, skip_ahead=True)


def schedule_step_preempts_the_oldest(waiting: deque, running: deque, block_manager, max_num_seqs,
                                      max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, preempt_oldest=True)


def schedule_step_without_may_append(waiting: deque, running: deque, block_manager, max_num_seqs,
                                     max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, may_append=False)


def schedule_step_forgets_computed_tokens(waiting: deque, running: deque, block_manager, max_num_seqs,
                                          max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, forget_computed=True)


def schedule_step_chunks_back_to_back(waiting: deque, running: deque, block_manager, max_num_seqs,
                                      max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, no_decode_first=True)


def schedule_step_running_before_half_prefilled(waiting: deque, running: deque, block_manager, max_num_seqs,
                                                 max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          running_before_half_prefilled=True)


def schedule_step_spares_the_half_prefilled(waiting: deque, running: deque, block_manager, max_num_seqs,
                                            max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          spare_half_prefilled=True)


def schedule_step_victim_at_the_back(waiting: deque, running: deque, block_manager, max_num_seqs,
                                     max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          victim_at_the_back=True)


# ---- the list ------------------------------------------------------------------------------------------
MISTAKES: list[Mistake] = [
    # 3.1
    Mistake("ch3_slot_mapping_block_by_ceil", "3.1", {"slot_mapping_for": slot_mapping_block_by_ceil},
            "the logical block is rounded up ((pos + block_size - 1) // block_size): position pos lies in block "
            "pos // block_size, rounded down, so positions 1 .. block_size - 1 belong to block 0 with position 0",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    Mistake("ch3_slot_mapping_one_ahead", "3.1", {"slot_mapping_for": slot_mapping_one_ahead},
            "every slot is the NEXT position's slot (off by one): position pos lives in logical block "
            "pos // block_size at row pos % block_size, with pos running from start to end - 1 "
            "(np.arange(start, end)), not from start + 1",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    Mistake("ch3_slot_mapping_ignores_start", "3.1", {"slot_mapping_for": slot_mapping_from_zero},
            "the slots are those of positions 0 .. end - start - 1: `start` is ignored. The positions are "
            "start .. end - 1 (np.arange(start, end)); start > 0 when the first tokens came from the prefix "
            "cache or an earlier step, and their slots must not be overwritten",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    Mistake("ch3_slot_mapping_block_id_as_row", "3.1", {"slot_mapping_for": slot_mapping_block_id_as_row},
            "the slot is block_table[pos // block_size] + pos % block_size: the physical block id must be "
            "multiplied by block_size (a block holds block_size rows), "
            "slot = block_table[pos // block_size] * block_size + pos % block_size",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    # 3.2
    Mistake("ch3_slot_mapping_returns_list", "3.1", {"slot_mapping_for": slot_mapping_as_list},
            "slot_mapping_for returns a Python list (.tolist()): return the int64 numpy array itself, which the "
            "engine concatenates and copies to the device as it is",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    Mistake("ch3_block_hash_unchained", "3.2", {"compute_block_hash": block_hash_unchained},
            "compute_block_hash ignores prefix_hash: the same block after different prefixes gets the same hash, "
            "so a cache hit could hand a sequence K/V computed after another prefix. Feed prefix_hash into the "
            "hash first (prefix_hash.to_bytes(8, 'little', signed=True)), then the tokens",
            "test_ch3.py::test_block_hash_is_chained_and_deterministic"),
    Mistake("ch3_block_hash_xor_chained", "3.2", {"compute_block_hash": block_hash_xor_chained},
            "the prefix's hash is combined with the block's by XOR: XOR is symmetric and undoes itself, so [A, B] "
            "and [B, A] get one hash and [A, A] gets -1, the 'no hash' mark (a prompt of a repeated block then "
            "reuses another position's K/V). Feed the prefix hash into the digest with the tokens: "
            "h.update(prefix_hash.to_bytes(8, 'little', signed=True)) before the token bytes",
            "test_ch3.py::test_block_hash_is_chained_and_deterministic"),
    Mistake("ch3_block_hash_int16_tokens", "3.2", {"compute_block_hash": block_hash_int16_tokens},
            "the token ids are packed as 16-bit integers: ids past 32,767 wrap around (Qwen's vocabulary has "
            "151,936), so different blocks hash alike and prefix hits are lost. Pack them as int64",
            "test_ch3.py::test_block_hash_is_chained_and_deterministic"),
    Mistake("ch3_block_hash_digits_joined", "3.2", {"compute_block_hash": block_hash_digits_joined},
            "the token ids are fed in as their digits joined into one string: [1, 23, ...] and [12, 3, ...] give "
            "the same text and so the same hash, and the second block's entry overwrites the first's. Feed fixed-"
            "width bytes (np.asarray(token_ids, dtype=np.int64).tobytes()), or put a separator between the ids",
            "test_ch3.py::test_block_hash_is_chained_and_deterministic"),
    Mistake("ch3_block_hash_unsigned", "3.2", {"compute_block_hash": block_hash_unsigned},
            "the hash is unsigned, in [0, 2**64): half of them do not fit a signed 64-bit integer. Turn the "
            "digest back into an int with int.from_bytes(digest, 'little', signed=True)",
            "test_ch3.py::test_block_hash_is_chained_and_deterministic"),
    Mistake("ch3_match_prefix_last_block_hits", "3.2", {"match_prefix": match_prefix_last_block_hits},
            "match_prefix counts the block holding the sequence's last token as a hit (a prompt of exactly "
            "k full cached blocks gets k hits): that token's K/V must be computed now to get the next "
            "token's logits. Only blocks before block (len(token_ids) - 1) // block_size can be hits",
            "test_ch3.py::test_match_prefix_rules"),
    Mistake("ch3_match_prefix_last_block_unhashed", "3.2", {"match_prefix": match_prefix_last_block_unhashed},
            "the block of the last token gets NO_HASH even when it is full: it can never be a HIT for this "
            "sequence, but it still needs its hash, which the block manager registers so the next request with "
            "this prefix reuses it. NO_HASH only for a last block that is not full",
            "test_ch3.py::test_match_prefix_rules"),
    Mistake("ch3_match_prefix_block_0_misses", "3.2", {"match_prefix": match_prefix_block_0_misses},
            "block id 0 is read as a miss (a test like `if block_id:` is false for block 0): a prompt whose cached "
            "prefix starts in block 0 gets no hits, allocates blocks it should share, and the cache runs out. "
            "Test for a missing entry explicitly: hash_to_block_id.get(h, -1) != -1 (or `h in hash_to_block_id`)",
            "test_ch3.py::test_block_manager_script"),
    Mistake("ch3_match_prefix_trusts_the_hash", "3.2", {"match_prefix": match_prefix_trusts_the_hash},
            "match_prefix trusts an equal hash without comparing tokens: after a hash collision a sequence would "
            "read another prompt's K/V. A block is a hit only if block_tokens(block_id) == the block's tokens",
            "test_ch3.py::test_match_prefix_rules"),
    Mistake("ch3_match_prefix_stops_hashing_at_a_miss", "3.2",
            {"match_prefix": match_prefix_stops_hashing_at_a_miss},
            "match_prefix stops at the first miss and returns no hashes for the blocks after it: every logical "
            "block needs its chained hash (NO_HASH only for a last block that is not full), because the block "
            "manager registers the new full blocks under them for the next request to find. Stop counting hits "
            "at the first miss, but keep hashing",
            "test_ch3.py::test_match_prefix_rules"),
    # 3.3
    # (before the fp16 one: in fp32 the two compute the same, and this one names the fp32 overflow)
    Mistake("ch3_paged_decode_naive_softmax_in_fp32", "3.3", {"paged_decode_torch": paged_decode_naive_softmax_in_fp32},
            "the softmax is exp(s) / exp(s).sum() without subtracting the row's max first: fp32's exp overflows to "
            "inf past a logit of about 88.7, and the row turns inf / inf = NaN. Subtract s.amax(-1, keepdim=True) "
            "before exp (the softmax is unchanged by it, and every exponent is then <= 0), or use torch.softmax or "
            "scaled_dot_product_attention, which do", FP32_LOGITS_PAST_88),
    Mistake("ch3_paged_decode_naive_softmax_in_q_dtype", "3.3",
            {"paged_decode_torch": paged_decode_naive_softmax_in_q_dtype},
            "the softmax is exp(s) / sum(exp(s)) in fp16: exp overflows fp16 past a logit of about 11 (real attention "
            "logits reach 10-30), so a row turns inf / inf = NaN. Compute the scores in fp32 (q.float() @ k.float()) "
            "and use torch.softmax, which subtracts the row's max first; cast the output to q.dtype at the end",
            LARGE_LOGITS),
    Mistake("ch3_paged_decode_math_in_q_dtype", "3.3", {"paged_decode_torch": paged_decode_math_in_q_dtype},
            "the scores, softmax and p @ v run in fp16: with logits near 16 the probabilities and their sums round "
            "to fp16's 11 bits. Do the math in fp32 (q.float(), k.float(), v.float(), or SDPA, which accumulates in "
            "fp32) and cast the output to q.dtype at the end", LARGE_LOGITS),
    Mistake("ch3_paged_decode_in_place_unchecked", "3.3", {"paged_decode_torch": paged_decode_in_place_unchecked},
            "the batch-1 shortcut reads the sequence's keys in place from its first block on, without checking "
            "that its blocks are consecutive: after a prefix-cache hit or a preemption they rarely are. Take the "
            "shortcut only when every step of the table is +1 ((blocks[0].diff() == 1).all()), else gather "
            "through the table",
            "test_ch3.py::test_paged_decode_torch_one_sequence_on_its_blocks", {"blocks": [0, 4, 2]}),
    Mistake("ch3_paged_decode_heads_tiled", "3.3", {"paged_decode_torch": paged_decode_heads_tiled},
            "query head h reads KV head h % Hkv (the KV heads were tiled, as Tensor.repeat does): with "
            "grouped-query attention query head h reads KV head h // (H // Hkv). Use "
            "repeat_interleave(H // Hkv, dim=<heads>) or scaled_dot_product_attention(..., enable_gqa=True)",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 0}),
    Mistake("ch3_paged_decode_masks_without_zeroing", "3.3", {"paged_decode_torch": paged_decode_masks_without_zeroing},
            "NaN leaks out of cache rows nobody wrote: masking their scores is not enough, because their softmax "
            "weight 0 times a NaN value is NaN. Zero the K and V rows at key positions >= context_lens[b] "
            "(masked_fill) as well as masking them",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 0}),
    Mistake("ch3_paged_decode_float_mask", "3.3", {"paged_decode_torch": paged_decode_float_mask},
            "the mask is given to scaled_dot_product_attention as floats, 1.0 (attend) and 0.0 (hide): SDPA ADDS a "
            "float mask to the scores, so every key stays in the softmax (a hidden one at score - 1). Pass a "
            "boolean mask (True = attend), or a float one of 0.0 and -inf",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 0}),
    Mistake("ch3_paged_decode_one_key_too_few", "3.3", {"paged_decode_torch": paged_decode_one_key_too_few},
            "each sequence attends to context_lens[b] - 1 keys, leaving out the newest: its K/V was stored "
            "before attention runs and context_lens[b] counts it. Key position p is visible iff p < context_lens[b]",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 0}),
    Mistake("ch3_paged_decode_one_key_too_many", "3.3", {"paged_decode_torch": paged_decode_one_key_too_many},
            "each sequence attends to context_lens[b] + 1 keys: the row after its newest token (never written, or "
            "another sequence's) joins the softmax. Key position p is visible iff p < context_lens[b], not <=",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 0}),
    Mistake("ch3_paged_decode_scale_from_head_dim", "3.3", {"paged_decode_torch": paged_decode_scale_from_head_dim},
            "the scores are scaled by head_dim ** -0.5 instead of the scale argument: the two agree for Qwen and "
            "Llama, but a model may set its own; pass `scale` through (scaled_dot_product_attention(..., "
            "scale=scale)): SDPA's default is head_dim ** -0.5",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 0}),
    Mistake("ch3_paged_decode_clamps_the_table_in_place", "3.3",
            {"paged_decode_torch": paged_decode_clamps_the_table_in_place},
            "the caller's block tables are clamped in place (block_tables.clamp_min_(0) or clamp_): their -1 "
            "padding becomes block 0, a real block, for whoever reads the tables after this step; clamp a copy, "
            "block_tables.long().clamp_min(0)",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 0}),
    # 3.4
    Mistake("ch3_store_stores_skipped_slots", "3.4", {"store_kvcache": store_kvcache_stores_skipped_slots},
            "tokens whose slot is -1 are stored too (at slot -1, just before the cache): -1 means 'do not "
            "store'. Put slot >= 0 into the mask that every load and store uses",
            "test_ch3.py::test_store_kernel_writes_exactly_the_slots", {"dtype": torch.float32, "block_size": 16}),
    Mistake("ch3_store_assumes_contiguous_rows", "3.4", {"store_kvcache": store_kvcache_assumes_contiguous_rows},
            "token t's key row is read at t * ROW, as if key were contiguous: key and value are strided views "
            "(slices of the fused QKV output), so token t's row starts at t * key_stride (t * value_stride)",
            "test_ch3.py::test_store_kernel_writes_exactly_the_slots", {"dtype": torch.float32, "block_size": 16}),
    Mistake("ch3_store_writes_the_padded_columns", "3.4", {"store_kvcache": store_kvcache_writes_the_padded_columns},
            "the tile's columns ROW .. BLOCK_R - 1 are written too (BLOCK_R is ROW rounded up to a power of "
            "two), into the next cache row: mask the columns with col < ROW in every load and store",
            "test_ch3.py::test_store_kernel_writes_exactly_the_slots", {"dtype": torch.float32, "block_size": 16}),
    Mistake("ch3_store_ignores_block_stride", "3.4", {"store_kvcache": store_kvcache_ignores_block_stride},
            "the destination ignores the cache's block stride: block s // PAGE is taken to start at "
            "(s // PAGE) * PAGE * ROW (so slot s at s * ROW), as if the blocks lay back to back. The cache can be a "
            "view whose blocks are further apart (K and V of a block side by side in one buffer): block b starts "
            "at b * cache_block_stride (k_cache.stride(0)), so slot s is at (s // PAGE) * cache_block_stride + "
            "(s % PAGE) * ROW",
            "test_ch3.py::test_store_kernel_follows_the_cache_block_stride"),
    # 3.5
    Mistake("ch3_decode_kernel_heads_modulo", "3.5", {"paged_decode_attention": paged_decode_attention_heads_modulo},
            "the program of KV head g serves query heads g, g + Hkv, g + 2*Hkv, ... (h % Hkv == g): with "
            "grouped-query attention KV head g serves the GROUP consecutive query heads g*GROUP .. g*GROUP + "
            "GROUP - 1 (h // GROUP == g)",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {"dtype": torch.float32, "case": 0, "num_splits": 1}),
    Mistake("ch3_decode_kernel_no_rescale", "3.5", {"paged_decode_attention": paged_decode_attention_no_rescale},
            "the online softmax does not rescale: when a tile raises the running maximum m, the sums so far "
            "(acc and l) are still relative to the old maximum. Multiply both by alpha = exp2(m_old - m_new) "
            "before adding the new tile's terms",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {"dtype": torch.float32, "case": 0, "num_splits": 1}),
    Mistake("ch3_decode_kernel_lse_natural_log", "3.5",
            {"paged_decode_attention": paged_decode_attention_lse_natural_log},
            "with split-K the splits are combined with the wrong weights: part_lse is m + ln(l), but m is in "
            "log2 units (the scores were scaled by log2(e) for exp2). Store m + log2(l) (tl.log2): the "
            "combine kernel weights split s by 2^(lse_s - max lse)",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {"dtype": torch.float32, "case": 0, "num_splits": 3}),
    Mistake("ch3_decode_chunk_floor", "3.5", {"paged_decode_attention": paged_decode_attention_chunk_floor},
            "the keys per split are rounded down (seq_len // num_splits): a sequence shorter than num_splits gets 0 "
            "keys a split and comes out zero (the rounding up to whole tiles hides it for longer ones). Round up: "
            "cdiv(seq_len, num_splits), then up to a multiple of BLOCK_N",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {"dtype": torch.float32, "case": 0, "num_splits": 3}),
    Mistake("ch3_decode_q_past_head_dim", "3.5", {"paged_decode_attention": paged_decode_attention_q_past_head_dim},
            "q is loaded without the head-dim mask: with HEAD_DIM < BLOCK_D (40 < 64 here) each query row also reads "
            "the first BLOCK_D - HEAD_DIM elements of the head after it (for the last head, whatever follows q: "
            "here NaN). k's masked columns are 0, but 0 * NaN is NaN. Load q with mask_h[:, None] & mask_d[None, :]",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {"dtype": torch.float32, "case": 0, "num_splits": 1}),
    # 3.6
    Mistake("ch3_schedule_skips_ahead", "3.6", {"schedule_step": schedule_step_skips_ahead},
            "admission skips a waiting sequence that does not fit and admits later ones: stop at the first "
            "sequence that does not fit (token budget or free blocks), so the queue stays fair and a long "
            "prompt is not starved by short ones",
            "test_ch3.py::test_schedule_step_stops_at_the_first_that_does_not_fit"),
    Mistake("ch3_schedule_preempts_the_oldest", "3.6", {"schedule_step": schedule_step_preempts_the_oldest},
            "the oldest running sequence is preempted (off the left of `running`): preempt the one admitted "
            "last, running.pop() (the right end), and only the sequence itself when no other is left",
            "test_ch3.py::test_schedule_step_preempts_the_newest"),
    Mistake("ch3_schedule_victim_at_the_back", "3.6", {"schedule_step": schedule_step_victim_at_the_back},
            "a preempted sequence joins the back of `waiting` (waiting.append): it was admitted before every "
            "waiting sequence, so it goes back to the FRONT, waiting.appendleft(victim), and is readmitted first "
            "when blocks free up",
            "test_ch3.py::test_schedule_step_preempts_the_newest"),
    Mistake("ch3_schedule_without_may_append", "3.6", {"schedule_step": schedule_step_without_may_append},
            "a decoding sequence is scheduled without block_manager.may_append(seq): when its new token starts a "
            "block, no block is added to its table and the token's K/V has no slot. Call may_append for every "
            "sequence that stays in the decode batch",
            "test_ch3.py::test_schedule_step_admits_in_order_within_budgets"),
    Mistake("ch3_schedule_forgets_computed_tokens", "3.6", {"schedule_step": schedule_step_forgets_computed_tokens},
            "a chunk's size ignores the tokens already computed: it is min(len(seq), budget left), so the "
            "last chunk runs past the prompt's end (num_computed_tokens > len(seq)). A sequence computes "
            "n = min(len(seq) - seq.num_computed_tokens, max_num_batched_tokens - tokens): prefix-cache hits "
            "and earlier chunks are already in the cache",
            "test_ch3.py::test_schedule_step_chunks_a_long_prompt"),
    Mistake("ch3_schedule_chunks_back_to_back", "3.6", {"schedule_step": schedule_step_chunks_back_to_back},
            "the chunks of a long prompt run back to back while other sequences are running, so they wait for "
            "the whole prompt. Decodes first: when the front of `waiting` holds blocks, its num_new_tokens > 0 "
            "and `running` is not empty, set its num_new_tokens to 0 and decode the running sequences",
            "test_ch3.py::test_schedule_step_decodes_between_chunks"),
    Mistake("ch3_schedule_running_before_half_prefilled", "3.6",
            {"schedule_step": schedule_step_running_before_half_prefilled},
            "the end of `running` is preempted before the prompt half prefilled at the front of `waiting`: that "
            "prompt was admitted last, so it is the first victim whenever it holds blocks; the end of `running` "
            "comes only when no prompt does",
            "test_ch3.py::test_schedule_step_preempts_the_half_prefilled_prompt_before_running_ones"),
    Mistake("ch3_schedule_spares_the_half_prefilled", "3.6",
            {"schedule_step": schedule_step_spares_the_half_prefilled},
            "under KV pressure a running sequence is preempted while the prompt being chunked keeps its blocks: "
            "that prompt was admitted last, so it is the first victim (waiting[0] when it holds blocks); "
            "sparing it can leave every running sequence preempted and the cache held by a prompt that cannot "
            "finish",
            "test_ch3.py::test_schedule_step_preempts_a_half_prefilled_prompt_first"),
]


# ---- 3.7 n samples: fork and copy on write --------------------------------------------------------
def fork_without_ref_counts(parent_table, blocks):
    return list(parent_table)  # the bug: the shared blocks' ref_count is not raised


def fork_aliases_the_parent(parent_table, blocks):
    for block_id in parent_table:
        blocks[block_id].ref_count += 1
    return parent_table  # the bug: the same list, not a copy


def _append_slot(block_table, num_tokens, block_size, blocks, take_block, *, copy=True, release=True,
                 always_copy=False, new_block_test=lambda n, bs: (n - 1) % bs == 0, last=lambda n, bs: -1,
                 release_all=False):
    """append_slot with one bug switched on (last: the table index taken for the newest token's block)."""
    if new_block_test(num_tokens, block_size):
        block_table.append(take_block().block_id)
        return None
    i = last(num_tokens, block_size)
    old = blocks[block_table[i]]
    if not copy or (old.ref_count == 1 and not always_copy):
        return None
    new = take_block()
    if release_all:  # the bug: every reference dropped, the other samples' too
        old.ref_count = 0
    elif release:
        old.ref_count -= 1
    block_table[i] = new.block_id
    return old.block_id, new.block_id


def append_slot_writes_into_shared(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot(block_table, num_tokens, block_size, blocks, take_block, copy=False)


def append_slot_keeps_the_reference(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot(block_table, num_tokens, block_size, blocks, take_block, release=False)


def append_slot_frees_the_shared_block(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot(block_table, num_tokens, block_size, blocks, take_block, release_all=True)


def append_slot_copies_its_own_block(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot(block_table, num_tokens, block_size, blocks, take_block, always_copy=True)


def append_slot_new_block_one_late(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot(block_table, num_tokens, block_size, blocks, take_block,
                        new_block_test=lambda n, bs: n % bs == 1)


def append_slot_last_block_of_num_tokens(block_table, num_tokens, block_size, blocks, take_block):
    """Finds the newest token's block as block_table[num_tokens // block_size]: one past the last block when
    the token fills that block's last row (the newest token, position num_tokens - 1, is in block (n - 1) // bs)."""
    return _append_slot(block_table, num_tokens, block_size, blocks, take_block, last=lambda n, bs: n // bs)


MISTAKES += [
    Mistake("ch3_fork_without_ref_counts", "3.7", {"fork_block_table": fork_without_ref_counts},
            "the forked table shares the blocks without raising their ref_count: when the first sample finishes "
            "it frees blocks the others still read, and a new request overwrites their K/V. Add 1 to "
            "blocks[block_id].ref_count for every block of the parent's table",
            "test_ch3.py::test_fork_block_table_shares_every_block"),
    Mistake("ch3_fork_aliases_the_parent", "3.7", {"fork_block_table": fork_aliases_the_parent},
            "fork_block_table returns the parent's own list: the block a sample appends (or copies) then lands "
            "in the parent's table too. Return a new list, list(parent_table)",
            "test_ch3.py::test_fork_block_table_shares_every_block"),
    Mistake("ch3_append_slot_writes_into_shared", "3.7", {"append_slot": append_slot_writes_into_shared},
            "a sample writes its token into a last block other samples still read (ref_count > 1): their K/V "
            "at that row is overwritten. Copy on write: take a fresh block, put it in the table instead, give "
            "up one reference to the shared block, and return (old id, new id) so the device copies it first",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 2}),
    Mistake("ch3_append_slot_last_block_of_num_tokens", "3.7",
            {"append_slot": append_slot_last_block_of_num_tokens},
            "the newest token's block is taken as block_table[num_tokens // block_size]: the token sits at "
            "position num_tokens - 1, so when it fills its block's last row that index is one past the table "
            "(IndexError). It is always the last block here: block_table[-1]",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 6}),
    Mistake("ch3_append_slot_keeps_the_reference", "3.7", {"append_slot": append_slot_keeps_the_reference},
            "after the copy the shared block keeps this sequence's reference: its ref_count never reaches 0 "
            "and the block is never freed. Subtract 1 from the old block's ref_count when the table moves to "
            "the copy",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 2}),
    Mistake("ch3_append_slot_frees_the_shared_block", "3.7", {"append_slot": append_slot_frees_the_shared_block},
            "after the copy the shared block's ref_count is set to 0: the other samples still read it, so it would "
            "be freed and handed out under them. Give up this sequence's reference only: old.ref_count -= 1",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 2}),
    Mistake("ch3_append_slot_copies_its_own_block", "3.7", {"append_slot": append_slot_copies_its_own_block},
            "the last block is copied even when the sequence holds it alone (ref_count 1): a block and a copy "
            "per decode step for nothing. Copy only when blocks[block_table[-1]].ref_count > 1",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 1}),
    Mistake("ch3_append_slot_new_block_one_late", "3.7", {"append_slot": append_slot_new_block_one_late},
            "a new block is taken when num_tokens % block_size == 1, which never holds for blocks of one "
            "token. Position num_tokens - 1 starts a block when (num_tokens - 1) % block_size == 0",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 5}),
]


# ---- more wrong versions (a later audit) ------------------------------------------------------------------
def slot_mapping_cast_after_multiplying(block_table, start, end, block_size):
    pos = np.arange(start, end, dtype=np.int64)
    # the bug: int32 block ids times block_size stay int32 (and overflow) before the cast
    return (block_table[pos // block_size] * block_size + pos % block_size).astype(np.int64)


def slot_mapping_end_inclusive(block_table, start, end, block_size):
    pos = np.arange(start, end + 1, dtype=np.int64)  # the bug: position `end` too
    return block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size


def block_hash_prefix_unsigned_bytes(token_ids, prefix_hash):
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little"))  # the bug: unsigned, so a negative prefix hash raises OverflowError
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def block_hash_wide_digest(token_ids, prefix_hash):
    h = hashlib.blake2b()  # the bug: the default digest, 64 bytes: a 512-bit int
    h.update(prefix_hash.to_bytes(8, "little", signed=True))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def _match_prefix_v2(token_ids, block_size, hash_to_block_id, block_tokens, *, hits_after_a_miss=False,
                     one_block_short=False, hash_partial=False, unchained=False):
    """match_prefix with one more rule broken."""
    hashes, num_hits, h = [], 0, -1
    last = len(token_ids) // block_size - 1 if one_block_short else (len(token_ids) - 1) // block_size
    for i in range(-(-len(token_ids) // block_size)):
        block = token_ids[i * block_size:(i + 1) * block_size]
        if len(block) == block_size or hash_partial:
            h = right_block_hash(block, -1 if unchained else h)
        else:
            h = -1
        hashes.append(h)
        block_id = hash_to_block_id.get(h)
        if ((hits_after_a_miss or num_hits == i) and i < last and block_id is not None
                and block_tokens(block_id) == block):
            num_hits += 1
    return hashes, num_hits


def match_prefix_hits_after_a_miss(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix_v2(token_ids, block_size, hash_to_block_id, block_tokens, hits_after_a_miss=True)


def match_prefix_one_block_short(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix_v2(token_ids, block_size, hash_to_block_id, block_tokens, one_block_short=True)


def match_prefix_hashes_the_partial_block(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix_v2(token_ids, block_size, hash_to_block_id, block_tokens, hash_partial=True)


def match_prefix_unchained(token_ids, block_size, hash_to_block_id, block_tokens):
    return _match_prefix_v2(token_ids, block_size, hash_to_block_id, block_tokens, unchained=True)


def _gathered(k_cache, v_cache, block_tables, context_lens):
    """-> (K, V as [B, Hkv, L, D] with the rows past context_lens zeroed, visible [B, L])."""
    blocks = block_tables.long().clamp_min(0)
    visible = torch.arange(blocks.shape[1] * k_cache.shape[1]) < context_lens[:, None]
    hide = ~visible[:, :, None, None]
    k = k_cache[blocks].flatten(1, 2).masked_fill(hide, 0).transpose(1, 2)
    v = v_cache[blocks].flatten(1, 2).masked_fill(hide, 0).transpose(1, 2)
    return k, v, visible


def paged_decode_without_gqa(q, k_cache, v_cache, block_tables, context_lens, scale):
    k, v, visible = _gathered(k_cache, v_cache, block_tables, context_lens)
    # the bug: Hkv < H heads of K/V, and neither enable_gqa=True nor repeat_interleave
    return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=visible[:, None, None, :],
                                                            scale=scale).squeeze(2)


def paged_decode_zeroes_without_masking(q, k_cache, v_cache, block_tables, context_lens, scale):
    k, v, _ = _gathered(k_cache, v_cache, block_tables, context_lens)
    # the bug: no attn_mask; the zeroed keys still score 0 and take softmax weight
    return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale,
                                                            enable_gqa=True).squeeze(2)


def paged_decode_returns_fp32(q, k_cache, v_cache, block_tables, context_lens, scale):
    # the bug: computed in fp32 for accuracy, never cast back to q.dtype
    return _paged_decode(q.float(), k_cache.float(), v_cache.float(), block_tables, context_lens, scale)


def paged_decode_squeezes_every_unit_axis(q, k_cache, v_cache, block_tables, context_lens, scale):
    # the bug: squeeze() with no dim; with one sequence it drops the batch axis too
    return _paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale).unsqueeze(2).squeeze()


def schedule_step_budget_for_the_first(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          budget_for_the_first=True)


def schedule_step_one_seq_too_many(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, one_seq_too_many=True)


def schedule_step_counts_taken_twice(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          joins_running_at_once=True)


def schedule_step_budget_strict(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, budget_strict=True)


def schedule_step_victims_queued_last(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          victims_queued_last=True)


def schedule_step_never_chunks(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, never_chunks=True)


def schedule_step_chunk_runs_at_once(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          chunk_runs_at_once=True)


def schedule_step_chunk_in_both_queues(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, chunk_in_both=True)


def schedule_step_decodes_first_every_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          decode_first_every_step=True)


def schedule_step_victim_stays_running(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          victim_stays_running=True)


def schedule_step_preempts_itself_first(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, preempts_itself=True)


def schedule_step_tokens_not_summed(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          tokens_not_summed=True)


def fork_counts_table_positions(parent_table, blocks):
    for i in range(len(parent_table)):
        blocks[i].ref_count += 1  # the bug: the i-th block, not the block the table names
    return list(parent_table)


def _append_slot_v2(block_table, num_tokens, block_size, blocks, take_block, *, new_block_when_full=False,
                    copy_appended=False, pair_reversed=False, copy_checked_first=False, extra_reference=False):
    """append_slot with one more bug switched on."""
    def take():
        block = take_block()
        if extra_reference:  # the bug: take_block's block already holds this table's reference
            block.ref_count += 1
        return block
    old = blocks[block_table[-1]]
    starts_a_block = num_tokens % block_size == 0 if new_block_when_full else (num_tokens - 1) % block_size == 0
    if starts_a_block and not (copy_checked_first and old.ref_count > 1):
        block_table.append(take().block_id)
        return None
    if old.ref_count == 1:
        return None
    new = take()
    old.ref_count -= 1
    if copy_appended:  # the bug: the copy joins the table beside the shared block
        block_table.append(new.block_id)
    else:
        block_table[-1] = new.block_id
    return (new.block_id, old.block_id) if pair_reversed else (old.block_id, new.block_id)


def append_slot_new_block_when_full(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot_v2(block_table, num_tokens, block_size, blocks, take_block, new_block_when_full=True)


def append_slot_appends_the_copy(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot_v2(block_table, num_tokens, block_size, blocks, take_block, copy_appended=True)


def append_slot_pair_reversed(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot_v2(block_table, num_tokens, block_size, blocks, take_block, pair_reversed=True)


def append_slot_copies_before_the_new_block_test(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot_v2(block_table, num_tokens, block_size, blocks, take_block, copy_checked_first=True)


def append_slot_extra_reference(block_table, num_tokens, block_size, blocks, take_block):
    return _append_slot_v2(block_table, num_tokens, block_size, blocks, take_block, extra_reference=True)


F32_CASE_0 = {"dtype": torch.float32, "case": 0}
MISTAKES += [
    # 3.1
    Mistake("ch3_slot_mapping_cast_after_multiplying", "3.1",
            {"slot_mapping_for": slot_mapping_cast_after_multiplying},
            "the slots of large block ids overflow: block_table is int32, so block_table[pos // block_size] * "
            "block_size is computed (and wraps around) in int32 before your cast to int64. Cast the block ids "
            "first: block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    Mistake("ch3_slot_mapping_position_as_row", "3.1", {"slot_mapping_for": slot_mapping_position_as_row},
            "the row within the block is the whole position (block_table[pos // block_size] * block_size + pos): "
            "right in the first block, then each later block's slots run past it into other blocks' rows. The "
            "row is the position within its block, pos % block_size",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    Mistake("ch3_slot_mapping_end_inclusive", "3.1", {"slot_mapping_for": slot_mapping_end_inclusive},
            "one slot too many: the positions run from start to end inclusive (np.arange(start, end + 1)). `end` "
            "is exclusive: the positions are start .. end - 1, np.arange(start, end), end - start slots",
            "test_ch3.py::test_slot_mapping_for_positions", {"block_size": 16}),
    # 3.2
    Mistake("ch3_block_hash_prefix_unsigned_bytes", "3.2", {"compute_block_hash": block_hash_prefix_unsigned_bytes},
            "compute_block_hash raises OverflowError on a negative prefix_hash (NO_HASH = -1 for block 0, and half "
            "the chained hashes are negative): prefix_hash.to_bytes(8, 'little') is unsigned. Use "
            "prefix_hash.to_bytes(8, 'little', signed=True)",
            "test_ch3.py::test_block_hash_is_chained_and_deterministic"),
    Mistake("ch3_block_hash_wide_digest", "3.2", {"compute_block_hash": block_hash_wide_digest},
            "the hashes have far more than 64 bits: blake2b's default digest is 64 bytes (sha256's 32), and "
            "int.from_bytes turns all of them into one huge int. Ask for 8 bytes, hashlib.blake2b(digest_size=8), "
            "so int.from_bytes(digest, 'little', signed=True) lies in [-2**63, 2**63)",
            "test_ch3.py::test_block_hash_is_chained_and_deterministic"),
    Mistake("ch3_match_prefix_hits_after_a_miss", "3.2", {"match_prefix": match_prefix_hits_after_a_miss},
            "match_prefix counts cached blocks after a miss as hits: only the LEADING run of cached blocks can be "
            "reused (the sequence's K/V starts after them, and a later block's K/V was computed after a prefix "
            "this sequence recomputes into blocks of its own). Block i is a hit only if every block before it was "
            "(num_hits == i): stop counting at the first miss",
            "test_ch3.py::test_match_prefix_rules"),
    Mistake("ch3_match_prefix_one_block_short", "3.2", {"match_prefix": match_prefix_one_block_short},
            "match_prefix allows hits only before block len(token_ids) // block_size - 1: one block too few when "
            "the sequence ends inside a block. Only the block holding the last token, block "
            "(len(token_ids) - 1) // block_size, is never a hit; every block before it can be",
            "test_ch3.py::test_match_prefix_rules"),
    Mistake("ch3_match_prefix_hashes_the_partial_block", "3.2", {"match_prefix": match_prefix_hashes_the_partial_block},
            "match_prefix hashes a last block that is not full: that block cannot be shared (more tokens will be "
            "written into it), so its hash is NO_HASH; hash a block only when it holds block_size tokens",
            "test_ch3.py::test_match_prefix_rules"),
    Mistake("ch3_match_prefix_unchained", "3.2", {"match_prefix": match_prefix_unchained},
            "match_prefix hashes every block with prefix_hash NO_HASH: the hashes are not chained, so block i's "
            "hash does not name the blocks before it. Feed each block the previous block's hash, "
            "h = compute_block_hash(block, h), starting from NO_HASH",
            "test_ch3.py::test_match_prefix_rules"),
    # 3.3
    Mistake("ch3_paged_decode_without_gqa", "3.3", {"paged_decode_torch": paged_decode_without_gqa},
            "scaled_dot_product_attention fails on a shape mismatch when Hkv < H: there are fewer KV heads than "
            "query heads. Pass enable_gqa=True (query head h reads KV head h // (H // Hkv)), or repeat_interleave "
            "K and V H // Hkv times on the heads dim",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", F32_CASE_0),
    Mistake("ch3_paged_decode_zeroes_without_masking", "3.3",
            {"paged_decode_torch": paged_decode_zeroes_without_masking},
            "the key positions >= context_lens[b] are zeroed but not masked: a zero key still scores 0 and takes "
            "softmax weight, and its zero value dilutes the output. Mask them out of the softmax too "
            "(attn_mask: True = attend, for p < context_lens[b])",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", F32_CASE_0),
    Mistake("ch3_paged_decode_returns_fp32", "3.3", {"paged_decode_torch": paged_decode_returns_fp32},
            "the output of float16 inputs is float32: computed in float32 (for accuracy) and never cast back. "
            "Return q.dtype (.to(q.dtype) at the end)",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float16, "case": 0}),
    Mistake("ch3_paged_decode_scaled_twice", "3.3", {"paged_decode_torch": paged_decode_scaled_twice},
            "the scores are scaled twice: q is multiplied by scale and scaled_dot_product_attention(..., "
            "scale=scale) multiplies q k^T by it again (without scale= it uses head_dim ** -0.5, a second factor "
            "too). Scale once: pass the raw q and scale=scale to SDPA, or multiply q k^T by scale yourself and "
            "do the softmax by hand",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", F32_CASE_0),
    Mistake("ch3_paged_decode_squeezes_every_unit_axis", "3.3",
            {"paged_decode_torch": paged_decode_squeezes_every_unit_axis},
            "with one sequence (batch-1 decode, every token of a chat) the output is [H, D], not [1, H, D]: "
            "squeeze() without a dim drops every axis of size 1, the batch axis too. Squeeze only the query "
            "axis you added (squeeze(2) on SDPA's [B, H, 1, D])",
            "test_ch3.py::test_paged_decode_torch_matches_sdpa", {"dtype": torch.float32, "case": 3}),
    # 3.4
    Mistake("ch3_store_value_at_key_stride", "3.4", {"store_kvcache": store_kvcache_value_at_key_stride},
            "token t's value row is read at t * key_stride: value has its own row stride, value_stride, which "
            "differs from key's when they are views of different buffers. Load v at value_ptr + t * value_stride",
            "test_ch3.py::test_store_kernel_writes_exactly_the_slots", {"dtype": torch.float32, "block_size": 16}),
    Mistake("ch3_store_value_from_key", "3.4", {"store_kvcache": store_kvcache_value_from_key},
            "the value cache gets the KEY rows: v is loaded from key_ptr (a copy of the key's load). Load v from "
            "value_ptr + t * value_stride",
            "test_ch3.py::test_store_kernel_writes_exactly_the_slots", {"dtype": torch.float32, "block_size": 16}),
    Mistake("ch3_store_program_ignored", "3.4", {"store_kvcache": store_kvcache_program_ignored},
            "every program stores the same first BLOCK_T tokens: the program id is left out of the token offsets, "
            "or read on the wrong axis (the grid is 1-D, so tl.program_id(1) is always 0). Program i owns tokens "
            "i*BLOCK_T .. i*BLOCK_T + BLOCK_T - 1: tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)",
            "test_ch3.py::test_store_kernel_of_qwen3_rows_in_programs_of_4_tokens"),
    Mistake("ch3_store_tiles_not_scaled", "3.4", {"store_kvcache": store_kvcache_tiles_not_scaled},
            "program i starts at token i, not i * BLOCK_T: the programs overlap and the tokens past the last "
            "program's few are never stored. Multiply the program id by BLOCK_T: tok = tl.program_id(0) * BLOCK_T "
            "+ tl.arange(0, BLOCK_T)", "test_ch3.py::test_store_kernel_of_qwen3_rows_in_programs_of_4_tokens"),
    Mistake("ch3_store_k_v_swapped", "3.4", {"store_kvcache": store_kvcache_k_v_swapped},
            "the key rows are stored into v_cache and the value rows into k_cache: store k at k_cache_ptr and v at "
            "v_cache_ptr", "test_ch3.py::test_store_kernel_writes_exactly_the_slots",
            {"dtype": torch.float32, "block_size": 16}),
    Mistake("ch3_store_slots_in_int32", "3.4", {"store_kvcache": store_kvcache_slots_in_int32},
            "the slot stays int32 (an int32 slot_mapping not cast, or a cast to tl.int32), so (slot // PAGE) * "
            "cache_block_stride wraps around past 2**31 - 1 (in a cache of more than 2**31 elements, as a big GPU's "
            "can be) and the store lands before the cache: cast the loaded slots to int64, tl.load(...).to(tl.int64)",
            "test_ch3.py::test_store_kernel_into_a_cache_past_2_gib_elements"),
    Mistake("ch3_store_through_fp16", "3.4", {"store_kvcache": store_kvcache_through_fp16},
            "the rows are rounded to fp16 on their way into the cache (a .to(tl.float16) written in): an fp32 cache "
            "then holds fp16 values, off by up to 2**-11 of each. Store in the cache's own element type, "
            "k.to(k_cache_ptr.dtype.element_ty)", "test_ch3.py::test_store_kernel_writes_exactly_the_slots",
            {"dtype": torch.float32, "block_size": 16}),
    # 3.5
    Mistake("ch3_decode_kernel_max_from_zero", "3.5", {"paged_decode_attention": paged_decode_attention_max_from_zero},
            "the running maximum m starts at 0, not -inf: a split with no keys then reports part_lse = 0 + "
            "log2(1) = 0 instead of -inf, and the combine gives its zero output a weight (with one split the "
            "result is right). Start m at -inf: tl.full([BLOCK_H], float('-inf'), dtype=tl.float32)",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {**F32_CASE_0, "num_splits": 3}),
    Mistake("ch3_decode_kernel_exp_not_exp2", "3.5", {"paged_decode_attention": paged_decode_attention_exp_not_exp2},
            "the softmax uses tl.exp on scores already multiplied by log2(e) (qk_scale = scale * log2(e)): "
            "e^(x log2 e) is a softmax at the wrong temperature. Use tl.exp2 for p and alpha",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {**F32_CASE_0, "num_splits": 1}),
    Mistake("ch3_decode_kernel_unmasked_scores", "3.5",
            {"paged_decode_attention": paged_decode_attention_unmasked_scores},
            "the scores of a tile's keys past `end` are not set to -inf: those keys load as 0, score 0 and still "
            "take softmax weight, diluting the output. scores = tl.where(pos < end, scores, -inf) before the "
            "maximum and the exp2",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {**F32_CASE_0, "num_splits": 1}),
    Mistake("ch3_decode_kernel_divides_by_zero", "3.5",
            {"paged_decode_attention": paged_decode_attention_divides_by_zero},
            "an empty sequence (context length 0, a padding row) or an empty split divides acc = 0 by l = 0: "
            "NaN. Divide by l only where l > 0 (tl.where(l > 0, l, 1.0)), so an empty sequence outputs zeros",
            "test_ch3.py::test_paged_decode_kernel_empty_sequence_gives_zeros"),
    Mistake("ch3_decode_kernel_out_at_q_strides", "3.5",
            {"paged_decode_attention": paged_decode_attention_out_at_q_strides},
            "the output is written with q's strides (b * stride_qb + h * stride_qh): out has strides of its own, "
            "and q can be a view of a wider buffer (a slice of the fused QKV output). Store at "
            "b * stride_ob + h * stride_oh + d",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {**F32_CASE_0, "num_splits": 1}),
    Mistake("ch3_decode_kernel_chunk_unrounded", "3.5",
            {"paged_decode_attention": paged_decode_attention_chunk_unrounded},
            "a split's chunk is cdiv(L, num_splits), not rounded up to a multiple of BLOCK_N: tiles then start "
            "off the BLOCK_N grid, and where PAGE % BLOCK_N == 0 a tile that takes one block id for all its keys "
            "straddles two blocks. chunk = cdiv(cdiv(L, num_splits), BLOCK_N) * BLOCK_N",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {"dtype": torch.float32, "case": 1, "num_splits": 3}),
    Mistake("ch3_decode_kernel_block_ids_in_int32", "3.5",
            {"paged_decode_attention": paged_decode_attention_block_ids_in_int32},
            "the block ids loaded from the table stay int32, so block * stride_cb wraps around past 2**31 - 1 (in a "
            "cache of more than 2**31 elements, as a big GPU's can be) and the K/V loads land before the cache: "
            "cast the loaded ids to int64 before multiplying, tl.load(table + ...).to(tl.int64) * stride_cb (in "
            "every path that loads a block id)",
            "test_ch3.py::test_paged_decode_kernel_reads_a_cache_past_2_gib_elements",
            {"page": 16, "hkv": 2, "d": 32}),
    Mistake("ch3_decode_kernel_sum_not_rescaled", "3.5",
            {"paged_decode_attention": paged_decode_attention_sum_not_rescaled},
            "the online softmax rescales acc but not the running sum l: when a tile raises the maximum m, l keeps "
            "the earlier tiles' terms relative to the old maximum, so acc / l is divided by a sum too large (wrong "
            "only where a later tile holds a larger score). l = l * alpha + tl.sum(p, 1), with the same "
            "alpha = exp2(m_old - m_new) as acc",
            "test_ch3.py::test_paged_decode_kernel_matches_sdpa", {**F32_CASE_0, "num_splits": 1}),
    # 3.6
    Mistake("ch3_schedule_budget_for_the_first", "3.6", {"schedule_step": schedule_step_budget_for_the_first},
            "the first sequence of a step must fit the token budget too, so a prompt longer than "
            "max_num_batched_tokens is never admitted: only a sequence after the first needs tokens + len(seq) "
            "<= max_num_batched_tokens; the first is taken anyway and prefilled in chunks of the budget",
            "test_ch3.py::test_schedule_step_chunks_a_long_prompt"),
    Mistake("ch3_schedule_one_seq_too_many", "3.6", {"schedule_step": schedule_step_one_seq_too_many},
            "admission takes more sequences than max_num_seqs allows: the running ones count too, and it stops "
            "when they reach it. Take another only while len(running) + taken < max_num_seqs (strictly less)",
            "test_ch3.py::test_schedule_step_admits_in_order_within_budgets"),
    Mistake("ch3_schedule_counts_taken_twice", "3.6", {"schedule_step": schedule_step_counts_taken_twice},
            "a sequence admitted in this step is counted twice against max_num_seqs: it joins `running` at once "
            "and is in `taken` too, so len(running) + taken reaches the limit with half as many admitted. Count "
            "len(running) as it was when the step began (or add the completed prefills to `running` after the loop)",
            "test_ch3.py::test_schedule_step_admits_up_to_max_num_seqs"),
    Mistake("ch3_schedule_budget_strict", "3.6", {"schedule_step": schedule_step_budget_strict},
            "a sequence that fills the token budget exactly is refused (tokens + len(seq) >= "
            "max_num_batched_tokens): the budget is the most a step may compute, so admit while tokens + len(seq) "
            "<= max_num_batched_tokens and stop only when it would go past it",
            "test_ch3.py::test_schedule_step_admits_in_order_within_budgets"),
    Mistake("ch3_schedule_victims_queued_last", "3.6", {"schedule_step": schedule_step_victims_queued_last},
            "the step's victims go back to `waiting` together at the end, newest first: each one goes to the FRONT "
            "as it is preempted (waiting.appendleft(victim) inside the loop), so of two victims the older, "
            "preempted last, is readmitted first",
            "test_ch3.py::test_schedule_step_preempts_until_a_block_frees"),
    Mistake("ch3_schedule_never_chunks", "3.6", {"schedule_step": schedule_step_never_chunks},
            "the first prompt of a step is computed whole, past the token budget: its chunk is n = min(len(seq) - "
            "seq.num_computed_tokens, max_num_batched_tokens - tokens so far); a prompt longer than the budget "
            "stays at the front of `waiting` and gets its next chunk in a later step",
            "test_ch3.py::test_schedule_step_chunks_a_long_prompt"),
    Mistake("ch3_schedule_chunk_runs_at_once", "3.6", {"schedule_step": schedule_step_chunk_runs_at_once},
            "a prompt that got only a chunk leaves `waiting` for `running`, as if prefilled: it stays at the "
            "FRONT of `waiting` with its blocks (status WAITING) until its last chunk; only then does it become "
            "RUNNING and join `running`",
            "test_ch3.py::test_schedule_step_chunks_a_long_prompt"),
    Mistake("ch3_schedule_chunk_in_both_queues", "3.6", {"schedule_step": schedule_step_chunk_in_both_queues},
            "a prompt that got only a chunk joins `running` while it also stays at the front of `waiting`: only "
            "the sequences whose prefill is complete (status RUNNING) join `running`",
            "test_ch3.py::test_schedule_step_chunks_a_long_prompt"),
    Mistake("ch3_schedule_decodes_first_every_step", "3.6", {"schedule_step": schedule_step_decodes_first_every_step},
            "the prompt being chunked never gets its next chunk while other sequences run: skip admission only in "
            "the step right after its chunk ran (its num_new_tokens > 0), and set its num_new_tokens to 0 when "
            "you skip, so the step after admits it again",
            "test_ch3.py::test_schedule_step_decodes_between_chunks"),
    Mistake("ch3_schedule_victim_stays_running", "3.6", {"schedule_step": schedule_step_victim_stays_running},
            "a preempted sequence keeps status RUNNING: it waits again, to be readmitted from scratch, so set "
            "victim.status = SequenceStatus.WAITING",
            "test_ch3.py::test_schedule_step_preempts_the_newest"),
    Mistake("ch3_schedule_preempts_itself_first", "3.6", {"schedule_step": schedule_step_preempts_itself_first},
            "the sequence that needs a block preempts itself although others run: the victim is the one admitted "
            "last (a half-prefilled prompt at the front of `waiting`, else running.pop(), the right end); a "
            "sequence preempts itself only when no other is left",
            "test_ch3.py::test_schedule_step_preempts_the_newest"),
    Mistake("ch3_schedule_tokens_not_summed", "3.6", {"schedule_step": schedule_step_tokens_not_summed},
            "the step's token count never grows (the n of each admitted sequence is not added to `tokens`): "
            "every sequence after the first is checked against an empty budget, so a step takes more than "
            "max_num_batched_tokens tokens (a prompt beside the last chunk of another, whose chunk was the whole "
            "budget). Add n to `tokens` as each sequence is taken",
            "test_ch3.py::test_schedule_step_chunks_a_long_prompt"),
    # 3.7
    Mistake("ch3_fork_counts_table_positions", "3.7", {"fork_block_table": fork_counts_table_positions},
            "fork_block_table raises the ref_count of blocks 0 .. len(parent_table) - 1 (the positions in the "
            "table), not of the blocks the table names: blocks[block_id].ref_count += 1 for each block_id in "
            "parent_table",
            "test_ch3.py::test_fork_block_table_shares_every_block"),
    Mistake("ch3_append_slot_new_block_when_full", "3.7", {"append_slot": append_slot_new_block_when_full},
            "a new block is taken when num_tokens % block_size == 0, i.e. when the newest token FILLS a block: it "
            "starts one when (num_tokens - 1) % block_size == 0 (position num_tokens - 1 is a block's first row)",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 0}),
    Mistake("ch3_append_slot_appends_the_copy", "3.7", {"append_slot": append_slot_appends_the_copy},
            "copy on write appends the fresh block to the table: the copy REPLACES the shared last block "
            "(block_table[-1] = new id), or the table holds both and every later position shifts by a block",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 2}),
    Mistake("ch3_append_slot_pair_reversed", "3.7", {"append_slot": append_slot_pair_reversed},
            "append_slot returns (new id, old id): the device copies the first block's rows into the second, so "
            "this copies the fresh block's garbage over the shared one. Return (old block id, new block id)",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 2}),
    Mistake("ch3_append_slot_copies_before_the_new_block_test", "3.7",
            {"append_slot": append_slot_copies_before_the_new_block_test},
            "a shared last block is copied even when the newest token starts a new block: that full block is "
            "never written again, so it stays shared. Test (num_tokens - 1) % block_size == 0 first and append a "
            "fresh block; copy on write only for a token that lies in the shared last block",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 4}),
    Mistake("ch3_append_slot_extra_reference", "3.7", {"append_slot": append_slot_extra_reference},
            "the block take_block() hands out gets ref_count += 1: it already comes with ref_count 1 (this "
            "table's reference), and a count of 2 keeps it from ever being freed. Use it as it is",
            "test_ch3.py::test_append_slot_copies_a_shared_block_before_writing", {"case": 0}),
]


# ---- more wrong versions (a third audit) -------------------------------------------------------------------
def schedule_step_status_not_set(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    """A sequence whose prefill completes joins `running` with its status left WAITING."""
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens, status_not_set=True)


def schedule_step_none_join_running(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    """The status is left WAITING, and `running` takes the admitted sequences by status RUNNING: none."""
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          none_join_running=True)


def schedule_step_decodes_first_with_nothing_running(waiting, running, block_manager, max_num_seqs,
                                                     max_num_batched_tokens):
    """Decodes first after a chunk even when `running` is empty (the test lacks `and running`)."""
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          decode_first_without_running=True)


def schedule_step_victims_not_returned(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    """The victims leave `running` but are not appended to `preempted`."""
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          victims_not_returned=True)


def schedule_step_itself_not_returned(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens):
    """A sequence that preempts itself is not appended to `preempted` (the other victims are)."""
    return _schedule_step(waiting, running, block_manager, max_num_seqs, max_num_batched_tokens,
                          itself_not_returned=True)


MISTAKES += [
    # 3.4
    Mistake("ch3_store_stores_without_column_guard", "3.4",
            {"store_kvcache": store_kvcache_stores_without_column_guard},
            "the stores' mask has only the slot condition, (slot >= 0)[:, None], without the column guard: the "
            "masked loads leave the tile's columns ROW .. BLOCK_R - 1 at 0, and the stores write those zeros over "
            "the first BLOCK_R - ROW elements of the next cache row (another token's K/V). Store with the loads' "
            "whole mask, (slot >= 0)[:, None] & (col < ROW)[None, :]",
            "test_ch3.py::test_store_kernel_writes_exactly_the_slots", {"dtype": torch.float32, "block_size": 16}),
    Mistake("ch3_store_loads_unmasked", "3.4", {"store_kvcache": store_kvcache_loads_unmasked},
            "the loads take no mask: the last program's tokens past num_tokens and every row's columns past ROW are "
            "read outside key and value (the bounds check stops the load; on a GPU it reads memory that is not the "
            "tensor, or faults). Mask every load as the stores are masked: key and value with (slot >= 0)[:, None] "
            "& (col < ROW)[None, :], the slots with tok < num_tokens (other=-1)",
            "test_ch3.py::test_store_kernel_follows_the_cache_block_stride"),
    # 3.5
    Mistake("ch3_decode_kernel_end_unclamped", "3.5", {"paged_decode_attention": paged_decode_attention_end_unclamped},
            "a split's end is start + chunk, not clamped to the context length: chunk is rounded up to whole tiles "
            "of BLOCK_N, so the last split attends to keys past context_lens[b], read through table entries past "
            "the sequence's blocks (-1, or past the table) and cache rows it never wrote. end = tl.minimum(start + "
            "chunk, L), as the kernel's docstring says",
            "test_ch3.py::test_paged_decode_kernel_reads_a_cache_past_2_gib_elements", {"page": 64, "hkv": 1, "d": 16}),
    # 3.6
    Mistake("ch3_schedule_status_not_set", "3.6", {"schedule_step": schedule_step_status_not_set},
            "a sequence whose prefill completes joins `running` with status WAITING: set seq.status = "
            "SequenceStatus.RUNNING as it leaves `waiting` (a prompt that got only a chunk stays WAITING)",
            "test_ch3.py::test_schedule_step_admits_in_order_within_budgets"),
    Mistake("ch3_schedule_none_join_running", "3.6", {"schedule_step": schedule_step_none_join_running},
            "no admitted sequence joins `running`: a sequence whose prefill completes keeps status WAITING, and "
            "the ones that join `running` after the loop are picked by status RUNNING. Set seq.status = "
            "SequenceStatus.RUNNING as its prefill completes and it leaves `waiting`",
            "test_ch3.py::test_schedule_step_admits_in_order_within_budgets"),
    Mistake("ch3_schedule_decodes_first_with_nothing_running", "3.6",
            {"schedule_step": schedule_step_decodes_first_with_nothing_running},
            "decodes first with nothing running: after a chunk of a long prompt the next step skips admission "
            "even when `running` is empty, and runs nothing, ([], False, []). Skip admission only when the front "
            "of `waiting` holds blocks, its num_new_tokens > 0 and `running` is not empty (`and running`)",
            "test_ch3.py::test_schedule_step_chunks_a_long_prompt"),
    # (before victims_not_returned: where the only victim is the sequence itself, that bug gives this one's result,
    # and this hint is true of it too)
    Mistake("ch3_schedule_itself_not_returned", "3.6", {"schedule_step": schedule_step_itself_not_returned},
            "a sequence that preempts itself (no other is left to give up blocks) is missing from the returned "
            "`preempted` list: it is a victim like the others, so append it to `preempted` too",
            "test_ch3.py::test_schedule_step_preempts_until_a_block_frees"),
    Mistake("ch3_schedule_victims_not_returned", "3.6", {"schedule_step": schedule_step_victims_not_returned},
            "a preempted sequence leaves `running` but is missing from the returned `preempted` list (the engine "
            "counts preemptions from it): append every victim to `preempted` as it is preempted, the sequence "
            "itself included",
            "test_ch3.py::test_schedule_step_preempts_the_newest"),
]
