"""What generate and chat return: one RequestOutput per prompt, holding one CompletionOutput per
sample (SamplingParams.n), with vLLM's names and fields, so a vLLM user's code runs unchanged:

    outs = llm.generate(prompts, SamplingParams(n=2, logprobs=3))
    outs[0].outputs[1].text; outs[0].outputs[0].logprobs[0]   # {token_id: Logprob(...), ...}
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

# the keys of the dict generate returned before RequestOutput: readable for one more release
_OLD_KEYS = ("text", "token_ids", "finish_reason")


@dataclass
class Logprob:
    """One token's log-probability at one position, its rank in the vocabulary (1 = most likely) and
    its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# per position, {token id: Logprob} for the top tokens and the chosen one (vLLM's SampleLogprobs)
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One sample of one prompt. text: its text, without the stop string or the stop token (EOS or a
    stop token id) that ended it unless SamplingParams.include_stop_str_in_output (token_ids keep a
    stop token, as in vLLM). finish_reason: "stop" (EOS, a stop token or string), "length"
    (max_tokens or max_model_len), "abort", or None while running; stop_reason: the stop string or
    stop token id that ended it (None for EOS and the rest); logprobs: one dict per token when
    SamplingParams.logprobs was set, with cumulative_logprob the sum of the chosen tokens'."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock times (time.time()) of one request's life: queued, first scheduled, first token read
    back, finished (None until then)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """The result of one prompt: request_id, prompt (its text when it was given as text, else None),
    prompt_token_ids, prompt_logprobs (with SamplingParams.prompt_logprobs: None for the first token,
    then one dict per token), outputs (n CompletionOutputs), finished, metrics, num_cached_tokens
    (prompt tokens whose K/V came from the prefix cache). Two are equal when they hold the same
    prompt and results: request_id, metrics (times) and num_cached_tokens are not compared."""

    request_id: str = field(compare=False)
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = field(default=None, compare=False)
    num_cached_tokens: int = field(default=0, compare=False)

    def __getitem__(self, key: str):
        """out["text"] etc.: the dict generate returned before (the first sample's fields). Deprecated."""
        if key not in _OLD_KEYS:
            raise KeyError(f"{key!r}: a RequestOutput is not a dict; its fields are request_id, prompt, "
                           f"prompt_token_ids, prompt_logprobs, outputs, finished, metrics")
        warnings.warn(f'out["{key}"] is deprecated: generate returns RequestOutput objects, as vLLM does; '
                      f"use out.outputs[0].{key}", DeprecationWarning, stacklevel=2)
        return getattr(self.outputs[0], key)

