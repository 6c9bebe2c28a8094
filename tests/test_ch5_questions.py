"""The "Check your understanding" questions that end notebooks/05_engine_performance.ipynb (registered by
minillm/course/engine_questions.py with minillm.course.questions) and chapter 5's lecturer file.

The right answers are recomputed here without the checker's code: transformers' Qwen3 built on the meta
device (what a decode step reads), plain arithmetic from the questions' text, the real engine on CPU for
the async question (its own steps, counted), and per-request closed forms of the bench's decode floor.
"""
from __future__ import annotations

import math
import os
import re

import nbformat
import numpy as np
import pytest
import torch

from helpers import check_exercise_boxes_and_switch, greedy_reference, ref_path, small_engine_args
from minillm.course import kit
from minillm.course import questions as Q
from minillm.course.exercises import REPO_DIR
from minillm.course.slides import SLIDE_TYPES

NOTEBOOK = os.path.join(REPO_DIR, "notebooks", "05_engine_performance.ipynb")
CHAPTER = "05_engine_performance"
H200_COPY = 4251e9  # bytes/s: section 1's measurement, as Q1 quotes it
KIT_PARTS = ["## Learning objectives", "## A 90-minute lecture", "## Check your understanding: the answer key",
             "## Common mistakes the grader diagnoses"]


def decode_read_bytes(shapes: dict) -> int:
    """Bytes a one-token decode step reads: every parameter of transformers' Qwen3ForCausalLM (meta device)
    but the embedding table, the LM head included (untied: its own matrix)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**shapes))
    table = model.model.embed_tokens.weight.numel()
    head = model.lm_head.weight.numel()
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    return (sum(p.numel() for p in model.parameters()) - table + (head if tied else 0)) * 2


def decode_floor_bytes(prompt_lens, output_lens, weights: float, kv: float) -> float:
    """Request r is decoded o_r - 1 times at contexts p_r + 1 .. p_r + o_r - 1; weights once per step."""
    p, o = np.asarray(prompt_lens, dtype=np.float64), np.asarray(output_lens, dtype=np.float64)
    return (o.max() - 1) * weights + kv * ((o - 1) * p + o * (o - 1) / 2).sum()


def right_answers() -> dict:
    from minillm.bench import make_workload
    from minillm.model_zoo import QWEN3_06B, QWEN3_8B
    q1 = H200_COPY / decode_read_bytes(QWEN3_8B)
    sizes = [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100]  # 1, 2, 4, 8, the multiples of 16 to 100, and 100
    graph = min(s for s in sizes if s >= 37)
    q4 = 100 / (1 + math.exp(0.5))  # x / T = [1.5, 1, 0.5, 0]; the nucleus is tokens 0 and 1: e^1 / (e^1.5 + e^1)
    prompts, outputs = make_workload(256, 100, 1024, 1024)
    lens = [len(x) for x in prompts]
    kv = 2 * 28 * 8 * 128 * 2
    w06 = decode_read_bytes(QWEN3_06B)
    ratio = decode_floor_bytes(lens, [2 * o for o in outputs], w06, kv) / decode_floor_bytes(lens, outputs, w06, kv)
    assert 2 < ratio < 4
    # Q6: the gap above the floor, 0.620 - 0.280 ms, over 177 kernels prices one kernel; 55% of the floor is
    # 0.280 / 0.55 ms per token
    q6 = (0.620 - 0.280 / 0.55) / ((0.620 - 0.280) / 177)
    return {"q1": q1, "q2": (graph, graph - 37, len(sizes)), "q3": (4, 3), "q4": q4, "q5": "c", "q6": q6}


@pytest.fixture(scope="module")
def answers():
    return right_answers()


def test_the_checker_expects_the_recomputed_answers(answers):
    got = Q.expected("05")
    assert set(got) == set(answers)
    for qid, want in answers.items():
        if isinstance(want, str):
            assert got[qid] == want, qid
        else:
            assert got[qid] == pytest.approx(want, rel=1e-9), qid


def test_the_checker_accepts_the_right_answers_and_rounded_ones(answers):
    assert Q.check_answers("05", answers, show=False) == {q: Q.CORRECT for q in answers}
    rounded = {"q1": 281, "q2": [48, 11, 11], "q4": "37.8%", "q5": " (C) ", "q6": 58}
    assert Q.check_answers("05", rounded, show=False) == {"q1": Q.CORRECT, "q2": Q.CORRECT, "q3": Q.NOT_ANSWERED,
                                                         "q4": Q.CORRECT, "q5": Q.CORRECT, "q6": Q.CORRECT}


def test_wrong_answers_get_a_hint_that_keeps_the_answer(answers):
    wrong = {"q1": 500.0, "q2": (40, 3, 7), "q3": (9, 9), "q4": 50.0, "q5": "a", "q6": 120}
    for qid, status in Q.check_answers("05", wrong, show=False).items():
        assert status.startswith(Q.NOT_YET + ": ") and len(status) > len(Q.NOT_YET) + 20, (qid, status)
        value = answers[qid]
        for v in (value if isinstance(value, tuple) else (value,)):
            if isinstance(v, (int, float)) and abs(v) >= 10:
                for shown in {f"{v:.0f}", f"{v:.1f}", f"{v:.2f}"}:
                    assert shown not in status, f"{qid}: the hint gives the answer away: {status}"


def test_known_wrong_answers_get_their_own_hint():
    r = Q.check_answers("05", {"q1": 259.5, "q2": (64, 27, 10), "q3": (3, 4), "q4": 26.9, "q5": "b"}, show=False)
    assert "embedding table" in r["q1"]
    assert "multiples of 16" in r["q2"] and "max_num_seqs is always a size" in r["q2"]
    assert "synchronous loop" in r["q3"] and "dropped" in r["q3"]
    assert "temperature first" in r["q4"]
    assert "grows as the outputs get longer" in r["q5"]
    assert "LM head" in Q.check_answers("05", {"q1": 306.0}, show=False)["q1"]
    assert "renormalise" in Q.check_answers("05", {"q4": 27.6}, show=False)["q4"]
    assert "crosses 0.7 is kept" in Q.check_answers("05", {"q4": 0}, show=False)["q4"]
    assert "gap above the floor" in Q.check_answers("05", {"q6": 31.7}, show=False)["q6"]  # 0.620 ms / 177 a kernel
    assert "divided by 0.55" in Q.check_answers("05", {"q6": 145.2}, show=False)["q6"]  # 55% of 0.620 ms as the goal


@pytest.mark.parametrize("asynchronous, want", [(True, (4, 3)), (False, (3, 3))])
def test_q3_is_what_the_engine_does(asynchronous, want):
    """The real engine on CPU: one request alone, its 3rd greedy token made its EOS; forward passes counted
    by the engine (one prefill, then its decode tokens), the output read back."""
    from minillm import LLM, SamplingParams
    prompt = greedy_reference()["prompts"][1]
    tokens = greedy_reference()["tokens"]["tiny-qwen3"][1]
    assert tokens[2] not in tokens[:2]
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(async_scheduling=asynchronous))
    llm.engine.eos_token_ids = {tokens[2]}
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=5), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == tokens[:3] and out.outputs[0].finish_reason == "stop"
    assert (1 + llm.engine.num_decode_tokens, len(out.outputs[0].token_ids)) == want
    assert Q.expected("05")["q3"] == (4, 3)


def test_the_quoted_bandwidth_is_what_the_notebook_prints():
    from minillm.course.engine_questions import MEASURED_05_COPY_GBPS
    nb = nbformat.read(NOTEBOOK, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert f"copy {MEASURED_05_COPY_GBPS:,.0f} GB/s" in text
    assert f"({MEASURED_05_COPY_GBPS:,.0f} GB/s)" in nb.cells[-2].source  # Q1 quotes it


def test_q6_quotes_the_ladder_as_the_notebook_prints_it():
    from minillm.course.engine_questions import MEASURED_05_B1_FLOOR_MS, MEASURED_05_B1_KERNELS, MEASURED_05_B1_MS
    nb = nbformat.read(NOTEBOOK, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    last_rung = (rf"\+ async scheduling +{MEASURED_05_B1_MS:.3f} ms/token +\d+% of the floor "
                 rf"\({MEASURED_05_B1_FLOOR_MS:.3f} ms\) +{MEASURED_05_B1_KERNELS} kernels/token")
    assert re.search(last_rung, text), "section 7's last rung no longer prints the figures Q6 quotes"
    q6 = nb.cells[-2].source.split("**Q6.**")[1]
    for quoted in (f"{MEASURED_05_B1_MS:.3f} ms", f"{MEASURED_05_B1_KERNELS} CUDA kernels", f"{MEASURED_05_B1_FLOOR_MS:.3f} ms"):
        assert quoted in q6, quoted



def test_every_cell_has_a_slide_type_and_the_exercises_have_their_boxes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    check_exercise_boxes_and_switch(nb, 5, ["5.1", "5.2", "5.3", "5.4"], SLIDE_TYPES)
    from minillm.course.exercises import find_exercises
    headings = {line.lstrip("#").strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("#")}
    for e in find_exercises():
        if e.chapter == 5:  # a failing grade points the student at a section that exists
            assert e.section in headings, (e.id, e.section)


# ------------------------------------------------------------------------------------------------ the kit
def kit_text() -> str:
    return open(os.path.join(kit.KIT_DIR, CHAPTER + ".md"), encoding="utf-8").read()


def test_the_kit_file_has_its_four_parts_and_current_generated_sections():
    text = kit_text()
    where = [text.find(p) for p in KIT_PARTS]
    assert -1 not in where and where == sorted(where), f"{CHAPTER}.md needs {KIT_PARTS}, in that order"
    assert kit.render(os.path.join(kit.KIT_DIR, CHAPTER + ".md")) == text, f"run `{kit.COMMAND}`"


def test_the_lecture_plan_fills_90_minutes():
    plan = kit_text().split("## A 90-minute lecture", 1)[1].split("\n## ", 1)[0]
    spans = [(int(a), int(b)) for a, b in re.findall(r"^\| (\d+)–(\d+) \|", plan, re.M)]
    assert spans and spans[0][0] == 0 and spans[-1][1] == 90, spans
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(spans, spans[1:])), f"gaps or overlaps: {spans}"


def test_every_worked_answer_is_one_the_checker_accepts():
    key = kit_text().split("## Check your understanding: the answer key", 1)[1]
    for q in Q.questions("05"):
        m = re.search(rf"^\*\*Q{q.id[1:]} — .+\((?P<answer>[^()]*(\([^()]*\))?[^()]*)\)\.\*\*", key, re.M)
        assert m, f"no worked answer headed '**Q{q.id[1:]} — ... (answer).**'"
        text = m.group("answer").strip()
        if re.fullmatch(r"\([a-z]\)", text):
            answer = text[1]
        elif text.startswith("("):
            answer = tuple(float(x.replace(",", "")) for x in text[1:-1].split(", "))
        else:
            answer = float(re.match(r"[\d,]*\.?\d+", text).group().replace(",", ""))
        assert q.check(answer) == Q.CORRECT, (q.id, text, q.check(answer))
