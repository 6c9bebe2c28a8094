"""The OpenAI API's shapes: a request body -> (prompt, SamplingParams, stream flags); outputs -> JSON.

Every bad request raises APIError, which the server turns into OpenAI's error body
{"error": {"message", "type", "param", "code"}} with its HTTP status. Sampling fields keep
SamplingParams' names and its checks (a bad value's ValueError becomes the 400's message, in the
request's terms: request_message).
"""
from __future__ import annotations

import dataclasses
import json
import re

from minillm.outputs import CompletionOutput
from minillm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams, describe, is_integer
from minillm.tokenizer import chat_template_options, check_text, template_fields, text_content

MAX_BODY_BYTES = 1 << 20  # a larger request body is a 413

# OpenAI's sampling fields, then vLLM's extra ones; all are SamplingParams fields of the same name
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
                   "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
                   "include_stop_str_in_output", "allowed_token_ids", "bad_words", "truncate_prompt_tokens",
                   "skip_special_tokens", "prompt_logprobs")
# vLLM's beam search: use_beam_search runs n beams instead of n samples; length_penalty ranks them
BEAM_FIELDS = ("use_beam_search", "length_penalty")
# request_id: vLLM's, the response's id after its "cmpl-"/"chatcmpl-" (request_id below)
COMMON_FIELDS = {"model", "stream", "stream_options", "logit_bias", "user", "request_id", *SAMPLING_FIELDS,
                 *BEAM_FIELDS}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "echo"}
# vLLM's chat template options, as LLM.chat takes them (minillm.tokenizer.chat_template_options)
TEMPLATE_FIELDS = ("chat_template_kwargs", "add_generation_prompt", "continue_final_message")
CHAT_FIELDS = COMMON_FIELDS | {"messages", "logprobs", "top_logprobs", "max_completion_tokens", *TEMPLATE_FIELDS}
# vLLM's /tokenize takes a prompt (TokenizeCompletionRequest) or a conversation (TokenizeChatRequest);
# /detokenize token ids (DetokenizeRequest). Their fields, as vLLM names them:
TOKENIZE_FIELDS = {"model", "prompt", "add_special_tokens", "return_token_strs"}
TOKENIZE_CHAT_FIELDS = {"model", "messages", "add_special_tokens", "return_token_strs", "tools", *TEMPLATE_FIELDS}
DETOKENIZE_FIELDS = {"model", "tokens"}


def _off(*values):
    """A check that a field holds one of `values` (compared by identity for False, so 0 is not false)."""
    return lambda v, body: any(v is x if isinstance(x, bool) or x is None else v == x for x in values)


def _zero(v, body) -> bool:
    """An integer 0 (not false, not 0.0), or null: vLLM's default priority."""
    return v is None or (type(v) is int and v == 0)


# vLLM's /tokenize and chat take a request's own template only with --trust-request-chat-template, which this
# server has not: null only (the same message on both)
CHAT_TEMPLATE_UNUSED = (_off(None), "null (vLLM refuses a request's own template unless trusted; this server has "
                                    "no --trust-request-chat-template)")

# OpenAI's (and vLLM's) request fields this server does not implement, each with the values that leave it
# unused, which SDKs and existing clients send (echo=false, best_of=n, response_format text, ...): accepted
# holding one of those, as vLLM accepts them; any other value is a 400 naming the field. A field in neither
# table is a 400 too (a typo must not be dropped silently). vLLM's own extras are here at their vLLM
# defaults, which are what minillm does anyway: add_special_tokens (completions encode the prompt with the
# tokenizer's special tokens; a chat template writes its own), spaces_between_special_tokens (vLLM's fast
# tokenizers ignore it), priority 0 (vLLM refuses any other without priority scheduling).
VLLM_UNUSED = {
    "priority": (_zero, "0"),
    "spaces_between_special_tokens": (_off(None, True), "true"),
    "return_tokens_as_token_ids": (_off(None, False), "false"),
}
COMPLETION_UNUSED = {
    **VLLM_UNUSED,
    "suffix": (_off(None, ""), "null"),
    "best_of": (lambda v, body: v is None or (type(v) is int and v == (body.get("n") or 1)), "null, or equal to n"),
    "response_format": (_off(None, {"type": "text"}), '{"type": "text"}'),
    "add_special_tokens": (_off(None, True), "true (vLLM's default for completions)"),
}
CHAT_UNUSED = {
    **VLLM_UNUSED,
    "response_format": (_off(None, {"type": "text"}), '{"type": "text"}'),
    "tools": (_off(None, []), "null or []"),
    "functions": (_off(None, []), "null or []"),
    "tool_choice": (lambda v, body: _off(None, "none")(v, body) or (v == "auto" and not body.get("tools")),
                    '"none", or "auto" without tools'),
    "function_call": (lambda v, body: _off(None, "none")(v, body) or (v == "auto" and not body.get("functions")),
                      '"none", or "auto" without functions'),
    "parallel_tool_calls": (lambda v, body: v is None or (isinstance(v, bool) and not body.get("tools")),
                            "true or false, without tools"),
    "store": (_off(None, False), "false"),
    "metadata": (_off(None, {}), "null"),
    "service_tier": (_off(None, "auto", "default"), '"auto"'),
    "modalities": (_off(None, ["text"]), '["text"]'),
    "add_special_tokens": (_off(None, False), "false (vLLM's default for chat: the template writes them)"),
    "echo": (_off(None, False), "false"),
    "chat_template": CHAT_TEMPLATE_UNUSED,
    "documents": (_off(None), "null"),
    "reasoning_effort": (_off(None), "null"),
}

# vLLM's /tokenize takes these only with the trust or the processor this server has not: null (or {}) only
TOKENIZE_CHAT_UNUSED = {
    "chat_template": CHAT_TEMPLATE_UNUSED,
    "mm_processor_kwargs": (_off(None, {}), "null"),
}


class APIError(Exception):
    """An error answer: OpenAI's body {"error": {"message", "type", "param", "code"}}: `type` its category,
    `code` a machine-readable reason as OpenAI's API sends it ("context_length_exceeded") or None, `param`
    the request field at fault (or None). vLLM sends the exception's name as `type` and the status as `code`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def check_fields(body, allowed: set[str], unused: dict | None = None) -> None:
    """A JSON object of `allowed` fields, and of `unused` ones (COMPLETION_UNUSED, CHAT_UNUSED) holding a
    value that leaves them unused."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    unused = unused or {}
    unknown = sorted(set(body) - allowed - set(unused))
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}; this endpoint accepts: {', '.join(sorted(allowed))}",
                          param=unknown[0], code="unknown_field")
    for name in sorted(set(body) & set(unused)):
        leaves_unused, accepted = unused[name]
        if not leaves_unused(body[name], body):
            raise bad_request(f"{name}={json.dumps(body[name])[:80]} is not supported by this server; it accepts "
                              f"{name} only as {accepted}, which leaves it unused", param=name,
                              code="unsupported_value")


def flag(body: dict, name: str, default: bool = False, within: str | None = None) -> bool:
    """A true/false request field; left out or null: `default`. within: the request field that holds `body`
    (stream_options), which the error names as its param, as OpenAI names the top-level field."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        field = f"{within}.{name}" if within else name
        raise bad_request(f"{field} must be true or false, got {describe(value)}", param=within or name)
    return value


def optional_string(body: dict, name: str) -> str | None:
    """A request field that is a string (valid Unicode) or null, as vLLM declares `user` and `request_id`."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string or null, got {describe(value)}", param=name)
    try:
        return check_text(value, name)
    except ValueError as e:
        raise bad_request(str(e), param=name) from None


def request_id(body: dict) -> str | None:
    """vLLM's request_id: the client's id for the request, which the response's id carries after "cmpl-" or
    "chatcmpl-" (as vLLM's does); None: the server makes one."""
    rid = optional_string(body, "request_id")
    if rid == "":
        raise bad_request("request_id must be a non-empty string (or null: the server makes one)",
                          param="request_id")
    return rid


def token_id_list(body: dict, name: str) -> list[int]:
    """A request field holding a list of token ids (ints, not true/false) -> that list."""
    ids = body.get(name)
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad_request(f"{name} must be a list of token ids (integers), got {describe(ids)}", param=name)
    return ids


def stream_flags(body: dict) -> tuple[bool, bool]:
    """-> (stream, include_usage)."""
    stream = flag(body, "stream")
    opts = body.get("stream_options")
    if opts is None or (opts == {} and not stream):  # vLLM's check reads an empty object as none
        return stream, False
    if not stream:
        raise bad_request("stream_options is only allowed with stream: true", param="stream_options")
    # vLLM's continuous_usage_stats (usage in every chunk) is not implemented: accepted when false
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"} or flag(
            opts, "continuous_usage_stats", within="stream_options"):
        raise bad_request(f"stream_options must be {{\"include_usage\": true|false}} (continuous_usage_stats "
                          f"only false), got {opts!r:.80}", param="stream_options")
    return stream, flag(opts, "include_usage", within="stream_options")


def sampling_params(body: dict, defaults: SamplingParams, chat: bool, beams: bool = False) -> SamplingParams:
    """The request's sampling fields over the model's defaults (LLM.get_default_sampling_params). beams: a beam
    search's request (use_beam_search), whose n is its beam width (beam_width reads it), not a sample count:
    its SamplingParams keep n=1, so a greedy search of n beams is not refused as n greedy samples are."""
    changes = {name: body[name] for name in SAMPLING_FIELDS
               if body.get(name) is not None and not (beams and name == "n")}
    renamed = {}  # SamplingParams field -> the request field it came from
    if chat:
        if body.get("max_completion_tokens") is not None:
            changes["max_tokens"] = body["max_completion_tokens"]
            renamed["max_tokens"] = "max_completion_tokens"
        want = flag(body, "logprobs")
        top = body.get("top_logprobs")
        # vLLM's check_logprobs: top_logprobs 0 (its default, which SDKs fill in) asks for nothing by itself
        if top is not None and not want and not (is_integer(top) and top == 0):
            raise bad_request(f"top_logprobs needs logprobs: true (got top_logprobs {describe(top)} without it; "
                              f"0 or null asks for none)", param="top_logprobs")
        if want:
            changes["logprobs"] = 0 if top is None else top
            renamed["logprobs"] = "top_logprobs"
    elif body.get("logprobs") is not None:
        changes["logprobs"] = body["logprobs"]
    bias = body.get("logit_bias")
    if bias is not None:  # OpenAI's JSON keys are token ids as strings
        if not isinstance(bias, dict) or not all(isinstance(k, str) and re.fullmatch(r"\d{1,19}", k) for k in bias):
            raise bad_request(f"logit_bias must map token ids (as strings) to numbers, got {bias!r:.80}",
                              param="logit_bias")
        changes["logit_bias"] = {int(k): v for k, v in bias.items()}
    if not chat and flag(body, "echo"):
        if echo_only(body):  # OpenAI's echo of the prompt alone: one token runs, none is returned
            changes["max_tokens"] = 1
        if changes.get("logprobs") is not None and changes.get("prompt_logprobs") is None:
            changes["prompt_logprobs"] = changes["logprobs"]  # the echoed prompt's logprobs (vLLM's rule)
    changes["output_kind"] = RequestOutputKind.DELTA  # the server sends each chunk's new part (or gathers them)
    if body.get("prompt_logprobs") is not None and flag(body, "stream"):
        raise bad_request("prompt_logprobs is not available with stream: true (vLLM refuses it too): send stream: "
                          "false, or on /v1/completions echo: true with logprobs, whose first chunk carries the "
                          "prompt's logprobs", param="prompt_logprobs")
    try:
        return dataclasses.replace(defaults, **changes)
    except ValueError as e:
        raise bad_request(request_message(e, renamed), param=param_of(e, renamed)) from None


# What a beam search does not use: it keeps the likeliest sequences, so nothing that shapes a sample applies.
# vLLM drops these silently; here a value other than the field's default is a 400 naming it.
BEAM_UNUSED = ("top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
               "min_tokens", "stop", "stop_token_ids", "logit_bias", "allowed_token_ids", "bad_words",
               "truncate_prompt_tokens", "skip_special_tokens", "prompt_logprobs", "echo")
NO_TOP_K = (-1, 0)  # both mean "no top-k" to SamplingParams


def use_beam_search(body: dict) -> bool:
    """Whether the request asks for vLLM's beam search (use_beam_search: true). Raises a 400 for a field the
    search would ignore, or a length_penalty other than vLLM's default 1.0 without it (ignored too)."""
    if not flag(body, "use_beam_search"):
        penalty = body.get("length_penalty")
        if penalty is not None and not (type(penalty) in (int, float) and penalty == 1):  # 1: vLLM's default
            raise bad_request("length_penalty ranks the beams of a beam search: send it with use_beam_search: true, "
                              "or leave it out", param="length_penalty")
        return False
    neutral = SamplingParams()
    for name in BEAM_UNUSED:
        value, default = body.get(name), getattr(neutral, name, False)
        if not (value is None or value == default or value in ([], {}, "") or (name == "top_k" and value in NO_TOP_K)):
            raise bad_request(f"{name} is not used by a beam search (use_beam_search: true keeps the n likeliest "
                              f"sequences; nothing is sampled): leave {name} out, or sample without use_beam_search",
                              param=name)
    return True


def beam_search_params(body: dict, params: SamplingParams, max_tokens: int) -> BeamSearchParams:
    """A beam-search request's BeamSearchParams, as vLLM builds them: beam_width its n (1 when left out), its
    temperature, ignore_eos and include_stop_str_in_output (params: the request's SamplingParams), its
    length_penalty (default 1.0); max_tokens: the request's, or what the context leaves the prompt."""
    penalty, width = body.get("length_penalty"), body.get("n")
    try:
        return BeamSearchParams(beam_width=1 if width is None else width, max_tokens=max_tokens,
                                ignore_eos=params.ignore_eos,
                                temperature=params.temperature, length_penalty=1.0 if penalty is None else penalty,
                                include_stop_str_in_output=params.include_stop_str_in_output)
    except ValueError as e:  # BeamSearchParams.beam_width must be ... -> n
        renamed = {"beam_width": "n"}
        raise bad_request(request_message(e, renamed), param=param_of(e, renamed)) from None


def beam_width(body: dict) -> int:
    """A beam search's width: its n, checked as beam_search_params checks it (a 400 naming n)."""
    return beam_search_params(body, SamplingParams(), 1).beam_width


def echo_only(body: dict) -> bool:
    """A completion that echoes its prompt and generates nothing (echo: true, max_tokens: 0)."""
    return flag(body, "echo") and body.get("max_tokens") == 0


def template_options(body: dict) -> dict:
    """A chat request's template options (TEMPLATE_FIELDS; null or left out: LLM.chat's defaults) ->
    keyword arguments for Tokenizer.apply_chat_template."""
    given = {name: body[name] for name in TEMPLATE_FIELDS if body.get(name) is not None}
    try:
        return chat_template_options(**given)
    except ValueError as e:
        name = next((n for n in TEMPLATE_FIELDS if str(e).startswith(n)), None)
        raise bad_request(str(e), param=name or "chat_template_kwargs") from None


# What the server's JSON takes, where SamplingParams' own words (Python's None) would mislead a client:
# a null max_tokens is the server's default (64 on completions), not "up to max_model_len"
REQUEST_ACCEPTS = {"max_tokens": "an integer >= 1, or null for the server's default"}
PARAMS_FIELD = r"(?:SamplingParams|BeamSearchParams)\.(\w+)"  # how their ValueErrors name a field


def request_message(error: ValueError, renamed: dict | None = None) -> str:
    """A SamplingParams ValueError ("SamplingParams.top_p must be a number in (0, 1], got 0 (int)") in the
    request's terms: the request field's name (top_logprobs for logprobs, max_completion_tokens for
    max_tokens), JSON's null, true and false for Python's None, True and False."""
    text = str(error)
    m = re.fullmatch(PARAMS_FIELD + r" must be (.*?), got (.*)", text, flags=re.DOTALL)
    if m is None:  # another shape: only the field's name changes
        return re.sub(PARAMS_FIELD, lambda f: (renamed or {}).get(f.group(1), f.group(1)), text)
    name, accepts, got = m.groups()
    accepts = REQUEST_ACCEPTS.get(name) or re.sub(r"\bNone\b", "null", accepts.replace("True or False",
                                                                                     "true or false"))
    return f"{(renamed or {}).get(name, name)} must be {accepts}, got {got}"


def param_of(error: ValueError, renamed: dict | None = None, default: str | None = None) -> str | None:
    """The request field a ValueError of SamplingParams names ("SamplingParams.top_p must ..."): its own
    name, or the request's for a renamed one (max_completion_tokens for max_tokens); else `default`."""
    m = re.match(PARAMS_FIELD, str(error))
    return (renamed or {}).get(m.group(1), m.group(1)) if m else default


def _token_ids(p) -> bool:
    return isinstance(p, list) and bool(p) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)


def completion_prompts(body: dict) -> list:
    """-> the prompts, as OpenAI's completions take them: one (a string, or a list of token ids) or
    several (a list of strings and token-id lists); each becomes a request of its own."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _token_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _token_ids(p) for p in prompt):
        return list(prompt)
    raise bad_request(f"prompt must be a non-empty string, a non-empty list of token ids, or a non-empty list of "
                      f"those, got {describe(prompt)}", param="prompt")


def chat_messages(body: dict) -> list[dict]:
    """-> the conversation, each message's content as a string (text parts joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"messages must be a non-empty list of {{\"role\", \"content\"}} objects, got "
                          f"{describe(messages)}", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string role and a content, got {m!r:.80}",
                              param="messages")
        content = m.get("content")
        if content is None:  # OpenAI's assistant content is optional (one that made tool calls has none)
            if m["role"] != "assistant":
                raise bad_request(f"messages[{i}] ({m['role']!r:.40}) has no content: only an assistant message "
                                  f"may leave it out or null", param="messages")
            content = ""
        try:  # a string, or a list of text parts: LLM.chat takes the same (minillm.tokenizer.text_content)
            content = text_content(content, f"messages[{i}].content")
        except ValueError as e:
            raise bad_request(str(e), param="messages") from None
        try:
            out.append({"role": m["role"], "content": content, **template_fields(m, f"messages[{i}]")})
        except ValueError as e:
            raise bad_request(str(e), param="messages") from None
    return out


# ---- responses -----------------------------------------------------------------------------------
def merge(into: dict[int, CompletionOutput], deltas: list[CompletionOutput]) -> None:
    """Add a step's deltas to the samples collected so far (by index)."""
    for d in deltas:
        c = into.setdefault(d.index, CompletionOutput(index=d.index, text="", token_ids=[],
                                                      logprobs=[] if d.logprobs is not None else None))
        c.text += d.text
        c.token_ids = c.token_ids + d.token_ids
        if d.logprobs is not None:
            c.logprobs = (c.logprobs or []) + d.logprobs
        c.cumulative_logprob = d.cumulative_logprob
        c.finish_reason = d.finish_reason or c.finish_reason
        c.stop_reason = c.stop_reason if d.stop_reason is None else d.stop_reason  # token id 0 is a stop reason


def _top(position: dict, k: int, chosen: int | None = None) -> list:
    """The k most likely (token id, Logprob) of one position, and the chosen token where given, most
    likely first."""
    ranked = [(t, lp) for t, lp in position.items() if t == chosen or (lp.rank is not None and lp.rank <= k)]
    return sorted(ranked, key=lambda x: x[1].rank or 0)


MIN_LOGPROB = -9999.0  # JSON has no -inf: a token a processed logprobs_mode dropped reads as this, as vLLM sends it


def _json_logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


def completion_logprobs(token_ids: list[int], positions: list | None, k: int, offset: int = 0,
                        first_token: str = "") -> dict | None:
    """OpenAI's legacy logprobs object (tokens, token_logprobs, top_logprobs, text_offset) of token_ids, each
    scored by its position's {token id: Logprob}; positions None: no logprobs were asked for. A position of
    None is an echoed prompt's first token, which nothing before it scores: it reads `first_token`, with
    null logprobs (as vLLM sends it)."""
    if positions is None:
        return None
    tokens, lps, tops, offsets = [], [], [], []
    for t, position in zip(token_ids, positions):
        if position is None:
            tokens.append(first_token)
            lps.append(None)
            tops.append(None)
        else:
            chosen = position[t]
            tokens.append(chosen.decoded_token or "")
            lps.append(_json_logprob(chosen.logprob))
            # the legacy API's top_logprobs: "the logprobs most likely tokens, as well the chosen tokens" (vLLM's)
            tops.append({lp.decoded_token or "": _json_logprob(lp.logprob) for _, lp in _top(position, k, chosen=t)})
        offsets.append(offset)
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs_json(positions: list | None) -> list | None:
    """vLLM's prompt_logprobs field: per prompt token None (the first) or {"token id": {"logprob", "rank",
    "decoded_token"}}, the prompt's own token first, then the k most likely."""
    if positions is None:
        return None
    return [None if p is None else {str(t): {"logprob": _json_logprob(lp.logprob), "rank": lp.rank,
                                             "decoded_token": lp.decoded_token} for t, lp in p.items()}
            for p in positions]


def chat_logprobs(c: CompletionOutput, k: int) -> dict | None:
    """OpenAI's chat logprobs object: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    if c.logprobs is None:
        return None

    def entry(lp) -> dict:
        text = lp.decoded_token or ""
        return {"token": text, "logprob": _json_logprob(lp.logprob), "bytes": list(text.encode("utf-8"))}

    return {"content": [dict(entry(position[t]), top_logprobs=[entry(lp) for _, lp in _top(position, k)])
                        for t, position in zip(c.token_ids, c.logprobs)]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
