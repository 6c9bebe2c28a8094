"""The "Check your understanding" questions that end notebooks 00-04, and their checker
(minillm/course/questions.py).

The right answers below are recomputed here without the checker's code: plain arithmetic from the
shapes the notebooks print, parameter counts of transformers' own Qwen3 model (built on the meta
device, so nothing is allocated), and runs of the real engine on CPU for the answers that are
behaviour (steps of the async engine, prefix-cache hits). The worked answers in
notebooks/lecturer/NN_*.md give the same numbers.
"""
from __future__ import annotations

import ast
import contextlib
import io
import os
import re

import nbformat
import pytest
import torch

from minillm.course import questions as Q
from minillm.course.exercises import REPO_DIR
from minillm.course.slides import SLIDE_TYPES

NOTEBOOKS = {"00": "00_tour", "01": "01_vocab_weights_runtime", "02": "02_decoder_layer", "03": "03_paged_kv_cache",
             "04": "04_tensor_parallel"}
# every notebook that ends with questions (02a's, 05's and 06's answers are tested in their own files)
ENDINGS = {**NOTEBOOKS, "02a": "02a_triton_primer", "05": "05_engine_performance", "06": "06_serving"}
KIB = 1024


def hf_parameters(shapes: dict) -> tuple[int, int]:
    """(all parameters, embedding-table parameters) of transformers' Qwen3ForCausalLM with these shapes,
    built on the meta device: an independent count of what Qwen3 holds."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(**{k: v for k, v in shapes.items() if k not in ("rope_theta",)})
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    return sum(p.numel() for p in model.parameters()), model.model.embed_tokens.weight.numel()


def qwen3_8b():
    from minillm.model_zoo import QWEN3_8B
    return QWEN3_8B


def right_answers() -> dict[str, dict]:
    """Every question's answer, recomputed here (see the module docstring)."""
    bpt_smol = 2 * 30 * 3 * (576 // 9) * 2  # K and V x layers x KV heads x head_dim x bf16 = 23,040
    n8b, emb8b = hf_parameters(qwen3_8b())
    read8b = (n8b - emb8b) * 2  # a one-token forward reads all but the (untied) embedding table
    layer_params = 1024 * (16 + 2 * 8) * 128 + 16 * 128 * 1024 + 2 * 1024 * 3072 + 3072 * 1024  # 15,728,640
    floor_us = layer_params * 2 / 4185e9 * 1e6
    bpt_06b = 2 * 28 * 8 * 128 * 2  # 112 KiB, as notebook 03's introduction says
    return {
        "00": {"q1": bpt_smol, "q2": 10069 * 256 * bpt_smol / 2 ** 30, "q3": 10069 // (4096 // 256), "q4": (6, 5)},
        "01": {"q1": 8 + 30528 + 56624256,
               "q2": ((16 + 2 * 8) * 128, (16 + 8) * 128),
               "q3": (128 * 2048 + 127 * 128 // 2, 2048 + 127),
               "q4": read8b / 4148e9 * 1e3,
               "q5": "b"},
        "02": {"q1": [4, 5, 0, 1, 2, 9],
               "q2": (4 * 16384 * 576 + 576) * 2 / 4185e9 * 1e6,
               "q3": 252,  # 251 * 2048 * 1024 / (251*2048 + 2048*1024 + 251*1024) = 183.5; at 252: 184.1
               "q4": (4 * 256 * 1024 * 16 * 128) / (2 * (2 * 256 * 16 * 128 + 2 * 256 * 1024 * 4 * 128)),
               "q5": (floor_us, 100 * floor_us / 112)},
        "03": {"q1": (12, 12 * 256 * bpt_06b),
               "q2": (256, 88),
               "q3": 3.38,  # the exact arithmetic of section 1's table at 64-token blocks
               "q4": (5, 9),
               "q5": (100 * 2048 / 2064, 100 * 1792 / 2064),
               # the printed rule: splits until 40 x 8 programs per split reach 6 x 132 = 792, at most 16 of
               # >= 256 keys (4,096 / 256 = 16): ceil(792 / 320) = 3 splits, 3 x 320 programs
               "q6": (3, 960)},
        "04": {"q1": (48 * 128 // 4, 2 * 32 // 4, 2 * 8 // 4),
               "q2": [2, 4, 8],
               "q3": [0, 0, 1, 2, 2, 3, 3],
               "q4": (2 * 30 + 1, 8 * 576 * 2),
               "q5": read8b / 2 / 4200e9 / (2 * 36 + 1) * 1e6},
    }


@pytest.fixture(scope="module")
def answers():
    return right_answers()


def wrong(value):
    """A plainly wrong answer of the same form."""
    if isinstance(value, tuple):
        return tuple(wrong(v) for v in value)
    if isinstance(value, list):
        return [v + 1 for v in value]
    if isinstance(value, str):
        return "a" if value != "a" else "c"
    return value * 1.5 + 7


# ------------------------------------------------------------------------------------------------ the checker
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_the_checker_accepts_the_right_answers(nb, answers):
    results = Q.check_answers(nb, answers[nb], show=False)
    assert results == {q: Q.CORRECT for q in answers[nb]}, results


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_expected_values_equal_the_independent_ones(nb, answers):
    got = Q.expected(nb)
    assert set(got) == set(answers[nb])
    for qid, want in answers[nb].items():
        g = got[qid] if isinstance(got[qid], tuple) else (got[qid],)
        w = want if isinstance(want, tuple) else (want,)
        for a, b in zip(g, w, strict=True):
            if isinstance(b, (list, str)):
                assert (sorted(a) if qid == "q2" and nb == "04" else a) == b, (nb, qid)
            else:
                assert a == pytest.approx(b, rel=1e-3, abs=0.01), (nb, qid, got[qid], want)


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_the_checker_rejects_wrong_answers_with_a_hint_that_keeps_the_answer(nb, answers):
    results = Q.check_answers(nb, {q: wrong(v) for q, v in answers[nb].items()}, show=False)
    for qid, status in results.items():
        assert status.startswith(Q.NOT_YET + ": ") and len(status) > len(Q.NOT_YET) + 20, (qid, status)
        for v in (answers[nb][qid] if isinstance(answers[nb][qid], tuple) else (answers[nb][qid],)):
            if isinstance(v, (int, float)) and abs(v) >= 100:  # small numbers occur in any text
                for shown in {f"{v:.0f}", f"{v:,.0f}", f"{v:.1f}", f"{v:.2f}"}:
                    assert shown not in status, f"{nb} {qid}: the hint gives the answer away: {status}"


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_unanswered_questions_are_reported_as_such(nb):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results = Q.check_answers(nb, {q.id: None for q in Q.questions(nb)})
    assert set(results.values()) == {Q.NOT_ANSWERED}
    assert out.getvalue().count(Q.NOT_ANSWERED) == len(results)
    assert f"0 of {len(results)} correct" in out.getvalue()


def test_known_wrong_answers_get_their_own_hint():
    r = Q.check_answers("00", {"q1": 2 * 30 * 9 * 64 * 2, "q4": (5, 5)}, show=False)
    assert "query heads" in r["q1"]
    assert r["q4"].startswith("not yet: calls: ") and "forward passes correct" in r["q4"]
    r = Q.check_answers("03", {"q1": (12, 3000 * 114688), "q5": (100 * 1792 / 2064, 86.8)}, show=False)
    assert "blocks correct" in r["q1"] and "counts the 3,000 tokens" in r["q1"]
    assert "new request's share" in r["q5"]
    for answer, slip in (((2, 960), "round up"), ((3, 320), "one split's programs"), ((3, 1920), "query heads"),
                         ((16, 960), "a cap")):
        assert slip in Q.check_answers("03", {"q6": answer}, show=False)["q6"], answer


def test_answers_in_other_forms():
    assert Q.check_answers("00", {"q1": "23,040", "q2": 55.3, "q4": [6, 5]}, show=False) == {
        "q1": Q.CORRECT, "q2": Q.CORRECT, "q3": Q.NOT_ANSWERED, "q4": Q.CORRECT}
    assert Q.check_answers("01", {"q5": " (B) "}, show=False)["q5"] == Q.CORRECT
    assert Q.check_answers("04", {"q2": [8, 2, 4]}, show=False)["q2"] == Q.CORRECT
    r = Q.check_answers("00", {"q1": "lots", "q4": 6}, show=False)
    assert r["q1"] == "not yet: give a number (got 'lots')"
    assert r["q4"] == "not yet: answer with 2 values in parentheses: (calls, forward passes)"
    assert Q.check_answers("01", {"q5": 2}, show=False)["q5"].startswith("not yet: give a letter")


def test_the_estimate_of_the_lecturers_kit_passes_within_the_tolerance():
    # 03 q3: 12.4% at 256-token blocks, a quarter of the tail at 64 -> about 3.1%; the exact figure is 3.38%
    assert Q.check_answers("03", {"q3": 12.4 / 4}, show=False)["q3"] == Q.CORRECT
    assert Q.check_answers("03", {"q3": 6.6}, show=False)["q3"].startswith(Q.NOT_YET)


def test_notebook_ids_in_every_form():
    for name in ("03", 3, "03_paged_kv_cache", "03_paged_kv_cache.ipynb", "notebooks/03_paged_kv_cache.ipynb"):
        assert Q.questions(name) is Q.questions("03")
    with pytest.raises(ValueError, match="no questions for notebook '99'"):
        Q.questions("99")
    assert Q._short_id("02a_triton_primer.ipynb") == "02a"


def test_expected_values_come_from_minillms_reference_even_under_use_my_code():
    """With a notebook's USE_MY_CODE switch on, the engine's modules hold the reader's functions; the
    checker's expected values must still come from minillm's reference."""
    from minillm.course import exercises
    from minillm.engine import scheduler

    def broken(*args, **kwargs):
        raise AssertionError("the reader's schedule_step ran inside the checker")

    ref = scheduler.schedule_step
    swap = exercises.Swap("exercises", ["3.6"], [], patched=[(scheduler, "schedule_step", ref, broken)])
    scheduler.schedule_step, saved = broken, exercises._NOTEBOOK_SWAP
    exercises._NOTEBOOK_SWAP = swap
    try:
        assert Q.check_answers("03", {"q4": (5, 9)}, show=False)["q4"] == Q.CORRECT
        assert scheduler.schedule_step is broken  # the reader's code is back in place afterwards
    finally:
        exercises._NOTEBOOK_SWAP = saved
        scheduler.schedule_step = ref


def test_register_rejects_repeated_ids():
    q = Q.Question("q1", "x", (Q.Part(lambda: 1),))
    with pytest.raises(ValueError, match="repeat"):
        Q.register("99", [q, q])


# ------------------------------------------------------------------------------------------------ the notebooks
def load(nb: str):
    return nbformat.read(os.path.join(REPO_DIR, "notebooks", ENDINGS[nb] + ".ipynb"), as_version=4)


def outputs_text(notebook) -> str:
    parts = []
    for c in notebook.cells:
        for o in c.get("outputs", []):
            parts.append(o.get("text", "") if o.get("output_type") == "stream" else
                         o.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.parametrize("nb", ENDINGS)
def test_every_notebook_ends_with_its_questions_and_a_check_cell(nb):
    notebook = load(nb)
    md, code = notebook.cells[-2], notebook.cells[-1]
    assert md.cell_type == "markdown" and re.match(r"## \d+\. Check your understanding$", md.source.splitlines()[0]), \
        f"{ENDINGS[nb]} must end with a '## N. Check your understanding' cell, then the check cell"
    asked = re.findall(r"^\*\*Q(\d+)\.\*\*", md.source, re.M)
    qs = Q.questions(nb)
    assert 3 <= len(qs) <= 6
    assert asked == [str(i + 1) for i in range(len(qs))], f"{ENDINGS[nb]} asks Q{asked}; the checker has {len(qs)}"
    assert [q.id for q in qs] == [f"q{i + 1}" for i in range(len(qs))]
    assert code.cell_type == "code" and not code.get("outputs"), "the check cell keeps no outputs"
    tree = ast.parse(code.source)
    answers = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "ANSWERS")
    assert [k.value for k in answers.keys] == [q.id for q in qs]
    assert all(isinstance(v, ast.Constant) and v.value is None for v in answers.values), "ANSWERS start as None"
    call = re.search(r'check_answers\("([^"]+)", ANSWERS\)', code.source)
    assert call and Q.questions(call.group(1)) is qs
    for cell in (md, code):
        assert cell.metadata.get("slideshow", {}).get("slide_type") in SLIDE_TYPES


@pytest.mark.parametrize("nb", ENDINGS)
def test_the_check_cell_runs_as_the_reader_finds_it(nb):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(load(nb).cells[-1].source, "check cell", "exec"), {})
    assert f"0 of {len(Q.questions(nb))} correct" in out.getvalue()


MEASURED_IN_OUTPUTS = {  # constant of the checker -> (notebook, text its outputs print, runs of spaces as one)
    "MEASURED_00_KV_BLOCKS": ("00", "KV cache: {:d} blocks x 256 tokens, max_model_len 4096"),
    "MEASURED_01_COPY_GBPS": ("01", "copy {:,.0f} GB/s"),
    "MEASURED_01_SAFETENSORS_HEADER": ("01", "header {:,d} bytes"),
    "MEASURED_01_DOWN_PROJ_BEGIN": ("01", "model.layers.0.mlp.down_proj.weight BF16 [576, 1536] bytes {:,d} .."),
    "MEASURED_02_COPY_GBPS": ("02", "copy {:,.0f} GB/s, bf16 matmul"),
    "MEASURED_02_RIDGE": ("02", "ridge point {:d} FLOP/byte"),
    "MEASURED_02_LAYER_GRAPH_US": ("02", "decode (1 token): whole layer eager 704 us, CUDA graph {:.0f} us"),
}


@pytest.mark.parametrize("name", MEASURED_IN_OUTPUTS)
def test_quoted_measurements_are_what_the_notebooks_print(name):
    nb, text = MEASURED_IN_OUTPUTS[name]
    want = text.format(getattr(Q, name))
    assert " ".join(want.split()) in " ".join(outputs_text(load(nb)).split()), (
        f"notebook {NOTEBOOKS[nb]} no longer prints {want!r}: it was re-executed. Update {name} in "
        f"minillm/course/questions.py, the question that quotes it, and the worked answer in notebooks/lecturer/")


def test_smollm2_shapes_are_what_the_notebooks_print():
    s = Q.SMOLLM2_135M
    assert (f"llama: {s['num_hidden_layers']} layers, hidden {s['hidden_size']}, {s['num_attention_heads']} heads "
            f"({s['num_key_value_heads']} KV heads), vocab {s['vocab_size']:,}") in outputs_text(load("00"))
    text01 = outputs_text(load("01"))
    for key in ("head_dim", "hidden_size", "intermediate_size", "num_attention_heads"):
        assert f'"{key}": {s[key]}' in text01, key
    assert f"smollm2-135m         {s['num_hidden_layers']} layers x {s['num_key_value_heads']} kv heads x " \
           f"{s['head_dim']}:   22.5 KiB per token" in text01


def test_notebook_03s_printed_figures_follow_from_the_checkers_arithmetic():
    text = outputs_text(load("03"))
    assert f"paged, block 256               21.7{Q._paged_waste(256):>24.1f}%" in text
    assert f"paged, block 16                18.3{Q._paged_waste(16):>24.1f}%" in text
    share = Q.prefix_hit_shares(2048, 64)[0]
    assert f"{share:5.1f}% of prompt tokens from the cache" in text
    assert Q._first_preemption(6) == 5 and "step 5: decode  AB   preempted C" in text
    assert "split-K: while batch x KV heads < 6 x SMs, split into up to 16 chunks of >= 256 keys" in text  # Q6's rule


# ------------------------------------------------------------------------------------------------ the engine
def tiny_engine(**kw):
    from minillm import LLM
    return LLM("qwen3-tiny", device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256, **kw)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_00_q4_step_counts_are_the_engines(one_thread):
    from minillm import SamplingParams
    for asynchronous, expect in ((True, Q.expected("00")["q4"]), (False, (5, 5))):
        with tiny_engine(async_scheduling=asynchronous) as llm:
            engine = llm.engine
            params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
            seqs = [engine.add_request(ids, params) for ids in ([1, 2, 3, 4, 5], [7, 8])]
            calls, decode0 = 0, engine.num_decode_tokens
            while not engine.is_finished():
                engine.step()
                calls += 1
            forwards = 1 + (engine.num_decode_tokens - decode0) // len(seqs)  # one prefill, then decode steps
            assert (calls, forwards) == expect, asynchronous
            assert all(len(s.completion_token_ids) == 5 for s in seqs)


def test_03_q5_prefix_shares_are_the_engines(one_thread):
    """prefix_hit_shares imitates section 3's cell with the BlockManager alone; the engine must agree
    (small sizes: a 90-token system prompt at 16-token blocks is not a whole number of blocks either)."""
    import random

    from minillm import SamplingParams
    system_len, user_len, n = 90, 30, 6
    rng = random.Random(1)
    system = [rng.randrange(10000) for _ in range(system_len)]
    reqs = [system + [rng.randrange(10000, 20000) for _ in range(user_len)] for _ in range(n)]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    with tiny_engine(enable_prefix_caching=True) as llm:
        bm = llm.engine.scheduler.block_manager
        for _ in range(2):
            llm.generate(reqs, one, use_tqdm=False)
        before = bm.num_cached_tokens_total
        llm.generate(reqs, one, use_tqdm=False)
        repeated = 100 * (bm.num_cached_tokens_total - before) / sum(map(len, reqs))
        before = bm.num_cached_tokens_total
        fresh = system + [rng.randrange(20000, 30000) for _ in range(user_len)]
        llm.generate([fresh], one, use_tqdm=False)
        new = 100 * (bm.num_cached_tokens_total - before) / len(fresh)
    assert (repeated, new) == pytest.approx(Q.prefix_hit_shares(system_len, user_len, block_size=16, num_requests=n))
    assert repeated == pytest.approx(100 * 112 / 120) and new == pytest.approx(100 * 80 / 120)
