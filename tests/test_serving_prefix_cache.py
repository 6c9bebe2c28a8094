"""The server's prefix cache from outside: vLLM's prefix_cache_queries / prefix_cache_hits on /metrics, and
vLLM's `await engine.reset_prefix_cache()`, with the engine in the server's process and in its own."""
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
