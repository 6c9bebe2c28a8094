"""Test switches.

  --impl=exercises|solutions|ref  (env MINILLM_IMPL) which code the graded tests in tests/exercises
                                  run: the student's exercises/ (the default: a plain
                                  `pytest tests/exercises` grades your code), solutions/, or minillm
                                  itself. CI and the Makefile name `ref`/`solutions` explicitly.
  --expect-stubs                  CI only: every graded test must fail with its stub's
                                  NotImplementedError (proof that the grader can fail)

Triton kernels are compiled or interpreted once per process (triton reads TRITON_INTERPRET when it
loads), so a run is one of two kinds:
  the CPU suite (any run not selecting `-m gpu`): what CI runs, the same on every machine: the GPU hidden
      (CUDA_VISIBLE_DEVICES=, for the servers and CLIs tests start too), kernels in Triton's interpreter;
      tests marked `gpu` skip, with the reason
  the GPU tests (`pytest tests -m gpu` on a CUDA machine): kernels compiled for the GPU
An explicit TRITON_INTERPRET in the environment leaves both as they are.
"""
import os
import sys

import pytest
import torch


def _selects_gpu_tests(markexpr: str) -> bool:
    return "gpu" in markexpr and "not gpu" not in markexpr


def _choose_kernel_mode(config) -> None:
    """Before collection imports any test module (and with it triton and CUDA): unless this is the GPU run,
    hide the GPU and interpret the kernels. On a CUDA machine a plain `pytest tests/exercises` then grades a
    student's kernels as CI does, instead of failing in Triton ('Pointer argument cannot be accessed') on
    CPU tensors, and an engine a test starts with device='auto' runs on the CPU, as it does in CI."""
    if "TRITON_INTERPRET" in os.environ or _selects_gpu_tests(config.getoption("markexpr") or ""):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    if not torch.cuda.is_initialized():  # CUDA reads the variable when it starts
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _share_the_cores_between_workers() -> None:
    """pytest-xdist workers (make test runs two) split the cores: torch's default, one thread per core
    in each worker, oversubscribes them, and OpenMP's waiting threads then slow every matmul ~5x (two
    SmolLM2 generations side by side on two cores: 22 s each, 4.2 s each with one thread apiece). The
    environment variable carries the share to the servers and CLIs that tests start."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS: no affinity
        threads = max(1, cores // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_the_cores_between_workers()

from minillm.course import grading  # noqa: E402
from minillm.course.exercises import DEFAULT_IMPL, IMPLS, find_exercises, impl_files, load_impl  # noqa: E402

IMPL_WHO = {"exercises": "your code", "solutions": "the reference solutions", "ref": "minillm itself"}


def pytest_addoption(parser):
    parser.addoption("--impl", default=os.environ.get("MINILLM_IMPL", DEFAULT_IMPL), choices=IMPLS,
                     help=f"implementation the graded tests run (default: {DEFAULT_IMPL}, your own code)")
    parser.addoption("--expect-stubs", action="store_true",
                     help="invert graded tests: each must fail with its exercise's NotImplementedError")


def pytest_configure(config):
    _choose_kernel_mode(config)
    for e in find_exercises():
        config.addinivalue_line("markers", f"{e.marker}: exercise {e.id} ({e.where()})")
    impl = config.getoption("--impl")
    grading.GRADED = f"{IMPL_WHO[impl]}, --impl={impl}"


def _graded_banner(config) -> str | None:
    """One line naming the implementation under test, when the run collects graded tests."""
    impl = config.getoption("--impl")
    files = impl_files(impl)
    shown = ", ".join(files) if len(files) <= 4 else f"{files[0]} ... ({len(files)} files)"
    return f"minillm grading: --impl={impl} ({IMPL_WHO[impl]}): {shown}"


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    # printed even under -q (the report header is not): a student must see whose code was graded
    if any(os.sep + "exercises" + os.sep in str(item.fspath) for item in session.items):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(_graded_banner(session.config), bold=True)


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
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" and "gpu" not in (config.getoption("markexpr") or ""):
        no_gpu = pytest.mark.skip(reason="a GPU test: the CPU suite runs without the GPU, as CI does; "
                                         "`pytest tests -m gpu` on a GPU machine runs it")
    elif not torch.cuda.is_available():
        no_gpu = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine)")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        no_gpu = pytest.mark.skip(reason="TRITON_INTERPRET=1 interprets the Triton kernels on the CPU: "
                                         "`pytest tests -m gpu` runs the GPU tests, with compiled kernels")
    else:
        no_gpu = None
    # an endless loop in a student's exercise fails its test at the grader's time limit instead of hanging
    # the run (make grade passes its own --timeout, which this leaves alone)
    limit = None
    if config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is None:
        from minillm.course.grade import TEST_TIMEOUT_S
        limit = pytest.mark.timeout(TEST_TIMEOUT_S)
    for item in items:
        if "gpu" in item.keywords and no_gpu is not None:
            item.add_marker(no_gpu)
        graded = os.sep + "exercises" + os.sep in str(item.fspath)
        if graded and not _exercise_markers(item):
            raise pytest.UsageError(f"graded test {item.nodeid} carries no exercise marker (exN_M)")
        if graded and limit is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(limit)


@pytest.fixture(autouse=True)
def _kernel_bounds_checked():
    """Under Triton's interpreter, every test: a kernel's load or store outside its tensors raises at its line
    (minillm.course.kernel_bounds) instead of writing into this process's memory, which crashed it later,
    elsewhere. It holds the students' kernels in the graded tests and minillm's own everywhere else."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from minillm.course.kernel_bounds import checked_bounds
    with checked_bounds():
        yield


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


def pytest_runtest_logreport(report):
    # A GPU session's call can be cut off before pytest prints its summary: with MINILLM_EARLY_FAILURES=1
    # (tests/gpu/env.sh sets it) each failure's traceback is written when it happens.
    if report.failed and os.environ.get("MINILLM_EARLY_FAILURES"):
        sys.stderr.write(f"\n==== {report.nodeid} FAILED ({report.when}) ====\n{report.longreprtext}\n")
        sys.stderr.flush()
