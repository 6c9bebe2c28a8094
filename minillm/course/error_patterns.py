"""What a wrong result's error looks like, for the grader to say when no known bug matches.

A graded check that fails first tries the exercise's known wrong versions (tests/exercises/
mistakes_chN.py). A bug outside that list still often leaves a recognisable shape in the output:

    the opposite sign everywhere                        a sign flipped
    the reference times one factor                      a missing or extra scale (1/sqrt(d), mean vs sum)
    a factor per row times a factor per column          a normalization over the wrong dimension
    shifted by one along a dimension                    an index off by one
    the two halves of the last dimension swapped        the halves of a rotation in the wrong order
    right except at some rows / heads / positions       a loop bound, a mask, an offset
    every value off by the same amount (integers)       a start or base added twice or missed
    one number times 1e3, 1e9, 1024 or 2**30 / 1e9      a unit: ms for s, GB for bytes, GiB for GB

Each pattern is a fact about the two results, tested within a tolerance (FIT_RTOL); the cause after
it is a suggestion. When no pattern fits (noise, or a bug with no simple shape) nothing is said.
"""
from __future__ import annotations

import math

import numpy as np
import torch

FIT_RTOL = 1e-2  # a pattern fits when it explains every element to within 1% (bf16 keeps ~3 digits)
MAX_RANGES = 6  # index ranges named in one message
NUMBER_RTOL = 1e-5  # one number's ratio to the reference names a unit within 1e-5: a slip of units leaves an exact
# ratio (float32 keeps ~7 digits), while other bugs land near a unit's factor by chance (0.1% named a floor that is
# max() instead of a sum, 0.9535 of the reference, as MiB for MB: 0.95367)
# a unit's factor between one number and the reference: (factor, its name, the slip it suggests); each also as 1/it
UNIT_FACTORS = [(10.0 ** (3 * k), f"1e{3 * k}", "a decimal prefix: ms for s, GB for bytes, TFLOP/s for FLOP/s")
                for k in range(1, 5)]
UNIT_FACTORS += [(1024.0 ** k, f"2**{10 * k}", "a binary prefix: KiB, MiB or GiB for bytes") for k in range(1, 5)]
UNIT_FACTORS += [(2.0 ** (10 * k) / 10.0 ** (3 * k), f"2**{10 * k} / 1e{3 * k}",
                  "binary units for decimal ones: GiB for GB, MiB for MB") for k in range(1, 5)]


def describe_error(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> str | None:
    """The pattern of a float result's error against the reference (same shape), or None."""
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)) or actual.shape != expected.shape:
        return None
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if a.numel() == 1:
        return describe_number(float(a), float(e))
    if a.numel() < 2 or not (torch.isfinite(a).all() and torch.isfinite(e).all()):
        return None
    slack = 10 * atol + 1e-9 * float(e.abs().max())

    def near(x: torch.Tensor, y: torch.Tensor) -> bool:
        return bool(((x - y).abs() <= FIT_RTOL * y.abs() + slack).all())

    relation = _relation(a, e, near, min_len=3)
    if relation:
        return relation
    bad = (a - e).abs() > atol + rtol * e.abs()
    facts = [f for f in (_confined(bad, e), _scale(a, e, slack)) if f]
    return "; ".join(facts) or None


def describe_number(actual: float, expected: float) -> str | None:
    """The pattern of one number's error: the reference times a unit's factor (UNIT_FACTORS), or None. One number
    has no shape, so any other ratio (2, 0.7, ...) says nothing about the bug."""
    if not (math.isfinite(actual) and math.isfinite(expected)) or actual == 0 or expected == 0:
        return None
    ratio = actual / expected
    for factor, name, slip in UNIT_FACTORS:
        inverse = " / ".join(name.split(" / ")[::-1]) if " / " in name else f"1 / {name}"
        for f, label in ((factor, name), (1 / factor, inverse)):
            if abs(ratio / f - 1) <= NUMBER_RTOL:
                return f"is the reference times {ratio:.4g} (= {label}: {slip}?)"
    return None


def describe_mismatch(actual, expected) -> str | None:
    """The pattern of an exact result's mismatch (integer tensors, arrays or lists of one shape; or two numbers,
    see describe_number), or None."""
    if _is_number(actual) and _is_number(expected):
        return describe_number(float(actual), float(expected))
    a, e = _as_int_tensor(actual), _as_int_tensor(expected)
    if a is None or e is None or a.shape != e.shape or a.numel() < 2:
        return None
    diff = a - e
    if not bool((diff != 0).any()):
        return None  # equal values (a tuple for a list, another dtype): nothing to describe
    if a.numel() >= 3 and bool((diff == diff.flatten()[0]).all()) and int(diff.flatten()[0]) != 0:
        return (f"every value is {int(diff.flatten()[0]):+d} off the reference (an offset such as a start, "
                f"a base or a +1 added where it does not belong, or missed)")
    # integers can match a shifted copy by chance: ask for more of them, and several distinct values
    relation = _relation(a, e, lambda x, y: torch.equal(x, y) and len(torch.unique(y)) >= 3, min_len=6)
    if relation or a.dim() != 1:
        return relation or _confined(diff != 0)
    bad = diff != 0  # a sequence (token ids, slots): where it goes wrong
    first = int(bad.nonzero()[0])
    if first and bool(bad[first:].all()):
        return f"matches the reference up to index {first - 1} and differs at every index from {first} on"
    return _confined(bad) or (f"first differs at index {first}" if first else None)


def _relation(a: torch.Tensor, e: torch.Tensor, near, min_len: int) -> str | None:
    """A whole-tensor relation between result and reference: sign, shift by one (along a dimension of
    at least min_len), halves, transpose."""
    if near(a, -e) and not near(a, e):
        return "has the opposite sign of the reference everywhere (a sign flipped?)"
    for dim, n in enumerate(a.shape):
        if n < min_len or near(e.narrow(dim, 1, n - 1), e.narrow(dim, 0, n - 1)):
            continue  # a reference that repeats along dim would match its own shift
        if near(a.narrow(dim, 1, n - 1), e.narrow(dim, 0, n - 1)):
            return (f"equals the reference shifted by one along dim {dim}: got[i] = expected[i - 1] "
                    f"(an index off by one?)")
        if near(a.narrow(dim, 0, n - 1), e.narrow(dim, 1, n - 1)):
            return (f"equals the reference shifted by one along dim {dim}: got[i] = expected[i + 1] "
                    f"(an index off by one?)")
    d = a.shape[-1]
    if a.dim() >= 1 and d >= 2 and d % 2 == 0:
        swapped = torch.cat([e[..., d // 2:], e[..., :d // 2]], dim=-1)
        if not near(swapped, e) and near(a, swapped):
            return "equals the reference with the two halves of the last dimension swapped"
    if a.dim() >= 2 and a.shape[-1] == a.shape[-2] >= 2:
        t = e.transpose(-1, -2)
        if not near(t, e) and near(a, t):
            return "equals the reference with its last two dimensions transposed"
    return None


def _confined(bad: torch.Tensor, expected: torch.Tensor | None = None) -> str | None:
    """'wrong only at ...' when the wrong elements lie in some indices of one dimension and a fair
    share of that dimension (a quarter, at least two indices) is right. An index where the reference
    holds one value throughout (a guard block of the grader's, padding: nothing a computation fills in)
    and the result matches it is no evidence either way: such indices count as neither."""
    best = None
    for dim, n in enumerate(bad.shape):
        hit_mask = bad.movedim(dim, 0).reshape(n, -1).any(dim=1)
        hit = hit_mask.nonzero().flatten().tolist()
        filler = 0
        if expected is not None and expected.numel() // n >= 2:
            slices = expected.movedim(dim, 0).reshape(n, -1)
            filler = int(((slices == slices[:, :1]).all(dim=1) & ~hit_mask).sum())
        right = n - len(hit) - filler
        if hit and right >= max(2, (n - filler) / 4) and (best is None or len(hit) / n < best[0]):
            best = (len(hit) / n, dim, n, hit, right, filler)
    if best is None:
        return None
    _, dim, n, hit, right, filler = best
    where = f"{'index' if len(hit) == 1 else 'indices'} {_ranges(hit)} of dim {dim} (size {n})"
    besides = f", not counting {filler} where the reference is one value throughout (guards, padding)" if filler else ""
    return f"is wrong only at {where}; the other {right} match{besides} (a loop bound, a mask or an offset?)"


def _scale(a: torch.Tensor, e: torch.Tensor, slack: float) -> str | None:
    """'the reference times ...' when got / expected is one factor, a factor per row, per column, or
    a product of the two (rows: every index but the last dimension's; columns: the last's). Elements
    near zero in either result (within the checker's tolerance) say nothing about a ratio and are
    left out; they must be fewer than half."""
    shape = a.shape
    rows, cols = (1, a.numel()) if a.dim() < 2 else (a.numel() // a.shape[-1], a.shape[-1])
    a, e = a.reshape(rows, cols), e.reshape(rows, cols)
    valid = (a.abs() > slack) & (e.abs() > slack)
    if int(valid.sum()) < max(2, a.numel() // 2):
        return None
    w = valid.double()
    sign = torch.sign(a * e) * w  # +-1 where valid, 0 elsewhere
    log_ratio = (a.abs().clamp_min(1e-300).log() - e.abs().clamp_min(1e-300).log()) * w
    r, c = torch.zeros(rows, 1, dtype=torch.float64), torch.zeros(1, cols, dtype=torch.float64)
    sr, sc = torch.ones(rows, 1, dtype=torch.float64), torch.ones(1, cols, dtype=torch.float64)
    two = rows >= 2 and cols >= 2  # a factor per row and one per column can both be pinned down
    for _ in range(20):  # alternating least squares: log|ratio| ~ r[i] + c[j], sign(ratio) ~ sr[i] * sc[j]
        if two or rows == 1:
            c = ((log_ratio - r) * w).sum(0, keepdim=True) / w.sum(0, keepdim=True).clamp_min(1)
            sc = torch.where((sign * sr).sum(0, keepdim=True) < 0, -1.0, 1.0).double()
        if two or cols == 1:
            r = ((log_ratio - c) * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1)
            sr = torch.where((sign * sc).sum(1, keepdim=True) < 0, -1.0, 1.0).double()
    misfit = float(((log_ratio - r - c).abs() * w).max())
    if misfit > math.log1p(FIT_RTOL) or bool(((sign != sr * sc) & valid).any()):
        return None
    row_f = ((r + c.mean()).exp() * sr).flatten()
    col_f = ((c - c.mean()).exp() * sc).flatten()
    def varies(f: torch.Tensor) -> bool:  # in size, or in sign
        return float(f.abs().max() / f.abs().min()) > 1 + FIT_RTOL or bool((f < 0).any() and (f > 0).any())

    if varies(row_f) and varies(col_f):
        if rows * cols < 2 * (rows + cols):
            return None  # too few elements for two sets of factors to say anything
        return ("is the reference times a factor per row times a factor per column of the last dimension "
                "(a normalization whose statistic is taken over the wrong dimension?)")
    if varies(row_f):
        return None if cols < 3 else (
            f"is the reference times a factor that differs from row to row ({_span(row_f)}) and is the same "
            f"along each row (a per-row statistic, such as a norm or a softmax's sum, that is off?)")
    if varies(col_f):
        return None if rows < 3 else (
            f"is the reference times a factor per index of the last dimension ({_span(col_f)}), the same in "
            f"every row (a per-channel weight missing, applied twice or misaligned?)")
    factor = float(row_f.mean() * col_f.mean())
    if abs(factor - 1) <= FIT_RTOL:
        return None
    return f"is the reference times {factor:.4g}{_name_factor(factor, shape)} everywhere (a scale missing or extra?)"


def _span(f: torch.Tensor) -> str:
    return f"{float(f.min()):.4g} to {float(f.max()):.4g}"


def _name_factor(f: float, shape: torch.Size) -> str:
    """' (= 1/sqrt(64), ...)' when f is a simple function of one of the result's sizes."""
    for n in sorted(set(shape) | {2}):
        for label, v in ((f"1/{n}", 1 / n), (f"sqrt({n})", math.sqrt(n)), (f"1/sqrt({n})", n ** -0.5)):
            if n > 1 and abs(f / v - 1) <= FIT_RTOL:
                return f" (= {label})"
    return ""


def _ranges(idx: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (at most MAX_RANGES ranges)."""
    spans, start = [], idx[0]
    for prev, cur in zip(idx, idx[1:] + [None]):
        if cur != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(spans[:MAX_RANGES]) + (", ..." if len(spans) > MAX_RANGES else "")


def _as_int_tensor(x) -> torch.Tensor | None:
    """An integer tensor of x (a tensor, a numpy array, or a nested list of ints), else None."""
    try:
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    except Exception:  # not numbers of one shape (strings, dicts, ragged lists)
        return None
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        return None
    return t.cpu().to(torch.int64)


def _is_number(x) -> bool:
    """A real number (a Python, numpy or 0-d torch one), not a bool."""
    if isinstance(x, torch.Tensor):
        return x.dim() == 0 and x.dtype != torch.bool and not x.dtype.is_complex
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
