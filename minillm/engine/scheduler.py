"""Scheduler: which sequences run this step, as a prefill batch or a decode batch.

- Prefill first: admit waiting sequences while the token budget (max_num_batched_tokens), the
  sequence budget (max_num_seqs) and free KV blocks allow. A prompt longer than the budget is
  prefilled in chunks (chunked prefill): the first sequence of a step gets what is left of the budget,
  and keeps its blocks at the front of the queue until its last chunk.
- Decodes first while a prompt is prefilled in chunks: after each of its chunks the running
  sequences decode one token, so a long prompt holds them up for one chunk at a time, not for all of it.
- Otherwise decode every running sequence one token. When the KV cache cannot hold the next token,
  preempt the most recently admitted sequence: free its blocks and put it back at the front of the
  queue; it is recomputed (prompt + what it generated so far) when it is admitted again.
"""
from __future__ import annotations

from collections import deque

from minillm.config import EngineConfig
from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence, SequenceStatus


# >>> exercise 3.6 | notebooks/03_paged_kv_cache.ipynb | 7. The scheduler: admission and preemption
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
# <<< exercise 3.6


class Scheduler:
    def __init__(self, config: EngineConfig, num_blocks: int):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = BlockManager(num_blocks, config.kvcache_block_size, config.enable_prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """-> (the sequences of this step, is_prefill)."""
        scheduled, is_prefill, preempted = schedule_step(self.waiting, self.running, self.block_manager,
                                                         self.max_num_seqs, self.max_num_batched_tokens)
        self.num_preemptions += len(preempted)
        if is_prefill:  # a chunk's later blocks enter the prefix cache only with the chunk that computes them
            for seq in scheduled:
                if seq.num_new_tokens < len(seq) - seq.num_cached_tokens:  # a chunk (a whole prompt: allocate did it)
                    self.block_manager.cache_computed_blocks(seq, seq.num_computed_tokens)
        return scheduled, is_prefill

    def fork(self, parent: Sequence, sample: Sequence) -> None:
        """n > 1: run `sample` from this step on, sharing parent's blocks (parent's prompt is computed
        in this step; the sample takes its first token from the same logits)."""
        self.block_manager.fork(parent, sample)
        sample.status, sample.fork_of = SequenceStatus.RUNNING, parent
        self.running.append(sample)

    def remove(self, seq: Sequence) -> None:
        """Schedule a sequence no more and free its blocks (its status is the caller's business)."""
        self.block_manager.deallocate(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (a stop condition, a stop string, or an abort) and free its blocks."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        self.remove(seq)
