"""`make grade` / `python -m minillm.course.grade`: grade your exercises and print a scoreboard.

    make grade                 # every exercise: passed / failed / not started, and the first failure
    make grade EX=2.3          # one exercise
    python -m minillm.course.grade --json results.json     # + a Gradescope-style report for instructors

It runs the graded tests in tests/exercises against your `exercises/` (or `--impl solutions|ref`).
An exercise whose functions all still raise the stub's NotImplementedError is "not started" and is
not run. Exit status 0 only when every exercise graded passes.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field

import pytest

from minillm.course.exercises import DEFAULT_IMPL, IMPLS, REPO_DIR, exercise, find_exercises, impl_files, unsolved

TESTS_DIR = os.path.join(REPO_DIR, "tests", "exercises")
MESSAGE_LINES = 4  # lines of the first failure shown on the scoreboard (the JSON keeps all of it)
MAX_CRASH_CHARS = 300  # of a crash's exception message, on its one line
# seconds one graded test may run: the slowest takes ~8 s on the course's 2-core machine; past this an
# endless loop in an exercise would hang `make grade`, whose output is captured, with no word
TEST_TIMEOUT_S = float(os.environ.get("MINILLM_TEST_TIMEOUT_S", "120"))  # also a plain pytest's (tests/conftest.py)


@dataclass
class Result:
    """One exercise's grade."""

    id: str
    title: str
    status: str = "not started"  # passed | failed | not started
    passed: int = 0
    total: int = 0
    message: str = ""  # the first failure, or why it was not run
    outputs: list[str] = field(default_factory=list)
    timed_out: bool = False  # a test ran out of time: the exercise's later tests are skipped


class _Collector:
    """A pytest plugin that records each graded test's outcome under its exercise id."""

    def __init__(self, results: dict[str, Result], files: list[str], timeout_s: float):
        self.results, self.files, self.timeout_s = results, files, timeout_s

    def _results_of(self, keywords) -> list[Result]:
        """The exercises a test grades, from its exN_M markers."""
        ids = (k[2:].replace("_", ".") for k in keywords if k.startswith("ex"))
        return [self.results[i] for i in ids if i in self.results]

    def pytest_runtest_setup(self, item):
        if any(r.timed_out for r in self._results_of(item.keywords)):  # one endless loop is enough
            pytest.skip(f"an earlier test of this exercise did not finish within {self.timeout_s:g} s")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """A test that crashed (not a failed check): remember the line of the graded code that raised."""
        report = yield
        if report.failed and call.excinfo is not None and not call.excinfo.errisinstance(
                (AssertionError, NotImplementedError)):
            at = raised_at(call.excinfo.value, self.files)
            if at:
                report.user_properties.append(("raised_at", at))
            if str(call.excinfo.value).startswith("Timeout"):  # pytest-timeout's failure
                report.user_properties.append(("timed_out", self.timeout_s))
                for r in self._results_of(item.keywords):
                    r.timed_out = True
        return report

    def pytest_runtest_logreport(self, report):
        # one outcome per test: its call, or its setup when that failed or skipped
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        for r in self._results_of(report.keywords):
            r.total += 1
            if report.passed:
                r.passed += 1
            elif not r.message:
                r.message = _failure_text(report, exercise(r.id).where())


def raised_at(exc: BaseException, files: list[str]) -> str | None:
    """'exercises/ch2.py:164 in add_kernel: <that line>': the innermost frame in one of `files`
    (relative to the repository) of the exception or of the exceptions it was raised from (Triton's
    interpreter raises its own error from the one the kernel's line raised)."""
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for frame in traceback.extract_tb(exc.__traceback__):
            rel = os.path.relpath(frame.filename, REPO_DIR).replace(os.sep, "/")
            if rel in files:
                found = f"{rel}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
        exc = exc.__cause__ or exc.__context__
    return found


def _failure_text(report, where: str = "") -> str:
    """The assertion message of a failed test (what grading.check_* wrote), without the traceback."""
    if report.skipped:  # a graded test that did not run is not a pass
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return f"{report.nodeid.split('::')[-1]}: skipped ({reason})"
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    for prefix in ("AssertionError: ", "NotImplementedError: "):
        text = text.removeprefix(prefix)
    props = dict(report.user_properties)
    at = props.get("raised_at")
    label = "raised at"
    if "timed_out" in props:
        text, label = f"did not finish within {props['timed_out']:g} s (an endless loop?)", "still running"
    if at:  # a crash, not a failed check: where in the graded code, and where the notebook explains it
        first = text.splitlines()[0] if text else ""
        text = f"{first[:MAX_CRASH_CHARS]}\n  {label} {at}" + (f"\n  -- see {where}" if where else "")
    return f"{report.nodeid.split('::')[-1]}: {text}"


def grade(impl: str = DEFAULT_IMPL, only: str | None = None, verbose: bool = False,
          timeout_s: float = TEST_TIMEOUT_S) -> list[Result]:
    """Run the graded tests of every written exercise (or of `only`). -> one Result per exercise.
    A graded test running past timeout_s fails (where pytest-timeout and SIGALRM exist: not on
    Windows), and the rest of its exercise's tests are skipped."""
    exercises = [e for e in find_exercises() if only is None or e.id == only]
    if not exercises:
        raise ValueError(f"no exercise {only!r}; exercises are {', '.join(e.id for e in find_exercises())}")
    todo, unreadable = {}, {}
    for ch in sorted({e.chapter for e in exercises}):  # a syntax error fails its own chapter, not the rest
        try:
            todo.update(unsolved(impl, {ch}))
        except ValueError as err:
            unreadable[ch] = str(err)
    results = {e.id: Result(e.id, f"{', '.join(e.stubbed)}") for e in exercises}
    to_run = []
    for e in exercises:
        missing = todo.get(e.id, [])
        if e.chapter in unreadable:
            results[e.id].status, results[e.id].message = "failed", unreadable[e.chapter]
        elif len(missing) == len(e.stubbed):
            results[e.id].message = f"{', '.join(missing)} in {impl}/ch{e.chapter}.py still raise NotImplementedError"
        else:
            to_run.append(e)
    if to_run:
        args = [TESTS_DIR, f"--impl={impl}", "-p", "no:cacheprovider", "-q", "--tb=short",
                "-m", " or ".join(e.marker for e in to_run)]
        if importlib.util.find_spec("pytest_timeout") and hasattr(signal, "SIGALRM"):
            args += ["--timeout", f"{timeout_s:g}", "--timeout-method", "signal"]  # 0: no limit
        out = io.StringIO()
        with contextlib.redirect_stdout(sys.stdout if verbose else out):
            code = pytest.main(args, plugins=[_Collector(results, impl_files(impl), timeout_s)])
        if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            sys.stdout.write(out.getvalue())
            raise RuntimeError(f"pytest could not run the graded tests (exit code {int(code)}); its output is above")
    for e in to_run:
        r = results[e.id]
        r.status = "passed" if r.total and r.passed == r.total else "failed"
        if r.status == "failed" and not r.message:
            r.message = "no graded test ran"
    return [results[e.id] for e in exercises]


def scoreboard(results: list[Result], impl: str) -> str:
    """The table a student reads."""
    files = ", ".join(impl_files(impl)) if impl != DEFAULT_IMPL else "exercises/ch*.py (your code)"
    lines = [f"Grading {files}", ""]
    width = max(len(r.title) for r in results)
    lines.append(f"{'exercise':<9} {'functions':<{width}}  {'status':<12} tests")
    for r in results:
        tests = f"{r.passed}/{r.total}" if r.total else "-"
        lines.append(f"{r.id:<9} {r.title:<{width}}  {r.status:<12} {tests}")
    failed = [r for r in results if r.status == "failed"]
    for r in failed:
        msg = r.message.splitlines()
        lines += ["", f"{r.id} {r.title}: first failure", *("    " + m for m in msg[:MESSAGE_LINES])]
        if len(msg) > MESSAGE_LINES:
            marker = "ex" + r.id.replace(".", "_")
            lines.append(f"    ... (make grade EX={r.id} VERBOSE=1, or pytest tests/exercises -m {marker})")
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "not started")}
    lines += ["", f"{counts['passed']} passed, {counts['failed']} failed, {counts['not started']} not started "
                  f"(of {len(results)})"]
    return "\n".join(lines)


def gradescope_json(results: list[Result]) -> dict:
    """Gradescope's autograder results.json shape: one test per exercise, partial credit by tests passed."""
    tests = []
    for r in results:
        ex = exercise(r.id)
        score = round(r.passed / r.total, 3) if r.total else 0.0
        tests.append({"name": f"Exercise {r.id}: {r.title}", "number": r.id, "score": score, "max_score": 1.0,
                      "status": "passed" if r.status == "passed" else "failed",
                      "output": f"{r.status} ({r.passed}/{r.total} tests). {r.message}".strip()
                                + f"\nSee {ex.where()}."})
    return {"score": round(sum(t["score"] for t in tests), 3), "max_score": float(len(tests)), "tests": tests}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minillm.course.grade", description=__doc__.split("\n")[0])
    p.add_argument("--exercise", "-e", default=None, help="grade one exercise, e.g. 2.3")
    p.add_argument("--impl", default=os.environ.get("MINILLM_IMPL", DEFAULT_IMPL), choices=IMPLS)
    p.add_argument("--json", default=None, metavar="PATH", help="also write a Gradescope-style results.json")
    p.add_argument("--verbose", "-v", action="store_true", help="show pytest's own output")
    p.add_argument("--timeout", type=float, default=TEST_TIMEOUT_S, metavar="S",
                   help=f"seconds one graded test may run (default {TEST_TIMEOUT_S:g}; 0: no limit)")
    args = p.parse_args(argv)
    try:
        if args.timeout < 0:
            raise ValueError(f"--timeout must be >= 0 seconds, got {args.timeout:g}")
        results = grade(args.impl, args.exercise, args.verbose, args.timeout)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(scoreboard(results, args.impl))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(gradescope_json(results), f, indent=2)
        print(f"wrote {args.json}")
    sys.exit(0 if all(r.status == "passed" for r in results) else 1)


if __name__ == "__main__":
    main()
