"""LLMEngine: requests in, tokens out. One `step()` = schedule -> run the model -> append tokens.

The engine owns every request's lifecycle: it queues them (all of a call, or none), runs them,
finishes them (a stop, the length limit, an abort) and forgets them. A lock makes each of those
state changes atomic, so several threads may share one engine; an abort asked for while another
thread (or a garbage collection inside this thread's step) holds the engine waits in a queue that
the holder empties as soon as it lets go.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from contextlib import contextmanager

from minillm.config import EngineConfig, ModelConfig
from minillm.engine.model_runner import ModelRunner, Pending
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import PLACEHOLDER_TOKEN, Sequence
from minillm.layers.attention import backend_for
from minillm.layers.sampler import TokenLogprobs
from minillm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from minillm.sampling_params import SamplingParams, describe, is_integer
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer


# >>> exercise 5.2 | notebooks/05_engine_performance.ipynb | 4. Async scheduling: the CPU works while the GPU runs
def append_placeholders(token_lists: list[list[int]], num_prompt_tokens: list[int], max_tokens: list[int],
                        max_model_len: int) -> tuple[list[int], list[bool]]:
    """Give every sequence of a step just launched a placeholder for the token that step will sample.

    token_lists[i]: sequence i's tokens, prompt then completion (it may already end in the
    placeholder of the step launched before, PLACEHOLDER_TOKEN = -1, not read back yet);
    num_prompt_tokens[i], max_tokens[i]: its prompt length and its SamplingParams.max_tokens (the
    caller passes max_model_len where that is None);
    max_model_len: no sequence may grow longer than this.
    In place: appends PLACEHOLDER_TOKEN to every list.
    -> (positions, at_limit), one per sequence: positions[i] is the index of its new placeholder;
       at_limit[i] is True when that placeholder is its last token: with it the completion
       (tokens after the prompt) has max_tokens[i] tokens, or the sequence has max_model_len tokens.
       The engine schedules such a sequence no more: its length is known now, its last token later.

    Hints: a placeholder counts like a token; decide at_limit after appending it.
    """
    positions, at_limit = [], []
    for tokens, prompt_len, limit in zip(token_lists, num_prompt_tokens, max_tokens):
        positions.append(len(tokens))
        tokens.append(PLACEHOLDER_TOKEN)
        at_limit.append(len(tokens) - prompt_len >= limit or len(tokens) >= max_model_len)
    return positions, at_limit


def fill_placeholders(token_lists: list[list[int]], positions: list[int], sampled: list[int],
                      at_limit: list[bool], eos_token_ids: set[int], params: list[SamplingParams]) -> list[str | None]:
    """Write a step's sampled tokens over their placeholders, one step after it was launched.

    With async scheduling the tokens of step n are read back while step n+1 runs, so a sequence can
    end in two placeholders: step n's at positions[i] and step n+1's after it.
    token_lists[i]: sequence i's tokens as they are now; positions[i]: the index of step n's
    placeholder (append_placeholders' positions); sampled[i]: the token step n sampled there;
    at_limit[i]: the sequence has reached its length limit (append_placeholders said so for its
    newest placeholder); eos_token_ids: the model's EOS ids; params[i]: its SamplingParams
    (ignore_eos, stop_token_ids).
    -> one outcome per sequence, and in place:
      "dropped": the sequence ended before this token (a stop one step earlier, an abort): an ended
                 sequence keeps no placeholder, so positions[i] is past its end or holds a real
                 token. Nothing is written.
      "stop":    the token is written and stops the sequence: it is in eos_token_ids (unless
                 params[i].ignore_eos) or in params[i].stop_token_ids. The placeholders after it
                 are removed: the step launched meanwhile computed a token nobody will read.
      "length":  the token is written and is the sequence's last: at_limit[i] and positions[i] is
                 its last index. A stop token there is a "stop".
      None:      the token is written; the sequence goes on.
    (Stop strings need the decoded text: the engine checks them afterwards.)

    Hints: the order of the checks above matters; `del tokens[i:]` removes a tail in place.
    """
    outcomes: list[str | None] = []
    for tokens, pos, tok, limit, p in zip(token_lists, positions, sampled, at_limit, params):
        if pos >= len(tokens) or tokens[pos] != PLACEHOLDER_TOKEN:
            outcomes.append("dropped")
            continue
        tokens[pos] = tok
        if (not p.ignore_eos and tok in eos_token_ids) or tok in p.stop_token_ids:
            del tokens[pos + 1:]
            outcomes.append("stop")
        elif limit and pos == len(tokens) - 1:
            outcomes.append("length")
        else:
            outcomes.append(None)
    return outcomes
# <<< exercise 5.2


class PromptTooLongError(ValueError):
    """A prompt that leaves no room in max_model_len for one generated token (the server's 400
    context_length_exceeded, as OpenAI and vLLM code it)."""


@dataclasses.dataclass(frozen=True)
class RequestChecks:
    """What this engine accepts, checked before a request is queued. Plain values, so `serve`'s API
    process checks requests for an engine that runs in another process (serving/engine_core.py)."""

    vocab_size: int
    max_model_len: int
    has_tokenizer: bool
    eos_token_ids: frozenset[int] = frozenset()  # the model's, where a beam search ends a beam (serving/beams.py)

    def check_prompt(self, token_ids, params: SamplingParams | None = None) -> list[int]:
        """Raise ValueError for a prompt the engine cannot run.
        token_ids: a list or tuple of ints (numpy integers too), or a 1-D integer array or tensor;
        params: checked params (check_params), whose truncate_prompt_tokens cuts the prompt first.
        -> the ids as a list of Python ints."""
        if hasattr(token_ids, "tolist") and not isinstance(token_ids, (list, tuple, str)):
            token_ids = token_ids.tolist()  # a numpy array or a torch tensor
        if not isinstance(token_ids, (list, tuple)):
            raise ValueError(f"a prompt must be a string or a list of token ids (ints), got {describe(token_ids)}")
        if not token_ids:
            raise ValueError("the prompt is empty: give a non-empty string or list of token ids")
        if not all(type(t) is int for t in token_ids):  # the common case first: it is much faster
            bad = next((i for i, t in enumerate(token_ids) if not is_integer(t)), None)
            if bad is not None:
                raise ValueError(f"a token-id prompt must hold integers; position {bad} holds "
                                 f"{describe(token_ids[bad])}")
            token_ids = [int(t) for t in token_ids]
        if params is not None:  # vLLM truncates, then checks what is kept
            token_ids = self.truncate_prompt(token_ids, params)
        vocab = self.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        limit = self.max_model_len
        if len(token_ids) >= limit:
            raise PromptTooLongError(f"the prompt has {len(token_ids)} tokens but max_model_len is {limit}: the "
                                     f"prompt plus at least one generated token must fit; shorten it or raise "
                                     f"max_model_len")
        return list(token_ids)

    def prompt_tokens_kept(self, params: SamplingParams) -> int | None:
        """How many prompt tokens params.truncate_prompt_tokens keeps (None: all), as vLLM's TokenizeParams
        resolves it: -1 is max_model_len - max_tokens, and k may not be more than that (max_tokens None:
        1, the room any prompt leaves for a generated token). Raises ValueError when it is."""
        k = params.truncate_prompt_tokens
        if k is None:
            return None
        out = params.max_tokens or 1
        room = self.max_model_len - out
        kept = room if k == -1 else k
        if not 1 <= kept <= room:
            raise ValueError(f"SamplingParams.truncate_prompt_tokens must be at most max_model_len - max_tokens = "
                             f"{self.max_model_len} - {out} = {room} (-1 keeps that many), got {k}"
                             + ("; lower max_tokens" if room < 1 else ""))
        return kept

    def truncate_prompt(self, token_ids: list[int], params: SamplingParams) -> list[int]:
        """The prompt's last prompt_tokens_kept(params) token ids (left truncation), or all of them."""
        k = self.prompt_tokens_kept(params)
        return token_ids if k is None else token_ids[-k:]

    def bad_words_ids(self, params: SamplingParams, tokenizer) -> tuple[tuple[int, ...], ...]:
        """params.bad_words as token sequences (SamplingParams.bad_words_token_ids), each id checked
        against the vocabulary. params: checked (check_params: a tokenizer is there when it has bad_words)."""
        if not params.bad_words:
            return ()
        seqs = params.bad_words_token_ids(tokenizer)
        outside = sorted({t for ids in seqs for t in ids if t >= self.vocab_size})
        if outside:
            raise ValueError(f"SamplingParams.bad_words tokenize to token ids {outside[:5]} outside the vocabulary "
                             f"[0, {self.vocab_size}) of this model")
        return tuple(tuple(ids) for ids in seqs)

    def check_params(self, params) -> SamplingParams:
        """Raise ValueError for sampling params the engine cannot run. -> a checked copy for the request
        alone (a field changed after the object was made is caught; later changes do not reach the engine)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {describe(params)}")
        params = dataclasses.replace(params)  # __post_init__ checks every field again
        if params.stop and not self.has_tokenizer:
            raise ValueError("stop strings need a tokenizer; this model folder has no tokenizer.json "
                             "(use stop_token_ids)")
        if params.bad_words and not self.has_tokenizer:
            raise ValueError("bad_words need a tokenizer; this model folder has no tokenizer.json "
                             "(use logit_bias with -100 for single tokens)")
        self.prompt_tokens_kept(params)
        vocab = self.vocab_size
        for name, ids in (("logit_bias", params.logit_bias or {}), ("allowed_token_ids", params.allowed_token_ids or ())):
            outside = [t for t in ids if t >= vocab]
            if outside:
                raise ValueError(f"SamplingParams.{name} names token ids {outside[:5]} outside the vocabulary "
                                 f"[0, {vocab}); name only this model's token ids")
        return params


class LLMEngine:
    def __init__(self, model_path: str, config: EngineConfig):
        self.model_config = ModelConfig.from_folder(model_path)
        config.validate(self.model_config)
        backend_for(config)  # an attention backend that cannot run this engine fails here, before any process starts
        self.config = config
        # a folder without tokenizer.json still runs token-id prompts (text outputs are then ""); a
        # tokenizer asked for by name must be there
        if config.tokenizer is not None:
            self.tokenizer = Tokenizer(config.tokenizer)
        else:
            self.tokenizer = Tokenizer(model_path) if Tokenizer.available(model_path) else None
        eos = list(self.model_config.eos_token_id)
        if self.tokenizer and self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.checks = RequestChecks(self.model_config.vocab_size, config.max_model_len, self.tokenizer is not None,
                                    frozenset(eos))
        self.model_runner = self._make_runner(model_path)
        self.scheduler = Scheduler(config, self.model_runner.num_kvcache_blocks)
        self.detokenizers: dict[int, IncrementalDetokenizer] = {}  # requests with stop strings
        self.stop_starts: dict[int, int] = {}  # their stop_text_start, once known (it never changes)
        self.eos_token_ids = set(eos)
        # vLLM's model EOS (the tokenizer's): a sequence it ends has stop_reason None; the others of
        # eos_token_ids (generation_config.json's extra ones) vLLM makes stop token ids, named in stop_reason
        self.tokenizer_eos_token_id = self.tokenizer.eos_token_id if self.tokenizer else None
        # async scheduling needs a runner that can launch without waiting (one process)
        self.async_scheduling = config.async_scheduling and config.tensor_parallel_size == 1
        self.pending: Pending | None = None  # the launched step not yet read back
        self.num_prefill_tokens = self.num_decode_tokens = 0
        # wall seconds of step() calls per phase, charged to the batch each call waited for: on a GPU
        # with async scheduling the one it read back (launched the call before), else the one it launched
        self.phase_seconds = {"prefill": 0.0, "decode": 0.0}
        self.requests: dict[int, Sequence] = {}  # every unfinished request, by seq_id
        self.lock = threading.Lock()  # one state change at a time: a step, queueing requests, an abort
        self.abort_queue: deque[Sequence] = deque()  # aborts asked for while the lock was taken

    def _make_runner(self, model_path: str) -> ModelRunner:
        if self.config.tensor_parallel_size > 1:
            from minillm.engine.tp import TPModelRunner
            return TPModelRunner(self.config, self.model_config, model_path)
        return ModelRunner(self.config, self.model_config, model_path)

    # ---- requests -----------------------------------------------------------------------------
    def add_requests(self, prompts: list, params: list[SamplingParams],
                     arrival_time: float | None = None) -> list[Sequence]:
        """Queue one request per (prompt, params), all or none: each one is checked before any is queued.
        prompts: token-id lists (see RequestChecks.check_prompt); arrival_time: when they were accepted
        (a server accepts a request a turn before its engine thread adds it; None: now).
        -> their Sequences (sample 0 of each), in order; with n > 1 a Sequence's `samples` holds all n."""
        if len(prompts) != len(params):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        checked = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            try:
                sp = self.checks.check_params(sp)  # first: truncate_prompt_tokens cuts the prompt before its checks
                ids = self.checks.check_prompt(prompt, sp)
                checked.append((ids, sp, self.checks.bad_words_ids(sp, self.tokenizer)))
            except ValueError as e:
                raise (ValueError(f"prompt {i}: {e}") if len(prompts) > 1 else e) from None
        seqs = [Sequence(ids, sp, self.config.kvcache_block_size, self._min_tokens_blocked(sp), 0, arrival_time, bad)
                for ids, sp, bad in checked]
        for seq in seqs:  # n > 1: the other samples wait in sample 0 until its prompt is computed
            p = seq.params
            seq.unforked = [seq.fork(i, dataclasses.replace(p, seed=None if p.seed is None else p.seed + i))
                            for i in range(1, p.n)]
            seq.samples += seq.unforked
        with self._owned():
            for seq in seqs:
                for sample in seq.samples:
                    if sample.params.stop:
                        skip = sample.params.skip_special_tokens
                        self.detokenizers[sample.seq_id] = IncrementalDetokenizer(self.tokenizer, skip)
                    self.requests[sample.seq_id] = sample
                self.scheduler.add(seq)
        return seqs

    def _min_tokens_blocked(self, params: SamplingParams) -> tuple[int, ...]:
        """The tokens params.min_tokens holds back: its stop_token_ids, and the model's EOS unless ignore_eos."""
        if not params.min_tokens:
            return ()
        return tuple(sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)))

    def add_request(self, token_ids: list[int], params: SamplingParams) -> Sequence:
        return self.add_requests([token_ids], [params])[0]

    def abort(self, seq: Sequence) -> None:
        """Finish one request with finish_reason "abort"; every other request goes on untouched.
        Safe from any thread and from a finalizer: when the engine is busy the abort is queued, and
        whoever holds the engine applies it before it lets go."""
        self.abort_queue.append(seq)
        self._apply_queued_aborts()

    def abort_all(self) -> None:
        """Finish every unfinished request (after an error or an interrupt): the engine stays usable."""
        with self._owned():
            pending, self.pending = self.pending, None
            if pending is not None:
                try:
                    self.model_runner.resolve(pending)  # let the device finish what it was given
                except Exception:  # noqa: BLE001 -- the caller is raising the error that matters
                    pass
            for seq in list(self.requests.values()):
                self._finish(seq, "abort")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix -> True; False, with nothing changed, while a request holds blocks."""
        with self._owned():
            return self.scheduler.block_manager.reset_prefix_cache()

    @contextmanager
    def _owned(self):
        """Hold the engine for one state change; apply the aborts queued meanwhile, before and after."""
        try:
            with self.lock:
                self._apply_aborts()
                yield
        finally:
            self._apply_queued_aborts()

    def _apply_queued_aborts(self) -> None:
        # whoever takes the lock applies the queue; when another holds it, its release does
        while self.abort_queue and self.lock.acquire(blocking=False):
            try:
                self._apply_aborts()
            finally:
                self.lock.release()

    def _apply_aborts(self) -> None:
        while self.abort_queue:
            seq = self.abort_queue.popleft()
            if seq.seq_id in self.requests:
                self._finish(seq, "abort")

    def _finish(self, seq: Sequence, reason: str) -> None:
        """End a request: no placeholder stays, its blocks are freed, the engine forgets it."""
        seq.finished_time = time.time()
        unforked, seq.unforked = seq.unforked, []  # samples that were waiting for this one's prompt
        for sample in unforked:
            self._finish(sample, reason)
        seq.drop_placeholders()
        self.scheduler.finish(seq, reason)
        self.requests.pop(seq.seq_id, None)
        self.detokenizers.pop(seq.seq_id, None)
        self.stop_starts.pop(seq.seq_id, None)

    # ---- the loop -----------------------------------------------------------------------------
    # A step is launched on the device and its tokens are read back one step later (async
    # scheduling): while the GPU runs step n, the CPU reads step n-1's tokens, finishes requests and
    # schedules step n+1. A launched sequence gets a placeholder token (PLACEHOLDER_TOKEN) at once, so
    # lengths, block tables and max_tokens stay exact; only a stop *token* (EOS, stop ids, stop
    # strings) is seen one step late, and the one extra token computed for that request is dropped.
    # A request is finished only once its last token is read back: a finished one has no placeholder.
    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        """Launch one batch, then read back the previous one.
        -> (the sequences whose new token was read back now, those of them that finished)."""
        with self._owned():
            return self._step()

    def _step(self) -> tuple[list[Sequence], list[Sequence]]:
        t0 = time.perf_counter()
        finished: list[Sequence] = []
        launched = None
        if self.requests and self.scheduler.is_finished() and self.pending is None:
            raise RuntimeError(f"{len(self.requests)} requests are unfinished but none is scheduled or running; "
                               f"this is a bug")
        if not self.scheduler.is_finished():
            seqs, is_prefill = self.scheduler.schedule()
            scheduled_at = time.time()  # vLLM's first_scheduled_time: when the scheduler picked it, before its launch
            if not seqs:
                raise RuntimeError("the scheduler found nothing to run although requests are pending; this is a bug")
            if is_prefill:
                seqs = self._fork(seqs)
            else:  # longest context first: the decode kernel's longest programs start first, short ones
                # fill the SMs at the end (tests/gpu/decode_sweep.py: 1-2% faster at batch 128-256)
                seqs = sorted(seqs, key=lambda s: s.num_tokens, reverse=True)
            prev = self.pending if self.async_scheduling else None
            copies, self.scheduler.block_manager.copies = self.scheduler.block_manager.copies, []
            launched = self.model_runner.launch(seqs, is_prefill, prev, copies)
            if is_prefill:  # a sequence is first scheduled (or forked) in a prefill step: decode steps skip this
                for seq in seqs:
                    seq.fork_of = None  # forked: from now on it computes its own tokens
                    if seq.first_scheduled_time is None:
                        seq.first_scheduled_time, seq.num_prefix_cache_hits = scheduled_at, seq.num_cached_tokens
                self.num_prefill_tokens += sum(s.num_new_tokens for s in seqs)
            else:
                self.num_decode_tokens += len(seqs)
                for s in seqs:  # this step computes the K/V of each one's newest token
                    s.num_computed_tokens = s.num_tokens
            launched.positions = self._append_placeholders(seqs, is_prefill)
        if not self.async_scheduling:  # read this step back now
            self.pending, launched = launched, None
        ran = []
        if self.pending is not None:
            ran = [s for s, pos in zip(self.pending.seqs, self.pending.positions) if pos is not None]
            self._fill_tokens(self.pending, self.model_runner.resolve(self.pending), finished)
        if not self.async_scheduling:  # this call launched the step and read it back
            waited = self.pending
        else:  # a GPU runs the step launched the call before while this one prepared the next
            waited = self.pending if self.model_runner.device.type == "cuda" else launched
        if waited is not None:
            self.phase_seconds["prefill" if waited.is_prefill else "decode"] += time.perf_counter() - t0
        self.pending = launched
        return ran, finished

    def _fork(self, seqs: list[Sequence]) -> list[Sequence]:
        """n > 1: the samples waiting in a sequence whose prompt is computed in this step (its last chunk)
        fork from it (share its blocks, sample from its logits row), while max_num_seqs allows; the
        others queue as sequences of their own (their prompt's full blocks then come from the prefix cache).
        -> the step's sequences with the forked samples after their parent."""
        out = []
        for seq in seqs:
            out.append(seq)
            if seq.num_computed_tokens < seq.num_tokens:  # a chunk: its samples fork after its last one
                continue
            waiting, seq.unforked = [s for s in seq.unforked if not s.is_finished], []
            room = self.config.max_num_seqs - len(self.scheduler.running)
            for sample in waiting[:max(room, 0)]:
                self.scheduler.fork(seq, sample)
                out.append(sample)
            for sample in reversed(waiting[max(room, 0):]):
                self.scheduler.waiting.appendleft(sample)
        return out

    def _append_placeholders(self, seqs: list[Sequence], is_prefill: bool) -> list[int | None]:
        """Give every launched sequence a placeholder for its coming token. One that reaches max_tokens
        or max_model_len with it is scheduled no more; it finishes when that token is read back.
        A prefill chunk short of its prompt's end gets none: its row's token is never read.
        -> the placeholders' positions (None for such a chunk)."""
        sampling = [s for s in seqs if s.num_computed_tokens >= s.num_tokens] if is_prefill else seqs
        positions, at_limit = append_placeholders([s.token_ids for s in sampling],
                                                  [s.num_prompt_tokens for s in sampling],
                                                  [s.params.max_tokens or self.config.max_model_len for s in sampling],
                                                  self.config.max_model_len)  # max_tokens None: max_model_len limits
        for seq, limit in zip(sampling, at_limit):
            if limit:
                self.scheduler.remove(seq)
                seq.finish_reason = "length"  # final once its last token is read back
        if len(sampling) == len(seqs):
            return positions
        where = {s.seq_id: pos for s, pos in zip(sampling, positions)}
        return [where.get(s.seq_id) for s in seqs]

    def _fill_tokens(self, pending: Pending, token_ids: list[int], finished: list[Sequence]) -> None:
        """Write a read-back step's tokens over their placeholders; finish the requests that stop here
        (stop tokens, stop strings) or that got their last token."""
        self._fill_prompt_logprobs(pending)
        # a finished request (a stop one step earlier, an abort) drops its token; a prefill chunk short of
        # its prompt's end (no position) sampled one nobody keeps
        rows = [(seq, pos, tok) for seq, pos, tok in zip(pending.seqs, pending.positions, token_ids)
                if pos is not None and not seq.is_finished]
        seqs = [seq for seq, _, _ in rows]
        outcomes = fill_placeholders([s.token_ids for s in seqs], [pos for _, pos, _ in rows],
                                     [tok for _, _, tok in rows], [s.finish_reason == "length" for s in seqs],
                                     self.eos_token_ids, [s.params for s in seqs])
        now = time.time()
        for seq, (_, _, tok), outcome in zip(seqs, rows, outcomes):
            if outcome == "dropped":
                continue
            if seq.first_token_time is None:
                seq.first_token_time = now
            if seq.params.logprobs is not None:
                row = pending.rows[seq.seq_id]
                seq.logprobs.append(position_logprobs(pending.logprobs, row, seq.params.logprobs, tok))
                seq.cumulative_logprob += float(pending.logprobs.chosen[row])
            detok = self.detokenizers.get(seq.seq_id)
            if detok is not None and outcome != "stop":
                detok.add([tok])
                start = self.stop_starts.get(seq.seq_id)
                if start is None:
                    start = self.stop_text_start(seq.params, detok.ids)
                    if start is not None:
                        self.stop_starts[seq.seq_id] = start
                if start is not None and seq.params.first_stop(detok.text, start) is not None:
                    outcome = "stop"
            if outcome is not None:
                self._finish(seq, outcome)  # drops a placeholder launched after this token
                finished.append(seq)

    def _fill_prompt_logprobs(self, pending: Pending) -> None:
        for row, first, lp in pending.prompt_logprobs:
            seq = pending.seqs[row]
            k = seq.params.prompt_logprobs
            for i in range(len(lp.chosen)):
                if first + i == len(seq.prompt_logprobs):  # (a recomputed prompt is scored once)
                    seq.prompt_logprobs.append(position_logprobs(lp, i, k, seq.token_ids[first + i]))

    def is_finished(self) -> bool:
        return not self.requests and self.pending is None

    def stop_text_start(self, params: SamplingParams, tokens: list[int]) -> int | None:
        """Where stop strings count in the text of a completion's tokens: a match must end past the text
        of its first min_tokens tokens (vLLM checks stop strings only once more than min_tokens tokens
        exist, and only in the text after them). -> that text's length (0 without min_tokens), or None
        while there are at most min_tokens tokens (no stop string can stop it yet)."""
        m = params.min_tokens
        if len(tokens) <= m:
            return None
        if not m or self.tokenizer is None:
            return 0
        # a character split across tokens decodes to U+FFFD until its last byte comes: not text yet
        return len(self.tokenizer.decode(tokens[:m], params.skip_special_tokens).rstrip("\ufffd"))

    def is_stop_token(self, params: SamplingParams, token: int) -> bool:
        """Whether token stops a sequence with these params: EOS (unless ignore_eos) or a stop token id."""
        return token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids)

    def stopped_by_token(self, seq: Sequence, tokens: list[int]) -> bool:
        """Whether the last of tokens (seq's completion) stopped seq: EOS or a stop token id (a stop
        string is found only in tokens that are neither: those stop first)."""
        return seq.finish_reason == "stop" and bool(tokens) and self.is_stop_token(seq.params, tokens[-1])

    def completion(self, seq: Sequence) -> CompletionOutput:
        """One sample's result so far (final once it is finished)."""
        tokens = seq.resolved_completion()
        params = seq.params
        by_token = self.stopped_by_token(seq, tokens)
        # vLLM's detokenizer leaves the stop token's text out (token_ids keep it) unless
        # include_stop_str_in_output: '.\n' stopped by the id of '\n' reads '.'
        text_tokens = tokens[:-1] if by_token and not params.include_stop_str_in_output else tokens
        text = self.tokenizer.decode(text_tokens, params.skip_special_tokens) if self.tokenizer and params.detokenize \
            else ""
        start = self.stop_text_start(params, tokens) if params.stop else None
        cut = params.cut_at_stop(text, start) if start is not None else None
        stop_reason = None
        if cut is not None:
            stop_reason, text = params.first_stop(text, start), cut
        elif by_token and (tokens[-1] in params.stop_token_ids or tokens[-1] != self.tokenizer_eos_token_id):
            stop_reason = tokens[-1]
        logprobs = None
        if seq.params.logprobs is not None:
            logprobs = [self._logprob_objects(d, params.detokenize) for d in seq.logprobs[:len(tokens)]]
        return CompletionOutput(index=seq.index, text=text, token_ids=tokens,
                                cumulative_logprob=seq.cumulative_logprob if logprobs is not None else None,
                                logprobs=logprobs, finish_reason=seq.finish_reason, stop_reason=stop_reason)

    def request_output(self, seq: Sequence, prompt: str | None = None) -> RequestOutput:
        """The result of one request (seq: its sample 0) so far: all its samples, in index order."""
        samples = sorted(seq.samples, key=lambda s: s.index)
        firsts = [s.first_token_time for s in samples if s.first_token_time is not None]
        ends = [s.finished_time for s in samples]
        metrics = RequestMetrics(arrival_time=seq.arrival_time, first_scheduled_time=seq.first_scheduled_time,
                                 first_token_time=min(firsts, default=None),
                                 finished_time=None if None in ends else max(ends))
        return RequestOutput(request_id=str(seq.seq_id), prompt=prompt, prompt_token_ids=seq.prompt_token_ids,
                             prompt_logprobs=self.prompt_logprobs(seq), outputs=[self.completion(s) for s in samples],
                             finished=all(s.is_finished for s in samples), metrics=metrics,
                             num_cached_tokens=seq.num_prefix_cache_hits)

    def prompt_logprobs(self, seq: Sequence) -> list[dict | None] | None:
        """RequestOutput.prompt_logprobs of a request (seq: its sample 0) so far: None without
        SamplingParams.prompt_logprobs, else None for the first token and {token: Logprob} for each scored one."""
        if seq.params.prompt_logprobs is None:
            return None
        return [None if d is None else self._logprob_objects(d, seq.params.detokenize) for d in seq.prompt_logprobs]

    def _logprob_objects(self, entry: dict[int, tuple[float, int]], detokenize: bool = True) -> dict:
        """{token: Logprob}, each with its token's own text, a special token's included (vLLM's decoded_token,
        which decodes each id with skip_special_tokens=False; None without detokenize)."""
        decode = self.tokenizer.decode if self.tokenizer and detokenize else None
        return {t: Logprob(lp, rank, decode([t], skip_special_tokens=False) if decode else None)
                for t, (lp, rank) in entry.items()}

    def shutdown(self) -> None:
        """Free everything on the device (weights, KV cache, CUDA graphs) and stop tensor-parallel
        workers, in order (minillm/engine/tp.py). Idempotent; the engine cannot run after it."""
        self.pending = None  # the last launched step's tokens, on the device
        self.model_runner.shutdown()


def position_logprobs(lp: TokenLogprobs, row: int, k: int, token_id: int) -> dict[int, tuple[float, int]]:
    """One position's {token id: (logprob, rank)}: the chosen token (token_id) first, then the k most
    likely (as vLLM orders them)."""
    entry = {token_id: (float(lp.chosen[row]), int(lp.rank[row]))}
    for rank, (t, v) in enumerate(zip(lp.top_ids[row, :k].tolist(), lp.top_logprobs[row, :k].tolist()), start=1):
        entry.setdefault(t, (v, rank))
    return entry
