"""The grader names the bug: every known wrong version (tests/exercises/mistakes_ch*.py), fed to the
graded test named in it, must fail with its own diagnosis in the message."""
import importlib
import os
import sys

import pytest

EXERCISE_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exercises")
sys.path.insert(0, EXERCISE_TESTS)

from minillm.course.exercises import load_impl  # noqa: E402
from mistakes import all_mistakes, with_mistake  # noqa: E402

MISTAKES = all_mistakes()


def test_every_exercise_has_named_mistakes():
    """Each exercise names at least two common wrong versions."""
    from minillm.course.exercises import find_exercises
    count = {e.id: 0 for e in find_exercises()}
    for m in MISTAKES.values():
        count[m.exercise] += 1
    thin = {ex: n for ex, n in count.items() if n < 2}
    assert not thin, f"exercises with fewer than two named mistakes: {thin}"


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_grader_names_the_mistake(name, request):
    mistake = MISTAKES[name]
    module_name, test_name = mistake.test.split("::")
    test_fn = getattr(importlib.import_module(module_name.removesuffix(".py")), test_name)
    impl = with_mistake(load_impl("ref"), mistake)
    args = dict(mistake.test_args)
    for arg in test_fn.__code__.co_varnames[:test_fn.__code__.co_argcount]:
        if arg != "impl" and arg not in args:  # pytest's own fixtures the test asks for: monkeypatch, tmp_path, ...
            args[arg] = request.getfixturevalue(arg)
    with pytest.raises(AssertionError) as failure:
        test_fn(impl=impl, **args)
    assert mistake.hint in str(failure.value), (
        f"the grader caught mistake {name!r} but did not name it; its message was:\n{failure.value}")
