"""Chapter 6 graded tests: serving.

References nobody here wrote: the `openai` package's own server-sent-events decoder
(openai._streaming.SSEDecoder, and its _SSELineDecoder to cut a byte stream into lines) and the
official openai client against the real server; the `tokenizers` library's own streaming decoder
(tokenizers.decoders.DecodeStream) and its Tokenizer.decode, on the tokenizer.json of qwen3-tiny (the
real Qwen vocabulary: byte-level BPE, which splits an emoji's UTF-8 bytes across tokens); plain
Python models of the rules (admission: each request waiting, running or ended, the counts taken
from the operation log); vLLM's benchmark_serving definitions of TTFT, TPOT, ITL and E2EL restated,
with percentiles from statistics.quantiles (method="inclusive": linear interpolation, as numpy's
default). Each exercise also runs alone in the engine (CPU, qwen3-tiny): the server streaming to
the openai client and to `bench serve`'s client (6.1), llm.generate / llm.stream / the server on a
completion full of split characters (6.2), an AsyncLLM under aborts and a full queue (6.3), and a
real `bench serve` run (6.4).

Some tests draw their inputs with hypothesis (properties.for_all: seeded, bounded); a failure
shrinks to a minimal input, which the message names.

    pytest tests/exercises/test_ch6.py --impl=exercises -m ex6_1
"""
import argparse
import asyncio
import dataclasses
import functools
import math
import os
import statistics
import time
from contextlib import contextmanager

import httpx
import numpy as np
import openai
import pytest
import torch
from hypothesis import strategies as st
from openai._streaming import SSEDecoder, _SSELineDecoder
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

from helpers import one_torch_thread, small_engine_args  # noqa: F401 (one_torch_thread: an autouse fixture)
from minillm import LLM, SamplingParams
from minillm import bench_serve
from minillm.bench_serve import RequestTrace
from minillm.course.exercises import use_impl
from minillm.course.grading import check_close, check_equal, check_that, check_type, require_written
from minillm.model_zoo import resolve_model
from minillm.serving import async_engine
from minillm.serving.async_engine import Admission, AsyncLLM, EngineError, QueueFullError, _Request
from minillm.tokenizer import Tokenizer
from mistakes import call_pure, suspects, suspects_of
from properties import for_all, outcome
from serving_helpers import server_handle

MODEL = "qwen3-tiny"
PROMPT = "Tell me a story about a robot."
TIMEOUT_S = 60  # the longest any wait on the engine or the server may take (a CPU under load)




@pytest.fixture(scope="module")
def server():
    """One qwen3-tiny server for the in-engine tests (each swaps its exercise in while it runs)."""
    with server_handle(MODEL) as handle:
        yield handle


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=TIMEOUT_S, max_retries=0)


# ---- 6.1 server-sent events ---------------------------------------------------------------------------
def decoded_by_openai(stream: str) -> list[str]:
    """The data of every event the openai package's decoder reads in `stream`."""
    return [event.data for event in SSEDecoder().iter_bytes([stream.encode("utf-8")])]


PAYLOADS = ['{"a": 1}', "[DONE]", "", "two\nlines", "\nnewlines first and last\n", "  spaces kept  ",
            "unicode: naïve café 🤖 数字", "a: colon", "data: a field inside", ": a comment inside", "\n\n",
            '{"choices": [{"text": " the"}]}']


def written_the_same(impl, payloads: list[str]):
    """suspects_of's second look for sse_event: a known bug is named only if it writes exactly the student's
    text for these payloads (two bugs can give a reader the same events from different text: a missing data:
    line and a missing empty line both leave it nothing)."""
    written = lambda fn: outcome(lambda: [fn(d) for d in payloads])  # noqa: E731
    return written, lambda: written(impl.sse_event)


@pytest.mark.ex6_1
def test_sse_event_frames_decode_with_openai(impl):
    data = '{"a": 1}'
    check_equal(outcome(lambda: impl.sse_event(data)), 'data: {"a": 1}\n\n', "6.1",
                f"sse_event({data!r}) (the docstring's example: one data line, then an empty line)",
                suspects=suspects("sse_event", data))
    for data in PAYLOADS:
        check_equal(outcome(lambda: decoded_by_openai(impl.sse_event(data))), [data], "6.1",
                    f"the events the openai package's SSE decoder reads in sse_event({data!r}) (vs the data itself)",
                    suspects=suspects_of("sse_event", lambda fn, data=data: outcome(
                        lambda: decoded_by_openai(fn(data))), agree=written_the_same(impl, PAYLOADS)))
    stream = "".join(impl.sse_event(d) for d in PAYLOADS)
    check_equal(decoded_by_openai(stream), PAYLOADS, "6.1",
                f"the events the openai package's SSE decoder reads in the events of {PAYLOADS} written one after "
                f"the other", suspects=suspects_of("sse_event", lambda fn: outcome(
                    lambda: decoded_by_openai("".join(fn(d) for d in PAYLOADS))),
                    agree=written_the_same(impl, PAYLOADS)))


@pytest.mark.ex6_1
def test_sse_event_any_data(impl):
    """Any text without a carriage return (hypothesis: a failure shrinks to the shortest)."""
    def check(data):
        check_equal(outcome(lambda: decoded_by_openai(impl.sse_event(data))), [data], "6.1",
                    f"the events the openai package's SSE decoder reads in sse_event({data!r})",
                    suspects=suspects_of("sse_event", lambda fn: outcome(lambda: decoded_by_openai(fn(data))),
                                         agree=written_the_same(impl, [data])))
    for_all(st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=40), check)


def reads(fn, lines: list[str]) -> list:
    """fn(line, lines so far) for each line of a stream, in order: what it returns at each."""
    buffer: list[str] = []
    return [outcome(lambda line=line: fn(line, buffer)) for line in lines]


def read_by_openai(groups: list[tuple[list[str], bool]]) -> list[str | None]:
    """Per line, the data the openai package's decoder dispatches there. groups: (lines, whether they hold a
    data line), each ended by its empty line. (openai's decoder also dispatches an event without data, at
    an empty line after an event: or id: field; the spec, and sse_data, dispatch nothing there.)"""
    decoder, out = SSEDecoder(), []
    for lines, has_data in groups:
        for line in lines:
            event = decoder.decode(line)
            out.append(event.data if event is not None and has_data else None)
        assert has_data == (out[-1] is not None), f"the test's groups are mislabelled: {lines}"
    return out


STREAM = [  # (lines of one event, does it hold a data line); each group ends with its empty line
    ([": a comment first", ""], False),
    (["data: hello", ""], True),
    (["data:no space", ""], True),
    (["data:  two spaces, one dropped", "data: trailing spaces  ", ""], True),
    (["event: message", "id: 7", "data: first", "data", "data: third", ""], True),  # a bare "data": empty value
    (["retry: 100", "event: ping", ": keep-alive", ""], False),
    (['data: {"a": 1}', ": keep-alive inside an event", "data: : not a comment", ""], True),
    (["data:", ""], True),  # empty data
    (["Data: not data", "datum: nor this", "dataset: nor this", "event:data", ""], False),
    # a line of whitespace only is not the empty line: it is a field named " " (or "\t") with an empty value,
    # ignored, so the event goes on; nor is a name with a space in it "data"
    (["data: x", " ", "data: y", "\t", "data : not data", " data: nor this", "data:z", ""], True),
    ([" ", "  ", ""], False),
    (["data: [DONE]", ""], True),
]


@pytest.mark.ex6_1
def test_sse_data_reads_a_stream(impl):
    lines = [line for group, _ in STREAM for line in group]
    want, got = read_by_openai(STREAM), reads(impl.sse_data, lines)
    # the stream is long: say where the two part first, at which line
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None) if isinstance(got, list) else None
    where = "" if first is None else f"; first at line {first}, {lines[first]!r}: got {got[first]!r}, expected " \
                                     f"{want[first]!r}"
    check_equal(got, want, "6.1", f"what sse_data returns at each line of the stream (vs the openai package's SSE "
                f"decoder{where})", suspects=suspects_of("sse_data", lambda fn: reads(fn, lines)))


WHITESPACE_LINES = [" ", "  ", "\t", " \t", "\x0b", "\x0c", "\xa0", "\u2028"]  # str.isspace(); no SSE line end
FIELD_VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)


@st.composite
def sse_line(draw) -> tuple[str, bool]:
    """One non-empty line of an event: (the line, is it a data line)."""
    kind = draw(st.sampled_from(["data", "data", "bare data", "comment", "field", "no colon", "whitespace"]))
    sep = draw(st.sampled_from(["", " ", "  "]))
    if kind == "data":
        return f"data:{sep}{draw(FIELD_VALUE)}", True
    if kind == "bare data":
        return "data", True
    if kind == "comment":
        return ":" + draw(FIELD_VALUE), False
    if kind == "whitespace":  # not the empty line that ends an event: a field named by the whitespace, ignored
        return draw(st.sampled_from(WHITESPACE_LINES)), False
    name = draw(st.sampled_from(["event", "id", "retry", "Data", "datum", "dataset", "data ", " data", " ", "\t"]))
    return (f"{name}:{sep}{draw(FIELD_VALUE)}" if kind == "field" else name), False


@st.composite
def sse_streams(draw):
    """Events (groups of lines, each ended by an empty line) written with one line ending; -> (the stream's
    text, the groups)."""
    groups = []
    for _ in range(draw(st.integers(1, 5))):
        body = draw(st.lists(sse_line(), max_size=4))
        groups.append(([line for line, _ in body] + [""], any(is_data for _, is_data in body)))
    ending = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    return "".join(line + ending for lines, _ in groups for line in lines), groups


@pytest.mark.ex6_1
def test_sse_data_agrees_with_openai_on_any_stream(impl):
    """Generated streams: comments, data with and without the space, multi-line data, event:/id:/retry:
    fields, unusual field names ('data ', ' data', ' '), lines of whitespace only (a field, not the empty
    line that ends an event), lines without a colon, empty data, ending in \\n, \\r\\n or \\r; the lines
    are cut by openai's own line decoder (hypothesis: a failure shrinks to the fewest, shortest lines)."""
    def check(case):
        text, groups = case
        splitter = _SSELineDecoder()
        lines = [raw.decode("utf-8") for raw in [*splitter.feed(text.encode("utf-8")), *splitter.finish()]]
        assert lines == [line for group, _ in groups for line in group], "openai's line decoder cut other lines"
        check_equal(reads(impl.sse_data, lines), read_by_openai(groups), "6.1",
                    f"what sse_data returns at each line of the stream {text!r} (vs the openai package's decoder)",
                    suspects=suspects_of("sse_data", lambda fn: reads(fn, lines)))
    for_all(sse_streams(), check)


async def bench_client_trace(base_url: str, prompt: list[int], max_tokens: int) -> RequestTrace:
    """One streamed request sent by `bench serve`'s client (minillm.bench_serve.send_request)."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S)) as client:
        payload = bench_serve._payload(MODEL, prompt, max_tokens, 0.0)
        return await bench_serve.send_request(client, base_url + "/v1/completions", payload, time.perf_counter(),
                                              max_tokens)


@pytest.mark.ex6_1
def test_sse_in_the_server(impl_name, server):
    """Your 6.1 alone in the server and in `bench serve`'s client (qwen3-tiny, CPU): the official openai
    client's streamed completion and chat join to the server's non-streamed text; bench serve's client
    reads every chunk and the usage."""
    require_written(impl_name, "6.1")
    client, max_tokens = openai_client(server), 12
    ids = server.async_llm.tokenizer.encode(PROMPT)
    messages = [{"role": "user", "content": PROMPT}]
    with use_impl(impl_name, exercises={"6.1"}):
        plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=max_tokens, temperature=0)
        chunks = list(client.completions.create(model=MODEL, prompt=ids, max_tokens=max_tokens, temperature=0,
                                                stream=True))
        chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)
        chat_chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                                          temperature=0, stream=True,
                                                          stream_options={"include_usage": True}))
        trace = asyncio.run(bench_client_trace(server.base_url, ids, max_tokens))
    want = plain.choices[0]
    check_equal(("".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason if chunks else None),
                (want.text, want.finish_reason), "6.1", "(text, finish_reason) of a completion streamed to the openai "
                "client through your 6.1 (vs the same request not streamed)")
    check_equal(("".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices),
                 chat_chunks[-1].usage.completion_tokens if chat_chunks and chat_chunks[-1].usage else None),
                (chat.choices[0].message.content, chat.usage.completion_tokens), "6.1",
                "(text, usage.completion_tokens) of a chat completion streamed to the openai client through your "
                "6.1 (vs the same request not streamed)")
    # a reader that falls behind gets merged deltas (AsyncLLM), so two streams of one completion may
    # come in different numbers of chunks: at least one, and at most one per token
    check_equal((trace.error, trace.output_tokens, 1 <= len(trace.chunk_times) <= max_tokens),
                ("", plain.usage.completion_tokens, True), "6.1",
                "(error, output tokens, 1 <= chunks <= tokens) of the same completion read by bench serve's client "
                "with your sse_data (vs the server's usage)")


# ---- 6.2 incremental detokenization -------------------------------------------------------------------
@functools.cache
def qwen_tokenizers() -> tuple[Tokenizer, HFTokenizer]:
    """minillm's Tokenizer and the tokenizers library's, both from qwen3-tiny's tokenizer.json."""
    path = resolve_model(MODEL)
    return Tokenizer(path), HFTokenizer.from_file(os.path.join(path, "tokenizer.json"))


DETOK_TEXTS = ["naïve café 🤖🚀 数字 👩‍👩‍👧 ✨", "Ünïcödé: ½ ÷ ∞ — “quotes” … ©®", "日本語のテキストと한국어 텍스트",
               "🧑🏽‍🚀 flags 🇫🇷🇯🇵 keycap 1️⃣ end 🎉", "<|im_start|>assistant\nOK 👍🏿<|im_end|>",
               "a real \ufffd in the text (mojibake), then 🤖 done"]  # a U+FFFD the text holds: not half a character


class DecodeLog:
    """minillm's Tokenizer, recording how many ids each decode call is given."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens)


def deltas_by(fn, tokenizer, ids: list[int], skip: bool, chunks: list[int] | None = None,
              offsets: bool = False) -> list:
    """fn's text deltas as the tokens arrive one at a time (or `chunks` at a time, cycling), each call given
    every token so far and the offsets the previous call returned (offsets: each call's whole result, the
    offsets it returned with the text)."""
    out, prefix_offset, read_offset, n, k = [], 0, 0, 0, 0
    while n < len(ids):
        n = min(len(ids), n + (chunks[k % len(chunks)] if chunks else 1))
        k += 1
        text, prefix_offset, read_offset = fn(tokenizer, ids[:n], prefix_offset, read_offset, skip)
        out.append((text, prefix_offset, read_offset) if offsets else text)
    return out


def decode_stream_deltas(ids: list[int], skip: bool) -> list[str]:
    """The tokenizers library's own streaming decoder, one token at a time ("" where it emits nothing)."""
    _, hf = qwen_tokenizers()
    stream = DecodeStream(skip_special_tokens=skip)
    return [stream.step(hf, i) or "" for i in ids]


def check_detokenizer(impl, text: str, skip: bool) -> None:
    tok, hf = qwen_tokenizers()
    ids = hf.encode(text, add_special_tokens=False).ids
    run = lambda fn: outcome(lambda: deltas_by(fn, tok, ids, skip))  # noqa: E731
    got = run(impl.detokenize_incrementally)
    check_equal(got, decode_stream_deltas(ids, skip), "6.2",
                f"the text each token of {text!r} (ids {ids}) adds, the tokens arriving one at a time, "
                f"skip_special_tokens={skip} (vs the tokenizers library's DecodeStream: each piece as soon as its "
                f"characters are complete)", suspects=suspects_of("detokenize_incrementally", run))
    check_equal("".join(got), hf.decode(ids, skip_special_tokens=skip), "6.2",
                f"the deltas of {text!r} joined (vs decoding every token at once)")


@pytest.mark.ex6_2
def test_detokenize_matches_decode_stream(impl):
    for text in DETOK_TEXTS:
        for skip in (True, False):
            check_detokenizer(impl, text, skip)


class DecodeWith:
    """minillm's Tokenizer.decode(ids, skip_special_tokens) over a tokenizers.Tokenizer."""

    def __init__(self, hf: HFTokenizer):
        self.hf = hf

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)


# SentencePiece's convention (Llama 2, T5, Gemma): "▁" marks a word's start and the decoder turns it into a
# space, except at the very start of the text; so a token's text depends on whether a token comes before it
SENTENCEPIECE_WORDS = ["<unk>", "▁Hello", "▁world", ",", "▁how", "▁are", "▁you", "?", "▁ca", "fé", "s", "▁"]
SENTENCEPIECE_SPECIAL = "<s>"  # a special token (id len(SENTENCEPIECE_WORDS)): skip_special_tokens drops its text
SENTENCEPIECE_CASES = [  # (ids, skip_special_tokens)
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2], True),
    # special tokens between words, skipped: the token after one is not at the start of the text
    ([1, 12, 2, 3, 12, 4, 5, 12, 12, 6, 7], True),
    ([1, 12, 2, 3, 12, 4, 5, 12, 12, 6, 7], False),
]


SENTENCEPIECE_CHUNKS = ([2], [1, 2], [3])  # tokens per call, cycling


@pytest.mark.ex6_2
def test_detokenize_a_sentencepiece_decoder(impl):
    """A tokenizer whose decoding depends on the tokens before (tokenizers' Metaspace decoder, SentencePiece's
    word-start spaces), with special tokens between words (skipped or not): every delta as the tokenizers
    library's DecodeStream gives it."""
    from tokenizers import AddedToken, decoders, models
    hf = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(SENTENCEPIECE_WORDS)}, unk_token="<unk>"))
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    hf.add_special_tokens([AddedToken(SENTENCEPIECE_SPECIAL, special=True)])
    for ids, skip in SENTENCEPIECE_CASES:
        stream = DecodeStream(skip_special_tokens=skip)
        want = [stream.step(hf, i) or "" for i in ids]
        def run(fn, ids=ids, skip=skip, offsets=False):
            return outcome(lambda: deltas_by(fn, DecodeWith(hf), ids, skip, offsets=offsets))
        # a second look before a bug is named: the offsets too (decoding the new tokens alone and a window that
        # starts at the newest tokens give the same text by different offsets)
        with_offsets = (lambda fn, run=run: run(fn, offsets=True), lambda run=run: run(impl.detokenize_incrementally,
                                                                                       offsets=True))
        specials = (f", {SENTENCEPIECE_SPECIAL!r} (id {len(SENTENCEPIECE_WORDS)}) a special token between words, "
                    f"skip_special_tokens={skip}" if len(SENTENCEPIECE_WORDS) in ids else "")
        check_equal(run(impl.detokenize_incrementally), want, "6.2",
                    f"the text each token of {hf.decode(ids, skip_special_tokens=skip)!r} (ids {ids}{specials}) adds, "
                    f"decoded SentencePiece's way (the word-start '▁' is a space except at the start of a text), "
                    f"tokens one at a time (vs the tokenizers library's DecodeStream)",
                    suspects=suspects_of("detokenize_incrementally", run, agree=with_offsets))
        # tokens arriving several at a time (a step that read back more than one): a window that keeps too
        # little context decodes a word after a skipped special token as the start of a text, without its space
        for chunks in SENTENCEPIECE_CHUNKS:
            joined = lambda fn, ids=ids, skip=skip, chunks=chunks: outcome(  # noqa: E731
                lambda: "".join(deltas_by(fn, DecodeWith(hf), ids, skip, chunks)))
            check_equal(joined(impl.detokenize_incrementally), hf.decode(ids, skip_special_tokens=skip), "6.2",
                        f"the deltas of ids {ids}{specials} joined, the tokens arriving {chunks} at a time (vs "
                        f"decoding them all at once)", suspects=suspects_of("detokenize_incrementally", joined))


# characters whose UTF-8 bytes byte-level BPE splits across tokens, beside ASCII ones
DETOK_ALPHABET = list("ab ,.\n7") + ["é", "ï", "ß", "Ω", "½", "—", "“", "…", "数", "字", "日", "本", "한", "🤖", "🚀",
                                     "👩", "\u200d", "🏽", "🇫", "🇷", "✨", "\ufe0f"]


@pytest.mark.ex6_2
def test_detokenize_any_text(impl):
    """Random texts (hypothesis: a failure shrinks to the shortest): one token at a time as DecodeStream; and
    tokens arriving several at a time (as after a step that read back more than one): the deltas never hold
    U+FFFD and join to the full decode."""
    tok, hf = qwen_tokenizers()

    def check(case):
        text, chunks = case
        check_detokenizer(impl, text, True)
        ids = hf.encode(text, add_special_tokens=False).ids
        run = lambda fn: outcome(lambda: deltas_by(fn, tok, ids, True, chunks))  # noqa: E731
        got = run(impl.detokenize_incrementally)
        check_equal(("".join(got), [d for d in got if "\ufffd" in d]), (hf.decode(ids), []), "6.2",
                    f"(the deltas joined, the deltas holding U+FFFD) of {text!r} (ids {ids}), the tokens arriving "
                    f"{chunks} at a time (vs decoding every token at once, and none)",
                    suspects=suspects_of("detokenize_incrementally", lambda fn: (lambda d: d if isinstance(d, str)
                                         else ("".join(d), [x for x in d if "\ufffd" in x]))(run(fn))))
    texts = st.lists(st.sampled_from(DETOK_ALPHABET), min_size=1, max_size=24).map("".join)
    for_all(st.tuples(texts, st.lists(st.integers(1, 3), min_size=1, max_size=4)), check)


def decode_stream_largest_window(ids: list[int]) -> int:
    """The most ids DecodeStream decodes at once on these tokens. Its bookkeeping (tokenizers'
    step_decode_stream): it keeps ids from the start of the piece it emitted last; at an emission it drops
    the ids before that start, and the new piece's start is where the dropped window ended."""
    _, hf = qwen_tokenizers()
    stream = DecodeStream(skip_special_tokens=True)
    window, prefix_index, largest = 0, 0, 0
    for i in ids:
        window += 1
        largest = max(largest, window)
        if stream.step(hf, i) is not None:
            window, prefix_index = window - prefix_index, window - prefix_index
    return largest


@pytest.mark.ex6_2
def test_detokenize_window_stays_short(impl):
    """A long completion (every text of DETOK_TEXTS, 6 times): no decode call is given more ids than
    DecodeStream's window (the last piece emitted and the tokens after it), however long the text."""
    tok, hf = qwen_tokenizers()
    ids = hf.encode(" ".join(DETOK_TEXTS * 6), add_special_tokens=False).ids
    limit = decode_stream_largest_window(ids)

    @functools.cache
    def decoded(fn) -> tuple[int, list | str]:
        """(the most ids one decode call was given, the offsets each call returned)."""
        log = DecodeLog(tok)
        steps = outcome(lambda: deltas_by(fn, log, ids, True, offsets=True))
        return max(log.sizes, default=0), steps if isinstance(steps, str) else [step[1:] for step in steps]

    got = decoded(impl.detokenize_incrementally)[0]
    if got > limit:
        # a second look before a bug is named: the offsets it returns too (a window that never slides and a
        # decode from ids[0] whatever the offsets say both end up decoding every id)
        check_equal(got, limit, "6.2", f"the most ids one tokenizer.decode call was given over a completion of "
                    f"{len(ids)} tokens (DecodeStream's largest window: {limit}; at most that)",
                    suspects=suspects_of("detokenize_incrementally", lambda fn: decoded(fn)[0],
                                         agree=(lambda fn: decoded(fn)[1],
                                                lambda: decoded(impl.detokenize_incrementally)[1])))


class ScriptedSampler:
    """Stands in for the engine's sampler: whatever the logits, the completion's k-th token is script[k]
    (the model still runs every step; only the choice of token is fixed), for a batch of one request."""

    def __init__(self, script: list[int]):
        self.script, self.calls = script, 0

    def __call__(self, logits: torch.Tensor, temperatures: torch.Tensor, *args, num_logprobs=None, **kwargs):
        token = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return torch.full((logits.shape[0],), token, dtype=torch.long, device=logits.device)


SPLIT_TEXT = "Streaming 🤖🚀 naïve café 数字 👩‍👩‍👧 ✨ done 🎉"  # 24 tokens; 8 end inside a character
SPLIT_STOP = "✨"  # a stop string whose bytes are split across two tokens


@contextmanager
def scripted(runner, script: list[int]):
    before = runner.sampler
    runner.sampler = ScriptedSampler(script)
    try:
        yield
    finally:
        runner.sampler = before


@pytest.mark.ex6_2
def test_detokenizer_in_the_engine(impl_name, server):
    """Your 6.2 alone in the engine (qwen3-tiny, CPU) on a completion forced to SPLIT_TEXT's tokens: llm.stream
    and the server's stream (the official openai client) join to the full decode and never show U+FFFD; a stop
    string made of split bytes stops generation at the token that completes it."""
    require_written(impl_name, "6.2")
    _, hf = qwen_tokenizers()
    script = hf.encode(SPLIT_TEXT, add_special_tokens=False).ids
    full = hf.decode(script)
    stop_at = next(k for k in range(1, len(script) + 1) if SPLIT_STOP in hf.decode(script[:k]))
    params = SamplingParams(temperature=0.0, max_tokens=len(script), ignore_eos=True)
    with use_impl(impl_name, exercises={"6.2"}):
        llm = LLM(MODEL, **small_engine_args())
        try:
            with scripted(llm.engine.model_runner, script):
                streamed = list(llm.stream(PROMPT, params))
            with scripted(llm.engine.model_runner, script):
                stopped = llm.generate(PROMPT, dataclasses.replace(params, stop=[SPLIT_STOP]), use_tqdm=False)
        finally:
            llm.shutdown()
        with scripted(server.async_llm.engine.model_runner, script):
            served = [c.choices[0].text for c in openai_client(server).completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=len(script), temperature=0, stream=True,
                extra_body={"ignore_eos": True}) if c.choices]
    for deltas, where in ((streamed, "llm.stream"), (served, "the server's stream")):
        check_equal(("".join(deltas), [d for d in deltas if "\ufffd" in d]), (full, []), "6.2",
                    f"(the text deltas of {where} joined, the deltas holding U+FFFD) using your 6.2, the completion "
                    f"forced to the tokens of {SPLIT_TEXT!r} (vs decoding them all at once, and none)")
    out = stopped[0].outputs[0]
    check_equal((out.token_ids, out.text, out.finish_reason), (script[:stop_at], full[:full.index(SPLIT_STOP)], "stop"),
                "6.2", f"(tokens, text, finish_reason) of the same completion with stop={[SPLIT_STOP]!r}, using your "
                "6.2 (vs stopping at the first token whose decoded text holds the stop string)")


# ---- 6.3 admission and abort --------------------------------------------------------------------------
ADMISSION_FUNCTIONS = ("admit", "start", "abort_request", "finish")


def new_request(request_id: str) -> _Request:
    return _Request(request_id, None, [1, 2, 3], SamplingParams(max_tokens=1), loop=None, outbox=[])


def run_admission(fns: dict, max_waiting: int, ops: list[tuple[str, object]]) -> list[tuple]:
    """Apply ops to a fresh Admission through fns (admit, start, abort_request, finish). An op is
    ("admit", id), ("abort", id), ("start", k) or ("finish", k), k naming the k-th request admitted so far
    (modulo their number). -> per op (its outcome, num_waiting, the ids in book.requests, and (waiting,
    aborted) of every request admitted so far)."""
    book, admitted, out = Admission(max_waiting), [], []
    for op, arg in ops:
        if op == "admit":
            req = new_request(arg)

            def call():
                try:
                    fns["admit"](book, req)
                except (ValueError, QueueFullError) as e:
                    return type(e).__name__
                admitted.append(req)
                return "admitted"
            result = outcome(call)
        elif op == "abort":
            got = outcome(lambda: fns["abort_request"](book, arg))
            result = next((f"request #{i}" for i, r in enumerate(admitted) if r is got), got)
        elif not admitted:
            result = "no request yet"
        else:
            req = admitted[arg % len(admitted)]
            result = outcome(lambda: fns["start" if op == "start" else "finish"](book, req))
        out.append((result, book.num_waiting, sorted(book.requests), [(r.waiting, r.aborted) for r in admitted]))
    return out


def admission_by_the_rules(max_waiting: int, ops: list[tuple[str, object]]) -> list[tuple]:
    """The same observations from a plain model: each admitted request is waiting, running or ended, and
    aborted or not; a request is admitted when fewer than max_waiting wait and no live one has its id."""
    state: list[list] = []  # per admitted request: [id, "waiting" | "running" | "ended", aborted]
    out = []
    for op, arg in ops:
        live = {s[0]: i for i, s in enumerate(state) if s[1] != "ended"}
        if op == "admit":
            if sum(s[1] == "waiting" for s in state) >= max_waiting:
                result = "QueueFullError"
            elif arg in live:
                result = "ValueError"
            else:
                state.append([arg, "waiting", False])
                result = "admitted"
        elif op == "abort":
            i = live.get(arg)
            result = None if i is None or state[i][2] else f"request #{i}"
            if result is not None:
                state[i][2] = True
        elif not state:
            result = "no request yet"
        else:
            s = state[arg % len(state)]
            if op == "start":
                result, s[1] = None, "running" if s[1] == "waiting" else s[1]
            else:
                result, s[1] = s[1] != "ended", "ended"
        out.append((result, sum(s[1] == "waiting" for s in state), sorted(s[0] for s in state if s[1] != "ended"),
                    [(s[1] == "waiting", s[2]) for s in state]))
    return out


def check_admission(impl, max_waiting: int, ops: list[tuple[str, object]]) -> None:
    fns = {name: getattr(impl, name) for name in ADMISSION_FUNCTIONS}
    got, want = run_admission(fns, max_waiting, ops), admission_by_the_rules(max_waiting, ops)
    first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    if first is None:
        return
    right = {name: getattr(async_engine, name) for name in ADMISSION_FUNCTIONS}  # minillm's: one bug at a time
    # a second look before a known bug is named: it must also behave as the student's code over these operations
    # and over SCENARIO (two bugs can go wrong at the same step the same way: a request with a live id while
    # the queue is full is refused with ValueError by an id checked first and by a > check of the queue alike)
    whole = lambda fns: (run_admission(fns, max_waiting, ops), run_admission(fns, 2, SCENARIO))  # noqa: E731
    suspected = {}
    for name in ADMISSION_FUNCTIONS:
        suspected.update(suspects_of(name, lambda fn, name=name: run_admission({**right, name: fn}, max_waiting,
                                                                                ops)[first],
                                     agree=(lambda fn, name=name: whole({**right, name: fn}), lambda: whole(fns))))
    check_equal(got[first], want[first], "6.3",
                f"(outcome, num_waiting, ids in book.requests, (waiting, aborted) of each admitted request) after "
                f"the operations {ops[:first + 1]} with max_waiting={max_waiting} (the last one is where it first "
                f"differs; ('start', k) and ('finish', k) take the k-th request admitted)", suspects=suspected)


SCENARIO = [("admit", "a"), ("admit", "b"), ("admit", "c"),  # max_waiting 2: c is refused
            ("abort", "b"), ("abort", "b"),  # b aborted while waiting; a second abort finds nothing
            ("finish", 1),  # ... and the engine ends it: its waiting slot is free again
            ("start", 0), ("start", 0),  # a runs its first step (twice told)
            ("admit", "a"),  # a is live: its id is in use
            ("admit", "c"), ("admit", "d"), ("admit", "e"),  # two wait again: e is refused
            ("finish", 0), ("finish", 0),  # a (running) finishes; finishing it again changes nothing
            ("abort", "a"),  # a has finished: nothing to abort
            ("start", 2), ("admit", "a"),  # c runs: a's id may be used again
            ("finish", 0),  # the first a, ended long ago, is told to finish again: the new a is not touched
            ("finish", 2), ("finish", 3), ("finish", 4)]


@pytest.mark.ex6_3
def test_admission_scenario(impl):
    check_admission(impl, 2, SCENARIO)


@st.composite
def admission_cases(draw):
    op = st.one_of(st.tuples(st.sampled_from(["admit", "abort"]), st.sampled_from("abc")),
                   st.tuples(st.sampled_from(["start", "finish"]), st.integers(0, 7)))
    return draw(st.integers(1, 3)), draw(st.lists(op, min_size=1, max_size=30))


@pytest.mark.ex6_3
def test_admission_any_operations(impl):
    """Random sequences of admit / start / abort / finish against the plain model (hypothesis: a failure
    shrinks to the fewest operations)."""
    for_all(admission_cases(), lambda case: check_admission(impl, *case))


@contextmanager
def engine_held(async_llm: AsyncLLM):
    """The engine thread cannot add or step while the test holds the engine's lock: accepted requests wait."""
    assert async_llm.engine.lock.acquire(timeout=TIMEOUT_S), "the engine's lock was not free"
    try:
        yield
    finally:
        async_llm.engine.lock.release()


_ENDED = object()


async def next_output(stream, async_llm: AsyncLLM):
    """The stream's next output, _ENDED at its end, or a string saying why none came: the engine thread
    stopped (a function of yours raised in it), the request failed, or TIMEOUT_S passed."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return await asyncio.wait_for(stream.__anext__(), 0.5)
        except StopAsyncIteration:
            return _ENDED
        except EngineError as e:
            return f"failed: {e}"
        except asyncio.TimeoutError:
            if not async_llm.is_running:
                return "no end: the engine thread has stopped"
            if time.monotonic() > deadline:
                return f"no end within {TIMEOUT_S} s"


async def drained(stream, async_llm: AsyncLLM) -> list | str:
    """Every output of a stream, to its end; or a string saying why it did not end (see next_output)."""
    outs = []
    while True:
        out = await next_output(stream, async_llm)
        if out is _ENDED:
            return outs
        if isinstance(out, str):
            return out
        outs.append(out)


def ending(outs: list | str) -> str | None:
    """How a drained stream ended: its last finish_reason, "nothing sent", or why it did not end."""
    if isinstance(outs, str):
        return outs
    return outs[-1].outputs[0].finish_reason if outs and outs[-1].outputs else "nothing sent"


def admit_outcome(async_llm: AsyncLLM, params: SamplingParams, streams: list) -> str:
    try:
        streams.append(async_llm.add_request(PROMPT, params))
        return "accepted"
    except Exception as e:  # noqa: BLE001 -- what add_request raised is the outcome
        return type(e).__name__


ABORT_MAX_WAITING = 3


async def abort_scenario(async_llm: AsyncLLM) -> None:
    """Requests aborted while waiting, while running, after finishing; then the queue again."""
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    waiting: list = []
    with engine_held(async_llm):  # nothing runs: every accepted request waits
        accepted = [admit_outcome(async_llm, long, waiting) for _ in range(ABORT_MAX_WAITING + 1)]
        check_equal(accepted, ["accepted"] * ABORT_MAX_WAITING + ["QueueFullError"], "6.3",
                    f"add_request x {ABORT_MAX_WAITING + 1} while the engine is held (max_waiting="
                    f"{ABORT_MAX_WAITING}) using your 6.3")
        for stream in waiting[1:]:  # aborted while waiting; twice, as a client and the server both may
            await async_llm.abort(stream.request_id)
            await async_llm.abort(stream.request_id)
    # a request aborted before the engine took it ends with nothing sent; one the engine had taken ends "abort"
    ended = [ending(await drained(s, async_llm)) for s in waiting[1:]]
    check_equal(ended, ["nothing sent" if e == "nothing sent" else "abort" for e in ended],
                "6.3", "how the streams of the requests aborted while waiting end (nothing sent, or 'abort')")
    running = waiting[0]
    first = await next_output(running, async_llm)  # it runs: its first output came
    got = first if isinstance(first, str) else "ended before any output" if first is _ENDED else "an output"
    check_equal(got, "an output", "6.3", "what the request that was not aborted sends first")
    await async_llm.abort(running.request_id)
    check_equal(ending(await drained(running, async_llm)), "abort", "6.3",
                "how the stream of a request aborted while running ends")
    done: list = []
    admit_outcome(async_llm, short, done)
    finished = ending(await drained(done[0], async_llm)) if done else "refused"
    if done:
        await async_llm.abort(done[0].request_id)  # after it finished: nothing happens
    # every stream has ended, so every request's finish() has run; the engine frees blocks before it says so
    bm = async_llm.engine.scheduler.block_manager
    deadline = time.monotonic() + TIMEOUT_S
    while bm.num_free_blocks < len(bm.blocks) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    check_equal((finished, async_llm.num_waiting,
                 async_llm.num_running, bm.num_free_blocks), ("length", 0, 0, len(bm.blocks)), "6.3",
                "(finish_reason of a short request, num_waiting, num_running, free KV blocks) after aborts while "
                "waiting, while running and after finishing, using your 6.3 (vs nothing left over: every block "
                "free)")
    again: list = []
    with engine_held(async_llm):
        accepted = [admit_outcome(async_llm, short, again) for _ in range(ABORT_MAX_WAITING + 1)]
    check_equal(accepted, ["accepted"] * ABORT_MAX_WAITING + ["QueueFullError"], "6.3",
                f"add_request x {ABORT_MAX_WAITING + 1} after the aborts (max_waiting={ABORT_MAX_WAITING}: no "
                f"waiting slot may have leaked) using your 6.3")
    outs = [ending(await drained(s, async_llm)) for s in again]
    check_equal(outs, ["length"] * ABORT_MAX_WAITING, "6.3", "how the requests accepted after the aborts end")


@pytest.mark.ex6_3
def test_admission_in_the_engine(impl_name):
    """Your 6.3 alone in an AsyncLLM (qwen3-tiny, CPU, max_waiting 3): a full queue refuses one more; requests
    aborted while waiting, while running and after finishing all end, and afterwards nothing waits, every
    KV block is free and the queue takes max_waiting requests again."""
    require_written(impl_name, "6.3")
    with use_impl(impl_name, exercises={"6.3"}):
        async_llm = AsyncLLM(LLM(MODEL, **small_engine_args()), max_waiting=ABORT_MAX_WAITING)
        try:
            asyncio.run(abort_scenario(async_llm))
        finally:
            async_llm.shutdown()


# ---- 6.4 latency figures ------------------------------------------------------------------------------
SAME_SUMS = dict(atol=1e-12, rtol=1e-9)  # the same float64 arithmetic in another order (seconds and ms)

TRACES = [  # hand-made: times in seconds
    RequestTrace(start=0.0, chunk_times=[0.25, 0.30, 0.45, 0.50], end=0.51, prompt_tokens=10, output_tokens=4),
    RequestTrace(start=1.0, chunk_times=[1.5, 1.6, 1.9], end=1.9, prompt_tokens=3, output_tokens=5),  # a chunk of 3
    RequestTrace(start=2.0, chunk_times=[2.125], end=2.2, prompt_tokens=7, output_tokens=1),  # one token: no TPOT/ITL
    RequestTrace(start=3.0, chunk_times=[3.2, 3.4], end=3.5, prompt_tokens=5, output_tokens=2,
                 error="error event: the engine failed"),  # failed after two chunks: excluded
    RequestTrace(start=4.0, prompt_tokens=5, error="HTTP 503: the server is busy"),  # failed before any chunk
    RequestTrace(start=5.0, chunk_times=[5.05, 5.10, 5.30, 5.31, 5.60, 5.625], end=5.7, prompt_tokens=9,
                 output_tokens=6),
    RequestTrace(start=6.0, end=6.05, prompt_tokens=4),  # no error, but the stream closed with no chunk: not completed
]


def by_definition(traces: list[RequestTrace]) -> dict[str, list[float]]:
    """vLLM's benchmark_serving definitions, restated, over the completed requests (no error, a chunk):
    TTFT = first chunk - send; E2EL = last chunk - send; TPOT = (E2EL - TTFT) / (output tokens - 1) for a
    request of more than one token; ITL = each gap between two consecutive chunks, all requests pooled."""
    done = [t for t in traces if not t.error and t.chunk_times]
    return {"ttfts": [t.chunk_times[0] - t.start for t in done],
            "e2e_latencies": [t.chunk_times[-1] - t.start for t in done],
            "tpots": [(t.chunk_times[-1] - t.chunk_times[0]) / (t.output_tokens - 1)
                      for t in done if t.output_tokens > 1],
            "itls": sorted(b - a for t in done for a, b in zip(t.chunk_times, t.chunk_times[1:]))}


def as_values(got, sort: bool = False) -> torch.Tensor:
    """A function's array as a float64 tensor (sorted: for pooled gaps, whose order is not specified)."""
    values = np.asarray(got, dtype=np.float64)
    return torch.from_numpy(np.sort(values) if sort else values)


def check_latencies(impl, traces: list[RequestTrace], what: str) -> None:
    want = by_definition(traces)
    for name in ("ttfts", "e2e_latencies", "tpots", "itls"):
        got = outcome(lambda fn=getattr(impl, name): fn(traces))
        if not (isinstance(got, str) and got.startswith("raised ")):  # (an error is reported with the values below)
            check_type(got, np.ndarray, "6.4", f"{name} must return a numpy array (float64 seconds: the signature "
                       f"says -> np.ndarray)", f"{name}({what})",
                       suspects=suspects_of(name, lambda fn: type(outcome(lambda: fn(traces))).__name__))
        if isinstance(got, np.ndarray):  # before the values: float32 ones differ from float64 past ~7 digits only
            dtype_of = lambda fn: str(getattr(outcome(lambda: fn(traces)), "dtype", None))  # noqa: E731
            wrong_dtype = f"({name}({what}) returned {got.tolist()} as {got.dtype})"
            check_that(None if got.dtype == np.float64 else wrong_dtype, "6.4", f"{name} must return float64 "
                       f"seconds (the reference's dtype, np.float64), got dtype {got.dtype}", actual=str(got.dtype),
                       suspects=suspects_of(name, dtype_of))
        values = lambda fn, traces=traces: outcome(lambda: as_values(fn(traces), sort=name == "itls"))  # noqa: E731
        # a known wrong version is named only if it agrees on the hand-made TRACES too: on a one-trace case two
        # bugs (a filter by chunks, a division by chunks) can give the same values
        agree = (lambda fn: outcome(lambda: values(fn, TRACES).tolist()),
                 lambda fn=getattr(impl, name): outcome(lambda: values(fn, TRACES).tolist()))
        if isinstance(values(getattr(impl, name)), str):  # it raised: say what (check_close wants a tensor)
            check_equal(values(getattr(impl, name)), want[name], "6.4", f"{name}({what}) in seconds (vs "
                        f"benchmark_serving's definition)", suspects=suspects_of(name, values, agree=agree))
        check_close(values(getattr(impl, name)), torch.tensor(want[name], dtype=torch.float64), "6.4",
                    f"{name}({what}) in seconds{' (sorted)' if name == 'itls' else ''} (vs benchmark_serving's "
                    f"definition)", **SAME_SUMS, suspects=suspects_of(name, values, agree=agree))


@pytest.mark.ex6_4
def test_latencies_by_their_definitions(impl):
    shown = [(t.start, t.chunk_times, t.output_tokens, t.error) for t in TRACES]
    check_latencies(impl, TRACES, f"traces of (start, chunk_times, output_tokens, error) {shown}")


@st.composite
def trace_lists(draw):
    traces = []
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, 100)) / 8
        gaps = draw(st.lists(st.integers(1, 40), max_size=6))
        chunks = [start + sum(gaps[:i + 1]) / 16 for i in range(len(gaps))]
        traces.append(RequestTrace(start=start, chunk_times=chunks, end=chunks[-1] if chunks else 0.0,
                                   output_tokens=len(chunks) + draw(st.integers(0, 3)),
                                   error=draw(st.sampled_from(["", "", "", "HTTP 500"]))))
    return traces


@pytest.mark.ex6_4
def test_latencies_on_any_traces(impl):
    """Random traces: completed, failed, with one chunk or none (hypothesis: a failure shrinks to the fewest)."""
    for_all(trace_lists(), lambda traces: check_latencies(
        impl, traces, f"traces of (start, chunk_times, output_tokens, error) "
                      f"{[(t.start, t.chunk_times, t.output_tokens, t.error) for t in traces]}"))


def summary_by_statistics(values_s: list[float], percentiles: tuple[float, ...]) -> dict[str, float]:
    """The summary in ms from the standard library: statistics.fmean, statistics.quantiles(n=1000,
    method="inclusive") (numpy's default linear interpolation, at tenths of a percent: 99.9 is cut point
    999); one value is every percentile; none is NaN. Keys: "mean", then "median" for 50 and "p90",
    "p99.9" for the others, as vLLM's benchmark names them."""
    ms = [v * 1e3 for v in values_s]
    out = {"mean": statistics.fmean(ms) if ms else math.nan}
    for p in percentiles:
        key = "median" if p == 50 else "p" + (str(int(p)) if float(p).is_integer() else str(p))
        out[key] = (math.nan if not ms else ms[0] if len(ms) == 1
                    else statistics.quantiles(ms, n=1000, method="inclusive")[round(p * 10) - 1])
    return out


def check_summary(impl, values: list[float], percentiles: tuple[int, ...] | None) -> None:
    args = (values,) if percentiles is None else (values, percentiles)
    want = summary_by_statistics(values, percentiles or (50, 90, 99))
    what = f"latency_percentiles({values}{'' if percentiles is None else f', {percentiles}'})"
    keys = lambda fn: outcome(lambda: sorted(fn(*args)))  # noqa: E731
    check_equal(keys(impl.latency_percentiles), sorted(want), "6.4", f"the keys of {what}",
                suspects=suspects_of("latency_percentiles", keys))
    def figures(fn):
        return outcome(lambda: torch.tensor([float(fn(*args)[k]) for k in want], dtype=torch.float64))
    check_close(figures(impl.latency_percentiles), torch.tensor(list(want.values()), dtype=torch.float64), "6.4",
                f"{list(want)} of {what}, in ms (vs statistics.fmean and statistics.quantiles(..., "
                f"method='inclusive'))", **SAME_SUMS, suspects=suspects_of("latency_percentiles", figures))


SUMMARY_CASES = [([], None), ([0.25], None), ([0.1, 0.3], None), ([0.5, 0.5, 0.5, 0.5, 1.0], None),
                 (np.random.default_rng(6).lognormal(-3, 1, 7).round(6).tolist(), None),
                 (np.random.default_rng(7).exponential(0.05, 100).round(6).tolist(), None),
                 ([0.012, 0.02, 0.031, 0.04, 0.5], (25, 50, 75, 95)),
                 # a tenth of a percent (vLLM's p99.9), and no 50 asked for (no "median" then)
                 (np.random.default_rng(9).lognormal(-3, 1, 40).round(6).tolist(), (90, 99, 99.9)),
                 # floats, as bench serve's --metric-percentiles parses "50,90,99" (keys "median", "p90", "p99")
                 (np.random.default_rng(10).lognormal(-3, 1, 12).round(6).tolist(), (50.0, 90.0, 99.0))]


@pytest.mark.ex6_4
def test_latency_percentiles_match_statistics(impl):
    for values, percentiles in SUMMARY_CASES:
        check_summary(impl, values, percentiles)
    # the values as a numpy array, as ttfts() and tpots() return them: the caller keeps the array (a second
    # summary of it must not see it scaled to ms)
    values = np.array(SUMMARY_CASES[4][0])
    call_pure(impl.latency_percentiles, "latency_percentiles", "6.4", values)


@pytest.mark.ex6_4
def test_latency_percentiles_any_values(impl):
    """Random latencies (hypothesis: a failure shrinks to the fewest)."""
    values = st.lists(st.integers(1, 10_000).map(lambda x: x / 1000), max_size=30)
    for_all(values, lambda v: check_summary(impl, v, None))


def bench_serve_args(base_url: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_serve.add_serve_args(parser)
    return parser.parse_args(["--base-url", base_url, "--num-prompts", "4", "--min-len", "4", "--max-input-len", "16",
                              "--max-output-len", "6", "--temperature", "0", "--seed", "3"])


@pytest.mark.ex6_4
def test_bench_serve_figures_in_the_engine(impl_name, server, monkeypatch):
    """Your 6.4 alone in a real `bench serve` run (4 requests at once against the qwen3-tiny server): each
    figure it reports equals the definitions' over the traces that run recorded."""
    require_written(impl_name, "6.4")
    recorded = []
    real_summarize = bench_serve.summarize

    def recording(traces, duration_s, *options):
        recorded.append(traces)
        return real_summarize(traces, duration_s, *options)

    monkeypatch.setattr(bench_serve, "summarize", recording)
    with use_impl(impl_name, exercises={"6.4"}):
        result = bench_serve.run_bench_serve(bench_serve_args(server.base_url))
    (traces,), (run,) = recorded, result["runs"]
    check_equal((run["completed"], run["failed"]), (4, 0), "6.4", "(completed, failed) requests of the bench run")
    for name, key in (("ttfts", "ttft"), ("tpots", "tpot"), ("itls", "itl"), ("e2e_latencies", "e2el")):
        want = summary_by_statistics(by_definition(traces)[name], (50, 90, 99))
        check_close(torch.tensor([float(run[f"{stat}_{key}_ms"]) for stat in want], dtype=torch.float64),
                    torch.tensor(list(want.values()), dtype=torch.float64), "6.4",
                    f"the bench's {[f'{stat}_{key}_ms' for stat in want]} using your 6.4 (vs the definitions over the "
                    f"run's traces)", **SAME_SUMS)
