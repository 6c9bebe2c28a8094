"""The OpenAI-compatible HTTP server (FastAPI + uvicorn, server-sent events): `python -m minillm serve`.

    GET  /v1/models             the model served (one entry per --served-model-name)
    POST /v1/completions        prompt (text or token ids, or a list of them) -> text; "stream": true for SSE chunks
    POST /v1/chat/completions   messages -> the assistant's reply; the same sampling fields
                                (both: vLLM's "use_beam_search": true for n beams instead of n samples)
    POST /tokenize, POST /detokenize, GET /version   vLLM's: text or a conversation <-> token ids
    GET  /health, GET /metrics (Prometheus text), GET / (the chat page, static/index.html)
    POST /reset_prefix_cache    vLLM's (its dev mode): forget every cached prefix; 409 while requests hold blocks

CORS as vLLM's (Starlette's CORSMiddleware; by default any origin, method and header: create_app's options).
Every error is OpenAI's JSON {"error": {"message", "type", "param", "code"}}, never a traceback:
400 bad input (also an explicit max_tokens the context cannot hold, and a list of more prompts than
max_waiting), 401 a missing or wrong API key, 404 an unknown model or path, 409 a prefix-cache reset
while requests hold KV-cache blocks, 413 a body over MAX_BODY_BYTES, 503 (with Retry-After) when
max_waiting requests already wait, 500 an engine error (every request in flight fails; the server goes
on). A client that disconnects aborts its request.
Ctrl-C or SIGTERM first stops the engine, which fails what is in flight, then uvicorn closes.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from minillm.engine.llm_engine import PromptTooLongError
from minillm.serving.async_engine import AsyncStream, EngineClient, EngineError, QueueFullError
from minillm.serving.beams import BeamSearchStream
from minillm.serving.protocol import (CHAT_FIELDS, CHAT_UNUSED, COMPLETION_FIELDS, COMPLETION_UNUSED,
                                      DETOKENIZE_FIELDS, MAX_BODY_BYTES, TOKENIZE_CHAT_FIELDS, TOKENIZE_CHAT_UNUSED,
                                      TOKENIZE_FIELDS, APIError, bad_request, beam_search_params, beam_width,
                                      chat_logprobs, chat_messages, check_fields, completion_logprobs,
                                      completion_prompts, echo_only,
                                      flag, merge, optional_string, param_of, prompt_logprobs_json, request_id,
                                      request_message, sampling_params, stream_flags, template_options, token_id_list,
                                      usage, use_beam_search)
from minillm.sampling_params import describe
from minillm.serving.sse import sse_event

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
ANY = ("*",)  # vLLM's default --allowed-origins, --allowed-methods and --allowed-headers: every one
RETRY_AFTER_S = 1  # what a 503 asks the client to wait
REQUEST_ID_HEADER = "X-Request-Id"  # vLLM's: the client's request id, over the body's request_id
# The engine thread and the event loop share one GIL; a thread that wants it back waits up to the
# interpreter's switch interval (5 ms by default, about one decode step) while the other runs Python.
# A shorter one lets the engine thread launch the next step sooner: on one H200, qwen3-0.6b-random,
# 256 streaming requests at once, 13.1k -> 14.6k output tok/s in an A/B run (before this module's
# later changes; the README has the current figures).
SWITCH_INTERVAL_S = 0.0005
log = logging.getLogger("minillm.serving")


def query_flag(request: Request, name: str) -> bool:
    """A boolean query parameter (?name=true), false when absent; anything but true/false/1/0 is a 400."""
    given = request.query_params.get(name, "false")
    value = given.lower()
    if value not in ("true", "false", "1", "0"):
        raise bad_request(f"the query parameter {name} must be true or false, got {given!r}", param=name)
    return value in ("true", "1")


def _sse(obj) -> str:
    """One JSON object as a server-sent event (OpenAI's streaming chunks)."""
    return sse_event(json.dumps(obj, ensure_ascii=False))


class _EventStream(StreamingResponse):
    """Server-sent events whose requests are aborted however the response ends (a client gone mid-stream)."""

    def __init__(self, events, streams: list[AsyncStream]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self.streams:
                stream.abort()  # a no-op once the request has finished


async def _outputs(streams: list[AsyncStream]):
    """(prompt number, output) as each request's outputs arrive: one request's straight from its stream,
    several through one queue (the completions of a list of prompts)."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(p: int, stream: AsyncStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((p, out, None))
            queue.put_nowait((p, None, None))
        except Exception as e:  # an engine error ends this request: pass it on
            queue.put_nowait((p, None, e))

    tasks = [asyncio.ensure_future(pump(p, s)) for p, s in enumerate(streams)]
    try:
        live = len(streams)
        while live:
            p, out, error = await queue.get()
            if error is not None:
                raise error
            if out is None:
                live -= 1
            else:
                yield p, out
    finally:
        for task in tasks:
            task.cancel()


async def _read_json(request: Request) -> dict:
    """The body as JSON: 413 past MAX_BODY_BYTES (the rest is read and dropped, so the client sees the
    answer rather than a reset connection), 400 when it is not JSON."""
    size, body, too_big = 0, bytearray(), False
    length = request.headers.get("content-length", "")
    too_big = length.isdigit() and int(length) > MAX_BODY_BYTES
    async for chunk in request.stream():
        size += len(chunk)
        too_big = too_big or size > MAX_BODY_BYTES
        if not too_big:
            body += chunk
        elif size > 16 * MAX_BODY_BYTES:
            break
    if too_big:
        raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes: send at most that much",
                       code="request_too_large")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(streams: list[AsyncStream], request: Request) -> list[tuple[dict, list | None]] | None:
    """Every output of non-streaming requests (one per prompt): (its samples merged by index, its
    prompt_logprobs or None); None when the client went away first (the requests are aborted)."""
    async def consume(stream: AsyncStream) -> tuple[dict, list | None]:
        outs: dict = {}
        prompt_logprobs = None
        async for out in stream:
            merge(outs, out.outputs)
            prompt_logprobs = out.prompt_logprobs or prompt_logprobs
        return outs, prompt_logprobs

    done_task = asyncio.ensure_future(asyncio.gather(*(consume(s) for s in streams)))
    gone_task = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({done_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for stream in streams:
            stream.abort()
        for task in (done_task, gone_task):
            if not task.done():
                task.cancel()
    return done_task.result() if done_task.done() and not done_task.cancelled() else None


def _version() -> str:
    """minillm's version (vLLM's GET /version answers its own)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("minillm")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def model_root(model: str) -> str:
    """GET /v1/models' `root` for the model `serve` was given: vLLM's is that argument, a hub id or a folder,
    which transformers can load; here an embedded name becomes the folder it was prepared in and a folder
    its absolute path, so a client on this machine can load the tokenizer from it. A hub id stays as it is."""
    from minillm.model_zoo import EMBEDDED, cache_dir
    if model in EMBEDDED:
        return os.path.join(cache_dir(), model)
    return os.path.abspath(model) if os.path.isdir(model) else model


def _model_permission(created: int) -> dict:
    """vLLM's ModelPermission, with its defaults: the one entry of each model's `permission`."""
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}


class RequestIdHeaders:
    """vLLM's --enable-request-id-headers (its XRequestIdMiddleware), as ASGI middleware: every HTTP response
    carries an X-Request-Id header, the one the request sent, else a fresh uuid4 hex."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        value = Headers(scope=scope).get(REQUEST_ID_HEADER) or uuid.uuid4().hex

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (REQUEST_ID_HEADER.lower().encode(), value.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_id)


def create_app(async_llm: EngineClient, model_name: str | Sequence[str], api_key: str | None = None,
               model: str | None = None, allowed_origins: Sequence[str] = ANY, allowed_methods: Sequence[str] = ANY,
               allowed_headers: Sequence[str] = ANY, allow_credentials: bool = False,
               chat_template: str | None = None, response_role: str = "assistant",
               enable_request_id_headers: bool = False) -> FastAPI:
    """The server's routes over one EngineClient (an AsyncLLM or an EngineCoreClient; the caller owns it and
    shuts it down). model_name: the name clients send, or several (vLLM's --served-model-name: a request may
    name any, responses carry the first, /v1/models lists each). model: what `serve` was given (default the
    first name), for /v1/models' root. The CORS options are vLLM's --allowed-origins, --allowed-methods,
    --allowed-headers and --allow-credentials, for Starlette's CORSMiddleware as vLLM installs it: by default
    a page from any origin may call the server. chat_template (vLLM's --chat-template, a Jinja string)
    replaces the model's own for every chat request and /tokenize. response_role (vLLM's --response-role):
    the role of a chat answer that opens a new turn (one that continues the last message keeps its role).
    enable_request_id_headers (vLLM's flag): each response carries an X-Request-Id header (RequestIdHeaders)."""
    names = [model_name] if isinstance(model_name, str) else list(model_name)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"model_name must be a non-empty name or a list of them, got {model_name!r}")
    model_name = names[0]
    app = FastAPI(title="minillm", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=allowed_methods,
                       allow_headers=allowed_headers, allow_credentials=allow_credentials)
    if enable_request_id_headers:  # added last, so outermost: CORS preflights and errors carry it too
        app.add_middleware(RequestIdHeaders)
    created = int(time.time())
    root = model_root(model or model_name)
    served = ", ".join(repr(n) for n in names)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):  # unknown path, wrong method
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return await api_error(request, APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                                                 type=kind))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):  # a bug: logged here, one line to the client
        log.exception("error serving %s %s", request.method, request.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}: {e}",
                                     type="internal_server_error").body(), status_code=500)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           type="authentication_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def parse(request: Request, allowed: set[str], unused: dict | None, guarded: bool = True) -> dict:
        if guarded:  # /v1/*, as vLLM guards it; /tokenize and /detokenize are open, as vLLM leaves them
            authorize(request)
        body = await _read_json(request)
        check_fields(body, allowed, unused)
        await parse_model(body)
        optional_string(body, "user")  # vLLM's: a string, which it ignores, as this server does
        return body

    async def parse_model(body: dict) -> None:
        model = body.get("model")
        if model is not None and model not in names:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {served}",
                           type="not_found_error", param="model", code="model_not_found")

    def chat_options(body: dict) -> dict:
        """A chat request's template options, with the server's --chat-template where it has one."""
        options = template_options(body)
        if chat_template is not None:
            options["chat_template"] = chat_template
        return options

    def check_all(prompts: list, params, body: dict, chat: bool) -> list[tuple]:
        """Every prompt checked (tokens, vocabulary, length, sampling, the context, bad words) before any is
        queued -> check_request's (text, token ids, params) for each."""
        param = "messages" if chat else "prompt"
        if len(prompts) > async_llm.max_waiting:  # a 503 would never pass, however long the client waits
            raise bad_request(f"{len(prompts)} prompts in one request, but this server queues at most "
                              f"{async_llm.max_waiting} requests (--max-waiting): send at most "
                              f"{async_llm.max_waiting} prompts per request, or start the server with a larger "
                              f"--max-waiting", param=param)
        # vLLM's and OpenAI's 400: an explicit max_tokens the context cannot hold is refused, not cut short
        # (left out, the default max_tokens runs until max_model_len, finish_reason "length")
        given = next((f for f in (("max_completion_tokens", "max_tokens") if chat else ("max_tokens",))
                      if body.get(f) is not None), None)
        checked = []
        for i, prompt in enumerate(prompts):
            where = f"prompt {i}: " if len(prompts) > 1 else ""
            try:
                checked.append(async_llm.check_request(prompt, params))
            except PromptTooLongError as e:
                raise bad_request(where + str(e), param=param, code="context_length_exceeded") from None
            except ValueError as e:  # the prompt's, or a sampling field's the vocabulary decides (logit_bias)
                raise bad_request(where + request_message(e), param=param_of(e, default=param)) from None
            n_prompt, limit = len(checked[-1][1]), async_llm.max_model_len
            if given is not None and n_prompt + params.max_tokens > limit:
                raise bad_request(f"{where}This model's maximum context length is {limit} tokens. However, you "
                                  f"requested {n_prompt + params.max_tokens} tokens ({n_prompt} in the {param}, "
                                  f"{params.max_tokens} in the completion). Please reduce the length of the {param} "
                                  f"or completion.", param=given, code="context_length_exceeded")
        return checked

    @contextlib.contextmanager
    def admission():
        """A full queue is a 503 with Retry-After, a stopped engine a 503."""
        try:
            yield
        except QueueFullError as e:
            raise APIError(503, f"the server is busy: {e}; retry after {RETRY_AFTER_S} s", type="server_busy",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except EngineError as e:
            raise APIError(503, str(e), type="service_unavailable") from None

    def submit(prompts: list, params, body: dict, chat: bool) -> list[AsyncStream]:
        """One request per prompt, all or none: every prompt is checked, then all are admitted together."""
        checked = check_all(prompts, params, body, chat)
        with admission():
            return async_llm.add_checked(checked)

    def submit_beams(prompts: list, params, body: dict, chat: bool) -> list[BeamSearchStream]:
        """A beam search per prompt (use_beam_search), all or none, each read as a request's stream: n beams,
        max_tokens as given, else the smaller of the default and what the context leaves the prompt."""
        width = beam_width(body)
        queued = len(prompts) * width  # each step queues n requests a prompt: past this a 503 would never pass
        if queued > async_llm.max_waiting:
            what = f"{len(prompts)} prompts x " if len(prompts) > 1 else ""
            raise bad_request(f"a beam search of {what}n={width} beams queues {queued} requests a step, but this "
                              f"server queues at most {async_llm.max_waiting} (--max-waiting): ask for fewer beams "
                              f"(or prompts), or start the server with a larger --max-waiting", param="n")
        checked = check_all(prompts, params, body, chat)
        streams: list[BeamSearchStream] = []
        try:
            with admission():
                for text, ids, _ in checked:
                    left = async_llm.max_model_len - len(ids)
                    steps = left if params.max_tokens is None else min(params.max_tokens, left)
                    streams.append(BeamSearchStream(async_llm, text, ids, beam_search_params(body, params, steps),
                                                    with_logprobs=params.logprobs is not None))
        except BaseException:
            for stream in streams:
                stream.abort()
            raise
        return streams

    def echo_texts(streams: list[AsyncStream], params) -> list[str]:
        """What echo puts before each prompt's completions: the prompt as given, or the text of its token ids
        (special tokens kept; also for a text prompt that truncate_prompt_tokens cut)."""
        return [s.prompt if s.prompt is not None and params.truncate_prompt_tokens is None
                else async_llm.tokenizer.decode(s.prompt_token_ids, skip_special_tokens=False) for s in streams]

    def completion_choice(index: int, c, k: int | None, offset: int = 0, echo: str | None = None,
                          prompt_ids: list[int] | None = None, prompt_logprobs: list | None = None) -> dict:
        """One /v1/completions choice (or its chunk) of sample c; echo: the prompt's text, put before c's text,
        and its tokens before c's in the logprobs (scored by prompt_logprobs)."""
        text, ids, positions = c.text, c.token_ids, c.logprobs
        first = ""
        if echo is not None:
            text, ids = echo + text, prompt_ids + ids
            if positions is not None:
                positions = prompt_logprobs + positions
                first = async_llm.tokenizer.decode(prompt_ids[:1], skip_special_tokens=False)
        return {"index": index, "text": text, "logprobs": completion_logprobs(ids, positions, k, offset, first)}

    def quiet(c):
        """echo with max_tokens 0: the one token the engine ran for it is not part of the answer."""
        return dataclasses.replace(c, text="", token_ids=[], logprobs=None if c.logprobs is None else [])

    async def run(request: Request, streams: list[AsyncStream], params, n: int, chat: bool, stream_mode: bool,
                  include_usage: bool, echo: bool = False, only_echo: bool = False, client_id: str | None = None,
                  role: str = "assistant"):
        """The response to one or more requests (a completion's list of prompts), n choices a prompt (params.n
        samples, or a beam search's width); the choices of prompt p are numbered p * n + i, as OpenAI numbers
        them. echo (completions): each choice starts with its prompt; only_echo: and holds nothing else.
        client_id: the request's request_id, which the response's id carries (else the engine's id of its first
        request). role: a chat answer's message role."""
        rid = ("chatcmpl-" if chat else "cmpl-") + (client_id or streams[0].request_id)
        kind = "chat.completion" if chat else "text_completion"
        k = params.logprobs
        n_prompt = sum(len(s.prompt_token_ids) for s in streams)
        echoes = echo_texts(streams, params) if echo else [None] * len(streams)
        with_prompt_logprobs = params.prompt_logprobs is not None  # asked for, or by echo with logprobs
        if not stream_mode:
            try:
                results = await _collect(streams, request)
            except EngineError as e:
                raise APIError(500, str(e), type="internal_server_error") from None
            if results is None:  # the client has gone: nobody reads this
                return JSONResponse({}, status_code=499)
            choices = []
            for p, (outs, prompt_logprobs) in enumerate(results):
                for i in sorted(outs):
                    c = quiet(outs[i]) if only_echo else outs[i]
                    if chat:
                        choices.append({"index": i, "message": {"role": role, "content": c.text},
                                        "logprobs": chat_logprobs(c, k), "finish_reason": c.finish_reason,
                                        "stop_reason": c.stop_reason})
                        continue
                    choice = completion_choice(p * n + i, c, k, 0, echoes[p], streams[p].prompt_token_ids,
                                               prompt_logprobs)
                    choices.append(dict(choice, finish_reason=c.finish_reason, stop_reason=c.stop_reason))
                    if with_prompt_logprobs:  # vLLM's: on each completion choice
                        choices[-1]["prompt_logprobs"] = prompt_logprobs_json(prompt_logprobs)
                if only_echo:
                    outs.clear()  # counted below as no completion tokens
            n_tokens = sum(len(c.token_ids) for outs, _ in results for c in outs.values())
            answer = {"id": rid, "object": kind, "created": int(time.time()), "model": model_name,
                      "choices": choices, "usage": usage(n_prompt, n_tokens)}
            if chat and with_prompt_logprobs:  # vLLM's: on the chat response, beside its choices
                answer["prompt_logprobs"] = prompt_logprobs_json(results[0][1])
            return JSONResponse(answer)

        async def events():
            head = {"id": rid, "object": kind + ".chunk" if chat else kind, "created": int(time.time()),
                    "model": model_name}
            extra = {"usage": None} if include_usage else {}
            n_tokens, offsets, prompt_logprobs = 0, {}, {}
            try:
                if chat:
                    for i in range(n):
                        yield _sse({**head, "choices": [{"index": i, "delta": {"role": role, "content": ""},
                                                         "logprobs": None, "finish_reason": None,
                                                         "stop_reason": None}], **extra})
                async for p, out in _outputs(streams):
                    if out.prompt_logprobs:  # (they come with the prompt's first token, before any echo needs them)
                        prompt_logprobs[p] = out.prompt_logprobs
                    for c in out.outputs:
                        c = quiet(c) if only_echo else c
                        n_tokens += len(c.token_ids)
                        if chat:
                            choice = {"index": c.index, "delta": {"content": c.text} if c.text else {},
                                      "logprobs": chat_logprobs(c, k)}
                        else:
                            index = p * n + c.index
                            first = echo and index not in offsets  # the choice's first chunk starts with the prompt
                            choice = completion_choice(index, c, k, offsets.get(index, 0),
                                                       echoes[p] if first else None, streams[p].prompt_token_ids,
                                                       prompt_logprobs.get(p))
                            # the next chunk's first text_offset: past this chunk's tokens, not past the text
                            # sent (text a stop string may still complete is held back; its tokens are not)
                            lp = choice["logprobs"]
                            offsets[index] = (lp["text_offset"][-1] + len(lp["tokens"][-1]) if lp and lp["tokens"]
                                              else offsets.get(index, 0) + len(choice["text"]))
                        # vLLM's stop_reason: the stop string or token id that ended it (None for EOS; until the end)
                        choice["finish_reason"], choice["stop_reason"] = c.finish_reason, c.stop_reason
                        yield _sse({**head, "choices": [choice], **extra})
                if include_usage:
                    yield _sse({**head, "choices": [], "usage": usage(n_prompt, n_tokens)})
            except EngineError as e:  # the status line has gone out: the error travels as an event
                yield _sse(APIError(500, str(e), type="internal_server_error").body())
            yield sse_event("[DONE]")

        return _EventStream(events(), streams)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, COMPLETION_FIELDS, COMPLETION_UNUSED)
        client_id = request.headers.get(REQUEST_ID_HEADER) or request_id(body)  # vLLM's order
        stream_mode, include_usage = stream_flags(body)
        beams = use_beam_search(body)
        params = sampling_params(body, async_llm.default_sampling_params(), chat=False, beams=beams)
        echo = flag(body, "echo")
        if echo and async_llm.tokenizer is None:
            raise bad_request("echo needs the model's tokenizer to write the prompt as text, and this model has "
                              "no tokenizer.json: leave echo out", param="echo")
        streams = (submit_beams if beams else submit)(completion_prompts(body), params, body, chat=False)
        n = beam_width(body) if beams else params.n
        return await run(request, streams, params, n, False, stream_mode, include_usage, echo=echo,
                         only_echo=echo_only(body), client_id=client_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request, CHAT_FIELDS, CHAT_UNUSED)
        client_id = request.headers.get(REQUEST_ID_HEADER) or request_id(body)  # vLLM's order
        stream_mode, include_usage = stream_flags(body)
        beams = use_beam_search(body)
        params = sampling_params(body, async_llm.default_sampling_params(chat=True), chat=True, beams=beams)
        messages = chat_messages(body)
        options = chat_options(body)
        if async_llm.tokenizer is None:
            raise bad_request("this model has no tokenizer, so it cannot chat: use /v1/completions with token ids")
        try:
            prompt = async_llm.tokenizer.encode_chat(messages, **options)
        except ValueError as e:
            raise bad_request(str(e), param="messages") from None
        # vLLM's rule: a new turn is --response-role's; a continued message keeps its own role
        role = response_role if options["add_generation_prompt"] else messages[-1]["role"]
        streams = (submit_beams if beams else submit)([prompt], params, body, chat=True)
        n = beam_width(body) if beams else params.n
        return await run(request, streams, params, n, True, stream_mode,
                         include_usage, client_id=client_id, role=role)

    def need_tokenizer():
        if async_llm.tokenizer is None:
            raise bad_request("this model has no tokenizer.json, so it cannot tokenize or detokenize text")
        return async_llm.tokenizer

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's /tokenize: {"prompt": text, "add_special_tokens": true} or a conversation {"messages": [...],
        "add_special_tokens": false, vLLM's template options} -> {"count", "max_model_len", "tokens",
        "token_strs"} (token_strs with "return_token_strs": true, else null)."""
        body = await _read_json(request)
        chat = isinstance(body, dict) and "messages" in body
        if chat and "prompt" in body:
            raise bad_request("give prompt or messages, not both: /tokenize tokenizes one text or one conversation",
                              param="prompt")
        check_fields(body, TOKENIZE_CHAT_FIELDS if chat else TOKENIZE_FIELDS, TOKENIZE_CHAT_UNUSED if chat else None)
        await parse_model(body)
        tok = need_tokenizer()
        special = flag(body, "add_special_tokens", default=not chat)  # vLLM's defaults: a template adds its own
        param = "messages" if chat else "prompt"
        try:
            if chat:
                options = chat_options(body)
                tools = body.get("tools")
                if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
                    raise bad_request(f"tools must be a list of tool definitions (objects), got {describe(tools)}",
                                      param="tools")
                text = tok.apply_chat_template(chat_messages(body), **dict(options, tools=tools), tokenize=False)
            else:
                text = body.get("prompt")
                if not isinstance(text, str):
                    raise bad_request(f"prompt must be a string (the text to tokenize), got {describe(text)}",
                                      param="prompt")
            ids = tok.encode(text, add_special_tokens=special)
        except ValueError as e:
            raise bad_request(str(e), param=param) from None
        limit = async_llm.max_model_len
        if len(ids) > limit:  # vLLM's check: what /tokenize returns must fit the context
            raise bad_request(f"the {param} has {len(ids)} tokens but max_model_len is {limit}: tokenize at most "
                              f"{limit} tokens (shorten the {param}, or start the server with a larger "
                              f"--max-model-len)", param=param, code="context_length_exceeded")
        strs = tok.convert_ids_to_tokens(ids) if flag(body, "return_token_strs") else None
        return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": their text}, special tokens kept (as vLLM decodes)."""
        body = await _read_json(request)
        check_fields(body, DETOKENIZE_FIELDS)
        await parse_model(body)
        tok = need_tokenizer()
        ids = token_id_list(body, "tokens")
        vocab = async_llm.checks.vocab_size
        outside = [t for t in ids if not 0 <= t < vocab]
        if outside:
            raise bad_request(f"tokens holds ids {outside[:5]} outside the vocabulary [0, {vocab}) of this model; "
                              f"send ids this model's /tokenize gives", param="tokens")
        if len(ids) > async_llm.max_model_len:
            raise bad_request(f"tokens holds {len(ids)} ids but max_model_len is {async_llm.max_model_len}: "
                              f"detokenize at most that many at once", param="tokens", code="context_length_exceeded")
        return {"prompt": tok.decode(ids, skip_special_tokens=False)}

    @app.get("/version")
    async def version():
        return {"version": _version()}

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        # vLLM's ModelCard: root the model's path, parent null (a LoRA adapter's base model there)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                            "owned_by": "minillm", "root": root, "parent": None,
                                            "max_model_len": async_llm.max_model_len,
                                            "permission": [_model_permission(created)]} for name in names]}

    @app.get("/health")
    async def health():
        if async_llm.is_running:  # vLLM's answer: 200 and an empty body
            return Response(status_code=200)
        raise APIError(503, "the engine is not running", type="service_unavailable")

    @app.get("/metrics")
    async def metrics():
        text = async_llm.metrics.render(running=async_llm.num_running, waiting=async_llm.num_waiting)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request):
        """vLLM's /reset_prefix_cache (served there with VLLM_SERVER_DEV_MODE=1): forget every cached prefix,
        so the next prompts start cold (between two benchmark runs) -> 200, empty. Guarded by --api-key."""
        authorize(request)
        if query_flag(request, "reset_running_requests"):
            raise bad_request("reset_running_requests=true is not supported: minillm resets the prefix cache only "
                              "while no request holds KV-cache blocks; call again without it once they finish",
                              param="reset_running_requests")
        query_flag(request, "reset_external")  # vLLM's external KV caches (a KV connector): minillm has none
        if not await async_llm.reset_prefix_cache():
            raise APIError(409, f"the prefix cache was not reset: requests hold KV-cache blocks "
                                f"({async_llm.num_running} running now); call again once they finish (when "
                                f"minillm_num_requests_running on /metrics reads 0)", type="conflict_error")
        log.info("prefix cache reset")
        return Response(status_code=200)

    @app.get("/")
    async def index():
        page = os.path.join(STATIC, "index.html")
        if not os.path.isfile(page):
            raise APIError(404, "no chat page in this installation (minillm/serving/static/index.html)",
                           type="not_found_error")
        return FileResponse(page, media_type="text/html")

    return app


def serve(async_llm: EngineClient, model_name: str | Sequence[str], sock, api_key: str | None = None,
          log_level: str = "info", access_log: bool = True, **app_options) -> None:
    """Serve on an already bound socket until Ctrl-C or SIGTERM (app_options: create_app's model, CORS,
    chat_template, response_role and enable_request_id_headers options; log_level and access_log: uvicorn's, as vLLM's
    --uvicorn-log-level and --disable-uvicorn-access-log set them). On the signal the EngineClient is shut
    down first (what is in flight fails at once), then uvicorn closes the connections; the caller may call
    its shutdown() again (it is idempotent). Returns after SIGTERM; raises KeyboardInterrupt after Ctrl-C
    (SIGINT)."""
    import uvicorn

    class Server(uvicorn.Server):
        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            self.stop_signals: list[int] = []  # the signals that stopped it, in order

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn's own version raises the signal again once it has shut down, into the handler it
            # found: in a process started with SIGINT ignored (a background `make test &`, nohup) that
            # did nothing, and a Ctrl-C ended the CLI with status 0 instead of 130. Here the signals are
            # only recorded, and serve() below says how the server stopped.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig: int, frame) -> None:
            self.stop_signals.append(sig)
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            # uvicorn's graceful shutdown waits (up to timeout_graceful_shutdown) for the open
            # connections, and a stream in flight would go on until then and be cut off without an
            # end. Stop the engine first: that fails every request in flight as an engine error does
            # (a stream: an error event, then [DONE]; a plain request: a 500), so each response ends
            # now. In a thread: the failures reach the streams through this event loop meanwhile.
            try:
                await asyncio.to_thread(async_llm.shutdown)
            finally:
                await super().shutdown(sockets)

    sys.setswitchinterval(SWITCH_INTERVAL_S)  # process-wide: this process exists to serve
    config = uvicorn.Config(create_app(async_llm, model_name, api_key, **app_options), log_level=log_level,
                            access_log=access_log, timeout_graceful_shutdown=5)
    server = Server(config)
    server.run(sockets=[sock])
    if signal.SIGINT in server.stop_signals:  # Ctrl-C: the CLI exits with 130, as a shell reports it
        raise KeyboardInterrupt
