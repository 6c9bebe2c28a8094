"""Beam search for the server (vLLM's `use_beam_search`), through the engine client like any request.

minillm.beam_search.search() is a generator: it yields each step's beams as token lists and is sent back
their one-token outputs. Here an event loop drives it: every live beam becomes one request of the
EngineClient (so beams share the running batch, the admission book and the prefix cache with everyone
else's requests), and the next step starts when they have all answered. The caller reads it as it reads
a request's AsyncStream: one output, at the end, holding the beam_width best sequences as samples
0 .. beam_width - 1 (vLLM's server sends a beam search's answer whole, also when streaming).

    stream = BeamSearchStream(async_llm, None, prompt_ids, BeamSearchParams(beam_width=4, max_tokens=16))
    async for out in stream:            # once
        print([c.text for c in out.outputs])
"""
from __future__ import annotations

import asyncio
import uuid

from minillm.beam_search import completion_output, search, step_params
from minillm.outputs import RequestOutput
from minillm.sampling_params import BeamSearchParams
from minillm.serving.async_engine import AsyncStream, EngineClient, EngineError, QueueFullError

QUEUE_RETRY_S = 0.01  # a step after the first waits this long for room in a full queue, then tries again


class BeamSearchStream:
    """One prompt's beam search, read as a request's stream (`async for out in stream`: one RequestOutput,
    finished, its outputs the best sequences, best first); abort() (or close()) ends it. The first step's
    requests are queued here, so a full queue raises QueueFullError now, as add_request does (the server's
    503); a later step waits for room instead: the search was accepted, and its beams go on."""

    def __init__(self, client: EngineClient, prompt: str | None, prompt_token_ids: list[int],
                 params: BeamSearchParams, request_id: str | None = None, with_logprobs: bool = True):
        self.request_id = request_id or uuid.uuid4().hex
        self.prompt, self.prompt_token_ids = prompt, prompt_token_ids
        self.finished = False
        self._aborted = False
        self._client, self._params, self._step = client, params, step_params(params)
        self._with_logprobs = with_logprobs  # the outputs carry each token's candidates (the server: if asked)
        self._steps = search([prompt_token_ids], params, client.checks.eos_token_ids)
        self._number = 1  # the step's number, in its requests' ids
        self._live: list[AsyncStream] = self._queue(next(self._steps))  # QueueFullError, EngineError

    def _queue(self, batch: list[list[int]]) -> list[AsyncStream]:
        ids = [f"{self.request_id}-step{self._number}-beam{i}" for i in range(len(batch))]
        return self._client.add_checked([(None, tokens, self._step) for tokens in batch], ids)

    async def _answers(self) -> list[RequestOutput]:
        """The live step's outputs, one per beam, in order."""
        answers = []
        for stream in self._live:
            last = None
            async for out in stream:
                last = out
            if self._aborted:
                raise StopAsyncIteration
            if last is None or not last.finished or not last.outputs[0].logprobs:
                raise EngineError(f"beam search {self.request_id}: a beam's request ended without its token")
            answers.append(last)
        return answers

    def __aiter__(self) -> "BeamSearchStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            while True:
                answers = await self._answers()
                try:
                    batch = self._steps.send(answers)
                except StopIteration as done:
                    best = done.value[0].sequences
                    break
                self._number += 1
                while True:
                    try:
                        self._live = self._queue(batch)
                        break
                    except QueueFullError:
                        await asyncio.sleep(QUEUE_RETRY_S)
                        if self._aborted:
                            raise StopAsyncIteration from None
        finally:
            self.finished = True
            for stream in self._live:  # a search cut short (the reader cancelled, an error): end its requests
                stream.abort()
        n = len(self.prompt_token_ids)
        outputs = [completion_output(beam, i, n, self._params, self._client.tokenizer, self._with_logprobs)
                   for i, beam in enumerate(best)]
        return RequestOutput(request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
                             prompt_logprobs=None, outputs=outputs, finished=True)

    def abort(self) -> None:
        """End the search now: the live step's requests are aborted (their blocks freed before the engine's
        next step). Idempotent."""
        self.finished = self._aborted = True
        for stream in self._live:
            stream.abort()

    close = abort
