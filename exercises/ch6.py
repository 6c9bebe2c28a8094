"""Chapter 6 exercises: YOUR file. Fill in the bodies below, then grade one exercise with
    make grade EX=6.1            (or: pytest tests/exercises -m ex6_1)
(Generated from minillm/ by `make exercises`, which refuses to overwrite a file holding your code.)

Exercise 6.1: sse_event, sse_data  (notebooks/06_serving.ipynb, section '1. A request's life: server-sent events')
Exercise 6.2: detokenize_incrementally  (notebooks/06_serving.ipynb, section '2. Streaming text: incremental detokenization')
Exercise 6.3: admit, start, abort_request, finish  (notebooks/06_serving.ipynb, section '3. The async engine loop: admission, backpressure, abort')
Exercise 6.4: ttfts, e2e_latencies, tpots, itls, latency_percentiles  (notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL')
"""
from __future__ import annotations

import math
import numpy as np
from minillm.bench_serve import PERCENTILES
from minillm.bench_serve import RequestTrace
from minillm.serving.async_engine import Admission
from minillm.serving.async_engine import QueueFullError
from minillm.serving.async_engine import _Request
from minillm.tokenizer import Tokenizer


# ---- Exercise 6.1 (notebooks/06_serving.ipynb, section '1. A request's life: server-sent events'), from minillm.serving.sse ----
def sse_event(data: str) -> str:
    r"""One server-sent event carrying `data`, as the text to write to the stream.

    Every line of `data` (split on "\n") becomes its own `data: ` line, then a blank line ends the
    event:  sse_event('{"a": 1}') == 'data: {"a": 1}\n\n';  sse_event("a\nb") == "data: a\ndata: b\n\n".
    A reader joins the data lines of one event with "\n", so it gets `data` back exactly when `data`
    holds no carriage return: in an event stream "\r" ends a line too ("\r\n" is one line end), so the
    text after a "\r" starts a line of its own, read as a field of its own: sse_event("a\rb") reads
    back as "a" (the line "b" is a field named "b", ignored). The server's JSON payloads never hold
    one (JSON writes a carriage return escaped, as a backslash and an "r").

    Hints: a line ends with "\n"; an event ends with an empty line, so the event ends in "\n\n".
    """
    raise NotImplementedError("Exercise 6.1: implement sse_event in exercises/ch6.py (see notebooks/06_serving.ipynb, section '1. A request's life: server-sent events')")


def sse_data(line: str, lines: list[str]) -> str | None:
    r"""Read one line of an event stream (its terminator, "\n", "\r\n" or "\r", already removed).

    lines: the data lines of the event being read so far (the caller keeps it between calls,
    starting from []). A `data` field appends its value to `lines`; a blank line ends the event:
    return its data (the lines joined with "\n") and clear `lines`, or None if the event had no
    data line. Comments (lines starting with ':') and other fields (event, id, retry, unknown
    names) are ignored. A field is `name:value`; after the colon one space, if present, is
    dropped (only one: the rest of the value is kept as it is); a line with no colon is a field
    name with an empty value. Names are case-sensitive and taken as written: only exactly `data`
    is a data field ("Data", " data" and "data " are other fields). Otherwise return None.

        lines = []
        sse_data("data: hello", lines) -> None      (lines == ["hello"])
        sse_data("data:  two", lines)  -> None      (lines == ["hello", " two"])
        sse_data("", lines)            -> "hello\n two"   (lines == [])

    Hints: str.partition(":"); a blank line after an event with no data dispatches nothing.
    """
    raise NotImplementedError("Exercise 6.1: implement sse_data in exercises/ch6.py (see notebooks/06_serving.ipynb, section '1. A request's life: server-sent events')")


# ---- Exercise 6.2 (notebooks/06_serving.ipynb, section '2. Streaming text: incremental detokenization'), from minillm.tokenizer ----
def detokenize_incrementally(tokenizer: Tokenizer, ids: list[int], prefix_offset: int, read_offset: int,
                             skip_special_tokens: bool = True) -> tuple[str, int, int]:
    """The text that the newest tokens complete (vLLM's detokenize_incrementally).

    ids: every token of the completion so far (the newest at the end); text before read_offset has
    been emitted; prefix_offset <= read_offset starts the decode window. Decode only the window
    ids[prefix_offset:] (with tokenizer.decode(ids, skip_special_tokens)), so that a step costs the
    window, not the whole text; the window's first read_offset - prefix_offset tokens are context
    whose text was emitted already.
    -> (new text, new prefix_offset, new read_offset):
      - while the window's text ends in U+FFFD ("\ufffd", what decoding gives for a character whose
        UTF-8 bytes are split across tokens and not all there yet), or has not grown past the text
        of ids[prefix_offset:read_offset]: nothing new, ("", prefix_offset, read_offset) unchanged;
      - else the window's text past that prefix's text, and the window slides: the new
        prefix_offset is the old read_offset, the new read_offset is len(ids) (all of it emitted).

    Hints: decode the prefix ids[prefix_offset:read_offset] and the whole window; compare lengths.
    Byte-level BPE (Qwen, Llama 3, GPT-2) splits an emoji into up to 4 tokens.
    """
    raise NotImplementedError("Exercise 6.2: implement detokenize_incrementally in exercises/ch6.py (see notebooks/06_serving.ipynb, section '2. Streaming text: incremental detokenization')")


# ---- Exercise 6.3 (notebooks/06_serving.ipynb, section '3. The async engine loop: admission, backpressure, abort'), from minillm.serving.async_engine ----
def admit(book: Admission, req: _Request) -> None:
    """Accept a new request (the caller's add_request), or refuse it.

    Raise QueueFullError when book.max_waiting requests already wait (the server answers 503: try
    later; the error's message is the 503's), ValueError when book.requests already holds a request
    with req.request_id. Else register
    it in book.requests under its id and count it waiting (req.waiting is True for a new request).

    Hints: check the queue first, then the id; a request whose id was used by one that has
    finished is a new request (a finished request is no longer in book.requests).
    """
    raise NotImplementedError("Exercise 6.3: implement admit in exercises/ch6.py (see notebooks/06_serving.ipynb, section '3. The async engine loop: admission, backpressure, abort')")


def start(book: Admission, req: _Request) -> None:
    """The engine ran req's first step: it waits no more (req.waiting becomes False and it stops
    counting in book.num_waiting); it is running. Idempotent; a no-op for a request that has ended
    (finish() ran for it: it is no longer in book.requests, and finish cleared its req.waiting)."""
    raise NotImplementedError("Exercise 6.3: implement start in exercises/ch6.py (see notebooks/06_serving.ipynb, section '3. The async engine loop: admission, backpressure, abort')")


def abort_request(book: Admission, request_id: str) -> _Request | None:
    """A caller's abort (a client went away). -> the live request with this id, now marked
    req.aborted = True, for the engine thread to end; None when there is nothing to abort: no such
    request, it has finished (it is no longer in book.requests), or it was aborted already (so two
    aborts end it once). Counts do not change here: the request is still in until finish()."""
    raise NotImplementedError("Exercise 6.3: implement abort_request in exercises/ch6.py (see notebooks/06_serving.ipynb, section '3. The async engine loop: admission, backpressure, abort')")


def finish(book: Admission, req: _Request) -> bool:
    """The request has ended (finished, aborted or failed): unregister it; if it was still waiting
    (aborted before its first step) it stops counting in book.num_waiting and req.waiting becomes
    False. -> True, or False when req had already ended (then nothing changes: a later request that
    reuses its id is not touched)."""
    raise NotImplementedError("Exercise 6.3: implement finish in exercises/ch6.py (see notebooks/06_serving.ipynb, section '3. The async engine loop: admission, backpressure, abort')")


# ---- Exercise 6.4 (notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL'), from minillm.bench_serve ----
def ttfts(traces: list[RequestTrace]) -> np.ndarray:
    """TTFT of every completed request (t.ok: no error, at least one chunk), seconds: shape (completed,)."""
    raise NotImplementedError("Exercise 6.4: implement ttfts in exercises/ch6.py (see notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL')")


def e2e_latencies(traces: list[RequestTrace]) -> np.ndarray:
    """End-to-end latency (send to last chunk) of every completed request, seconds: shape (completed,)."""
    raise NotImplementedError("Exercise 6.4: implement e2e_latencies in exercises/ch6.py (see notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL')")


def tpots(traces: list[RequestTrace]) -> np.ndarray:
    """TPOT of every completed request with more than one output token, seconds per token:
    (latency - ttft) / (output_tokens - 1), i.e. the time after the first token spread over the tokens
    that followed it. Shape (completed requests with output_tokens > 1,)."""
    raise NotImplementedError("Exercise 6.4: implement tpots in exercises/ch6.py (see notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL')")


def itls(traces: list[RequestTrace]) -> np.ndarray:
    """Every gap between consecutive chunks of a completed request, all requests pooled, seconds:
    shape (sum over completed requests of (chunks - 1),). A chunk carrying several tokens counts once."""
    raise NotImplementedError("Exercise 6.4: implement itls in exercises/ch6.py (see notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL')")


def latency_percentiles(values_s, percentiles=PERCENTILES) -> dict[str, float]:
    """Summary of latencies given in seconds, in milliseconds: {"mean": ..., "median": ..., "p90": ...,
    "p99": ...}: "mean", then one key per percentile asked for and nothing else (f"p{p:g}": "p90", "p99.9"; 50 is
    named "median", so there is no "median" without it), by numpy's default linear interpolation. Values are
    shape (n,); n = 0 gives NaN everywhere (nothing was measured)."""
    raise NotImplementedError("Exercise 6.4: implement latency_percentiles in exercises/ch6.py (see notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL')")
