"""The serving layer (issue: async engine + OpenAI-compatible server), against qwen3-tiny on the CPU.

A real uvicorn server runs in a background thread (tests/serving_helpers.py); clients are the
official `openai` package and httpx. Every wait is bounded; nothing sleeps to synchronize: a test that
needs requests to be waiting holds the engine's lock (the engine thread then cannot schedule them),
and a test that needs a state (blocks freed) polls /metrics for it with a deadline.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import one_torch_thread, small_engine_args  # noqa: F401 (one_torch_thread: an autouse fixture)
from minillm import LLM, RequestOutputKind, SamplingParams
from serving_helpers import running_server, serve_process, server_handle

pytestmark = pytest.mark.timeout(180)
MODEL = "qwen3-tiny"
ARGS = dict(max_num_seqs=16, max_model_len=512)
TIMEOUT = httpx.Timeout(60.0)
PROMPTS = [f"Request {i}: tell me about the number {i * 7}." for i in range(64)]




@pytest.fixture(scope="module")
def server():
    with server_handle(MODEL, **ARGS) as handle:
        yield handle


@pytest.fixture(scope="module")
def offline():
    """The same model and engine arguments, run offline: what every served answer must equal."""
    llm = LLM(MODEL, **small_engine_args(**ARGS))
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=60, max_retries=0)


def offline_texts(llm, prompts, params_list) -> list[str]:
    return [o.outputs[0].text for o in llm.generate(prompts, params_list, use_tqdm=False)]


def params_for(llm, **changes) -> SamplingParams:
    import dataclasses
    return dataclasses.replace(llm.get_default_sampling_params(), **changes)


def metrics(base_url: str) -> dict[str, float]:
    """/metrics parsed as Prometheus text: {sample name with labels: value}."""
    text = httpx.get(base_url + "/metrics", timeout=TIMEOUT).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def wait_for(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def good_request(base_url: str) -> None:
    r = httpx.post(base_url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def sse_events(response) -> list:
    """The data of each server-sent event, JSON-decoded ([DONE] kept as the string)."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ---- the OpenAI client ----------------------------------------------------------------------------
def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server.base_url + "/health", timeout=TIMEOUT)
    assert (health.status_code, health.content) == (200, b"")  # vLLM's answer: an empty body


def test_completions_equal_offline_generate(client, offline):
    prompt = PROMPTS[0]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    want = offline.generate(prompt, params_for(offline, temperature=0.0, max_tokens=12), use_tqdm=False)[0]
    assert r.choices[0].text == want.outputs[0].text
    assert r.choices[0].finish_reason == want.outputs[0].finish_reason
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert r.usage.completion_tokens == len(want.outputs[0].token_ids)
    ids = offline.tokenizer.encode(prompt)  # a token-id prompt gives the same answer
    r2 = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert r2.choices[0].text == r.choices[0].text


def test_streaming_completions_join_to_the_offline_text(client, offline):
    params = dict(max_tokens=10, temperature=0.8, seed=7, stop=["e"])
    want = offline.generate(PROMPTS[1], params_for(offline, **params), use_tqdm=False)[0].outputs[0]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[1], stream=True, **params))
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_chat_non_streaming_and_streaming(client, offline):
    messages = [{"role": "user", "content": "Name three colors."}]
    want = offline.chat(messages, params_for(offline, temperature=0.0, max_tokens=12))[0].outputs[0]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                       logprobs=True, top_logprobs=3)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == want.finish_reason
    content = r.choices[0].logprobs.content
    assert len(content) == len(want.token_ids) and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob  # most likely first
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_n_samples_and_logprobs(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=6, temperature=1.0, seed=3, n=3,
                                  logprobs=2)
    want = offline.generate(PROMPTS[2], params_for(offline, max_tokens=6, temperature=1.0, seed=3, n=3, logprobs=2),
                            use_tqdm=False)[0]
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [c.text for c in want.outputs]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(want.outputs[0].token_ids) and all(len(t) <= 3 for t in lp.top_logprobs)
    assert all(token in top for token, top in zip(lp.tokens, lp.top_logprobs))  # the top 2 and the sampled one
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in want.outputs)


def test_completion_logprobs_hold_the_sampled_token_beside_the_top_k(server, offline):
    """Legacy completions' top_logprobs: the k most likely tokens "as well the chosen tokens" (OpenAI), so
    k + 1 entries where the sampled token is not among the k, and the sampled token alone for logprobs=0,
    as vLLM fills them; the values are offline generate's."""
    body = dict(prompt=PROMPTS[9], max_tokens=8, temperature=1.0, seed=5)
    for k in (0, 2):
        want = offline.generate(PROMPTS[9], params_for(offline, max_tokens=8, temperature=1.0, seed=5, logprobs=k),
                                use_tqdm=False)[0].outputs[0]
        r = httpx.post(f"{server.base_url}/v1/completions", json={**body, "logprobs": k}, timeout=TIMEOUT)
        lp = r.json()["choices"][0]["logprobs"]
        assert len(lp["top_logprobs"]) == len(want.token_ids) == 8, r.text
        outside = 0
        for top, t, position in zip(lp["top_logprobs"], want.token_ids, want.logprobs):
            expected = {lp_.decoded_token: lp_.logprob for tid, lp_ in position.items() if tid == t or lp_.rank <= k}
            assert top.keys() == expected.keys() and all(abs(top[key] - expected[key]) < 1e-5 for key in top)
            outside += position[t].rank > k
        assert outside > 0  # the case that needs the extra entry happened (a random tiny model, temperature 1)


def test_allowed_token_ids_as_vllm_takes_them(server, offline):
    """vLLM's allowed_token_ids in a request body: the tokens offline generate gives with the same list."""
    allowed = offline.tokenizer.encode(" one two three four")
    body = dict(prompt=PROMPTS[5], max_tokens=8, temperature=0.0, ignore_eos=True, allowed_token_ids=allowed)
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=TIMEOUT)
    want = offline.generate(PROMPTS[5], params_for(offline, max_tokens=8, temperature=0.0, ignore_eos=True,
                                                   allowed_token_ids=allowed), use_tqdm=False)[0].outputs[0]
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.text, r.text
    assert set(want.token_ids) <= set(allowed)
    r = httpx.post(f"{server.base_url}/v1/completions", json={**body, "allowed_token_ids": []}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "allowed_token_ids", r.text


def test_bad_words_and_truncate_prompt_tokens_as_vllm_takes_them(server, client, offline):
    """vLLM's bad_words and truncate_prompt_tokens through the openai client's extra_body, completions and
    chat: offline generate's text with the same fields; usage counts the kept prompt tokens, and -1 lets
    a prompt longer than the context run."""
    greedy = dict(max_tokens=8, temperature=0.0)
    free = offline.generate(PROMPTS[2], params_for(offline, **greedy, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    word = offline.tokenizer.decode(free.token_ids[2:4])  # two tokens the unconstrained answer holds
    for extra in ({"bad_words": [word]}, {"bad_words": [word], "truncate_prompt_tokens": 5}):
        want = offline.generate(PROMPTS[2], params_for(offline, **greedy, ignore_eos=True, **extra),
                                use_tqdm=False)[0]
        r = client.completions.create(model=MODEL, prompt=PROMPTS[2], **greedy, extra_body={"ignore_eos": True,
                                                                                               **extra})
        assert r.choices[0].text == want.outputs[0].text != free.text
        assert r.usage.prompt_tokens == len(want.prompt_token_ids) == extra.get("truncate_prompt_tokens",
                                                                                len(offline.tokenizer.encode(PROMPTS[2])))
    messages = [{"role": "user", "content": "Name three colors."}]
    extra = {"bad_words": [word], "truncate_prompt_tokens": 6}
    want = offline.chat(messages, params_for(offline, **greedy, ignore_eos=True, **extra))[0]
    r = client.chat.completions.create(model=MODEL, messages=messages, **greedy,
                                       extra_body={"ignore_eos": True, **extra})
    assert r.choices[0].message.content == want.outputs[0].text and r.usage.prompt_tokens == 6
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": OVER, "truncate_prompt_tokens": -1, **greedy},
                   timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == ARGS["max_model_len"] - 8, r.text


def test_skip_special_tokens_as_vllm_takes_it(server, client, offline):
    """vLLM's skip_special_tokens in extra_body: false keeps the special tokens' text, in the text and in
    its stream, as offline generate gives it with the same field; the default leaves it out."""
    im_end = offline.tokenizer.encode("<|im_end|>", add_special_tokens=False)
    fields = dict(ignore_eos=True, allowed_token_ids=im_end + offline.tokenizer.encode(" cat dog"))
    sampled = dict(max_tokens=12, temperature=1.0, seed=3)
    for skip in (True, False):
        want = offline.generate(PROMPTS[4], params_for(offline, **sampled, **fields, skip_special_tokens=skip),
                                use_tqdm=False)[0].outputs[0]
        assert ("<|im_end|>" in want.text) == (not skip) and want.text.strip()  # both kinds of token came
        extra = {**fields, "skip_special_tokens": skip}
        r = client.completions.create(model=MODEL, prompt=PROMPTS[4], **sampled, extra_body=extra)
        assert r.choices[0].text == want.text
        stream = client.completions.create(model=MODEL, prompt=PROMPTS[4], **sampled, extra_body=extra, stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == want.text


def test_chat_template_options_as_vllm_takes_them(server, offline):
    """chat_template_kwargs, add_generation_prompt and continue_final_message render the prompt as
    LLM.chat renders it with the same options (the prompt's length and the greedy reply agree)."""
    messages = [{"role": "user", "content": "Name three colors."}, {"role": "assistant", "content": "Red, green"}]
    greedy = dict(max_tokens=6, temperature=0.0, ignore_eos=True)
    lengths = set()
    for options in ({}, dict(add_generation_prompt=False, continue_final_message=True),
                    dict(chat_template_kwargs={"enable_thinking": False})):
        want = offline.chat(messages, params_for(offline, **greedy), **options)[0]
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"messages": messages, **greedy, **options},
                       timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(want.prompt_token_ids), options
        assert r.json()["choices"][0]["message"]["content"] == want.outputs[0].text, options
        lengths.add(len(want.prompt_token_ids))
    assert len(lengths) == 2  # continuing the last message leaves the new turn's header out


def test_chat_without_max_tokens_runs_to_the_context_as_vllm_chat_does(server):
    """A chat request that leaves max_tokens out runs until EOS or max_model_len (vLLM's chat default;
    this model's generation_config sets no max_new_tokens); a completion takes SamplingParams' 64."""
    url, limit = server.base_url + "/v1", ARGS["max_model_len"]
    r = httpx.post(url + "/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                    "ignore_eos": True, "temperature": 0.0}, timeout=TIMEOUT)
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == limit - usage["prompt_tokens"], r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = httpx.post(url + "/completions", json={"prompt": "Hi", "ignore_eos": True, "temperature": 0.0},
                   timeout=TIMEOUT)
    assert r.json()["usage"]["completion_tokens"] == SamplingParams().max_tokens == 64, r.text


def test_a_list_of_prompts_is_one_request_each(server, client, offline):
    """OpenAI's completions take a list of prompts (strings or token-id lists): prompt p's samples are
    choices p * n .. p * n + n - 1, each equal to that prompt's own offline request."""
    prompts = [PROMPTS[3], offline.tokenizer.encode(PROMPTS[4]), PROMPTS[5]]
    params = dict(max_tokens=6, temperature=1.0, seed=11, n=2)
    want = [offline.generate(p, params_for(offline, **params), use_tqdm=False)[0] for p in prompts]
    r = client.completions.create(model=MODEL, prompt=prompts, **params)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == [o.text for w in want for o in w.outputs]
    assert r.usage.prompt_tokens == sum(len(w.prompt_token_ids) for w in want)
    assert r.usage.completion_tokens == sum(len(o.token_ids) for w in want for o in w.outputs)
    chunks = list(client.completions.create(model=MODEL, prompt=prompts, stream=True,
                                            stream_options={"include_usage": True}, **params))
    texts, finished = {}, {}
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            finished[c.index] = c.finish_reason
    assert [texts[i] for i in range(6)] == [c.text for c in r.choices]
    assert [finished[i] for i in range(6)] == [c.finish_reason for c in r.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # a refused prompt refuses the whole list: the prompts before it are not left running
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": [PROMPTS[6], "", PROMPTS[7]],
                                                              "max_tokens": 64}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt 1: "), r.text
    wait_for(lambda: metrics(server.base_url)["minillm_num_requests_running"] == 0
             and metrics(server.base_url)["minillm_num_requests_waiting"] == 0, "no request left in the engine")


# ---- many clients at once ------------------------------------------------------------------------
def test_64_concurrent_streaming_clients_get_their_offline_tokens(server, offline):
    """Continuous batching across clients: each answer equals LLM.generate's (greedy or seeded)."""
    def body(i):
        return dict(model=MODEL, prompt=PROMPTS[i], max_tokens=8, stream=True,
                    **(dict(temperature=0.0) if i % 2 else dict(temperature=1.0, seed=100 + i)))

    async def one(client, i) -> tuple[str, str | None, bool]:
        async with client.stream("POST", "/v1/completions", json=body(i)) as r:
            assert r.status_code == 200
            text, reason, done = [], None, False
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    choice = json.loads(line[6:])["choices"][0]
                    text.append(choice["text"])
                    reason = choice["finish_reason"] or reason
            return "".join(text), reason, done

    async def all_clients():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=TIMEOUT, limits=limits) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, i) for i in range(64))), 120)

    got = asyncio.run(all_clients())
    params = [params_for(offline, **{k: v for k, v in body(i).items() if k not in ("model", "prompt", "stream")})
              for i in range(64)]
    want = offline.generate(PROMPTS, params, use_tqdm=False)
    assert all(done for _, _, done in got)
    assert [t for t, _, _ in got] == [o.outputs[0].text for o in want]
    assert [r for _, r, _ in got] == [o.outputs[0].finish_reason for o in want]
    m = wait_for(lambda: (lambda m: m if m["minillm_num_requests_running"] == 0 else None)(metrics(server.base_url)),
                 "every request to finish")
    assert m["minillm_kv_cache_usage_perc"] == 0.0


# ---- disconnects, backpressure, engine errors ------------------------------------------------------
def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server):
    total = metrics(server.base_url)["minillm_kv_cache_total_blocks"]
    before = metrics(server.base_url)
    with httpx.Client(base_url=server.base_url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=dict(model=MODEL, prompt=PROMPTS[3], max_tokens=480,
                                                           ignore_eos=True, stream=True)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # it is running
            assert metrics(server.base_url)["minillm_kv_cache_free_blocks"] < total
        # leaving the block closes the connection mid-stream
    m = wait_for(lambda: (lambda m: m if m["minillm_kv_cache_free_blocks"] == total
                          and m["minillm_num_requests_running"] == 0 else None)(metrics(server.base_url)),
                 "the aborted request's blocks to be freed")
    key = 'minillm_request_success_total{finished_reason="abort"}'
    assert m[key] == before[key] + 1
    assert m["minillm_generation_tokens_total"] - before["minillm_generation_tokens_total"] < 480
    good_request(server.base_url)


def test_a_non_streaming_client_that_disconnects_aborts_its_request(server):
    """The server watches for the disconnect while it waits for the answer; the engine is held meanwhile,
    so the request cannot finish first."""
    async_llm = server.async_llm
    total = metrics(server.base_url)["minillm_kv_cache_total_blocks"]
    before = metrics(server.base_url)
    body = json.dumps(dict(model=MODEL, prompt=PROMPTS[6], max_tokens=480, ignore_eos=True)).encode()
    host, port = server.base_url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_for(lambda: async_llm.num_running == 1, "the request to start")
        with engine_held(async_llm):
            sock.close()
            wait_for(lambda: any(r.aborted for r in list(async_llm._book.requests.values())), "the server to abort it")
    m = wait_for(lambda: (lambda m: m if m["minillm_kv_cache_free_blocks"] == total
                          and m["minillm_num_requests_running"] == 0 else None)(metrics(server.base_url)),
                 "the aborted request's blocks to be freed")
    key = 'minillm_request_success_total{finished_reason="abort"}'
    assert m[key] == before[key] + 1
    assert m["minillm_generation_tokens_total"] - before["minillm_generation_tokens_total"] < 480
    good_request(server.base_url)


def test_abort_frees_blocks_before_the_next_step(server):
    """AsyncLLM.abort: at most the step already under way (and the one that reads it back) runs after it."""
    engine, async_llm = server.async_llm.engine, server.async_llm
    steps = []
    real_step = engine.step

    def counting_step():
        steps.append(1)
        return real_step()

    async def run():
        stream = async_llm.add_request(PROMPTS[4], SamplingParams(max_tokens=400, ignore_eos=True))
        first = await asyncio.wait_for(stream.__anext__(), 30)
        assert first.outputs and not first.finished
        at_abort = len(steps)
        stream.abort()
        outs = [out async for out in stream]
        assert outs[-1].finished and outs[-1].outputs[-1].finish_reason == "abort"
        return len(steps) - at_abort

    engine.step = counting_step
    try:
        after = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        del engine.step
    assert after <= 2
    bm = engine.scheduler.block_manager
    assert bm.num_free_blocks == len(bm.blocks)


def test_abort_is_vllms_coroutine_for_one_id_or_several(server):
    """`await async_llm.abort(request_id)` as vLLM's AsyncLLM takes it: one id or an iterable of them; each
    request ends with finish_reason "abort", and an unknown or finished id is a no-op."""
    import inspect
    async_llm = server.async_llm
    assert inspect.iscoroutinefunction(async_llm.abort)
    params = SamplingParams(max_tokens=400, ignore_eos=True)

    async def run():
        streams = {rid: async_llm.add_request(PROMPTS[i], params, rid) for i, rid in enumerate(("one", "two", "three"))}
        for stream in streams.values():  # every one is running
            assert not (await asyncio.wait_for(stream.__anext__(), 30)).finished
        await async_llm.abort("one")
        await async_llm.abort(rid for rid in ("two", "three", "no-such-request"))
        ends = {rid: [out async for out in stream][-1] for rid, stream in streams.items()}
        await async_llm.abort("one")  # finished: nothing to do
        return ends

    ends = asyncio.run(asyncio.wait_for(run(), 60))
    for rid, out in ends.items():
        assert out.finished and out.outputs[0].finish_reason == "abort", rid
        assert len(out.outputs[0].token_ids) < 400, rid
    good_request(server.base_url)


def test_a_request_arrives_when_accepted_not_when_the_engine_thread_takes_it():
    """RequestOutput.metrics.arrival_time is vLLM's: when add_request accepted the request. A request
    accepted while the engine thread is busy waits for its next turn, and that wait counts before
    first_scheduled_time (notebook 06, section 2 reads it so)."""
    from minillm.serving.async_engine import AsyncLLM
    async_llm, busy_s = AsyncLLM(LLM(MODEL, **small_engine_args(**ARGS))), 0.2
    admit = async_llm._admit

    def busy_admit(reqs):
        time.sleep(busy_s)  # the engine thread is still in its previous step
        admit(reqs)

    async_llm._admit = busy_admit

    async def run():
        return [o async for o in async_llm.generate(PROMPTS[0], SamplingParams(max_tokens=2))][-1].metrics

    try:
        m = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        async_llm.shutdown()
    assert m.first_scheduled_time - m.arrival_time >= busy_s
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time


@pytest.mark.parametrize("static", [False, True], ids=["continuous", "static"])
def test_static_batching_admits_a_request_only_after_the_batch_has_finished(static):
    """Continuous batching: a short request that arrives while a long one runs joins it and finishes
    first. Static batching (serve --batching static): it waits until the long one has finished."""
    from minillm.serving.async_engine import AsyncLLM
    async_llm = AsyncLLM(LLM(MODEL, **small_engine_args(**ARGS)), static_batching=static)

    async def run():
        long = async_llm.add_request(PROMPTS[0], SamplingParams(max_tokens=60, ignore_eos=True))
        assert (await asyncio.wait_for(long.__anext__(), 30)).outputs  # the long request is running
        short = async_llm.add_request(PROMPTS[1], SamplingParams(max_tokens=4, ignore_eos=True))
        long_outs, short_outs = [o async for o in long], [o async for o in short]
        return long_outs[-1].metrics, short_outs[-1].metrics

    try:
        long_m, short_m = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        async_llm.shutdown()
    if static:
        assert short_m.first_scheduled_time >= long_m.finished_time
    else:
        assert short_m.first_scheduled_time < long_m.finished_time and short_m.finished_time < long_m.finished_time


def test_output_kind_cumulative_delta_and_final_only_as_vllm(offline):
    """vLLM's RequestOutputKind on AsyncLLM.generate, two samples (n=2): CUMULATIVE (the default) yields the
    whole output so far each time, every one extending the one before and the last equal to offline
    generate's; DELTA yields the new parts, which join to it; FINAL_ONLY yields it once."""
    from minillm.serving.async_engine import AsyncLLM
    async_llm = AsyncLLM(LLM(MODEL, **small_engine_args(**ARGS)))
    base = params_for(offline, max_tokens=12, temperature=1.0, seed=7, n=2, ignore_eos=True, logprobs=1)
    want = offline.generate(PROMPTS[6], base, use_tqdm=False)[0].outputs

    async def outputs(kind):
        return [out async for out in async_llm.generate(PROMPTS[6], dataclasses.replace(base, output_kind=kind))]

    def final(c):
        return c.index, c.text, c.token_ids, c.finish_reason, [sorted(lp) for lp in c.logprobs]

    try:
        runs = {kind: asyncio.run(asyncio.wait_for(outputs(kind), 60)) for kind in RequestOutputKind}
    finally:
        async_llm.shutdown()
    cumulative, deltas, only = (runs[k] for k in RequestOutputKind)
    assert [final(c) for c in cumulative[-1].outputs] == [final(c) for c in want]
    assert [final(c) for c in only[0].outputs] == [final(c) for c in want] and len(only) == 1 and only[0].finished
    assert len(cumulative) > 2 and not any(o.finished for o in cumulative[:-1])
    for before, after in zip(cumulative, cumulative[1:]):  # each output extends the one before (nothing lost)
        for b in before.outputs:
            a = after.outputs[[c.index for c in after.outputs].index(b.index)]
            assert a.token_ids[:len(b.token_ids)] == b.token_ids and a.text.startswith(b.text)
    for c in want:
        mine = [d for o in deltas for d in o.outputs if d.index == c.index]
        assert [t for d in mine for t in d.token_ids] == c.token_ids and "".join(d.text for d in mine) == c.text
    assert sum(len(d.token_ids) for d in deltas[0].outputs) < 24  # a delta is not the whole output


def test_a_reader_that_falls_behind_reads_one_merged_delta(offline):
    """Outputs the reader has not taken yet merge into one delta (no backlog of per-step chunks); the
    merged delta holds exactly the tokens and text of offline generate."""
    from minillm.serving.async_engine import _END, AsyncLLM
    async_llm = AsyncLLM(LLM(MODEL, **small_engine_args(**ARGS)))
    params = params_for(offline, max_tokens=24, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)

    async def run():
        stream = async_llm.add_request(PROMPTS[2], params)
        for _ in range(3000):  # read nothing until the request has ended (bounded: 30 s)
            if _END in stream._req.outputs.items:
                break
            await asyncio.sleep(0.01)
        unread = len(stream._req.outputs.items)
        return unread, [out async for out in stream]

    try:
        unread, outs = asyncio.run(run())
    finally:
        async_llm.shutdown()
    assert unread == 2 and len(outs) == 1 and outs[0].finished, (unread, outs)
    want = offline.generate([PROMPTS[2]], params, use_tqdm=False)[0].outputs[0]
    got = outs[0].outputs[0]
    assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, "length")


def test_stream_interval_sends_the_first_token_at_once_then_groups_of_that_many(offline):
    from minillm.serving.async_engine import AsyncLLM
    interval = 4
    async_llm = AsyncLLM(LLM(MODEL, **small_engine_args(**ARGS)), stream_interval=interval)
    params = params_for(offline, max_tokens=23, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)

    async def run():
        return [out async for out in async_llm.add_request(PROMPTS[3], params)]

    try:
        outs = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        async_llm.shutdown()
    sizes = [len(o.outputs[0].token_ids) for o in outs if o.outputs]
    # 23 tokens: the first alone, then groups of at least 4 (more when the reader was slow to take the
    # last one: they gather meanwhile), the last group whatever is left: at most 1 + ceil(22 / 4) chunks
    assert sizes[0] == 1 and all(n >= interval for n in sizes[1:-1]) and sizes[-1] > 0, sizes
    assert len(sizes) <= 1 + -(-22 // interval), sizes
    want = offline.generate([PROMPTS[3]], params, use_tqdm=False)[0].outputs[0]
    assert [t for o in outs for c in o.outputs for t in c.token_ids] == want.token_ids
    assert "".join(c.text for o in outs for c in o.outputs) == want.text


@contextmanager
def engine_held(async_llm):
    """The engine thread cannot add or step while the test holds the engine's lock."""
    assert async_llm.engine.lock.acquire(timeout=30)
    try:
        yield
    finally:
        async_llm.engine.lock.release()


def test_a_full_waiting_queue_answers_503_with_retry_after():
    with server_handle(MODEL, max_waiting=2, **ARGS) as s, httpx.Client(base_url=s.base_url, timeout=TIMEOUT) as c:
        req = dict(model=MODEL, prompt="Hello", max_tokens=4, stream=True)
        with ExitStack() as streams:
            with engine_held(s.async_llm):
                accepted = [streams.enter_context(c.stream("POST", "/v1/completions", json=req)) for _ in range(2)]
                assert [r.status_code for r in accepted] == [200, 200]
                assert metrics(s.base_url)["minillm_num_requests_waiting"] == 2
                r = c.post("/v1/completions", json=dict(req, stream=False))
                assert r.status_code == 503
                assert r.headers["retry-after"] == "1"
                assert (r.json()["error"]["code"], r.json()["error"]["type"]) == ("queue_full", "server_busy")
            for r in accepted:  # the engine goes on: both accepted requests finish
                events = sse_events(r)
                assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        good_request(s.base_url)


def test_an_engine_error_fails_every_request_in_flight_and_the_server_goes_on(server):
    """A step that raises fails both requests in it (a stream: an error event; a plain request: a 500)."""
    engine, async_llm = server.async_llm.engine, server.async_llm
    real_launch = engine.model_runner.launch
    failed = []

    def failing_launch(*args, **kwargs):
        if len(engine.requests) >= 2 and not failed:  # the first step that runs both requests
            failed.append(1)
            raise RuntimeError("boom (a test's injected failure)")
        return real_launch(*args, **kwargs)

    engine.model_runner.launch = failing_launch
    before = metrics(server.base_url)["minillm_request_failure_total"]
    try:
        with httpx.Client(base_url=server.base_url, timeout=TIMEOUT) as c, ExitStack() as stack:
            streaming = stack.enter_context(c.stream("POST", "/v1/completions", json=dict(
                model=MODEL, prompt=PROMPTS[5], max_tokens=480, ignore_eos=True, stream=True)))
            lines = streaming.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "error" not in first  # it is running
            with engine_held(async_llm):  # it cannot finish before the second request is in
                plain = stack.enter_context(_thread_result(lambda: c.post("/v1/completions", json=dict(
                    model=MODEL, prompt="Hello", max_tokens=4))))
                wait_for(lambda: async_llm.num_waiting == 1, "the second request to be accepted")
            r = plain.result()
            assert r.status_code == 500, r.text
            assert r.json()["error"]["type"] == "internal_server_error"
            assert "boom" in r.json()["error"]["message"]
            events = [json.loads(x[6:]) if x != "data: [DONE]" else x for x in lines if x.startswith("data: ")]
            assert "boom" in events[-2]["error"]["message"] and events[-1] == "data: [DONE]"
    finally:
        del engine.model_runner.launch
    assert failed
    assert metrics(server.base_url)["minillm_request_failure_total"] == before + 2
    good_request(server.base_url)


class _Result:
    def __init__(self, fn):
        self.value = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.value = fn()
        except BaseException as e:  # noqa: BLE001 -- re-raised in result()
            self.error = e

    def result(self, timeout: float = 60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the request did not finish"
        if self.error is not None:
            raise self.error
        return self.value


@contextmanager
def _thread_result(fn):
    res = _Result(fn)
    yield res
    res.thread.join(60)


def test_a_list_longer_than_max_waiting_is_a_400_and_a_list_is_admitted_whole():
    """A list of more prompts than --max-waiting could never be admitted, so it is a 400 naming the limit
    (a 503 would have the client retry forever). A list that fits is admitted whole: beside requests
    already waiting, it is refused whole (503) with none of it queued."""
    with server_handle(MODEL, max_waiting=2, **ARGS) as s, httpx.Client(base_url=s.base_url, timeout=TIMEOUT) as c:
        r = c.post("/v1/completions", json=dict(model=MODEL, prompt=["a", "b", "c"], max_tokens=2))
        assert r.status_code == 400 and "retry-after" not in r.headers, r.text
        error = r.json()["error"]
        assert error["param"] == "prompt" and "at most 2 prompts per request" in error["message"]
        assert "--max-waiting" in error["message"]
        r = c.post("/v1/completions", json=dict(model=MODEL, prompt=["a", "b"], max_tokens=2))
        assert r.status_code == 200 and len(r.json()["choices"]) == 2
        with ExitStack() as streams:
            with engine_held(s.async_llm):
                first = streams.enter_context(c.stream("POST", "/v1/completions", json=dict(
                    model=MODEL, prompt="Hello", max_tokens=4, stream=True)))
                assert first.status_code == 200 and s.async_llm.num_waiting == 1
                r = c.post("/v1/completions", json=dict(model=MODEL, prompt=["a", "b"], max_tokens=2))
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                assert s.async_llm.num_waiting == 1  # neither prompt of the list was queued
            assert sse_events(first)[-1] == "[DONE]"
        good_request(s.base_url)


def test_a_refused_list_queues_none_of_its_prompts(server, monkeypatch):
    """Every prompt of a list is checked (tokens, vocabulary, length, the context) before any is queued:
    a refused list leaves /metrics as it was (no prompt tokens counted, no abort)."""
    queued = []
    real_queue = server.async_llm._queue
    monkeypatch.setattr(server.async_llm, "_queue", lambda req: (queued.append(req), real_queue(req)))
    before = metrics(server.base_url)
    for body in ({"prompt": ["hello world foo", ""]}, {"prompt": ["hello world foo", [1, 10**9]]},
                 {"prompt": ["hello world foo", OVER]},
                 {"prompt": ["hello world foo", list(range(1000, 1500))], "max_tokens": 100}):
        r = httpx.post(server.base_url + "/v1/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt 1: "), r.text
    assert queued == []
    # a request queued after them has finished: whatever they queued has been handled by the engine by now
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=TIMEOUT)
    assert r.status_code == 200 and len(queued) == 1
    after = wait_for(lambda: (lambda m: m if m["minillm_num_requests_running"] == 0 else None)(
        metrics(server.base_url)), "no request left in the engine")
    assert after["minillm_prompt_tokens_total"] == before["minillm_prompt_tokens_total"] + r.json()["usage"][
        "prompt_tokens"]
    for key in ('minillm_request_success_total{finished_reason="abort"}', "minillm_request_failure_total"):
        assert after[key] == before[key], key


def test_an_explicit_max_tokens_the_context_cannot_hold_is_a_400(server):
    """vLLM's and OpenAI's answer: 400 context_length_exceeded naming the sizes, not a completion cut
    short. Left out, max_tokens takes the default and the context's end stops it (finish_reason length)."""
    url, limit = server.base_url + "/v1", ARGS["max_model_len"]
    prompt = list(range(1000, 1500))  # 500 tokens
    r = httpx.post(url + "/completions", json={"prompt": prompt, "max_tokens": 100}, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"], error["type"]) == ("max_tokens", "context_length_exceeded",
                                                              "invalid_request_error")
    assert error["message"] == (f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"600 tokens (500 in the prompt, 100 in the completion). Please reduce the length "
                                f"of the prompt or completion.")
    messages = [{"role": "user", "content": "Hi"}]
    n_chat = len(server.async_llm.tokenizer.encode_chat(messages))
    r = httpx.post(url + "/chat/completions", json={"messages": messages, "max_completion_tokens": limit},
                   timeout=TIMEOUT)
    error = r.json()["error"]
    assert r.status_code == 400 and (error["param"], error["code"]) == ("max_completion_tokens",
                                                                        "context_length_exceeded"), r.text
    assert f"({n_chat} in the messages, {limit} in the completion)" in error["message"]
    for body in ({"max_tokens": limit - 500}, {}):  # exactly the room left; the default (64) beyond it
        r = httpx.post(url + "/completions", json={"prompt": prompt, "ignore_eos": True, **body}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == limit - 500
        assert r.json()["choices"][0]["finish_reason"] == "length"


def test_choices_carry_stop_reason_and_leave_a_stop_tokens_text_out(server, offline):
    """vLLM's stop_reason on every choice (the stop string or stop token id; None for EOS and length),
    streamed (the last chunk) or not, completions and chat; a stop token's text is left out of the
    text, as offline generate leaves it out."""
    greedy = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
    messages = [{"role": "user", "content": "Name three colors."}]
    tok = offline.get_tokenizer()

    def offline_out(chat: bool, **extra):
        params = params_for(offline, **greedy, **extra)
        outs = offline.chat(messages, params) if chat else offline.generate(PROMPTS[8], params, use_tqdm=False)
        return outs[0].outputs[0]

    for chat in (False, True):
        path, body = ("chat/completions", {"messages": messages}) if chat else ("completions", {"prompt": PROMPTS[8]})
        full = offline_out(chat)
        stop_id = next(t for t in full.token_ids[3:] if tok.decode([t]).strip())
        stop_str = full.text[len(full.text) // 2:][:3]
        for extra, reason in ((dict(stop_token_ids=[stop_id]), stop_id), (dict(stop=[stop_str]), stop_str), ({}, None)):
            want = offline_out(chat, **extra)
            assert want.stop_reason == reason and (reason != stop_id or want.text == tok.decode(want.token_ids[:-1]))
            r = httpx.post(f"{server.base_url}/v1/{path}", json={**body, **greedy, **extra}, timeout=TIMEOUT)
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            assert (text, choice["finish_reason"], choice["stop_reason"]) == (want.text, want.finish_reason, reason)
            with httpx.stream("POST", f"{server.base_url}/v1/{path}", json={**body, **greedy, **extra, "stream": True},
                              timeout=TIMEOUT) as r:
                chunks = [e["choices"][0] for e in sse_events(r) if e != "[DONE]"]
            text = "".join((c["delta"].get("content") or "") if chat else c["text"] for c in chunks)
            assert (text, chunks[-1]["finish_reason"], chunks[-1]["stop_reason"]) == (want.text, want.finish_reason,
                                                                                      reason)


# ---- the bad-input battery ---------------------------------------------------------------------------
OVER = list(range(1000, 1600))  # 600 token ids: over max_model_len=512
BAD = [
    ("completions", b"{not json", 400, "not valid JSON", None),
    ("completions", b"[1, 2]", 400, "must be a JSON object", None),
    ("completions", b"\xff\xfe", 400, "not valid JSON", None),
    ("completions", {"model": "gpt-4", "prompt": "Hi"}, 404, "does not exist", "model"),
    ("completions", {"prompt": OVER}, 400, "max_model_len", "prompt"),
    ("completions", {"prompt": "Hi", "temperature": -1}, 400, "temperature must be", "temperature"),
    ("completions", {"prompt": "Hi", "max_tokens": "ten"}, 400, "max_tokens must be", "max_tokens"),
    ("completions", {"prompt": "Hi", "max_tokens": 2.5}, 400, "max_tokens must be", "max_tokens"),
    ("completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens must be", "max_tokens"),
    ("completions", {"prompt": "Hi", "top_p": 0}, 400, "top_p must be", "top_p"),
    ("completions", {"prompt": "Hi", "n": 0}, 400, "n must be", "n"),
    ("completions", {"prompt": "Hi", "seed": -2**63 - 1}, 400, "seed must be", "seed"),
    ("completions", {"prompt": "Hi", "stop": [""]}, 400, "stop must be", "stop"),
    ("completions", {"prompt": "Hi", "logprobs": 50}, 400, "logprobs must be", "logprobs"),
    ("completions", {"prompt": "Hi", "presence_penalty": 3}, 400, "presence_penalty must be",
     "presence_penalty"),
    ("completions", {"prompt": "Hi", "logit_bias": {"x": 1}}, 400, "logit_bias", "logit_bias"),
    ("completions", {"prompt": "Hi", "bad_words": [""]}, 400, "bad_words must be", "bad_words"),
    ("completions", {"prompt": "Hi", "bad_words": "Hi"}, 400, "bad_words must be", "bad_words"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "bad_words": ["7" * 1100]}, 400,
     "of 1024 tokens in all", "bad_words"),
    ("completions", {"prompt": "Hi", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens must be",
     "truncate_prompt_tokens"),
    ("completions", {"prompt": "Hi", "truncate_prompt_tokens": 500}, 400,
     "truncate_prompt_tokens must be at most max_model_len - max_tokens = 512 - 64 = 448", "truncate_prompt_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "truncate_prompt_tokens": 512}, 400,
     "= 512 - 1 = 511", "truncate_prompt_tokens"),
    ("completions", {"prompt": "Hi", "foo": 1}, 400, "unknown field 'foo'", "foo"),
    ("completions", {"prompt": "Hi", "logit_bias": {"999999999": 5}}, 400, "outside the vocabulary", "logit_bias"),
    ("completions", {"prompt": "Hi", "echo": "yes"}, 400, "echo must be true or false", "echo"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "echo": True}, 400,
     "echo=true is not supported by this server", "echo"),
    ("completions", {"prompt": "Hi", "prompt_logprobs": 21}, 400, "prompt_logprobs must be", "prompt_logprobs"),
    ("completions", {"prompt": "Hi", "prompt_logprobs": 1, "stream": True}, 400,
     "prompt_logprobs is not available with stream: true", "prompt_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 0, "stream": True},
     400, "prompt_logprobs is not available with stream: true", "prompt_logprobs"),
    ("completions", {"prompt": "Hi", "best_of": 3}, 400, "best_of=3 is not supported", "best_of"),
    ("completions", {"prompt": "Hi", "suffix": "!"}, 400, 'suffix="!" is not supported', "suffix"),
    ("completions", {"prompt": "Hi", "stream": True, "stream_options": {"continuous_usage_stats": True}}, 400,
     "continuous_usage_stats only false", "stream_options"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logit_bias": {"999999999": 5}}, 400,
     "outside the vocabulary", "logit_bias"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}},
     400, "response_format=", "response_format"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                          "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools=", "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "tool_choice": "required"}, 400,
     'tool_choice="required" is not supported', "tool_choice"),
    ("completions", {"prompt": "Hi", "stream": "yes"}, 400, "stream must be true or false", "stream"),
    ("completions", {"prompt": "Hi", "stream_options": {"include_usage": True}}, 400, "only allowed with stream",
     "stream_options"),
    ("completions", {"prompt": ""}, 400, "empty", "prompt"),
    ("completions", {"prompt": ["a", 3]}, 400, "or a non-empty list of those", "prompt"),
    ("completions", {"prompt": ["a", []]}, 400, "or a non-empty list of those", "prompt"),
    ("completions", {"prompt": []}, 400, "or a non-empty list of those", "prompt"),
    ("completions", {"prompt": ["a", ""]}, 400, "prompt 1: the prompt is empty", "prompt"),
    ("completions", {"prompt": [1, 999999999]}, 400, "outside the vocabulary", "prompt"),
    ("completions", {}, 400, "prompt must be", "prompt"),
    ("chat/completions", {"messages": []}, 400, "messages must be", "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content must be", "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}, 400,
     "needs logprobs", "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 99},
     400, "top_logprobs must be null or an integer in [0, 20]", "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "prompt": "x"}, 400,
     "unknown field 'prompt'", "prompt"),
    ("completions", b'{"prompt": "' + b"x" * (1 << 20) + b'"}', 413, "larger than", None),
    ("completions", {"prompt": "Hi", "skip_special_tokens": "no"}, 400, "skip_special_tokens must be true or false",
     "skip_special_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": "x"}, 400,
     "chat_template_kwargs must be a dict", "chat_template_kwargs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"messages": 1}},
     400, "chat_template_kwargs may not set ['messages']", "chat_template_kwargs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": "yes"}, 400,
     "add_generation_prompt must be True or False", "add_generation_prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True}, 400,
     "cannot both be True", "messages"),
]


BAD_IDS = [f"{i}-{b[2]}-{b[3][:24]}" for i, b in enumerate(BAD)]
# OpenAI's error types by status (vLLM names the exception instead: "BadRequestError", ...)
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}


@pytest.mark.parametrize("path, body, status, phrase, param", BAD, ids=BAD_IDS)
def test_bad_requests_get_an_openai_error_and_the_server_goes_on(server, path, body, status, phrase, param):
    kwargs = dict(content=body, headers={"content-type": "application/json"}) if isinstance(body, bytes) else dict(
        json=body)
    r = httpx.post(f"{server.base_url}/v1/{path}", timeout=TIMEOUT, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ERROR_TYPES[status] and (error["code"] is None or isinstance(error["code"], str))
    assert phrase in error["message"]
    assert "SamplingParams." not in error["message"]  # the request's own field names, not the offline API's
    assert error["param"] == param
    assert "Traceback" not in r.text
    good_request(server.base_url)


def test_openai_fields_holding_their_unused_values_are_accepted(server, client):
    """What SDKs and existing clients send by default (echo=false, best_of=n, response_format text, no
    tools, ...) is accepted, as vLLM accepts it, and changes nothing: the same greedy text as without them.
    Other values of those fields are 400s naming them (the bad-input battery)."""
    greedy = dict(max_tokens=6, temperature=0.0, ignore_eos=True)
    plain = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Hi", **greedy}, timeout=TIMEOUT).json()
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=TIMEOUT, json={
        "prompt": "Hi", **greedy, "echo": False, "suffix": None, "best_of": 1, "user": "u"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain["choices"][0]["text"], r.text
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=TIMEOUT, json={"prompt": "Hi", **greedy, "n": 2,
                                                                               "temperature": 0.7, "best_of": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
    messages = [{"role": "user", "content": "Hi"}]
    want = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0.0)
    got = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0.0, response_format={"type": "text"},
        tool_choice="none", parallel_tool_calls=False, store=False, service_tier="auto",
        extra_body={"tools": [], "modalities": ["text"]})
    assert got.choices[0].message.content == want.choices[0].message.content
    with httpx.stream("POST", f"{server.base_url}/v1/completions", timeout=TIMEOUT, json={
            "prompt": "Hi", **greedy, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": False}}) as r:
        events = [e for e in sse_events(r) if e != "[DONE]"]
    assert r.status_code == 200 and events[-1]["usage"]["completion_tokens"] == 6


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(server):
    """OpenAI's code for it, as for a max_tokens the context cannot hold, with param the prompt."""
    for path, body, param in (("completions", {"prompt": OVER}, "prompt"),
                              ("completions", {"prompt": ["Hi", OVER]}, "prompt")):
        r = httpx.post(f"{server.base_url}/v1/{path}", json=body, timeout=TIMEOUT)
        error = r.json()["error"]
        assert r.status_code == 400 and (error["code"], error["param"]) == ("context_length_exceeded", param), r.text
        assert "max_model_len is 512" in error["message"]


def test_unknown_paths_and_methods(server):
    """The framework's own errors in the same JSON: an unknown path a 404, a wrong method a 405."""
    r = httpx.get(server.base_url + "/v1/nothing", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"] == {"message": "GET /v1/nothing: Not Found",
                                                          "type": "not_found_error", "param": None, "code": None}
    r = httpx.get(server.base_url + "/v1/completions", timeout=TIMEOUT)
    error = r.json()["error"]
    assert r.status_code == 405 and error["type"] == "invalid_request_error" and "Method Not Allowed" in error["message"]


def test_the_openai_client_sees_errors_as_its_exceptions(client):
    """The openai client reads the error object's code, type and param."""
    with pytest.raises(openai.BadRequestError, match="temperature must be") as e:
        client.completions.create(model=MODEL, prompt="Hi", temperature=-2)
    assert (e.value.status_code, e.value.code, e.value.type, e.value.param) == (400, None, "invalid_request_error",
                                                                                "temperature")
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="Hi")
    assert (e.value.code, e.value.type, e.value.param) == ("model_not_found", "not_found_error", "model")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=10**6)
    assert (e.value.code, e.value.param) == ("context_length_exceeded", "max_tokens")
    assert "maximum context length" in e.value.message


def test_api_key():
    with running_server(MODEL, api_key="sekret", **ARGS) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            r = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=headers,
                           timeout=TIMEOUT)
            assert r.status_code == 401 and (r.json()["error"]["type"], r.json()["error"]["code"]) == (
                "authentication_error", "invalid_api_key")
        assert httpx.get(url + "/v1/models", timeout=TIMEOUT).status_code == 401
        assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200  # not under /v1
        c = openai.OpenAI(base_url=url + "/v1", api_key="sekret", timeout=60, max_retries=0)
        assert c.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].finish_reason
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="bad", max_retries=0).models.list()


# ---- vLLM's /tokenize, /detokenize, /version --------------------------------------------------------
@pytest.fixture(scope="module")
def hf_tokenizer(server):
    from transformers import AutoTokenizer

    from minillm.model_zoo import resolve_model
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


def test_tokenize_and_detokenize_as_vllm_with_transformers_ids(server, hf_tokenizer):
    """vLLM's request and response fields; the ids and token strings are transformers' for the same folder
    (a conversation: its apply_chat_template(tokenize=True)); /detokenize gives the text back, special
    tokens kept, as vLLM's decode does."""
    url, text = server.base_url, "Hello world, naïve café 🤖"
    for special in (True, False):
        r = httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": special,
                                                "return_token_strs": True}, timeout=TIMEOUT)
        want = hf_tokenizer(text, add_special_tokens=special)["input_ids"]
        assert r.status_code == 200 and r.json() == {"count": len(want), "max_model_len": ARGS["max_model_len"],
                                                     "tokens": want,
                                                     "token_strs": hf_tokenizer.convert_ids_to_tokens(want)}, r.text
    r = httpx.post(url + "/tokenize", json={"prompt": text}, timeout=TIMEOUT)  # vLLM's defaults
    assert r.json()["tokens"] == hf_tokenizer(text)["input_ids"] and r.json()["token_strs"] is None
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colors."}]
    for options in ({}, {"add_generation_prompt": False}, {"chat_template_kwargs": {"enable_thinking": False}}):
        r = httpx.post(url + "/tokenize", json={"messages": messages, **options}, timeout=TIMEOUT)
        kwargs = {"add_generation_prompt": options.get("add_generation_prompt", True),
                  **options.get("chat_template_kwargs", {})}
        want = hf_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
        assert r.status_code == 200 and r.json()["tokens"] == list(want), (options, r.text)
        back = httpx.post(url + "/detokenize", json={"model": MODEL, "tokens": r.json()["tokens"]}, timeout=TIMEOUT)
        assert back.json() == {"prompt": hf_tokenizer.decode(want, skip_special_tokens=False)}
        assert back.json()["prompt"] == hf_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    assert httpx.post(url + "/detokenize", json={"tokens": []}, timeout=TIMEOUT).json() == {"prompt": ""}
    # the ids a served chat request runs are the ones /tokenize gives
    n = httpx.post(url + "/tokenize", json={"messages": messages}, timeout=TIMEOUT).json()["count"]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=TIMEOUT)
    assert r.json()["usage"]["prompt_tokens"] == n
    version = httpx.get(url + "/version", timeout=TIMEOUT).json()
    assert set(version) == {"version"} and isinstance(version["version"], str)


TOKENIZE_BAD = [
    ("tokenize", {}, "prompt must be a string", "prompt"),
    ("tokenize", {"prompt": 5}, "prompt must be a string", "prompt"),
    ("tokenize", {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]}, "not both", "prompt"),
    ("tokenize", {"prompt": "Hi", "add_special_tokens": "yes"}, "add_special_tokens must be true or false",
     "add_special_tokens"),
    ("tokenize", {"prompt": "Hi", "return_token_strs": 1}, "return_token_strs must be true or false",
     "return_token_strs"),
    ("tokenize", {"prompt": "Hi", "add_generation_prompt": True}, "unknown field 'add_generation_prompt'",
     "add_generation_prompt"),
    ("tokenize", {"prompt": "x " * 600}, "but max_model_len is 512", "prompt"),
    ("tokenize", {"messages": []}, "messages must be", "messages"),
    ("tokenize", {"messages": [{"role": "user", "content": "Hi"}], "chat_template": "{{ 1 }}"},
     "chat_template only as null", "chat_template"),
    ("tokenize", {"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True},
     "cannot both be True", "messages"),
    ("tokenize", {"messages": [{"role": "user", "content": "Hi"}], "tools": "f"}, "tools must be a list", "tools"),
    ("tokenize", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"tools": 1}},
     "may not set ['tools']", "chat_template_kwargs"),
    ("tokenize", {"model": "gpt-4", "prompt": "Hi"}, "does not exist", "model"),
    ("detokenize", {}, "tokens must be a list of token ids", "tokens"),
    ("detokenize", {"tokens": [1, True]}, "tokens must be a list of token ids", "tokens"),
    ("detokenize", {"tokens": [1, 10**12]}, "outside the vocabulary", "tokens"),
    ("detokenize", {"tokens": [-1]}, "outside the vocabulary", "tokens"),
    ("detokenize", {"tokens": [1] * 513}, "but max_model_len is 512", "tokens"),
    ("detokenize", {"tokens": [1], "prompt": "x"}, "unknown field 'prompt'", "prompt"),
    ("detokenize", {"model": "gpt-4", "tokens": [1]}, "does not exist", "model"),
]


@pytest.mark.parametrize("path, body, phrase, param", TOKENIZE_BAD,
                         ids=[f"{i}-{b[0]}" for i, b in enumerate(TOKENIZE_BAD)])
def test_bad_tokenize_and_detokenize_requests_get_an_openai_error(server, path, body, phrase, param):
    r = httpx.post(f"{server.base_url}/{path}", json=body, timeout=TIMEOUT)
    status = 404 if param == "model" else 400
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["type"] == ERROR_TYPES[status] and phrase in r.json()["error"]["message"], r.text
    r = httpx.post(f"{server.base_url}/{path}", content=b"{oops", timeout=TIMEOUT)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    good_request(server.base_url)


def _strict_json(text: str):
    """JSON as the standard has it: no NaN or Infinity (what JavaScript's JSON.parse and most clients read)."""
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_processed_logprobs_server_matches_offline_and_sends_no_infinity():
    """--logprobs-mode reaches the engine in its own process; what top-k drops is -inf offline and -9999.0
    in the JSON (as vLLM clamps it: JSON has no -inf), streamed or not, completions and chat."""
    mode = "processed_logprobs"
    sampling = dict(max_tokens=4, temperature=0.5, top_k=2, seed=7, ignore_eos=True)
    offline_llm = LLM(MODEL, logprobs_mode=mode, **small_engine_args(**ARGS))
    try:
        want = offline_llm.generate(PROMPTS[3], params_for(offline_llm, logprobs=4, **sampling),
                                    use_tqdm=False)[0].outputs[0]
    finally:
        offline_llm.shutdown()
    assert any(lp.logprob == float("-inf") for lp in want.logprobs[0].values())
    with server_handle(MODEL, engine_core="process", logprobs_mode=mode, **ARGS) as s:
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": PROMPTS[3], "logprobs": 4, **sampling},
                       timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        lp = _strict_json(r.text)["choices"][0]["logprobs"]
        assert lp["token_logprobs"] == pytest.approx([p[t].logprob for t, p in zip(want.token_ids, want.logprobs)],
                                                     abs=1e-5)
        top = [sorted(v for v in d.values()) for d in lp["top_logprobs"]]
        assert all(d[0] == -9999.0 for d in top)  # top_k=2 leaves 2 of the 4 finite
        body = {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 4, **sampling}
        r = httpx.post(s.base_url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        content = _strict_json(r.text)["choices"][0]["logprobs"]["content"]
        assert all(min(t["logprob"] for t in c["top_logprobs"]) == -9999.0 for c in content)
        with httpx.stream("POST", s.base_url + "/v1/chat/completions", json={**body, "stream": True},
                          timeout=TIMEOUT) as r:
            lines = [x[len("data: "):] for x in r.iter_lines() if x.startswith("data: ") and x != "data: [DONE]"]
        chunks = [_strict_json(x) for x in lines]
        assert sum(len(c["choices"][0]["logprobs"]["content"]) for c in chunks if c["choices"][0]["logprobs"]) == 4


# ---- echo and prompt_logprobs: what lm-evaluation-harness's loglikelihood asks of a completions server ----
LOGPROB_TOL = 1e-4  # fp32 logits of two implementations of one model
EVAL_TEXT = "The capital of France is Paris, and the capital of Spain is"


@pytest.fixture(scope="module")
def hf_model(server):
    import torch
    from transformers import AutoModelForCausalLM

    from minillm.model_zoo import resolve_model
    return AutoModelForCausalLM.from_pretrained(resolve_model(MODEL), dtype=torch.float32).eval()


def hf_logprobs(hf_model, ids: list[int]):
    """log_softmax of transformers' logits at each position of ids: [len(ids), vocab] (row i scores ids[i + 1])."""
    import torch
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_prompt_logprobs(entries: list, ids: list[int], want, k: int) -> None:
    """vLLM's prompt_logprobs JSON against transformers: None for the first token, then per token its own
    logprob and rank first, and the k most likely beside it."""
    assert len(entries) == len(ids) and entries[0] is None
    for i in range(1, len(ids)):
        row, entry = want[i - 1], entries[i]
        assert next(iter(entry)) == str(ids[i])
        assert entry[str(ids[i])]["logprob"] == pytest.approx(float(row[ids[i]]), abs=LOGPROB_TOL)
        # a random tiny model's logits are nearly flat: its rank is fixed up to the tokens within the tolerance
        v, rank = float(row[ids[i]]), entry[str(ids[i])]["rank"]
        assert int((row > v + LOGPROB_TOL).sum()) + 1 <= rank <= int((row >= v - LOGPROB_TOL).sum())
        top = [(t, e) for t, e in entry.items() if e["rank"] <= k]  # the k most likely, as this engine ranks them
        assert len(top) == k and len(entry) <= k + 1
        kth = float(row.topk(k).values[-1]) if k else float("inf")  # (near-ties may swap which token is kth)
        for t, e in top:
            assert e["logprob"] == pytest.approx(float(row[int(t)]), abs=LOGPROB_TOL)
            assert e["logprob"] >= kth - LOGPROB_TOL


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(server, hf_model, hf_tokenizer):
    """lm-evaluation-harness's loglikelihood request: the prompt as text or as token ids, echo, logprobs 1,
    one greedy token. The answer starts with the prompt; its logprobs score every prompt token after the
    first (null, as vLLM sends it) and the generated one, each as transformers' forward does."""
    ids = hf_tokenizer(EVAL_TEXT)["input_ids"]
    want = hf_logprobs(hf_model, ids)
    greedy = int(want[-1].argmax())
    for prompt in (EVAL_TEXT, ids):
        r = httpx.post(f"{server.base_url}/v1/completions", timeout=TIMEOUT, json={
            "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["text"] == hf_tokenizer.decode(ids) + hf_tokenizer.decode([greedy])
        lp = choice["logprobs"]
        assert lp["tokens"] == [hf_tokenizer.decode([t]) for t in ids + [greedy]]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:] == pytest.approx(
            [float(want[i - 1][t]) for i, t in enumerate(ids + [greedy]) if i > 0], abs=LOGPROB_TOL)
        for i in range(1, len(ids) + 1):  # each position: its token and the most likely one (near-ties may swap it)
            top = lp["top_logprobs"][i]
            assert lp["tokens"][i] in top and len(top) <= 2
            assert max(top.values()) == pytest.approx(float(want[i - 1].max()), abs=LOGPROB_TOL)
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(ids) + 1)]
        check_prompt_logprobs(choice["prompt_logprobs"], ids, want, 1)  # vLLM's field, there too
        assert r.json()["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}


def test_echo_alone_and_echo_without_logprobs(server, client, hf_tokenizer):
    """echo with max_tokens 0 answers the prompt alone, no completion tokens (the openai client); echo
    without logprobs puts the prompt before the same text a plain request gets, and computes no
    prompt logprobs."""
    n_ids = len(hf_tokenizer(EVAL_TEXT)["input_ids"])
    r = client.completions.create(model=MODEL, prompt=EVAL_TEXT, echo=True, max_tokens=0, logprobs=0)
    assert r.choices[0].text == EVAL_TEXT and r.choices[0].finish_reason == "length"
    assert len(r.choices[0].logprobs.tokens) == n_ids and r.choices[0].logprobs.token_logprobs[0] is None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_ids, 0)
    greedy = dict(prompt=EVAL_TEXT, max_tokens=5, temperature=0, ignore_eos=True)
    plain = httpx.post(f"{server.base_url}/v1/completions", json=greedy, timeout=TIMEOUT).json()["choices"][0]
    echoed = httpx.post(f"{server.base_url}/v1/completions", json={**greedy, "echo": True},
                        timeout=TIMEOUT).json()["choices"][0]
    assert echoed["text"] == EVAL_TEXT + plain["text"] and echoed["logprobs"] is None
    assert "prompt_logprobs" not in echoed


def test_streamed_echo_starts_each_choice_with_its_prompt(server):
    """Streamed, echo puts each choice's prompt (and, with logprobs, its tokens' logprobs) in that
    choice's first chunk: the chunks join to the non-streamed answer, two prompts of two samples each."""
    body = {"prompt": [EVAL_TEXT, "Once upon a time"], "n": 2, "echo": True, "logprobs": 2, "max_tokens": 4,
            "temperature": 1.0, "seed": 11, "ignore_eos": True}
    whole = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=TIMEOUT).json()["choices"]
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json={**body, "stream": True},
                      timeout=TIMEOUT) as r:
        chunks = [c for e in sse_events(r) if e != "[DONE]" for c in e["choices"]]
    assert r.status_code == 200 and sorted(c["index"] for c in whole) == [0, 1, 2, 3]
    for want in whole:
        mine = [c for c in chunks if c["index"] == want["index"]]
        assert "".join(c["text"] for c in mine) == want["text"]
        assert want["text"].startswith((EVAL_TEXT, "Once upon a time")[want["index"] // 2])
        for key in ("tokens", "token_logprobs", "text_offset"):
            assert [x for c in mine for x in c["logprobs"][key]] == want["logprobs"][key]


def test_streamed_text_offset_counts_tokens_a_stop_string_holds_back(server):
    """While the text's end could still begin a stop string the stream holds that text back, but not its
    tokens: each chunk's text_offset must go on from the tokens' text, as the non-streamed answer's does
    (it went on from the text sent, so every later offset fell short; vLLM streams it so too)."""
    greedy = {"prompt": EVAL_TEXT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    free = httpx.post(f"{server.base_url}/v1/completions", json=greedy, timeout=TIMEOUT).json()["choices"][0]
    tokens = free["logprobs"]["tokens"]
    k = next(i for i in range(1, len(tokens) - 2) if tokens[i].strip() and tokens[i].isprintable())
    body = {**greedy, "stop": [tokens[k] + "\x07"]}  # token k's text begins it; the BEL never follows
    whole = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=TIMEOUT).json()["choices"][0]
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json={**body, "stream": True},
                      timeout=TIMEOUT) as r:
        chunks = [c for e in sse_events(r) if e != "[DONE]" for c in e["choices"]]
    assert whole["text"] == free["text"] and whole["finish_reason"] == "length"
    assert any(c["text"] != "".join(c["logprobs"]["tokens"]) for c in chunks), "no text was held back"
    assert "".join(c["text"] for c in chunks) == whole["text"]
    for key in ("tokens", "text_offset"):
        assert [x for c in chunks for x in c["logprobs"][key]] == whole["logprobs"][key]


def test_prompt_logprobs_as_vllm_sends_them(server, hf_model, hf_tokenizer):
    """vLLM's prompt_logprobs field: on each completion choice, and beside the chat response's choices
    (the chat template's tokens), each against transformers' forward."""
    ids = hf_tokenizer(EVAL_TEXT)["input_ids"]
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": ids, "prompt_logprobs": 2, "max_tokens": 2},
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    check_prompt_logprobs(r.json()["choices"][0]["prompt_logprobs"], ids, hf_logprobs(hf_model, ids), 2)
    messages = [{"role": "user", "content": "Name a colour."}]
    chat_ids = hf_tokenizer(hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)["input_ids"]
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=TIMEOUT,
                   json={"messages": messages, "prompt_logprobs": 0, "max_tokens": 2})
    assert r.status_code == 200, r.text
    check_prompt_logprobs(r.json()["prompt_logprobs"], chat_ids, hf_logprobs(hf_model, chat_ids), 0)
    assert "prompt_logprobs" not in r.json()["choices"][0]


@pytest.mark.parametrize("engine_core", ["thread", "process"])
def test_async_llm_yields_prompt_logprobs_as_vllm(engine_core, offline):
    """AsyncLLM.generate with SamplingParams.prompt_logprobs, the engine in this process or its own: the
    first output after the prompt ran carries them (DELTA: only that one), CUMULATIVE and FINAL_ONLY
    outputs carry them whole; equal to offline generate's."""
    from serving_helpers import engine_client
    base = params_for(offline, max_tokens=6, prompt_logprobs=2, ignore_eos=True)
    want = offline.generate(PROMPTS[4], base, use_tqdm=False)[0].prompt_logprobs
    async_llm = engine_client(MODEL, engine_core, **ARGS)

    async def outputs(kind):
        return [out async for out in async_llm.generate(PROMPTS[4], dataclasses.replace(base, output_kind=kind))]

    try:
        runs = {kind: asyncio.run(asyncio.wait_for(outputs(kind), 60)) for kind in RequestOutputKind}
    finally:
        async_llm.shutdown()
    cumulative, deltas, only = (runs[k] for k in RequestOutputKind)
    assert all(o.prompt_logprobs == want for o in cumulative) and only[0].prompt_logprobs == want
    assert deltas[0].prompt_logprobs == want and all(o.prompt_logprobs is None for o in deltas[1:])


# ---- /metrics and / ------------------------------------------------------------------------------
def test_metrics_parse_and_move(server, client):
    before = metrics(server.base_url)
    for name in ("minillm_num_requests_running", "minillm_num_requests_waiting", "minillm_kv_cache_usage_perc",
                 "minillm_kv_cache_free_blocks", "minillm_generation_tokens_total", "minillm_prompt_tokens_total",
                 "minillm_time_to_first_token_seconds_count", "minillm_time_per_output_token_seconds_count",
                 'minillm_time_to_first_token_seconds_bucket{le="+Inf"}'):
        assert name in before, name
    assert 0.0 <= before["minillm_kv_cache_usage_perc"] <= 1.0
    r = client.completions.create(model=MODEL, prompt="Count", max_tokens=5, temperature=0, extra_body={
        "ignore_eos": True})
    assert r.usage.completion_tokens == 5
    after = metrics(server.base_url)
    assert after["minillm_generation_tokens_total"] == before["minillm_generation_tokens_total"] + 5
    assert after["minillm_prompt_tokens_total"] == before["minillm_prompt_tokens_total"] + r.usage.prompt_tokens
    for h in ("minillm_time_to_first_token_seconds", "minillm_time_per_output_token_seconds"):
        assert after[h + "_count"] == before[h + "_count"] + 1
        assert after[h + "_sum"] > before[h + "_sum"]


def test_the_chat_page_or_a_404(server, monkeypatch, tmp_path):
    import minillm.serving.server as srv
    page = tmp_path / "index.html"
    page.write_text("<!doctype html><title>chat</title>")
    monkeypatch.setattr(srv, "STATIC", str(tmp_path))
    r = httpx.get(server.base_url + "/", timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html") and "chat" in r.text
    page.unlink()
    r = httpx.get(server.base_url + "/", timeout=TIMEOUT)
    assert r.status_code == 404 and "index.html" in r.json()["error"]["message"]


# ---- the command line ------------------------------------------------------------------------------
def _serve(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillm", "serve", *args], capture_output=True, text=True,
                          timeout=120)


def test_serve_bad_arguments_are_one_line_errors():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        for args, phrase in ((["--port", "70000"], "--port must be in"), (["--max-waiting", "0"], "--max-waiting"),
                             (["--port", str(taken.getsockname()[1])], "cannot listen on"),
                             (["--api-key", ""], "--api-key is empty"),
                             (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be at least 1"),
                             (["--stream-interval", "0"], "--stream-interval must be at least 1")):
            p = _serve(*args)
            assert p.returncode == 2, (args, p.stderr)
            assert p.stderr.startswith("error: ") and phrase in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_serve_takes_vllm_serves_command_line():
    """`serve MODEL` (the model as `vllm serve MODEL` takes it) and vLLM's engine flags reach LLM(...)."""
    from minillm.cli import _llm_args, _parser, _pick_model
    args = _parser().parse_args(["serve", "qwen3-tiny", "--gpu-memory-utilization", "0.5", "--no-enable-prefix-caching",
                                 "--generation-config", "vllm", "--trust-remote-code"])
    _pick_model(args)
    assert args.model == "qwen3-tiny"
    given = _llm_args(args)
    names = ("gpu_memory_utilization", "enable_prefix_caching", "generation_config", "trust_remote_code")
    assert {k: given[k] for k in names} == {"gpu_memory_utilization": 0.5, "enable_prefix_caching": False,
                                           "generation_config": "vllm", "trust_remote_code": True}
    args = _parser().parse_args(["serve"])
    _pick_model(args)
    assert args.model == "smollm2-135m" and not set(names) & set(_llm_args(args))  # the engine's defaults
    p = _serve("qwen3-tiny", "--model", "smollm2-135m")
    assert p.returncode == 2 and "two models given" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    with serve_process(MODEL, "--device", "cpu", "--engine-core", "thread", "--no-enable-prefix-caching") as url:
        assert [m["id"] for m in httpx.get(url + "/v1/models", timeout=TIMEOUT).json()["data"]] == [MODEL]


def test_sigterm_stops_the_server_and_shuts_the_engine_down():
    """A process manager's SIGTERM: the engine is shut down, uvicorn finishes, and the process exits 0
    (uvicorn re-raises the signal after its shutdown; left to the default handler the process would die
    with -15 before the CLI's own shutdown of the engine, which is then a no-op, and its last line)."""
    from minillm.course.serving_lab import Server
    srv = Server(MODEL, "--device", "cpu", "--max-model-len", "256").start()  # up once /health answers
    try:
        assert httpx.get(srv.url + "/health", timeout=TIMEOUT).status_code == 200
    finally:
        returncode = srv.stop()  # SIGTERM, then wait
    err = srv.log_tail()
    assert returncode == 0, err
    assert "the engine is shut down" in err, err


@pytest.mark.timeout(300)
def test_ctrl_c_exits_130_even_when_the_server_started_with_sigint_ignored(tmp_path):
    """A process started in the background by a non-interactive shell (`make test &`, nohup) inherits
    SIGINT ignored. uvicorn's own signal capture then stopped on the Ctrl-C but re-raised it into that
    ignored disposition, and the CLI exited 0 instead of 130 (a red CI once). serve() now records the
    signal and raises KeyboardInterrupt itself."""
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", MODEL, "--device", "cpu",
                                 "--port", "0", "--engine-core", "thread"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: "/v1 (OpenAI API" in log.read_text() or proc.poll() is not None, "the server to start", 120)
        url = log.read_text().split(" at ", 1)[1].split("/v1", 1)[0]
        assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "the engine is shut down" in log.read_text() and "Traceback" not in log.read_text(), log.read_text()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine_core, sig, status", [("thread", signal.SIGTERM, 0), ("process", signal.SIGTERM, 0),
                                                      ("process", signal.SIGINT, 130), ("process", "group", 0)],
                         ids=["thread-SIGTERM", "process-SIGTERM", "process-SIGINT", "process-group-SIGTERM"])
def test_a_stop_signal_fails_the_requests_in_flight_and_the_server_exits_at_once(engine_core, sig, status):
    """SIGTERM (or Ctrl-C) with requests in flight: before uvicorn waits for the open connections, the
    engine stops, which fails each request as an engine error does (a stream: an error event, then
    [DONE]; a plain request: a 500 that names the shutdown); then the process exits, long before
    uvicorn's 5 s grace runs out, with no traceback. (Before: the stream went on for the 5 s, then was
    cut off with neither, and the plain request got a text/plain 500.)"""
    from minillm.course.serving_lab import Server
    srv = Server(MODEL, "--device", "cpu", "--max-model-len", "4096", "--engine-core", engine_core).start()
    body = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=4000, ignore_eos=True)
    try:
        with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c, \
                httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c2, \
                _thread_result(lambda: c2.post("/v1/completions", json=body)) as plain:
            with c.stream("POST", "/v1/completions", json=dict(body, stream=True)) as r:
                lines = r.iter_lines()
                assert "error" not in next(line for line in lines if line.startswith("data: "))
                wait_for(lambda: metrics(srv.url)["minillm_num_requests_running"] == 2, "both requests to run")
                if sig == "group":  # systemd's stop, kill -- -PGID: every process of the server's group at once
                    with open(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children") as f:
                        for child in map(int, f.read().split()):
                            os.kill(child, signal.SIGTERM)
                srv.proc.send_signal(signal.SIGTERM if sig == "group" else sig)
                signalled = time.monotonic()
                events = [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                          for line in lines if line.startswith("data: ")]
            answer = plain.result()
        returncode = srv.proc.wait(60)
        seconds = time.monotonic() - signalled
    finally:
        srv.stop()
    log = srv.log_tail(10**6)
    assert events[-1] == "[DONE]" and "shut down" in events[-2]["error"]["message"], (events[-3:], log)
    assert answer.status_code == 500 and "shut down" in answer.json()["error"]["message"], answer.text
    assert returncode == status, log
    assert "graceful shutdown exceeded" not in log and "Traceback" not in log, log
    assert "the engine is shut down" in log and seconds < 20, (seconds, log)
