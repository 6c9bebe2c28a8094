"""The server's prefix cache from outside: vLLM's prefix_cache_queries / prefix_cache_hits on /metrics,
vLLM's `await engine.reset_prefix_cache()`, with the engine in the server's process and in its own, and
vLLM's POST /reset_prefix_cache."""
import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import one_torch_thread  # noqa: F401 (an autouse fixture)
from minillm import SamplingParams
from minillm.serving.async_engine import EngineError
from serving_helpers import server_handle

pytestmark = pytest.mark.timeout(180)
MODEL = "qwen3-tiny"
BLOCK = 16  # small_engine_args' kvcache_block_size
PROMPT = list(range(10, 10 + 3 * BLOCK + 5))  # three full blocks and a partial one
TIMEOUT = httpx.Timeout(60.0)
LONG_CONTEXT = 2048


def cache_counters(base_url: str) -> tuple[float, float]:
    """(prefix-cache queries, hits) in tokens, from /metrics."""
    values = {s.name: s.value for f in text_string_to_metric_families(httpx.get(base_url + "/metrics").text)
              for s in f.samples}
    return values["minillm_prefix_cache_queries_total"], values["minillm_prefix_cache_hits_total"]


def complete(server, prompt: list[int], max_tokens: int = 2) -> None:
    r = httpx.post(server.base_url + "/v1/completions", json=dict(model=MODEL, prompt=prompt, max_tokens=max_tokens),
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("engine_core", ["thread", "process"])
def test_hits_queries_and_reset_prefix_cache_as_vllm(engine_core):
    with server_handle(MODEL, engine_core=engine_core) as server:
        engine = server.async_llm
        q0, h0 = cache_counters(server.base_url)
        complete(server, PROMPT)
        q1, h1 = cache_counters(server.base_url)
        assert (q1 - q0, h1 - h0) == (len(PROMPT), 0)  # a cold cache: every token looked up, none held
        complete(server, PROMPT)
        q2, h2 = cache_counters(server.base_url)
        assert (q2 - q1, h2 - h1) == (len(PROMPT), 3 * BLOCK)  # the three full blocks come from the cache
        assert asyncio.run(engine.reset_prefix_cache()) is True
        complete(server, PROMPT)
        q3, h3 = cache_counters(server.base_url)
        assert (q3 - q2, h3 - h2) == (len(PROMPT), 0)  # forgotten: computed again

        # while a request holds blocks, nothing changes: False, and the cache still answers
        async def reset_while_running() -> bool:
            stream = engine.add_request(PROMPT, SamplingParams(max_tokens=200, ignore_eos=True))
            try:
                await stream.__anext__()  # it is running
                return await engine.reset_prefix_cache()
            finally:
                stream.abort()

        assert asyncio.run(reset_while_running()) is False
        deadline = time.monotonic() + 20
        while engine.num_running and time.monotonic() < deadline:
            time.sleep(0.01)
        _, h4 = cache_counters(server.base_url)
        complete(server, PROMPT)
        _, h5 = cache_counters(server.base_url)
        assert h5 - h4 == 3 * BLOCK


def test_reset_prefix_cache_after_the_engine_process_stopped_is_an_engine_error():
    with server_handle(MODEL, engine_core="process") as server:
        server.async_llm.shutdown()
        with pytest.raises(EngineError, match="not running"):
            asyncio.run(server.async_llm.reset_prefix_cache())


def test_post_reset_prefix_cache_as_vllm_and_its_errors():
    key = "k3y"
    auth = {"Authorization": f"Bearer {key}"}
    # a context long enough that the streamed request below runs for seconds after its first chunk
    with server_handle(MODEL, api_key=key, max_model_len=LONG_CONTEXT) as server:
        url = server.base_url + "/reset_prefix_cache"

        def complete_with_key():
            r = httpx.post(server.base_url + "/v1/completions", headers=auth, timeout=TIMEOUT,
                           json=dict(model=MODEL, prompt=PROMPT, max_tokens=2))
            assert r.status_code == 200, r.text

        complete_with_key()
        complete_with_key()
        _, h0 = cache_counters(server.base_url)
        r = httpx.post(url, headers=auth)
        assert (r.status_code, r.content) == (200, b"")  # vLLM's answer: 200, no body
        complete_with_key()
        _, h1 = cache_counters(server.base_url)
        assert h1 == h0  # the prompt found nothing cached after the reset
        complete_with_key()
        _, h2 = cache_counters(server.base_url)
        assert h2 - h1 == 3 * BLOCK  # and the cache works again

        r = httpx.post(url)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        for query, param in (("reset_running_requests=true", "reset_running_requests"),
                             ("reset_external=maybe", "reset_external")):
            r = httpx.post(f"{url}?{query}", headers=auth)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert httpx.post(f"{url}?reset_external=true&reset_running_requests=false", headers=auth).status_code == 200

        # while a request holds blocks: 409, nothing forgotten
        body = dict(model=MODEL, prompt=PROMPT, max_tokens=LONG_CONTEXT - len(PROMPT), ignore_eos=True, stream=True)
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, headers=auth,
                          timeout=TIMEOUT) as stream:
            lines = stream.iter_lines()  # kept: a generator dropped unfinished closes the connection (an abort)
            next(lines)  # its first chunk: it is running
            r = httpx.post(url, headers=auth)
        error = r.json()["error"]
        assert r.status_code == 409 and error["type"] == "conflict_error", r.text
        assert "hold KV-cache blocks" in error["message"] and "call again" in error["message"]
        deadline = time.monotonic() + 20
        while server.async_llm.num_running and time.monotonic() < deadline:  # the closed stream's abort lands
            time.sleep(0.01)
        _, h3 = cache_counters(server.base_url)
        complete_with_key()
        _, h4 = cache_counters(server.base_url)
        assert h4 - h3 == 3 * BLOCK
