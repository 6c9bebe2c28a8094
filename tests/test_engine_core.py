"""serve's default: the engine in a process of its own (minillm/serving/engine_core.py), qwen3-tiny on the CPU.

The request side (checks, admission, streams) is the code AsyncLLM uses, white-box tested in
tests/test_serving.py. These tests check what crosses the pipe and the process's life: served answers
equal offline generate (the openai client, n samples, logprobs, 64 concurrent streams), a disconnect
frees blocks (seen on /metrics, which the API process loads from the engine's), a dead engine process
fails its requests and the server says so, and shutdown ends the process.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

import test_serving as served
from test_serving import client, offline  # noqa: F401 (fixtures: client reads this module's server)
from helpers import one_torch_thread, small_engine_args  # noqa: F401 (one_torch_thread: an autouse fixture)
from minillm import LLM, SamplingParams
from minillm.serving.async_engine import EngineError
from serving_helpers import engine_client, server_handle

pytestmark = pytest.mark.timeout(180)
MODEL, ARGS, TIMEOUT = served.MODEL, served.ARGS, served.TIMEOUT


@pytest.fixture(scope="module")
def server():
    with server_handle(MODEL, engine_core="process", **ARGS) as handle:
        yield handle


def test_the_engine_runs_in_another_process(server):
    proc = server.async_llm._proc
    assert proc.is_alive() and proc.pid != __import__("os").getpid()
    assert not hasattr(server.async_llm, "engine")  # nothing of the engine lives in the API process


# the black-box tests of tests/test_serving.py, against this server
def test_completions_equal_offline_generate(client, offline):
    served.test_completions_equal_offline_generate(client, offline)


def test_streaming_completions_join_to_the_offline_text(client, offline):
    served.test_streaming_completions_join_to_the_offline_text(client, offline)


def test_chat_non_streaming_and_streaming(client, offline):
    served.test_chat_non_streaming_and_streaming(client, offline)


def test_n_samples_and_logprobs(client, offline):
    served.test_n_samples_and_logprobs(client, offline)


def test_a_list_of_prompts_is_one_request_each(server, client, offline):
    served.test_a_list_of_prompts_is_one_request_each(server, client, offline)


def test_64_concurrent_streaming_clients_get_their_offline_tokens(server, offline):
    served.test_64_concurrent_streaming_clients_get_their_offline_tokens(server, offline)


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server):
    served.test_a_client_that_disconnects_mid_stream_frees_its_blocks(server)


def test_metrics_parse_and_move(server, client):
    served.test_metrics_parse_and_move(server, client)


def test_generate_takes_vllms_keyword_names_and_positions(server, offline):
    """AsyncLLM.generate(prompt, sampling_params, request_id), vLLM's names, by keyword and by position."""
    params = SamplingParams(max_tokens=6, temperature=0.0)

    async def last(*args, **kwargs):
        async for out in server.async_llm.generate(*args, **kwargs):
            pass  # the last output holds every token (vLLM's CUMULATIVE kind)
        return out

    by_name = asyncio.run(last(prompt=served.PROMPTS[3], sampling_params=params, request_id="by-name"))
    by_place = asyncio.run(last(served.PROMPTS[3], params, "by-place"))
    want = offline.generate(served.PROMPTS[3], params, use_tqdm=False)[0].outputs[0].token_ids
    assert by_name.request_id == "by-name" and by_place.request_id == "by-place"
    assert by_name.outputs[0].token_ids == by_place.outputs[0].token_ids == want


def test_abort_is_vllms_coroutine_for_one_id_or_several(server):
    served.test_abort_is_vllms_coroutine_for_one_id_or_several(server)


def test_a_refused_list_queues_none_of_its_prompts(server, monkeypatch):
    served.test_a_refused_list_queues_none_of_its_prompts(server, monkeypatch)


def test_an_explicit_max_tokens_the_context_cannot_hold_is_a_400(server):
    served.test_an_explicit_max_tokens_the_context_cannot_hold_is_a_400(server)


def test_choices_carry_stop_reason_and_leave_a_stop_tokens_text_out(server, offline):
    served.test_choices_carry_stop_reason_and_leave_a_stop_tokens_text_out(server, offline)


@pytest.mark.parametrize("path, body, status, phrase, param", served.BAD, ids=served.BAD_IDS)
def test_bad_requests_get_an_openai_error_and_the_server_goes_on(server, path, body, status, phrase, param):
    served.test_bad_requests_get_an_openai_error_and_the_server_goes_on(server, path, body, status, phrase, param)


# ---- the process's life ----------------------------------------------------------------------------
def test_a_dead_engine_process_fails_its_requests_and_the_server_says_so():
    with server_handle(MODEL, engine_core="process", **ARGS) as s, httpx.Client(base_url=s.base_url,
                                                                                  timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=dict(model=MODEL, prompt=served.PROMPTS[3], max_tokens=480,
                                                           ignore_eos=True, stream=True)) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            assert "error" not in next(lines)  # it is running
            s.async_llm._proc.kill()
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2][len("data: "):])["error"]
        assert "the engine stopped before this request finished" in error["message"], rest[-2]
        served.wait_for(lambda: c.get("/health").status_code == 503, "/health to say the engine is down")
        r = c.post("/v1/completions", json=dict(model=MODEL, prompt="Hi", max_tokens=2))
        assert r.status_code == 503 and "not running" in r.json()["error"]["message"]


def test_shutdown_fails_requests_in_flight_and_ends_the_engine_process():
    llm = engine_client(MODEL, "process", **ARGS)

    async def run():
        stream = llm.add_request(served.PROMPTS[4], SamplingParams(max_tokens=400, ignore_eos=True))
        first = await asyncio.wait_for(stream.__anext__(), 30)
        assert first.outputs and not first.finished
        llm.shutdown()
        with pytest.raises(EngineError, match="the engine stopped before this request finished|shutting down"):
            async for _ in stream:
                pass
        with pytest.raises(EngineError, match="not running"):
            llm.add_request("Hi", SamplingParams(max_tokens=2))

    asyncio.run(run())
    assert llm._proc.exitcode == 0 and not llm.is_running
    llm.shutdown()  # again: a no-op


def test_an_engine_that_cannot_load_is_a_one_line_error():
    from minillm.serving.engine_core import EngineCoreClient
    with pytest.raises(ValueError, match="no-such-model"):
        EngineCoreClient("no-such-model", {"device": "cpu"})
    p = subprocess.run([sys.executable, "-m", "minillm", "serve", "--model", "no-such-model", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "no-such-model" in p.stderr


def test_tensor_parallel_workers_start_from_the_engine_process(offline):
    """TP=2 over gloo: the engine process (not a daemon) starts its own worker; greedy tokens equal TP=1's."""
    llm = engine_client(MODEL, "process", tensor_parallel_size=2, **ARGS)

    async def tokens() -> list[int]:
        async for out in llm.generate(served.PROMPTS[7], SamplingParams(max_tokens=8, temperature=0.0)):
            pass  # each output holds everything so far (vLLM's CUMULATIVE kind): the last is the answer
        return out.outputs[0].token_ids

    try:
        got = asyncio.run(tokens())
    finally:
        llm.shutdown()
    want = offline.generate(served.PROMPTS[7], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    assert got == want.outputs[0].token_ids
    assert llm._proc.exitcode == 0


@pytest.mark.gpu
def test_on_cuda_the_engine_process_holds_the_gpu_and_gives_it_back():
    """The engine process builds qwen3-0.6b-random on CUDA (graphs on); this process never touches the
    device but to read its free memory. Served greedy tokens equal an offline engine's; after shutdown
    the memory is back and the process has exited 0."""
    import torch
    gib = 1 << 30
    free = lambda: torch.cuda.mem_get_info()[0] / gib  # noqa: E731
    gpu_args = dict(device="cuda", max_model_len=2048, max_num_seqs=32)
    start = free()
    from minillm.serving.engine_core import EngineCoreClient
    llm = EngineCoreClient("qwen3-0.6b-random", gpu_args)
    used = start - free()

    async def tokens(prompt: str) -> list[int]:
        async for out in llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)):
            pass  # the last output holds every token (vLLM's CUMULATIVE kind)
        return out.outputs[0].token_ids

    async def one_at_a_time():  # each alone in its batch, as offline below: bf16 results depend on the batch
        return [await tokens(p) for p in ("Hello", "The capital of France is")]

    try:
        got = asyncio.run(one_at_a_time())
    finally:
        llm.shutdown()
    assert llm._proc.exitcode == 0
    assert used > 10, f"the engine process held only {used:.1f} GiB: did it size its KV cache from the device?"
    assert free() > start - 1.0, f"after shutdown {start - free():.2f} GiB are still held"
    engine = LLM("qwen3-0.6b-random", **gpu_args)
    try:
        want = [engine.generate(p, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
                                 use_tqdm=False)[0].outputs[0].token_ids for p in ("Hello", "The capital of France is")]
    finally:
        engine.shutdown()
    assert got == want
