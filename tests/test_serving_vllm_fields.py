"""The server's request handling where a vLLM user meets it: CORS, vLLM's declared request fields, the
request_id, top_logprobs 0, an assistant message without content, errors in the request's own terms and
/v1/models' ModelCard fields. Each is compared with what vLLM does (its FastAPI app with Starlette's
CORSMiddleware; the rules of vllm/entrypoints/openai/{completion,chat_completion}/protocol.py) or with
what the openai client declares, on qwen3-tiny on the CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.testclient import TestClient

from helpers import TOOL_TEMPLATE, TOOL_TURNS, hf_tool_rendering, one_torch_thread  # noqa: F401 (one_torch_thread: an autouse fixture)
from serving_helpers import serve_process, server_handle

pytestmark = pytest.mark.timeout(180)
MODEL = "qwen3-tiny"
TIMEOUT = httpx.Timeout(60.0)
MESSAGES = [{"role": "user", "content": "Hi"}]
GREEDY = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
GREEDY_CHAT = dict(max_tokens=4, temperature=0.0)  # (the openai client's arguments)
PREFLIGHT = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


@pytest.fixture(scope="module")
def server():
    with server_handle(MODEL, max_num_seqs=4, max_model_len=256) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=60, max_retries=0)


def post(server, path: str, body: dict) -> httpx.Response:
    """body as JSON with escapes kept (a lone surrogate travels as \\ud800, as a client's JSON sends it)."""
    return httpx.post(f"{server.base_url}{path}", content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=TIMEOUT)


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


# ---- CORS ---------------------------------------------------------------------------------------------
def vllm_cors_app(origins=("*",), methods=("*",), headers=("*",), credentials=False) -> FastAPI:
    """What vLLM's build_app installs: Starlette's CORSMiddleware with --allowed-origins, --allowed-methods,
    --allowed-headers and --allow-credentials, over a POST /v1/chat/completions route."""
    app = FastAPI()
    app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_credentials=credentials,
                       allow_methods=list(methods), allow_headers=list(headers))

    @app.post("/v1/chat/completions")
    async def chat():
        return {}

    return app


def cors_headers(r: httpx.Response) -> dict:
    return {k: v for k, v in r.headers.items() if k.startswith("access-control-")}


def test_cors_by_default_as_vllm_serve_answers_a_browser(server):
    """A page from another origin: its preflight gets vLLM's answer (any origin, method and header), and
    every answer, a 400 included, carries Access-Control-Allow-Origin, so the browser lets the page read it."""
    with TestClient(vllm_cors_app()) as vllm:
        want = vllm.options("/v1/chat/completions", headers=PREFLIGHT)
    r = httpx.options(server.base_url + "/v1/chat/completions", headers=PREFLIGHT, timeout=TIMEOUT)
    assert (r.status_code, cors_headers(r)) == (want.status_code, cors_headers(want)) and r.status_code == 200
    origin = {"Origin": "http://example.com"}
    assert httpx.get(server.base_url + "/v1/models", headers=origin, timeout=TIMEOUT).headers[
        "access-control-allow-origin"] == "*"
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hi", "foo": 1}, headers=origin,
                   timeout=TIMEOUT)
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "*"
    with httpx.stream("POST", server.base_url + "/v1/completions", headers=origin, timeout=TIMEOUT,
                      json={"prompt": "Hi", "stream": True, **GREEDY}) as r:
        assert r.headers["access-control-allow-origin"] == "*" and r.read().endswith(b"data: [DONE]\n\n")


def test_cors_options_and_the_api_key_as_vllm(server):
    """create_app's CORS options answer as vLLM's middleware with the same options; a preflight needs no
    API key (a browser sends none with it), and a 401 still tells the page why."""
    options = dict(origins=["http://a.example"], methods=["GET", "POST"], headers=["authorization"], credentials=True)
    from minillm.serving.server import create_app
    app = create_app(server.async_llm, MODEL, api_key="sekret", allowed_origins=options["origins"],
                     allowed_methods=options["methods"], allowed_headers=options["headers"],
                     allow_credentials=options["credentials"])
    with TestClient(app) as ours, TestClient(vllm_cors_app(**options)) as vllm:
        for origin in ("http://a.example", "http://b.example"):
            for request_headers in ("authorization", "x-other"):
                preflight = dict(PREFLIGHT, Origin=origin, **{"Access-Control-Request-Headers": request_headers})
                want = vllm.options("/v1/chat/completions", headers=preflight)
                got = ours.options("/v1/chat/completions", headers=preflight)
                assert (got.status_code, cors_headers(got)) == (want.status_code, cors_headers(want)), (origin,
                                                                                                     request_headers)
        r = ours.post("/v1/chat/completions", json={"messages": MESSAGES}, headers={"Origin": "http://a.example"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert (r.headers["access-control-allow-origin"], r.headers["access-control-allow-credentials"]) == (
            "http://a.example", "true")
        r = ours.get("/v1/models", headers={"Origin": "http://b.example", "Authorization": "Bearer sekret"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def _serve_args(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillm", "serve", *args], capture_output=True, text=True,
                          timeout=120)


def test_serve_takes_vllms_cors_flags():
    """--allowed-origins/--allowed-methods/--allowed-headers (JSON lists, default ["*"]) and
    --allow-credentials (default off) as `vllm serve` takes them, and they reach the server; a flag that
    is not a JSON list of strings is a one-line error (exit 2) before the model loads."""
    from minillm.cli import _parser
    args = _parser().parse_args(["serve"])
    assert (args.allowed_origins, args.allowed_methods, args.allowed_headers, args.allow_credentials) == (
        ["*"], ["*"], ["*"], False)
    for bad in ("http://a.example", '"*"', "[1]", "{}"):
        p = _serve_args("--allowed-origins", bad)
        assert p.returncode == 2 and "--allowed-origins: must be a JSON list of strings" in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1, p.stderr
    with serve_process(MODEL, "--device", "cpu", "--engine-core", "thread", "--max-model-len", "256",
                       "--allowed-origins", '["http://a.example"]', "--allowed-methods", '["POST"]',
                       "--allowed-headers", '["content-type"]', "--allow-credentials") as url, \
            TestClient(vllm_cors_app(["http://a.example"], ["POST"], ["content-type"], True)) as vllm:
        for origin in ("http://a.example", "http://b.example"):
            preflight = dict(PREFLIGHT, Origin=origin, **{"Access-Control-Request-Headers": "content-type"})
            want = vllm.options("/v1/chat/completions", headers=preflight)
            got = httpx.options(url + "/v1/chat/completions", headers=preflight, timeout=TIMEOUT)
            assert (got.status_code, cors_headers(got)) == (want.status_code, cors_headers(want)), origin


# ---- vLLM's declared fields -----------------------------------------------------------------------------
# vLLM's CompletionRequest and ChatCompletionRequest declare these (their defaults as vLLM sets them), which
# minillm implements only at those values: accepted there, as no-ops.
COMPLETION_DEFAULTS = {"add_special_tokens": True, "response_format": {"type": "text"}, "priority": 0,
                       "spaces_between_special_tokens": True, "return_tokens_as_token_ids": False}
CHAT_DEFAULTS = {"add_special_tokens": False, "echo": False, "chat_template": None, "documents": None,
                 "reasoning_effort": None, "priority": 0, "spaces_between_special_tokens": True,
                 "return_tokens_as_token_ids": False, "response_format": {"type": "text"}}
# ... and other values of them, which would change the answer: refused, naming the field
COMPLETION_OTHERS = {"add_special_tokens": False, "response_format": {"type": "json_object"}, "priority": 1,
                     "spaces_between_special_tokens": False, "return_tokens_as_token_ids": True}
CHAT_OTHERS = {"add_special_tokens": True, "echo": True, "documents": [{"title": "t", "text": "x"}],
               "reasoning_effort": "low", "priority": -1, "spaces_between_special_tokens": False,
               "return_tokens_as_token_ids": True}


def test_vllms_declared_fields_at_their_defaults_change_nothing(server, client):
    plain = post(server, "/v1/completions", {"prompt": "Hi", **GREEDY}).json()["choices"][0]["text"]
    r = post(server, "/v1/completions", {"prompt": "Hi", **GREEDY, **COMPLETION_DEFAULTS})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain, r.text
    want = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY_CHAT).choices[0].message.content
    got = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY_CHAT, extra_body=CHAT_DEFAULTS)
    assert got.choices[0].message.content == want


@pytest.mark.parametrize("path, field, value", [("/v1/completions", k, v) for k, v in COMPLETION_OTHERS.items()]
                         + [("/v1/chat/completions", k, v) for k, v in CHAT_OTHERS.items()])
def test_vllms_declared_fields_at_other_values_are_refused_by_name(server, path, field, value):
    body = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": MESSAGES}
    error = error_of(post(server, path, {**body, field: value}))
    assert (error["param"], error["code"]) == (field, "unsupported_value"), error
    assert error["message"].startswith(f"{field}={json.dumps(value)}"[:60]) and "not supported by this server" in \
        error["message"]


def test_a_requests_chat_template_is_refused_as_tokenize_refuses_it(server):
    """vLLM refuses a request's own template without --trust-request-chat-template (null is its default):
    chat now says so, with /tokenize's words, where it said "unknown field"."""
    template = "{{ messages }}"
    tokenize = error_of(post(server, "/tokenize", {"messages": MESSAGES, "chat_template": template}))
    chat = error_of(post(server, "/v1/chat/completions", {"messages": MESSAGES, "chat_template": template}))
    assert chat == tokenize and chat["param"] == "chat_template" and "--trust-request-chat-template" in chat["message"]
    error = error_of(post(server, "/v1/chat/completions", {"messages": MESSAGES, "chat_templates": None}))
    assert error["code"] == "unknown_field"  # a typo is still no field at all


def test_request_id_is_the_responses_id_as_vllm(server, client):
    """vLLM answers with id "cmpl-" / "chatcmpl-" + the request's request_id, streamed or not."""
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"request_id": "job-7"})
    assert r.id == "cmpl-job-7"
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"request_id": "j8"})
    assert r.id == "chatcmpl-j8"
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, stream=True,
                                                 extra_body={"request_id": "j9"}))
    assert chunks and {c.id for c in chunks} == {"chatcmpl-j9"}
    r = client.completions.create(model=MODEL, prompt=["Hi", "Yo"], max_tokens=2, extra_body={"request_id": "j10"})
    assert r.id == "cmpl-j10" and len(r.choices) == 2
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).id.startswith("cmpl-")
    for bad in (5, "", "\ud800"):
        error = error_of(post(server, "/v1/completions", {"prompt": "Hi", "request_id": bad}))
        assert error["param"] == "request_id" and "request_id" in error["message"]
    # vLLM's _base_request_id: the X-Request-Id header first, then the body's request_id
    r = client.with_options(default_headers={"X-Request-Id": "gw-1"}).completions.create(
        model=MODEL, prompt="Hi", max_tokens=2, extra_body={"request_id": "body-1"})
    assert r.id == "cmpl-gw-1"
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                       extra_headers={"x-request-id": "g2"})
    assert r.id == "chatcmpl-g2"


def test_tool_calls_names_and_reasoning_reach_the_template_as_vllm_hands_them(server):
    """vLLM's parse_chat_messages keeps a message's name, an assistant's tool_calls (arguments parsed from
    JSON) and reasoning (also as reasoning_content), and a tool message's tool_call_id for the template: the
    server's messages render as transformers' apply_chat_template renders the same turns with the arguments
    as an object; the server takes such a conversation, and refuses malformed tool_calls with a 400."""
    from minillm.model_zoo import resolve_model
    from minillm.serving.protocol import chat_messages
    from minillm.tokenizer import Tokenizer
    mine = Tokenizer(resolve_model(MODEL)).apply_chat_template(chat_messages({"messages": TOOL_TURNS}),
                                                               chat_template=TOOL_TEMPLATE)
    assert mine == hf_tool_rendering(MODEL)
    r = post(server, "/v1/chat/completions", {"messages": TOOL_TURNS, "max_tokens": 2})
    assert r.status_code == 200, r.text
    bad = json.loads(json.dumps(TOOL_TURNS))
    bad[2]["tool_calls"] = [{"id": "call_1", "function": "get_weather"}]
    error = error_of(post(server, "/v1/chat/completions", {"messages": bad, "max_tokens": 2}))
    assert error["param"] == "messages" and "messages[2].tool_calls must be a list" in error["message"]


def test_stream_options_empty_without_stream_is_accepted_as_vllm(server):
    """vLLM refuses stream_options without stream only when it holds something (`if data.get("stream_options")
    and not data.get("stream")`): {} is read as none."""
    for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": MESSAGES})):
        r = post(server, path, {**body, "max_tokens": 2, "stream_options": {}})
        assert r.status_code == 200 and len(r.json()["choices"]) == 1, r.text
        error = error_of(post(server, path, {**body, "max_tokens": 2, "stream_options": {"include_usage": False}}))
        assert error["param"] == "stream_options"


# ---- top_logprobs 0 ----------------------------------------------------------------------------------
def test_top_logprobs_zero_without_logprobs_is_accepted_as_vllm(server, client):
    """vLLM's check_logprobs refuses top_logprobs without logprobs only when it asks for some (> 0 or -1):
    0, its default, is what SDKs that fill every field send."""
    want = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY_CHAT)
    for extra in ({"logprobs": False, "top_logprobs": 0}, {"top_logprobs": 0}):
        r = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "temperature": 0.0, **extra})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert (choice["message"]["content"], choice["logprobs"]) == (want.choices[0].message.content, None)
    got = client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=False, top_logprobs=0,
                                         **GREEDY_CHAT)
    assert got.choices[0].message.content == want.choices[0].message.content
    for top in (2, -1, "0"):  # vLLM: "when using `top_logprobs`, `logprobs` must be set to true"
        error = error_of(post(server, "/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": top}))
        assert error["param"] == "top_logprobs" and "needs logprobs: true" in error["message"]


# ---- assistant content -----------------------------------------------------------------------------
def test_an_assistant_message_without_content_is_an_empty_one(server):
    """OpenAI's ChatCompletionAssistantMessageParam makes content optional and nullable (a tool call's
    message has none), a user's it requires: a null or missing assistant content reads as "", as vLLM
    reads it; a user or system message without content is still a 400."""
    from openai.types.chat import ChatCompletionAssistantMessageParam, ChatCompletionUserMessageParam
    hints = typing.get_type_hints(ChatCompletionAssistantMessageParam, include_extras=True)
    assert typing.get_origin(hints["content"]) is not typing.Required and type(None) in typing.get_args(
        hints["content"])
    assert typing.get_origin(typing.get_type_hints(ChatCompletionUserMessageParam, include_extras=True)[
        "content"]) is typing.Required

    def conversation(assistant: dict) -> list[dict]:
        return [*MESSAGES, {"role": "assistant", **assistant}, {"role": "user", "content": "Go"}]

    want = post(server, "/v1/chat/completions", {"messages": conversation({"content": ""}), **GREEDY}).json()
    want_ids = post(server, "/tokenize", {"messages": conversation({"content": ""})}).json()["tokens"]
    for assistant in ({"content": None}, {}, {"content": None, "tool_calls": []}):
        r = post(server, "/v1/chat/completions", {"messages": conversation(assistant), **GREEDY})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"] == want["choices"][0]["message"]
        assert r.json()["usage"] == want["usage"]
        assert post(server, "/tokenize", {"messages": conversation(assistant)}).json()["tokens"] == want_ids
    for message in ({"role": "user"}, {"role": "user", "content": None}, {"role": "system", "content": None}):
        error = error_of(post(server, "/v1/chat/completions", {"messages": [message, *MESSAGES]}))
        assert error["param"] == "messages" and "has no content" in error["message"], error


# ---- errors in the request's terms -------------------------------------------------------------------
def test_errors_name_the_request_field_not_samplingparams(server):
    """A bad value's message names the field the client sent (vLLM's top_logprobs, max_completion_tokens)
    in JSON's words, and a null max_tokens is the server's default, not "up to max_model_len"."""
    chat = {"messages": MESSAGES}
    cases = [
        ("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
         "top_logprobs must be null or an integer in [0, 20]"),
        ("/v1/chat/completions", {**chat, "max_completion_tokens": 0}, "max_completion_tokens",
         "max_completion_tokens must be an integer >= 1, or null for the server's default"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens",
         "max_tokens must be an integer >= 1, or null for the server's default"),
        ("/v1/completions", {"prompt": "Hi", "ignore_eos": "yes"}, "ignore_eos", "ignore_eos must be true or false"),
        ("/v1/completions", {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": "yes"}},
         "stream_options", "stream_options.include_usage must be true or false"),
        ("/v1/completions", {"prompt": "Hi", "stream": True, "stream_options": {"continuous_usage_stats": 1}},
         "stream_options", "stream_options.continuous_usage_stats must be true or false"),
    ]
    for path, body, param, phrase in cases:
        error = error_of(post(server, path, body))
        assert error["param"] == param and error["message"].startswith(phrase), error
        assert "SamplingParams" not in error["message"] and "max_model_len" not in error["message"]


def test_stop_strings_are_checked_as_prompts_are_and_user_is_a_string(server):
    """A lone surrogate (invalid UTF-8) is a 400 in a stop string as in a prompt; vLLM declares user a
    string (or null)."""
    prompt = error_of(post(server, "/v1/completions", {"prompt": "a\ud800"}))
    assert "lone surrogate" in prompt["message"]
    for stop, where in (("\ud800", "stop"), (["ok", "x\ud800"], "stop[1]")):
        for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": MESSAGES})):
            error = error_of(post(server, path, {**body, "stop": stop}))
            assert error["param"] == "stop" and error["message"].startswith(f"{where} is not valid Unicode: it holds "
                                                                            f"a lone surrogate"), error
    for user in (5, ["u"], "\ud800"):
        error = error_of(post(server, "/v1/completions", {"prompt": "Hi", "user": user}))
        assert error["param"] == "user", error
    assert post(server, "/v1/chat/completions", {**GREEDY, "messages": MESSAGES, "user": "u-1"}).status_code == 200


# ---- /v1/models ---------------------------------------------------------------------------------------
# vLLM's ModelCard and ModelPermission fields (vllm/entrypoints/openai/engine/protocol.py)
MODEL_CARD = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
MODEL_PERMISSION = {"id": str, "object": str, "created": int, "allow_create_engine": bool, "allow_sampling": bool,
                    "allow_logprobs": bool, "allow_search_indices": bool, "allow_view": bool,
                    "allow_fine_tuning": bool, "organization": str, "group": type(None), "is_blocking": bool}


def test_models_list_has_vllms_model_card_fields(server, client):
    """root the model's folder (a client loads the tokenizer from it), parent null (vLLM's is a LoRA's base
    model), permission vLLM's one ModelPermission with its defaults."""
    from transformers import AutoTokenizer
    card = httpx.get(server.base_url + "/v1/models", timeout=TIMEOUT).json()["data"][0]
    assert set(card) == MODEL_CARD and (card["id"], card["parent"], card["max_model_len"]) == (MODEL, None, 256)
    assert card["root"] == server.async_llm.llm.model_path and os.path.isabs(card["root"])
    assert AutoTokenizer.from_pretrained(card["root"]).encode("Hi") == server.async_llm.tokenizer.encode("Hi")
    [permission] = card["permission"]
    assert {k: type(v) for k, v in permission.items()} == MODEL_PERMISSION
    assert permission["object"] == "model_permission" and permission["id"].startswith("modelperm-")
    assert (permission["allow_sampling"], permission["allow_logprobs"], permission["organization"]) == (True, True, "*")
    model = client.models.list().data[0]  # the openai client keeps vLLM's extra fields
    assert (model.id, model.model_extra["root"]) == (MODEL, card["root"])


def test_model_root_as_serve_was_given_the_model(tmp_path, monkeypatch):
    """An embedded name: the folder it was prepared in; a folder: its absolute path; a hub id as given
    (vLLM's root is the model argument itself)."""
    from minillm.model_zoo import cache_dir
    from minillm.serving.server import model_root
    assert model_root(MODEL) == os.path.join(cache_dir(), MODEL)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-model").mkdir()
    assert model_root("my-model") == str(tmp_path / "my-model")
    assert model_root("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
