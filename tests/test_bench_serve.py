"""`python -m minillm bench serve` (minillm/bench_serve.py): its statistics on hand-made traces (exact
values, and numpy's percentile), its Poisson arrivals, its workloads, its command line, and one run
against a real server on the CPU (qwen3-tiny, a handful of short requests at two rates)."""
import argparse
import json
import math

import numpy as np
import pytest

from minillm import bench, bench_serve
from minillm.bench_serve import RequestTrace, itls, latency_percentiles, poisson_arrivals, summarize, tpots, ttfts
from minillm.cli import main as cli_main


# ---- statistics on hand-made traces -----------------------------------------------------------------
def hand_made() -> list[RequestTrace]:
    """Five requests: A four chunks of one token; B two; C a single token; D failed; E a chunk of two
    tokens (four tokens in three chunks). Times in seconds."""
    return [
        RequestTrace(start=0.0, chunk_times=[0.1, 0.2, 0.35, 0.5], end=0.51, prompt_tokens=10, output_tokens=4),
        RequestTrace(start=1.0, chunk_times=[1.3, 1.4], end=1.41, prompt_tokens=20, output_tokens=2),
        RequestTrace(start=2.0, chunk_times=[2.05], end=2.06, prompt_tokens=5, output_tokens=1),
        RequestTrace(start=2.1, prompt_tokens=7, error="HTTP 400: bad request"),
        RequestTrace(start=0.0, chunk_times=[0.2, 0.3, 0.4], end=2.5, prompt_tokens=3, output_tokens=4),
    ]


def test_ttft_tpot_itl_by_their_definitions():
    tr = hand_made()
    # TTFT: first chunk - start, completed requests only (D failed)
    np.testing.assert_allclose(ttfts(tr), [0.1, 0.3, 0.05, 0.2])
    # TPOT: (latency - ttft) / (output tokens - 1); C (one token) has none; E counts tokens, not chunks
    np.testing.assert_allclose(tpots(tr), [(0.5 - 0.1) / 3, (1.4 - 1.3) / 1, (0.4 - 0.2) / 3])
    # ITL: every gap between consecutive chunks, requests pooled in order
    np.testing.assert_allclose(itls(tr), [0.1, 0.15, 0.15, 0.1, 0.1, 0.1])
    assert itls([tr[2], tr[3]]).shape == (0,)


def test_latency_percentiles_exact_and_as_numpy():
    # sorted TTFTs 0.05, 0.1, 0.2, 0.3 s; linear interpolation between order statistics
    s = latency_percentiles(ttfts(hand_made()))
    assert s == pytest.approx({"mean": 162.5, "median": 150.0, "p90": 270.0, "p99": 297.0})
    rng = np.random.default_rng(3)
    v = rng.exponential(0.02, 101)
    s = latency_percentiles(v, percentiles=(50, 90, 99, 99.9))
    assert list(s) == ["mean", "median", "p90", "p99", "p99.9"]
    assert s["mean"] == pytest.approx(v.mean() * 1e3)
    for key, p in (("median", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9)):
        assert s[key] == pytest.approx(np.percentile(v, p) * 1e3)
    assert all(math.isnan(x) for x in latency_percentiles([]).values())  # nothing measured: NaN, no crash


def test_summarize_in_benchmark_serving_shape():
    res = summarize(hand_made(), duration_s=2.5)
    assert (res["completed"], res["failed"], res["duration"]) == (4, 1, 2.5)
    assert (res["total_input_tokens"], res["total_output_tokens"]) == (38, 11)
    assert res["request_throughput"] == pytest.approx(4 / 2.5)
    assert res["output_throughput"] == pytest.approx(11 / 2.5)
    assert res["total_token_throughput"] == pytest.approx((38 + 11) / 2.5)
    assert res["median_ttft_ms"] == pytest.approx(150.0)
    assert res["mean_tpot_ms"] == pytest.approx(np.mean([0.4 / 3, 0.1, 0.2 / 3]) * 1e3)
    assert res["p99_itl_ms"] == pytest.approx(np.percentile([0.1, 0.15, 0.15, 0.1, 0.1, 0.1], 99) * 1e3)
    assert res["median_e2el_ms"] == pytest.approx(np.median([0.5, 0.4, 0.05, 0.4]) * 1e3)
    for x in ("ttft", "tpot", "itl", "e2el"):
        assert {f"{s}_{x}_ms" for s in ("mean", "median", "p90", "p99")} <= set(res)
    assert res["output_lens"] == [4, 2, 1, 4] and res["errors"] == ["HTTP 400: bad request"]
    table = bench_serve.format_run({"request_rate": 2.0, **res})
    assert "Successful requests:" in table and "Median TTFT (ms):" in table and "first error: HTTP 400" in table


# ---- arrivals and workloads -------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.5, 4.0, 100.0])
def test_poisson_arrivals(rate):
    """20,000 exponential gaps: their mean is 1/rate within 3% (the standard error is 0.7%), and about
    1/e of them exceed the mean (an exponential's tail; +-0.02 is six standard errors)."""
    n = 20_001
    t = poisson_arrivals(n, rate, seed=7)
    assert t.shape == (n,) and t[0] == 0.0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert (gaps > 1 / rate).mean() == pytest.approx(math.exp(-1), abs=0.02)
    np.testing.assert_array_equal(t, poisson_arrivals(n, rate, seed=7))  # seeded
    assert not np.array_equal(t, poisson_arrivals(n, rate, seed=8))


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_arrivals_for_burstiness(burstiness):
    """vLLM's --burstiness: 20,000 gamma gaps of shape b keep the mean 1/rate (within 3%) and have a
    coefficient of variation 1/sqrt(b) (within 5%): burstier below 1, more even above."""
    n, rate = 20_001, 4.0
    gaps = np.diff(bench_serve.arrival_times(n, rate, seed=3, burstiness=burstiness))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    np.testing.assert_array_equal(bench_serve.arrival_times(n, rate, seed=3, burstiness=1.0),
                                  poisson_arrivals(n, rate, seed=3))  # 1 is the Poisson process, the same draw


def test_infinite_rate_sends_everything_at_once():
    np.testing.assert_array_equal(poisson_arrivals(5, math.inf), np.zeros(5))
    assert poisson_arrivals(0, 1.0).shape == (0,)


def test_workloads():
    prompts, outs = bench_serve.make_requests("nanovllm", 6, 4, 16, 8, seed=1)
    assert (prompts, outs) == bench.make_workload(6, 4, 16, 8, seed=1)  # nano-vLLM's draw, exactly
    p2, o2 = bench_serve.make_requests("sharegpt-like", 500, 4, 1024, 512, seed=1)
    assert (p2, o2) == bench_serve.make_requests("sharegpt-like", 500, 4, 1024, 512, seed=1)
    lens = np.array([len(p) for p in p2])
    assert lens.min() >= 4 and lens.max() <= 1024 and min(o2) >= 4 and max(o2) <= 512
    assert all(0 <= i <= bench_serve.MAX_TOKEN_ID for p in p2 for i in p)
    # a long tail: the median near SHAREGPT_LIKE's, the mean well above it
    assert 80 < np.median(lens) < 180 and lens.mean() > 1.3 * np.median(lens)
    fresh = bench_serve.fresh_prompts(prompts, 1)
    assert [len(p) for p in fresh] == [len(p) for p in prompts]
    assert all(f[0] != p[0] and f[1:] == p[1:] for f, p in zip(fresh, prompts))


def test_random_workload_lengths_as_vllms_random_dataset():
    # vLLM's RandomDataset: lengths uniform integers in [floor(L(1-r)), ceil(L(1+r))], outputs at least 1
    p_lens, o_lens = bench_serve.random_lengths(4000, 100, 10, 0.25, seed=3)
    assert (min(p_lens), max(p_lens)) == (75, 125) and (min(o_lens), max(o_lens)) == (7, 13)
    assert abs(np.mean(p_lens) - 100) < 1.5  # uniform: centred on L
    assert bench_serve.random_lengths(50, 33, 5, 0.0, seed=1) == ([33] * 50, [5] * 50)  # r = 0: exactly L
    assert min(bench_serve.random_lengths(200, 8, 1, 0.9, seed=1)[1]) == 1  # floor(0.1) = 0 -> 1 token
    prompts, outs = bench_serve.make_requests("random", 20, 4, 16, 8, seed=2, input_len=12, output_len=6,
                                              range_ratio=0.5, prefix_len=40)
    assert (prompts, outs) == bench_serve.random_requests(20, 12, 6, 0.5, 40, seed=2)  # seeded
    assert all(p[:40] == prompts[0][:40] for p in prompts)  # one shared prefix
    assert len({tuple(p[40:]) for p in prompts}) == 20  # each prompt its own tail
    assert [len(p) - 40 for p in prompts] == bench_serve.random_lengths(20, 12, 6, 0.5, seed=2)[0]
    assert all(0 <= i <= bench_serve.MAX_TOKEN_ID for p in prompts for i in p)
    fresh = bench_serve.fresh_prompts(prompts, 1)  # the next rate: a new prefix, still shared
    assert all(f[:40] == fresh[0][:40] != prompts[0][:40] for f in fresh)


# ---- the command line -------------------------------------------------------------------------------
def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_bench_args(p)
    return p.parse_args(list(argv))


def test_serve_is_a_mode_of_bench():
    a = parse("serve", "--base-url", "http://h:1", "--request-rate", "2", "inf", "--num-prompts", "3",
              "--workload", "sharegpt-like", "--json-file", "x.json", "--seed", "5")
    assert a.bench_mode == "serve" and a.base_url == "http://h:1" and a.request_rate == [2.0, math.inf]
    assert (a.num_prompts, a.workload, a.json_file, a.seed) == (3, "sharegpt-like", "x.json", 5)
    assert parse("--device", "cpu").bench_mode is None  # plain `bench` is unchanged
    d = parse("serve", "--port", "8011", "--max-concurrency", "3", "--burstiness", "0.5")
    bench_serve.check_serve_args(d)  # vLLM's: no --base-url is --host (default 127.0.0.1) and --port
    assert (d.base_url, d.max_concurrency, d.burstiness) == ("http://127.0.0.1:8011", 3, 0.5)


def test_vllms_dataset_name_random_and_its_flags():
    a = parse("serve", "--port", "8011", "--dataset-name", "random", "--random-input-len", "64",
              "--random-prefix-len", "32")
    bench_serve.check_serve_args(a)
    assert a.workload == "random" and bench_serve.random_args(a) == dict(input_len=64, output_len=128,
                                                                         range_ratio=0.0, prefix_len=32)
    d = parse("serve", "--workload", "random")
    bench_serve.check_serve_args(d)  # vLLM's defaults
    assert bench_serve.random_args(d) == dict(input_len=1024, output_len=128, range_ratio=0.0, prefix_len=0)
    assert bench_serve.random_args(parse("serve")) == {}


def test_summarize_and_tables_with_vllms_percentile_flags():
    res = summarize(hand_made(), 2.5, percentiles=(25, 50, 99.9), metrics=("ttft", "itl"))
    v = np.array([0.1, 0.3, 0.05, 0.2]) * 1e3  # the completed requests' TTFTs
    assert res["p25_ttft_ms"] == pytest.approx(np.percentile(v, 25))
    assert res["median_ttft_ms"] == pytest.approx(np.percentile(v, 50))
    assert res["p99.9_ttft_ms"] == pytest.approx(np.percentile(v, 99.9))
    assert not any(k.endswith(("tpot_ms", "e2el_ms")) or k.startswith("p90_") for k in res)  # only those asked
    table = bench_serve.format_run({"request_rate": 2.0, **res}, (25, 50, 99.9), ("ttft", "itl"))
    assert "P25 TTFT (ms):" in table and "Median ITL (ms):" in table and "P99.9 ITL (ms):" in table
    assert "TPOT" not in table and "P90" not in table
    summary = bench_serve.format_summary({"model": "m", "base_url": "u", "workload": {"name": "nanovllm"},
                                          "runs": [{"request_rate": 2.0, **res}]}, (25, 50, 99.9), ("ttft", "itl"))
    head, row = summary.splitlines()[1:]
    assert head.split() == ["rate", "done", "req/s", "out", "tok/s", "TTFT", "p25", "p99.9", "ITL", "p25", "p99.9",
                            "(ms)"]
    assert float(row.split()[4]) == pytest.approx(res["p25_ttft_ms"], abs=0.05)


def test_vllms_bench_serve_command_line_runs_here():
    a = parse("serve", "--backend", "vllm", "--endpoint", "/v1/completions", "--served-model-name", "qwen",
              "--model", "/models/qwen3", "--metric-percentiles", "25,50,75,99", "--percentile-metrics",
              "ttft,tpot,itl,e2el", "--ignore-eos", "--save-result", "--result-dir", "out", "--result-filename", "r.json")
    bench_serve.check_serve_args(a)
    assert (a.metric_percentiles, a.percentile_metrics) == ((25.0, 50.0, 75.0, 99.0), bench_serve.METRICS)
    assert (a.served_model_name, a.save_result, a.result_dir, a.result_filename) == ("qwen", True, "out", "r.json")
    d = parse("serve")
    assert (d.metric_percentiles, d.percentile_metrics, d.save_result) == (bench_serve.PERCENTILES, bench_serve.METRICS,
                                                                           False)


@pytest.mark.parametrize("argv, message", [
    (["--endpoint", "/v1/chat/completions"], "sends token-id prompts to /v1/completions only"),
    (["--result-dir", "out"], "--result-dir names where --save-result writes: add --save-result"),
    (["--metric-percentiles", "50,101"], "percentiles lie in [0, 100]"),
    (["--metric-percentiles", "p99"], "not a comma-separated list of percentiles"),
    (["--percentile-metrics", "ttft,goodput"], "unknown metric 'goodput'"),
    (["--backend", "tgi"], "invalid choice: 'tgi'"),
    (["--random-input-len", "8"], "--random-input-len sets the random workload: add --workload random"),
    (["--dataset-name", "random", "--random-range-ratio", "1"], "--random-range-ratio must be in [0, 1)"),
    (["--dataset-name", "random", "--random-input-len", "1", "--random-range-ratio", "0.5"],
     "could draw an empty prompt"),
    (["--dataset-name", "random", "--random-output-len", "0"], "--random-output-len >= 1"),
    (["--dataset-name", "sharegpt"], "invalid choice: 'sharegpt'"),
    (["--request-rate", "0"], "request rate must be > 0"),
    (["--request-rate", "fast"], "not a number"),
    (["--num-prompts", "0"], "--num-prompts must be at least 1"),
    (["--min-len", "8", "--max-output-len", "4"], "--min-len"),
    (["--max-concurrency", "0"], "--max-concurrency must be at least 1"),
    (["--burstiness", "0"], "--burstiness must be a finite number > 0"),
])
def test_bad_serve_arguments_name_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "serve", "--base-url", "http://127.0.0.1:9", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_no_server_says_so(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert e.value.code == 1
    assert "is `python -m minillm serve` running there?" in capsys.readouterr().err


# ---- against a real server --------------------------------------------------------------------------
def test_end_to_end_on_a_cpu_server(tmp_path, capsys):
    """Four short requests at two rates (all at once, then 20/s) against qwen3-tiny, then two of the
    sharegpt-like workload: every request completes with exactly its requested output length (ignore_eos),
    and the JSON holds benchmark_serving's fields with consistent values."""
    from serving_helpers import running_server

    out, out2 = tmp_path / "serve.json", tmp_path / "sharegpt.json"
    lengths = ["--min-len", "4", "--max-input-len", "24", "--max-output-len", "8"]
    with running_server(model="qwen3-tiny") as base:
        cli_main(["bench", "serve", "--base-url", base, "--request-rate", "inf", "20", "--num-prompts", "4",
                  "--seed", "1", "--json-file", str(out), *lengths])
        cli_main(["bench", "serve", "--base-url", base, "--workload", "sharegpt-like", "--num-prompts", "2",
                  "--served-model-name", "qwen3-tiny", "--model", "not-served", "--save-result", "--result-dir",
                  str(tmp_path / "results"), "--result-filename", out2.name, *lengths])
        out2 = tmp_path / "results" / out2.name  # vLLM's --save-result wrote it there
    printed = capsys.readouterr().out
    assert printed.count("Serving Benchmark Result") == 3 and "Median TPOT (ms):" in printed
    res = json.loads(out.read_text())
    prompts, output_lens = bench.make_workload(4, 4, 24, 8, seed=1)
    assert res["model"] == "qwen3-tiny" and res["base_url"] == base
    assert res["workload"]["name"] == "nanovllm" and res["workload"]["output_tokens"] == sum(output_lens)
    assert [r["request_rate"] for r in res["runs"]] == ["inf", 20.0]
    for r in res["runs"]:
        assert (r["completed"], r["failed"], r["errors"]) == (4, 0, [])
        assert r["output_lens"] == r["requested_output_lens"] == output_lens  # ignore_eos: exactly max_tokens
        assert r["input_lens"] == [len(p) for p in prompts]
        assert r["total_output_tokens"] == sum(output_lens)
        assert r["output_throughput"] == pytest.approx(sum(output_lens) / r["duration"])
        assert r["request_throughput"] == pytest.approx(4 / r["duration"])
        assert r["total_token_throughput"] == pytest.approx((sum(output_lens) + r["total_input_tokens"]) / r["duration"])
        for x in ("ttft", "tpot", "itl", "e2el"):
            values = [r[f"{s}_{x}_ms"] for s in ("mean", "median", "p90", "p99")]
            assert all(math.isfinite(v) and v > 0 for v in values), (x, values)
            assert r[f"median_{x}_ms"] <= r[f"p90_{x}_ms"] <= r[f"p99_{x}_ms"]
        assert r["p99_ttft_ms"] <= r["p99_e2el_ms"] and max(r["ttfts"]) * 1e3 <= r["duration"] * 1e3
    res2 = json.loads(out2.read_text())
    assert res2["workload"]["name"] == "sharegpt-like"
    run = res2["runs"][0]
    assert run["completed"] == 2 and run["output_lens"] == run["requested_output_lens"]
    assert all(4 <= n <= 8 for n in run["output_lens"]) and all(4 <= n <= 24 for n in run["input_lens"])


def test_max_concurrency_caps_the_requests_in_flight(capsys):
    """Eight requests at once against qwen3-tiny: without a cap all eight are in flight together; with
    max_concurrency=2 never more than two (a request is in flight from its send to its response's end, as its
    trace records them), and each still completes at its length. The command's table says the cap."""
    import asyncio

    import httpx

    from serving_helpers import running_server

    prompts, output_lens = bench_serve.make_requests("nanovllm", 8, 4, 16, 12, seed=2)

    async def run(base: str, cap: int | None):
        async with httpx.AsyncClient(timeout=60) as client:
            traces, _ = await bench_serve.run_at_rate(client, base + "/v1/completions", "qwen3-tiny", prompts,
                                                      output_lens, math.inf, 0.0, 0, max_concurrency=cap)
        assert [t.output_tokens for t in traces if t.ok] == output_lens
        spans = [(t.start, t.end) for t in traces]
        return max(sum(s <= t0 < e for s, e in spans) for t0, _ in spans)  # the most in flight at one send

    with running_server(model="qwen3-tiny") as base:
        assert asyncio.run(run(base, None)) == 8
        assert asyncio.run(run(base, 2)) == 2
        cli_main(["bench", "serve", "--base-url", base, "--num-prompts", "4", "--max-concurrency", "2", "--min-len",
                  "4", "--max-input-len", "16", "--max-output-len", "8"])
    assert "\nMaximum request concurrency:" + " " * 12 + "2" in capsys.readouterr().out


def test_random_workload_with_a_shared_prefix_hits_the_servers_prefix_cache(tmp_path, capsys):
    """vLLM's random dataset with a 32-token shared prefix (two KV blocks) against qwen3-tiny at two rates:
    every request completes at its drawn length, and every request after each rate's first finds the
    prefix's two blocks in the prefix cache (the rates' prefixes differ: one fresh first token a rate)."""
    from prometheus_client.parser import text_string_to_metric_families

    import httpx
    from serving_helpers import running_server

    def hits(base: str) -> float:
        return next(s.value for f in text_string_to_metric_families(httpx.get(base + "/metrics").text)
                    for s in f.samples if s.name == "minillm_prefix_cache_hits_total")

    out = tmp_path / "random.json"
    with running_server(model="qwen3-tiny") as base:  # its KV blocks hold 16 tokens (small_engine_args)
        before = hits(base)
        cli_main(["bench", "serve", "--base-url", base, "--dataset-name", "random", "--random-input-len", "10",
                  "--random-output-len", "4", "--random-range-ratio", "0.5", "--random-prefix-len", "32",
                  "--num-prompts", "4", "--request-rate", "inf", "20", "--json-file", str(out)])
        after = hits(base)
    res = json.loads(out.read_text())
    prompts, output_lens = bench_serve.random_requests(4, 10, 4, 0.5, 32)
    assert res["workload"]["name"] == "random" and res["workload"]["random_prefix_len"] == 32
    for r in res["runs"]:
        assert (r["completed"], r["failed"]) == (4, 0)
        assert r["output_lens"] == output_lens and r["input_lens"] == [len(p) for p in prompts]
    assert after - before == 2 * 3 * 32  # two rates x three later requests x the prefix's 32 tokens
