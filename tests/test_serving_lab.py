"""minillm/course/serving_lab.py, notebook 06's servers: a `python -m minillm serve` subprocess that is up
when start() returns, says why when it cannot start, and is gone after stop(); /metrics parsed."""
from __future__ import annotations

import asyncio
import os
import socket
import sys

import httpx
import pytest

from minillm.course.serving_lab import Server, parse_metrics, read_metrics, sample_in_system

pytestmark = pytest.mark.timeout(120)


def test_parse_metrics_reads_samples_and_skips_comments():
    text = ("# HELP minillm_num_requests_running Requests.\n# TYPE minillm_num_requests_running gauge\n"
            "minillm_num_requests_running 3\n"
            'minillm_request_success_total{finished_reason="abort"} 2\n'
            "minillm_kv_cache_usage_perc 0.25\n")
    assert parse_metrics(text) == {"minillm_num_requests_running": 3.0,
                                   'minillm_request_success_total{finished_reason="abort"}': 2.0,
                                   "minillm_kv_cache_usage_perc": 0.25}


def test_a_server_that_cannot_start_says_why():
    srv = Server("no-such-model", "--device", "cpu")
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 2 .*error: .*no-such-model"):
        srv.start()
    assert not os.path.exists(srv.log_path), "the failed server's log file was left behind"


def test_start_serves_and_stop_ends_the_process():
    srv = Server("qwen3-tiny", "--device", "cpu", "--max-num-seqs", "2", "--max-model-len", "256")
    assert srv.command[:4] == [sys.executable, "-m", "minillm", "serve"]
    with srv:
        health = httpx.get(srv.url + "/health", timeout=10)
        assert (health.status_code, health.content) == (200, b"")
        m = read_metrics(srv.url)
        assert m["minillm_num_requests_running"] == 0 and m["minillm_kv_cache_total_blocks"] >= 1

        async def watch():
            stop = asyncio.Event()
            async with httpx.AsyncClient(timeout=10) as client:
                task = asyncio.create_task(sample_in_system(client, srv.url, stop, period_s=0.01))
                await asyncio.sleep(0.1)
                stop.set()
                return await task
        samples = asyncio.run(watch())
        assert samples and all(run == 0 and wait == 0 for _, run, wait in samples)
    assert srv.proc.poll() is not None, "the server still runs after the block"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", srv.port)) != 0, "the port still accepts connections"
    assert srv.stop() == srv.proc.returncode  # idempotent
    # the log outlives the file: stop() kept its text and deleted it (a notebook run leaves no file)
    assert not os.path.exists(srv.log_path) and "GET /health" in srv.log_tail(10**6)


def test_use_my_code_starts_the_server_through_swap_in():
    cmd = Server("qwen3-tiny", "--device", "cpu", use_my_code=True).command
    assert cmd[:2] == [sys.executable, "-c"] and "swap_in('exercises', chapters={6})" in cmd[2]
    assert cmd[3:6] == ["serve", "--model", "qwen3-tiny"]
