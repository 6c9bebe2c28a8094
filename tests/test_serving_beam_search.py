"""The server's beam search (vLLM's "use_beam_search": true): the beams transformers' beam search finds, as
vLLM's server answers them, the fields it ignores refused by name, and a search that ends however it ends."""
import asyncio
import dataclasses
import json
import re
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import one_torch_thread, ref_path  # noqa: F401 (one_torch_thread: an autouse fixture)
from minillm.model_zoo import resolve_model
from minillm.sampling_params import BeamSearchParams
from minillm.serving import beams as beams_module
from minillm.serving.async_engine import EngineError, QueueFullError
from minillm.serving.beams import BeamSearchStream
from serving_helpers import engine_client, server_handle

pytestmark = pytest.mark.timeout(180)
MODEL = "qwen3-tiny"
TIMEOUT = httpx.Timeout(60.0)
LOGPROB_ATOL = 1e-4  # fp32 sums of a few logprobs, two implementations
PROMPTS = ["The cat sat on the", "Once upon a time, in a land far"]


@pytest.fixture(scope="module")
def server():
    with server_handle(MODEL, max_model_len=256) as handle:
        yield handle


@pytest.fixture(scope="module")
def hf():
    path = resolve_model(MODEL)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=dict(model=MODEL, **body), timeout=TIMEOUT)


def hf_beams(hf, ids: list[int], width: int, steps: int) -> tuple[list[list[int]], list[float]]:
    """transformers' beam search of one prompt, no EOS: (generated tokens of each beam, best first; their
    summed logprobs). length_penalty 0 scores a beam by its sum; all have one length, so the ranking is the
    same as vLLM's default 1.0."""
    model, _ = hf
    out = model.generate(torch.tensor([ids]), num_beams=width, num_return_sequences=width, do_sample=False,
                         max_new_tokens=steps, min_new_tokens=steps, length_penalty=0.0, eos_token_id=None,
                         pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    return [s[len(ids):] for s in out.sequences.tolist()], out.sequences_scores.tolist()


def test_completions_beams_are_transformers_beams(server, hf):
    width, steps = 3, 5
    r = post(server, "/v1/completions", dict(prompt=PROMPTS, use_beam_search=True, n=width, max_tokens=steps,
                                             ignore_eos=True, logprobs=2))
    assert r.status_code == 200, r.text
    answer = r.json()
    choices = answer["choices"]
    assert [c["index"] for c in choices] == list(range(2 * width))  # prompt p's beams are p * n + i
    _, tok = hf
    for p, prompt in enumerate(PROMPTS):
        want_tokens, want_scores = hf_beams(hf, tok.encode(prompt), width, steps)
        mine = choices[p * width:(p + 1) * width]
        assert [c["text"] for c in mine] == [tok.decode(t) for t in want_tokens]
        for c, score in zip(mine, want_scores):
            lp = c["logprobs"]
            # each token's logprob, and the top 2 of the beam's candidates beside it
            # (the chosen token beside the top 2, as for sampled tokens)
            assert len(lp["token_logprobs"]) == steps and all(len(top) <= 3 for top in lp["top_logprobs"])
            assert sum(lp["token_logprobs"]) == pytest.approx(score, abs=LOGPROB_ATOL)
            assert c["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 2 * width * steps


def test_each_step_finds_the_beams_blocks_in_the_prefix_cache(server):
    """A step is one request per beam, the whole beam as its prompt: after the first step the prefix cache
    holds every full block of each beam's prompt (what /metrics counts as hits)."""
    def hits() -> float:
        text = httpx.get(server.base_url + "/metrics", timeout=TIMEOUT).text
        return float(re.search(r"^minillm_prefix_cache_hits_total (\S+)$", text, re.M).group(1))

    prompt = [(13 * i + 7) % 900 + 1 for i in range(40)]  # two full blocks of 16, and 8 tokens
    width, steps = 2, 4
    before = hits()
    r = post(server, "/v1/completions", dict(prompt=prompt, use_beam_search=True, n=width, max_tokens=steps,
                                             ignore_eos=True))
    assert r.status_code == 200, r.text
    assert hits() - before >= (steps - 1) * width * 2 * 16


def test_with_the_engine_in_its_own_process_the_beams_are_the_same(server, hf):
    """`serve` runs the engine in a process of its own: the API process drives the search, and knows the
    model's EOS tokens from the engine's checks."""
    _, tok = hf
    with server_handle(MODEL, engine_core="process", max_model_len=256) as other:
        assert other.async_llm.checks.eos_token_ids == server.async_llm.checks.eos_token_ids
        assert tok.eos_token_id in other.async_llm.checks.eos_token_ids
        r = post(other, "/v1/completions", dict(prompt=PROMPTS[1], use_beam_search=True, n=2, max_tokens=4,
                                                ignore_eos=True))
        assert r.status_code == 200, r.text
    want, _ = hf_beams(hf, tok.encode(PROMPTS[1]), 2, 4)
    assert [c["text"] for c in r.json()["choices"]] == [tok.decode(t) for t in want]


def test_chat_beams_streamed_and_not_are_one_answer(server, hf):
    body = dict(messages=[{"role": "user", "content": "Name a colour."}], use_beam_search=True, n=2, max_tokens=4,
                ignore_eos=True)
    whole = post(server, "/v1/chat/completions", body)
    assert whole.status_code == 200, whole.text
    texts = [c["message"]["content"] for c in whole.json()["choices"]]
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=dict(model=MODEL, stream=True, **body),
                      timeout=TIMEOUT) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = ["", ""]
    for e in events:
        for c in e["choices"]:
            streamed[c["index"]] += c["delta"].get("content", "")
    assert streamed == texts
    # vLLM's server answers a beam search whole: one chunk per beam after the roles, each with its finish_reason
    content = [c for e in events for c in e["choices"] if c["delta"].get("content")]
    assert len(content) == 2 and all(c["finish_reason"] == "length" for c in content)
    ids = whole.json()["usage"]["prompt_tokens"]
    _, tok = hf
    prompt = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
    want, scores = hf_beams(hf, tok.encode(prompt, add_special_tokens=False), 2, 4)
    assert texts == [tok.decode(t) for t in want] and ids == len(tok.encode(prompt, add_special_tokens=False))
    # chat's logprobs: each token's, with the top 2 of its step's candidates
    r = post(server, "/v1/chat/completions", dict(body, logprobs=True, top_logprobs=2))
    for c, score in zip(r.json()["choices"], scores):
        content = c["logprobs"]["content"]
        assert len(content) == 4 and all(len(t["top_logprobs"]) == 2 for t in content)
        assert sum(t["logprob"] for t in content) == pytest.approx(score, abs=LOGPROB_ATOL)


def test_a_beam_ending_in_eos_stops_there_as_vllm_answers_it(server, hf):
    _, tok = hf
    eos = hf_beams(hf, tok.encode(PROMPTS[0]), 2, 3)[0][0][0]  # the best beam's first token, made the EOS here
    checks = server.async_llm.checks
    server.async_llm.checks = dataclasses.replace(checks, eos_token_ids=frozenset({eos}))
    try:
        for include in (False, True):
            r = post(server, "/v1/completions", dict(prompt=PROMPTS[0], use_beam_search=True, n=2, max_tokens=3,
                                                     logprobs=0, include_stop_str_in_output=include))
            choices = r.json()["choices"]
            stopped = [c for c in choices if c["finish_reason"] == "stop"]
            assert stopped and all(c["stop_reason"] == eos for c in stopped)
            assert all(len(c["logprobs"]["tokens"]) == 3 for c in choices if c not in stopped)
            # the beam that ended at once: no text (vLLM leaves the EOS out of it), and the EOS is a token of
            # the answer only with include_stop_str_in_output
            at_once = [c for c in stopped if len(c["logprobs"]["tokens"]) == int(include)]
            assert at_once and at_once[0]["text"] == ""
            assert r.json()["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in choices)
    finally:
        server.async_llm.checks = checks


@pytest.mark.parametrize("field, value", [("top_p", 0.5), ("top_k", 5), ("seed", 1), ("stop", ["x"]),
                                          ("presence_penalty", 0.5), ("logit_bias", {"5": 1}), ("echo", True),
                                          ("min_tokens", 2), ("prompt_logprobs", 1)])
def test_a_field_the_search_would_ignore_is_refused_by_name(server, field, value):
    r = post(server, "/v1/completions", {"prompt": "Hi", "use_beam_search": True, "n": 2, "max_tokens": 2,
                                         field: value})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == field and "not used by a beam search" in error["message"]


def test_greedy_samples_are_refused_and_a_greedy_search_of_n_beams_is_not(server, hf):
    """vLLM's rule: n > 1 at temperature 0 is a 400 (the samples would all be the same), naming n and the fix;
    with use_beam_search the same n is the width of a search at temperature 0, as vLLM runs it."""
    for path, prompt in (("/v1/completions", dict(prompt="Hi")),
                         ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "Hi"}]))):
        r = post(server, path, dict(prompt, n=2, temperature=0, max_tokens=2))
        assert r.status_code == 400, r.text
        e = r.json()["error"]
        assert e["param"] == "n" and e["message"].startswith("n must be 1 when temperature is 0"), e
        assert "use_beam_search: true" in e["message"]
    _, tok = hf
    ids = tok.encode(PROMPTS[0])
    r = post(server, "/v1/completions", dict(prompt=ids, use_beam_search=True, n=3, temperature=0, max_tokens=3,
                                             ignore_eos=True))
    assert r.status_code == 200, r.text
    want, _ = hf_beams(hf, ids, 3, 3)
    assert [c["text"] for c in r.json()["choices"]] == [tok.decode(t) for t in want]


def test_beam_search_errors_name_the_field_and_the_fix(server):
    def error(path, body):
        r = post(server, path, body)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    e = error("/v1/completions", dict(prompt="Hi", use_beam_search=True, n=11, max_tokens=2))
    assert e["param"] == "n" and e["message"].startswith("n must be an integer in [1, 10]")
    e = error("/v1/completions", dict(prompt="Hi", length_penalty=0.5, max_tokens=2))
    assert e["param"] == "length_penalty" and "use_beam_search: true" in e["message"]
    # vLLM's defaults of both, as a client that copies them sends them, change nothing
    r = post(server, "/v1/completions", dict(prompt="Hi", use_beam_search=False, length_penalty=1.0, max_tokens=2))
    assert r.status_code == 200 and len(r.json()["choices"]) == 1
    e = error("/v1/chat/completions", dict(messages=[{"role": "user", "content": "Hi"}], use_beam_search=True,
                                           length_penalty="long", max_tokens=2))
    assert e["param"] == "length_penalty" and "a finite number" in e["message"]
    e = error("/v1/completions", dict(prompt=[1] * 250, use_beam_search=True, n=2, max_tokens=7))
    assert e["code"] == "context_length_exceeded" and e["param"] == "max_tokens"
    # the fields' defaults, as SDKs send them, change nothing
    r = post(server, "/v1/completions", dict(prompt="Hi", use_beam_search=True, n=2, max_tokens=2, top_p=1.0,
                                             top_k=-1, stop=[], seed=None, echo=False, skip_special_tokens=True,
                                             length_penalty=1.0))
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    assert not server.async_llm._book.requests


def test_without_max_tokens_the_beams_run_to_the_context(server):
    r = post(server, "/v1/chat/completions", dict(messages=[{"role": "user", "content": "Hi"}],
                                                  use_beam_search=True, n=1, ignore_eos=True))
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 256  # max_model_len
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_more_beams_than_the_queue_holds_is_a_400_not_a_503():
    with server_handle(MODEL, max_waiting=2) as server:
        r = post(server, "/v1/completions", dict(prompt="Hi", use_beam_search=True, n=3, max_tokens=2))
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        assert "--max-waiting" in r.json()["error"]["message"]
        r = post(server, "/v1/completions", dict(prompt=["Hi", "Ho"], use_beam_search=True, n=2, max_tokens=2))
        assert r.status_code == 400 and "2 prompts x n=2 beams queues 4 requests" in r.json()["error"]["message"]
        ok = post(server, "/v1/completions", dict(prompt="Hi", use_beam_search=True, n=2, max_tokens=2))
        assert ok.status_code == 200


def test_a_later_step_waits_for_room_in_a_full_queue(monkeypatch):
    """The search was admitted: a step after the first that finds the queue full tries again (the first
    step's refusal is the server's 503)."""
    llm = engine_client(ref_path("tiny-qwen3"), "thread")
    try:
        refusals = []
        add = llm.add_checked

        def full_once(requests, ids=None):
            if len(refusals) < 2 and "step2" in ids[0]:
                refusals.append(ids[0])
                raise QueueFullError("full (a test)")
            return add(requests, ids)

        monkeypatch.setattr(llm, "add_checked", full_once)
        monkeypatch.setattr(beams_module, "QUEUE_RETRY_S", 0.001)
        params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)

        async def search():
            return [out async for out in BeamSearchStream(llm, None, [5, 6, 7, 8], params)]

        outs = asyncio.run(search())
        assert len(refusals) == 2 and len(outs) == 1 and [len(c.token_ids) for c in outs[0].outputs] == [3, 3]
        assert not llm._book.requests
    finally:
        llm.shutdown()


async def search_under_way(llm, steps: int) -> tuple[BeamSearchStream, asyncio.Task]:
    """A 200-step search of 3 beams, read by a task, once it has reached its `steps`-th step."""
    stream = BeamSearchStream(llm, None, list(range(1, 40)), BeamSearchParams(beam_width=3, max_tokens=200,
                                                                             ignore_eos=True))
    task = asyncio.ensure_future(stream.__anext__())
    while stream._number < steps:
        await asyncio.sleep(0.001)
    return stream, task


def test_aborting_a_search_mid_step_ends_its_requests():
    llm = engine_client(ref_path("tiny-qwen3"), "thread")
    try:
        async def search_then_abort():
            stream, task = await search_under_way(llm, 3)
            task.cancel()  # what the server does when the client goes away
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(StopAsyncIteration):
                await stream.__anext__()

        asyncio.run(search_then_abort())
        deadline = time.monotonic() + 20
        while (llm._book.requests or not llm.engine.is_finished()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not llm._book.requests and llm.engine.is_finished()
    finally:
        llm.shutdown()


def test_a_search_the_engine_stops_under_fails_at_once():
    """Every accepted request finishes or errors: shut down mid-search, the search raises EngineError
    (the server's 500, or an error event), whichever step it was in."""
    llm = engine_client(ref_path("tiny-qwen3"), "thread")
    try:
        async def search():
            _, task = await search_under_way(llm, 4)
            await asyncio.to_thread(llm.shutdown)
            with pytest.raises(EngineError):
                await asyncio.wait_for(task, timeout=20)

        asyncio.run(search())
    finally:
        llm.shutdown()
