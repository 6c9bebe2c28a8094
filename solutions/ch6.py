"""Chapter 6 solutions. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand.

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
    # a newline inside one data line would end that line early: the rest would read as a field of its own
    return "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


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
    if not line:
        if not lines:  # a blank line after comments or other fields only: no event
            return None
        data = "\n".join(lines)
        lines.clear()
        return data
    if line.startswith(":"):  # a comment (servers send ": ping" to keep a connection open)
        return None
    name, _, value = line.partition(":")
    if value.startswith(" "):  # exactly one: the spaces after it belong to the value
        value = value[1:]
    if name == "data":
        lines.append(value)
    return None


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
    prefix = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens)
    window = tokenizer.decode(ids[prefix_offset:], skip_special_tokens)
    # a trailing U+FFFD is half a character: its other bytes are still to come, so nothing is emitted
    # (the window's text is not comparable with the prefix's while it ends in one)
    if len(window) > len(prefix) and not window.endswith("\ufffd"):
        return window[len(prefix):], read_offset, len(ids)
    return "", prefix_offset, read_offset


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


# ---- Exercise 6.4 (notebooks/06_serving.ipynb, section '4. Latency under load: TTFT, TPOT, ITL'), from minillm.bench_serve ----
def ttfts(traces: list[RequestTrace]) -> np.ndarray:
    """TTFT of every completed request (t.ok: no error, at least one chunk), seconds: shape (completed,)."""
    return np.array([t.ttft for t in traces if t.ok], dtype=np.float64)


def e2e_latencies(traces: list[RequestTrace]) -> np.ndarray:
    """End-to-end latency (send to last chunk) of every completed request, seconds: shape (completed,)."""
    return np.array([t.latency for t in traces if t.ok], dtype=np.float64)


def tpots(traces: list[RequestTrace]) -> np.ndarray:
    """TPOT of every completed request with more than one output token, seconds per token:
    (latency - ttft) / (output_tokens - 1), i.e. the time after the first token spread over the tokens
    that followed it. Shape (completed requests with output_tokens > 1,)."""
    return np.array([(t.latency - t.ttft) / (t.output_tokens - 1) for t in traces if t.ok and t.output_tokens > 1],
                    dtype=np.float64)


def itls(traces: list[RequestTrace]) -> np.ndarray:
    """Every gap between consecutive chunks of a completed request, all requests pooled, seconds:
    shape (sum over completed requests of (chunks - 1),). A chunk carrying several tokens counts once."""
    gaps = [np.diff(np.asarray(t.chunk_times, dtype=np.float64)) for t in traces if t.ok]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def latency_percentiles(values_s, percentiles=PERCENTILES) -> dict[str, float]:
    """Summary of latencies given in seconds, in milliseconds: {"mean": ..., "median": ..., "p90": ...,
    "p99": ...}: "mean", then one key per percentile asked for and nothing else (f"p{p:g}": "p90", "p99.9"; 50 is
    named "median", so there is no "median" without it), by numpy's default linear interpolation. Values are
    shape (n,); n = 0 gives NaN everywhere (nothing was measured)."""
    v = np.asarray(values_s, dtype=np.float64) * 1e3
    out = {"mean": float(v.mean()) if v.size else math.nan}
    for p in percentiles:
        out["median" if p == 50 else f"p{p:g}"] = float(np.percentile(v, p)) if v.size else math.nan
    return out
