"""The "Check your understanding" questions that end notebooks/06_serving.ipynb (registered by
minillm/course/serving_questions.py with minillm.course.questions) and the notebook's shape (chapter 6's
lecturer file is checked with the others' in tests/test_kit.py).

The right answers are recomputed here without the checker's code: the SSE frame written out by hand (the
standard's rule: a `data: ` line per payload line, an empty line to end the event), TTFT and TPOT from
the question's timestamps, numpy's linear-interpolation percentile done by hand on the sorted values,
and plain arithmetic for the static batch, Little's law and the saturation rate.
"""
from __future__ import annotations

import os
import re

import nbformat
import pytest

from helpers import check_exercise_boxes_and_switch
from minillm.course import questions as Q
from minillm.course.exercises import REPO_DIR
from minillm.course.slides import SLIDE_TYPES

NOTEBOOK = os.path.join(REPO_DIR, "notebooks", "06_serving.ipynb")
CHAPTER = "06_serving"
SECTIONS = ["1. A request's life: server-sent events", "2. Streaming text: incremental detokenization",
            "3. The async engine loop: admission, backpressure, abort", "4. Latency under load: TTFT, TPOT, ITL"]


def linear_percentile(values, q: float) -> float:
    """numpy's default (linear) percentile, by hand: rank q/100 x (n - 1) in the sorted values, interpolated."""
    v = sorted(values)
    rank = q / 100 * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (rank - lo) * (v[hi] - v[lo])


def right_answers() -> dict:
    frame = "data: line one\n" + "data: line two\n" + "\n"
    chunks = [120, 150, 175, 205, 230]
    ttfts = [30, 32, 35, 31, 29, 33, 400, 34, 36, 30]
    outputs = [100, 200, 300, 1000]
    slots = len(outputs) * max(outputs)
    return {"q1": (frame.count("\n"), len(frame.encode())),           # (3, 31)
            "q2": (chunks[0], (chunks[-1] - chunks[0]) / (len(chunks) - 1)),   # (120, 27.5)
            "q3": (linear_percentile(ttfts, 50), linear_percentile(ttfts, 90)),   # (32.5, 72.4)
            "q4": (slots - sum(outputs), 100 * sum(outputs) / slots),   # (2400, 40)
            "q5": (12 * 3.5, 12 * 200),                                 # (42, 2400)
            "q6": (18000 / 450, 100 * 30 / (18000 / 450))}              # (40, 75)


@pytest.fixture(scope="module")
def answers():
    return right_answers()


def test_the_recomputed_answers_are_the_worked_ones(answers):
    assert answers == {"q1": (3, 31), "q2": (120, 27.5), "q3": (32.5, pytest.approx(72.4)), "q4": (2400, 40.0),
                       "q5": (42.0, 2400), "q6": (40.0, 75.0)}


def test_the_checker_expects_the_recomputed_answers(answers):
    got = Q.expected("06")
    assert set(got) == set(answers)
    for qid, want in answers.items():
        assert got[qid] == pytest.approx(want, rel=1e-9), qid


def test_the_checker_accepts_the_right_answers_and_rounded_ones(answers):
    assert Q.check_answers("06", answers, show=False) == {q: Q.CORRECT for q in answers}
    rounded = {"q2": ["120", "27.5"], "q3": (32.5, 72), "q4": (2400, "40%"), "q6": (40, 75.0)}
    assert Q.check_answers("06_serving", rounded, show=False) == {
        "q1": Q.NOT_ANSWERED, "q2": Q.CORRECT, "q3": Q.CORRECT, "q4": Q.CORRECT, "q5": Q.NOT_ANSWERED,
        "q6": Q.CORRECT}


def test_wrong_answers_get_a_hint_that_keeps_the_answer(answers):
    wrong = {"q1": (7, 99), "q2": (999, 999), "q3": (999, 999), "q4": (9999, 99), "q5": (999, 99999),
             "q6": (999, 999)}
    for qid, status in Q.check_answers("06", wrong, show=False).items():
        assert status.startswith(Q.NOT_YET + ": ") and len(status) > len(Q.NOT_YET) + 20, (qid, status)
        for v in answers[qid]:
            if abs(v) >= 10:
                for shown in {f"{v:.0f}", f"{v:,.0f}", f"{v:.1f}", f"{v:.2f}"}:
                    assert shown not in status, f"{qid}: the hint gives the answer away: {status}"


def test_known_wrong_answers_get_their_own_hint():
    r = Q.check_answers("06", {"q1": (2, 25), "q2": (120, 46), "q3": (69, 36), "q4": (2400, 60),
                               "q5": (12 / 3.5, 42 * 200), "q6": (450 / 18000, 100 * 40 / 30)}, show=False)
    assert "blank line" in r["q1"] and "its own `data: `" in r["q1"]
    assert "TTFT correct" in r["q2"] and "leaves the first token out" in r["q2"]
    assert "the mean" in r["q3"] and "nearest-rank" in r["q3"]
    assert "idle slots correct" in r["q4"] and "idle share" in r["q4"]
    assert "do not divide" in r["q5"] and "complete per second" in r["q5"]
    assert "tokens per request" in r["q6"] and "offered rate goes on top" in r["q6"]
    r = Q.check_answers("06", {"q1": (3, 30), "q2": (120, 22), "q3": (32.5, 400)}, show=False)
    assert "one more newline" in r["q1"]
    assert "divide by the gaps" in r["q2"]
    assert "not at the largest" in r["q3"]
    assert "milliseconds" in Q.check_answers("06", {"q3": (32.5, 0.0724)}, show=False)["q3"]
    both_in_seconds = Q.check_answers("06", {"q3": (0.0325, 0.0724)}, show=False)["q3"]
    assert both_in_seconds.count("milliseconds") >= 2 and "sort them" not in both_in_seconds, both_in_seconds


def test_the_expected_values_are_minillms_own_functions():
    """Q1-Q3 run the server's and the bench's functions: a frame with a newline, a trace, the percentiles."""
    from minillm.bench_serve import RequestTrace, latency_percentiles, tpots
    from minillm.serving.sse import sse_event
    assert sse_event("line one\nline two") == "data: line one\ndata: line two\n\n"
    t = RequestTrace(start=0.0, chunk_times=[0.12, 0.15, 0.175, 0.205, 0.23], end=0.23, output_tokens=5)
    assert tpots([t])[0] * 1e3 == pytest.approx(27.5)
    assert latency_percentiles([v / 1e3 for v in (30, 32, 35, 31, 29, 33, 400, 34, 36, 30)])["p90"] == \
        pytest.approx(72.4)


# ------------------------------------------------------------------------------------------------ the notebook
def notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_every_cell_has_a_slide_type_and_the_exercises_have_their_boxes():
    nb = notebook()
    check_exercise_boxes_and_switch(nb, 6, ["6.1", "6.2", "6.3", "6.4"], SLIDE_TYPES)


def test_the_sections_the_exercises_name_exist():
    headings = {line.lstrip("#").strip() for c in notebook().cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("#")}
    assert set(SECTIONS) <= headings, set(SECTIONS) - headings
    from minillm.course.exercises import find_exercises
    for e in find_exercises():
        if e.chapter == 6:  # a failing grade points the student at a section that exists
            assert e.notebook == "notebooks/06_serving.ipynb" and e.section in headings, (e.id, e.section)


def test_every_server_the_notebook_starts_is_stopped_in_its_section():
    """A server started with Server(...).start() is stopped (srv.stop()) in the same section, so the next
    section finds the GPU's memory free; the others are `with Server(...)` blocks, stopped when they end."""
    started = {}
    section = None
    for c in notebook().cells:
        if c.cell_type == "markdown" and re.match(r"## \d+\. ", c.source):
            section = c.source.splitlines()[0]
        elif c.cell_type == "code":
            started.setdefault(section, [0, 0])
            started[section][0] += len(re.findall(r"Server\((?:[^()]|\([^()]*\))*\)\.start\(\)", c.source))
            started[section][1] += c.source.count("srv.stop()")
    assert any(n for n, _ in started.values()), "no server started with .start(): the pattern is stale"
    assert {s: n for s, (n, _) in started.items() if n} == {s: m for s, (n, m) in started.items() if n}, started
