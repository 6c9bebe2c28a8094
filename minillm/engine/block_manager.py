"""BlockManager: hands out fixed-size KV-cache blocks and shares full blocks between sequences
whose prompts start the same way (prefix caching).

A full block is identified by a hash chained over the whole prefix, hash(prev_hash, its tokens), so
two blocks match only if everything before them matched too. On a hash hit the tokens are compared
as well: a hash collision must never hand a sequence someone else's K/V.

n samples of one prompt share its blocks: the later samples fork from the first once its prompt is
computed (their block tables point at the same blocks, each ref_count + 1), and a sample about to
write into a block that others still read gets its own copy first (copy on write): only the last,
partly filled block is ever written, so only it is ever copied.

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


# >>> exercise 3.7 | notebooks/03_paged_kv_cache.ipynb | 10. n samples of one prompt: fork and copy on write
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
# <<< exercise 3.7


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.num_cached_tokens_total = 0  # prefix-cache hits, in tokens, since start (a statistic)
        # copy-on-write copies (src block, dst block) the next step must do on the device first
        self.copies: list[tuple[int, int]] = []

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

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's reset_prefix_cache: after the weights change, or between
        benchmark runs) -> True; False, changing nothing, while any block is in use, since a running
        sequence's blocks would stay shared under hashes nobody could find again."""
        if self.num_free_blocks != len(self.blocks):
            return False
        self.hash_to_block_id.clear()
        for block in self.blocks:
            block.hash, block.token_ids = NO_HASH, []
        return True

    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free_blocks >= seq.num_blocks  # ignores hits: never too optimistic

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing cached full blocks of its prefix."""
        assert not seq.block_table
        if self.enable_prefix_caching and seq.params.prompt_logprobs is None:  # those compute every position
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

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares all of parent's blocks (parent's prompt is being computed this step)."""
        assert not child.block_table
        child.block_table = fork_block_table(parent.block_table, self.blocks)
        child.num_computed_tokens, child.num_new_tokens = parent.num_tokens, 0  # nothing of its own to compute

    def can_append(self, seq: Sequence) -> bool:
        """Room for the K/V of seq's newest token? It needs a fresh block when it starts one, or when
        its last block is shared (copy on write)."""
        starts_block = (seq.num_tokens - 1) % self.block_size == 0
        return self.num_free_blocks >= (starts_block or self.blocks[seq.block_table[-1]].ref_count > 1)

    def may_append(self, seq: Sequence) -> None:
        """Before a decode step: add a block if the newest token starts one, or copy a shared last
        block (recorded in `copies`); hash a block it fills."""
        n, bs = seq.num_tokens, self.block_size
        copy = append_slot(seq.block_table, n, bs, self.blocks, lambda: self._take(next(iter(self.free_block_ids))))
        if copy is not None:
            self.copies.append(copy)
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
