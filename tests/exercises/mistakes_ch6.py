"""Chapter 6's known wrong versions (see mistakes.py): serving.

Each function below is an exercise function written the way students get it wrong: an event that
never ends or a newline that breaks it, a parser that loses spaces, events or the field name, or that
ends an event at a line of spaces (6.1); a detokenizer that emits half a character, loses or repeats
text, or decodes everything every step (6.2); admission bookkeeping that leaks a waiting slot or counts
one twice (6.3); latency figures with the wrong divisor, gap, percentile, unit or dtype (6.4).
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from minillm.bench_serve import PERCENTILES
from minillm.bench_serve import e2e_latencies as right_e2e_latencies
from minillm.bench_serve import itls as right_itls
from minillm.bench_serve import latency_percentiles as right_latency_percentiles
from minillm.bench_serve import tpots as right_tpots
from minillm.bench_serve import ttfts as right_ttfts
from minillm.serving.async_engine import QueueFullError
from mistakes import Mistake


# ---- 6.1 server-sent events ---------------------------------------------------------------------------
def sse_event_no_blank_line(data):
    return "".join(f"data: {line}\n" for line in data.split("\n"))  # the bug: no empty line ends the event


def sse_event_raw_newlines(data):
    return f"data: {data}\n\n"  # the bug: a newline in data ends the data line early


def sse_event_splitlines(data):
    # the bug: str.splitlines() gives no line at all for '', drops the empty line after a final '\n', and also
    # splits at \r, \x0b, \x0c, \x1c-\x1e, \x85, \u2028 and \u2029
    return "".join(f"data: {line}\n" for line in data.splitlines()) + "\n"


def _read(line, lines, value_of):
    """sse_data with the value of a data line taken by value_of(line) (None: not a data line)."""
    if not line:
        if not lines:
            return None
        data = "\n".join(lines)
        lines.clear()
        return data
    value = value_of(line)
    if value is not None:
        lines.append(value)
    return None


def _data_value(line):
    if line.startswith(":"):
        return None
    name, _, value = line.partition(":")
    return (value[1:] if value.startswith(" ") else value) if name == "data" else None


def sse_data_strips_whitespace(line, lines):
    # the bug: every space around the value goes, not only the one after the colon
    return _read(line, lines, lambda s: None if _data_value(s) is None else s.partition(":")[2].strip())


def sse_data_fixed_prefix(line, lines):
    # the bug: the value is taken after a fixed "data: ", so "data:x" loses its first character
    return _read(line, lines, lambda s: s[len("data: "):] if _data_value(s) is not None else None)


def sse_data_every_colon_line(line, lines):
    # the bug: the field name is not checked: comments, event:, id: and retry: lines are read as data
    def value(s):
        if ":" not in s:
            return _data_value(s)
        v = s.partition(":")[2]
        return v[1:] if v.startswith(" ") else v
    return _read(line, lines, value)


def sse_data_line_per_event(line, lines):
    return _data_value(line) if line else None  # the bug: each data line is returned as an event of its own


def sse_data_dispatches_empty_event(line, lines):
    if not line:
        data = "\n".join(lines)  # the bug: an event without any data line (a keep-alive comment) gives ''
        lines.clear()
        return data
    return _read(line, lines, _data_value)


def sse_data_empty_data_is_none(line, lines):
    data = _read(line, lines, _data_value)
    return data or None  # the bug: an event whose data is '' ('data:' alone) dispatches nothing


# ---- 6.2 incremental detokenization -------------------------------------------------------------------
def _detok(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens, *, hold_back=True, drop_prefix=True,
           read_while_holding=False, slide=True, emit_nothing=False, slide_to_last=False):
    """detokenize_incrementally with one rule switched off."""
    prefix = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens)
    window = tokenizer.decode(ids[prefix_offset:], skip_special_tokens)
    longer = len(window) >= len(prefix) if emit_nothing else len(window) > len(prefix)
    if longer and (not hold_back or not window.endswith("\ufffd")):
        # (slide_to_last: the next window starts at the newest token, not at the tokens this call emitted)
        new_prefix = len(ids) - 1 if slide_to_last else (read_offset if slide else 0)
        return (window[len(prefix):] if drop_prefix else window), new_prefix, len(ids)
    return "", prefix_offset, (len(ids) if read_while_holding else read_offset)


def detokenize_no_hold_back(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    return _detok(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens, hold_back=False)


def detokenize_slides_to_the_last_token(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    return _detok(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens, slide_to_last=True)


def detokenize_token_alone(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    # the bug: the new tokens are decoded without the tokens before them
    return tokenizer.decode(ids[read_offset:], skip_special_tokens), read_offset, len(ids)


def detokenize_new_tokens_alone(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    # the bug: only the tokens not yet emitted are decoded (held back while split): right for byte-level BPE,
    # wrong where a token's text depends on the token before it (SentencePiece's word-start space)
    text = tokenizer.decode(ids[read_offset:], skip_special_tokens)
    if not text or text.endswith("\ufffd"):
        return "", prefix_offset, read_offset
    return text, read_offset, len(ids)


def detokenize_reads_while_holding(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    return _detok(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens, read_while_holding=True)


def detokenize_keeps_prefix_text(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    return _detok(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens, drop_prefix=False)


def detokenize_window_never_slides(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    return _detok(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens, slide=False)


def detokenize_emits_nothing(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    # the bug: >=, so tokens that add no text (a skipped special token) count as emitted and the window moves on
    return _detok(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens, emit_nothing=True)


def detokenize_prefix_jumps_to_end(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    prefix = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens)
    window = tokenizer.decode(ids[prefix_offset:], skip_special_tokens)
    if len(window) > len(prefix) and not window.endswith("\ufffd"):
        return window[len(prefix):], len(ids), len(ids)  # the bug: the next window starts after every token
    return "", prefix_offset, read_offset


# ---- 6.3 admission and abort --------------------------------------------------------------------------
def admit_one_too_many(book, req):
    if book.num_waiting > book.max_waiting:  # the bug: > lets a request in when max_waiting already wait
        raise QueueFullError(f"{book.num_waiting} requests are waiting (max_waiting={book.max_waiting})")
    if req.request_id in book.requests:
        raise ValueError(f"request id {req.request_id!r} is already in use")
    book.num_waiting += 1
    book.requests[req.request_id] = req


def admit_id_before_queue(book, req):
    if req.request_id in book.requests:  # the bug: the id is checked first, so a full queue can answer ValueError
        raise ValueError(f"request id {req.request_id!r} is already in use")
    if book.num_waiting >= book.max_waiting:
        raise QueueFullError(f"{book.num_waiting} requests are waiting (max_waiting={book.max_waiting})")
    book.num_waiting += 1
    book.requests[req.request_id] = req


def finish_keeps_the_waiting_slot(book, req):
    if book.requests.get(req.request_id) is not req:
        return False
    del book.requests[req.request_id]  # the bug: a request that ends while waiting still counts as waiting
    return True


def finish_counts_down_every_request(book, req):
    if book.requests.get(req.request_id) is not req:
        return False
    del book.requests[req.request_id]
    req.waiting = False
    book.num_waiting -= 1  # the bug: a running request was counted down already, by start()
    return True


def finish_by_id(book, req):
    if req.request_id not in book.requests:  # the bug: the id is looked up, not this request
        return False
    del book.requests[req.request_id]  # (a later request with the same id is the one removed)
    if req.waiting:
        req.waiting = False
        book.num_waiting -= 1
    return True


def abort_request_twice(book, request_id):
    req = book.requests.get(request_id)
    if req is None:  # the bug: a request aborted already is returned again
        return None
    req.aborted = True
    return req


# ---- 6.4 latency figures ------------------------------------------------------------------------------
def tpots_over_all_tokens(traces):
    # the bug: divided by every output token, the first one (which TTFT covers) included
    return np.array([(t.latency - t.ttft) / t.output_tokens for t in traces if t.ok and t.output_tokens > 1],
                    dtype=np.float64)


def tpots_of_single_token_requests(traces):
    # the bug: requests of one output token are not left out: (latency - ttft) / 0
    return np.array([(t.latency - t.ttft) / (t.output_tokens - 1) for t in traces if t.ok], dtype=np.float64)


def itls_from_the_send(traces):
    # the bug: the first "gap" is the TTFT (send to first chunk)
    gaps = [np.diff(np.asarray([t.start] + t.chunk_times, dtype=np.float64)) for t in traces if t.ok]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def latency_percentiles_nearest_rank(values_s, percentiles=PERCENTILES):
    v = np.sort(np.asarray(values_s, dtype=np.float64) * 1e3)
    out = {"mean": float(v.mean()) if v.size else math.nan}
    for p in percentiles:  # the bug: the nearest-rank value, no interpolation between the two around it
        out["median" if p == 50 else f"p{p:g}"] = float(v[max(0, math.ceil(p / 100 * v.size) - 1)]) if v.size \
            else math.nan
    return out


def latency_percentiles_midpoint(values_s, percentiles=PERCENTILES):
    v = np.asarray(values_s, dtype=np.float64) * 1e3
    out = {"mean": float(v.mean()) if v.size else math.nan}
    for p in percentiles:  # the bug: the midpoint of the two values around the percentile, not linear
        out["median" if p == 50 else f"p{p:g}"] = float(np.percentile(v, p, method="midpoint")) if v.size \
            else math.nan
    return out


def latency_percentiles_in_seconds(values_s, percentiles=PERCENTILES):
    return {k: v / 1e3 for k, v in right_latency_percentiles(values_s, percentiles).items()}  # the bug: no * 1000


def ttfts_as_list(traces):
    return [t.ttft for t in traces if t.ok]  # the bug: a list, not a numpy array


def e2e_latencies_as_list(traces):
    return [t.latency for t in traces if t.ok]  # the bug: a list, not a numpy array


def _with_failed(traces):
    """Every trace that got a chunk, failed or not, as if completed."""
    return [type(t)(**{**vars(t), "error": ""}) if t.chunk_times else t for t in traces]


def ttfts_with_failed(traces):
    return np.array([t.ttft for t in _with_failed(traces) if t.ok], dtype=np.float64)


def e2e_latencies_with_failed(traces):
    return np.array([t.latency for t in _with_failed(traces) if t.ok], dtype=np.float64)


def tpots_with_failed(traces):
    return np.array([(t.latency - t.ttft) / (t.output_tokens - 1) for t in _with_failed(traces)
                     if t.ok and t.output_tokens > 1], dtype=np.float64)


def itls_with_failed(traces):
    return right_itls(_with_failed(traces))


# ---- audit 7: more wrong versions ----------------------------------------------------------------------
# 6.1
def sse_event_no_space(data):
    return "".join(f"data:{line}\n" for line in data.split("\n")) + "\n"  # the bug: no space after the colon


def sse_event_strips(data):
    return "".join(f"data: {line}\n" for line in data.strip().split("\n")) + "\n"  # the bug: data.strip()


def sse_event_rstrips_newlines(data):
    # the bug: trailing newlines are stripped first (as if they were the line's terminator)
    return "".join(f"data: {line}\n" for line in data.rstrip("\n").split("\n")) + "\n"


def sse_event_crlf(data):
    # the bug (valid SSE, not this server's framing): every line ends in \r\n, the event in \r\n\r\n
    return "".join(f"data: {line}\r\n" for line in data.split("\n")) + "\r\n"


def _read7(line, lines, value_of, *, join="\n", clear=True):
    """sse_data with the value of a data line taken by value_of(line) (None: not a data line)."""
    if not line:
        if not lines:
            return None
        data = join.join(lines)
        if clear:
            lines.clear()
        else:
            lines = []  # the bug (clear=False): a new local list; the caller's keeps the event's lines  # noqa: F841
        return data
    value = value_of(line)
    if value is not None:
        lines.append(value)
    return None


def _one_space_dropped(value):
    return value[1:] if value.startswith(" ") else value


def sse_data_splits_at_every_colon(line, lines):
    def value(s):
        parts = s.split(":")  # the bug: the value is cut at its own colons too
        if s.startswith(":") or parts[0] != "data":
            return None
        return _one_space_dropped(parts[1] if len(parts) > 1 else "")
    return _read7(line, lines, value)


def sse_data_lstrips_spaces(line, lines):
    # the bug: every leading space is dropped, not just one
    return _read7(line, lines, lambda s: None if _data_value(s) is None else s.partition(":")[2].lstrip(" "))


def sse_data_bare_data_ignored(line, lines):
    # the bug: only lines starting with "data:" are data, so a bare "data" line (an empty value) is lost
    return _read7(line, lines, lambda s: _data_value(s) if s.startswith("data:") else None)


def sse_data_name_prefix(line, lines):
    # the bug: any field whose name starts with "data" is read as data ("dataset: ...")
    return _read7(line, lines, lambda s: _one_space_dropped(s.partition(":")[2]) if s.startswith("data") else None)


def sse_data_any_case(line, lines):
    # the bug: the field name compared without its case ("Data: x" read as data)
    return _read7(line, lines, lambda s: None if s.startswith(":") or s.partition(":")[0].lower() != "data"
                  else _one_space_dropped(s.partition(":")[2]))


def sse_data_name_stripped(line, lines):
    # the bug: the field name stripped of spaces and compared without its case (" data: x", "Data : x" read as data)
    return _read7(line, lines, lambda s: None if s.startswith(":") or s.partition(":")[0].strip().lower() != "data"
                  else _one_space_dropped(s.partition(":")[2]))


def sse_data_never_clears(line, lines):
    return _read7(line, lines, _data_value, clear=False)


def sse_data_joins_without_newline(line, lines):
    return _read7(line, lines, _data_value, join="")  # the bug: "".join


def sse_data_whitespace_line_ends_event(line, lines):
    # the bug: a line of whitespace only (" ") is taken for the empty line that ends the event
    return _read7("" if not line.strip() else line, lines, _data_value)


# 6.2
def detokenize_read_offset_plus_one(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    prefix = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens)
    window = tokenizer.decode(ids[prefix_offset:], skip_special_tokens)
    if len(window) > len(prefix) and not window.endswith("\ufffd"):
        return window[len(prefix):], read_offset, read_offset + 1  # the bug: one token read, however many came
    return "", prefix_offset, read_offset


def detokenize_strips_fffd(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    prefix = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens)
    window = tokenizer.decode(ids[prefix_offset:], skip_special_tokens).rstrip("\ufffd")  # the bug: cut off, emitted
    if len(window) > len(prefix):
        return window[len(prefix):], read_offset, len(ids)
    return "", prefix_offset, read_offset


def detokenize_ignores_skip_special_tokens(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    prefix = tokenizer.decode(ids[prefix_offset:read_offset])  # the bug: decode's default, whatever the caller asked
    window = tokenizer.decode(ids[prefix_offset:])
    if len(window) > len(prefix) and not window.endswith("\ufffd"):
        return window[len(prefix):], read_offset, len(ids)
    return "", prefix_offset, read_offset


def detokenize_fffd_anywhere(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    prefix = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens)
    window = tokenizer.decode(ids[prefix_offset:], skip_special_tokens)
    if len(window) > len(prefix) and "\ufffd" not in window:  # the bug: anywhere, not at the end
        return window[len(prefix):], read_offset, len(ids)
    return "", prefix_offset, read_offset


def detokenize_decodes_from_start(tokenizer, ids, prefix_offset, read_offset, skip_special_tokens=True):
    prefix = tokenizer.decode(ids[:read_offset], skip_special_tokens)  # the bug: from ids[0], not prefix_offset
    window = tokenizer.decode(ids, skip_special_tokens)
    if len(window) > len(prefix) and not window.endswith("\ufffd"):
        return window[len(prefix):], read_offset, len(ids)  # (the offsets are right, but never used)
    return "", prefix_offset, read_offset


# 6.3
def start_not_idempotent(book, req):
    req.waiting = False
    book.num_waiting -= 1  # the bug: counted down again when told twice, or after finish()


def start_keeps_waiting_flag(book, req):
    if req.waiting:
        book.num_waiting -= 1  # the bug: req.waiting stays True, so finish() counts it down a second time


def abort_request_unregisters(book, request_id):
    req = book.requests.get(request_id)
    if req is None or req.aborted:
        return None
    req.aborted = True
    del book.requests[request_id]  # the bug: finish() unregisters, and finds nothing then
    return req


def abort_request_clears_waiting(book, request_id):
    req = book.requests.get(request_id)
    if req is None or req.aborted:
        return None
    req.aborted = True
    req.waiting = False  # the bug: finish() then never counts this waiting request down in num_waiting
    return req


def abort_request_counts_down(book, request_id):
    req = book.requests.get(request_id)
    if req is None or req.aborted:
        return None
    req.aborted = True
    if req.waiting:  # the bug: counts change in finish(), not here
        req.waiting = False
        book.num_waiting -= 1
    return req


def admit_counts_running(book, req):
    if len(book.requests) >= book.max_waiting:  # the bug: every live request is counted, running ones too
        raise QueueFullError(f"{len(book.requests)} requests are in (max_waiting={book.max_waiting})")
    if req.request_id in book.requests:
        raise ValueError(f"request id {req.request_id!r} is already in use")
    book.num_waiting += 1
    book.requests[req.request_id] = req


def admit_registers_before_the_queue_check(book, req):
    if req.request_id in book.requests:
        raise ValueError(f"request id {req.request_id!r} is already in use")
    book.requests[req.request_id] = req  # the bug: registered, then refused: the id stays taken
    if book.num_waiting >= book.max_waiting:
        raise QueueFullError(f"{book.num_waiting} requests are waiting (max_waiting={book.max_waiting})")
    book.num_waiting += 1


def admit_never_counts(book, req):
    if book.num_waiting >= book.max_waiting:
        raise QueueFullError(f"{book.num_waiting} requests are waiting (max_waiting={book.max_waiting})")
    if req.request_id in book.requests:
        raise ValueError(f"request id {req.request_id!r} is already in use")
    book.requests[req.request_id] = req  # the bug: registered, but num_waiting not counted up


def finish_leaves_waiting_flag(book, req):
    if book.requests.get(req.request_id) is not req:
        return False
    del book.requests[req.request_id]
    if req.waiting:
        book.num_waiting -= 1  # the bug: req.waiting stays True
    return True


# 6.4
def tpots_filtered_by_chunks(traces):
    # the bug: the requests kept are those with more than one chunk, not more than one token
    return np.array([(t.latency - t.ttft) / (t.output_tokens - 1) for t in traces
                     if t.ok and len(t.chunk_times) > 1], dtype=np.float64)


def tpots_per_chunk(traces):
    # the bug: the time after the first chunk over the chunks that followed it, not over the tokens
    return np.array([(t.latency - t.ttft) / (len(t.chunk_times) - 1) for t in traces
                     if t.ok and len(t.chunk_times) > 1], dtype=np.float64)


def itls_mean_per_request(traces):
    # the bug: one mean gap per request, not every gap
    return np.array([np.diff(t.chunk_times).mean() for t in traces if t.ok and len(t.chunk_times) > 1],
                    dtype=np.float64)


def e2e_latencies_to_the_close(traces):
    # the bug: to `end` (the response closed), not to the last chunk
    return np.array([t.end - t.start for t in traces if t.ok], dtype=np.float64)


def ttfts_from_clock_zero(traces):
    return np.array([t.chunk_times[0] for t in traces if t.ok], dtype=np.float64)  # the bug: start not subtracted


def _not_failed(traces):
    return [t for t in traces if not t.error]  # the bug: no error is taken for completed, with no chunk too


def ttfts_without_chunks(traces):
    return np.array([t.ttft for t in _not_failed(traces)], dtype=np.float64)


def e2e_latencies_without_chunks(traces):
    return np.array([t.latency for t in _not_failed(traces)], dtype=np.float64)


def tpots_without_chunks(traces):
    return np.array([(t.latency - t.ttft) / (t.output_tokens - 1) for t in _not_failed(traces) if t.output_tokens > 1],
                    dtype=np.float64)


def itls_without_chunks(traces):
    gaps = [np.diff(np.asarray(t.chunk_times, dtype=np.float64)) for t in _not_failed(traces)]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def _percentiles7(values_s, percentiles, *, fractions=False, empty_nan=True, p50_named_median=True,
                  int_keys=False, repr_keys=False, median_always=False):
    v = np.asarray(values_s, dtype=np.float64) * 1e3
    out = {"mean": float(v.mean()) if v.size else math.nan}
    if median_always:  # the bug: a median whether or not 50 is asked for
        out["median"] = float(np.median(v)) if v.size else math.nan
    for p in percentiles:
        key = ("median" if p == 50 and p50_named_median else f"p{int(p)}" if int_keys else f"p{p}" if repr_keys
               else f"p{p:g}")
        if not v.size and empty_nan:
            out[key] = math.nan
        else:
            out[key] = float(np.percentile(v, p / 100 if fractions else p))
    return out


def _percentiles_s8(values_s, percentiles, *, mean_scale=1e3, percentile_scale=1e3, mean=np.mean,
                    percentile=lambda v, p: float(np.percentile(v, p))):
    v = np.asarray(values_s, dtype=np.float64)
    out = {"mean": float(mean(v)) * mean_scale if v.size else math.nan}
    for p in percentiles:
        out["median" if p == 50 else f"p{p:g}"] = percentile(v, p) * percentile_scale if v.size else math.nan
    return out


def latency_percentiles_mean_in_seconds(values_s, percentiles=PERCENTILES):
    return _percentiles_s8(values_s, percentiles, mean_scale=1)  # the bug: the mean not scaled to ms


def latency_percentiles_percentiles_in_seconds(values_s, percentiles=PERCENTILES):
    return _percentiles_s8(values_s, percentiles, percentile_scale=1)  # the bug: the percentiles not scaled to ms


def latency_percentiles_mean_is_median(values_s, percentiles=PERCENTILES):
    return _percentiles_s8(values_s, percentiles, mean=np.median)  # the bug: 'mean' is the median


def latency_percentiles_lower(values_s, percentiles=PERCENTILES):
    # the bug: the value at or below the rank (method='lower'), no interpolation
    return _percentiles_s8(values_s, percentiles, percentile=lambda v, p: float(np.percentile(v, p, method="lower")))


def _exclusive(v, p):
    """statistics.quantiles' default method='exclusive' at p (tenths of a percent), one value as itself."""
    return float(v[0]) if v.size == 1 else statistics.quantiles(v.tolist(), n=1000)[round(p * 10) - 1]


def latency_percentiles_exclusive(values_s, percentiles=PERCENTILES):
    return _percentiles_s8(values_s, percentiles, percentile=_exclusive)  # the bug: statistics.quantiles' default


def latency_percentiles_fractions(values_s, percentiles=PERCENTILES):
    return _percentiles7(values_s, percentiles, fractions=True)  # the bug: np.percentile(v, 0.99)


def latency_percentiles_empty_raises(values_s, percentiles=PERCENTILES):
    return _percentiles7(values_s, percentiles, empty_nan=False)  # the bug: np.percentile of no values


def latency_percentiles_p50_key(values_s, percentiles=PERCENTILES):
    return _percentiles7(values_s, percentiles, p50_named_median=False)  # the bug: "p50", not "median"


def latency_percentiles_int_keys(values_s, percentiles=PERCENTILES):
    return _percentiles7(values_s, percentiles, int_keys=True)  # the bug: f"p{int(p)}": 99.9 overwrites "p99"


def latency_percentiles_repr_keys(values_s, percentiles=PERCENTILES):
    return _percentiles7(values_s, percentiles, repr_keys=True)  # the bug: f"p{p}": 90.0 gives "p90.0"


def latency_percentiles_median_always(values_s, percentiles=PERCENTILES):
    return _percentiles7(values_s, percentiles, median_always=True)


def latency_percentiles_fixed(values_s, percentiles=PERCENTILES):
    v = np.asarray(values_s, dtype=np.float64) * 1e3  # the bug: the percentiles asked for are ignored
    if not v.size:
        return {"mean": math.nan, "median": math.nan, "p90": math.nan, "p99": math.nan}
    return {"mean": float(v.mean()), "median": float(np.median(v)), "p90": float(np.percentile(v, 90)),
            "p99": float(np.percentile(v, 99))}



def _float32(right):
    return lambda traces: right(traces).astype(np.float32)  # the bug: np.array(..., dtype=np.float32)


ttfts_float32, e2e_latencies_float32, tpots_float32, itls_float32 = (
    _float32(right_ttfts), _float32(right_e2e_latencies), _float32(right_tpots), _float32(right_itls))


MISTAKES = [
    # 6.1
    Mistake("ch6_sse_event_no_blank_line", "6.1", {"sse_event": sse_event_no_blank_line},
            "the event has no empty line after its data: a reader dispatches an event at an empty line only, so it "
            "gets nothing, or every chunk glued into one event. End the event with one more '\\n' (it ends in "
            "'\\n\\n')",
            "test_ch6.py::test_sse_event_frames_decode_with_openai"),
    Mistake("ch6_sse_event_raw_newlines", "6.1", {"sse_event": sse_event_raw_newlines},
            "data holding a newline is written as one `data: ` line: the newline ends that line, and the reader "
            "takes the rest for a field of its own (dropped). Write each line of data.split('\\n') as its own "
            "`data: ` line",
            "test_ch6.py::test_sse_event_frames_decode_with_openai"),
    Mistake("ch6_sse_event_splitlines", "6.1", {"sse_event": sse_event_splitlines},
            "data is cut with str.splitlines(), which gives no line at all for '' (so sse_event('') has no `data: ` "
            "line and the reader dispatches nothing: an empty line ends an event only after a data line), drops "
            "the empty line after a final '\\n', and also splits at \\r, \\x0b, \\x0c, \\u2028, ... Cut at "
            "'\\n' only, keeping empty lines: data.split('\\n') ('' is one empty `data: ` line)",
            "test_ch6.py::test_sse_event_frames_decode_with_openai"),
    Mistake("ch6_sse_data_strips_whitespace", "6.1", {"sse_data": sse_data_strips_whitespace},
            "the value is stripped of all whitespace: only the one space right after the colon is dropped "
            "('data:  x ' carries ' x '); the others are the data's own (a token ' the' starts with one)",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_fixed_prefix", "6.1", {"sse_data": sse_data_fixed_prefix},
            "the value is cut after a fixed 'data: ', so 'data:x' (no space, which is allowed) loses its first "
            "character. Split at the first colon, then drop one space if there is one",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_every_colon_line", "6.1", {"sse_data": sse_data_every_colon_line},
            "comment lines (': ping') and other fields (event:, id:, retry:) are read as data: only a field whose "
            "name, the text before the first colon, is exactly 'data' carries data; a line starting with ':' is "
            "a comment",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_line_per_event", "6.1", {"sse_data": sse_data_line_per_event},
            "each data line is returned as an event of its own: an event ends at the empty line only, and its "
            "data is all its data lines joined with '\\n'. Append each value to `lines`; return at the empty line",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_empty_data_is_none", "6.1", {"sse_data": sse_data_empty_data_is_none},
            "an event whose only data line is empty ('data:' or 'data: ') returns None: it is an event that "
            "carries the empty string, and returns ''. None is for a blank line after no data line at all (test "
            "whether `lines` is empty, not whether the joined data is)",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_dispatches_empty_event", "6.1", {"sse_data": sse_data_dispatches_empty_event},
            "an empty line after an event without any data line (only comments such as ': keep-alive', or "
            "event:/id:/retry: fields) returned '' : the client then reads an event whose data is empty "
            "(json.loads('') fails). Such an event dispatches nothing: return None when `lines` is empty "
            "('data:' alone is the event that carries '')",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_event_no_space", "6.1", {"sse_event": sse_event_no_space},
            "the data lines are written 'data:' + line, with no space: a reader drops ONE space after the colon if "
            "there is one, so a line that starts with a space (a token ' the') loses it. Write 'data: ' + line",
            "test_ch6.py::test_sse_event_frames_decode_with_openai"),
    Mistake("ch6_sse_event_strips", "6.1", {"sse_event": sse_event_strips},
            "data is stripped before it is written: its leading and trailing spaces and newlines are the data's "
            "own (a reader must get it back exactly). Split data itself on '\\n'",
            "test_ch6.py::test_sse_event_frames_decode_with_openai"),
    Mistake("ch6_sse_event_rstrips_newlines", "6.1", {"sse_event": sse_event_rstrips_newlines},
            "trailing newlines are stripped from data (data.rstrip('\\n')): they are the data's own, and a final "
            "'\\n' is one more empty `data: ` line. Split data itself: data.split('\\n')",
            "test_ch6.py::test_sse_event_frames_decode_with_openai"),
    Mistake("ch6_sse_event_crlf", "6.1", {"sse_event": sse_event_crlf},
            "the event's lines end in '\\r\\n': valid SSE (the spec and the openai client read it), but not this "
            "server's framing, which the docstring gives as '\\n' (sse_event('{\"a\": 1}') == 'data: {\"a\": "
            "1}\\n\\n'): minillm's chat page (minillm/serving/static/index.html) ends an event at '\\n\\n' only, so "
            "it would never show one. End each line with '\\n'",
            "test_ch6.py::test_sse_event_frames_decode_with_openai"),
    Mistake("ch6_sse_data_splits_at_every_colon", "6.1", {"sse_data": sse_data_splits_at_every_colon},
            "the line is split at every colon (line.split(':')[1]): the value ends at its own first colon "
            "('data: {\"a\": 1}' gives '{\"a\"'). Split at the first colon only: line.partition(':')",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_lstrips_spaces", "6.1", {"sse_data": sse_data_lstrips_spaces},
            "every space after the colon is dropped (lstrip): only ONE is, the rest belong to the value "
            "('data:  two' carries ' two'). Drop value[0] when it is a space",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_bare_data_ignored", "6.1", {"sse_data": sse_data_bare_data_ignored},
            "a line 'data' with no colon is ignored: a line without a colon is a field name with an empty value, "
            "so it appends '' to the event's data lines. Take the name as line.partition(':')[0] for every line",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_name_prefix", "6.1", {"sse_data": sse_data_name_prefix},
            "any field whose name starts with 'data' is read as data (line.startswith('data')): 'dataset: x' is "
            "another field. The name, the text before the first colon, must be exactly 'data'",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_any_case", "6.1", {"sse_data": sse_data_any_case},
            "the field name is compared without its case ('Data: x' read as data): field names are case-sensitive, "
            "so 'Data' is another field, ignored. The name, the text before the first colon, must be exactly 'data'",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_name_stripped", "6.1", {"sse_data": sse_data_name_stripped},
            "the field name is stripped and compared without its case (name.strip().lower()): ' data', 'data ' and "
            "'Data' are other fields, ignored. The name, the text before the first colon, must be exactly 'data'",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_never_clears", "6.1", {"sse_data": sse_data_never_clears},
            "the data lines of an event are not cleared when it is dispatched (lines = [] binds a new local list; "
            "the caller's keeps them), so every event repeats all the ones before it. Empty the caller's list in "
            "place: lines.clear()",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_joins_without_newline", "6.1", {"sse_data": sse_data_joins_without_newline},
            "an event's data lines are joined with '' : they are joined with '\\n' (the writer split the data at "
            "its newlines)",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    Mistake("ch6_sse_data_whitespace_line_ends_event", "6.1", {"sse_data": sse_data_whitespace_line_ends_event},
            "a line of whitespace only (' ', '\\t') is taken for the empty line that ends an event (`not "
            "line.strip()`): only a line with nothing in it ends one; ' ' is a field named ' ' with an empty value, "
            "ignored, and the event goes on (openai's decoder reads 'data: x\\n \\ndata: y\\n\\n' as one event, "
            "'x\\ny'). Test the line itself: `if not line`",
            "test_ch6.py::test_sse_data_reads_a_stream"),
    # 6.2
    Mistake("ch6_detok_no_hold_back", "6.2", {"detokenize_incrementally": detokenize_no_hold_back},
            "text ending in U+FFFD is emitted: those are the first bytes of a character whose last bytes are in the "
            "next token, and the client shows '\ufffd' for good. Emit nothing (and keep both offsets) while the "
            "window's text ends in '\\ufffd'",
            "test_ch6.py::test_detokenize_matches_decode_stream"),
    Mistake("ch6_detok_slides_to_the_last_token", "6.2",
            {"detokenize_incrementally": detokenize_slides_to_the_last_token},
            "the next window starts at the newest token (prefix_offset = len(ids) - 1), not at the first token this "
            "call emitted (read_offset): when several tokens arrive at once and the last is a skipped special "
            "token, the window that follows has no word before it, and SentencePiece's next '▁word' decodes as the "
            "start of a text, without its space. Return read_offset as the new prefix_offset",
            "test_ch6.py::test_detokenize_a_sentencepiece_decoder"),
    Mistake("ch6_detok_token_alone", "6.2", {"detokenize_incrementally": detokenize_token_alone},
            "the new tokens are decoded on their own: a token holding only part of a character's UTF-8 bytes "
            "decodes to U+FFFD. Decode the window ids[prefix_offset:], emit its text past the prefix's "
            "(ids[prefix_offset:read_offset]), and hold it back while it ends in '\\ufffd'",
            "test_ch6.py::test_detokenize_matches_decode_stream"),
    Mistake("ch6_detok_new_tokens_alone", "6.2", {"detokenize_incrementally": detokenize_new_tokens_alone},
            "only the new tokens are decoded (ids[read_offset:]): a SentencePiece-style decoder drops the space "
            "that starts a word when the word's token comes first, so 'Hello world' streams as 'Helloworld'. "
            "Decode the window ids[prefix_offset:] and emit its text past the prefix's",
            "test_ch6.py::test_detokenize_a_sentencepiece_decoder"),
    Mistake("ch6_detok_reads_while_holding", "6.2", {"detokenize_incrementally": detokenize_reads_while_holding},
            "read_offset moves on while the text is held back: the held tokens then count as emitted, the prefix "
            "ends in U+FFFD, and the character they start is lost. Return the offsets unchanged when nothing is "
            "emitted",
            "test_ch6.py::test_detokenize_matches_decode_stream"),
    Mistake("ch6_detok_keeps_prefix_text", "6.2", {"detokenize_incrementally": detokenize_keeps_prefix_text},
            "the whole window's text is emitted, so the prefix's text (ids[prefix_offset:read_offset], emitted "
            "last time) comes again. Emit window[len(prefix):]",
            "test_ch6.py::test_detokenize_matches_decode_stream"),
    Mistake("ch6_detok_window_never_slides", "6.2", {"detokenize_incrementally": detokenize_window_never_slides},
            "prefix_offset never moves on, so every step decodes the whole completion (quadratic in its length). "
            "After an emission the new prefix_offset is the old read_offset",
            "test_ch6.py::test_detokenize_window_stays_short"),
    Mistake("ch6_detok_decodes_from_start", "6.2", {"detokenize_incrementally": detokenize_decodes_from_start},
            "every step decodes from the start of the completion (ids[:read_offset] and all of ids), whatever "
            "prefix_offset says: the text and the offsets returned are right, but each step decodes the whole "
            "text so far, so its cost grows with the completion (quadratic over it). Decode only the window: the "
            "prefix ids[prefix_offset:read_offset] and the window ids[prefix_offset:]",
            "test_ch6.py::test_detokenize_window_stays_short"),
    Mistake("ch6_detok_emits_nothing", "6.2", {"detokenize_incrementally": detokenize_emits_nothing},
            "the offsets move on when the new tokens add no text (len(window) >= len(prefix): a skipped special "
            "token decodes to ''): the next window then starts at that token, and a SentencePiece-style decoder "
            "drops the space that starts the next word ('Hello' + 'world' instead of ' world'). Emit, and move "
            "the offsets, only when the window's text is longer than the prefix's (>)",
            "test_ch6.py::test_detokenize_a_sentencepiece_decoder"),
    Mistake("ch6_detok_prefix_jumps_to_end", "6.2", {"detokenize_incrementally": detokenize_prefix_jumps_to_end},
            "after an emission prefix_offset jumps to len(ids), so the next window holds the new tokens alone, "
            "with no token before them as context: a SentencePiece-style decoder then drops the space that starts "
            "each word ('Hello' + 'world'). The new prefix_offset is the OLD read_offset (the tokens just emitted "
            "stay as context); only read_offset moves to len(ids)",
            "test_ch6.py::test_detokenize_a_sentencepiece_decoder"),
    Mistake("ch6_detok_read_offset_plus_one", "6.2", {"detokenize_incrementally": detokenize_read_offset_plus_one},
            "read_offset moves on by one token after an emission: several tokens can come in one call (a step read "
            "back late), and all of them are emitted. The new read_offset is len(ids)",
            "test_ch6.py::test_detokenize_any_text"),
    Mistake("ch6_detok_strips_fffd", "6.2", {"detokenize_incrementally": detokenize_strips_fffd},
            "the trailing U+FFFD is cut off and the rest emitted, the offsets moving on: the bytes it stood for are "
            "then in the prefix, and the character they start is lost. While the window's text ends in '\\ufffd' "
            "emit nothing and return both offsets unchanged",
            "test_ch6.py::test_detokenize_matches_decode_stream"),
    Mistake("ch6_detok_ignores_skip_special_tokens", "6.2",
            {"detokenize_incrementally": detokenize_ignores_skip_special_tokens},
            "skip_special_tokens is not passed on: tokenizer.decode(ids) uses its default, so special tokens are "
            "dropped even when the caller asks to keep them. Call tokenizer.decode(ids, skip_special_tokens) for "
            "both the prefix and the window",
            "test_ch6.py::test_detokenize_matches_decode_stream"),
    Mistake("ch6_detok_fffd_anywhere", "6.2", {"detokenize_incrementally": detokenize_fffd_anywhere},
            "text is held back while it holds U+FFFD anywhere: a '\\ufffd' inside the text is a real character (the "
            "text had it); only one at the END stands for a character whose other bytes are still to come. Test "
            "window.endswith('\\ufffd')",
            "test_ch6.py::test_detokenize_matches_decode_stream"),
    # 6.3
    Mistake("ch6_admit_one_too_many", "6.3", {"admit": admit_one_too_many},
            "a request is accepted when max_waiting requests already wait (num_waiting > max_waiting is checked): "
            "max_waiting + 1 then wait. Refuse when num_waiting >= max_waiting",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_admit_id_before_queue", "6.3", {"admit": admit_id_before_queue},
            "the id is checked before the queue: when max_waiting requests wait and the id is also in use, admit "
            "raises ValueError where the queue's QueueFullError (the server's 503: try later) comes first. Check "
            "the queue first (num_waiting >= max_waiting), then the id",
            "test_ch6.py::test_admission_any_operations"),
    Mistake("ch6_finish_keeps_the_waiting_slot", "6.3", {"finish": finish_keeps_the_waiting_slot},
            "a request that ends while still waiting (aborted before its first step) keeps counting in num_waiting: "
            "every such abort leaks a slot, and once max_waiting have leaked the server answers 503 forever. In "
            "finish, count it down when req.waiting (and set req.waiting = False)",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_finish_counts_down_every_request", "6.3", {"finish": finish_counts_down_every_request},
            "finish counts every request down in num_waiting, also one that start() counted down already: "
            "num_waiting drifts below the truth (negative), num_running above it, and more than max_waiting "
            "get in. Count down only a request that is still waiting (req.waiting)",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_abort_request_twice", "6.3", {"abort_request": abort_request_twice},
            "a second abort of the same request returns it again (a client that disconnects while the server "
            "aborts it too): return None when req.aborted is already True, so it is ended once",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_finish_by_id", "6.3", {"finish": finish_by_id},
            "finish looks the request up by its id only: told again that an old request ended, after a new request "
            "took its id, it unregisters the NEW request (which then runs on, unknown to the book, and its id is "
            "free twice). Unregister only when book.requests holds this very request (`is req`)",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_start_not_idempotent", "6.3", {"start": start_not_idempotent},
            "start counts the request down every time it is called: told twice (or after finish()), num_waiting "
            "drops below the truth. Count down only while req.waiting, and set it False then",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_start_keeps_waiting_flag", "6.3", {"start": start_keeps_waiting_flag},
            "start counts the request down but leaves req.waiting True: the request still looks waiting, and "
            "finish() (or a second start) counts it down again. Set req.waiting = False",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_abort_unregisters", "6.3", {"abort_request": abort_request_unregisters},
            "abort_request removes the request from book.requests: it only marks it (req.aborted = True); the "
            "engine thread ends it and finish() unregisters it and frees its waiting slot (which it cannot do once "
            "the request is gone)",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_abort_clears_waiting", "6.3", {"abort_request": abort_request_clears_waiting},
            "abort_request sets req.waiting = False: an aborted request still holds its place in the queue until "
            "finish(), which counts a waiting one down in num_waiting; with waiting already False it never does, "
            "and num_waiting leaks a slot. Only mark it: req.aborted = True",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_abort_counts_down", "6.3", {"abort_request": abort_request_counts_down},
            "abort_request counts a waiting request down in num_waiting: counts change only in finish(), when the "
            "engine has ended it (until then it still holds its place). Only mark it: req.aborted = True",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_admit_counts_running", "6.3", {"admit": admit_counts_running},
            "the queue check counts every live request (len(book.requests)), running ones too: only waiting "
            "requests count against max_waiting. Refuse when book.num_waiting >= book.max_waiting",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_admit_registers_before_the_queue_check", "6.3", {"admit": admit_registers_before_the_queue_check},
            "the request is registered before the queue check: a refused request (QueueFullError) stays in "
            "book.requests, its id taken for good. Check the queue, then the id, and register only an accepted "
            "request",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_admit_never_counts", "6.3", {"admit": admit_never_counts},
            "admit registers the request but does not count it waiting: book.num_waiting stays where it was, so "
            "the queue never fills (no QueueFullError, no 503) and start() or finish() then count it down below "
            "the truth. Add book.num_waiting += 1 where an accepted request is registered",
            "test_ch6.py::test_admission_scenario"),
    Mistake("ch6_finish_leaves_waiting_flag", "6.3", {"finish": finish_leaves_waiting_flag},
            "finish counts a waiting request down but leaves req.waiting True: set req.waiting = False too (a "
            "later start() or finish() would count it down again)",
            "test_ch6.py::test_admission_scenario"),
    # 6.4
    Mistake("ch6_tpot_over_all_tokens", "6.4", {"tpots": tpots_over_all_tokens},
            "TPOT is divided by output_tokens: the time after the first token is spent on the output_tokens - 1 "
            "tokens that follow it (the first one's time is the TTFT)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_tpot_of_single_token_requests", "6.4", {"tpots": tpots_of_single_token_requests},
            "requests of one output token are not left out of TPOT: (latency - ttft) / (output_tokens - 1) divides "
            "by zero there. A request with one token has no time per output token after the first: keep only "
            "completed requests with output_tokens > 1",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_itl_from_the_send", "6.4", {"itls": itls_from_the_send},
            "ITL counts the time from sending to the first chunk as a gap: that is the TTFT. The gaps are between "
            "consecutive chunks only (chunks - 1 per request)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_percentiles_nearest_rank", "6.4", {"latency_percentiles": latency_percentiles_nearest_rank},
            "percentiles by nearest rank: benchmark_serving's (numpy's default) interpolate linearly between the "
            "two values around rank (n - 1) x p / 100: np.percentile(v, p)",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_midpoint", "6.4", {"latency_percentiles": latency_percentiles_midpoint},
            "percentiles by the midpoint of the two values around the rank (method='midpoint'): benchmark_serving's "
            "(numpy's default, 'linear') weighs them by where the rank (n - 1) x p / 100 falls: np.percentile(v, p)",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_in_seconds", "6.4", {"latency_percentiles": latency_percentiles_in_seconds},
            "the summary is in seconds: the values come in seconds and the summary is in milliseconds (x 1000)",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_failed_requests_included", "6.4",
            {"ttfts": ttfts_with_failed, "e2e_latencies": e2e_latencies_with_failed, "tpots": tpots_with_failed,
             "itls": itls_with_failed},
            "a failed request (trace.error set) is counted because it got chunks before it failed: only completed "
            "requests count (trace.ok)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_latencies_as_lists", "6.4", {"ttfts": ttfts_as_list, "e2e_latencies": e2e_latencies_as_list},
            "the figures come back as a Python list: ttfts and e2e_latencies, like tpots and itls, return a numpy "
            "array, np.array([...], dtype=np.float64) (an empty float64 array when no request completed)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_latencies_float32", "6.4",
            {"ttfts": ttfts_float32, "e2e_latencies": e2e_latencies_float32, "tpots": tpots_float32,
             "itls": itls_float32},
            "the figures are made float32 (dtype=np.float32): the times are float64 seconds, and float32 keeps "
            "about 7 significant digits (0.05 s comes back as 0.0500000007). Build them as float64: np.array([...], "
            "dtype=np.float64)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_tpot_per_chunk", "6.4", {"tpots": tpots_per_chunk},
            "TPOT is divided by the chunks after the first: a chunk can carry several tokens. Divide by "
            "output_tokens - 1, the tokens after the first (and keep every completed request with output_tokens > 1)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_tpot_filtered_by_chunks", "6.4", {"tpots": tpots_filtered_by_chunks},
            "the requests TPOT keeps are those with more than one chunk: a request can stream several tokens in "
            "one chunk, and it still has a TPOT. Keep every completed request with output_tokens > 1",
            "test_ch6.py::test_latencies_on_any_traces"),
    Mistake("ch6_itl_mean_per_request", "6.4", {"itls": itls_mean_per_request},
            "ITL is one mean gap per request: it is every gap between consecutive chunks, all requests pooled "
            "(chunks - 1 values per request): np.diff of each request's chunk times, concatenated",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_e2e_to_the_close", "6.4", {"e2e_latencies": e2e_latencies_to_the_close},
            "the end-to-end latency runs to `end` (when the response closed): it runs to the last chunk, "
            "t.latency = chunk_times[-1] - start (benchmark_serving's E2EL)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_ttft_from_clock_zero", "6.4", {"ttfts": ttfts_from_clock_zero},
            "TTFT is the first chunk's clock time: it is measured from the request's send, chunk_times[0] - start "
            "(t.ttft)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_latencies_of_requests_without_chunks", "6.4",
            {"ttfts": ttfts_without_chunks, "e2e_latencies": e2e_latencies_without_chunks,
             "tpots": tpots_without_chunks, "itls": itls_without_chunks},
            "a request with no error but no chunk (its stream closed before any token) is counted as completed: "
            "its chunk_times is empty, so t.ttft and t.latency raise IndexError. Keep only t.ok (no error AND at "
            "least one chunk)",
            "test_ch6.py::test_latencies_by_their_definitions"),
    Mistake("ch6_percentiles_mean_in_seconds", "6.4", {"latency_percentiles": latency_percentiles_mean_in_seconds},
            "the mean is in seconds while the percentiles are in ms: the values come in seconds and the whole "
            "summary is in milliseconds. Scale them once, before the mean and the percentiles alike: "
            "v = np.asarray(values_s, dtype=np.float64) * 1e3",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_quantiles_in_seconds", "6.4",
            {"latency_percentiles": latency_percentiles_percentiles_in_seconds},
            "the percentiles ('median', 'p90', ...) are in seconds while the mean is in ms: the values come in "
            "seconds and the whole summary is in milliseconds. Scale them once, before the mean and the percentiles "
            "alike: v = np.asarray(values_s, dtype=np.float64) * 1e3",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_mean_is_median", "6.4", {"latency_percentiles": latency_percentiles_mean_is_median},
            "'mean' holds the median (np.median): it is the average of the values, v.mean() (the median is the 50th "
            "percentile, keyed 'median' when 50 is asked for)",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_lower", "6.4", {"latency_percentiles": latency_percentiles_lower},
            "percentiles by the value at or below the rank (method='lower'): benchmark_serving's (numpy's default, "
            "'linear') interpolates between the two values around rank (n - 1) x p / 100: np.percentile(v, p)",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_exclusive", "6.4", {"latency_percentiles": latency_percentiles_exclusive},
            "percentiles by statistics.quantiles' default method, 'exclusive' (the value at rank p/100 x (n + 1), "
            "counting from 1): benchmark_serving's, numpy's default, is the 'inclusive' one (rank 1 + (n - 1) x "
            "p/100, interpolated): np.percentile(v, p), or statistics.quantiles(..., method='inclusive')",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_as_fractions", "6.4", {"latency_percentiles": latency_percentiles_fractions},
            "the percentiles are given to np.percentile as fractions (0.5, 0.9, 0.99): np.percentile takes them "
            "in percent (np.quantile takes fractions). np.percentile(v, p)",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_of_nothing_raise", "6.4", {"latency_percentiles": latency_percentiles_empty_raises},
            "no values (no request completed, or none had two tokens for TPOT) raise: np.percentile of an empty "
            "array fails. Return NaN for the mean and every percentile when there are no values",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_p50_key", "6.4", {"latency_percentiles": latency_percentiles_p50_key},
            "the 50th percentile is keyed 'p50': it is reported as 'median' (the others as 'pN')",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_int_keys", "6.4", {"latency_percentiles": latency_percentiles_int_keys},
            "a percentile's key is f'p{int(p)}': 99.9 becomes 'p99' and overwrites the 99th. Key it f'p{p:g}' "
            "('p99.9', and 'p90' for 90 or 90.0), as vLLM's benchmark names them",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_repr_keys", "6.4", {"latency_percentiles": latency_percentiles_repr_keys},
            "a percentile's key is f'p{p}': the 90.0 that bench serve's --metric-percentiles reads ('50,90,99' as "
            "floats) is keyed 'p90.0'. Key it f'p{p:g}' ('p90' for 90 or 90.0, 'p99.9'), as vLLM's benchmark names "
            "them", "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_median_always", "6.4", {"latency_percentiles": latency_percentiles_median_always},
            "the summary has a 'median' although 50 is not among the percentiles asked for: 'mean', then one key "
            "per percentile asked for (50 is keyed 'median'), nothing else",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
    Mistake("ch6_percentiles_fixed", "6.4", {"latency_percentiles": latency_percentiles_fixed},
            "the summary always has median, p90 and p99, whatever `percentiles` asks for: one key per "
            "percentile passed ('median' for 50, else f'p{p:g}')",
            "test_ch6.py::test_latency_percentiles_match_statistics"),
]
