"""store_kvcache: write this step's K/V rows into their slots of the paged cache.

Slot s is row s % block_size of block s // block_size; a slot of -1 means "do not store"
(padding rows of a CUDA-graph batch). One cache row (one slot) holds num_kv_heads * head_dim
contiguous values, so the store is a scatter of whole rows: memory-bound, it should move bytes at
the device's copy bandwidth. The Triton kernel does exactly that, a tile of BLOCK_T tokens per
program; `index_copy_` / advanced indexing (the reference) reaches a fraction of it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def store_kvcache_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """key/value: [N, Hkv, D]; k_cache/v_cache: [num_blocks, block_size, Hkv, D]; slot_mapping: [N] int."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):  # a host sync; only the padding rows of a CUDA graph's batch skip their slots
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    # index_copy_ moves whole rows; a boolean-masked index_put took twice as long for one token on a CPU
    slots = slot_mapping.long()
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value.to(v_cache.dtype))


def store_kvcache_config(row: int) -> dict:
    """Launch parameters for rows of `row` = Hkv * D elements: about 4K elements per program
    (Qwen3-0.6B: 8 x 128 = 1024 -> 4 tokens a program; with 4 warps each thread moves four 16-byte
    vectors of K and four of V, enough bytes in flight per SM at 8K programs for 32K tokens)."""
    block_r = triton.next_power_of_2(row)
    return dict(BLOCK_T=max(1, min(64, 4096 // block_r)), BLOCK_R=block_r, num_warps=4)


def check_kv_cache_layout(name: str, cache: torch.Tensor, row: int) -> None:
    if cache.dim() != 4 or cache.stride(3) != 1 or cache.stride(2) != cache.shape[3] or cache.stride(1) != row:
        raise ValueError(f"{name} must be [num_blocks, block_size, Hkv, D] with contiguous rows (slot stride "
                         f"Hkv*D={row}), got shape {tuple(cache.shape)} strides {cache.stride()}")


# >>> exercise 3.4 | notebooks/03_paged_kv_cache.ipynb | 5. The store kernel in Triton
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
# <<< exercise 3.4
