"""BlockManager: hands out fixed-size KV-cache blocks and shares full blocks between sequences
whose prompts start the same way (prefix caching).

A full block is identified by a hash chained over the whole prefix, hash(prev_hash, its tokens), so
two blocks match only if everything before them matched too. On a hash hit the tokens are compared
as well: a hash collision must never hand a sequence someone else's K/V.

Blocks with ref_count 0 keep their contents and hash until they are handed out again; free blocks
are reused oldest-first, so recently freed prefixes stay cached longest.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from minillm.engine.sequence import Sequence


def compute_block_hash(token_ids: list[int], prefix_hash: int) -> int:
    """A 64-bit hash of one full block's tokens, chained to the hash of the block before (-1 for the first)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little", signed=True))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


class Block:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.num_cached_tokens_total = 0  # prefix-cache hits, in tokens, since start (a statistic)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _take(self, block_id: int) -> Block:
        """Move a block from the free list to use; a reused block loses its old cached identity."""
        block = self.blocks[block_id]
        self.free_block_ids.pop(block_id)
        if block.ref_count == 0 and block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids, block.ref_count = -1, [], 1
        return block

    def _register(self, block: Block, h: int, token_ids: list[int]) -> None:
        block.hash, block.token_ids = h, list(token_ids)
        self.hash_to_block_id[h] = block.block_id

    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free_blocks >= seq.num_blocks  # ignores hits: never too optimistic

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing cached full blocks of its prefix."""
        assert not seq.block_table
        h, hit_run = -1, True
        # The block holding the last token is never taken from the cache: its token must be computed
        # this step to produce logits, and it would write into a block others read.
        num_cacheable = (seq.num_tokens - 1) // self.block_size
        for i in range(seq.num_blocks):
            token_ids = seq.block(i)
            full = len(token_ids) == self.block_size
            h = compute_block_hash(token_ids, h) if full and self.enable_prefix_caching else -1
            block_id = self.hash_to_block_id.get(h, -1) if h != -1 else -1
            hit = (hit_run and i < num_cacheable and block_id != -1
                   and self.blocks[block_id].token_ids == token_ids)
            hit_run = hit
            if hit:
                block = self.blocks[block_id]
                if block.ref_count == 0:
                    self.free_block_ids.pop(block_id)
                block.ref_count += 1
                seq.num_cached_tokens += self.block_size
                self.num_cached_tokens_total += self.block_size
            else:
                block = self._take(next(iter(self.free_block_ids)))
                if h != -1:
                    self._register(block, h, token_ids)
            seq.block_table.append(block.block_id)

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table.clear()
        seq.num_cached_tokens = 0

    def can_append(self, seq: Sequence) -> bool:
        """Room for the K/V of seq's newest token? It needs a fresh block when it starts one."""
        return self.num_free_blocks >= (seq.num_tokens % self.block_size == 1)

    def may_append(self, seq: Sequence) -> None:
        """Before a decode step: add a block if the newest token starts one; hash a block it fills."""
        n = seq.num_tokens
        if n % self.block_size == 1:
            seq.block_table.append(self._take(next(iter(self.free_block_ids))).block_id)
        elif n % self.block_size == 0 and self.enable_prefix_caching:
            i = n // self.block_size - 1
            prev = self.blocks[seq.block_table[i - 1]].hash if i > 0 else -1
            if prev != -1 or i == 0:
                self._register(self.blocks[seq.block_table[i]], compute_block_hash(seq.block(i), prev), seq.block(i))
