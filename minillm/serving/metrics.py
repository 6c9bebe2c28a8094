"""What GET /metrics exports, in Prometheus' text format (vLLM's metric names, prefix minillm_).

The engine thread writes (counts tokens, observes finished requests, sets the state after each
step); the server's event loop reads (render). One lock keeps each read whole. With the engine in a
process of its own, the API process's Metrics loads a snapshot the engine sends after each step.

A counter's # HELP and # TYPE lines name it with its _total suffix, as its samples are named (what
prometheus_client writes): under `# TYPE x counter` a parser reads only samples named x, and takes
x_total for another metric, of unknown type.
"""
from __future__ import annotations

import threading

# vLLM's buckets for the two latency histograms (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
FINISH_REASONS = ("stop", "length", "abort")


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)  # per bucket, not cumulative
        self.count, self.sum = 0, 0.0

    def observe(self, value: float) -> None:
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1
                break
        self.count += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for upper, n in zip(self.buckets, self.counts):
            total += n
            out.append(f'{name}_bucket{{le="{upper}"}} {total}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum!r}", f"{name}_count {self.count}"]
        return out


class Metrics:
    def __init__(self, num_blocks: int):
        self.lock = threading.Lock()
        self.num_blocks = num_blocks
        self.free_blocks = num_blocks
        self.prompt_tokens = self.generation_tokens = self.failed = 0
        self.prefix_cache_hits = 0  # prompt tokens whose K/V the prefix cache held (the block manager's total)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)

    # ---- the engine thread writes ------------------------------------------------------------
    def set_free_blocks(self, free_blocks: int) -> None:
        with self.lock:
            self.free_blocks = free_blocks

    def set_prefix_cache_hits(self, tokens: int) -> None:
        with self.lock:
            self.prefix_cache_hits = tokens

    def count_prompt_tokens(self, n: int) -> None:
        with self.lock:
            self.prompt_tokens += n

    def count_generation_tokens(self, n: int) -> None:
        if n:
            with self.lock:
                self.generation_tokens += n

    def count_failed(self) -> None:
        with self.lock:
            self.failed += 1

    def observe_finished(self, out) -> None:
        """A finished RequestOutput: its finish reasons, time to first token and time per output token
        (the mean gap between its tokens, from its metrics; several samples: the longest)."""
        m = out.metrics
        with self.lock:
            for c in out.outputs:
                self.finished[c.finish_reason] = self.finished.get(c.finish_reason, 0) + 1
            if m is None or m.first_token_time is None:
                return
            self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
            n = max(len(c.token_ids) for c in out.outputs)
            if n > 1 and m.finished_time is not None:
                self.tpot.observe(max(0.0, m.finished_time - m.first_token_time) / (n - 1))

    # ---- another process's engine (serving/engine_core.py) --------------------------------------
    def snapshot(self) -> tuple:
        """Every value, as plain data: what the engine process sends with each step's outputs."""
        with self.lock:
            return (self.free_blocks, self.prompt_tokens, self.prefix_cache_hits, self.generation_tokens, self.failed,
                    dict(self.finished),
                    (list(self.ttft.counts), self.ttft.count, self.ttft.sum),
                    (list(self.tpot.counts), self.tpot.count, self.tpot.sum))

    def load(self, snapshot: tuple) -> None:
        """Take every value from a snapshot() of the engine process's Metrics."""
        with self.lock:
            (self.free_blocks, self.prompt_tokens, self.prefix_cache_hits, self.generation_tokens, self.failed,
             self.finished,
             (self.ttft.counts, self.ttft.count, self.ttft.sum),
             (self.tpot.counts, self.tpot.count, self.tpot.sum)) = snapshot

    # ---- the server reads --------------------------------------------------------------------
    def render(self, running: int, waiting: int) -> str:
        """The text /metrics returns; running and waiting are the AsyncLLM's counts now."""
        with self.lock:
            usage = 1.0 - self.free_blocks / self.num_blocks if self.num_blocks else 0.0
            lines = []

            def metric(name: str, kind: str, help_: str, samples: list[str]) -> None:
                lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *samples])

            metric("minillm_num_requests_running", "gauge", "Requests the engine has started and not finished.",
                   [f"minillm_num_requests_running {running}"])
            metric("minillm_num_requests_waiting", "gauge", "Requests accepted and not yet scheduled.",
                   [f"minillm_num_requests_waiting {waiting}"])
            metric("minillm_kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (0..1).",
                   [f"minillm_kv_cache_usage_perc {min(1.0, max(0.0, usage))!r}"])
            metric("minillm_kv_cache_free_blocks", "gauge", "KV-cache blocks free.",
                   [f"minillm_kv_cache_free_blocks {self.free_blocks}"])
            metric("minillm_kv_cache_total_blocks", "gauge", "KV-cache blocks in all.",
                   [f"minillm_kv_cache_total_blocks {self.num_blocks}"])
            metric("minillm_prompt_tokens_total", "counter", "Prompt tokens of the requests scheduled.",
                   [f"minillm_prompt_tokens_total {self.prompt_tokens}"])
            # vLLM's prefix_cache_queries and prefix_cache_hits: hits / queries is the cache's hit rate
            metric("minillm_prefix_cache_queries_total", "counter",
                   "Prompt tokens looked up in the prefix cache (those of the requests scheduled).",
                   [f"minillm_prefix_cache_queries_total {self.prompt_tokens}"])
            metric("minillm_prefix_cache_hits_total", "counter", "Prompt tokens whose K/V the prefix cache held.",
                   [f"minillm_prefix_cache_hits_total {self.prefix_cache_hits}"])
            metric("minillm_generation_tokens_total", "counter", "Tokens generated.",
                   [f"minillm_generation_tokens_total {self.generation_tokens}"])
            metric("minillm_request_success_total", "counter", "Samples finished, by finish reason.",
                   [f'minillm_request_success_total{{finished_reason="{r}"}} {n}' for r, n in self.finished.items()])
            metric("minillm_request_failure_total", "counter", "Requests failed by an engine error or shutdown.",
                   [f"minillm_request_failure_total {self.failed}"])
            metric("minillm_time_to_first_token_seconds", "histogram", "From arrival to the first token.",
                   self.ttft.lines("minillm_time_to_first_token_seconds"))
            metric("minillm_time_per_output_token_seconds", "histogram",
                   "Mean time between a request's output tokens.",
                   self.tpot.lines("minillm_time_per_output_token_seconds"))
        return "\n".join(lines) + "\n"

