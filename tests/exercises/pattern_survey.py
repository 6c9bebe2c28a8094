"""What the grader's error patterns (minillm.course.error_patterns) say about the known wrong versions
when their own diagnoses are switched off: one line per mistake, its pattern or '-'. A maintainer's
check that the patterns stay true of realistic bugs (the README quotes its count).

    python tests/exercises/pattern_survey.py [EXERCISE_PREFIX]      # e.g. 2.1, or 3 for chapter 3
"""
import importlib
import os
import pathlib
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the kernels in Triton's interpreter, as the CPU suite runs them

import pytest  # noqa: E402

from minillm.course import grading  # noqa: E402
from minillm.course.exercises import load_impl  # noqa: E402
from minillm.course.kernel_bounds import checked_bounds  # noqa: E402
from mistakes import all_mistakes, with_mistake  # noqa: E402


def main(prefix: str = "") -> int:
    grading._diagnose = lambda *args, **kwargs: None  # as if no known wrong version matched
    named = total = 0
    scratch = tempfile.TemporaryDirectory(prefix="pattern-survey-")  # every tmp_path below, removed at the end
    for name, m in sorted(all_mistakes().items()):
        if not m.exercise.startswith(prefix):
            continue
        module, test = m.test.split("::")
        fn = getattr(importlib.import_module(module.removesuffix(".py")), test)
        fixtures = {"tmp_path": lambda: pathlib.Path(tempfile.mkdtemp(dir=scratch.name)), "monkeypatch": pytest.MonkeyPatch}
        args = {a: fixtures[a]() for a in fn.__code__.co_varnames[:fn.__code__.co_argcount]
                if a != "impl" and a not in m.test_args}
        total += 1
        try:  # kernels bounds-checked, as the graded tests run them (a wrapped int32 offset must not read wild memory)
            with checked_bounds():
                fn(impl=with_mistake(load_impl("ref"), m), **m.test_args, **args)
            said = "NOT CAUGHT"
        except AssertionError as e:
            found = re.search(r"the error's pattern: (.*)", str(e))
            said, named = (found.group(1), named + 1) if found else ("-", named)
        print(f"{m.exercise:5s} {name:44s} {said}", flush=True)
    scratch.cleanup()
    print(f"{named} of {total} wrong versions get a pattern")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
