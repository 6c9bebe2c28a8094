"""Beam search on top of generate, as vLLM's LLM.beam_search does it.

Each step sends every live beam, its whole token list, as a one-token request that asks for the
2 x beam_width likeliest next tokens with their logprobs; each candidate is the beam plus one of them,
and the beam_width best candidates of each prompt live on. Nothing is kept between steps but token
lists: the prefix cache (chapter 3) finds each beam's full blocks already computed, so a step computes
only the tokens past a beam's last full block. HF transformers instead keeps the beams as rows of one
batch and reorders their KV caches after every step; a paged cache shares them by block hash.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, Sequence

from tqdm.auto import tqdm

from minillm.outputs import CompletionOutput, RequestOutput
from minillm.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class BeamSearchSequence:
    """One beam (vLLM's fields): tokens, the prompt's included; logprobs, per generated token the step's
    {token id: Logprob} of its candidates; text, the whole sequence decoded (None without a tokenizer)."""

    tokens: list[int]
    logprobs: list[dict] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop": it emitted an EOS token; "length": max_tokens
    stop_reason: int | None = None  # the EOS token that finished it


@dataclass
class BeamSearchOutput:
    """The beam_width best sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(beam: BeamSearchSequence, eos_token_ids: set[int], length_penalty: float) -> float:
    """vLLM's ranking: cum_logprob / length ** length_penalty, the length counting the prompt but not a
    final EOS token (transformers' rule, which counts generated tokens only, ranks the same beams the same
    way when they are all of one length)."""
    length = len(beam.tokens) - (beam.finish_reason == "stop")
    return beam.cum_logprob / length ** length_penalty


def search(prompts: Sequence[list[int]], params: BeamSearchParams,
           eos_token_ids: set[int]) -> Generator[list[list[int]], list[RequestOutput], list[BeamSearchOutput]]:
    """The search as a generator, so that a plain loop (LLM.beam_search) and an event loop (the server) drive
    the same code: it yields each step's token lists, one per live beam of every prompt, and is sent back
    their one-token outputs (RequestOutputs with 2 x beam_width logprobs, in the same order). prompts:
    token-id lists. -> (its StopIteration's value) one BeamSearchOutput per prompt, its sequences sorted by
    beam_score, best first (text not yet set)."""
    rank = lambda beam: beam_score(beam, eos_token_ids, params.length_penalty)  # noqa: E731
    live = [[BeamSearchSequence(list(p))] for p in prompts]
    finished: list[list[BeamSearchSequence]] = [[] for _ in prompts]
    for _ in range(params.max_tokens):
        beams = [b for group in live for b in group]
        if not beams:  # every beam of every prompt ended in an EOS
            break
        outputs = iter((yield [b.tokens for b in beams]))
        for i, group in enumerate(live):
            candidates = []
            for beam in group:
                top = next(outputs).outputs[0].logprobs[0]  # the 2 x beam_width likeliest (and the sampled) token
                for token, lp in top.items():
                    child = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [top],
                                               beam.cum_logprob + lp.logprob)
                    if token in eos_token_ids and not params.ignore_eos:
                        child.finish_reason, child.stop_reason = "stop", token
                        finished[i].append(child)
                    else:
                        candidates.append(child)
            live[i] = sorted(candidates, key=rank, reverse=True)[:params.beam_width]
    for group in live:
        for beam in group:
            beam.finish_reason = "length"
    return [BeamSearchOutput(sorted(done + group, key=rank, reverse=True)[:params.beam_width])
            for done, group in zip(finished, live)]


def step_params(params: BeamSearchParams) -> SamplingParams:
    """What each step asks of the engine for every live beam: one token and its 2 x beam_width logprobs."""
    return SamplingParams(max_tokens=1, temperature=params.temperature, logprobs=2 * params.beam_width,
                          ignore_eos=True)


def beam_search(generate: Callable[[list[list[int]], SamplingParams], list[RequestOutput]],
                prompts: Sequence[list[int]], params: BeamSearchParams, eos_token_ids: set[int],
                use_tqdm: bool = False) -> list[BeamSearchOutput]:
    """search() driven by a plain loop: generate(token_id_lists, step_params) -> one RequestOutput each
    (LLM.generate). -> search's outputs."""
    steps, step = search(prompts, params, eos_token_ids), step_params(params)
    with tqdm(total=params.max_tokens, desc="Beam search", disable=not use_tqdm) as bar:
        try:
            batch = next(steps)
            while True:
                outputs = generate(batch, step)
                bar.update()
                batch = steps.send(outputs)
        except StopIteration as done:
            return done.value


def completion_output(beam: BeamSearchSequence, index: int, prompt_len: int, params: BeamSearchParams,
                      tokenizer, with_logprobs: bool = True) -> CompletionOutput:
    """A beam as sample `index` of one request's answer, as vLLM's server gives it: the generated tokens
    (a final EOS among them only with include_stop_str_in_output), their text without the EOS, special
    tokens kept ("" without a tokenizer), and (with_logprobs) the per-token logprobs of the beam's candidates."""
    generated = beam.tokens[prompt_len:]
    eos = beam.finish_reason == "stop"
    shown = generated[:-1] if eos else generated
    text = tokenizer.decode(shown, skip_special_tokens=False) if tokenizer is not None else ""
    token_ids = generated if (params.include_stop_str_in_output or not eos) else shown
    return CompletionOutput(index=index, text=text, token_ids=token_ids, cumulative_logprob=beam.cum_logprob,
                            logprobs=beam.logprobs[:len(token_ids)] if with_logprobs else None,
                            finish_reason=beam.finish_reason, stop_reason=beam.stop_reason)
