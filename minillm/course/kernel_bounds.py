"""Out-of-bounds loads and stores of an interpreted Triton kernel, caught before they happen.

On a GPU a store outside its tensor corrupts memory or faults. In Triton's interpreter
(TRITON_INTERPRET=1, how the exercises are graded on a CPU) it writes into the Python process's own
heap, which then crashes somewhere else, later, with no word about the kernel (seen: a decode kernel
whose output store lacked its head mask killed the grader in `check_close`, two calls after it ran).
Inside `checked_bounds()`, every tl.load and tl.store of an interpreted kernel first checks that each
address its mask lets through lies inside a tensor the kernel was launched with, and raises
KernelOutOfBounds (an IndexError) naming the access, so the grader can point at the kernel's line.

The check hooks three methods of triton.runtime.interpreter (its launch's copy of the arguments, and
the builder's masked load and store); where a Triton version lacks them it checks nothing.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class _Span:
    """The bytes [start, end) of one tensor argument's storage."""

    name: str
    start: int
    end: int


class KernelOutOfBounds(IndexError):
    """A load or store of an interpreted kernel outside every tensor it was given."""


_launch = threading.local()  # .spans: those of the kernel launch running in this thread


def _spans(names: list[str], values: list) -> list[_Span]:
    spans = []
    for name, value in zip(names, values):
        items = value if isinstance(value, (tuple, list)) else [value]
        for item in items:
            item = getattr(item, "base", item)  # a TensorWrapper's or TensorDescriptor's tensor
            if isinstance(item, torch.Tensor):
                storage = item.untyped_storage()
                spans.append(_Span(name, storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return spans


def _where(address: int, size: int, spans: list[_Span]) -> str:
    """An address outside every span, said relative to the nearest one, in elements of `size` bytes."""
    def gap(s: _Span) -> int:
        return s.start - address if address < s.start else address + size - s.end
    s = min(spans, key=gap)
    if address < s.start:
        return f"{(s.start - address + size - 1) // size} element(s) before the start of {s.name}'s storage"
    return f"{(address + size - s.end + size - 1) // size} element(s) past the end of {s.name}'s storage"


def _check(ptrs, mask, op: str, element_size: int) -> None:
    spans = getattr(_launch, "spans", None)
    if not spans:
        return
    addresses = np.asarray(ptrs.data).astype(np.uint64).ravel()
    if mask is not None:
        addresses = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()]
    if addresses.size == 0:
        return
    inside = np.zeros(addresses.shape, dtype=bool)
    for s in spans:
        inside |= (addresses >= s.start) & (addresses + element_size <= s.end)
    if inside.all():
        return
    outside = addresses[~inside]
    raise KernelOutOfBounds(
        f"tl.{op} outside every tensor the kernel was given: {outside.size} of the {addresses.size} addresses "
        f"its mask lets through, the first {_where(int(outside[0]), element_size, spans)}. Give the {op} a mask "
        f"that keeps only the tensor's elements (or fix its offsets); on a GPU this {op} would "
        f"{'corrupt memory' if op == 'store' else 'read memory that is not the tensor'}")


@contextlib.contextmanager
def checked_bounds() -> Iterator[bool]:
    """Check every interpreted kernel's loads and stores while in the block. -> whether this Triton's
    interpreter could be hooked (False: nothing is checked)."""
    try:
        from triton.runtime import interpreter as ti
        executor, builder, np_dtype = ti.GridExecutor, ti.InterpreterBuilder, ti._get_np_dtype
        originals = (executor._init_args_hst, builder.create_masked_load, builder.create_masked_store)
    except (ImportError, AttributeError):
        yield False
        return
    init_args, masked_load, masked_store = originals

    def init_args_checked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        _launch.spans = _spans(list(self.arg_names[:len(args_hst)]) + list(kwargs_hst),
                               list(args_hst) + list(kwargs_hst.values()))
        return args_hst, kwargs_hst

    def size_of(ptrs) -> int:
        return np.dtype(np_dtype(ptrs.get_element_ty())).itemsize

    def load_checked(self, ptrs, mask, other, *rest):
        _check(ptrs, mask, "load", size_of(ptrs))
        return masked_load(self, ptrs, mask, other, *rest)

    def store_checked(self, ptrs, value, mask, *rest):
        _check(ptrs, mask, "store", size_of(ptrs))
        return masked_store(self, ptrs, value, mask, *rest)

    executor._init_args_hst = init_args_checked
    builder.create_masked_load, builder.create_masked_store = load_checked, store_checked
    try:
        yield True
    finally:
        executor._init_args_hst = init_args
        builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
        _launch.spans = None
