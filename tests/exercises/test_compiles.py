"""Graded: each Triton exercise's kernel compiles for a GPU (exercises 2.7-2.12, 3.4, 3.5).

The other graded tests run the kernels in Triton's interpreter, which accepts kernels that Triton's GPU
compiler rejects: a variable carried through a loop may change type there (an fp16 `acc` that
`acc += tl.dot(a, b)` makes fp32, `l = 0` that the loop makes a float), where the compiler requires one
type. Such a kernel passes every other test and then fails in the notebook's GPU cells. Here each kernel
is compiled for a CUDA sm_90 target (an H100), on this CPU machine, with the argument types and
constexprs minillm's launcher gives it on a GPU (minillm/course/gpu_compile.py): no GPU is needed. It runs
in a subprocess with TRITON_INTERPRET=0 (this process interprets the kernels), about 2-5 s a kernel.

A kernel the compiler rejects fails with the compiler's own words and the line of your file they point
at; a known wrong version that the compiler rejects the same way is named (tests/exercises/mistakes_ch*.py),
else a known cause (a loop-carried variable that changes type) is said in plain words.

    pytest tests/exercises/test_compiles.py --impl=exercises -m ex2_10
"""
from __future__ import annotations

import os

import pytest

from minillm.course import gpu_compile
from minillm.course.exercises import REPO_DIR, exercise
from minillm.course.grading import check_that
from mistakes import wrong_versions

EXERCISE_OF = {kernel: ex for ex, (kernel, _) in gpu_compile.LAUNCHES.items()}


def _where(path: str) -> str:
    return os.path.relpath(path, REPO_DIR) if path.startswith(REPO_DIR + os.sep) else path


def _outcome(result: dict) -> tuple | None:
    """What a compile's result is compared by: the signature it failed with and the compiler's last line
    (None when it compiled)."""
    return None if result.get("ok") else (result.get("signature"), result.get("error"))


@pytest.mark.parametrize("kernel", [
    pytest.param(kernel, marks=getattr(pytest.mark, "ex" + ex.replace(".", "_")), id=f"{ex}-{kernel}")
    for kernel, ex in EXERCISE_OF.items()])
def test_kernel_compiles_for_a_gpu(impl, kernel):
    ex = exercise(EXERCISE_OF[kernel])
    fn = getattr(impl, kernel)
    if gpu_compile.python_function(fn) is None:  # a chapter file that does not import: its stand-in raises
        fn()
        check_that("it is not a @triton.jit function", ex.id, f"{kernel} cannot be compiled", actual=repr(fn))
    path = _where(gpu_compile.locate(fn)["file"])
    if gpu_compile.is_stub(fn):
        raise NotImplementedError(f"Exercise {ex.id}: implement {kernel} in {path} (see {ex.where()})")
    wrong = wrong_versions(kernel)
    results = gpu_compile.compile_kernels(ex.id, [fn, *wrong.values()])
    mine = results[0]
    if "missing_backend" in mine:
        check_that(mine["missing_backend"], ex.id, f"cannot check that {kernel} compiles for a GPU "
                   f"({gpu_compile.TARGET_NAME}; the check needs no GPU, but Triton's nvidia backend):")
    if mine["ok"]:
        return
    suspects = {hint: _outcome(r) for hint, r in zip(wrong, results[1:])}
    cause = gpu_compile.known_cause(mine["error"])
    if cause is not None:  # after the catalogue's own diagnoses: said when none of them matches
        suspects[cause] = _outcome(mine)
    at = f"\n  at {_where(mine['file'])} line {mine['line']}: {mine['code']}" if "line" in mine else ""
    check_that(f"\n  {mine['kind']}: {mine['error']}{at}", ex.id,
               f"Triton's GPU compiler rejects {kernel} (compiled here for {gpu_compile.TARGET_NAME} with "
               f"{mine['signature']}, as minillm's launcher calls it on a GPU; no GPU is needed). Triton's "
               f"interpreter, which runs the other graded tests, accepts kernels the compiler does not: passing them "
               f"is not enough. The compiler says:", actual=_outcome(mine), suspects=suspects)
