"""Chapter 6's "Check your understanding" questions (notebooks/06_serving.ipynb), registered as notebook 06
with minillm.course.questions (which imports this module), checked the way every chapter's are.

Every question states all the numbers it needs, so no answer depends on a measurement of the notebook's
(its outputs may be made again on another GPU). The expected values come from minillm's own chapter-6
functions where there is one (always the reference, even while the notebook runs the reader's:
questions.py swaps them back while it checks): the server's sse_event frames Q1's payload, a
RequestTrace through the bench's ttfts / tpots gives Q2, latency_percentiles Q3. Q4-Q6 are arithmetic
on the stated numbers (the slots of a static batch, Little's law, the saturation rate), written out here.
"""
from __future__ import annotations

# the questions' inputs, as the notebook states them
Q1_PAYLOAD = "line one\nline two"  # 17 characters, one of them the newline
Q2_CHUNKS_MS = (120.0, 150.0, 175.0, 205.0, 230.0)  # arrival of each one-token chunk; sent at 0
Q3_TTFTS_MS = (30.0, 32.0, 35.0, 31.0, 29.0, 33.0, 400.0, 34.0, 36.0, 30.0)
Q4_OUTPUT_LENS = (100, 200, 300, 1000)  # one static batch
Q5_RATE, Q5_LATENCY_S, Q5_TOKENS = 12.0, 3.5, 200.0  # completions/s, mean seconds in the server, tokens per request
Q6_TOK_S, Q6_TOKENS, Q6_RATE = 18000.0, 450.0, 30.0  # saturated output tokens/s, tokens per request, offered rate


# ------------------------------------------------------------------------------------------------ Q1
def sse_frame(payload: str = Q1_PAYLOAD) -> tuple[int, int]:
    """(lines, bytes) of the event the server writes for `payload` (minillm's sse_event)."""
    from minillm.serving.sse import sse_event
    event = sse_event(payload)
    return event.count("\n"), len(event.encode())


def _sse_one_data_line(payload: str = Q1_PAYLOAD) -> tuple[int, int]:
    """The frame when the whole payload goes after one `data: ` (its newline then ends that line early)."""
    event = f"data: {payload}\n\n"
    return event.count("\n"), len(event.encode())


# ------------------------------------------------------------------------------------------------ Q2
def trace_ttft_tpot(chunks_ms=Q2_CHUNKS_MS) -> tuple[float, float]:
    """(TTFT, TPOT) in ms of a request sent at 0 whose one-token chunks arrived at chunks_ms (the bench's
    own ttfts and tpots on a RequestTrace)."""
    from minillm.bench_serve import RequestTrace, tpots, ttfts
    trace = RequestTrace(start=0.0, chunk_times=[c / 1e3 for c in chunks_ms], end=chunks_ms[-1] / 1e3,
                         output_tokens=len(chunks_ms), requested_output_tokens=len(chunks_ms))
    return float(ttfts([trace])[0]) * 1e3, float(tpots([trace])[0]) * 1e3


# ------------------------------------------------------------------------------------------------ Q3
def ttft_median_p90(values_ms=Q3_TTFTS_MS) -> tuple[float, float]:
    """(median, p90) in ms, as latency_percentiles reports them."""
    from minillm.bench_serve import latency_percentiles
    p = latency_percentiles([v / 1e3 for v in values_ms])
    return p["median"], p["p90"]


def _nearest_rank(values, q: float) -> float:
    """The q-th percentile by the nearest-rank rule (the smallest value with at least q% at or below it)."""
    import math
    v = sorted(values)
    return v[max(0, math.ceil(q / 100 * len(v)) - 1)]


# ------------------------------------------------------------------------------------------------ Q4
def static_batch_slots(output_lens=Q4_OUTPUT_LENS) -> tuple[int, float]:
    """A static batch runs one step per token of its longest request; every request holds its slot for
    all of them. -> (slots held by requests that have finished, percent of all slots that make a token)."""
    steps = max(output_lens)
    slots = len(output_lens) * steps
    useful = sum(output_lens)
    return slots - useful, 100.0 * useful / slots


# ------------------------------------------------------------------------------------------------ Q5, Q6
def littles_law(rate: float = Q5_RATE, latency_s: float = Q5_LATENCY_S, tokens: float = Q5_TOKENS):
    """(requests in the system L = lambda W, output tokens/s = completions/s x tokens per request)."""
    return rate * latency_s, rate * tokens


def saturation(tok_s: float = Q6_TOK_S, tokens: float = Q6_TOKENS, rate: float = Q6_RATE):
    """(lambda_sat = X / o, requests/s; utilisation rho = lambda / lambda_sat at `rate`, percent)."""
    lam_sat = tok_s / tokens
    return lam_sat, 100.0 * rate / lam_sat


def _questions():
    from minillm.course.questions import PERCENT_TOL, Approx, Exact, Part, Question
    return [
        Question("q1", "sse_event of 'line one' + newline + 'line two': lines on the wire (the blank one too), bytes", (
            Part(lambda: sse_frame()[0], Exact(), label="lines",
                 hint="every line of the payload becomes a `data: ` line of its own, and an empty line ends the event",
                 traps=lambda: [(sse_frame()[0] - 1, "the blank line that ends the event is a line too")]),
            Part(lambda: sse_frame()[1], Exact(), label="bytes",
                 hint="count `data: ` (6 bytes) once per payload line, each line's text, every newline, and the "
                      "empty line at the end",
                 traps=lambda: [(_sse_one_data_line()[1], "a newline inside one data line would end that line: the "
                                                          "payload's second line needs its own `data: `"),
                                (sse_frame()[1] - 1, "the event ends with an empty line: one more newline")]),
        )),
        Question("q2", "chunks at 120, 150, 175, 205, 230 ms after sending: TTFT and TPOT, ms", (
            Part(lambda: trace_ttft_tpot()[0], Approx(), label="TTFT",
                 hint="from sending the request to its first chunk"),
            Part(lambda: trace_ttft_tpot()[1], Approx(), label="TPOT",
                 hint="the time after the first token, spread over the tokens that followed it",
                 traps=lambda: [(Q2_CHUNKS_MS[-1] / len(Q2_CHUNKS_MS), "TPOT leaves the first token out: the TTFT "
                                                                       "is its own figure"),
                                ((Q2_CHUNKS_MS[-1] - Q2_CHUNKS_MS[0]) / len(Q2_CHUNKS_MS),
                                 "after the first token come one token fewer than the request has: divide by the "
                                 "gaps, not the tokens")]),
        )),
        Question("q3", "TTFTs 30, 32, 35, 31, 29, 33, 400, 34, 36, 30 ms: median and p90 (numpy's linear "
                       "interpolation), ms", (
            Part(lambda: ttft_median_p90()[0], Approx(), label="median",
                 hint="sort them; with ten values the median lies halfway between the 5th and the 6th",
                 traps=lambda: [(sum(Q3_TTFTS_MS) / len(Q3_TTFTS_MS), "that is the mean, which one slow request "
                                                                      "drags up; the median is the middle value"),
                                (ttft_median_p90()[0] / 1e3, "answer in milliseconds, the unit of the question")]),
            Part(lambda: ttft_median_p90()[1], Approx(), label="p90",
                 hint="numpy puts percentile q at rank q/100 x (n - 1) of the sorted values (from 0) and "
                      "interpolates between the two values around it",
                 traps=lambda: [(_nearest_rank(Q3_TTFTS_MS, 90), "that is the nearest-rank rule; numpy's default "
                                                                "interpolates between the two neighbouring values"),
                                (max(Q3_TTFTS_MS), "the p90 lies between the 9th and the 10th sorted values, not at "
                                                   "the largest"),
                                (ttft_median_p90()[1] / 1e3, "answer in milliseconds, the unit of the question")]),
        )),
        Question("q4", "static batch of outputs 100, 200, 300, 1000 tokens: idle slots, percent of slots that make a "
                       "token", (
            Part(lambda: static_batch_slots()[0], Exact(), label="idle slots",
                 hint="the batch runs as many steps as its longest request has tokens; each request holds a slot "
                      "in every one of them, and makes a token only until it has finished"),
            Part(lambda: static_batch_slots()[1], Approx(rel=0, abs=PERCENT_TOL), label="percent",
                 hint="tokens made over slots held",
                 traps=lambda: [(100 - static_batch_slots()[1], "that is the idle share; the question asks for the "
                                                                "slots that make a token")]),
        )),
        Question("q5", "12 requests/s, 3.5 s each in the server, 200 tokens each: requests inside, output tokens/s", (
            Part(lambda: littles_law()[0], Approx(), label="requests",
                 hint="Little's law: requests inside = arrival (or completion) rate x time each spends inside",
                 traps=lambda: [(Q5_RATE / Q5_LATENCY_S, "multiply the rate by the time, do not divide"),
                                (Q5_LATENCY_S / Q5_RATE, "multiply the rate by the time, do not divide")]),
            Part(lambda: littles_law()[1], Approx(), label="tokens/s",
                 hint="every completed request has generated its tokens",
                 traps=lambda: [(littles_law()[0] * Q5_TOKENS, "the requests inside have not all generated their "
                                                               "tokens yet; count the requests that complete per "
                                                               "second")]),
        )),
        Question("q6", "18,000 output tokens/s at saturation, 450 tokens per request: the saturation rate, and the "
                       "utilisation at 30 requests/s, percent", (
            Part(lambda: saturation()[0], Approx(), label="requests/s",
                 hint="at most X output tokens per second, o tokens per request: at most X / o requests per second",
                 traps=lambda: [(Q6_TOKENS / Q6_TOK_S, "divide the tokens per second by the tokens per request")]),
            Part(lambda: saturation()[1], Approx(rel=0, abs=PERCENT_TOL), label="percent",
                 hint="utilisation: the offered rate over the rate the server can complete",
                 traps=lambda: [(10000.0 / saturation()[1], "the offered rate goes on top: a server below "
                                                            "saturation is less than 100% utilised")]),
        )),
    ]


def _register() -> None:
    from minillm.course.questions import register
    register("06", _questions())


_register()
