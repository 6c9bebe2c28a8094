"""Assertions for graded tests: failures say what is wrong and which notebook section explains it."""
from __future__ import annotations

import torch

from minillm.course.exercises import exercise


def check_close(actual, expected, exercise_id: str, what: str = "output", atol: float = 1e-5,
                rtol: float = 1e-5) -> None:
    """Assert two tensors match (shape, dtype, values within atol + rtol * |expected|)."""
    ex = exercise(exercise_id)
    where = f"Exercise {ex.id} ({', '.join(ex.stubbed)}): {what}"
    hint = f" -- see {ex.where()}"
    if not isinstance(actual, torch.Tensor):
        raise AssertionError(f"{where} should be a torch.Tensor, got {type(actual).__name__}{hint}")
    if actual.shape != expected.shape:
        raise AssertionError(f"{where} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}{hint}")
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{where} has dtype {actual.dtype}, expected {expected.dtype}{hint}")
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if torch.isnan(a).any() and not torch.isnan(e).any():
        raise AssertionError(f"{where} contains NaN{hint}")
    err = (a - e).abs()
    bad = err > atol + rtol * e.abs()
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{where} differs from the reference at {int(bad.sum())} of {bad.numel()} elements; "
            f"max abs error {err.max().item():.3g} (atol {atol:g}, rtol {rtol:g}); first at index {idx}: "
            f"got {a[idx].item():.6g}, expected {e[idx].item():.6g}{hint}")


def check_equal(actual, expected, exercise_id: str, what: str = "output") -> None:
    """Assert exact equality (token ids, slot numbers, block tables, ...)."""
    ex = exercise(exercise_id)
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        same = (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
                and actual.shape == expected.shape and bool((actual.cpu() == expected.cpu()).all()))
    else:
        same = actual == expected
    if not same:
        raise AssertionError(f"Exercise {ex.id} ({', '.join(ex.stubbed)}): {what} is wrong.\n  got:      "
                             f"{_short(actual)}\n  expected: {_short(expected)}\n  -- see {ex.where()}")


def _short(x) -> str:
    s = repr(x.tolist() if isinstance(x, torch.Tensor) else x)
    return s if len(s) < 300 else s[:300] + " ..."
