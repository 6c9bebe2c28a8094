"""The "Check your understanding" questions that end notebooks/02a_triton_primer.ipynb (registered by
minillm/course/triton_primer.py with minillm.course.questions): the checker's expected values against
answers recomputed here by plain arithmetic from the questions' text, and the notebook's last two cells
in the form every notebook uses."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import nbformat
import pytest

from minillm.course import questions as Q
from minillm.course.exercises import REPO_DIR

NOTEBOOK = os.path.join(REPO_DIR, "notebooks", "02a_triton_primer.ipynb")
TB_PER_S = 4.2e12

# recomputed from the questions as the notebook asks them
RIGHT = {
    "q1": (977, 448),  # ceil(1e6 / 1024) programs; 977 * 1024 - 1e6 lanes masked
    "q2": (2 ** 18, 100 * (2 ** 18 - 151_936) / 2 ** 18),  # the next power of two over Qwen3's vocabulary
    "q3": (9, 188, 9 * 256 * 1024 + 188 * 1024 + 5),  # table[700 // 256] = table[2] = 9; 700 % 256 = 188
    "q4": (32 * 32, 4096 // 64, 4096 // 128),
    "q5": (math.exp(-3.0), 3.0 * math.exp(-3.0) + math.exp(0.0) + math.exp(-4.0)),
    "q6": ((4 * 16384 * 1024 + 1024) * 2, (5 * 16384 * 1024 + 1024) * 2, 16384 * 1024 * 2 / TB_PER_S * 1e6),
}
WRONG = {  # plainly wrong answers of the right form, none of them a known trap
    "q1": (970, 400), "q2": (100_000, 10.0), "q3": (5, 5, 5), "q4": (7, 7, 7), "q5": (0.5, 9.0), "q6": (1e6, 2e6, 1.0),
}


def test_the_checker_expects_the_recomputed_answers():
    got = Q.expected("02a")
    assert set(got) == set(RIGHT)
    for qid, want in RIGHT.items():
        assert got[qid] == pytest.approx(want, rel=1e-9), qid


def test_the_checker_accepts_the_right_answers_and_rounded_ones():
    assert Q.check_answers("02a", RIGHT, show=False) == {q: Q.CORRECT for q in RIGHT}
    rounded = {"q2": (262144, 42.0), "q5": (0.05, 1.17), "q6": (134.2e6, 167.8e6, 8.0)}
    assert Q.check_answers("02a", rounded, show=False) == {**{q: Q.NOT_ANSWERED for q in RIGHT},
                                                          **{q: Q.CORRECT for q in rounded}}


def test_wrong_answers_get_a_hint_that_keeps_the_answer():
    results = Q.check_answers("02a", WRONG, show=False)
    for qid, status in results.items():
        assert status.startswith(Q.NOT_YET + ": ") and len(status) > len(Q.NOT_YET) + 20, (qid, status)
        for value in RIGHT[qid]:
            if abs(value) >= 100:
                for shown in {f"{value:.0f}", f"{value:,.0f}", f"{value:.1f}"}:
                    assert shown not in status, f"{qid}: the hint gives the answer away: {status}"


def test_known_wrong_answers_get_their_own_hint():
    r = Q.check_answers("02a", {"q1": (976, 576), "q3": (2, 188, 2 * 256 * 1024 + 188 * 1024 + 5),
                                "q5": (math.exp(3.0), 3.0 + 1.0 + math.exp(-4.0))}, show=False)
    assert "rounds up" in r["q1"] and "do work" in r["q1"]
    assert "logical page" in r["q3"] and "row correct" in r["q3"]
    assert "turn it over" in r["q5"] and "rescaled" in r["q5"]



def test_the_check_cell_runs_alone_in_a_fresh_python():
    """The questions are registered by importing minillm.course.questions (which imports the primer):
    a reader who restarts the kernel and runs only the last cell gets the checker."""
    cell = nbformat.read(NOTEBOOK, as_version=4).cells[-1].source
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", cell], capture_output=True, text=True, env=env, cwd=REPO_DIR,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"0 of {len(RIGHT)} correct" in out.stdout
