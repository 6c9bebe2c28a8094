"""Known wrong versions of the exercises, so the grader can name a bug instead of a symptom.

Each chapter lists its mistakes in mistakes_chN.py. A mistake is a function written the way
students get it wrong (rotation sign flipped, data offset forgotten, ...) and the diagnosis the
grader prints when a student's output equals that function's output on the graded input.

Graders use `suspects(function, *args)`: diagnosis -> the lazily computed output of every known
wrong version of `function` on the same arguments, for grading.check_close / check_equal.
tests/test_diagnosis.py feeds every mistake to the graded test named in it and requires the
failure message to carry the mistake's own diagnosis.

These wrong versions live here, in the tests, never in exercises/.
"""
from __future__ import annotations

import functools
import glob
import importlib
import inspect
import os
import types
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from minillm.course.exercises import load_impl
from minillm.course.grading import check_unmodified, equal


@dataclass(frozen=True)
class Mistake:
    name: str  # short id, e.g. "rope_sign_flipped"
    exercise: str  # "2.3"
    replaces: dict[str, Callable]  # exercise function name -> the wrong version
    hint: str  # the diagnosis: what the bug is and how to fix it (appears verbatim in the failure)
    test: str  # the graded test that must catch it: "test_ch2.py::test_apply_rotary_matches_transformers"
    test_args: dict = field(default_factory=dict)  # arguments for that test besides `impl` (parametrized ones)


def all_mistakes() -> dict[str, Mistake]:
    """Every chapter's mistakes (every mistakes_ch*.py beside this file) by name."""
    here = os.path.dirname(os.path.abspath(__file__))
    found: dict[str, Mistake] = {}
    for path in sorted(glob.glob(os.path.join(here, "mistakes_ch*.py"))):
        mod = importlib.import_module(os.path.basename(path)[:-3])
        for m in mod.MISTAKES:
            if m.name in found:
                raise ValueError(f"mistake name {m.name!r} is used twice")
            found[m.name] = m
    return found


def suspects(function: str, *args, **kwargs) -> dict[str, Callable]:
    """diagnosis -> a zero-argument callable giving each known wrong version's output of `function`
    on these arguments (computed only if the student's output is wrong). Each runs on copies of the
    tensor and array arguments, so one that writes into its inputs cannot change what the next sees."""
    return {m.hint: (lambda fn=m.replaces[function]: on_copies(fn)(*args, **kwargs))
            for m in all_mistakes().values() if function in m.replaces}


def copied(x):
    """A copy of a tensor or numpy array (any other argument as it is)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    return x.copy() if isinstance(x, np.ndarray) else x


def on_copies(fn: Callable) -> Callable:
    """fn, called on copies of its tensor and array arguments (the caller's stay as they were)."""
    return lambda *args, **kwargs: fn(*map(copied, args), **{k: copied(v) for k, v in kwargs.items()})


def call_pure(fn: Callable, function: str, exercise_id: str, *args, **kwargs):
    """fn(*args, **kwargs) -> its result, for an exercise function `function` that must leave its
    inputs alone (rms_norm, causal_attention, slot_mapping_for, ...). fn gets copies of the tensor and
    array arguments, so whatever it does to them, the reference and the known wrong versions computed
    after it see the inputs as the test made them; then an input it changed fails the test, naming
    the argument (and the known wrong version that changes it the same way, if one does)."""
    names = list(inspect.signature(getattr(load_impl("ref"), function)).parameters)
    given = {**dict(zip(names, args)), **kwargs}
    copies = {name: copied(value) for name, value in given.items()}
    result = fn(*(copies[name] for name in names[:len(args)]), **{k: copies[k] for k in kwargs})
    wrong = wrong_versions(function)

    def left_in(wrong_fn, name):
        """What wrong_fn leaves in input `name` when it runs on fresh copies of the inputs."""
        fresh = {k: copied(v) for k, v in given.items()}
        wrong_fn(*(fresh[k] for k in names[:len(args)]), **{k: fresh[k] for k in kwargs})
        return fresh[name]

    for name, value in given.items():
        if isinstance(value, (torch.Tensor, np.ndarray)):
            check_unmodified(value, copies[name], exercise_id, function, name,
                             suspects={hint: (lambda w=w, name=name: left_in(w, name)) for hint, w in wrong.items()})
    return result


def suspects_of(function: str, run: Callable, agree: tuple[Callable, Callable] | None = None,
                probe_if: Callable | None = None) -> dict[str, Callable]:
    """diagnosis -> run(wrong version) for every known wrong version of `function` (computed only if
    the student's result is wrong): for results that are not simply function(*args). A wrong version
    whose result equals minillm's own here is left out: its bug does not show on this input (a decode-only
    bug in a prefill count), so the difference lies elsewhere, and naming it would mislead.

    agree: (probe, student): a second look, for a result that two different bugs can share (the events a
    decoder reads, the first step where a scenario goes wrong): a wrong version is named only where
    probe(it) also equals student(), the same probe of the code under test (the raw output behind the
    derived one, the whole scenario). A student whose bug merely ends in the same symptom as a known one
    is then not sent to fix a bug they do not have. probe_if(value): probe only a wrong version whose
    result passes it (the one the code under test's result matches), where a probe is slow (kernels run
    by the interpreter)."""
    reference = functools.cache(lambda: run(getattr(load_impl("ref"), function)))
    probe, student = agree if agree is not None else (None, None)
    students = functools.cache(student) if student is not None else None

    def distinct(fn: Callable):
        value = run(fn)
        if _same(value, reference()):
            raise LookupError(f"this wrong version of {function} gives minillm's own result here")
        if probe is not None and (probe_if is None or probe_if(value)) and not _same(probe(fn), students()):
            raise LookupError(f"this wrong version of {function} differs from the code under test elsewhere")
        return value  # (grading._diagnose skips a suspect that raises)
    return {m.hint: (lambda fn=m.replaces[function]: distinct(fn))
            for m in all_mistakes().values() if function in m.replaces}


def _same(a, b) -> bool:
    """check_equal's test, and for tensors one dtype too (a wrong dtype is a bug of its own)."""
    return equal(a, b) and (not isinstance(a, torch.Tensor) or a.dtype == b.dtype)


def then(suspected: dict[str, Callable], part: Callable) -> dict[str, Callable]:
    """The same suspects, each output passed through part() (the piece of it a check compares)."""
    return {hint: (lambda run=run: part(run())) for hint, run in suspected.items()}


def wrong_versions(function: str) -> dict[str, Callable]:
    """diagnosis -> each known wrong version of `function` itself, for checks that call it their own way
    (a kernel launch, the inputs after a call)."""
    return {m.hint: m.replaces[function] for m in all_mistakes().values() if function in m.replaces}


def with_mistake(impl: types.SimpleNamespace, mistake: Mistake) -> types.SimpleNamespace:
    """A copy of an implementation namespace with the mistake's wrong functions in it."""
    return types.SimpleNamespace(**{**vars(impl), **mistake.replaces})
