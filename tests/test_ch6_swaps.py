"""Chapter 6's exercises really run in the engine: a wrong version put in through the course's own swap
(minillm.course.exercises.use_impl, as `make grade` and USE_MY_CODE do) changes what the server, the
async engine or `bench serve` does, and the exercise's in-engine graded test fails on it.

swap_in takes its functions from load_impl; here load_impl("ref") answers with minillm's functions
and one wrong version (a known mistake from tests/exercises/mistakes_ch6.py, or a plainly broken
function), so each in-engine test runs exactly as for a student whose code has that bug.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "exercises"))

import test_ch6 as graded  # noqa: E402
from helpers import one_torch_thread  # noqa: E402, F401 (an autouse fixture)
from minillm.course import exercises  # noqa: E402
from mistakes import all_mistakes, with_mistake  # noqa: E402
from serving_helpers import server_handle  # noqa: E402


def sse_data_never_dispatches(line, lines):
    return None  # reads nothing: every stream ends without an event


WRONG = {  # case -> (the in-engine graded test, the wrong functions swapped in)
    "6.1 an event without its empty line": (graded.test_sse_in_the_server, "ch6_sse_event_no_blank_line"),
    "6.1 a parser that never dispatches": (graded.test_sse_in_the_server, {"sse_data": sse_data_never_dispatches}),
    "6.2 no hold-back of a split character": (graded.test_detokenizer_in_the_engine, "ch6_detok_no_hold_back"),
    "6.2 characters lost while holding back": (graded.test_detokenizer_in_the_engine, "ch6_detok_reads_while_holding"),
    "6.3 a leaked waiting slot": (graded.test_admission_in_the_engine, "ch6_finish_keeps_the_waiting_slot"),
    "6.3 one request too many": (graded.test_admission_in_the_engine, "ch6_admit_one_too_many"),
    "6.4 seconds for milliseconds": (graded.test_bench_serve_figures_in_the_engine, "ch6_percentiles_in_seconds"),
    "6.4 TPOT over every token": (graded.test_bench_serve_figures_in_the_engine, "ch6_tpot_over_all_tokens"),
}




@pytest.fixture(scope="module")
def server():
    with server_handle(graded.MODEL) as handle:
        yield handle


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_wrong_version_swapped_in_fails_the_in_engine_test(case, server, monkeypatch, request):
    test_fn, wrong = WRONG[case]
    right_load = exercises.load_impl
    replaces = all_mistakes()[wrong].replaces if isinstance(wrong, str) else wrong
    mistake = type("Wrong", (), {"replaces": replaces})
    monkeypatch.setattr(exercises, "load_impl",
                        lambda impl, chapters=None: with_mistake(right_load(impl, chapters), mistake))
    args = {"impl_name": "ref"}
    for name in test_fn.__code__.co_varnames[:test_fn.__code__.co_argcount]:
        if name == "server":
            args[name] = server
        elif name != "impl_name":
            args[name] = request.getfixturevalue(name)
    with pytest.raises(AssertionError, match="Exercise 6"):
        test_fn(**args)

