"""Test switches.

  --impl=ref|solutions|exercises  (env MINILLM_IMPL) which code the graded tests in tests/exercises
                                  run: minillm itself, solutions/, or the student's exercises/
  --expect-stubs                  CI only: every graded test must fail with its stub's
                                  NotImplementedError (proof that the grader can fail)

Tests marked `gpu` skip (with the reason) where torch sees no CUDA device.
"""
import os

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit is defined

from minillm.course.exercises import IMPLS, find_exercises, load_impl  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--impl", default=os.environ.get("MINILLM_IMPL", "ref"), choices=IMPLS,
                     help="implementation the graded tests run (default: ref, i.e. minillm itself)")
    parser.addoption("--expect-stubs", action="store_true",
                     help="invert graded tests: each must fail with its exercise's NotImplementedError")


def pytest_configure(config):
    for e in find_exercises():
        config.addinivalue_line("markers", f"{e.marker}: exercise {e.id} ({e.where()})")


@pytest.fixture(scope="session")
def impl_name(request) -> str:
    return request.config.getoption("--impl")


@pytest.fixture(scope="session")
def impl(impl_name):
    """Namespace of the exercise functions under test."""
    return load_impl(impl_name)


def _exercise_markers(item) -> list[str]:
    return [m.name for m in item.iter_markers() if m.name.startswith("ex") and m.name[2:3].isdigit()]


def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
        graded = os.sep + "exercises" + os.sep in str(item.fspath)
        if graded and not _exercise_markers(item):
            raise pytest.UsageError(f"graded test {item.nodeid} carries no exercise marker (exN_M)")


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    outcome = yield
    if not pyfuncitem.config.getoption("--expect-stubs"):
        return
    markers = _exercise_markers(pyfuncitem)
    if not markers:
        return
    ids = [m[2:].replace("_", ".") for m in markers]
    exc = outcome.excinfo[1] if outcome.excinfo else None
    if exc is None:
        outcome.force_exception(AssertionError(
            f"graded test passed on the exercise stubs ({', '.join(ids)}): it cannot fail"))
    elif isinstance(exc, NotImplementedError) or "NotImplementedError" in str(exc):
        if any(f"Exercise {i}" in str(exc) for i in ids):
            outcome.force_result(True)  # the stub's own message, as a student will see it
    # anything else (a crash before reaching the stub) stays a failure
