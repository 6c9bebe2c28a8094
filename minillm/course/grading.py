"""Assertions for graded tests: failures say what is wrong, which bug it looks like, and which
notebook section explains it.

A graded test compares the student's output with a reference. When they differ, it can name the
bug: `suspects` maps a diagnosis (what the bug is and how to fix it) to what a function with that
bug returns on the same input (a value, or a zero-argument callable computed only on failure).
If the student's output equals one of them, the failure message leads with that diagnosis; if
none does, it says what the error looks like when it has a simple shape (a sign, a scale, a shift
by one, wrong only in some rows: minillm.course.error_patterns).

    check_close(got, want, "2.3", "apply_rotary(q)",
                suspects={"the rotation's sign is flipped: ...": lambda: buggy_rotary(q, pos, cs)})

The wrong versions themselves live in the tests (tests/exercises/mistakes.py), never in exercises/.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from minillm.course.error_patterns import describe_error, describe_mismatch
from minillm.course.exercises import exercise, unsolved

GRADED = ""  # which implementation is under test ("your code, --impl=exercises"); set by tests/conftest.py
Suspects = dict[str, Any]  # diagnosis -> what the buggy version returns (or a callable producing it)
ARTICLES = ("the", "a", "an", "each", "every", "your")  # a `what` that starts with one is not prefixed "your"


class Raised(str):
    """What a graded call raised, as a value a check compares: 'raised IndexError: <message>' (equal to a
    known bug's outcome that raised the same). It keeps the error, so a check that fails on it is raised
    from it and the grader shows the line of the student's file that raised it."""
    error: BaseException

    def __new__(cls, error: BaseException) -> Raised:
        text = super().__new__(cls, f"raised {type(error).__name__}: {error}")
        text.error = error
        return text

    def __reduce__(self):  # a copy (deepcopy, pickle) is the plain text; the error stays with the original
        return str, (str(self),)


def check_close(actual, expected, exercise_id: str, what: str = "output", atol: float = 1e-5,
                rtol: float = 1e-5, suspects: Suspects | None = None) -> None:
    """Assert two tensors match (shape, dtype, values within atol + rtol * |expected|)."""
    problem = _close_problem(actual, expected, atol, rtol)
    if problem is not None:
        diagnosis = _diagnose(actual, suspects, lambda a, s: _close_problem(a, s, atol, rtol) is None)
        pattern = None if diagnosis else describe_error(actual, expected, atol, rtol)
        _fail(exercise_id, what, problem, diagnosis, pattern, actual)


def check_equal(actual, expected, exercise_id: str, what: str = "output", suspects: Suspects | None = None) -> None:
    """Assert exact equality (token ids, slot numbers, block tables, ...). Two tensors that differ are told by
    their shape first, as check_close does, else by their first differing element."""
    if not equal(actual, expected):
        problem = f"{_unequal(actual, expected)}.\n  got:      {_short(actual)}\n  expected: {_short(expected)}"
        diagnosis = _diagnose(actual, suspects, equal)
        _fail(exercise_id, what, problem, diagnosis, None if diagnosis else describe_mismatch(actual, expected), actual)


def check_unmodified(original, after, exercise_id: str, function: str, arg: str,
                     suspects: Suspects | None = None, instead: str | None = None, where: str = "") -> None:
    """Assert that `function` left its input `arg` as it was: `original` is the input as the caller
    made it, `after` the tensor (or numpy array) the function was given, after the call. A
    function whose contract is to return a new value must not write into its inputs: the caller
    (the engine, the next layer, the grader's reference) still reads them. suspects: diagnosis ->
    what a known wrong version leaves in that input; instead: what to do (default: compute a new
    tensor or array); where: e.g. " on rank 1"."""
    problem = _modified(original, after)
    if problem is not None:
        instead = instead or f"compute a new {'array' if isinstance(original, np.ndarray) else 'tensor'} instead"
        diagnosis = _diagnose(after, suspects, lambda a, s: _modified(a, s) is None)
        _fail(exercise_id, f"{function} modified its input `{arg}`{where} in place; {instead}", problem, diagnosis)


def check_type(actual, expected: type, exercise_id: str, what: str, call: str = "",
               suspects: Suspects | None = None) -> None:
    """Assert isinstance(actual, expected) before its values are compared (a list where a numpy array
    is due would otherwise be reported by its values or dtype). what: e.g. "slot_mapping_for must
    return a numpy array"; call: the call that returned `actual`, for the message; suspects:
    diagnosis -> the type NAME a known wrong version returns."""
    if not isinstance(actual, expected):
        name = type(actual).__name__
        diagnosis = _diagnose(name, suspects, equal)
        _fail(exercise_id, f"{what}, got {name}", f"({call or 'it'} returned {_short(actual)})", diagnosis)


def check_that(problem: str | None, exercise_id: str, what: str, actual=None, suspects: Suspects | None = None,
               same: Callable[[Any, Any], bool] | None = None) -> None:
    """Fail with `what` and `problem` when problem is not None: for a check that words its own failure
    ("dropped tokens must be -inf" and "(got -1e+09 at row 0, token 3)"). The diagnosis compares
    `actual` with each suspect by `same` (check_equal's test by default)."""
    if problem is not None:
        _fail(exercise_id, what, problem, _diagnose(actual, suspects, same or equal), actual=actual)


def require_written(impl: str, exercise_id: str) -> None:
    """For a test that swaps one exercise into the engine: while its functions are still stubs the
    swap would silently run minillm's own code, so fail the way the stub does."""
    todo = unsolved(impl, {exercise(exercise_id).chapter}).get(exercise_id)
    if todo:
        ex = exercise(exercise_id)
        raise NotImplementedError(f"Exercise {ex.id}: implement {', '.join(todo)} in {impl}/ch{ex.chapter}.py "
                                  f"(see {ex.where()})")


def _fail(exercise_id: str, what: str, problem: str, diagnosis: str | None, pattern: str | None = None,
          actual=None) -> None:
    """Raise the failure. actual: the value that failed; a Raised one (the graded code raised) makes the
    failure say so and be raised from that error, whose line the grader then shows (from the first Raised
    in a list or tuple too)."""
    ex = exercise(exercise_id)
    head = f"Exercise {ex.id} ({', '.join(ex.stubbed)}): {what}"
    graded = f" [graded: {GRADED}]" if GRADED else ""
    crashed = isinstance(actual, Raised)
    # a Raised among the values (an outcome per line of a stream) also names the line that raised
    values = actual if isinstance(actual, (list, tuple)) else [actual]
    cause = next((v for v in values if isinstance(v, Raised)), None)
    lines = [f"{head}: your code {actual}" if crashed else f"{head} {problem}"]
    if diagnosis:
        lines.insert(0, f"Exercise {ex.id}: looks like a known bug: {diagnosis}")
    elif pattern and not crashed:  # no known bug matches: what the error looks like (minillm.course.error_patterns)
        subject = what if what.split(" ", 1)[0].lower() in ARTICLES else f"your {what}"
        lines.append(f"  the error's pattern: {subject} {pattern}")
    lines.append(f"  -- see {ex.where()}{graded}")
    raise AssertionError("\n".join(lines)) from (cause.error if cause is not None else None)


def _close_problem(actual, expected, atol: float, rtol: float) -> str | None:
    """None when actual matches expected, else what differs (shape, dtype, or the values)."""
    if not isinstance(actual, torch.Tensor):
        return f"should be a torch.Tensor, got {type(actual).__name__}"
    if actual.shape != expected.shape:
        return f"has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"has dtype {actual.dtype}, expected {expected.dtype}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if nan_a.any() and not nan_e.any():
        return "contains NaN"
    if not torch.equal(nan_a, nan_e):  # expected with NaN (a known bug's output): the NaN must sit in the same places
        return f"has NaN at {int(nan_a.sum())} elements, expected at {int(nan_e.sum())} (not the same ones)"
    err = (a - e).abs()
    bad = err > atol + rtol * e.abs()
    if not bad.any():
        return None
    if a.dim() == 0:  # one number: no elements or indices to count
        got, want = _distinct(a.item(), e.item())
        return f"is {got}, expected {want}: off by {err.item():.3g} (atol {atol:g}, rtol {rtol:g})"
    idx = tuple(int(i) for i in bad.nonzero()[0])
    got, want = _distinct(a[idx].item(), e[idx].item())
    return (f"differs from the reference at {int(bad.sum())} of {bad.numel()} elements; max abs error "
            f"{err.max().item():.3g} (atol {atol:g}, rtol {rtol:g}); first at index {idx}: "
            f"got {got}, expected {want}")


def _distinct(a: float, e: float) -> tuple[str, str]:
    """Two different numbers printed with as few digits as show them apart (6 unless they print alike:
    129.937 and 129.937 are 129.9370117 and 129.937)."""
    for digits in (6, 9, 12, 17):
        got, want = f"{a:.{digits}g}", f"{e:.{digits}g}"
        if got != want:
            break
    return got, want


def _unequal(actual, expected) -> str:
    """check_equal's first words for a mismatch: for two tensors, a shape that differs (the values alone
    would hide it in a long list), else where the first value differs (and a dtype that differs too)."""
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        return "is wrong"
    dtypes = "" if actual.dtype == expected.dtype else f" (dtype {actual.dtype}, expected {expected.dtype})"
    if actual.shape != expected.shape:
        return f"has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}{dtypes}"
    a, e = actual.detach().cpu(), expected.detach().cpu()
    try:
        differs = a != e
    except RuntimeError:  # dtypes torch cannot compare: the values below say the rest
        return f"is wrong{dtypes}"
    if a.dim() == 0 or not differs.any():
        return f"is wrong{dtypes}"
    idx = tuple(int(i) for i in differs.nonzero()[0])
    at = f"[{idx[0]}]" if len(idx) == 1 else str(idx)
    return (f"is wrong{dtypes}: {int(differs.sum())} of {differs.numel()} elements differ, the first at index "
            f"{at}: got {a[idx].item()!r}, expected {e[idx].item()!r}")


def _modified(original, after) -> str | None:
    """None when `after` holds exactly `original` (NaN where it had NaN), else where it changed."""
    if not isinstance(after, (torch.Tensor, np.ndarray)):
        return f"(it is now a {type(after).__name__})"
    a, b = (torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.detach().cpu()
            for x in (original, after))
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"(it was {tuple(a.shape)} {a.dtype}, it is now {tuple(b.shape)} {b.dtype})"
    changed = a != b
    if a.is_floating_point() or a.is_complex():
        changed &= ~(a.isnan() & b.isnan())
    if not changed.any():
        return None
    idx = tuple(int(i) for i in changed.nonzero()[0])
    return (f"({int(changed.sum())} of {changed.numel()} elements changed; first at index {idx}: it was "
            f"{a[idx].item():.6g}, it is now {b[idx].item():.6g})")


def equal(actual, expected) -> bool:
    """check_equal's test: tensors of one shape and equal values (any dtype), else ==."""
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        return (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
                and actual.shape == expected.shape and bool((actual.cpu() == expected.cpu()).all()))
    try:
        return bool(actual == expected)
    except Exception:  # e.g. numpy arrays of different shapes
        return False


def _diagnose(actual, suspects: Suspects | None, same: Callable[[Any, Any], bool]) -> str | None:
    """The first diagnosis whose buggy output equals the student's, if any."""
    for diagnosis, produced in (suspects or {}).items():
        try:
            value = produced() if callable(produced) else produced
            if same(actual, value):
                return diagnosis
        except Exception:  # a suspect that cannot run on this input simply does not match
            continue
    return None


def _short(x) -> str:
    s = repr(x.tolist() if isinstance(x, torch.Tensor) else x)
    return s if len(s) < 300 else s[:300] + " ..."
