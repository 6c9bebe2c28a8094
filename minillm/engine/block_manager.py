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
from typing import Callable

import numpy as np

from minillm.engine.sequence import PLACEHOLDER_TOKEN, Sequence

NO_HASH = -1  # a block not (yet) in the prefix cache; also the prefix hash of block 0, which has none


# >>> exercise 3.2 | notebooks/03_paged_kv_cache.ipynb | 3. Prefix caching: hashing full blocks
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
# <<< exercise 3.2


class Block:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
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
        if block.ref_count == 0 and block.hash != NO_HASH and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids, block.ref_count = NO_HASH, [], 1
        return block

    def _register(self, block: Block, h: int, token_ids: list[int]) -> None:
        block.hash, block.token_ids = h, list(token_ids)
        self.hash_to_block_id[h] = block.block_id

    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free_blocks >= seq.num_blocks  # ignores hits: never too optimistic

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing cached full blocks of its prefix."""
        assert not seq.block_table
        if self.enable_prefix_caching:
            hashes, num_hits = match_prefix(seq.token_ids, self.block_size, self.hash_to_block_id,
                                            lambda block_id: self.blocks[block_id].token_ids)
        else:
            hashes, num_hits = [NO_HASH] * seq.num_blocks, 0
        for i, h in enumerate(hashes):
            if i < num_hits:  # a cached block: share it
                block = self.blocks[self.hash_to_block_id[h]]
                if block.ref_count == 0:
                    self.free_block_ids.pop(block.block_id)
                block.ref_count += 1
                seq.num_cached_tokens += self.block_size
                self.num_cached_tokens_total += self.block_size
            else:
                block = self._take(next(iter(self.free_block_ids)))
                if h != NO_HASH:
                    self._register(block, h, seq.block(i))
            seq.block_table.append(block.block_id)
        seq.num_computed_tokens = seq.num_cached_tokens

    def cache_computed_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Make the prefix cache hold exactly seq's full blocks whose K/V is computed by the steps
        scheduled so far: those within its first `num_tokens` tokens. allocate registers every full block
        of the prompt, right when the whole prompt is prefilled in one step (a sequence admitted later in
        that step reads them in the same forward, after they are written); when only a chunk of it is
        scheduled, the blocks past the chunk leave the cache here, and come back with the chunk that
        computes them. Otherwise a request admitted later, or this one after a preemption, could find a
        block whose K/V was never written."""
        if not self.enable_prefix_caching:
            return
        for i, block_id in enumerate(seq.block_table):
            block = self.blocks[block_id]
            if (i + 1) * self.block_size <= num_tokens:
                self._hash_full_block(seq, i)
            elif block.hash != NO_HASH and block.ref_count == 1:  # registered by allocate, not computed yet
                if self.hash_to_block_id.get(block.hash) == block_id:
                    del self.hash_to_block_id[block.hash]
                block.hash, block.token_ids = NO_HASH, []

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table.clear()
        seq.num_cached_tokens = seq.num_computed_tokens = seq.num_new_tokens = 0

    def can_append(self, seq: Sequence) -> bool:
        """Room for the K/V of seq's newest token? It needs a fresh block when it starts one."""
        return self.num_free_blocks >= (seq.num_tokens % self.block_size == 1)

    def may_append(self, seq: Sequence) -> None:
        """Before a decode step: add a block if the newest token starts one; hash a block it fills."""
        n, bs = seq.num_tokens, self.block_size
        if n % bs == 1:
            seq.block_table.append(self._take(next(iter(self.free_block_ids))).block_id)
        if self.enable_prefix_caching and n % bs in (0, 1):
            # With async scheduling the newest token is a PLACEHOLDER_TOKEN until its step is read
            # back, so a block filled now may only become hashable one step later.
            last_full = n // bs - 1
            for i in range(max(last_full - 1, 0), last_full + 1):
                self._hash_full_block(seq, i)

    def _hash_full_block(self, seq: Sequence, i: int) -> None:
        block = self.blocks[seq.block_table[i]]
        if block.hash != NO_HASH:  # already cached (registered here, or shared from the cache)
            return
        prev = self.blocks[seq.block_table[i - 1]].hash if i > 0 else NO_HASH
        token_ids = seq.block(i)
        if (i > 0 and prev == NO_HASH) or PLACEHOLDER_TOKEN in token_ids:  # a broken chain, or a token not known yet
            return
        self._register(block, compute_block_hash(token_ids, prev), token_ids)
