"""The engine in a process of its own (vLLM V1's EngineCore): how `serve` runs it by default.

Why: in one process the server's event loop (HTTP, JSON, one SSE event per delta) and the engine
thread's step share one interpreter lock (the GIL). At saturation the engine thread waits for it
between steps while the GPU idles (notebook 06, section 4 measures what that costs). Here the API
process keeps the request side (EngineClient: checks, the Admission book, 503s, the streams) and a
process of its own runs the engine thread (the same AsyncLLM), which hands each step's events to
the API process in one pipe message:

    API process: EngineCoreClient                  engine process: run_engine_core
    add_request: check, admit  -- ("add", id, prompt, ids, params, arrival) -->  AsyncLLM's engine thread
    abort                      -- ("abort", id) ---------------------->
    reader thread: start,      <-- ([(id, event), ...], metrics) ------  after each step (_flush)
      finish, deliver deltas
    reset_prefix_cache         -- ("reset_prefix_cache", call id) -->  the engine's (under its lock)
    reader thread: the answer  <-- ([(call id, ("result", value))], metrics)
    shutdown                   -- ("stop",) ------------------------->  fail what is left, free the
                                                                         GPU, exit

An event is STARTED (the request's first step ran: it waits no more), a delta (a tuple: cheaper to
pickle than RequestOutput), ("error", message) or END. The engine process's own Admission never
refuses: the API process counts. If the engine process dies, every request in flight fails with
EngineError; if the API process dies, the engine process reads EOF and shuts down.
"""
from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import signal
import sys
import threading
import uuid

from minillm.outputs import CompletionOutput, RequestOutput
from minillm.serving.async_engine import (_END, AsyncLLM, EngineClient, EngineError, _Request, admit, check_positive,
                                          finish, start)

STARTED = "started"  # events (plain strings pickle small)
END = "end"
STOP_TIMEOUT_S = 60.0  # how long shutdown waits for the engine process before killing it


def _pack(item) -> tuple | str:
    """The engine process's side of an event: a RequestOutput delta as plain tuples."""
    if item is _END:
        return END
    if isinstance(item, BaseException):
        return ("error", str(item))
    if isinstance(item, RequestOutput):
        return ("out", item.finished, [(c.index, c.text, c.token_ids, c.cumulative_logprob, c.logprobs,
                                        c.finish_reason, c.stop_reason) for c in item.outputs], item.metrics,
                item.prompt_logprobs)
    return item  # STARTED


def _unpack(req: _Request, event: tuple) -> RequestOutput | EngineError:
    """The API process's side: an ("out", ...) or ("error", ...) event as what its stream yields."""
    if event[0] == "error":
        return EngineError(event[1])
    _, finished, outputs, metrics, prompt_logprobs = event
    return RequestOutput(request_id=req.request_id, prompt=req.prompt, prompt_token_ids=req.prompt_ids,
                         prompt_logprobs=prompt_logprobs, outputs=[CompletionOutput(*o) for o in outputs],
                         finished=finished, metrics=metrics)


def _settle(loop: asyncio.AbstractEventLoop, answer: asyncio.Future, value) -> None:
    """From the reader thread: resolve a call's future on its event loop (an exception: raise it there)."""
    def settle() -> None:
        if not answer.done():
            (answer.set_exception if isinstance(value, BaseException) else answer.set_result)(value)
    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # that event loop is closed: nobody is listening
        pass


class _EngineCore(AsyncLLM):
    """AsyncLLM in the engine process: requests arrive from the pipe (submit), each step's events
    leave through it (_flush, on the engine thread)."""

    def __init__(self, llm, outputs, stream_interval: int, static_batching: bool):
        self._pipe = outputs
        self._pipe_lock = threading.Lock()  # the engine thread's _flush and the main thread's answers
        self._sent_metrics: tuple | None = None
        super().__init__(llm, max_waiting=sys.maxsize, static_batching=static_batching,
                         stream_interval=stream_interval)

    def submit(self, request_id: str, prompt: str | None, ids: list[int], params, arrival_time: float) -> bool:
        """Queue a request the API process has checked and admitted (at arrival_time, its time.time()).
        -> False once the engine has stopped."""
        req = _Request(request_id, prompt, ids, params, None, self._outbox, arrival_time=arrival_time)
        with self._cond:
            if self._stopping or self._dead:
                return False
            admit(self._book, req)
            self._queue(req)
        return True

    def _reader_behind(self, req: _Request) -> bool:
        return False  # no reader here: the API process merges what its reader has not taken

    def _scheduled(self, req: _Request) -> None:
        super()._scheduled(req)
        self._outbox.append((req, STARTED))

    def _flush(self) -> None:
        events = [(req.request_id, _pack(item)) for req, item in self._outbox]
        self._outbox.clear()
        metrics = self.metrics.snapshot()
        if events or metrics != self._sent_metrics:
            with self._pipe_lock:
                self._pipe.send((events, metrics))
            self._sent_metrics = metrics

    def answer(self, call_id: str, value) -> None:
        """On the main thread: the result of an API-process call, as an event of its own."""
        with self._pipe_lock:
            self._pipe.send(([(call_id, ("result", value))], self.metrics.snapshot()))


def run_engine_core(requests, outputs, model: str, llm_args: dict, core_args: dict) -> None:
    """The engine process: build the LLM, say ready (or why not), then serve the API process's messages."""
    # Ctrl-C, and a SIGTERM sent to the whole process group (systemd, kill -- -PGID), reach this process
    # too: the API process decides, fails what is in flight naming the shutdown, then closes the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from minillm.llm import LLM
    try:
        llm = LLM(model, **llm_args)
    except Exception as e:  # noqa: BLE001 -- reported to the API process, which raises it
        bad_input = isinstance(e, ValueError)
        outputs.send(("failed", bad_input, str(e) if bad_input else f"{type(e).__name__}: {e}"))
        return
    outputs.send(("ready", llm.engine.checks, llm.get_default_sampling_params(),
                  len(llm.engine.scheduler.block_manager.blocks), llm.tokenizer, llm.model_max_tokens))
    core = _EngineCore(llm, outputs, **core_args)
    try:
        while True:
            try:
                message = requests.recv()
            except EOFError:  # the API process has gone
                break
            if message[0] == "add":
                if not core.submit(*message[1:]):
                    break  # the engine thread died: exit, and the API process fails what is left
            elif message[0] == "abort":
                core.cancel(message[1])
            elif message[0] == "reset_prefix_cache":
                core.answer(message[1], llm.engine.reset_prefix_cache())
            else:
                break
    finally:
        core.shutdown()


class EngineCoreClient(EngineClient):
    """An EngineClient whose engine runs in a process of its own (vLLM's AsyncMPClient); see the module
    docstring. model and llm_args: what LLM(model, **llm_args) takes, built in that process."""

    def __init__(self, model: str, llm_args: dict | None = None, max_waiting: int = 256,
                 static_batching: bool = False, stream_interval: int = 1):
        check_positive(max_waiting=max_waiting, stream_interval=stream_interval)
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: CUDA cannot be forked
        requests_r, self._requests = ctx.Pipe(duplex=False)
        self._outputs, outputs_w = ctx.Pipe(duplex=False)
        core_args = {"stream_interval": stream_interval, "static_batching": bool(static_batching)}
        # not a daemon: with tensor_parallel_size > 1 the engine process starts workers of its own
        self._proc = ctx.Process(target=run_engine_core, args=(requests_r, outputs_w, model, dict(llm_args or {}),
                                                               core_args), name="minillm-engine-core")
        self._proc.start()
        requests_r.close()  # the engine process's ends: when it exits, reads here see EOF
        outputs_w.close()
        self._send_lock = threading.Lock()
        try:
            hello = self._outputs.recv()
        except EOFError:
            self._proc.join()
            raise RuntimeError(f"the engine process exited with status {self._proc.exitcode} before it was "
                               f"ready") from None
        except BaseException:  # Ctrl-C while the model loads: the engine process ignores SIGINT, so end it here
            self._proc.kill()
            self._proc.join()
            raise
        if hello[0] == "failed":
            self._proc.join()
            raise (ValueError if hello[1] else RuntimeError)(hello[2])
        _, checks, default_params, num_blocks, tokenizer, chat_max_tokens = hello
        super().__init__(tokenizer, checks, default_params, num_blocks, max_waiting, chat_max_tokens)
        self._calls: dict[str, tuple] = {}  # call id -> (event loop, future) of a call awaiting its answer
        self._thread = threading.Thread(target=self._read, name="minillm-engine-reader", daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)  # before multiprocessing joins its children at exit

    def _send(self, message: tuple) -> None:
        with self._send_lock:  # the event loop (add, abort) and shutdown may send at once
            try:
                self._requests.send(message)
            except OSError:  # the engine process has gone: the reader fails every request
                pass

    def _queue(self, req: _Request) -> None:
        self._send(("add", req.request_id, req.prompt, req.prompt_ids, req.params, req.arrival_time))

    def _queue_abort(self, req: _Request) -> None:
        self._send(("abort", req.request_id))

    async def reset_prefix_cache(self) -> bool:
        loop = asyncio.get_running_loop()
        call_id, answer = f"call-{uuid.uuid4().hex}", loop.create_future()
        with self._cond:
            if self._stopping or self._dead:
                raise EngineError(f"the engine is not running ({self._dead or 'shutting down'})")
            self._calls[call_id] = (loop, answer)
        self._send(("reset_prefix_cache", call_id))
        return await answer

    def shutdown(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the engine process (requests in flight fail with EngineError; it frees the GPU as it
        exits) and wait for it; kill it if it has not exited within timeout. Idempotent."""
        with self._cond:
            self._stopping = True
        self._send(("stop",))
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._thread.join(timeout)
        self._requests.close()

    # ---- the reader thread --------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                try:
                    events, metrics = self._outputs.recv()
                except (EOFError, OSError):
                    break
                self.metrics.load(metrics)
                self._apply(events)
                self._flush()
        finally:
            with self._cond:
                self._dead = self._dead or "the engine process has stopped"
                left = list(self._book.requests.values())
                for req in left:
                    finish(self._book, req)
                calls, self._calls = list(self._calls.values()), {}
            error = f"the engine stopped before this request finished ({self._dead})"
            self._outbox.extend(pair for req in left for pair in ((req, EngineError(error)), (req, _END)))
            self._flush()
            for loop, answer in calls:  # nobody may wait forever
                _settle(loop, answer, EngineError(f"the engine stopped before it answered ({self._dead})"))

    def _apply(self, events: list) -> None:
        """One step's events: the book's start and finish, and each request's items to its event loop."""
        with self._cond:
            for request_id, event in events:
                req = self._book.requests.get(request_id)
                if req is None:  # the answer to a call (END is a request's last event)
                    call = self._calls.pop(request_id, None)
                    if call is not None:
                        _settle(*call, event[1])
                    continue
                if event == STARTED:
                    start(self._book, req)
                elif event == END:
                    finish(self._book, req)
                    self._outbox.append((req, _END))
                else:
                    self._outbox.append((req, _unpack(req, event)))
