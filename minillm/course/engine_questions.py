"""Chapter 5's "Check your understanding" questions (notebooks/05_engine_performance.ipynb), registered as
notebook 05 with minillm.course.questions (which imports this module), checked the way every chapter's are.

Every expected value comes from minillm's own chapter-5 functions (always the reference, even while the
notebook runs the reader's: questions.py swaps them back while it checks): the bench's model_bytes and
workload_floor, the decode-graph sizes, the engine's placeholder functions in a model of its loop, and
the sampler's masks. The one measured figure a question quotes, the H200's copy bandwidth, is
MEASURED_05_COPY_GBPS; tests/test_ch5_questions.py requires notebook 05's outputs to print it.
"""
from __future__ import annotations

import math

# the questions' inputs, as the notebook states them
MEASURED_05_COPY_GBPS = 4251.0  # 05, section 1: "copy 4,251 GB/s" (the H200 of the committed outputs)
H200_MATMUL_TFLOPS = 798.0  # 05, section 1: "matmul 798.0 TFLOP/s"
# 05, section 7, the ladder's last rung: "+ async scheduling  0.620 ms/token  45% of the floor (0.280 ms)  177 kernels/token"
MEASURED_05_B1_MS, MEASURED_05_B1_FLOOR_MS, MEASURED_05_B1_KERNELS = 0.620, 0.280, 177
Q6_TARGET = 0.55  # the share of the floor Q6 asks for
Q2_MAX_NUM_SEQS, Q2_BATCH = 100, 37
Q3_MAX_TOKENS, Q3_EOS_AT = 5, 3  # the request samples EOS as its 3rd token
Q4_LOGITS, Q4_TEMPERATURE, Q4_TOP_P, Q4_TOKEN = [3.0, 2.0, 1.0, 0.0], 2.0, 0.7, 1
BENCH_WORKLOAD = (256, 100, 1024, 1024)  # nano-vLLM's: requests, min length, max input, max output
BF16 = 2  # bytes per element


# ------------------------------------------------------------------------------------------------ Q1
def _qwen3_8b():
    from minillm.course.questions import model_config
    from minillm.model_zoo import QWEN3_8B
    return model_config(QWEN3_8B)


def batch1_floor_tok_s(weight_bytes: float | None = None) -> float:
    """Qwen3-8B's batch-1 decode floor on the H200, tokens/s: a step reads model_bytes' weights once."""
    from minillm.bench import model_bytes
    if weight_bytes is None:
        weight_bytes = model_bytes(_qwen3_8b(), BF16)[0]
    return MEASURED_05_COPY_GBPS * 1e9 / weight_bytes


def _q1_traps() -> list:
    from minillm.bench import model_bytes
    c = _qwen3_8b()
    weights, _, params = model_bytes(c, BF16)
    table = c.vocab_size * c.hidden_size * BF16
    return [(batch1_floor_tok_s(weights + table), "a decode step reads only the batch's rows of the embedding table, "
                                                  "not all of it"),
            (batch1_floor_tok_s(params * BF16), "the LM head is read whole every step too: it scores the whole "
                                                "vocabulary"),
            (batch1_floor_tok_s(weights / BF16), "count bytes: a bf16 weight is two")]


# ------------------------------------------------------------------------------------------------ Q2
def graph_choice(max_num_seqs: int = Q2_MAX_NUM_SEQS, batch: int = Q2_BATCH) -> tuple[int, int, int]:
    """(the graph size that runs `batch` rows, its padding rows, how many graphs are captured)."""
    from minillm.engine.cuda_graph import graph_batch_sizes, graph_size_for
    sizes = graph_batch_sizes(max_num_seqs)
    size = graph_size_for(sizes, batch)
    return size, size - batch, len(sizes)


# ------------------------------------------------------------------------------------------------ Q3
def async_passes(max_tokens: int = Q3_MAX_TOKENS, eos_at: int = Q3_EOS_AT,
                 asynchronous: bool = True) -> tuple[int, int]:
    """One request alone in the engine's loop, using the engine's own placeholder functions: it samples
    EOS as its `eos_at`-th token. -> (forward passes that include it, tokens in its output). Without
    async scheduling each step's token is read back before the next step is launched."""
    from minillm.engine.llm_engine import append_placeholders, fill_placeholders
    from minillm.engine.sequence import PLACEHOLDER_TOKEN
    from minillm.sampling_params import SamplingParams
    eos, prompt_len = 2, 4
    params = SamplingParams(max_tokens=max_tokens)
    tokens, at_limit, finished, passes, pending = [7] * prompt_len, False, False, 0, None
    sample = lambda pos: eos if pos - prompt_len + 1 == eos_at else 5  # noqa: E731  (the device's sample at pos)

    def read_back(step):
        nonlocal finished
        pos, tok = step
        outcome = fill_placeholders([tokens], [pos], [tok], [at_limit], {eos}, [params])[0]
        if outcome in ("stop", "length"):
            finished = True
            while tokens[-1] == PLACEHOLDER_TOKEN:  # LLMEngine._finish drops what is still on the device
                tokens.pop()

    while not finished:
        launched = None
        if not at_limit:
            (pos,), (limit,) = append_placeholders([tokens], [prompt_len], [max_tokens], 1 << 30)
            at_limit, passes, launched = limit, passes + 1, (pos, sample(pos))
        if not asynchronous and launched is not None:
            pending, launched = launched, None
        if pending is not None:
            read_back(pending)
        pending = launched
    return passes, len(tokens) - prompt_len


# ------------------------------------------------------------------------------------------------ Q4
def sampled_share(temperature: float = Q4_TEMPERATURE, top_p: float | None = Q4_TOP_P, renormalize: bool = True,
                  token: int = Q4_TOKEN) -> float:
    """Percent of draws the sampler gives `token`: softmax(logits / T) restricted to the nucleus that
    minillm's apply_top_k_top_p keeps (renormalize=False: the unrestricted probability)."""
    import torch

    from minillm.layers.sampler import apply_top_k_top_p
    x = torch.tensor([Q4_LOGITS], dtype=torch.float64) / temperature
    if not renormalize:
        return 100 * float(x.softmax(-1)[0, token])
    p = None if top_p is None else torch.tensor([top_p], dtype=torch.float64)
    return 100 * float(apply_top_k_top_p(x, None, p).softmax(-1)[0, token])


def _top_p_with_itself(top_p: float = Q4_TOP_P) -> float:
    """The share when a token is kept only while the mass up to and including it is below top_p."""
    probs = sorted((math.exp(v / Q4_TEMPERATURE) for v in Q4_LOGITS), reverse=True)
    total, kept, cum = sum(probs), [], 0.0
    for p in probs:
        cum += p / total
        if cum < top_p:
            kept.append(p)
    target = math.exp(Q4_LOGITS[Q4_TOKEN] / Q4_TEMPERATURE)
    return 100 * target / sum(kept) if target in kept else 0.0


# ------------------------------------------------------------------------------------------------ Q5
def decode_floor_ratio() -> float:
    """The bench workload's decode floor with every output twice as long, over the floor as it is
    (Qwen3-0.6B, bf16, the H200's ceilings)."""
    from minillm.bench import make_workload, workload_floor
    from minillm.course.questions import model_config
    from minillm.model_zoo import QWEN3_06B
    prompts, outputs = make_workload(*BENCH_WORKLOAD)
    lens = [len(p) for p in prompts]
    floor = lambda outs: workload_floor(model_config(QWEN3_06B), BF16, lens, outs, MEASURED_05_COPY_GBPS,  # noqa: E731
                                        H200_MATMUL_TFLOPS)["floor_decode_s"]
    return float(floor([2 * o for o in outputs]) / floor(outputs))


def ratio_letter(ratio: float) -> str:
    """(a) less than 2x, (b) 2x, (c) between 2x and 4x, (d) 4x or more."""
    if math.isclose(ratio, 2.0, rel_tol=1e-3):
        return "b"
    return "a" if ratio < 2 else ("c" if ratio < 4 else "d")


# ------------------------------------------------------------------------------------------------ Q6
def _kernel_price_ms(subtract_floor: bool = True) -> float:
    """The ladder's last rung's time (above the floor, or all of it) shared equally by its kernels, ms."""
    ms = MEASURED_05_B1_MS - (MEASURED_05_B1_FLOOR_MS if subtract_floor else 0.0)
    return ms / MEASURED_05_B1_KERNELS


def kernels_to_remove(target: float = Q6_TARGET, subtract_floor: bool = True) -> float:
    """Kernels per token that must go for batch-1 decode to reach `target` of the weight-read floor, when
    the ladder's last rung's gap to the floor is charged to its kernels equally (each costs the same)."""
    return (MEASURED_05_B1_MS - MEASURED_05_B1_FLOOR_MS / target) / _kernel_price_ms(subtract_floor)


def _q6_traps() -> list:
    goal = f"{100 * Q6_TARGET:.0f}% of the floor means the floor is {100 * Q6_TARGET:.0f}% of the time per " \
           f"token: the target time is the floor divided by {Q6_TARGET}"
    return [(kernels_to_remove(subtract_floor=False), f"the floor's own {MEASURED_05_B1_FLOOR_MS} ms is the weights' "
                                                      "reads, not the kernels': price a kernel by the gap above the floor"),
            (MEASURED_05_B1_MS * (1 - Q6_TARGET) / _kernel_price_ms(), goal)]


def _questions():
    from minillm.course.questions import PERCENT_TOL, Approx, Choice, Exact, Part, Question
    return [
        Question("q1", f"batch-1 decode floor of Qwen3-8B (bf16) at the H200's {MEASURED_05_COPY_GBPS:,.0f} GB/s, tokens/s", (
            Part(batch1_floor_tok_s, Approx(),
                 hint="a decode step of one token reads every weight it multiplies by once: which of Qwen3-8B's "
                      "matrices does one token's step use, and which only a row of?",
                 traps=_q1_traps),)),
        Question("q2", "max_num_seqs = 100, a batch of 37: the graph that runs it, its padding rows, graphs captured", (
            Part(lambda: graph_choice()[0], Exact(), label="graph",
                 hint="the smallest captured size >= 37; after 8 the sizes go up in steps of 16",
                 traps=lambda: [(64, "the sizes after 8 are multiples of 16, not powers of two")]),
            Part(lambda: graph_choice()[1], Exact(), label="padding rows",
                 hint="every row of the graph runs; those past the batch are padding"),
            Part(lambda: graph_choice()[2], Exact(), label="graphs",
                 hint="1, 2, 4, 8, the multiples of 16 up to 100, and one more",
                 traps=lambda: [(graph_choice()[2] - 1, "a full batch of 100 needs its own graph: max_num_seqs is "
                                                        "always a size")]),
        )),
        Question("q3", "async scheduling, max_tokens 5, EOS sampled as the 3rd token: forward passes with the "
                       "request, output tokens", (
            Part(lambda: async_passes()[0], Exact(), label="forward passes",
                 hint="the step after the EOS token is launched before the EOS is read back: count the prefill, "
                      "then one decode step per token the GPU computes",
                 traps=lambda: [(async_passes(asynchronous=False)[0],
                                 "that is the synchronous loop; with async scheduling a step is launched before the "
                                 "previous one's token is read")]),
            Part(lambda: async_passes()[1], Exact(), label="output tokens",
                 hint="the request stops at EOS; what happens to the token computed after it?",
                 traps=lambda: [(async_passes()[1] + 1, "the token computed after the EOS is dropped: the request "
                                                        "ended before it was read back")]),
        )),
        Question("q4", "logits [3, 2, 1, 0], temperature 2, top-p 0.7: percent of draws that pick token 1", (
            Part(sampled_share, Approx(rel=0, abs=PERCENT_TOL),
                 hint="divide by the temperature, take the softmax, keep the nucleus (each token whose better "
                      "tokens hold less than 0.7), then renormalise over what is kept",
                 traps=lambda: [(sampled_share(temperature=1.0), "divide the logits by the temperature first: the "
                                                                 "nucleus and the draw use softmax(logits / T)"),
                                (sampled_share(renormalize=False), "the kept tokens share all the draws: renormalise "
                                                                   "their probabilities to sum to 1"),
                                (_top_p_with_itself(), "a token stays when the tokens ranked BEFORE it hold less "
                                                       "than top-p: the one that crosses 0.7 is kept")]),)),
        Question("q5", "the bench workload with every output twice as long: the decode floor grows by "
                       "(a) < 2x (b) 2x (c) 2x-4x (d) >= 4x", (
            Part(lambda: ratio_letter(decode_floor_ratio()), Choice(),
                 hint="split a decode step's bytes into the weights (once per step) and the K/V (every running "
                      "request's context); how does each sum grow with the output lengths?",
                 traps=lambda: [("b", "the weights' part doubles with the steps, but the K/V read per step also "
                                      "grows as the outputs get longer"),
                                ("d", "only the generated tokens' part of the contexts grows quadratically; the "
                                      "prompts' K/V is read once more per extra step, which doubles")]),)),
        Question("q6", f"batch 1 at {MEASURED_05_B1_MS} ms/token with {MEASURED_05_B1_KERNELS} kernels, floor "
                       f"{MEASURED_05_B1_FLOOR_MS} ms: kernels per token to remove to reach "
                       f"{100 * Q6_TARGET:.0f}% of the floor", (
            Part(kernels_to_remove, Approx(),
                 hint=f"price one kernel: the time above the floor, shared by the {MEASURED_05_B1_KERNELS} kernels; "
                      f"then the time per token at {100 * Q6_TARGET:.0f}% of the floor, and how many kernels' worth "
                      "of time separate the two",
                 traps=_q6_traps),)),
    ]


def _register() -> None:
    from minillm.course.questions import register
    register("05", _questions())


_register()
