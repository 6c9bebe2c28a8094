"""Sequence: one request's tokens, its place in the KV cache (block_table) and its sampling params."""
from __future__ import annotations

import time
from enum import Enum, auto
from itertools import count

from minillm.sampling_params import SamplingParams

# The token of a launched step that has not been read back yet (async scheduling). It lives only at
# the end of an unfinished sequence: a finished or aborted one never keeps it.
PLACEHOLDER_TOKEN = -1


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    _ids = count()

    def __init__(self, token_ids: list[int], params: SamplingParams, block_size: int,
                 min_tokens_blocked: tuple[int, ...] = (), index: int = 0, arrival_time: float | None = None,
                 bad_words_ids: tuple[tuple[int, ...], ...] = ()):
        """min_tokens_blocked: the tokens params.min_tokens holds back (EOS unless ignore_eos, and
        stop_token_ids: the engine knows the model's EOS); index: which of its request's n samples;
        arrival_time: when the request was accepted (time.time(); None: now); bad_words_ids:
        params.bad_words as token sequences (SamplingParams.bad_words_token_ids: the engine has the tokenizer)."""
        self.seq_id = next(Sequence._ids)
        self.index = index
        # n > 1: sample 0 carries the other samples until its prompt is computed, then they fork from
        # it (share its blocks); in the step they fork, a sample reads its logits row from fork_of
        self.unforked: list[Sequence] = []
        self.fork_of: Sequence | None = None
        self.samples: list[Sequence] = [self]  # sample 0: its request's samples, itself first
        self.status = SequenceStatus.WAITING
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0  # prompt tokens whose K/V came from the prefix cache (a statistic)
        # tokens whose K/V is in the cache or computed by a step already scheduled: prefix-cache hits,
        # then each prefill chunk (the scheduler adds it), then each decode step (the engine sets it)
        self.num_computed_tokens = 0
        # the tokens the prefill step it was last scheduled in computes for it: positions
        # num_computed_tokens - num_new_tokens .. num_computed_tokens - 1 (the whole uncached prompt, or one
        # chunk of a long one). The scheduler sets it to 0 once running sequences have decoded after a chunk.
        self.num_new_tokens = 0
        self.num_prefix_cache_hits = 0  # num_cached_tokens when first scheduled (kept after its blocks are freed)
        self.block_size = block_size
        self.block_table: list[int] = []
        self.params = params
        self.finish_reason: str | None = None
        self.generator = None  # a seeded request's torch.Generator, made by the model runner on first use
        self.min_tokens_blocked = min_tokens_blocked
        self.bad_words_ids = bad_words_ids
        # a logits processor or min_p is on: its steps sample outside the fused sampler (params are the
        # engine's own checked copy, which nothing changes afterwards; read once per step and row)
        self.slow_sampling = params.processes_logits or params.min_p > 0 or params.logprobs is not None
        # with SamplingParams.logprobs / prompt_logprobs: per token {token id: (logprob, rank)}
        self.logprobs: list[dict[int, tuple[float, int]]] = []
        self.prompt_logprobs: list[dict[int, tuple[float, int]] | None] = [None]  # token 0 has none
        self.cumulative_logprob = 0.0
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.block_size)

    @property
    def num_cached_blocks(self) -> int:
        return self.num_cached_tokens // self.block_size

    @property
    def num_placeholders(self) -> int:
        """How many tokens at the end are still on the device (PLACEHOLDER_TOKEN): 0, 1 or 2."""
        n = 0
        while n < self.num_completion_tokens and self.token_ids[-1 - n] == PLACEHOLDER_TOKEN:
            n += 1
        return n

    def resolved_completion(self, start: int = 0) -> list[int]:
        """Completion tokens read back so far, from the start-th on (a launched step's token is
        PLACEHOLDER_TOKEN until it is read back)."""
        return self.token_ids[self.num_prompt_tokens + start:self.num_tokens - self.num_placeholders]

    def drop_placeholders(self) -> None:
        """Forget the tokens still on the device (the request ended before they were read back)."""
        del self.token_ids[self.num_tokens - self.num_placeholders:]

    def block(self, i: int) -> list[int]:
        """The token ids of logical block i."""
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def fork(self, index: int, params: SamplingParams) -> "Sequence":
        """Another sample of the same prompt (not started: it forks from this one when its prompt is computed)."""
        return Sequence(self.token_ids, params, self.block_size, self.min_tokens_blocked, index, self.arrival_time,
                        self.bad_words_ids)
