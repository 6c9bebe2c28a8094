"""`make grade` / `python -m minillm.course.grade`: grade your exercises and print a scoreboard.

    make grade                 # every exercise: passed / failed / not started, and the first failure
    make grade EX=2.3          # one exercise (EX=2: chapter 2; EX=2,3 or EX=2.1,3.4: a list)
    python -m minillm.course.grade --json results.json     # + a Gradescope-style report for instructors

It runs the graded tests in tests/exercises against your `exercises/` (or `--impl solutions|ref`).
An exercise whose functions all still raise the stub's NotImplementedError is "not started" and is
not run. Exit status 0 only when every exercise graded passes.

The tests run in a child process, because a test can kill the process it runs in: native code
reading a bad pointer, or, under Triton's interpreter, a kernel storing outside its tensor into
Python's own memory (tests/conftest.py turns on minillm.course.kernel_bounds, which stops such an
access at its line first). Each test's start and outcome reach the parent as they happen, so a test
that kills the child fails its exercise with the line of your file it was running, and a new child
grades the rest.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass

import pytest

from minillm.course.exercises import DEFAULT_IMPL, IMPLS, REPO_DIR, exercise, find_exercises, impl_files, unsolved
from minillm.course.kernel_bounds import KernelOutOfBounds

TESTS_DIR = os.path.join(REPO_DIR, "tests", "exercises")
MESSAGE_LINES = 4  # lines of the first failure shown on the scoreboard (the JSON keeps all of it)
# hypothesis appends the failing example after a property test's message, over many lines: the scoreboard
# stops before it (the test's own message already describes the case)
EXAMPLE_FOOTERS = ("Failing test case:", "Falsifying example:")
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


class _Recorder:
    """The child's pytest plugin: appends each graded test's start and outcome to a JSON-lines log,
    flushed at once, so the parent knows what ran even when a test kills this process."""

    def __init__(self, log_path: str, ids: list[str], files: list[str], timeout_s: float, finished: set[str],
                 dead: set[str]):
        self.log = open(log_path, "a")
        self.ids, self.files, self.timeout_s = set(ids), files, timeout_s
        self.finished, self.dead = finished, dead  # tests an earlier child ran; exercises one crashed in
        self.timed_out: set[str] = set()  # exercises with a test past the time limit

    def pytest_sessionfinish(self):
        self.log.close()

    def _ids_of(self, keywords) -> list[str]:
        """The exercises a test grades, from its exN_M markers."""
        return [i for i in (k[2:].replace("_", ".") for k in keywords if k.startswith("ex")) if i in self.ids]

    def _write(self, **record) -> None:
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()  # in the kernel's buffers now: it outlives this process

    def pytest_collection_modifyitems(self, config, items):
        """Leave out what an earlier child graded: its finished tests, and every test of an exercise whose
        test killed it."""
        gone = [it for it in items if it.nodeid in self.finished or set(self._ids_of(it.keywords)) & self.dead]
        if gone:
            config.hook.pytest_deselected(items=gone)
            items[:] = [it for it in items if it not in gone]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        self._write(start=item.nodeid, ids=self._ids_of(item.keywords))
        if set(self._ids_of(item.keywords)) & self.timed_out:  # one endless loop is enough
            pytest.skip(f"an earlier test of this exercise did not finish within {self.timeout_s:g} s")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """A test that crashed (not a failed check), or a failed check raised from a crash (a rank's error
        that the thread-rank tests of chapter 4 grade): remember the line of the graded code that raised."""
        report = yield
        if not (report.failed and call.excinfo is not None):
            return report
        if call.excinfo.errisinstance(AssertionError):
            crash = _crash_behind(call.excinfo.value)
            at = raised_at(crash, self.files) if crash is not None else None
            if at:
                report.user_properties.extend([("raised_at", at), ("checked", True)])
        elif call.excinfo.errisinstance(NotImplementedError):  # a function of a partly written exercise
            report.user_properties.append(("stub", True))
        else:
            at = raised_at(call.excinfo.value, self.files)
            if at:
                report.user_properties.append(("raised_at", at))
            out_of_bounds = next((e for e in _chain(call.excinfo.value) if isinstance(e, KernelOutOfBounds)), None)
            if out_of_bounds is not None:  # the interpreter's InterpreterError wraps it: say it in full
                report.user_properties.append(("message", f"{type(out_of_bounds).__name__}: {out_of_bounds}"))
            if str(call.excinfo.value).startswith("Timeout"):  # pytest-timeout's failure
                report.user_properties.append(("timed_out", self.timeout_s))
                self.timed_out.update(self._ids_of(item.keywords))
        limit = machine_limit(call.excinfo.value)  # in the crash itself, or behind a failed check of it
        if limit:
            report.user_properties.append(("machine", limit))
        return report

    def pytest_runtest_logreport(self, report):
        # one outcome per test: its call, or its setup when that failed or skipped
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        ids = self._ids_of(report.keywords)
        self._write(test=report.nodeid, ids=ids, passed=report.passed,
                    messages={} if report.passed else {i: _failure_text(report, exercise(i).where()) for i in ids},
                    timed_out="timed_out" in dict(report.user_properties), stub="stub" in dict(report.user_properties))


def _chain(exc: BaseException | None):
    """exc, then each exception it was raised from, once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _crash_behind(failure: AssertionError) -> BaseException | None:
    """The error a failed check was raised from (`raise ... from error`), if it is a crash: not another
    failed check, not a stub's NotImplementedError."""
    return next((e for e in _chain(failure.__cause__) if not isinstance(e, (AssertionError, NotImplementedError))),
                None)


def _graded_line(path: str, lineno: int, name: str, files: list[str]) -> str | None:
    """'exercises/ch2.py:164 in add_kernel: <that line>' when path is one of `files` (relative to the
    repository), else None."""
    rel = os.path.relpath(path, REPO_DIR).replace(os.sep, "/")
    return f"{rel}:{lineno} in {name}: {linecache.getline(path, lineno).strip()}" if rel in files else None


# triton 3.6's interpreter (the GPU image's) fails a kernel's loop over a runtime bound with this; 3.7 runs it
OLD_INTERPRETER_ERROR = "only 0-dimensional arrays can be converted to Python scalars"
FIXED_IN_TRITON = (3, 7)


def machine_limit(exc: BaseException) -> str | None:
    """A crash that is this machine's software, not the graded code: what to say instead of blaming it."""
    import triton
    version = tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:2])
    if version >= FIXED_IN_TRITON:
        return None
    for e in _chain(exc):
        in_interpreter = any(f.filename.replace(os.sep, "/").endswith("triton/runtime/interpreter.py")
                             for f in traceback.extract_tb(e.__traceback__))
        if in_interpreter and OLD_INTERPRETER_ERROR in str(e):
            return (f"this machine's triton {triton.__version__} interpreter cannot run a loop over a runtime bound "
                    f"(triton 3.7 can): grade with make setup's triton 3.7.1; this error says nothing about your code")
    return None


def raised_at(exc: BaseException, files: list[str]) -> str | None:
    """The innermost frame in one of `files` (see _graded_line) of the exception or of the exceptions it
    was raised from (Triton's interpreter raises its own error from the one the kernel's line raised)."""
    found = None
    for e in _chain(exc):
        for frame in traceback.extract_tb(e.__traceback__):
            found = _graded_line(frame.filename, frame.lineno, frame.name, files) or found
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
    if at and props.get("checked"):  # a failed check of a crash: its words (they name the error), and the line
        head, *rest = text.splitlines() or [""]
        text = "\n".join([head, f"  {label} {at}", *rest])
    elif at:  # a crash, not a failed check: where in the graded code, and where the notebook explains it
        first = props["message"] if "message" in props else (text.splitlines()[0] if text else "")[:MAX_CRASH_CHARS]
        text = f"{first}\n  {label} {at}" + (f"\n  -- see {where}" if where else "")
    if "machine" in props:
        text += f"\n  ({props['machine']})"
    return f"{report.nodeid.split('::')[-1]}: {text}"


def select(only: str | None) -> list:
    """The exercises `only` names: None for all; else comma-separated exercise ids and chapter numbers
    ("2.3", "2,3", "2.1,3.4": a class's assignment). ValueError for a name that is neither."""
    every = find_exercises()
    if only is None:
        return every
    chosen = set()
    for token in (t.strip() for t in str(only).split(",")):
        hits = {e.id for e in every if e.id == token or str(e.chapter) == token}
        if not hits:
            raise ValueError(f"no exercise or chapter {token!r}; exercises are {', '.join(e.id for e in every)} "
                             f"(a chapter number takes all of its exercises)")
        chosen |= hits
    return [e for e in every if e.id in chosen]


def grade(impl: str = DEFAULT_IMPL, only: str | None = None, verbose: bool = False,
          timeout_s: float = TEST_TIMEOUT_S) -> list[Result]:
    """Run the graded tests of every written exercise (or of those `only` selects: see select). -> one
    Result per exercise.
    A graded test running past timeout_s fails (where pytest-timeout and SIGALRM exist: not on
    Windows), and the rest of its exercise's tests are skipped."""
    exercises = select(only)
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
        stub_first = set()  # exercises whose first failure so far is a function not yet written
        for record in run_graded_tests(impl, to_run, verbose, timeout_s):
            for i in record["ids"]:
                r = results[i]
                r.total += 1
                if record["passed"]:
                    r.passed += 1
                elif not r.message or (i in stub_first and not record.get("stub")):
                    # a partly written exercise: a failure of what is written says more than "implement the rest"
                    r.message = record["messages"][i]
                    (stub_first.add if record.get("stub") else stub_first.discard)(i)
    for e in to_run:
        r = results[e.id]
        r.status = "passed" if r.total and r.passed == r.total else "failed"
        if r.status == "failed" and not r.message:
            r.message = "no graded test ran"
    return [results[e.id] for e in exercises]


def run_graded_tests(impl: str, exercises: list, verbose: bool, timeout_s: float) -> list[dict]:
    """The graded tests of `exercises`, run by pytest in a child process -> one record per test that ran:
    {"test": node id, "ids": its exercises, "passed": bool, "messages": {exercise id: first-failure text}}.
    A test that ends the child (a signal, or an exit before its outcome) fails with what it was running,
    the rest of its exercise is not run, and a new child runs the other exercises' remaining tests."""
    with tempfile.TemporaryDirectory(prefix="minillm-grade-") as tmp:
        log, plan_path = os.path.join(tmp, "log.jsonl"), os.path.join(tmp, "plan.json")
        args = [TESTS_DIR, f"--impl={impl}", "-p", "no:cacheprovider", "-q", "--tb=short",
                "-m", " or ".join(e.marker for e in exercises)]
        if importlib.util.find_spec("pytest_timeout") and hasattr(signal, "SIGALRM"):
            args += ["--timeout", f"{timeout_s:g}", "--timeout-method", "signal"]  # 0: no limit
        dead: list[str] = []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO_DIR, os.environ.get("PYTHONPATH")]))}
        while True:
            with open(plan_path, "w") as f:
                json.dump({"args": args, "log": log, "ids": [e.id for e in exercises], "files": impl_files(impl),
                           "timeout_s": timeout_s, "dead": dead}, f)
            child = subprocess.run([sys.executable, "-m", "minillm.course.grade", "--run-plan", plan_path],
                                   cwd=REPO_DIR, env=env, stdout=None if verbose else subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, check=False)
            records = _read_log(log)
            finished = {r["test"] for r in records if "test" in r}
            running = [r for r in records if "start" in r and r["start"] not in finished]
            if child.returncode == pytest.ExitCode.INTERRUPTED:
                raise KeyboardInterrupt
            if not running:  # every test that started has its outcome
                if child.returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
                                        pytest.ExitCode.NO_TESTS_COLLECTED):
                    if verbose:
                        sys.stderr.write(child.stderr)
                    return [r for r in records if "test" in r]
                sys.stdout.write((child.stdout or "") + child.stderr)  # pytest's own failure
                raise RuntimeError(f"pytest could not run the graded tests (exit code {child.returncode}); its "
                                   f"output is above")
            test, ids = running[-1]["start"], running[-1]["ids"]
            why = _death_text(test, child.returncode, child.stderr, impl_files(impl))
            with open(log, "a") as f:  # the test that killed the child fails; its exercise is not run again
                f.write(json.dumps({"test": test, "ids": ids, "passed": False,
                                    "messages": {i: f"{why}\n  -- see {exercise(i).where()}" for i in ids}}) + "\n")
            dead += ids


def _read_log(path: str) -> list[dict]:
    """The child's records; a line cut short by its death is left out."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return records


def _death_text(test: str, returncode: int, stderr: str, files: list[str]) -> str:
    """What a test that ended the grading process was doing (returncode < 0: the signal that killed it),
    from faulthandler's dump of the stack (innermost frame first) in the child's stderr: the line of the
    graded code it was running."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        what = (f"the grading process died ({name}) while this test ran: a crash in native code (a bad pointer "
                f"through ctypes or NumPy; in a Triton kernel, a load or store outside its tensors)")
    else:
        what = (f"the grading process exited (status {returncode}) while this test ran: the code under test "
                f"ended Python itself (os._exit?); return a result instead")
    frames = re.findall(r'File "(.+?)", line (\d+) in (\S+)', stderr)
    at = next(filter(None, (_graded_line(path, int(line), func, files) for path, line, func in frames)), None)
    return f"{test.split('::')[-1]}: {what}" + (f"\n  still running {at}" if at else "")


def _run_plan(plan_path: str) -> int:
    """The child: run pytest as the plan says, recording to its log (see run_graded_tests)."""
    faulthandler.enable()  # on a fatal signal, the stack goes to stderr: the parent reads the student's line there
    exit_now, stderr_fd = os._exit, os.dup(2)  # fd 2 itself is pytest's capture while a test runs

    def exit_with_stack(status: int) -> None:  # os._exit from the code under test: the same stack first
        faulthandler.dump_traceback(file=stderr_fd)
        exit_now(status)
    os._exit = exit_with_stack
    with open(plan_path) as f:
        plan = json.load(f)
    done = [r for r in _read_log(plan["log"]) if "test" in r]
    recorder = _Recorder(plan["log"], plan["ids"], plan["files"], plan["timeout_s"], {r["test"] for r in done},
                         set(plan["dead"]))
    recorder.timed_out.update(i for r in done if r.get("timed_out") for i in r["ids"])
    return int(pytest.main(plan["args"], plugins=[recorder]))


def scoreboard(results: list[Result], impl: str) -> str:
    """The table a student reads."""
    # the checkout's folder, in full: the one graded is the one minillm was imported from, which need not be
    # the current directory's (PYTHONPATH, another clone's venv)
    files = (", ".join(impl_files(impl)) if impl != DEFAULT_IMPL else "exercises/ch*.py (your code)") + \
        f" in {REPO_DIR}"
    lines = [f"Grading {files}", ""]
    width = max(len(r.title) for r in results)
    lines.append(f"{'exercise':<9} {'functions':<{width}}  {'status':<12} tests")
    for r in results:
        tests = f"{r.passed}/{r.total}" if r.total else "-"
        lines.append(f"{r.id:<9} {r.title:<{width}}  {r.status:<12} {tests}")
    failed = [r for r in results if r.status == "failed"]
    for r in failed:
        msg = r.message.splitlines()
        shown = msg[:MESSAGE_LINES]
        shown = shown[:next((i for i, m in enumerate(shown) if m.lstrip().startswith(EXAMPLE_FOOTERS)), len(shown))]
        lines += ["", f"{r.id} {r.title}: first failure", *("    " + m for m in shown)]
        if len(msg) > len(shown):
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
    p.add_argument("--exercise", "-e", default=None,
                   help="grade these: an exercise (2.3), a chapter (2), or a comma-separated list (2,3 or 2.1,3.4)")
    p.add_argument("--impl", default=os.environ.get("MINILLM_IMPL", DEFAULT_IMPL), choices=IMPLS)
    p.add_argument("--json", default=None, metavar="PATH", help="also write a Gradescope-style results.json")
    p.add_argument("--verbose", "-v", action="store_true", help="show pytest's own output")
    p.add_argument("--timeout", type=float, default=TEST_TIMEOUT_S, metavar="S",
                   help=f"seconds one graded test may run (default {TEST_TIMEOUT_S:g}; 0: no limit)")
    p.add_argument("--run-plan", default=None, help=argparse.SUPPRESS)  # the child process of run_graded_tests
    args = p.parse_args(argv)
    if args.run_plan:
        sys.exit(_run_plan(args.run_plan))
    try:
        if args.timeout < 0:
            raise ValueError(f"--timeout must be >= 0 seconds, got {args.timeout:g}")
        results = grade(args.impl, args.exercise, args.verbose, args.timeout)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("grading interrupted", file=sys.stderr)
        sys.exit(130)
    except RuntimeError as e:
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
