"""Check your understanding: the questions that end each notebook, and the checker of the reader's answers.

Every chapter notebook ends with a few questions that ask for a number or a prediction, then a cell:

    from minillm.course.questions import check_answers

    ANSWERS = {"q1": None, "q2": None, "q3": None}   # the reader fills these in
    results = check_answers("03", ANSWERS)           # one line per question

which prints, for each question, "not answered", "correct" or "not yet: <a hint>". The hint says
where to look or which step of the reasoning slipped, never the answer. The worked answers are in
the lecturer's kit (notebooks/lecturer/), not here and not in the notebooks.

API
    check_answers(notebook_id, answers, show=True) -> dict[str, str]
        notebook_id: "03", "03_paged_kv_cache" or "03_paged_kv_cache.ipynb"; answers: question id ->
        the reader's answer (None: not answered). -> question id -> "not answered" | "correct" |
        "not yet: <hint>", printed one per line unless show=False.
    questions(notebook_id) -> list[Question]       a notebook's questions, in order
    expected(notebook_id) -> dict[str, object]      every expected answer (tests and the kit use it)
    register(notebook_id, [Question, ...])          adds (or replaces) a notebook's questions

A Question has one or more Parts (an answer of several parts is a tuple, one value per part). Each
Part computes its expected value when checked and compares with a Match:
    Exact()       integers, strings and lists compared exactly (3.0 counts as 3, "1,024" as 1024)
    Approx(rel=REL_TOL, abs=0.0)   a number within a relative or an absolute tolerance
    Choice()      one letter or word, case and spaces ignored
    AnyOrder()    a list of integers whose order does not matter
and may name known wrong answers (traps): an answer equal to a trap gets the trap's own hint, the
way the grader names a known bug.

Expected values come from minillm itself wherever they can: shapes from minillm.model_zoo through
ModelConfig, block counts and prefix hits from the BlockManager, preemptions from the scheduler,
shards from shard_packed, the workload from minillm.bench. They are always computed with minillm's
reference functions, even while a notebook runs the reader's exercises (USE_MY_CODE = True). A few
questions quote a figure that a notebook measured on its GPU (a block count, a time); those figures
are the MEASURED_* constants below, and tests/test_questions.py checks that the notebooks' committed
outputs still print them.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

REL_TOL = 0.02  # default relative tolerance of a numeric answer: 2% (the reader rounds; measured figures are rounded)
PERCENT_TOL = 0.5  # absolute tolerance, in percentage points, of an answer given as a percentage

NOT_ANSWERED, CORRECT, NOT_YET = "not answered", "correct", "not yet"


# ------------------------------------------------------------------------------------------------ matching
class Match:
    """How an answer is compared with the expected value. describe() names the form the answer takes."""

    def __call__(self, answer: Any, expected: Any) -> bool:
        raise NotImplementedError

    def parse(self, answer: Any, expected: Any = None) -> Any:
        """The answer in the form compared (expected: the right value, for its form); ValueError saying
        what form was expected when it cannot be."""
        return answer


def _number(x: Any) -> float:
    if isinstance(x, bool):
        raise ValueError("a number, not True/False")
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        s = x.strip().replace(",", "").replace("_", "").rstrip("%").strip()
        try:
            return float(s)
        except ValueError:
            pass
    try:  # numpy scalars, 0-d tensors
        return float(x)
    except (TypeError, ValueError):
        raise ValueError(f"a number (got {x!r})") from None


@dataclass(frozen=True)
class Exact(Match):
    """Equal: numbers as numbers (3.0 == 3), strings ignoring surrounding spaces, lists element by element."""

    def parse(self, answer, expected=None):
        if isinstance(expected, (list, tuple)) and not isinstance(answer, (list, tuple)):
            raise ValueError(f"a list, like [1, 2] (got {answer!r})")
        if isinstance(answer, (list, tuple)):
            return [self.parse(a) for a in answer]
        if isinstance(answer, str) and not re.fullmatch(r"\s*-?[\d,_]+(\.\d*)?\s*", answer):
            if isinstance(expected, (int, float)):
                raise ValueError(f"a number (got {answer!r})")
            return answer.strip()
        return _number(answer)

    def __call__(self, answer, expected):
        return self.parse(answer) == self.parse(expected)


@dataclass(frozen=True)
class Approx(Match):
    """A number within `rel` of the expected value (relative) or within `abs` of it."""

    rel: float = REL_TOL
    abs: float = 0.0

    def parse(self, answer, expected=None):
        return _number(answer)

    def __call__(self, answer, expected):
        return math.isclose(self.parse(answer), float(expected), rel_tol=self.rel, abs_tol=self.abs)


@dataclass(frozen=True)
class Choice(Match):
    """One letter or word: "b", "B", " (b) " all match "b"."""

    def parse(self, answer, expected=None):
        if not isinstance(answer, str):
            raise ValueError(f"a letter in quotes, like \"a\" (got {answer!r})")
        return answer.strip().strip("()").strip().lower()

    def __call__(self, answer, expected):
        return self.parse(answer) == expected.lower()


@dataclass(frozen=True)
class AnyOrder(Match):
    """A list of integers, in any order (each value once)."""

    def parse(self, answer, expected=None):
        if not isinstance(answer, (list, tuple, set)):
            raise ValueError(f"a list of integers, like [1, 2] (got {answer!r})")
        return sorted(_number(a) for a in answer)

    def __call__(self, answer, expected):
        return self.parse(answer) == sorted(float(e) for e in expected)


# ------------------------------------------------------------------------------------------------ questions
@dataclass(frozen=True)
class Part:
    """One value of an answer.

    expected: computes the right value (called when an answer is checked).
    match: how the reader's value is compared with it.
    hint: shown when the value is wrong and matches no trap; points at the reasoning, not the result.
    traps: computes known wrong values and what each means -> [(wrong value, hint), ...].
    label: names the part in the message of a multi-part answer ("blocks", "bytes").
    """

    expected: Callable[[], Any]
    match: Match = Exact()
    hint: str = ""
    traps: Callable[[], list[tuple[Any, str]]] | None = None
    label: str = ""


@dataclass(frozen=True)
class Question:
    """One question: its id in ANSWERS ("q1"), a one-line summary, and the parts of its answer."""

    id: str
    ask: str
    parts: tuple[Part, ...]

    def expected(self) -> Any:
        with _reference_code():
            values = [p.expected() for p in self.parts]
        return values[0] if len(values) == 1 else tuple(values)

    def check(self, answer: Any) -> str:
        """-> "not answered", "correct" or "not yet: <hint>"."""
        if answer is None or answer is ...:
            return NOT_ANSWERED
        parts = self.parts
        if len(parts) > 1:
            shape = "(" + ", ".join(p.label or f"value {i + 1}" for i, p in enumerate(parts)) + ")"
            if not isinstance(answer, (tuple, list)) or len(answer) != len(parts):
                return f"{NOT_YET}: answer with {len(parts)} values in parentheses: {shape}"
            values = list(answer)
        else:
            values = [answer]
        notes = []
        with _reference_code():
            for i, (part, value) in enumerate(zip(parts, values)):
                name = part.label or f"value {i + 1}"
                right = part.expected()
                try:
                    part.match.parse(value, right)
                except ValueError as e:
                    notes.append(f"{name}: give {e}" if len(parts) > 1 else f"give {e}")
                    continue
                if part.match(value, right):
                    if len(parts) > 1:
                        notes.append(f"{name} correct")
                    continue
                traps = part.traps() if part.traps else []
                hint = next((h for wrong, h in traps if _matches(part.match, value, wrong)),
                            part.hint or "check your reasoning against the section the question names")
                notes.append(f"{name}: {hint}" if len(parts) > 1 else hint)
        wrong = [n for n in notes if not n.endswith(" correct")]
        return CORRECT if not wrong else f"{NOT_YET}: " + "; ".join(notes)


def _matches(match: Match, value: Any, wrong: Any) -> bool:
    try:
        return match(value, wrong)
    except (ValueError, TypeError):
        return False


@contextlib.contextmanager
def _reference_code():
    """minillm's own exercise functions for the duration, even while a notebook's USE_MY_CODE switch has
    the reader's in place (the expected values must not depend on the reader's code)."""
    from minillm.course import exercises
    swap = getattr(exercises, "_NOTEBOOK_SWAP", None)
    patched = list(swap.patched) if swap is not None else []
    for mod, name, ref, _ in patched:
        setattr(mod, name, ref)
    try:
        yield
    finally:
        for mod, name, _, new in patched:
            setattr(mod, name, new)


QUESTIONS: dict[str, list[Question]] = {}


def register(notebook_id: str, qs: list[Question]) -> None:
    """Add (or replace) a notebook's questions. notebook_id: its number, "05" or "02a"."""
    ids = [q.id for q in qs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"notebook {notebook_id}: question ids {ids} repeat")
    QUESTIONS[_short_id(notebook_id)] = list(qs)


def _short_id(notebook_id: str | int) -> str:
    """'03', '03_paged_kv_cache', 'notebooks/03_paged_kv_cache.ipynb', 3 -> '03'; '02a_triton_primer' -> '02a'."""
    if isinstance(notebook_id, int):
        return f"{notebook_id:02d}"
    name = str(notebook_id).replace("\\", "/").rsplit("/", 1)[-1]
    return name.removesuffix(".ipynb").split("_", 1)[0]


def questions(notebook_id: str | int) -> list[Question]:
    key = _short_id(notebook_id)
    if key not in QUESTIONS:
        raise ValueError(f"no questions for notebook {notebook_id!r}; notebooks with questions: {sorted(QUESTIONS)}")
    return QUESTIONS[key]


def expected(notebook_id: str | int) -> dict[str, Any]:
    """Question id -> the expected answer (a tuple for a multi-part answer)."""
    return {q.id: q.expected() for q in questions(notebook_id)}


def check_answers(notebook_id: str | int, answers: dict, show: bool = True) -> dict[str, str]:
    """Check a reader's answers. -> question id -> "not answered" | "correct" | "not yet: <hint>";
    printed one per line when show is true."""
    qs = questions(notebook_id)
    unknown = sorted(set(answers) - {q.id for q in qs})
    results = {q.id: q.check(answers.get(q.id)) for q in qs}
    if show:
        width = max(len(q.id) for q in qs) + 2
        for qid, status in results.items():
            print(f"{qid:<{width}}{status}")
        if unknown:
            print(f"(not questions of this notebook, ignored: {', '.join(map(str, unknown))})")
        done = sum(s == CORRECT for s in results.values())
        print(f"{done} of {len(qs)} correct" + ("" if done < len(qs) else ": well done"))
    return results


# ------------------------------------------------------------------------------------------------ shapes
def model_config(shapes: dict, model_type: str = "qwen3"):
    """A ModelConfig from one of minillm.model_zoo's shape dicts (QWEN3_06B, QWEN3_8B, ...)."""
    from minillm.config import ModelConfig
    return ModelConfig.from_dict({"model_type": model_type, "dtype": "bfloat16", **shapes}, source="shapes")


# SmolLM2-135M-Instruct's shapes, as its config.json gives them (notebook 00 prints layers, hidden size,
# heads and vocabulary; notebook 01 prints the config): a Llama model with tied embeddings. The model
# itself is prepared from a PyPI package on first use, so the checker does not load it; the test
# compares this dict with what the notebooks print.
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                    tie_word_embeddings=True)

# Figures that notebooks measured on their GPU (the NVIDIA H200 of their committed outputs) and that a
# question quotes. tests/test_questions.py requires each to appear in its notebook's outputs.
MEASURED_00_KV_BLOCKS = 10069  # 00_tour, section 1: "KV cache: 10069 blocks x 256 tokens"
MEASURED_01_COPY_GBPS = 4148.0  # 01, section 8: "copy 4,148 GB/s"
MEASURED_01_SAFETENSORS_HEADER = 30528  # 01, section 5: "header 30,528 bytes" (SmolLM2's model.safetensors)
MEASURED_01_DOWN_PROJ_BEGIN = 56624256  # 01, section 5: layers.0.mlp.down_proj's data_offsets[0]
MEASURED_02_COPY_GBPS = 4185.0  # 02, section 9: "copy 4,185 GB/s"
MEASURED_02_RIDGE = 184  # 02, section 9: "ridge point 184 FLOP/byte"
MEASURED_02_LAYER_GRAPH_US = 112.0  # 02, section 11: "decode (1 token): whole layer eager 704 us, CUDA graph 112 us"

BF16 = 2  # bytes per element


def _kv_bytes_per_token(shapes: dict, model_type: str = "qwen3", tp: int = 1) -> int:
    import torch
    return model_config(shapes, model_type).kv_bytes_per_token(tp, torch.bfloat16)


# ------------------------------------------------------------------------------------------------ 00_tour
def _tour_gib() -> float:
    return MEASURED_00_KV_BLOCKS * 256 * _kv_bytes_per_token(SMOLLM2_135M, "llama") / 2 ** 30


register("00", [
    Question("q1", "KV-cache bytes per token of SmolLM2-135M in bf16", (
        Part(lambda: _kv_bytes_per_token(SMOLLM2_135M, "llama"),
             hint="per layer, a token stores one key and one value vector for every KV head; count the layers, "
                  "the KV heads, the head's width and the bytes of a bf16 number",
             traps=lambda: [(30 * 3 * 64 * BF16, "that is the keys alone (or the values alone): the cache holds both"),
                            (2 * 30 * 9 * 64 * BF16, "the cache stores the KV heads, not the query heads: GQA shares "
                                                     "each KV head between several query heads"),
                            (2 * 30 * 3 * 64 * 4, "the engine runs SmolLM2 in bf16 here: how many bytes is a bf16 "
                                                  "number?"),
                            (2 * 3 * 64 * BF16, "that is one layer's share; every layer keeps its own K and V")]),)),
    Question("q2", "GiB of the tour's KV cache (10,069 blocks of 256 tokens)", (
        Part(_tour_gib, Approx(), hint="blocks x tokens per block x bytes per token (Q1), then divide by 2**30",
             traps=lambda: [(_tour_gib() * 2 ** 30 / 1e9, "that is in GB (10**9 bytes); the question asks for GiB "
                                                          "(2**30 bytes)")]),)),
    Question("q3", "requests of max_model_len (4,096 tokens) whose whole cache fits at once", (
        Part(lambda: MEASURED_00_KV_BLOCKS // (4096 // 256),
             hint="how many 256-token blocks does one 4,096-token request need? A request cannot use part of "
                  "a block that another holds",
             traps=lambda: [(MEASURED_00_KV_BLOCKS / (4096 // 256), "a request needs whole blocks: round down"),
                            (MEASURED_00_KV_BLOCKS // (4096 // 256) + 1,
                             "a request needs whole blocks: round down")]),)),
    Question("q4", "engine.step() calls, and forward passes, for two requests of max_tokens=5", (
        Part(lambda: 5 + 1, label="calls",
             hint="follow section 7's printout: which call launches a request's first token, and which one reads "
                  "its last token back?",
             traps=lambda: [(5, "with asynchronous scheduling, in which call is a request's last token read back?")]),
        Part(lambda: 5, label="forward passes",
             hint="one forward pass produces one token of each running request; does the last call launch one?",
             traps=lambda: [(6, "the last call only reads the final tokens back: it launches nothing")]),
    )),
])


# ------------------------------------------------------------------------------------------------ 01
def _qkv_rows(shapes: dict) -> tuple[int, int]:
    """(rows of the packed qkv_proj.weight, first row of its v_proj part)."""
    c = model_config(shapes)
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return q + 2 * kv, q + kv


def _weights_read_per_token_ms(shapes: dict, gbps: float) -> float:
    """Floor of a T = 1 forward: every weight once except the embedding table, of which a forward reads only
    T rows (unless the LM head is that same tensor), at `gbps`, in ms (notebook 01, section 8)."""
    c = model_config(shapes)
    params = c.num_parameters()
    if not c.tie_word_embeddings:
        params -= c.vocab_size * c.hidden_size
    return params * BF16 / (gbps * 1e9) * 1e3


def _positions(prompt: int, new: int) -> tuple[int, int]:
    """Token positions the naive loop and the KV-cache loop push through the model (notebook 01, sections 9-10)."""
    return sum(prompt + i for i in range(new)), prompt + new - 1


def _qwen3_8b():
    from minillm.model_zoo import QWEN3_8B
    return QWEN3_8B


def _qwen3_06b():
    from minillm.model_zoo import QWEN3_06B
    return QWEN3_06B


register("01", [
    Question("q1", "file offset of SmolLM2's layers.0.mlp.down_proj data", (
        Part(lambda: 8 + MEASURED_01_SAFETENSORS_HEADER + MEASURED_01_DOWN_PROJ_BEGIN,
             hint="data_offsets count from the first byte after the header; what comes before the header?",
             traps=lambda: [(MEASURED_01_DOWN_PROJ_BEGIN, "data_offsets do not count from the start of the file: "
                                                          "they count from the end of the header"),
                            (MEASURED_01_SAFETENSORS_HEADER + MEASURED_01_DOWN_PROJ_BEGIN,
                             "the header does not start at byte 0: something of 8 bytes comes first")]),)),
    Question("q2", "rows of Qwen3-0.6B's qkv_proj.weight, and the first row of its v_proj part", (
        Part(lambda: _qkv_rows(_qwen3_06b())[0], label="rows",
             hint="q has one head_dim-row block per query head, k and v one per KV head",
             traps=lambda: [(3 * 16 * 128, "k and v have the KV heads' rows, not the query heads'")]),
        Part(lambda: _qkv_rows(_qwen3_06b())[1], label="first row of v_proj",
             hint="the packed rows are [q | k | v]: v starts after all of q and all of k",
             traps=lambda: [(16 * 128, "that is where k starts; v comes after k")]),
    )),
    Question("q3", "token positions through the model: naive loop and KV-cache loop, prompt 2,048, 128 new", (
        Part(lambda: _positions(2048, 128)[0], label="naive",
             hint="step t runs the prompt plus the t tokens generated so far; add up the 128 steps (check your "
                  "formula on section 9's 396)",
             traps=lambda: [(128 * 2048, "every step also re-runs the tokens generated before it"),
                            (sum(2048 + i for i in range(1, 129)), "the first step (t = 0) runs the prompt alone; "
                                                                   "the last one runs prompt + 127")]),
        Part(lambda: _positions(2048, 128)[1], label="cached",
             hint="the prefill runs the prompt once and produces the first new token; each later token takes one "
                  "step of one position",
             traps=lambda: [(2048 + 128, "the prefill already produces the first new token")]),
    )),
    Question("q4", "T = 1 floor of Qwen3-8B in bf16 at 4,148 GB/s, ms", (
        Part(lambda: _weights_read_per_token_ms(_qwen3_8b(), MEASURED_01_COPY_GBPS), Approx(),
             hint="count Qwen3-8B's parameters (ModelConfig.num_parameters), keep only the ones a one-token forward "
                  "reads, times 2 bytes, over the bandwidth",
             traps=lambda: [(model_config(_qwen3_8b()).num_parameters() * BF16 / (MEASURED_01_COPY_GBPS * 1e6),
                             "a forward reads only T rows of the embedding table, and Qwen3-8B's LM head is a separate "
                             "tensor (it is not tied): leave the table out"),
                            (_weights_read_per_token_ms(_qwen3_8b(), MEASURED_01_COPY_GBPS) * 2,
                             "bf16 is 2 bytes per parameter")]),)),
    Question("q5", "why T = 128 costs barely more than T = 1 in the eager forward", (
        Part(lambda: "b", Choice(),
             hint="compare the measured 48.7 ms with the floor the same row prints: what time would each explanation "
                  "predict for T = 1?"),)),
])


# ------------------------------------------------------------------------------------------------ 02
def _packed_positions(seqlens: list[int], offsets: list[int]) -> list[int]:
    return [o + i for n, o in zip(seqlens, offsets) for i in range(n)]


def _norm_floor_us(rows: int, d: int, gbps: float) -> float:
    """Fused add+RMSNorm: read x and residual, write out and the new residual, read the weight (bf16)."""
    return (4 * rows * d + d) * BF16 / (gbps * 1e9) * 1e6


def _linear_intensity(n: int, k: int, m: int) -> float:
    """FLOP per byte of [n, k] @ [k, m] in bf16, counting the input, the weight and the output once (op_costs)."""
    return 2 * n * k * m / (BF16 * (n * k + k * m + n * m))


def _first_compute_bound_batch(k: int, m: int, ridge: float) -> int:
    n = 1
    while _linear_intensity(n, k, m) < ridge:
        n += 1
    return n


def _decode_attention_intensity(shapes: dict, kv_heads: int, batch: int = 256, ctx: int = 1024) -> float:
    """op_costs' decode attention: 4·n·ctx·H·D FLOPs; q and out, and ctx cached K and V rows per sequence."""
    H, D = shapes["num_attention_heads"], shapes["head_dim"]
    flops = 4 * batch * ctx * H * D
    nbytes = BF16 * (2 * batch * H * D + 2 * batch * ctx * kv_heads * D)
    return flops / nbytes


def _layer_weight_floor_us(shapes: dict, gbps: float) -> float:
    """One decoder layer's four projections (bf16) read once, at `gbps` (norm weights are a few kB: left out)."""
    h, H, Hkv, D, I = (shapes[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                           "intermediate_size"))
    params = h * (H + 2 * Hkv) * D + H * D * h + 2 * h * I + I * h
    return params * BF16 / (gbps * 1e9) * 1e6


register("02", [
    Question("q1", "packed positions of lengths [2, 3, 1] starting at [4, 0, 9]", (
        Part(lambda: _packed_positions([2, 3, 1], [4, 0, 9]),
             hint="each sequence counts its own positions, starting from its own offset, for as many tokens as it "
                  "has; the sequences are concatenated in order",
             traps=lambda: [(list(range(6)), "positions are not row indices: each sequence starts at its own offset"),
                            ([0, 1, 0, 1, 2, 0], "these sequences do not start at 0: a cached prefix or a decode "
                                                 "puts a sequence's first new token at its offset")]),)),
    Question("q2", "memory floor of add+RMSNorm on 16,384 x 576 bf16 at 4,185 GB/s, microseconds", (
        Part(lambda: _norm_floor_us(16384, 576, MEASURED_02_COPY_GBPS), Approx(),
             hint="the fused kernel reads x and the residual and writes the output and the new residual, once "
                  "each (plus the weight): bytes over bandwidth",
             traps=lambda: [(_norm_floor_us(16384, 576, MEASURED_02_COPY_GBPS) / 2,
                             "count all four [N, d] tensors: two read and two written"),
                            (_norm_floor_us(16384, 1024, MEASURED_02_COPY_GBPS),
                             "that is d = 1024; the question asks for SmolLM2's d = 576")]),)),
    Question("q3", "smallest decode batch at which o_proj reaches the ridge point (184 FLOP/byte)", (
        Part(lambda: _first_compute_bound_batch(16 * 128, 1024, MEASURED_02_RIDGE), Approx(rel=0, abs=1),
             hint="write o_proj's FLOPs and bytes for a batch of n tokens (op_costs' `linear(k, m)`), set their "
                  "ratio equal to 184 and solve for n; then take the next whole batch"),)),
    Question("q4", "decode attention's FLOP per byte with 4 KV heads (batch 256, context 1,024)", (
        Part(lambda: _decode_attention_intensity(_qwen3_06b(), kv_heads=4), Approx(rel=0.03),
             hint="the FLOPs depend on the query heads, the bytes mostly on the cached K and V: what changes when "
                  "the KV heads halve?",
             traps=lambda: [(_decode_attention_intensity(_qwen3_06b(), kv_heads=8),
                             "that is Qwen3-0.6B's own 8 KV heads"),
                            (_decode_attention_intensity(_qwen3_06b(), kv_heads=8) / 2,
                             "fewer KV heads read fewer bytes for the same FLOPs: does the ratio go up or down?")]),)),
    Question("q5", "one layer's weight-read floor at batch 1 (microseconds), and the share of it the graph "
                   "replay reaches", (
        Part(lambda: _layer_weight_floor_us(_qwen3_06b(), MEASURED_02_COPY_GBPS), Approx(rel=0.03), label="floor",
             hint="add the four projections' bf16 sizes that section 9 printed and divide by the bandwidth"),
        Part(lambda: 100 * _layer_weight_floor_us(_qwen3_06b(), MEASURED_02_COPY_GBPS) / MEASURED_02_LAYER_GRAPH_US,
             Approx(rel=0.05), label="percent of the floor",
             hint="the share is floor time / measured time, in percent",
             traps=lambda: [(MEASURED_02_LAYER_GRAPH_US / _layer_weight_floor_us(_qwen3_06b(), MEASURED_02_COPY_GBPS)
                             * 100, "turn it over: the share of the floor is floor / measured")]),
    )),
])


# ------------------------------------------------------------------------------------------------ 03
def _blocks_and_bytes(tokens: int, block_size: int = 256) -> tuple[int, int]:
    import torch
    blocks = -(-tokens // block_size)
    return blocks, blocks * block_size * model_config(_qwen3_06b()).kv_bytes_per_token(1, torch.bfloat16)


def _prefill_tokens_after_shared_prefix() -> tuple[int, int]:
    """Tokens the prefill computes for X (the cached 512 tokens exactly) and Y (them + 88 more), after a
    600-token request put its two full blocks in the cache (block size 256): the engine's BlockManager."""
    from minillm import SamplingParams
    from minillm.engine.block_manager import BlockManager
    from minillm.engine.sequence import Sequence
    bm = BlockManager(num_blocks=16, block_size=256, enable_prefix_caching=True)
    prefix = list(range(1000, 1512))
    first = Sequence(prefix + list(range(5000, 5088)), SamplingParams(), 256)
    bm.allocate(first)
    bm.deallocate(first)
    out = []
    for own in ([], list(range(7000, 7088))):
        seq = Sequence(prefix + own, SamplingParams(), 256)
        bm.allocate(seq)
        out.append(len(seq) - seq.num_cached_tokens)
    return tuple(out)


def _paged_waste(block_size: int) -> float:
    """Time-averaged share of the KV memory wasted by paging with `block_size`-token blocks, over the bench
    workload (notebook 03, section 1: the same arithmetic), in percent."""
    import numpy as np

    from minillm.bench import make_workload
    prompts, outputs = make_workload(256, 100, 1024, 1024, seed=0)
    P, O = np.array([len(p) for p in prompts]), np.array(outputs)
    held = alloc = 0
    for t in range(O.max() + 1):
        n = P[O >= t] + t
        held += n.sum()
        alloc += (np.ceil(n / block_size) * block_size).sum()
    return float(100 * (1 - held / alloc))


def _first_preemption(num_blocks: int, block_size: int = 4, steps: int = 100) -> int | None:
    """The step of section 7's demo (three 4-token requests) at which the scheduler first preempts."""
    from collections import deque

    from minillm import SamplingParams
    from minillm.engine.block_manager import BlockManager
    from minillm.engine.scheduler import schedule_step
    from minillm.engine.sequence import Sequence
    bm = BlockManager(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=False)
    waiting = deque(Sequence(list(range(10 * i, 10 * i + 4)), SamplingParams(), block_size) for i in range(3))
    running = deque()
    for step in range(steps):
        scheduled, _, preempted = schedule_step(waiting, running, bm, max_num_seqs=8, max_num_batched_tokens=64)
        if preempted:
            return step
        for s in scheduled:
            s.append_token(0)
    return None


def prefix_hit_shares(system_len: int, user_len: int, block_size: int = 256, num_requests: int = 64,
                      passes: int = 3) -> tuple[float, float]:
    """Section 3's prefix-caching cell, in the engine's BlockManager: `num_requests` requests (one shared
    system prompt + their own user tokens), run `passes` times; -> (percent of the prompt tokens the last pass
    takes from the cache, percent a new request with unseen user tokens takes)."""
    import random

    from minillm import SamplingParams
    from minillm.engine.block_manager import BlockManager
    from minillm.engine.sequence import Sequence
    rng = random.Random(0)
    system = [rng.randrange(10000) for _ in range(system_len)]
    reqs = [system + [rng.randrange(10000, 20000) for _ in range(user_len)] for _ in range(num_requests)]
    per_req = -(-(system_len + user_len) // block_size)
    bm = BlockManager(num_blocks=per_req * num_requests * (passes + 2), block_size=block_size)
    share = 0.0
    for _ in range(passes):
        seqs = [Sequence(list(r), SamplingParams(), block_size) for r in reqs]
        for s in seqs:  # one prefill batch: allocated in order, then all finish
            bm.allocate(s)
        share = 100 * sum(s.num_cached_tokens for s in seqs) / sum(len(r) for r in reqs)
        for s in seqs:
            bm.deallocate(s)
    new = Sequence(system + [rng.randrange(20000, 30000) for _ in range(user_len)], SamplingParams(), block_size)
    bm.allocate(new)
    return share, 100 * new.num_cached_tokens / len(new)


def _decode_launch(batch: int, sms: int = 132, max_context: int = 4096, block_size: int = 256) -> tuple[int, int]:
    """(splits, programs) of the paged decode kernel for a decode batch of Qwen3-0.6B on a GPU of `sms` SMs
    whose block tables allow `max_context` tokens: minillm's paged_decode_config, asked with `sms` SMs."""
    import torch

    from minillm.kernels import paged_attention as pa
    cfg = model_config(_qwen3_06b())
    hkv = cfg.num_key_value_heads
    real = pa.num_sms
    pa.num_sms = lambda device: sms
    try:
        launch = pa.paged_decode_config(batch, hkv, cfg.num_attention_heads // hkv, cfg.head_dim, max_context,
                                        block_size, torch.device("cuda"))
    finally:
        pa.num_sms = real
    return launch["num_splits"], batch * hkv * launch["num_splits"]


register("03", [
    Question("q1", "KV blocks of a 3,000-token prompt at block size 256, and their bytes at Qwen3-0.6B's shapes", (
        Part(lambda: _blocks_and_bytes(3000)[0], label="blocks",
             hint="a block holds 256 tokens, and a partly filled block is still a whole block",
             traps=lambda: [(3000 // 256, "the last 184 tokens need a block too: round up")]),
        Part(lambda: _blocks_and_bytes(3000)[1], label="bytes",
             hint="blocks x 256 token slots x the bytes one token's K and V take in all layers (bf16)",
             traps=lambda: [(3000 * _blocks_and_bytes(1)[1] // 256, "that counts the 3,000 tokens; the blocks hold "
                                                                     "more slots than that, and all are reserved"),
                            (_blocks_and_bytes(3000)[1] // 2, "the cache holds K and V"),
                            (_blocks_and_bytes(3000)[1] // 28, "that is one layer; every layer has its own cache")]),
    )),
    Question("q2", "tokens the prefill computes for X (512 cached tokens exactly) and Y (512 cached + 88)", (
        Part(lambda: _prefill_tokens_after_shared_prefix()[0], label="X",
             hint="which block holds X's last prompt token, and may that block come from the cache?",
             traps=lambda: [(0, "X's last token must go through the model now, to give the logits of its first "
                                "output token: its block cannot come from the cache")]),
        Part(lambda: _prefill_tokens_after_shared_prefix()[1], label="Y",
             hint="how many of Y's leading full blocks match the cache, and does either hold Y's last token?"),
    )),
    Question("q3", "waste of paging with 64-token blocks, percent", (
        Part(lambda: _paged_waste(64), Approx(rel=0, abs=0.75),
             hint="the waste is the unfilled tail of each request's last block; how does its average size change "
                  "with the block size, next to the tokens a request holds?"),)),
    Question("q4", "step of the first preemption with 8 blocks, and with 9", (
        Part(lambda: _first_preemption(8), label="8 blocks",
             hint="count the blocks the three requests hold after each step, and the steps at which each needs "
                  "a new one at the same time"),
        Part(lambda: _first_preemption(9), label="9 blocks",
             hint="with 9 blocks the step that preempted before finds enough; when do all three need a block "
                  "again?"),
    )),
    Question("q5", "prefix-cache share printed with SYSTEM_LEN = 2000, and a new request's share, percent", (
        Part(lambda: prefix_hit_shares(2000, 64)[0], Approx(rel=0, abs=PERCENT_TOL), label="printed",
             hint="the cell measures a pass over requests it has run before: which of each request's own full "
                  "blocks are already in the cache?",
             traps=lambda: [(prefix_hit_shares(2000, 64)[1], "that is a new request's share; the cell repeats "
                                                             "requests it has already run")]),
        Part(lambda: prefix_hit_shares(2000, 64)[1], Approx(rel=0, abs=PERCENT_TOL), label="new request",
             hint="a new request shares only the full blocks that hold nothing but the system prompt"),
    )),
    Question("q6", "splits and programs of the paged decode kernel for 40 sequences on 132 SMs", (
        Part(lambda: _decode_launch(40)[0], label="splits",
             hint="how many programs does the rule want, how many does one split give (one per sequence and "
                  "KV head), and how many splits reach the target? Then the caps printed beside it",
             traps=lambda: [(_decode_launch(40)[0] - 1, "that many splits fall short of the target: round up"),
                            (1, "40 sequences x 8 KV heads are far fewer programs than the rule's target"),
                            (16, "16 is a cap; the rule takes the fewest splits that reach the target")]),
        Part(lambda: _decode_launch(40)[1], label="programs",
             hint="one program per (sequence, KV head, split)",
             traps=lambda: [(40 * 8, "that is one split's programs; every split is a program of its own"),
                            (2 * _decode_launch(40)[1], "one program serves all the query heads of its KV head")]),
    )),
])


# ------------------------------------------------------------------------------------------------ 04
def _qkv_shard(shapes: dict, rank: int, tp: int) -> tuple[int, int, int]:
    """(rows of rank's qkv_proj shard, its first query head, its first KV head): minillm's shard_packed
    applied to the row numbers of the packed [q | k | v] tensor."""
    import torch

    from minillm.layers.linear import shard_packed
    c = model_config(shapes)
    D, H, Hkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    sizes = [H * D, Hkv * D, Hkv * D]
    rows = shard_packed(torch.arange(sum(sizes)).unsqueeze(1), sizes, rank, tp).flatten().tolist()
    q_rows = [r for r in rows if r < H * D]
    k_rows = [r - H * D for r in rows if H * D <= r < (H + Hkv) * D]
    return len(rows), q_rows[0] // D, k_rows[0] // D


def _tp_sizes(shapes: dict, candidates=(2, 3, 4, 6, 8, 16)) -> list[int]:
    """The sizes that divide every dimension tensor parallelism splits (EngineConfig.validate's rule)."""
    c = model_config(shapes)
    dims = (c.num_attention_heads, c.num_key_value_heads, c.vocab_size, c.intermediate_size)
    return [p for p in candidates if all(n % p == 0 for n in dims)]


OWNER_IDS = [0, 9707, 75967, 75968, 100000, 151643, 151935]  # notebook 04, section 5


def _owners(tp: int) -> list[int]:
    from minillm.model_zoo import QWEN3_TINY
    per_rank = QWEN3_TINY["vocab_size"] // tp
    return [i // per_rank for i in OWNER_IDS]


def _break_even_latency_us(shapes: dict, gbps: float = 4200.0) -> float:
    """Largest latency of one all-reduce at which TP=2 still beats TP=1 at batch 1: the weight-read time TP=2
    saves per decode step, shared among the step's 2L + 1 all-reduces."""
    c = model_config(shapes)
    params = c.num_parameters() - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)
    saved_s = params * BF16 / 2 / (gbps * 1e9)
    return saved_s / (2 * c.num_hidden_layers + 1) * 1e6


register("04", [
    Question("q1", "Qwen3-8B at TP = 4, rank 2's qkv_proj shard: rows, first query head, first KV head", (
        Part(lambda: _qkv_shard(_qwen3_8b(), 2, 4)[0], label="rows",
             hint="each rank holds a quarter of the query heads and a quarter of the KV heads, head_dim rows each",
             traps=lambda: [((32 + 16) * 128, "that is the whole packed tensor: a rank holds 1/4 of it")]),
        Part(lambda: _qkv_shard(_qwen3_8b(), 2, 4)[1], label="first query head",
             hint="ranks take consecutive groups of query heads in rank order"),
        Part(lambda: _qkv_shard(_qwen3_8b(), 2, 4)[2], label="first KV head",
             hint="the KV heads are cut into 4 groups the same way, so each query head finds its KV head on its "
                  "own rank"),
    )),
    Question("q2", "TP sizes among 2, 3, 4, 6, 8, 16 that Qwen3-0.6B can run at", (
        Part(lambda: _tp_sizes(_qwen3_06b()), AnyOrder(),
             hint="a size must divide every dimension that gets split: query heads, KV heads, intermediate size "
                  "and vocabulary",
             traps=lambda: [([2, 4, 8, 16], "16 ranks would need 16 KV heads to give each one; Qwen3-0.6B has 8"),
                            ([2, 4, 8, 16, 3, 6], "check the KV heads and the intermediate size too")]),)),
    Question("q3", "owner ranks of the seven ids at TP = 4", (
        Part(lambda: _owners(4),
             hint="rank r holds ids r * V/4 up to (r + 1) * V/4 - 1, with V = 151,936; a boundary id belongs to the "
                  "rank it starts",
             traps=lambda: [(_owners(2), "that is TP = 2's answer; at TP = 4 each rank holds V/4 ids")]),)),
    Question("q4", "SmolLM2-135M at TP = 3: all-reduces per decode step, and bytes of each at batch 8 (bf16)", (
        Part(lambda: 2 * SMOLLM2_135M["num_hidden_layers"] + 1, label="all-reduces",
             hint="two per decoder layer (after o_proj and after down_proj), and one more outside the layers",
             traps=lambda: [(2 * SMOLLM2_135M["num_hidden_layers"], "the layers are not the only part of the model "
                                                                    "that is split over the ranks")]),
        Part(lambda: 8 * SMOLLM2_135M["hidden_size"] * BF16, label="bytes",
             hint="every all-reduce carries the full [batch, hidden] activations, on every rank",
             traps=lambda: [(8 * SMOLLM2_135M["hidden_size"] * BF16 // 3,
                             "the all-reduce sums full [batch, hidden] partial results: each rank's message is the "
                             "whole tensor, not a third of it")]),
    )),
    Question("q5", "largest all-reduce latency at which Qwen3-8B at TP = 2 beats TP = 1 at batch 1, microseconds", (
        Part(lambda: _break_even_latency_us(_qwen3_8b()), Approx(),
             hint="TP = 2 saves the time of reading half the weights per step; the step pays 2L + 1 all-reduces "
                  "in return",
             traps=lambda: [(_break_even_latency_us(_qwen3_8b()) * 2, "TP = 2 saves half of TP = 1's read time, "
                                                                      "not all of it")]),)),
])

# notebooks whose questions are defined beside their material: importing the module registers them
from minillm.course import triton_primer as _triton_primer  # noqa: E402,F401  (notebook 02a, the Triton primer)
from minillm.course import engine_questions as _engine_questions  # noqa: E402,F401  (notebook 05, the engine at speed)
from minillm.course import serving_questions as _serving_questions  # noqa: E402,F401  (notebook 06, serving)
