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


class Scheduler:
    def __init__(self, config: EngineConfig, num_blocks: int, eos_token_ids: list[int]):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.eos_token_ids = set(eos_token_ids)
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
        scheduled, num_tokens = [], 0
        while self.waiting and len(self.running) + len(scheduled) < self.max_num_seqs:
            seq = self.waiting[0]
            if num_tokens + len(seq) > self.max_num_batched_tokens or not self.block_manager.can_allocate(seq):
                break
            self.block_manager.allocate(seq)
            num_tokens += len(seq) - seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            scheduled.append(seq)
        if scheduled:
            self.running.extend(scheduled)
            return scheduled, True

        while self.running:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
            else:
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        self.running.extend(scheduled)
        return scheduled, False

    def preempt(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def postprocess(self, seqs: list[Sequence], token_ids: list[int]) -> list[Sequence]:
        """Append each sampled token; finish the sequences that hit a stop condition. -> the finished ones."""
        finished = []
        for seq, token_id in zip(seqs, token_ids):
            seq.append_token(token_id)
            reason = self.stop_reason(seq, token_id)
            if reason:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def stop_reason(self, seq: Sequence, token_id: int) -> str | None:
        p = seq.params
        if not p.ignore_eos and token_id in self.eos_token_ids:
            return "stop"
        if token_id in p.stop_token_ids:
            return "stop"
        if seq.num_completion_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (a stop condition, a stop string, or an abort) and free its blocks."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        self.block_manager.deallocate(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
