"""AsyncLLM: one engine, stepped by one background thread, streaming to asyncio callers (vLLM's AsyncLLM).

Threads: the engine thread is the only one that touches the LLMEngine (add, step, abort, read
outputs). Callers on an asyncio event loop (the server) hand it requests and aborts through two
lists under one Condition and read each request's outputs from its own _Outputs. After each step
the engine thread hands the event loop all of the step's outputs in one loop.call_soon_threadsafe
(one wake-up per step, not one per request); a reader that has fallen behind finds its unread
deltas merged into one (vLLM's RequestOutputCollector), so a busy server sends fewer, larger chunks
instead of building a backlog. New requests join the running batch at the next step (continuous
batching). With nothing to do the thread sleeps on the Condition (no busy loop).

    stream = async_llm.add_request("Hello", SamplingParams(max_tokens=8))   # checked now: ValueError
    async for out in stream:            # RequestOutputs holding everything so far (vLLM's CUMULATIVE kind;
        print(out.outputs[0].text, out.outputs[0].token_ids, out.outputs[0].finish_reason)  # DELTA: the new part)

Static batching (static_batching=True, `serve --batching static`), for comparison only: new requests
join only when every running one has finished, at most max_num_seqs at a time: the batch runs to
its longest request's end while the others' slots sit idle (what continuous batching removes).

Stream interval (vLLM's --stream-interval): a request's tokens go out once stream_interval of them
have gathered (its first token and its last at once). Every delta costs Python work on both threads,
which share one GIL with the engine's own step: at high load, fewer larger deltas leave the engine
thread more of it. 1 (the default) sends every token as soon as it is read back.

Backpressure: at most max_waiting requests may wait to be scheduled (accepted, no step run yet);
one more raises QueueFullError (the server's 503). abort() (a client that went away) ends a request
before the engine's next step, which frees its KV blocks. Who is in and how many wait is an
Admission, changed under the lock by four small functions: admit (add_request), start (its first
step ran), abort_request (abort) and finish (it ended, however). An error inside a step fails every request
in flight with EngineError, and the engine goes on serving; shutdown() fails what is left and frees
the engine.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from minillm.engine.llm_engine import RequestChecks
from minillm.engine.sequence import Sequence
from minillm.llm import TextDeltas
from minillm.outputs import CompletionOutput, RequestOutput
from minillm.sampling_params import RequestOutputKind, SamplingParams, describe
from minillm.serving.metrics import Metrics
from minillm.serving.protocol import merge
from minillm.tokenizer import check_text

_END = object()  # the queue's last item after the final output


class QueueFullError(Exception):
    """max_waiting requests are already waiting: try again later."""


class EngineError(Exception):
    """The engine failed this request (an error inside a step), or it is shutting down."""


class _SampleText:
    """One sample's new tokens, text and logprobs since the last look, as a CompletionOutput."""

    def __init__(self, seq: Sequence, tokenizer):
        self.seq, self.text = seq, TextDeltas(seq, tokenizer)
        self.done = False

    @property
    def num_unsent(self) -> int:
        """Completion tokens read back from the device and not yet in a delta."""
        return self.seq.num_completion_tokens - self.seq.num_placeholders - self.text.num_read

    def delta(self, engine) -> CompletionOutput | None:
        seq, first = self.seq, self.text.num_read
        new, delta = self.text.advance(engine)
        logprobs = None
        if seq.params.logprobs is not None:
            logprobs = [engine._logprob_objects(d) for d in seq.logprobs[first:first + len(new)]]
        self.done = seq.is_finished
        if not (delta or new or self.done):
            return None
        return CompletionOutput(index=seq.index, text=delta, token_ids=new, logprobs=logprobs,
                                cumulative_logprob=seq.cumulative_logprob if logprobs is not None else None,
                                finish_reason=seq.finish_reason if self.done else None,
                                stop_reason=engine.completion(seq).stop_reason if self.done else None)


def merged(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """Two consecutive deltas of one request as one delta (samples merged by index, in order)."""
    outs: dict[int, CompletionOutput] = {}
    merge(outs, first.outputs)
    merge(outs, then.outputs)
    return dataclasses.replace(then, outputs=list(outs.values()),
                               prompt_logprobs=first.prompt_logprobs or then.prompt_logprobs)


class _Outputs:
    """One request's outputs on the event loop's side, not yet read: RequestOutput deltas (an unread
    one absorbs the next), then an exception and/or _END. Used on the loop's thread only."""

    def __init__(self):
        self.items: deque = deque()
        self.waiter: asyncio.Future | None = None
        # set by the engine thread when it sends a delta, cleared here once the reader has taken
        # everything: while it is set the engine thread leaves new tokens in the sequence and sends
        # them in one later delta (a reader that is behind costs no per-step work). A stale value
        # either way only moves tokens to the next delta.
        self.unread = False

    def put(self, item) -> None:
        last = self.items[-1] if self.items else None
        if isinstance(item, RequestOutput) and isinstance(last, RequestOutput):
            self.items[-1] = merged(last, item)  # the reader is behind: one larger chunk, no backlog
        else:
            self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self):
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        item = self.items.popleft()
        self.unread = bool(self.items)
        return item


def _deliver(sent: list) -> None:
    """On an event loop's thread: one step's (request, item) pairs into their requests' _Outputs."""
    for req, item in sent:
        req.outputs.put(item)


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    outbox: list  # the AsyncLLM's (request, item) pairs not yet handed to their event loops
    outputs: _Outputs = field(default_factory=_Outputs)
    seq: Sequence | None = None
    samples: list[_SampleText] = field(default_factory=list)
    waiting: bool = True  # counted against max_waiting until its first step
    prompt_logprobs_sent: bool = False  # params.prompt_logprobs: they went out with a delta
    aborted: bool = False
    # vLLM's arrival_time: when the server accepted it (the engine's Sequence is made a turn later)
    arrival_time: float = field(default_factory=time.time)

    def put(self, item) -> None:
        """On the engine thread: send an item (sent with the step's others by AsyncLLM._flush)."""
        self.outbox.append((self, item))


@dataclass
class Admission:
    """Who is in: AsyncLLM's bookkeeping of accepted requests, changed only under its lock (by admit,
    start, abort_request and finish below), read by num_waiting / num_running and the server's 503."""

    max_waiting: int  # at most this many requests may wait (accepted, no step run yet)
    requests: dict[str, _Request] = field(default_factory=dict)  # every accepted, unfinished request
    num_waiting: int = 0  # accepted, not yet run a step (counted against max_waiting)


# >>> exercise 6.3 | notebooks/06_serving.ipynb | 3. The async engine loop: admission, backpressure, abort
def admit(book: Admission, req: _Request) -> None:
    """Accept a new request (the caller's add_request), or refuse it.

    Raise QueueFullError when book.max_waiting requests already wait (the server answers 503: try
    later; the error's message is the 503's), ValueError when book.requests already holds a request
    with req.request_id. Else register
    it in book.requests under its id and count it waiting (req.waiting is True for a new request).

    Hints: check the queue first, then the id; a request whose id was used by one that has
    finished is a new request (a finished request is no longer in book.requests).
    """
    if book.num_waiting >= book.max_waiting:  # >=: max_waiting may wait, one more may not
        raise QueueFullError(f"{book.num_waiting} requests are waiting (max_waiting={book.max_waiting})")
    if req.request_id in book.requests:
        raise ValueError(f"request id {req.request_id!r} is already in use")
    book.num_waiting += 1
    book.requests[req.request_id] = req


def start(book: Admission, req: _Request) -> None:
    """The engine ran req's first step: it waits no more (req.waiting becomes False and it stops
    counting in book.num_waiting); it is running. Idempotent; a no-op for a request that has ended
    (finish() ran for it: it is no longer in book.requests, and finish cleared its req.waiting)."""
    if req.waiting:  # finish clears it too: an ended request is not counted twice
        req.waiting = False
        book.num_waiting -= 1


def abort_request(book: Admission, request_id: str) -> _Request | None:
    """A caller's abort (a client went away). -> the live request with this id, now marked
    req.aborted = True, for the engine thread to end; None when there is nothing to abort: no such
    request, it has finished (it is no longer in book.requests), or it was aborted already (so two
    aborts end it once). Counts do not change here: the request is still in until finish()."""
    req = book.requests.get(request_id)
    if req is None or req.aborted:
        return None
    req.aborted = True
    return req


def finish(book: Admission, req: _Request) -> bool:
    """The request has ended (finished, aborted or failed): unregister it; if it was still waiting
    (aborted before its first step) it stops counting in book.num_waiting and req.waiting becomes
    False. -> True, or False when req had already ended (then nothing changes: a later request that
    reuses its id is not touched)."""
    if book.requests.get(req.request_id) is not req:
        return False
    del book.requests[req.request_id]
    if req.waiting:  # an abort before its first step: start() never ran for it
        req.waiting = False
        book.num_waiting -= 1
    return True
# <<< exercise 6.3


class AsyncStream:
    """The outputs of one request: `async for out in stream`; close() (or abort()) ends the request.
    Each output is what the request's params.output_kind asks for (vLLM's RequestOutputKind): the whole
    output so far (CUMULATIVE, the default), what is new since the last (DELTA), or only the last
    (FINAL_ONLY). The engine side always sends deltas; they are gathered here."""

    def __init__(self, async_llm: "EngineClient", request: _Request):
        self._llm, self._req, self.request_id = async_llm, request, request.request_id
        self.prompt, self.prompt_token_ids = request.prompt, request.prompt_ids  # (prompt: None for token ids)
        self.finished = False
        self._kind = request.params.output_kind
        self._so_far: dict[int, CompletionOutput] = {}  # each sample's output so far, by index (not for DELTA)
        self._prompt_logprobs = None  # the delta that carried them is gone: every later output repeats them

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> RequestOutput:
        while True:
            if self.finished:
                raise StopAsyncIteration
            item = await self._req.outputs.get()
            if item is _END:
                self.finished = True
                raise StopAsyncIteration
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            if self._kind == RequestOutputKind.DELTA:  # prompt_logprobs in the first delta after the prompt ran
                return item
            merge(self._so_far, item.outputs)
            self._prompt_logprobs = item.prompt_logprobs or self._prompt_logprobs
            if item.finished or self._kind == RequestOutputKind.CUMULATIVE:
                # copies: what was yielded before must not change under its reader
                outputs = [dataclasses.replace(c) for _, c in sorted(self._so_far.items())]
                return dataclasses.replace(item, outputs=outputs, prompt_logprobs=self._prompt_logprobs)

    def abort(self) -> None:
        """End the request now (its KV blocks are freed before the engine's next step). Idempotent."""
        if not self.finished:
            self._llm.cancel(self.request_id)

    close = abort


def check_positive(**values: int) -> None:
    """Raise ValueError unless every value is an integer >= 1 (named by its keyword)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {describe(value)}")


class EngineClient:
    """The request side of serving, whichever way the engine runs: checks a request, admits it (the
    Admission book), hands it on, and streams its outputs to the caller's event loop. AsyncLLM runs
    the engine in a thread of this process; EngineCoreClient (engine_core.py) in a process of its own.
    A subclass starts self._thread (it is_running while that lives) and defines _queue, _queue_abort
    and shutdown."""

    def __init__(self, tokenizer, checks: RequestChecks, default_params: SamplingParams, num_blocks: int,
                 max_waiting: int, chat_max_tokens: int | None = None):
        self.tokenizer, self.checks, self._default_params = tokenizer, checks, default_params
        self._chat_max_tokens = chat_max_tokens
        self.metrics = Metrics(num_blocks)
        self._cond = threading.Condition()
        self._book = Admission(max_waiting)  # accepted requests and how many wait (under _cond)
        self._stopping = False
        self._dead: str | None = None  # why the engine ended
        self._thread: threading.Thread | None = None
        self._outbox: list = []  # the engine thread's own: (request, item) pairs to send after this step

    def default_sampling_params(self, chat: bool = False) -> SamplingParams:
        """The LLM's defaults (LLM.get_default_sampling_params); for a chat request max_tokens is the
        model's generation_config max_new_tokens, else None: a reply runs until EOS or max_model_len, as
        vLLM's chat endpoint does (a 64-token default would cut answers short)."""
        if chat:
            return dataclasses.replace(self._default_params, max_tokens=self._chat_max_tokens)
        return dataclasses.replace(self._default_params)

    @property
    def max_model_len(self) -> int:
        return self.checks.max_model_len

    def add_request(self, prompt, params: SamplingParams, request_id: str | None = None) -> AsyncStream:
        """Check and queue one request (prompt: text or token ids). Raises ValueError for bad input,
        QueueFullError when max_waiting requests wait, EngineError when the engine has stopped."""
        return self.add_checked([self.check_request(prompt, params)], None if request_id is None else [request_id])[0]

    def check_request(self, prompt, params: SamplingParams) -> tuple[str | None, list[int], SamplingParams]:
        """Check one request without queueing it (prompt: text or token ids): its sampling params valid,
        tokenized, cut to params.truncate_prompt_tokens, inside the vocabulary, short enough, its bad
        words inside the vocabulary: the engine's own checks, in its order. Raises ValueError for bad input.
        -> (the prompt's text, or None for token ids; its token ids; a checked copy of params)."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty: give a non-empty string or list of token ids")
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer.json: give prompts as lists of token ids")
            ids = self.tokenizer.encode(check_text(prompt))
        else:
            ids = prompt
        checked = self.checks.check_params(params)
        ids = self.checks.check_prompt(ids, checked)
        self.checks.bad_words_ids(checked, self.tokenizer)
        return prompt if isinstance(prompt, str) else None, ids, checked

    def add_checked(self, requests: list[tuple[str | None, list[int], SamplingParams]],
                    request_ids: list[str] | None = None) -> list[AsyncStream]:
        """Queue requests that check_request has checked, all or none (a completion's list of prompts):
        QueueFullError when they do not all fit in max_waiting, EngineError when the engine has stopped."""
        loop = asyncio.get_running_loop()
        ids = request_ids or [uuid.uuid4().hex for _ in requests]
        reqs = [_Request(rid, text, tokens, params, loop, self._outbox)
                for rid, (text, tokens, params) in zip(ids, requests)]
        with self._cond:
            if self._stopping or self._dead:
                raise EngineError(f"the engine is not running ({self._dead or 'shutting down'})")
            book = self._book
            if len(reqs) > 1 and book.num_waiting + len(reqs) > book.max_waiting:  # (admit checks one alone)
                raise QueueFullError(f"{book.num_waiting} requests are waiting and {len(reqs)} more do not fit "
                                     f"(max_waiting={book.max_waiting})")
            admitted: list[_Request] = []
            try:
                for req in reqs:
                    admit(book, req)  # QueueFullError, ValueError
                    admitted.append(req)
            except BaseException:
                for req in admitted:  # none of them was handed to the engine
                    finish(book, req)
                raise
            for req in reqs:
                self._queue(req)
        return [AsyncStream(self, req) for req in reqs]

    async def generate(self, prompt, sampling_params: SamplingParams, request_id: str | None = None):
        """vLLM's AsyncLLM.generate, with its parameter names: an async iterator of RequestOutputs, each
        what sampling_params.output_kind asks for (the whole output so far by default;
        RequestOutputKind.DELTA: the new part); closing it aborts."""
        stream = self.add_request(prompt, sampling_params, request_id)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """vLLM's AsyncLLM.abort, a coroutine: end one request, or each of several, before the next step (a
        no-op for one that has finished or is unknown)."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self.cancel(rid)

    async def reset_prefix_cache(self) -> bool:
        """vLLM's coroutine: empty the prefix cache, so the next prompts find no cached blocks -> True;
        False, with nothing changed, while a request holds blocks (as LLM.reset_prefix_cache)."""
        raise NotImplementedError

    def cancel(self, request_id: str) -> None:
        """abort's work, from any thread and without an event loop: end a request before the next step (a
        no-op for one that has finished)."""
        with self._cond:
            req = abort_request(self._book, request_id)
            if req is not None:
                self._queue_abort(req)

    def _flush(self) -> None:
        """Hand every event loop its share of the outbox in one call (one wake-up per loop and step)."""
        if not self._outbox:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for pair in self._outbox:
            by_loop.setdefault(pair[0].loop, []).append(pair)
        self._outbox.clear()
        for loop, sent in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, sent)
            except RuntimeError:  # that event loop is closed: nobody is listening
                pass

    def _queue(self, req: _Request) -> None:
        """Under _cond: hand an admitted request to the engine."""
        raise NotImplementedError

    def _queue_abort(self, req: _Request) -> None:
        """Under _cond: ask the engine to end an aborted request."""
        raise NotImplementedError

    def shutdown(self, timeout: float = 60.0) -> None:
        raise NotImplementedError

    @property
    def is_running(self) -> bool:
        return not self._stopping and self._dead is None and self._thread is not None and self._thread.is_alive()

    @property
    def max_waiting(self) -> int:
        return self._book.max_waiting

    @property
    def num_waiting(self) -> int:
        """Requests accepted that have not run a step yet."""
        return self._book.num_waiting

    @property
    def num_running(self) -> int:
        """Requests the engine has started (run at least one step) and not finished."""
        with self._cond:
            return len(self._book.requests) - self._book.num_waiting


class AsyncLLM(EngineClient):
    """An LLM (minillm.LLM) served to asyncio callers, its engine stepped by a thread of this process;
    see the module docstring."""

    def __init__(self, llm, max_waiting: int = 256, static_batching: bool = False, stream_interval: int = 1):
        check_positive(max_waiting=max_waiting, stream_interval=stream_interval)
        super().__init__(llm.tokenizer, llm.engine.checks, llm.get_default_sampling_params(),
                         len(llm.engine.scheduler.block_manager.blocks), max_waiting, llm.model_max_tokens)
        self.stream_interval = stream_interval
        self.llm, self.engine = llm, llm.engine
        self.static_batching = bool(static_batching)
        self._inbox: list[_Request] = []  # accepted, not yet given to the engine
        self._aborts: list[_Request] = []
        self._live: list[_Request] = []  # the engine thread's own: requests in the engine
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._thread.start()

    def _queue(self, req: _Request) -> None:
        self._inbox.append(req)
        self._cond.notify()

    async def reset_prefix_cache(self) -> bool:
        # the engine's own lock orders this between the engine thread's steps
        return await asyncio.to_thread(self.engine.reset_prefix_cache)

    def _queue_abort(self, req: _Request) -> None:
        self._aborts.append(req)
        self._cond.notify()

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop the engine thread (requests still in flight fail with EngineError), then free the engine."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        if not self._thread.is_alive():  # never free an engine a stuck step still uses
            self.llm.shutdown()

    # ---- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        reason = "shut down"
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._aborts or self._stopping or not self.engine.is_finished()):
                        self._cond.wait()
                    if self._stopping:
                        return
                    inbox, self._inbox = self._next_batch(self._inbox)
                    aborts, self._aborts = self._aborts, []
                self._admit([r for r in inbox if not r.aborted])
                for req in aborts:
                    for sample in req.seq.samples if req.seq is not None else ():
                        self.engine.abort(sample)  # this thread owns the engine: applied (blocks freed) now
                    if req.seq is None:
                        self._end(req, None)
                if not self.engine.is_finished():
                    try:
                        self.engine.step()
                    except Exception as e:  # noqa: BLE001 -- fail the requests, keep serving
                        self._fail_live(e)
                self._publish()
                self._flush()
        except BaseException as e:  # noqa: BLE001 -- the thread dies: nobody may wait forever
            reason = f"the engine thread died: {type(e).__name__}: {e}"
            raise
        finally:
            with self._cond:
                self._dead = reason
                left = list(self._book.requests.values())
            for req in left:
                self._end(req, EngineError(f"the engine stopped before this request finished ({reason})"))
            self._flush()

    def _next_batch(self, inbox: list[_Request]) -> tuple[list[_Request], list[_Request]]:
        """-> (requests to give the engine now, requests that stay in the inbox)."""
        if not self.static_batching:
            return inbox, []  # continuous batching: everyone joins the next step
        if not self.engine.is_finished():
            return [], inbox  # static: the running batch finishes first
        size = self.engine.config.max_num_seqs
        return inbox[:size], inbox[size:]

    def _admit(self, reqs: list[_Request]) -> None:
        for req in reqs:
            try:  # one at a time: a request the engine refuses fails alone
                req.seq = self.engine.add_requests([req.prompt_ids], [req.params], req.arrival_time)[0]
            except Exception as e:  # noqa: BLE001
                self._end(req, EngineError(f"{type(e).__name__}: {e}"))
                continue
            req.samples = [_SampleText(s, self.tokenizer) for s in req.seq.samples]
            self._live.append(req)

    def _prompt_logprobs(self, req: _Request) -> list | None:
        """A request's prompt_logprobs (SamplingParams.prompt_logprobs), once: in the step that scored its
        prompt's last position (the one that samples its first token), as vLLM's first output carries them."""
        if req.params.prompt_logprobs is None or req.prompt_logprobs_sent:
            return None
        if len(req.seq.prompt_logprobs) < len(req.seq.prompt_token_ids):  # a prefill chunk short of the end
            return None
        req.prompt_logprobs_sent = True
        return self.engine.prompt_logprobs(req.seq)

    def _publish(self) -> None:
        """Send every request what is new since the last step; finish those that are done."""
        still, new_tokens = [], 0
        for req in self._live:
            if req.waiting and req.seq.first_scheduled_time is not None:
                self._scheduled(req)
            if self._held(req):
                still.append(req)  # its new tokens go out with a later delta
                continue
            deltas = [d for d in (s.delta(self.engine) for s in req.samples if not s.done) if d is not None]
            new_tokens += sum(len(d.token_ids) for d in deltas)
            finished = all(s.done for s in req.samples)
            prompt_logprobs = self._prompt_logprobs(req)
            if deltas or finished or prompt_logprobs:
                full = self.engine.request_output(req.seq, req.prompt) if finished else None
                req.outputs.unread = True
                req.put(RequestOutput(request_id=req.request_id, prompt=req.prompt, prompt_token_ids=req.prompt_ids,
                                      prompt_logprobs=prompt_logprobs, outputs=deltas, finished=finished,
                                      metrics=full.metrics if full else None))
            if finished:
                self.metrics.observe_finished(full)
                self._end(req, None)
            else:
                still.append(req)
        self._live = still
        self.metrics.count_generation_tokens(new_tokens)
        blocks = self.engine.scheduler.block_manager
        self.metrics.set_free_blocks(blocks.num_free_blocks)
        self.metrics.set_prefix_cache_hits(blocks.num_cached_tokens_total)

    def _held(self, req: _Request) -> bool:
        """Whether req's new tokens wait for a later step: never once a sample has finished; else while
        its reader has not taken the last delta, or (after each sample's first token, which goes at
        once) while every sample has fewer than stream_interval new tokens."""
        held, behind = True, self._reader_behind(req)  # one pass, no lists: this runs for every request at every step
        for s in req.samples:
            if s.done:
                continue
            if s.seq.is_finished:
                return False
            if held and not behind and (s.text.num_read == 0 or s.num_unsent >= self.stream_interval):
                held = False
        return held

    def _reader_behind(self, req: _Request) -> bool:
        """Whether req's reader has not yet taken the last delta sent (its new tokens can wait)."""
        return req.outputs.unread

    def _scheduled(self, req: _Request) -> None:
        self.metrics.count_prompt_tokens(len(req.prompt_ids))
        with self._cond:
            start(self._book, req)

    def _fail_live(self, error: Exception) -> None:
        self.engine.abort_all()  # a step half done: end every request (the engine stays usable)
        failed, self._live = self._live, []
        for req in failed:
            self._end(req, EngineError(f"the engine failed while running this request: {type(error).__name__}: "
                                       f"{error}"))

    def _end(self, req: _Request, error: Exception | None) -> None:
        with self._cond:
            if not finish(self._book, req):  # ended already (an abort racing its finish)
                return
        if error is not None:
            self.metrics.count_failed()
            req.put(error)
        req.put(_END)

