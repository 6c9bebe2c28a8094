"""Chapter 5 graded tests: the engine at speed.

References nobody here wrote: transformers' TopKLogitsWarper / TopPLogitsWarper / TemperatureLogitsWarper
(the sampler's masks and the distribution it must sample), transformers' models built on the meta
device (parameter counts, the K/V a DynamicCache holds per token), torch.utils.flop_counter on a
transformers forward (prefill FLOPs), transformers' stored greedy tokens, and plain Python models of
what the engine must do (a synchronous generation loop for the placeholders, closed-form sums for the
floor). Each exercise also runs alone inside the engine (the CUDA graph path through a CPU stand-in
that replays each "graph" eagerly), which must give the reference's tokens.

The sampler is graded on its distribution: N seeded draws against softmax(logits / T) restricted by
top-k / top-p, with an L1 bound a correct sampler exceeds with probability < FALSE_FAILURE. Some
tests draw their inputs with hypothesis (properties.for_all: seeded, bounded); a failure shrinks to
a minimal input, which the message names.

    pytest tests/exercises/test_ch5.py --impl=exercises -m ex5_1
"""
import argparse
import functools
import math
import types

import numpy as np
import pytest
import torch
from hypothesis import assume
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from helpers import TINY_MODELS, greedy_reference, ref_path, small_engine_args
from minillm import LLM, SamplingParams
from minillm.config import ModelConfig
from minillm.context import reset_context
from minillm.course.exercises import use_impl
from minillm.course.grading import Raised, check_close, check_equal, check_that, require_written
from minillm.engine.cuda_graph import DecodeGraphs
from minillm.engine.llm_engine import append_placeholders as right_append, fill_placeholders as right_fill
from minillm.engine.sequence import PLACEHOLDER_TOKEN
from minillm.layers import sampler as sampler_module
from minillm.model_zoo import QWEN3_06B, QWEN3_8B, resolve_model
from mistakes import call_pure, suspects, suspects_of
from properties import for_all, outcome

EXACT = dict(atol=0.0, rtol=0.0)
FLOAT_SUMS = dict(atol=0.0, rtol=1e-9)  # the same float64 sums in another order


# ---- 5.1 CUDA-graph buckets and padding ---------------------------------------------------------------
def sizes_by_the_rule(max_num_seqs: int) -> list[int]:
    """The docstring's rule, restated: 1, 2, 4, 8, the multiples of 16, and max_num_seqs, none above it."""
    wanted = {1, 2, 4, 8} | set(range(16, max_num_seqs + 1, 16)) | {max_num_seqs}
    return sorted(s for s in wanted if s <= max_num_seqs)


@pytest.mark.ex5_1
def test_graph_batch_sizes(impl):
    for m in (1, 2, 3, 8, 9, 16, 20, 33, 64, 100, 256, 512):
        check_equal(impl.graph_batch_sizes(m), sizes_by_the_rule(m), "5.1", f"graph_batch_sizes({m})",
                    suspects=suspects("graph_batch_sizes", m))


GRAPH_SIZE_CASES = ([1, 2, 4, 8, 16, 32, 48, 64], [1, 2, 3], [1, 2, 4, 8, 16, 20], [1])


@pytest.mark.ex5_1
def test_graph_size_for(impl):
    # a second look before a bug is named: its sizes for every batch (a batch larger than all sizes gets the largest
    # one from two different bugs)
    every = lambda fn: [outcome(lambda: fn(list(sizes), bs)) for sizes in GRAPH_SIZE_CASES  # noqa: E731
                        for bs in range(1, sizes[-1] + 3)]
    for sizes in GRAPH_SIZE_CASES:
        for bs in range(1, sizes[-1] + 3):
            want = min((s for s in sizes if s >= bs), default=None)
            check_equal(impl.graph_size_for(list(sizes), bs), want, "5.1", f"graph_size_for({sizes}, {bs})",
                        suspects=suspects_of("graph_size_for", lambda fn, sizes=sizes, bs=bs: fn(list(sizes), bs),
                                             agree=(every, lambda: every(impl.graph_size_for))))


GRAPH_ROWS, GRAPH_BLOCKS = 8, 6  # the host buffers: rows of the largest graph, block-table width
BUFFER_NAMES = ("ids", "positions", "slots", "context_lens", "block_tables")


def previous_step_buffers(seed: int) -> tuple[np.ndarray, ...]:
    """Host buffers as an earlier step of 8 real rows left them: every entry a plausible live value
    (no -1, no 0 length), so any row or column left unwritten shows."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1, 500, GRAPH_ROWS).astype(np.int32), rng.integers(1, 60, GRAPH_ROWS).astype(np.int32),
            rng.integers(0, 90, GRAPH_ROWS).astype(np.int32), rng.integers(1, 60, GRAPH_ROWS).astype(np.int32),
            rng.integers(0, 12, (GRAPH_ROWS, GRAPH_BLOCKS)).astype(np.int32))


def decode_batch(bs: int, width: int, seed: int) -> tuple[np.ndarray, ...]:
    """A decode batch of bs rows whose block tables are `width` columns wide (-1 after each table's end)."""
    rng = np.random.default_rng(1000 + seed)
    lens = rng.integers(1, width * 4 + 1, bs).astype(np.int32)  # block size 4
    tables = np.full((bs, width), -1, dtype=np.int32)
    for i, n in enumerate(lens):
        tables[i, :-(-n // 4)] = rng.permutation(12)[:-(-n // 4)]
    tables[0, :] = rng.permutation(12)[:width]  # the widest row fills the width
    lens[0] = width * 4
    pos = lens.astype(np.int64) - 1
    slots = tables[np.arange(bs), pos // 4].astype(np.int64) * 4 + pos % 4
    return rng.integers(0, 500, bs).astype(np.int64), pos, slots, lens, tables


def padded_by_the_rule(batch, padded: int, before) -> list[list]:
    """What the buffers must hold after padding `batch` to `padded` rows (the docstring's rule)."""
    ids, pos, slots, lens, tables = (b.copy() for b in before)
    b_ids, b_pos, b_slots, b_lens, b_tables = batch
    bs, width = len(b_ids), b_tables.shape[1]
    ids[:bs], pos[:bs], slots[:bs], lens[:bs] = b_ids, b_pos, b_slots, b_lens
    ids[bs:padded], pos[bs:padded], slots[bs:padded], lens[bs:padded] = 0, 0, -1, 0
    tables[:padded] = -1
    tables[:bs, :width] = b_tables
    return [a.tolist() for a in (ids, pos, slots, lens, tables)]


def padded_by(fn, batch, padded: int, before) -> list[list]:
    out = tuple(b.copy() for b in before)
    fn(*batch, padded, out)
    return [a.tolist() for a in out]


def check_padding(impl, bs: int, padded: int, width: int, seed: int) -> None:
    batch, before = decode_batch(bs, width, seed), previous_step_buffers(seed)
    buffer = lambda fn, k: outcome(lambda: padded_by(fn, batch, padded, before)[k])  # noqa: E731
    want = padded_by_the_rule(batch, padded, before)
    for k, name in enumerate(BUFFER_NAMES):
        check_equal(buffer(impl.pad_graph_inputs, k), want[k], "5.1", f"the {name} buffer after padding a batch of "
                    f"{bs} rows (block tables {width} wide) to {padded} rows, in buffers that held an earlier "
                    f"step's 8 rows (rows {padded}.. must keep them)",
                    suspects=suspects_of("pad_graph_inputs", lambda fn, k=k: buffer(fn, k)))


@pytest.mark.ex5_1
def test_pad_graph_inputs(impl):
    for bs, padded, width in [(3, 4, 2), (5, 8, 6), (1, 1, 1), (4, 4, 3), (2, 8, 1)]:
        check_padding(impl, bs, padded, width, seed=bs * 10 + padded)


@st.composite
def padding_cases(draw):
    bs = draw(st.integers(1, GRAPH_ROWS))
    return bs, draw(st.integers(bs, GRAPH_ROWS)), draw(st.integers(1, GRAPH_BLOCKS)), draw(st.integers(0, 3))


@pytest.mark.ex5_1
def test_pad_graph_inputs_any_batch(impl):
    """Any batch size, graph size and table width (hypothesis: a failure shrinks to the smallest)."""
    for_all(padding_cases(), lambda case: check_padding(impl, *case))


class EagerGraphs(DecodeGraphs):
    """The decode graphs on a CPU: every 'graph' replays its step eagerly on the same static buffers
    (a CUDA graph replays the kernels recorded from exactly that code). The engine's graph path runs
    as on a GPU, from the bucket choice and the padding to the step on the padded batch; `runs`
    records (batch size, graph size) of every replay."""

    def _capture_all(self) -> None:
        self.runs: list[tuple[int, int]] = []
        self.graphs = {bs: types.SimpleNamespace(replay=functools.partial(self._replay_eagerly, bs))
                       for bs in self.sizes}

    @torch.inference_mode()
    def _replay_eagerly(self, bs: int) -> None:
        self._set_context(bs)
        self._forward(bs)
        reset_context()

    def run(self, batch, *args, **kwargs):
        self.runs.append((len(batch.input_ids), self.padded_size(len(batch.input_ids))))
        return super().run(batch, *args, **kwargs)


GRAPH_PROMPTS = 5  # 5 requests ending at different lengths: the batch runs graphs of 8, 4, 2 and 1 rows
GRAPH_MAX_TOKENS = [8, 3, 6, 2, 8]
SEEDED = dict(temperature=0.9, top_k=20, seed=11, ignore_eos=True)


@pytest.mark.ex5_1
def test_graph_path_in_the_engine(impl_name):
    """Your 5.1 alone in the engine's CUDA-graph path (a CPU stand-in replays each graph eagerly on the
    padded buffers): greedy tokens equal transformers', seeded ones the engine's without graphs."""
    require_written(impl_name, "5.1")
    ref = greedy_reference()
    prompts = ref["prompts"][:GRAPH_PROMPTS]
    greedy = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in GRAPH_MAX_TOKENS]
    seeded = [SamplingParams(max_tokens=n, **SEEDED) for n in GRAPH_MAX_TOKENS]
    eager = LLM(ref_path("tiny-qwen3"), **small_engine_args(attention_backend="triton"))
    want_seeded = [o.outputs[0].token_ids for o in eager.generate(prompts, seeded, use_tqdm=False)]
    with use_impl(impl_name, exercises={"5.1"}):
        llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(attention_backend="triton"))
        runner, config = llm.engine.model_runner, llm.engine.config
        runner.graphs = graphs = EagerGraphs(runner.model, config.max_num_seqs, config.blocks_per_seq(), runner.device)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        got_seeded = [o.outputs[0].token_ids for o in llm.generate(prompts, seeded, use_tqdm=False)]
    check_equal(any(p is not None and p > b for b, p in graphs.runs), True, "5.1",
                f"some decode steps ran a larger graph with padding rows (batch, graph size: "
                f"{sorted(set(graphs.runs))})")
    check_equal(got, [t[:n] for t, n in zip(ref["tokens"]["tiny-qwen3"], GRAPH_MAX_TOKENS)], "5.1",
                "greedy tokens of the engine's graph path using your 5.1 (vs transformers)")
    check_equal(got_seeded, want_seeded, "5.1", "seeded sampled tokens of the graph path using your 5.1 "
                "(vs the engine without graphs)")


# ---- 5.2 async placeholders ---------------------------------------------------------------------------
P = PLACEHOLDER_TOKEN
EOS = {2, 11}  # two EOS ids, as a model whose config lists several has (the engine adds the tokenizer's)


@pytest.mark.ex5_2
def test_append_placeholders(impl):
    lists = [[5, 6, 7], [5, 6, 7, 40], [5, 6, 7, 40, P], [1] * 9, [5, 6, 7, 40], [1] * 8]
    args = ([3, 3, 3, 2, 3, 2], [4, 2, 3, 100, 3, 100], 10)  # prompt lengths, max_tokens, max_model_len

    def run(fn):
        copies = [list(t) for t in lists]
        positions, at_limit = fn(copies, *args)
        return (list(positions), [bool(x) for x in at_limit]), copies

    got, got_lists = run(impl.append_placeholders)
    # a second look before a bug is named: whole generations with it (two bugs can give the same at_limit here, one
    # lagging a token, one that does not count the placeholders, which lags one or two)
    generated = lambda fn: outcome(lambda: generate_asynchronously(fn, right_fill, PROBE_REQUESTS, PROBE_MAX_LEN))  # noqa: E731
    check_equal(got, ([3, 4, 5, 9, 4, 8], [False, True, True, True, False, False]), "5.2",
                "(positions, at_limit) for completions of 0, 1 (max_tokens 2) and 2 (max_tokens 3, the last still a "
                "placeholder) tokens, a 9-token sequence with max_model_len 10, and, one token short of their "
                "limits, a completion of 1 token with max_tokens 3 and an 8-token sequence",
                suspects=suspects_of("append_placeholders", lambda fn: run(fn)[0],
                                     agree=(generated, lambda: generated(impl.append_placeholders))))
    check_equal(got_lists, [t + [P] for t in lists], "5.2", "the token lists after append_placeholders",
                suspects=suspects_of("append_placeholders", lambda fn: run(fn)[1]))


FILL_ROWS = [  # (what, tokens, position, sampled, at_limit, params, expected outcome, expected tokens)
    ("a plain token", [9, 9, P, P], 2, 5, False, SamplingParams(), None, [9, 9, 5, P]),
    ("EOS", [9, P, P], 1, 2, False, SamplingParams(), "stop", [9, 2]),
    ("EOS with ignore_eos", [9, P, P], 1, 2, False, SamplingParams(ignore_eos=True), None, [9, 2, P]),
    ("a stop id with ignore_eos", [9, P, P], 1, 7, False, SamplingParams(ignore_eos=True, stop_token_ids=[7]),
     "stop", [9, 7]),
    ("a token of a request that stopped a step earlier", [9, 4], 2, 3, False, SamplingParams(), "dropped", [9, 4]),
    ("a token for a position that holds a real token, not a placeholder (the request ended)", [9, 4, 8], 1, 3, False,
     SamplingParams(), "dropped", [9, 4, 8]),
    ("at its limit, the next-to-last token", [9, P, P], 1, 5, True, SamplingParams(), None, [9, 5, P]),
    ("at its limit, the last token", [9, 5, P], 2, 6, True, SamplingParams(), "length", [9, 5, 6]),
    ("at its limit, the last token is EOS", [9, 5, P], 2, 2, True, SamplingParams(), "stop", [9, 5, 2]),
    ("the second of the two EOS ids", [9, P, P], 1, 11, False, SamplingParams(), "stop", [9, 11]),
    ("an EOS id that is also a stop id, with ignore_eos", [9, P, P], 1, 2, False,
     SamplingParams(ignore_eos=True, stop_token_ids=[2]), "stop", [9, 2]),
]


@pytest.mark.ex5_2
def test_fill_placeholders(impl):
    def run(fn):
        lists = [list(r[1]) for r in FILL_ROWS]
        outcomes = fn(lists, [r[2] for r in FILL_ROWS], [r[3] for r in FILL_ROWS], [r[4] for r in FILL_ROWS],
                      set(EOS), [r[5] for r in FILL_ROWS])
        return list(outcomes), lists

    rows = "; ".join(f"{i}: {r[0]}" for i, r in enumerate(FILL_ROWS))
    raised = outcome(lambda: run(impl.fill_placeholders))
    if isinstance(raised, str):  # it raised: say what, and which known bug raises the same
        check_equal(raised, ([r[6] for r in FILL_ROWS], [r[7] for r in FILL_ROWS]), "5.2",
                    f"(outcomes, token lists) of fill_placeholders on the rows ({rows})",
                    suspects=suspects_of("fill_placeholders", lambda fn: outcome(lambda: run(fn))))
    got, got_lists = raised
    check_equal(got, [r[6] for r in FILL_ROWS], "5.2", f"outcomes of the rows ({rows}; EOS = {sorted(EOS)})",
                suspects=suspects_of("fill_placeholders", lambda fn: run(fn)[0]))
    check_equal(got_lists, [r[7] for r in FILL_ROWS], "5.2", f"token lists after fill_placeholders ({rows})",
                suspects=suspects_of("fill_placeholders", lambda fn: run(fn)[1]))


def generate_synchronously(prompt_len: int, stream: list[int], params: SamplingParams, max_model_len: int):
    """The plain loop (one token at a time, each seen before the next is made). -> (completion, reason)."""
    completion = []
    for tok in stream:
        completion.append(tok)
        if (not params.ignore_eos and tok in EOS) or tok in params.stop_token_ids:
            return completion, "stop"
        if len(completion) >= params.max_tokens or prompt_len + len(completion) >= max_model_len:
            return completion, "length"
    raise AssertionError("the test's token stream is too short")


def generate_asynchronously(append, fill, requests, max_model_len: int, max_steps: int = 64):
    """The engine's loop on plain lists: launch a step (placeholders), then read back the step launched
    before; the 'device' samples stream[k] for completion token k. A finished request drops its
    placeholders, as LLMEngine._finish does. -> per request (completion, reason)."""
    reqs = [types.SimpleNamespace(tokens=[100] * n, n=n, stream=s, params=p, at_limit=False, reason=None)
            for n, s, p in requests]
    pending = None
    for _ in range(max_steps):
        launch = [r for r in reqs if r.reason is None and not r.at_limit]
        launched = None
        if launch:
            positions, at_limit = append([r.tokens for r in launch], [r.n for r in launch],
                                         [r.params.max_tokens for r in launch], max_model_len)
            for r, limit in zip(launch, at_limit):
                r.at_limit = r.at_limit or bool(limit)
            launched = [(r, pos, r.stream[(pos - r.n) % len(r.stream)]) for r, pos in zip(launch, positions)]
        if pending:
            rows = [row for row in pending if row[0].reason is None]
            outcomes = fill([r.tokens for r, _, _ in rows], [pos for _, pos, _ in rows], [t for _, _, t in rows],
                            [r.at_limit for r, _, _ in rows], set(EOS), [r.params for r, _, _ in rows])
            for (r, _, _), result in zip(rows, outcomes):
                if result in ("stop", "length"):
                    r.reason = result
                    while len(r.tokens) > r.n and r.tokens[-1] == P:
                        r.tokens.pop()
        pending = launched
        if not launch and not pending:
            break
    return [(r.tokens[r.n:], r.reason) for r in reqs]


PROBE_MAX_LEN = 9  # a second look for test_append_placeholders: requests ending by max_tokens and by max_model_len
PROBE_REQUESTS = [(3, [0, 1, 5, 3] * 4, SamplingParams(max_tokens=4)), (2, [5, 0] * 8, SamplingParams(max_tokens=1)),
                  (4, [1, 4, 0, 5] * 4, SamplingParams(max_tokens=10))]


@st.composite
def generation_requests(draw):
    """1-4 requests: prompt length, the tokens the 'device' samples (EOS is 2), SamplingParams; and max_model_len."""
    max_model_len = draw(st.integers(2, 14))
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        prompt_len = draw(st.integers(1, max_model_len - 1))
        stream = draw(st.lists(st.integers(0, 5), min_size=16, max_size=16))
        params = SamplingParams(max_tokens=draw(st.integers(1, 10)), ignore_eos=draw(st.booleans()),
                                stop_token_ids=draw(st.lists(st.sampled_from([2, 3, 4]), max_size=1)))
        requests.append((prompt_len, stream, params))
    return requests, max_model_len


@pytest.mark.ex5_2
def test_async_loop_matches_the_synchronous_one(impl):
    """One step late, with two placeholders in flight, every request ends exactly as the plain loop ends it
    (hypothesis: a failure shrinks to the fewest, shortest requests)."""
    def check(case):
        requests, max_model_len = case
        want = [generate_synchronously(n, s, p, max_model_len) for n, s, p in requests]
        got = outcome(lambda: generate_asynchronously(impl.append_placeholders, impl.fill_placeholders, requests,
                                                      max_model_len))
        described = [f"prompt {n}, samples {s[:len(w[0]) + 2]}..., max_tokens {p.max_tokens}, ignore_eos "
                     f"{p.ignore_eos}, stop_token_ids {p.stop_token_ids}" for (n, s, p), w in zip(requests, want)]
        suspected = {**suspects_of("append_placeholders", lambda fn: outcome(lambda: generate_asynchronously(
                        fn, right_fill, requests, max_model_len))),
                     **suspects_of("fill_placeholders", lambda fn: outcome(lambda: generate_asynchronously(
                        right_append, fn, requests, max_model_len)))}
        check_equal(got, want, "5.2", f"(completion, finish reason) of each request with async placeholders vs the "
                    f"synchronous loop (max_model_len {max_model_len}, EOS {sorted(EOS)}; requests: {described})",
                    suspects=suspected)
    for_all(generation_requests(), check)


@pytest.mark.ex5_2
def test_placeholders_in_the_engine(impl_name):
    """Your 5.2 alone in the engine with async scheduling: stops by a stop id (one step late, the extra
    token dropped), by max_tokens and by max_model_len give transformers' tokens, cut where they must be;
    seeded requests give the engine's own tokens."""
    require_written(impl_name, "5.2")
    ref = greedy_reference()
    prompts = ref["prompts"][:4] + ref["prompts"][:1]  # 1, 5, 17, 40 and 1 tokens
    tokens = ref["tokens"]["tiny-qwen3"]
    max_model_len = 48  # the 40-token prompt can take 8 tokens
    stop_at = [tokens[1][4], tokens[2][3], tokens[0][3]]  # stop ids: the first occurrence is where it stops
    cut = [t.index(s) + 1 for t, s in zip(tokens[1:3] + tokens[:1], stop_at)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_at[0]]),
              SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_at[1]]),
              SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
              # the last token max_tokens allows is a stop id: a stop
              SamplingParams(temperature=0.0, max_tokens=cut[2], ignore_eos=True, stop_token_ids=[stop_at[2]])]
    want = [(tokens[0][:6], "length"), (tokens[1][:cut[0]], "stop"), (tokens[2][:cut[1]], "stop"),
            (tokens[3][:max_model_len - 40], "length"), (tokens[0][:cut[2]], "stop")]
    seeded = [SamplingParams(temperature=1.0, max_tokens=n, seed=5 + n, stop_token_ids=[7, 300])
              for n in (3, 9, 12, 20, 4)]
    args = small_engine_args(async_scheduling=True, max_model_len=max_model_len)
    want_seeded = [(o.outputs[0].token_ids, o.outputs[0].finish_reason)
                   for o in LLM(ref_path("tiny-qwen3"), **args).generate(prompts, seeded, use_tqdm=False)]
    with use_impl(impl_name, exercises={"5.2"}):
        llm = LLM(ref_path("tiny-qwen3"), **args)
        got = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts, greedy, use_tqdm=False)]
        got_seeded = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts, seeded, use_tqdm=False)]
    check_equal(got, want, "5.2", "(tokens, finish_reason) of greedy requests with async scheduling using your 5.2 "
                "(vs transformers' tokens cut at max_tokens, at a stop id, at max_model_len, at a stop id that is "
                "the last token max_tokens allows)")
    check_equal(got_seeded, want_seeded, "5.2", "(tokens, finish_reason) of seeded requests with stop ids using your "
                "5.2 (vs minillm's own engine)")


# ---- 5.3 the Gumbel-max sampler ----------------------------------------------------------------------
def warped(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """transformers' warpers, in generate's order (temperature, top-k, top-p), on one row [V] -> [V]."""
    x = logits[None].float()
    if temperature > 0:
        x = TemperatureLogitsWarper(temperature)(None, x)
    if top_k is not None and top_k < x.shape[-1]:
        x = TopKLogitsWarper(top_k=top_k)(None, x)
    if top_p is not None and top_p < 1.0:
        x = TopPLogitsWarper(top_p=top_p)(None, x)
    return x[0]


def shown(logits: torch.Tensor) -> list:
    """Logits as a failure message prints them (fp32 values rounded back to what the test wrote)."""
    values = logits.tolist()
    return [[round(x, 4) for x in row] for row in values] if logits.dim() == 2 else [round(x, 4) for x in values]


def kept_by(mask_fn, logits: torch.Tensor, top_k: list[int] | None, top_p: list[float] | None) -> list[list[bool]]:
    k = None if top_k is None else torch.tensor(top_k)
    p = None if top_p is None else torch.tensor(top_p, dtype=torch.float32)
    return torch.isfinite(mask_fn(logits.clone(), k, p)).tolist()


MASK_PROBS = [0.30, 0.22, 0.15, 0.11, 0.08, 0.06, 0.04, 0.02, 0.01, 0.005, 0.003, 0.002]  # cumulative mass
# (top_k, top_p) per row; top_k 20 > V = 12: a request may ask for more tokens than the vocabulary has (all stay)
MASK_ROWS = [(3, 1.0), (12, 0.6), (4, 0.8), (1, 1.0), (12, 1.0), (12, 0.25), (6, 0.9), (20, 1.0)]
# never within 0.01 of a top-p: 0.30, 0.52, 0.67, 0.78, ... (and, for top-k 4, 0.385, 0.667, 0.859)


def mask_case() -> torch.Tensor:
    """One row per MASK_ROWS entry: log(MASK_PROBS) + a row offset, each row permuted differently."""
    g = torch.Generator().manual_seed(3)
    base = torch.tensor(MASK_PROBS).log()
    return torch.stack([base[torch.randperm(len(MASK_PROBS), generator=g)] + i for i in range(len(MASK_ROWS))])


def not_minus_inf(mask_fn, logits: torch.Tensor, top_k: list[int], top_p: list[float], want: torch.Tensor) -> list:
    """[(row, token, value)] where mask_fn changed a logit that transformers drops (want: -inf there) to
    anything but -inf: a finite fill such as -1e9 (whose softmax weight is not exactly 0 in every dtype)."""
    got = mask_fn(logits.clone(), torch.tensor(top_k), torch.tensor(top_p, dtype=torch.float32))
    bad = torch.isneginf(want) & ~torch.isneginf(got) & (got != logits)
    return [(int(r), int(t), float(got[r, t])) for r, t in bad.nonzero()]


def check_masks(impl, logits: torch.Tensor, top_k: list[int], top_p: list[float], what: str) -> None:
    """impl.apply_top_k_top_p against transformers' warpers, row by row: dropped tokens at -inf, which tokens
    stay, then their values."""
    want = torch.stack([warped(row, 0.0, k, p) for row, k, p in zip(logits, top_k, top_p)])
    # first: it returns a new tensor and leaves the caller's logits alone (the docstring's contract: a caller may
    # still read them, as a logprobs pass would)
    try:
        call_pure(impl.apply_top_k_top_p, "apply_top_k_top_p", "5.3", logits, torch.tensor(top_k),
                  torch.tensor(top_p, dtype=torch.float32))
    except (AssertionError, NotImplementedError):
        raise
    except Exception:  # noqa: BLE001 -- a crash: the checks below report it, naming a known bug that crashes alike
        pass
    fills = lambda fn: outcome(lambda: not_minus_inf(fn, logits, top_k, top_p, want))  # noqa: E731
    filled = fills(impl.apply_top_k_top_p)
    if isinstance(filled, list) and filled:  # (a string: what it raised, which the check below reports)
        (r, t, value), more = filled[0], len(filled) - 1
        check_that(f"(got {value:g} at row {r}, token {t}" + (f", and at {more} more dropped tokens" if more else "") + ")", "5.3",
                   f"dropped tokens must be -inf {what}", filled, suspects=suspects_of("apply_top_k_top_p", fills))
    kept = lambda fn: outcome(lambda: kept_by(fn, logits, top_k, top_p))  # noqa: E731
    check_equal(kept(impl.apply_top_k_top_p), torch.isfinite(want).tolist(), "5.3",
                f"tokens kept (True) {what} (vs transformers' TopKLogitsWarper then TopPLogitsWarper)",
                suspects=suspects_of("apply_top_k_top_p", kept))
    got = impl.apply_top_k_top_p(logits.clone(), torch.tensor(top_k), torch.tensor(top_p, dtype=torch.float32))
    check_close(got.masked_fill(~torch.isfinite(got), 0), want.masked_fill(~torch.isfinite(want), 0), "5.3",
                f"values of the kept logits {what} (unchanged)", **EXACT)


@pytest.mark.ex5_3
def test_top_k_top_p_masks_match_transformers(impl):
    logits = mask_case()
    top_k, top_p = [k for k, _ in MASK_ROWS], [p for _, p in MASK_ROWS]
    check_masks(impl, logits, top_k, top_p, f"for rows with (top_k, top_p) = {MASK_ROWS}")
    check_masks(impl, logits[:2], [12, 12], [1.0, 1.0], "with top-k and top-p off (V and 1.0)")


# equal logits: every partial mass is exact in fp32 (1/4, 1/2, 3/4), so top_p can sit exactly on one
TIE_ROWS = [(4, 0.25), (4, 0.5), (4, 0.75), (2, 0.5)]  # (tokens, top_p): transformers keeps 1, 2, 3 and 1


def kept_counts(mask_fn, rows: list[tuple[int, float]]) -> list[int]:
    """How many tokens mask_fn keeps of each row of equal logits (which of the tied tokens is not graded)."""
    return [int(torch.isfinite(mask_fn(torch.zeros(1, v), None, torch.tensor([p]))).sum()) for v, p in rows]


@pytest.mark.ex5_3
def test_top_p_exactly_at_a_partial_mass(impl):
    """top_p equal to the mass of the tokens before one: that token is dropped, as transformers' TopPLogitsWarper
    drops it (the tokens before it already reach top_p); with top-k off (None)."""
    want = [int(torch.isfinite(warped(torch.zeros(v), 0.0, None, p)).sum()) for v, p in TIE_ROWS]
    counts = lambda fn: outcome(lambda: kept_counts(fn, TIE_ROWS))  # noqa: E731
    check_equal(counts(impl.apply_top_k_top_p), want, "5.3",
                f"tokens kept of rows of equal logits, (tokens, top_p) = {TIE_ROWS}",
                suspects=suspects_of("apply_top_k_top_p", counts))


MIN_GAP = 1 / 64  # between two logits of a row (transformers' top-k keeps ties at the k-th value; we keep k)
MIN_MARGIN = 1e-4  # between top_p and any partial mass (fp32 sums in another order differ by ~1e-7)


def top_p_margin(row: torch.Tensor, k: int, p: float) -> float:
    """How far top_p is from every partial mass of the row's top-k tokens (float64)."""
    probs = row.double().sort(descending=True).values[:k].softmax(-1)
    return float((probs.cumsum(-1) - p).abs().min())


def distinct_logits(v: int):
    """v logits in [-6, 6], at least MIN_GAP apart (no ties)."""
    return st.lists(st.integers(-6 * 64, 6 * 64), min_size=v, max_size=v, unique=True).map(
        lambda xs: [x * MIN_GAP for x in xs])


@st.composite
def mask_cases(draw):
    v, b = draw(st.integers(2, 16)), draw(st.integers(1, 4))
    logits = torch.tensor([draw(distinct_logits(v)) for _ in range(b)])
    top_k = [draw(st.integers(1, v)) for _ in range(b)]
    top_p = [draw(st.sampled_from([1.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95])) for _ in range(b)]
    return logits, top_k, top_p


@pytest.mark.ex5_3
def test_masks_match_transformers_on_any_logits(impl):
    """Random rows, top-k and top-p (hypothesis: a failure shrinks to the fewest, smallest rows)."""
    def check(case):
        logits, top_k, top_p = case
        assume(all(p == 1.0 or top_p_margin(row, k, p) > MIN_MARGIN for row, k, p in zip(logits, top_k, top_p)))
        check_masks(impl, logits, top_k, top_p, f"for logits {shown(logits)}, top_k {top_k}, top_p {top_p}")
    for_all(mask_cases(), check)


DRAWS = 20_000  # samples per distribution check
FALSE_FAILURE = 1e-6  # probability that a correct sampler fails one distribution check (over the seed)
SAMPLER_SEED = 1234
DIST_LOGITS = [2.0, 1.5, 1.0, 0.6, 0.2, -0.3, -1.0, -2.0]
DIST_CASES = [(0.7, None, None), (1.3, 4, None), (2.0, None, 0.7), (0.8, 5, 0.8), (1.0, None, None)]  # (T, k, p)


def l1_bound(support: int, draws: int = DRAWS, failure: float = FALSE_FAILURE) -> float:
    """epsilon with P(||empirical - p||_1 >= epsilon) <= failure for `draws` samples of a distribution on
    `support` outcomes: the Bretagnolle-Huber-Carol inequality P(L1 >= eps) <= (2^k - 2) exp(-n eps^2 / 2)."""
    return 0.0 if support == 1 else math.sqrt(2.0 / draws * math.log((2 ** support - 2) / failure))


def draws_of(sample_fn, logits: torch.Tensor, temperature: float, top_k, top_p, n: int = DRAWS) -> torch.Tensor:
    """n draws from one row: the row repeated n times in one batch, the global generator seeded."""
    torch.manual_seed(SAMPLER_SEED)
    k = None if top_k is None else torch.full((n,), top_k)
    p = None if top_p is None else torch.full((n,), top_p, dtype=torch.float32)
    return sample_fn(logits[None].expand(n, -1).contiguous(), torch.full((n,), temperature), k, p, None)


def with_mask(mask_fn):
    """minillm's gumbel_sample, calling mask_fn for its masks (to name a wrong mask from the draws)."""
    def sample(*args):
        right, sampler_module.apply_top_k_top_p = sampler_module.apply_top_k_top_p, mask_fn
        try:
            return sampler_module.gumbel_sample(*args)
        finally:
            sampler_module.apply_top_k_top_p = right
    return sample


def check_distribution(impl, logits: torch.Tensor, temperature: float, top_k, top_p) -> None:
    want = warped(logits, temperature, top_k, top_p).double().softmax(-1)
    case = f"T={temperature}, top_k={top_k}, top_p={top_p}, logits {shown(logits)}"
    draws = draws_of(impl.gumbel_sample, logits, temperature, top_k, top_p)
    check_equal((tuple(draws.shape), str(draws.dtype)), ((DRAWS,), "torch.int64"), "5.3", "(shape, dtype) of the draws")
    outside = int((want[draws] == 0).sum())
    freq = lambda d: (torch.bincount(d, minlength=len(logits)).double() / DRAWS)  # noqa: E731
    summary = lambda d: [round(f, 4) for f in freq(d).tolist()]  # noqa: E731
    # a second look before a wrong sampler is named: its draws of DIST_LOGITS at T = 1 too (on a small row two wrong
    # noises can both draw the argmax nearly always: U itself added, or every sampled row given its argmax)
    fixed = lambda fn: outcome(lambda: draws_of(fn, torch.tensor(DIST_LOGITS), 1.0, None, None).tolist())  # noqa: E731
    suspected = {**suspects_of("gumbel_sample", lambda fn: summary(draws_of(fn, logits, temperature, top_k, top_p)),
                               agree=(fixed, lambda: fixed(impl.gumbel_sample))),
                 **suspects_of("apply_top_k_top_p", lambda fn: summary(
                     draws_of(with_mask(fn), logits, temperature, top_k, top_p)))}
    check_equal(outside, 0, "5.3", f"draws of tokens that top-k / top-p removed ({case})")
    support = int((want > 0).sum())
    l1, bound = float((freq(draws) - want).abs().sum()), l1_bound(support)
    if l1 > bound:
        check_equal(summary(draws), [round(w, 4) for w in want.tolist()], "5.3",
                    f"frequencies of {DRAWS} draws ({case}) vs softmax(logits / T) restricted by top-k / top-p: L1 "
                    f"distance {l1:.4f} > {bound:.4f} (a correct sampler exceeds it with probability "
                    f"< {FALSE_FAILURE:g})", suspects=suspected)


@pytest.mark.ex5_3
def test_sampling_distribution(impl):
    """Each case's frequencies over DRAWS seeded draws (one check fails a correct sampler with probability
    < FALSE_FAILURE over the seed; with the fixed seed the outcome is the same on every run)."""
    for temperature, top_k, top_p in DIST_CASES:
        check_distribution(impl, torch.tensor(DIST_LOGITS), temperature, top_k, top_p)


@st.composite
def distribution_cases(draw):
    v = draw(st.integers(2, 6))
    logits = torch.tensor(draw(st.lists(st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.5]),
                                        min_size=v, max_size=v, unique=True)))
    return (logits, draw(st.sampled_from([0.5, 1.0, 1.7])), draw(st.one_of(st.none(), st.integers(1, v))),
            draw(st.sampled_from([None, 0.6, 0.85])))


DISTRIBUTION_EXAMPLES = 8  # DRAWS draws each


@pytest.mark.ex5_3
def test_sampling_distribution_on_any_logits(impl):
    """Random small rows (hypothesis, DISTRIBUTION_EXAMPLES of them: a correct sampler fails one of them with
    probability < DISTRIBUTION_EXAMPLES x FALSE_FAILURE)."""
    def check(case):
        logits, temperature, top_k, top_p = case
        if top_p is not None:
            k = len(logits) if top_k is None else top_k
            assume(top_p_margin(logits / temperature, k, top_p) > MIN_MARGIN)
        check_distribution(impl, logits, temperature, top_k, top_p)
    for_all(distribution_cases(), check, max_examples=DISTRIBUTION_EXAMPLES)


TIED_ROWS = 8  # rows of tied top logits: a draw among 3 tied tokens picks the first in all 8 with p = 3^-8


@pytest.mark.ex5_3
def test_greedy_rows_and_top_k_1_take_the_argmax(impl):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 50, generator=g) * 3
    temps = torch.tensor([0.0, 0.0, 0.9, 1.5, 0.0, 2.0])
    top_k = torch.tensor([50, 50, 1, 1, 3, 1])
    top_p = torch.tensor([1.0, 0.5, 1.0, 0.9, 0.7, 1.0])

    def run(fn, any_greedy=None, rows=slice(None)):
        torch.manual_seed(SAMPLER_SEED)
        return fn(logits[rows], temps[rows], top_k[rows], top_p[rows], None, any_greedy).tolist()

    pure = lambda *args: call_pure(impl.gumbel_sample, "gumbel_sample", "5.3", *args)  # noqa: E731
    check_equal(run(pure), logits.argmax(-1).tolist(), "5.3",
                "tokens of rows with temperature 0 or top_k = 1 (the argmax, whatever the noise)",
                suspects=suspects_of("gumbel_sample", run))
    hot = slice(2, 4)  # no greedy row: the caller says any_greedy=False
    check_equal(run(pure, False, hot), logits[hot].argmax(-1).tolist(), "5.3",
                "tokens of top_k = 1 rows when any_greedy=False", suspects=suspects_of(
                    "gumbel_sample", lambda fn: run(fn, False, hot)))
    # exact ties at the top, as bf16 logits often have: temperature 0 is the plain argmax (torch.argmax takes
    # the first of the tied tokens), never a draw among them
    tied = (torch.randn(TIED_ROWS, 50, generator=g) * 3).bfloat16().float()
    for row in tied:
        row[torch.randperm(50, generator=g)[:3]] = row.max() + 0.5  # three tokens share the top logit
    zero = torch.zeros(TIED_ROWS)

    def run_tied(fn, any_greedy=None):  # on copies: a known wrong version that divides in place must not change `tied`
        torch.manual_seed(SAMPLER_SEED)
        return fn(tied.clone(), zero.clone(), None, None, None, any_greedy).tolist()
    # a second look before a bug is named: the same rows with any_greedy=True (a sampler that takes no argmax at
    # all and one that takes it only when told to go wrong alike without it)
    told = lambda fn: outcome(lambda: run_tied(fn, True))  # noqa: E731
    check_equal(run_tied(pure), tied.argmax(-1).tolist(), "5.3",
                f"tokens of {TIED_ROWS} temperature-0 rows whose top logit three tokens share exactly (common in "
                f"bf16), any_greedy not given (None): the plain argmax, the first of the tied tokens (torch.argmax), "
                f"whatever the noise", suspects=suspects_of("gumbel_sample", run_tied,
                                                             agree=(told, lambda: told(impl.gumbel_sample))))


SEEDED_ROW, SEEDED_SEED, SEEDED_STEPS = 2, 1234, 4


def seeded_row_tokens(fn, logits, temps, top_k, top_p, seeds: list[int | None], rows: list[int]) -> list[int]:
    """SEEDED_ROW's token over SEEDED_STEPS calls of fn on the given rows (fresh generators from `seeds`)."""
    torch.manual_seed(0)
    gens = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
    r = rows.index(SEEDED_ROW)
    return [int(fn(logits[rows], temps[rows], top_k[rows], top_p[rows], [gens[i] for i in rows])[r])
            for _ in range(SEEDED_STEPS)]


@pytest.mark.ex5_3
def test_seeded_rows_ignore_the_rest_of_the_batch(impl):
    """A seeded row's tokens are the documented draw from its own generator: the same alone and in any batch."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(5, 40, generator=g) * 2
    temps = torch.tensor([1.0, 0.8, 0.6, 0.0, 1.2])
    top_k, top_p = torch.tensor([40, 5, 10, 40, 40]), torch.tensor([1.0, 0.9, 0.9, 1.0, 0.8])
    seeds = [None, 99, SEEDED_SEED, None, 7]
    gen = torch.Generator().manual_seed(SEEDED_SEED)
    x = warped(logits[SEEDED_ROW], float(temps[SEEDED_ROW]), int(top_k[SEEDED_ROW]), float(top_p[SEEDED_ROW]))
    want = [int((x - torch.rand(40, generator=gen).log().neg().log()).argmax()) for _ in range(SEEDED_STEPS)]
    args = (logits, temps, top_k, top_p, seeds)
    batches = [([0, 1, 2, 3, 4], "in a batch of 5 (2 unseeded rows, 2 seeded otherwise)"),
               ([SEEDED_ROW], "alone"), ([3, 2, 0], "in another batch, at another index")]
    # a known wrong version is named only if it gives your tokens in every batch: a row that is independent of
    # its batch but not the documented draw can match a batch-dependent bug's tokens in one of them; and your
    # unseeded draws of one row: a few tokens can agree between two wrong noises (-log U and log(-log U) both
    # pick the token whose U is smallest), DRAWS of them do not
    every_batch = lambda fn: outcome(lambda: ([seeded_row_tokens(fn, *args, rows) for rows, _ in batches],  # noqa: E731
                                              draws_of(fn, torch.tensor(DIST_LOGITS), 1.0, None, None).tolist()))
    for rows, what in batches:
        check_equal(seeded_row_tokens(impl.gumbel_sample, *args, rows), want, "5.3",
                    f"tokens of a seeded row over {SEEDED_STEPS} calls {what} (vs argmax(masked logits / T - "
                    f"log(-log U)) with U = torch.rand(V, generator=its generator))",
                    suspects=suspects_of("gumbel_sample", lambda fn, rows=rows: seeded_row_tokens(fn, *args, rows),
                                         agree=(every_batch, lambda: every_batch(impl.gumbel_sample))))


KEPT_SET_DRAWS = 256  # draws per case of test_draws_stay_in_the_kept_set


@st.composite
def sampler_cases(draw):
    v = draw(st.integers(2, 30))
    logits = torch.tensor(draw(distinct_logits(v)))
    return (logits, draw(st.sampled_from([0.0, 0.3, 1.0, 2.5])), draw(st.integers(1, v)),
            draw(st.sampled_from([1.0, 0.2, 0.5, 0.9])))


@pytest.mark.ex5_3
def test_draws_stay_in_the_kept_set(impl):
    """Any row: KEPT_SET_DRAWS draws only ever pick tokens transformers' warpers keep; temperature 0 is the argmax."""
    n = KEPT_SET_DRAWS

    def check(case):
        logits, temperature, top_k, top_p = case
        if temperature > 0 and top_p < 1.0:
            assume(top_p_margin(logits / temperature, top_k, top_p) > MIN_MARGIN)
        draws = draws_of(impl.gumbel_sample, logits, temperature, top_k, top_p, n)
        case_text = f"T={temperature}, top_k={top_k}, top_p={top_p}, logits {shown(logits)}"
        if temperature == 0:
            check_equal(draws.tolist(), [int(logits.argmax())] * n, "5.3", f"greedy draws ({case_text})",
                        suspects=suspects_of("gumbel_sample",
                                             lambda fn: draws_of(fn, logits, 0.0, top_k, top_p, n).tolist()))
            return
        kept = torch.isfinite(warped(logits, temperature, top_k, top_p))
        outside = lambda d: sorted(set(d[~kept[d]].tolist()))  # noqa: E731
        check_equal(outside(draws), [], "5.3", f"tokens drawn that top-k / top-p removed ({case_text})",
                    suspects=suspects_of("gumbel_sample",
                                         lambda fn: outside(draws_of(fn, logits, temperature, top_k, top_p, n))))
    for_all(sampler_cases(), check)


@pytest.mark.ex5_3
def test_sampler_in_the_engine(impl_name):
    """Your 5.3 alone in the engine's sampler (CPU: the torch path): seeded requests with top-k / top-p beside
    greedy ones give minillm's own tokens; the greedy ones transformers'."""
    require_written(impl_name, "5.3")
    ref = greedy_reference()
    prompts = ref["prompts"][:4]
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=1.5, top_k=2, seed=3, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=2.0, top_p=0.6, seed=4, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0.7, top_k=40, top_p=0.8, seed=5, max_tokens=16, ignore_eos=True)]
    want = [o.outputs[0].token_ids for o in LLM(ref_path("tiny-qwen3"), **small_engine_args()).generate(
        prompts, params, use_tqdm=False)]
    with use_impl(impl_name, exercises={"5.3"}):
        got = [o.outputs[0].token_ids for o in LLM(ref_path("tiny-qwen3"), **small_engine_args()).generate(
            prompts, params, use_tqdm=False)]
    check_equal(got[0], ref["tokens"]["tiny-qwen3"][0][:16], "5.3",
                "greedy tokens beside sampled ones (vs transformers)")
    check_equal(got, want, "5.3",
                "tokens of greedy and seeded top-k / top-p requests using your 5.3 (vs minillm's own)")


# ---- 5.4 the bench's floor ---------------------------------------------------------------------------
# a shape with attention_bias=True: q, k, v AND o_proj biases (no reference folder has an o_proj bias)
QWEN3_ATTENTION_BIAS = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=True,
                            tie_word_embeddings=False)
MODELS = {**{name: ref_path(name) for name in TINY_MODELS}, "qwen3-0.6b": QWEN3_06B, "qwen3-8b": QWEN3_8B,
          "tiny-qwen3-attention-bias": QWEN3_ATTENTION_BIAS}
KV_PROBE_TOKENS = 6  # prompt length of the forward whose cache is measured


def configs(name: str, dtype: torch.dtype):
    """(minillm's ModelConfig, transformers' config) of a reference folder or a model_zoo shape dict."""
    src = MODELS[name]
    dtype_name = str(dtype).removeprefix("torch.")
    if isinstance(src, str):
        hf = AutoConfig.from_pretrained(src)
        return ModelConfig.from_dict({**hf.to_dict(), "dtype": dtype_name}), hf
    return ModelConfig.from_dict(dict(src, model_type="qwen3", dtype=dtype_name)), Qwen3Config(**src)


@functools.cache
def counted_by_transformers(name: str, dtype: torch.dtype) -> tuple[int, int, int]:
    """transformers' model on the meta device -> (weight bytes a decode step reads, K/V bytes per token
    held by its DynamicCache after a forward, non-embedding parameters)."""
    _, hf = configs(name, dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype)
        cache = model.model(torch.zeros(1, KV_PROBE_TOKENS, dtype=torch.long), use_cache=True).past_key_values
    params = dict(model.named_parameters(remove_duplicate=False))
    non_embedding = sum(p.numel() for n, p in params.items() if "embed_tokens" not in n and not n.startswith("lm_head"))
    weights = (non_embedding + params["lm_head.weight"].numel()) * dtype.itemsize
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return weights, kv // KV_PROBE_TOKENS, non_embedding


@pytest.mark.ex5_4
def test_model_bytes_match_transformers(impl):
    # a second look before a bug is named: its counts on every model (hidden_size and the query heads' H x d are the
    # same number in some models, so two bugs can give one model's K/V alike)
    # and dtype (at 2 bytes an element, K/V counted in elements and the keys only agree)
    everywhere = lambda fn: outcome(lambda: [[float(x) for x in fn(configs(name, dtype)[0], dtype.itemsize)]  # noqa: E731
                                             for name in MODELS for dtype in (torch.bfloat16, torch.float32)])
    for name in MODELS:
        for dtype in (torch.bfloat16, torch.float32):
            mc, _ = configs(name, dtype)
            want = counted_by_transformers(name, dtype)
            got = impl.model_bytes(mc, dtype.itemsize)
            for i, what in enumerate(("weight bytes read per decode step", "K/V bytes per token",
                                      "non-embedding parameters")):
                check_equal(float(got[i]), float(want[i]), "5.4", f"{what} of {name} in {dtype} (vs transformers' "
                            f"model: its parameters, its cache)", suspects=suspects_of(
                                "model_bytes", lambda fn, i=i: float(fn(mc, dtype.itemsize)[i]),
                                agree=(everywhere, lambda: everywhere(impl.model_bytes))))


def floor_by_closed_form(name: str, prompt_lens, output_lens, copy_gbps: float, matmul_tflops: float) -> dict:
    """The docstring's floor as per-request sums: request r is decoded o_r - 1 times, at contexts p_r + 1 ..
    p_r + o_r - 1; the weights are read once per step, max(o) - 1 steps. Counts from transformers (bf16)."""
    weights, kv, params = counted_by_transformers(name, torch.bfloat16)
    mc, _ = configs(name, torch.bfloat16)
    p, o = np.asarray(prompt_lens, dtype=np.float64), np.asarray(output_lens, dtype=np.float64)
    decode_bytes = (o.max() - 1) * weights + kv * ((o - 1) * p + o * (o - 1) / 2).sum()
    attention_per_token2 = 2 * mc.num_attention_heads * mc.head_dim * mc.num_hidden_layers  # x p^2
    prefill_flops = 2 * params * p.sum() + attention_per_token2 * (p ** 2).sum()
    decode_s, prefill_s = decode_bytes / (copy_gbps * 1e9), prefill_flops / (matmul_tflops * 1e12)
    return {"floor_decode_s": decode_s, "floor_prefill_s": prefill_s, "floor_s": decode_s + prefill_s,
            "floor_tok_s": o.sum() / (decode_s + prefill_s)}


H200 = (4226.7, 788.6)  # copy GB/s and bf16 matmul TFLOP/s measured on the H200 (notebook 05's kept output)
BENCH_WORKLOAD = (256, 100, 1024, 1024)  # nano-vLLM's: requests, min length, max input, max output


def floor_cases():
    from minillm.bench import make_workload
    prompts, outputs = make_workload(*BENCH_WORKLOAD)
    rng = np.random.default_rng(8)
    return [("qwen3-0.6b", [len(x) for x in prompts], outputs, *H200),
            ("tiny-qwen3", rng.integers(1, 60, 7).tolist(), rng.integers(1, 30, 7).tolist(), 2.5, 0.01),
            ("tiny-qwen2", [5], [1], 1.0, 1.0),
            ("qwen3-8b", [100, 100, 3000], [1000, 1, 20], *H200)]


class Floors(dict):
    """Floors of workload_floor's result that equal another's key by key to within FLOAT_SUMS (the same sums in
    another order): for the grader's second look at a known bug, more of its result than the one key that failed."""
    def __eq__(self, other) -> bool:
        return (isinstance(other, dict) and self.keys() == other.keys()
                and all(math.isclose(self[k], other[k], rel_tol=FLOAT_SUMS["rtol"], abs_tol=FLOAT_SUMS["atol"])
                        for k in self))

    __hash__ = None


def floors(fn, args: tuple, keys) -> Floors | Raised:
    """fn(*args)'s floors of these keys (or what it raised)."""
    return outcome(lambda: Floors({k: float(fn(*args)[k]) for k in keys}))


@functools.cache
def floor_case_args() -> list[tuple]:
    """workload_floor's arguments for each of floor_cases()."""
    return [(configs(name, torch.bfloat16)[0], 2, list(prompt_lens), list(output_lens), copy_gbps, tflops)
            for name, prompt_lens, output_lens, copy_gbps, tflops in floor_cases()]


def floors_of_the_cases(fn) -> list:
    """fn's decode and prefill floors of each of floor_cases() (or what it raised)."""
    return [floors(fn, args, ("floor_decode_s", "floor_prefill_s")) for args in floor_case_args()]


@pytest.mark.ex5_4
def test_workload_floor_closed_form(impl):
    # a second look before a bug is named: its result up to the key that failed, the keys checked before it (right in
    # the code under test) included: a prefill floor 1000x too large is a floor in ms only where the decode floor is
    # 1000x too, else it is another bug (TFLOP/s taken as 1e9 FLOP/s, say); and its floors of every case (on
    # qwen3-0.6b, whose query heads are twice its KV heads, attention counted with the KV heads and attention
    # without its factor 2 give one floor; qwen3-8b's 4 to 1 tells them apart)
    for name, prompt_lens, output_lens, copy_gbps, tflops in floor_cases():
        mc, _ = configs(name, torch.bfloat16)
        args = (mc, 2, list(prompt_lens), list(output_lens), copy_gbps, tflops)
        got = impl.workload_floor(*args)
        want = floor_by_closed_form(name, prompt_lens, output_lens, copy_gbps, tflops)
        what = f"{name}, {len(prompt_lens)} requests ({sum(prompt_lens)} prompt, {sum(output_lens)} output tokens)"
        check_equal(sorted(got), sorted(want), "5.4", f"keys of workload_floor's result ({what})")
        for n, key in enumerate(want):
            checked = list(want)[:n + 1]
            check_close(torch.tensor(float(got[key]), dtype=torch.float64),
                        torch.tensor(want[key], dtype=torch.float64),
                        "5.4", f"{key} ({what}; vs the per-request closed form)", **FLOAT_SUMS,
                        suspects=suspects_of("workload_floor", lambda fn, key=key: torch.tensor(
                            float(fn(*args)[key]), dtype=torch.float64),
                            agree=(lambda fn, checked=checked: (floors(fn, args, checked), floors_of_the_cases(fn)),
                                   lambda checked=checked: (floors(impl.workload_floor, args, checked),
                                                            floors_of_the_cases(impl.workload_floor)))))


def counted_prefill_flops(name: str, prompt_len: int) -> float:
    """torch.utils.flop_counter on transformers' model (eager attention) prefilling one prompt: the
    linear layers' matmuls, the attention matmuls over the causal half (the counter counts the full
    p x p score matrix), and 2 FLOPs per token for each norm weight and bias (the docstring counts every
    non-embedding parameter)."""
    hf = AutoModelForCausalLM.from_pretrained(ref_path(name), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        hf.model(torch.arange(prompt_len)[None], use_cache=False)
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    linear = sum(n for op, n in counts.items() if op in ("aten.mm", "aten.addmm"))
    elementwise = sum(p.numel() for n, p in hf.named_parameters() if "norm" in n or n.endswith(".bias"))
    return linear + counts["aten.bmm"] / 2 + 2 * prompt_len * elementwise


@pytest.mark.ex5_4
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen2"])
def test_prefill_flops_match_a_flop_counter(impl, name):
    """One request of 12 prompt tokens and 1 output token: its floor is prefill only. With a matmul rate of
    1 FLOP/s (matmul_tflops=1e-12), floor_prefill_s is the FLOP count itself."""
    prompt_len = 12
    mc = ModelConfig.from_folder(ref_path(name))
    args = (mc, 4, [prompt_len], [1], 1e-9, 1e-12)
    got = impl.workload_floor(*args)
    # a second look before a bug is named: its decode and prefill floors of the closed-form test's workloads (a
    # prefill alone cannot tell a floor in ms from TFLOP/s taken as 1e9 FLOP/s)
    check_close(torch.tensor(float(got["floor_prefill_s"]), dtype=torch.float64),
                torch.tensor(counted_prefill_flops(name, prompt_len), dtype=torch.float64), "5.4",
                f"prefill FLOPs of {prompt_len} tokens on {name} (vs torch's FLOP counter on transformers' forward)",
                **FLOAT_SUMS, suspects=suspects_of("workload_floor", lambda fn: torch.tensor(
                    float(fn(*args)["floor_prefill_s"]), dtype=torch.float64),
                    agree=(floors_of_the_cases, lambda: floors_of_the_cases(impl.workload_floor))))
    check_equal(float(got["floor_decode_s"]), 0.0, "5.4", "decode floor of requests of one output token each",
                suspects=suspects_of("workload_floor", lambda fn: float(fn(*args)["floor_decode_s"])))


STAND_IN_CEILINGS = (0.001, 1e-6)  # GB/s and TFLOP/s that make the tiny workload's floor seconds long
BENCH_ROUNDING = 5e-4  # the bench prints seconds to 3 decimals


@pytest.mark.ex5_4
def test_bench_floor_in_the_engine(impl_name, monkeypatch):
    """Your 5.4 alone in `python -m minillm bench` (qwen3-tiny, 3 requests on the CPU; the device's ceilings
    replaced by fixed ones): the floor it prints equals minillm's own, to the bench's rounding."""
    from minillm import bench
    from minillm import timing
    require_written(impl_name, "5.4")
    copy_gbps, tflops = STAND_IN_CEILINGS
    monkeypatch.setattr(timing, "device_ceilings", lambda dtype=None, device=None: timing.Ceilings("stand-in", copy_gbps, tflops))
    parser = argparse.ArgumentParser()
    bench.add_bench_args(parser)
    args = parser.parse_args(["--model", "qwen3-tiny", "--device", "cpu", "--num-seqs", "3", "--min-len", "4",
                              "--max-input-len", "12", "--max-output-len", "6", "--max-model-len", "64",
                              "--max-num-seqs", "4", "--max-num-batched-tokens", "128", "--batch1-tokens", "0",
                              "--attention-backend", "torch"])
    with use_impl(impl_name, exercises={"5.4"}):
        result = bench.run_bench(args)
    # minillm's own functions (the swap is over)
    mc, dtype_bytes = ModelConfig.from_folder(resolve_model("qwen3-tiny")), getattr(torch, result["dtype"]).itemsize
    prompts, outputs = bench.make_workload(3, 4, 12, 6)
    want = bench.workload_floor(mc, dtype_bytes, [len(x) for x in prompts], outputs, copy_gbps, tflops)
    want["batch1_floor_ms_per_token"] = bench.model_bytes(mc, dtype_bytes)[0] / (copy_gbps * 1e9) * 1e3
    for key in ("floor_s", "floor_decode_s", "floor_prefill_s", "batch1_floor_ms_per_token"):
        check_close(torch.tensor(float(result[key]), dtype=torch.float64), torch.tensor(want[key], dtype=torch.float64),
                    "5.4", f"the bench's {key} using your 5.4 (vs minillm's own, to the bench's rounding)",
                    atol=BENCH_ROUNDING, rtol=1e-9)
