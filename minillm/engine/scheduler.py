"""Scheduler: which sequences run this step, as a prefill batch or a decode batch.

- Prefill first: admit waiting sequences while the token budget (max_num_batched_tokens), the
  sequence budget (max_num_seqs) and free KV blocks allow.
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
    1. Prefill first. Admit sequences from the FRONT of `waiting`, in order, while
       len(running) + admitted < max_num_seqs, block_manager.can_allocate(seq), and
       tokens + len(seq) <= max_num_batched_tokens, where `tokens` sums the tokens the admitted
       sequences will compute, len(seq) - seq.num_cached_tokens (prefix-cache hits are known only
       after allocate, so the check itself uses the whole len(seq)). Stop at the first that does not
       fit (no skipping ahead: the queue stays fair). Each admitted one: block_manager.allocate(seq),
       status RUNNING, leaves `waiting`, joins the END of `running`. If any were admitted, return them
       as a prefill step: (admitted, True, []).
    2. Otherwise decode every running sequence, in `running` order. Before a sequence can take its
       next token, block_manager.can_append(seq) must hold; while it does not, preempt the sequence
       admitted LAST (the end of `running`; the sequence itself if no other is left): status
       WAITING, block_manager.deallocate(it), put it at the FRONT of `waiting` (it is recomputed
       first when room comes back). A sequence that stays gets block_manager.may_append(seq).
       At the end `running` holds the scheduled sequences, in order. -> (scheduled, False, preempted).

    Hints: pop sequences off the left of `running` one by one and put the scheduled ones back at the
    end; the victims come off its right.
    """
    scheduled, preempted, num_tokens = [], [], 0
    while waiting and len(running) + len(scheduled) < max_num_seqs:
        seq = waiting[0]
        if num_tokens + len(seq) > max_num_batched_tokens or not block_manager.can_allocate(seq):
            break
        block_manager.allocate(seq)
        num_tokens += len(seq) - seq.num_cached_tokens
        seq.status = SequenceStatus.RUNNING
        waiting.popleft()
        scheduled.append(seq)
    if scheduled:
        running.extend(scheduled)
        return scheduled, True, preempted

    while running:
        seq = running.popleft()
        while not block_manager.can_append(seq):
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
