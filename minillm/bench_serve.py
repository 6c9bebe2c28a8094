"""`python -m minillm bench serve`: a load generator for a running `python -m minillm serve`, shaped like
vLLM's `benchmark_serving`.

It replays a workload against the server's OpenAI API as Poisson arrivals at each given request rate
(`inf`: every request at once), streams every response and timestamps each chunk as it arrives. From
those timestamps it reports, per rate, what a user of the server feels:

  TTFT  time to first token: from sending a request to its first streamed chunk (queueing + prefill)
  TPOT  time per output token, per request: (latency - TTFT) / (output tokens - 1), the decode pace
        one request saw after its first token (requests of one output token have none)
  ITL   inter-token latency: every gap between two consecutive chunks of one request, all requests
        pooled (a decode step's time as the client sees it, stalls included)
  E2EL  end-to-end latency of a request: sending it to its last chunk

and the throughputs over the whole run: completed requests / duration, output tokens / duration,
(prompt + output) tokens / duration. The duration runs from the first request sent to the last
response closed.

Workloads (prompts are token-id lists sent to /v1/completions, so their lengths are exact):
  nanovllm       nano-vLLM's bench (minillm.bench.make_workload): prompt and output lengths uniform in
                 [--min-len, --max-input-len] and [--min-len, --max-output-len], random ids in [0, 10000]
  sharegpt-like  lengths from seeded lognormals with roughly ShareGPT's shape (many short turns, a long
                 tail; medians near SHAREGPT_LIKE's), clipped to the same bounds; generated here, no download
  random         vLLM's `--dataset-name random`: prompt and output lengths uniform in
                 [floor(L(1-r)), ceil(L(1+r))] for L = --random-input-len / --random-output-len and
                 r = --random-range-ratio, each prompt after one shared --random-prefix-len-token prefix
                 (a prefix-cache workload); ids random in [0, 10000]; --min-len and the max lengths unused
Every request asks for exactly its output length (max_tokens, with ignore_eos). Each rate runs the same
lengths with fresh prompts (the first token changed), so no rate reuses another's cached prefixes.
As in vLLM's, --burstiness makes the gaps between arrivals gamma-distributed (1: Poisson) and
--max-concurrency caps the requests in flight (a request that arrives beyond it waits for a free slot).

The pure statistics (ttfts, tpots, itls, latency_percentiles, summarize) take RequestTrace lists and
are tested on hand-made traces; the client is asyncio + httpx.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from minillm.serving.sse import sse_data

WORKLOADS = ("nanovllm", "sharegpt-like", "random")
# vLLM's --dataset-name random: its flags and their defaults (RandomDataset's); the flags are None until filled
RANDOM_DEFAULTS = {"random_input_len": 1024, "random_output_len": 128, "random_range_ratio": 0.0,
                   "random_prefix_len": 0}
PERCENTILES = (50, 90, 99)  # reported beside the mean; 50 is reported as "median" (--metric-percentiles)
METRICS = ("ttft", "tpot", "itl", "e2el")  # the latencies reported (--percentile-metrics)
METRIC_TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
                 "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
ENDPOINT = "/v1/completions"  # the one endpoint the token-id prompts go to (vLLM's --endpoint)
MAX_TOKEN_ID = 10000  # the nanovllm workload's prompts are random ids in [0, 10000]
# The sharegpt-like workload: lognormal token counts (median, sigma of the log), clipped to the length bounds.
# ShareGPT's conversations, tokenized, have prompts with a median near a hundred tokens and outputs of a
# few hundred, both with long tails; these numbers give that shape, they are not a fit to the data.
SHAREGPT_LIKE = {"prompt": (120.0, 1.0), "output": (200.0, 0.8)}
WARMUP_TOKENS = 2  # the warm-up request's output length
REQUEST_TIMEOUT_S = 600.0


# ---- traces and their statistics --------------------------------------------------------------------
@dataclass
class RequestTrace:
    """One streamed request as the client saw it. Times are seconds on one clock (time.perf_counter).

    start: when the request was sent; chunk_times: arrival time of each streamed chunk that carried a
    choice (a token or a few), in order; end: when the response closed ([DONE] read);
    prompt_tokens, output_tokens: token counts (the server's usage when it reports one);
    error: "" for a completed request, else what went wrong (its times are then not used).
    """

    start: float
    chunk_times: list[float] = field(default_factory=list)
    end: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    requested_output_tokens: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        """Seconds from sending to the first chunk."""
        return self.chunk_times[0] - self.start

    @property
    def latency(self) -> float:
        """Seconds from sending to the last chunk (vLLM's end-to-end latency)."""
        return self.chunk_times[-1] - self.start


# >>> exercise 6.4 | notebooks/06_serving.ipynb | 4. Latency under load: TTFT, TPOT, ITL
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
# <<< exercise 6.4


def summarize(traces: list[RequestTrace], duration_s: float, percentiles=PERCENTILES, metrics=METRICS) -> dict:
    """The run's figures in the shape (and under the names) of vLLM's benchmark_serving JSON.

    traces: every request sent (failed ones count in "failed" only); duration_s: first send to last
    response closed. Throughputs are per second of that duration; latencies in ms: for X in `metrics`
    (by default ttft, tpot, itl, e2el) the keys mean_X_ms and one per percentile (latency_percentiles' names:
    by default median_X_ms, p90_X_ms, p99_X_ms).
    """
    done = [t for t in traces if t.ok]
    inp = sum(t.prompt_tokens for t in done)
    out = sum(t.output_tokens for t in done)
    res = {"completed": len(done), "failed": len(traces) - len(done), "duration": duration_s,
           "total_input_tokens": inp, "total_output_tokens": out,
           "request_throughput": len(done) / duration_s if duration_s > 0 else math.nan,
           "output_throughput": out / duration_s if duration_s > 0 else math.nan,
           "total_token_throughput": (inp + out) / duration_s if duration_s > 0 else math.nan}
    measures = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2e_latencies}
    for name in metrics:
        for stat, v in latency_percentiles(measures[name](traces), percentiles).items():
            res[f"{stat}_{name}_ms"] = v
    res["input_lens"] = [t.prompt_tokens for t in done]
    res["output_lens"] = [t.output_tokens for t in done]
    res["requested_output_lens"] = [t.requested_output_tokens for t in done]
    res["ttfts"] = [t.ttft for t in done]
    res["errors"] = [t.error for t in traces if not t.ok]
    return res


# ---- workload and arrivals --------------------------------------------------------------------------
def poisson_arrivals(num_requests: int, rate: float, seed: int = 0) -> np.ndarray:
    """Send times, seconds after the run starts, of a Poisson process of `rate` requests per second:
    the first request at 0, then gaps drawn independently from an exponential of mean 1/rate (seeded).
    rate = inf sends everything at 0. -> shape (num_requests,), non-decreasing."""
    if num_requests <= 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(num_requests)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num_requests - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def arrival_times(num_requests: int, rate: float, seed: int = 0, burstiness: float = 1.0) -> np.ndarray:
    """vLLM's `bench serve --burstiness`: send times whose gaps are gamma-distributed with shape `burstiness`
    and mean 1/rate, so their coefficient of variation is 1/sqrt(burstiness). 1 is the Poisson process
    (poisson_arrivals, the same draw); below 1 the arrivals bunch up, above 1 they even out. -> shape
    (num_requests,), the first at 0."""
    if burstiness == 1.0 or math.isinf(rate) or num_requests <= 1:
        return poisson_arrivals(num_requests, rate, seed)
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), num_requests - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def sharegpt_like_lengths(num: int, min_len: int, max_input_len: int, max_output_len: int, seed: int = 0):
    """(prompt lengths, output lengths), lists of `num` ints from seeded lognormals (SHAREGPT_LIKE's
    medians and sigmas), clipped to [min_len, max_input_len] and [min_len, max_output_len]."""
    rng = np.random.default_rng(seed)

    def draw(median: float, sigma: float, hi: int) -> list[int]:
        x = rng.lognormal(math.log(median), sigma, num)
        return [int(v) for v in np.clip(np.rint(x), min_len, hi)]

    return draw(*SHAREGPT_LIKE["prompt"], max_input_len), draw(*SHAREGPT_LIKE["output"], max_output_len)


def random_lengths(num: int, input_len: int, output_len: int, range_ratio: float, seed: int = 0):
    """vLLM's random dataset's lengths: (prompt lengths, output lengths), `num` ints each, uniform in
    [floor(L * (1 - r)), ceil(L * (1 + r))] for L = input_len and output_len, r = range_ratio in [0, 1)
    (an output at least 1 token)."""
    rng = np.random.default_rng(seed)

    def draw(n: int, lowest: int) -> list[int]:
        lo, hi = max(math.floor(n * (1 - range_ratio)), lowest), max(math.ceil(n * (1 + range_ratio)), lowest)
        return [int(v) for v in rng.integers(lo, hi + 1, num)]

    return draw(input_len, 0), draw(output_len, 1)


def random_requests(num: int, input_len: int, output_len: int, range_ratio: float, prefix_len: int,
                    seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """vLLM's random dataset as token ids: one shared prefix of `prefix_len` random ids, then each prompt's
    own random ids of a length random_lengths draws. -> (prompt token-id lists, output lengths)."""
    p_lens, o_lens = random_lengths(num, input_len, output_len, range_ratio, seed)
    rng = np.random.default_rng(seed + 1)
    prefix = [int(i) for i in rng.integers(0, MAX_TOKEN_ID + 1, prefix_len)]
    return [prefix + [int(i) for i in rng.integers(0, MAX_TOKEN_ID + 1, n)] for n in p_lens], o_lens


def make_requests(workload: str, num: int, min_len: int, max_input_len: int, max_output_len: int,
                  seed: int = 0, **random_args) -> tuple[list[list[int]], list[int]]:
    """-> (prompt token-id lists, output lengths) of the named workload (see the module docstring);
    random_args: the random workload's (RANDOM_DEFAULTS' names, less the `random_` prefix)."""
    from minillm.bench import make_workload
    if workload == "random":
        return random_requests(num, seed=seed, **random_args)
    if workload == "nanovllm":
        return make_workload(num, min_len, max_input_len, max_output_len, seed=seed)
    if workload == "sharegpt-like":
        p_lens, o_lens = sharegpt_like_lengths(num, min_len, max_input_len, max_output_len, seed)
        rng = np.random.default_rng(seed + 1)
        return [[int(i) for i in rng.integers(0, MAX_TOKEN_ID + 1, n)] for n in p_lens], o_lens
    raise ValueError(f"--workload {workload!r}: use one of {', '.join(WORKLOADS)}")


def fresh_prompts(prompts: list[list[int]], k: int) -> list[list[int]]:
    """The prompts with their first token shifted by k: the same lengths and cost, but a prefix cache
    (it hashes whole blocks from the first token on) finds nothing that run k-1 left in it."""
    return [[(p[0] + k) % (MAX_TOKEN_ID + 1)] + p[1:] for p in prompts]


# ---- the client -------------------------------------------------------------------------------------
def _error_text(status: int, body: bytes) -> str:
    """An OpenAI-shaped error body's message, else the body itself, with the HTTP status."""
    try:
        msg = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = body.decode(errors="replace")[:500]
    return f"HTTP {status}: {msg}"


async def send_request(client, url: str, payload: dict, start: float, requested: int) -> RequestTrace:
    """POST one streaming completion; timestamp each chunk. Never raises: failures land in .error."""
    trace = RequestTrace(start=start, prompt_tokens=len(payload["prompt"]), requested_output_tokens=requested)
    chunks = 0
    usage = None
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                trace.error = _error_text(resp.status_code, await resp.aread())
                return trace
            lines: list[str] = []  # the data lines of the event being read
            async for line in resp.aiter_lines():
                data = sse_data(line, lines)
                if data is None:
                    continue  # inside an event, a comment, a blank line after no data
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    trace.error = f"error event: {event['error'].get('message', event['error'])}"
                    return trace
                if event.get("choices"):
                    trace.chunk_times.append(time.perf_counter())
                    chunks += 1
                if event.get("usage"):
                    usage = event["usage"]
        trace.end = time.perf_counter()
    except Exception as e:  # noqa: BLE001 -- one failed request must not lose the others
        trace.error = f"{type(e).__name__}: {e}"
        return trace
    if usage:  # the server's count; chunks may carry more than one token, or none (a finish reason alone)
        trace.output_tokens = int(usage.get("completion_tokens", chunks))
        trace.prompt_tokens = int(usage.get("prompt_tokens", trace.prompt_tokens))
    else:
        trace.output_tokens = chunks
    if not trace.chunk_times:
        trace.error = "the stream ended without a chunk"
    return trace


def _payload(model: str, prompt: list[int], max_tokens: int, temperature: float) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}


async def run_at_rate(client, url: str, model: str, prompts: list[list[int]], output_lens: list[int], rate: float,
                      temperature: float, seed: int, burstiness: float = 1.0,
                      max_concurrency: int | None = None) -> tuple[list[RequestTrace], float]:
    """Send every request at its arrival time (Poisson, or arrival_times' gamma gaps with `burstiness`;
    absolute, so sleeps do not drift); wait for all. max_concurrency (vLLM's --max-concurrency): a request
    that arrives while that many are in flight waits for one to end, and its latencies count from when
    it is sent. -> (traces in request order, duration: first send to last response closed, seconds)."""
    offsets = arrival_times(len(prompts), rate, seed, burstiness)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    t0 = time.perf_counter()

    async def one(i: int) -> RequestTrace:
        delay = t0 + offsets[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        payload = _payload(model, prompts[i], output_lens[i], temperature)
        async with slots:
            return await send_request(client, url, payload, time.perf_counter(), output_lens[i])

    traces = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    end = max([t.end for t in traces if t.ok] or [time.perf_counter()])
    return list(traces), end - t0


async def _bench(args, prompts, output_lens) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.base_url.rstrip("/")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # every request at once if due
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(REQUEST_TIMEOUT_S), limits=limits) as client:
        model = args.served_model_name or args.served_model
        if not model:
            try:
                r = await client.get(f"{base}/v1/models")
            except httpx.HTTPError as e:
                raise RuntimeError(f"cannot reach {base}/v1/models ({type(e).__name__}: {e}); is "
                                   f"`python -m minillm serve` running there?") from None
            if r.status_code != 200:
                raise RuntimeError(f"GET {base}/v1/models: {_error_text(r.status_code, r.content)}")
            model = r.json()["data"][0]["id"]
        url = base + ENDPOINT
        # one short request first: the server answers, and its first-call costs stay out of the figures
        warm = await send_request(client, url, _payload(model, prompts[0][::-1], WARMUP_TOKENS, args.temperature),
                                  time.perf_counter(), WARMUP_TOKENS)
        if not warm.ok:
            raise RuntimeError(f"the warm-up request to {url} failed: {warm.error}")
        runs = []
        for k, rate in enumerate(args.request_rate):
            _log(f"request rate {_rate_name(rate)}: {len(prompts)} requests")
            traces, duration = await run_at_rate(client, url, model, fresh_prompts(prompts, k + 1), output_lens,
                                                 rate, args.temperature, args.seed + k, args.burstiness,
                                                 args.max_concurrency)
            res = {"request_rate": _rate_name(rate), "burstiness": args.burstiness,
                   "max_concurrency": args.max_concurrency,
                   **summarize(traces, duration, args.metric_percentiles, args.percentile_metrics)}
            runs.append(res)
            print(format_run(res, args.metric_percentiles, args.percentile_metrics), flush=True)
    return {"backend": "minillm", "base_url": base, "model": model, "runs": runs}


# ---- reporting --------------------------------------------------------------------------------------
def _rate_name(rate: float) -> str | float:
    """A rate as JSON keeps it: a number, or "inf" (JSON has no infinity)."""
    return "inf" if math.isinf(rate) else rate


def _log(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


def _stat_names(percentiles) -> list[str]:
    """latency_percentiles' names for these percentiles: "median" for 50, else f"p{p:g}"."""
    return ["median" if p == 50 else f"p{p:g}" for p in percentiles]


def format_run(res: dict, percentiles=PERCENTILES, metrics=METRICS) -> str:
    """One rate's figures as vLLM's benchmark_serving prints them (the mean and `percentiles` of `metrics`)."""
    w = 50
    lines = [f"{' Serving Benchmark Result ':=^{w}}",
             f"{'Request rate (req/s):':<40}{res['request_rate']:<10}",
             *([f"{'Burstiness:':<40}{res['burstiness']:<10}"] if res.get("burstiness", 1.0) != 1.0 else []),
             *([f"{'Maximum request concurrency:':<40}{res['max_concurrency']:<10}"]
               if res.get("max_concurrency") else []),
             f"{'Successful requests:':<40}{res['completed']:<10}",
             f"{'Failed requests:':<40}{res['failed']:<10}",
             f"{'Benchmark duration (s):':<40}{res['duration']:<10.2f}",
             f"{'Total input tokens:':<40}{res['total_input_tokens']:<10}",
             f"{'Total generated tokens:':<40}{res['total_output_tokens']:<10}",
             f"{'Request throughput (req/s):':<40}{res['request_throughput']:<10.2f}",
             f"{'Output token throughput (tok/s):':<40}{res['output_throughput']:<10.2f}",
             f"{'Total token throughput (tok/s):':<40}{res['total_token_throughput']:<10.2f}"]
    for key in metrics:
        lines.append(f"{' ' + METRIC_TITLES[key] + ' ':-^{w}}")
        for stat in ("mean", *_stat_names(percentiles)):
            label = f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} {key.upper()} (ms):"
            lines.append(f"{label:<40}{res[f'{stat}_{key}_ms']:<10.2f}")
    if res["errors"]:
        lines.append(f"first error: {res['errors'][0]}")
    lines.append("=" * w)
    return "\n".join(lines)


def format_summary(result: dict, percentiles=PERCENTILES, metrics=METRICS) -> str:
    """Every rate on one line each: the figures to compare across rates (of `metrics`, e2el aside, the
    lowest and highest of `percentiles`)."""
    names = _stat_names(sorted(set(percentiles)))
    stats = names[:1] + names[-1:] if len(names) > 1 else names
    shown = [m for m in metrics if m != "e2el"]
    head = f"{'rate':>8}{'done':>6}{'req/s':>8}{'out tok/s':>11}" + "".join(
        f"{(m.upper() + ' ' if i == 0 else '') + ('p50' if s == 'median' else s):>{10 if i == 0 else 9}}"
        for m in shown for i, s in enumerate(stats)) + "  (ms)"
    lines = [f"{result['model']} at {result['base_url']}, workload {result['workload']['name']}", head]
    for r in result["runs"]:
        lines.append(f"{r['request_rate']!s:>8}{r['completed']:>6}{r['request_throughput']:>8.2f}"
                     f"{r['output_throughput']:>11.1f}" + "".join(
                         f"{r[f'{s}_{m}_ms']:>{10 if i == 0 else 9}.1f}" for m in shown for i, s in enumerate(stats)))
    return "\n".join(lines)


# ---- arguments and the command ----------------------------------------------------------------------
def _percentiles(text: str) -> tuple[float, ...]:
    """vLLM's --metric-percentiles: "25,50,99" -> (25.0, 50.0, 99.0), each in [0, 100]."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of percentiles, e.g. 50,90,99") \
            from None
    if not all(0 <= p <= 100 for p in values):
        raise argparse.ArgumentTypeError(f"percentiles lie in [0, 100], got {text}")
    return values


def _metrics(text: str) -> tuple[str, ...]:
    """vLLM's --percentile-metrics: "ttft,itl" -> ("ttft", "itl"), each one of METRICS."""
    names = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown metric {unknown[0]!r}: use a comma-separated list of "
                                         f"{', '.join(METRICS)}")
    return names


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of requests per second (or inf)") from None
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"a request rate must be > 0 (inf: all at once), got {text}")
    return rate


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """`bench serve`'s arguments (a subcommand of `python -m minillm bench`)."""
    p.add_argument("--base-url", default=None, help="the server, e.g. http://127.0.0.1:8000 (default: --host, --port)")
    p.add_argument("--host", default="127.0.0.1", help="the server's host, when --base-url is left out")
    p.add_argument("--port", type=int, default=8000, help="the server's port, when --base-url is left out")
    p.add_argument("--model", dest="served_model", default=None,
                   help="the model name to send (default: the first one GET /v1/models lists)")
    p.add_argument("--served-model-name", default=None, help="vLLM's: the model name to send, over --model")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--request-rate", nargs="+", type=_rate, default=[math.inf], metavar="R",
                   help="requests per second, Poisson arrivals; several run one after the other; "
                        "inf (the default) sends every request at once")
    p.add_argument("--num-prompts", type=int, default=64, help="requests per rate (default 64)")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="arrivals' gamma shape: 1 Poisson (default), < 1 burstier, > 1 more even")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight; one that arrives beyond it waits (default: no limit)")
    p.add_argument("--workload", "--dataset-name", dest="workload", choices=WORKLOADS, default="nanovllm",
                   help="nanovllm: nano-vLLM's uniform lengths; sharegpt-like: lognormal lengths (offline); "
                        "random: vLLM's random dataset (--dataset-name random), set by the --random-* flags")
    p.add_argument("--random-input-len", type=int, default=None,
                   help=f"random: prompt length after the prefix (default {RANDOM_DEFAULTS['random_input_len']})")
    p.add_argument("--random-output-len", type=int, default=None,
                   help=f"random: output length (default {RANDOM_DEFAULTS['random_output_len']})")
    p.add_argument("--random-range-ratio", type=float, default=None,
                   help="random: lengths uniform in [L(1-r), L(1+r)], r in [0, 1) (default 0: exactly L)")
    p.add_argument("--random-prefix-len", type=int, default=None,
                   help="random: tokens of one prefix every prompt starts with (default 0)")
    p.add_argument("--min-len", type=int, default=100, help="shortest prompt and output (default 100)")
    p.add_argument("--max-input-len", type=int, default=1024, help="longest prompt (default 1024)")
    p.add_argument("--max-output-len", type=int, default=1024, help="longest output (default 1024)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=0, help="workload and arrival times (default 0)")
    p.add_argument("--json-file", default=None, help="write the result there as JSON")
    # vLLM's bench serve flags, so that its command lines run here
    p.add_argument("--save-result", action="store_true", help="vLLM's: write the result as JSON to --result-dir")
    p.add_argument("--result-dir", default=None, help="vLLM's: where --save-result writes (default: here)")
    p.add_argument("--result-filename", default=None,
                   help="vLLM's: the file --save-result writes (default minillm-MODEL-YYYYmmdd-HHMMSS.json)")
    p.add_argument("--metric-percentiles", type=_percentiles, default=PERCENTILES, metavar="P,P,...",
                   help="vLLM's: the percentiles reported beside each mean (default 50,90,99)")
    p.add_argument("--percentile-metrics", type=_metrics, default=METRICS, metavar="M,M,...",
                   help=f"vLLM's: the latencies reported (default {','.join(METRICS)})")
    p.add_argument("--ignore-eos", action="store_true",
                   help="vLLM's: every request runs to its output length; minillm's bench always does")
    p.add_argument("--backend", choices=("vllm", "openai"), default="vllm",
                   help="vLLM's: both send to the OpenAI completions API, as here")
    p.add_argument("--endpoint", default=ENDPOINT, help=f"vLLM's: only {ENDPOINT} (the prompts are token ids)")
    # the parent `bench` still fills in its own workload defaults by device (cli.check_bench_args): "cpu"
    # spares it probing CUDA, which sending requests does not need
    p.set_defaults(device="cpu")


def check_serve_args(args) -> None:
    """Raise ValueError naming a bad argument and the fix; fill in args.base_url from --host and --port when
    --base-url is left out (vLLM's rule), so that what is checked is what is used."""
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {args.num_prompts}")
    if not (math.isfinite(args.burstiness) and args.burstiness > 0):
        raise ValueError(f"--burstiness must be a finite number > 0 (1: Poisson arrivals), got {args.burstiness}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1 (or left out: no limit), got {args.max_concurrency}")
    if args.base_url is None:  # vLLM's: --base-url, else --host and --port
        args.base_url = f"http://{args.host}:{args.port}"
    if not args.base_url.startswith(("http://", "https://")):
        raise ValueError(f"--base-url {args.base_url!r} must start with http:// or https://")
    if args.min_len < 1 or args.max_input_len < args.min_len or args.max_output_len < args.min_len:
        raise ValueError(f"lengths must satisfy 1 <= --min-len <= --max-input-len and --max-output-len, got "
                         f"{args.min_len}, {args.max_input_len}, {args.max_output_len}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.endpoint != ENDPOINT:
        raise ValueError(f"--endpoint {args.endpoint}: bench serve sends token-id prompts to {ENDPOINT} only; "
                         f"leave --endpoint out")
    if not args.save_result and (args.result_dir or args.result_filename):
        flag = "--result-dir" if args.result_dir else "--result-filename"
        raise ValueError(f"{flag} names where --save-result writes: add --save-result (or --json-file FILE)")
    check_random_args(args)


def check_random_args(args) -> None:
    """The --random-* flags: only with --workload random (vLLM would ignore them silently), where each left
    out takes RANDOM_DEFAULTS' value and the lengths drawn must hold at least one prompt token."""
    given = [name for name in RANDOM_DEFAULTS if getattr(args, name) is not None]
    if args.workload != "random":
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ValueError(f"{flag} sets the random workload: add --workload random (vLLM's --dataset-name "
                             f"random), or leave {flag} out")
        return
    for name, value in RANDOM_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    r = args.random_range_ratio
    if not 0 <= r < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1) (lengths uniform in [L(1-r), L(1+r)]), got {r}")
    if args.random_input_len < 0 or args.random_prefix_len < 0 or args.random_output_len < 1:
        raise ValueError(f"--random-input-len and --random-prefix-len must be >= 0 and --random-output-len >= 1, "
                         f"got {args.random_input_len}, {args.random_prefix_len}, {args.random_output_len}")
    if args.random_prefix_len + math.floor(args.random_input_len * (1 - r)) < 1:
        raise ValueError("the random workload could draw an empty prompt: raise --random-input-len or "
                         "--random-prefix-len, or lower --random-range-ratio")


def random_args(args) -> dict:
    """make_requests' random_args from the parsed --random-* flags ({} for another workload)."""
    if args.workload != "random":
        return {}
    return {name.removeprefix("random_"): getattr(args, name) for name in RANDOM_DEFAULTS}


def run_bench_serve(args) -> dict:
    """Run every rate against the server; print each rate's table and a summary; write --json-file."""
    check_serve_args(args)
    randoms = random_args(args)
    prompts, output_lens = make_requests(args.workload, args.num_prompts, args.min_len, args.max_input_len,
                                         args.max_output_len, args.seed, **randoms)
    result = asyncio.run(_bench(args, prompts, output_lens))
    lengths = ({f"random_{k}": v for k, v in randoms.items()} if randoms else
               {"min_len": args.min_len, "max_input_len": args.max_input_len, "max_output_len": args.max_output_len})
    result["workload"] = {"name": args.workload, "num_prompts": args.num_prompts, "seed": args.seed, **lengths,
                          "temperature": args.temperature, "ignore_eos": True,
                          "prompt_tokens": sum(map(len, prompts)), "output_tokens": sum(output_lens)}
    result = {k: result[k] for k in ("backend", "base_url", "model", "workload", "runs")}
    print(format_summary(result, args.metric_percentiles, args.percentile_metrics))
    paths = [args.json_file] if args.json_file else []
    if args.save_result:  # vLLM's naming: <backend>-<model>-<date>-<time>.json, in --result-dir
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = args.result_filename or f"minillm-{result['model'].replace('/', '_')}-{stamp}.json"
        paths.append(os.path.join(args.result_dir or ".", name))
    for path in paths:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    failed = sum(r["failed"] for r in result["runs"])
    if failed:
        raise RuntimeError(f"bench serve: {failed} request(s) failed; the first: "
                           f"{next(e for r in result['runs'] for e in r['errors'])}")
    return result
