"""Chapter 2 graded tests, the Triton primer (exercises 2.7-2.11, notebooks/02a_triton_primer.ipynb).

Each kernel runs through its given launcher in Triton's interpreter on CPU, in fp32 (fp16 for the
matmul's accumulator: the interpreter computes bf16 wrongly), on odd sizes that end in a partial
block. References nobody here wrote: torch itself (x + y, torch.softmax, tensor indexing, matmul).

The interpreter does not catch out-of-bounds access, so every tensor a kernel sees sits in a buffer
with guard regions before and after it, filled with SENTINEL: outputs must leave their guards
untouched, and a read past an input's end reads the guard (known values, not junk or an unmapped
page), so a wrong kernel's output is the same on every run and the grader can name its bug. A read
past the end whose lanes are never stored changes no output: for the vector add, the test records
the address of every lane each tl.load reads (the interpreter's loads, their masks applied) and
requires them all inside x and y.

    pytest tests/exercises/test_ch2_primer.py --impl=exercises -m ex2_7
"""
from __future__ import annotations

import contextlib
import functools
import re
from typing import Callable

import numpy as np
import pytest
import torch

from minillm.course.grading import Raised, check_close, check_equal, check_that, equal
from mistakes import then, wrong_versions
from properties import outcome

SENTINEL = 77.0  # what every guard region holds
GUARD = 1024  # elements of guard on each side: more than any tile in these tests overhangs its tensor
EXACT = dict(atol=0.0, rtol=0.0)
TOL_SOFTMAX = dict(atol=1e-6, rtol=1e-5)  # one exp and one sum per row, in another order than torch's
TOL_MATMUL = dict(atol=1e-4, rtol=1e-4)  # fp32 dot products of <= 64 terms of size ~1
TOL_ONLINE = dict(atol=1e-5, rtol=1e-5)  # the same softmax, rescaled tile by tile
# fp16 matmul: the kernel rounds once, at the store (half an fp16 ulp, 2**-11 relative); a kernel
# that rounds its fp16 running sum after each of the 32 K tiles drifts by several ulps
TOL_FP16_MATMUL = dict(atol=1e-3, rtol=2 ** -10)
# fp16 matmul of zero-mean inputs, in fp16 ulps of torch's result (fp32 accumulation, rounded once): an fp32
# accumulator in another order than torch's moves a result by at most one rounding step
TOL_FP16_ULPS = 1.0
# results nearer 0 than 1/16 are measured in the ulp of 1/16 (2**-14): fp32 sums of 512 products of size ~1 in
# another order differ by ~1e-5, more than the fp16 ulp of a result that cancels to near 0
ULP_FLOOR = 2.0 ** -4


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def guarded(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of t placed, contiguous, between two guard regions of SENTINEL in one flat buffer.
    -> (buffer [GUARD + t.numel() + GUARD], the copy: a view of it shaped like t)."""
    buf = torch.full((GUARD + t.numel() + GUARD,), SENTINEL, dtype=t.dtype)
    view = buf[GUARD:GUARD + t.numel()].view(t.shape)
    view.copy_(t)
    return buf, view


def guarded_output(shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                   width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An output tensor filled with SENTINEL inside a guarded buffer (an element the kernel should
    write but does not keeps SENTINEL). width: for a 2-D output, its rows `width` elements apart (a
    slice [:, :cols] of a wider tensor; the columns past cols are guards too). -> (buffer, output view)."""
    if width is None:
        return guarded(torch.full(shape, SENTINEL, dtype=dtype))
    buf, wide = guarded(torch.full((shape[0], width), SENTINEL, dtype=dtype))
    return buf, wide[:, :shape[1]]


def guards_of(buf: torch.Tensor, shape: tuple[int, ...] | None = None, width: int | None = None) -> torch.Tensor:
    """The two guard regions of a guarded buffer, concatenated (and, for an output `width` wide, the
    columns past its shape[1] in every row)."""
    ends = torch.cat([buf[:GUARD], buf[-GUARD:]])
    if width is None:
        return ends
    return torch.cat([ends, buf[GUARD:-GUARD].view(shape[0], width)[:, shape[1]:].reshape(-1)])


def _spans(indices: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    spans, start = [], None
    for i, k in enumerate(indices):
        start = k if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != k + 1:
            spans.append(f"{start}" if start == k else f"{start}-{k}")
            start = None
    return ", ".join(spans)


def guard_writes(buf: torch.Tensor, shape: tuple[int, ...], width: int | None = None) -> str | None:
    """Where a kernel wrote outside its output, in the output's own terms (None: nowhere): elements before
    its first, elements past its end (as flat indices of the output), and for an output `width` wide the
    columns past shape[1] of each row."""
    n = shape[0] * width if width is not None else int(torch.tensor(shape).prod())
    touched = lambda t: (t != SENTINEL).nonzero().flatten().tolist()  # noqa: E731 (NaN != SENTINEL too)
    found = []
    before = touched(buf[:GUARD])
    if before:
        found.append(f"{_count(before)} before its first (flat indices {_spans([k - GUARD for k in before])})")
    after = touched(buf[-GUARD:])
    if after:
        found.append(f"{_count(after)} past its end (flat indices {_spans([n + k for k in after])} of its {n})")
    if width is not None:
        extra = buf[GUARD:-GUARD].view(shape[0], width)[:, shape[1]:] != SENTINEL
        rows, cols = extra.any(1).nonzero().flatten().tolist(), extra.any(0).nonzero().flatten().tolist()
        if rows:
            found.append(f"column{'' if len(cols) == 1 else 's'} {_spans([shape[1] + c for c in cols])} of "
                         f"row{'' if len(rows) == 1 else 's'} {_spans(rows)}, past each row's "
                         f"{shape[1]} (its rows are {width} apart: the rest of each row belongs to another tensor)")
    return "; ".join(found) if found else None


def _count(indices: list[int]) -> str:
    return f"{len(indices)} element{'' if len(indices) == 1 else 's'}"


def _same_guards(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal guard regions, NaN where the other has NaN."""
    return a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def interior(buf: torch.Tensor, shape: tuple[int, ...], width: int | None = None) -> torch.Tensor:
    """The tensor between the guards of a guarded buffer."""
    if width is None:
        return buf[GUARD:-GUARD].view(shape)
    return buf[GUARD:-GUARD].view(shape[0], width)[:, :shape[1]]


def check_guarded(exercise_id: str, what: str, launch: Callable[[Callable], torch.Tensor], launcher: str,
                  shape: tuple[int, ...], want: torch.Tensor, got_launcher: Callable, width: int | None = None,
                  agree: Callable[[Callable], object] | None = None, **tol) -> None:
    """Run launch(got_launcher) -> its guarded output buffer; its guards must hold SENTINEL and its
    interior `want` (width: the output's row stride, when launch made it a slice of a wider tensor).
    On failure each known wrong version of `launcher` runs through launch() the same way (into fresh
    buffers), so a student's output that equals one of them names the bug. agree: for a launch that
    raises, see check_raised_like_a_known_bug (without it, what the launch raises is raised as it is)."""
    if agree is None:
        buf = launch(got_launcher)
    else:
        buf = check_raised_like_a_known_bug(exercise_id, what, launch, got_launcher, launcher, agree)
    suspected = {hint: (lambda fn=fn: launch(fn)) for hint, fn in wrong_versions(launcher).items()}
    check_that(guard_writes(buf, shape, width), exercise_id, f"{what} wrote outside its output (a store without "
               f"its mask{', or at the wrong row stride' if width else ''}?):", actual=guards_of(buf, shape, width),
               suspects=then(suspected, lambda b: guards_of(b, shape, width)), same=_same_guards)
    check_close(interior(buf, shape, width), want, exercise_id, f"output of {what}", **tol,
                suspects=then(suspected, lambda b: interior(b, shape, width)))


def same_access_refused(a, b) -> bool:
    """The same outcome: the same error, or for the bounds check's KernelOutOfBounds ('raised KernelOutOfBounds:
    tl.load outside every tensor ...') the same kind of access refused (its counts, and the tensor it measures
    from, depend on where memory was allocated, so the rest of its message differs from run to run)."""
    if not (isinstance(a, Raised) and isinstance(b, Raised)):
        return False
    return a == b or (_refused_access(a) is not None and _refused_access(a) == _refused_access(b))


def _refused_access(raised: str) -> str | None:
    """'tl.load' or 'tl.store' for a KernelOutOfBounds (raised as it is, or inside the interpreter's
    InterpreterError), else None."""
    m = re.search(r"KernelOutOfBounds\W+(tl\.(?:load|store)) outside every tensor", raised)
    return m.group(1) if m else None


def check_raised_like_a_known_bug(exercise_id: str, what: str, launch: Callable[[Callable], torch.Tensor],
                                  got_launcher: Callable, launcher: str,
                                  agree: Callable[[Callable], object] | None = None) -> torch.Tensor:
    """Fail when launch(got_launcher) raises (the bounds check stopping a load or store at its line), naming the
    known wrong version of `launcher` that raises the same way, if one does; else -> launch's result.
    agree: a second look, for an error two bugs can share (Triton's bare AssertionError for any tl.dot whose acc's
    dtype is not its out_dtype): a wrong version is named only where agree(it), another launch, equals
    agree(got_launcher)."""
    got = outcome(lambda: launch(got_launcher))
    if isinstance(got, Raised):
        students = functools.cache(lambda: outcome(lambda: agree(got_launcher)))

        def raised_by(fn: Callable):
            if agree is not None and not equal(outcome(lambda: agree(fn)), students()):
                raise LookupError("this wrong version differs from the code under test elsewhere")
            return outcome(lambda: launch(fn))  # (grading._diagnose skips a suspect that raises)

        check_that("", exercise_id, what, actual=got, same=same_access_refused,
                   suspects={hint: (lambda fn=fn: raised_by(fn)) for hint, fn in wrong_versions(launcher).items()})
    return got


# ---- 2.7 masked vector add -----------------------------------------------------------------------
ADD_BLOCK = 256  # small blocks: 1000 elements take 4 programs, the last one three-quarters masked
ADD_WIDE_BLOCK = 1024  # the launcher's default block: the same 1000 elements in one program


def add_launch(n: int, block: int = ADD_BLOCK) -> tuple[Callable[[Callable], torch.Tensor], torch.Tensor]:
    """-> (launch(vector_add) -> guarded output buffer, the torch reference x + y)."""
    _, x = guarded(randn(n, seed=n))
    _, y = guarded(randn(n, seed=n + 1))

    def launch(vector_add: Callable) -> torch.Tensor:
        buf, out = guarded_output((n,))
        vector_add(x, y, block=block, out=out)
        return buf

    return launch, x + y


# the guard test first: a kernel that stores out of bounds is named before the value tests run it
@pytest.mark.ex2_7
def test_vector_add_writes_only_its_n_elements(impl):
    launch, want = add_launch(1000)
    check_guarded("2.7", f"vector_add of 1000 elements in blocks of {ADD_BLOCK}", launch, "vector_add", (1000,), want,
                  impl.vector_add, **EXACT)


@pytest.mark.ex2_7
@pytest.mark.parametrize("n", [1, ADD_BLOCK, 1000], ids=["one-element", "one-full-block", "odd-1000"])
def test_vector_add_matches_torch(impl, n):
    launch, want = add_launch(n)
    check_guarded("2.7", f"vector_add of {n} elements in blocks of {ADD_BLOCK}", launch, "vector_add", (n,), want,
                  impl.vector_add, **EXACT)


@pytest.mark.ex2_7
def test_vector_add_uses_the_block_it_is_given(impl):
    """The same 1000 elements in blocks of 1024 (the launcher's default): one program, its last 24 lanes masked.
    The kernel must tile by its BLOCK argument, not by a number of its own."""
    launch, want = add_launch(1000, ADD_WIDE_BLOCK)
    check_guarded("2.7", f"vector_add of 1000 elements in blocks of {ADD_WIDE_BLOCK}", launch, "vector_add", (1000,),
                  want, impl.vector_add, **EXACT)


@contextlib.contextmanager
def loads_recorded():
    """Record the byte address of every lane the kernels launched inside read with tl.load (masked-off
    lanes left out): Triton's interpreter funnels every load (plain, masked, block pointer,
    descriptor) through one builder method, which this wraps. -> a list that fills with arrays of
    addresses."""
    from triton.runtime import interpreter
    builder, addresses = interpreter.interpreter_builder, []
    real, patched_before = builder.create_masked_load, "create_masked_load" in vars(builder)

    def recording(ptrs, mask, *args, **kwargs):
        where = np.asarray(ptrs.data)
        addresses.append(where[np.broadcast_to(np.asarray(mask.data, dtype=bool), where.shape)].astype(np.int64))
        return real(ptrs, mask, *args, **kwargs)

    builder.create_masked_load = recording
    try:
        yield addresses
    finally:
        if patched_before:
            builder.create_masked_load = real
        else:
            del builder.create_masked_load  # the class's own method again


def read_outside(addresses: list, inputs: dict[str, torch.Tensor]) -> dict[str, str]:
    """For each contiguous input: which of its elements past either end were read (by their index,
    from -GUARD to numel + GUARD); 'none' when every read lies inside it or another input."""
    read = np.unique(np.concatenate(addresses)) if addresses else np.zeros(0, dtype=np.int64)
    inside = np.zeros(len(read), dtype=bool)
    for t in inputs.values():
        inside |= (read >= t.data_ptr()) & (read < t.data_ptr() + t.numel() * t.element_size())
    described = {}
    for name, t in inputs.items():
        index = (read[~inside] - t.data_ptr()) // t.element_size()
        near = index[(index >= -GUARD) & (index < t.numel() + GUARD)]
        described[name] = (f"{len(near)} elements, indices {near.min()}..{near.max()}" if len(near) else "none")
    return described


@pytest.mark.ex2_7
def test_vector_add_reads_only_its_n_elements(impl):
    """The lanes past n must not load either (x[i], y[i] for i >= n are another tensor's memory, or
    an unmapped page on a GPU). Their values never reach the output, so the test records what the
    kernel reads."""
    n = 1000

    def reads_of(vector_add: Callable) -> dict[str, str]:
        _, x = guarded(randn(n, seed=n))
        _, y = guarded(randn(n, seed=n + 1))
        _, out = guarded_output((n,))
        with loads_recorded() as addresses:
            vector_add(x, y, block=ADD_BLOCK, out=out)
        return read_outside(addresses, {"x": x, "y": y})

    check_equal(reads_of(impl.vector_add), {"x": "none", "y": "none"}, "2.7",
                f"elements read past the ends of x and y by vector_add of {n} elements in blocks of {ADD_BLOCK} "
                f"(a load without its mask?)",
                suspects={hint: (lambda fn=fn: reads_of(fn)) for hint, fn in wrong_versions("vector_add").items()})


# ---- 2.8 softmax, one program per row ------------------------------------------------------------
ROWS = 5


def softmax_launch(x: torch.Tensor, width: int | None = None) -> Callable[[Callable], torch.Tensor]:
    """launch(softmax_rows) -> the guarded output buffer of softmax_rows(x, out=...) (out's rows `width`
    elements apart when given)."""
    def launch(softmax_rows: Callable) -> torch.Tensor:
        buf, out = guarded_output(tuple(x.shape), width=width)
        softmax_rows(x, out=out)
        return buf

    return launch


OUT_WIDTH = 120  # a strided output's row stride: neither its row length nor the input's row stride


@pytest.mark.ex2_8
def test_softmax_of_strided_rows_writes_only_its_rows(impl):
    """x is a [5, 100] slice of a [5, 128] tensor: its rows are 128 elements apart; out is a [5, 100] slice
    of a [5, 120] tensor: its rows are 120 apart, and the 20 columns after each row must stay untouched."""
    _, wide = guarded(randn(ROWS, 128, seed=30) * 3)
    x = wide[:, :100]
    check_guarded("2.8", f"softmax_rows of [5, 100] rows 128 elements apart into rows {OUT_WIDTH} apart",
                  softmax_launch(x, OUT_WIDTH), "softmax_rows", (ROWS, 100), torch.softmax(x, dim=-1),
                  impl.softmax_rows, width=OUT_WIDTH, **TOL_SOFTMAX)


@pytest.mark.ex2_8
@pytest.mark.parametrize("cols", [64, 100, 1], ids=["pow2-64", "odd-100", "one-column"])
def test_softmax_rows_matches_torch(impl, cols):
    _, x = guarded(randn(ROWS, cols, seed=31) * 3)
    check_guarded("2.8", f"softmax_rows of [{ROWS}, {cols}]", softmax_launch(x), "softmax_rows", (ROWS, cols),
                  torch.softmax(x, dim=-1), impl.softmax_rows, **TOL_SOFTMAX)


@pytest.mark.ex2_8
def test_softmax_rows_of_large_logits(impl):
    """Logits near 100 (an LM head's can reach that): exp(100) overflows fp32 (max 3.4e38)."""
    _, x = guarded(randn(ROWS, 100, seed=32) * 5 + 100)
    check_guarded("2.8", "softmax_rows of logits near 100", softmax_launch(x), "softmax_rows", (ROWS, 100),
                  torch.softmax(x, dim=-1), impl.softmax_rows, **TOL_SOFTMAX)


# ---- 2.9 a gather through the page table ---------------------------------------------------------
GATHER_BLOCK_T = 8  # tokens per program: 13 tokens take 2 programs, the second partly masked
GATHER_WIDE_BLOCK_T = 16  # and the same gathers in programs of 16: the kernel must tile by its BLOCK_T
# name -> (tokens, page size, row width d, the page table: a permutation, -1 past the last page in use)
GATHER_CASES = {
    "whole-pages": (16, 4, 32, [2, 0, 3, 1]),
    "partial-last-page": (13, 4, 40, [5, 0, 3, 1, -1, -1]),
    "one-token": (1, 8, 16, [1, -1]),
}
NUM_PAGES = 6


def gather_launch(cache: torch.Tensor, table: torch.Tensor, n_tokens: int, width: int | None = None,
                  block_t: int = GATHER_BLOCK_T) -> Callable[[Callable], torch.Tensor]:
    """launch(gather_pages) -> the guarded output buffer of gather_pages(cache, table, n_tokens, out=...)
    (out's rows `width` elements apart when given)."""
    def launch(gather_pages: Callable) -> torch.Tensor:
        buf, out = guarded_output((n_tokens, cache.shape[2]), cache.dtype, width=width)
        gather_pages(cache, table, n_tokens, block_t=block_t, out=out)
        return buf

    return launch


def gathered(cache: torch.Tensor, table: list[int], n_tokens: int) -> torch.Tensor:
    """The reference: token t is row t % page of page table[t // page], by torch indexing."""
    page = cache.shape[1]
    return torch.stack([cache[table[t // page], t % page] for t in range(n_tokens)])


@pytest.mark.ex2_9
def test_gather_from_a_strided_cache_writes_only_its_tokens(impl):
    """The cache is [6, 4, 40] cut from a [6, 4, 56] tensor (as one head's K is cut from a cache of
    several heads): its rows are 56 elements apart and its pages 224. The output is [13, 40] cut from a
    [13, 48] tensor: its rows are 48 apart, and the 8 columns after each row must stay untouched."""
    n_tokens, page, d, table = GATHER_CASES["partial-last-page"]
    _, wide = guarded(randn(NUM_PAGES, page, 56, seed=33))
    cache = wide[:, :, :d]
    _, table_t = guarded(torch.tensor(table, dtype=torch.int32))
    check_guarded("2.9", f"gather_pages of {n_tokens} tokens from a strided cache into rows 48 apart",
                  gather_launch(cache, table_t, n_tokens, 48), "gather_pages", (n_tokens, d),
                  gathered(cache, table, n_tokens), impl.gather_pages, width=48, **EXACT)


@pytest.mark.ex2_9
@pytest.mark.parametrize("case", list(GATHER_CASES))
def test_gather_pages_matches_torch_indexing(impl, case):
    n_tokens, page, d, table = GATHER_CASES[case]
    _, cache = guarded(randn(NUM_PAGES, page, d, seed=34))
    _, table_t = guarded(torch.tensor(table, dtype=torch.int32))
    for block_t in (GATHER_BLOCK_T, GATHER_WIDE_BLOCK_T):
        check_guarded("2.9", f"gather_pages of {n_tokens} tokens, pages of {page}, table {table}, {block_t} tokens "
                      f"a program", gather_launch(cache, table_t, n_tokens, block_t=block_t), "gather_pages",
                      (n_tokens, d), gathered(cache, table, n_tokens), impl.gather_pages, **EXACT)


@pytest.mark.ex2_9
def test_gather_reads_only_the_tensors_it_was_given(impl):
    """12 tokens in pages of 4, a table of exactly their 3 pages and a cache of 6 pages of 20-wide rows, each
    a tensor of its own: the second program's lanes 12-15 are past the sequence (an unmasked table load there
    reads entry 3, past the table), and the last token's row is the cache's last (an unmasked row load reads
    columns 20-31, past the cache). On a GPU such loads read whatever follows (or fault); here the bounds check
    stops them at their line (minillm/course/kernel_bounds.py, on in every CPU test): guards inside the same
    storage, as the other tests have, take the reads silently."""
    n_tokens, page, d, table = 12, 4, 20, [2, 0, NUM_PAGES - 1]
    cache = randn(NUM_PAGES, page, d, seed=37)  # no guards: nothing of its storage after page 5's last row
    table_t = torch.tensor(table, dtype=torch.int32)
    check_guarded("2.9", f"gather_pages of {n_tokens} tokens, pages of {page}, a table of exactly {table}",
                  gather_launch(cache, table_t, n_tokens), "gather_pages", (n_tokens, d),
                  gathered(cache, table, n_tokens), impl.gather_pages, **EXACT)


@pytest.mark.ex2_9
def test_gather_from_k_and_v_pages_side_by_side(impl):
    """K and V of each page side by side in one buffer ([6, 2, 4, 56]: a layout an engine may allocate), and the
    cache one head's K cut from it: cache = buf[:, 0, :, :40], rows 56 elements apart and pages 2 * 4 * 56 =
    448, not 4 rows' worth (224): the page stride is its own, neither PAGE * stride_row nor PAGE * n_cols."""
    n_tokens, page, d, table = GATHER_CASES["partial-last-page"]
    _, buf = guarded(randn(NUM_PAGES, 2, page, 56, seed=38))
    cache = buf[:, 0, :, :d]
    _, table_t = guarded(torch.tensor(table, dtype=torch.int32))
    check_guarded("2.9", f"gather_pages of {n_tokens} tokens from a cache whose pages are {cache.stride(0)} elements "
                  f"apart (rows {cache.stride(1)})", gather_launch(cache, table_t, n_tokens), "gather_pages",
                  (n_tokens, d), gathered(cache, table, n_tokens), impl.gather_pages, **EXACT)


# a cache past 2**31 elements: int8 pages of 16 x 64 (1024 elements), 2**21 + 2 of them; only the pages the test
# writes become memory (torch.empty maps the rest lazily), and the pages read sit at element 2**31 and beyond
HUGE_PAGE, HUGE_D, HUGE_PAGES = 16, 64, 2 ** 21 + 2


@pytest.mark.ex2_9
def test_gather_from_a_cache_past_2_gib_elements(impl):
    """The sequence's 2 pages are the cache's last two, at elements 2**31 and 2**31 + 1024: an offset
    page * stride_page computed in int32 wraps around to a negative number (the bounds check stops the load
    at its line). On a GPU: any layer cache of more than 2**31 elements (a big GPU's)."""
    n_tokens = 2 * HUGE_PAGE - 3
    cache = torch.empty(HUGE_PAGES, HUGE_PAGE, HUGE_D, dtype=torch.int8)
    last = HUGE_PAGES - 1
    data = torch.randint(-100, 100, (2, HUGE_PAGE, HUGE_D), dtype=torch.int8,
                         generator=torch.Generator().manual_seed(39))
    cache[last - 1:] = data
    table = [last - 1, last]
    _, table_t = guarded(torch.tensor(table, dtype=torch.int32))
    launch = gather_launch(cache, table_t, n_tokens, block_t=GATHER_WIDE_BLOCK_T)
    what = (f"gather_pages of {n_tokens} tokens from pages {last - 1} and {last} of an int8 cache of {HUGE_PAGES} "
            f"pages of {HUGE_PAGE} x {HUGE_D} (element offsets past 2**31 - 1)")
    check_raised_like_a_known_bug("2.9", what, launch, impl.gather_pages, "gather_pages")
    check_guarded("2.9", what, launch, "gather_pages", (n_tokens, HUGE_D), data.reshape(-1, HUGE_D)[:n_tokens],
                  impl.gather_pages, **EXACT)


# ---- 2.10 a tiled matmul with tl.dot -------------------------------------------------------------
MATMUL_TILES = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)  # the smallest tl.dot tiles a GPU accepts
MATMUL_WIDE_TILES = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32)  # others: the kernel must use the tiles it is given


def matmul_launch(a: torch.Tensor, b: torch.Tensor, tiles: dict = MATMUL_TILES,
                  width: int | None = None) -> Callable[[Callable], torch.Tensor]:
    """launch(tiled_matmul) -> the guarded output buffer of tiled_matmul(a, b, tiles, out=...) (out's rows
    `width` elements apart when given)."""
    def launch(tiled_matmul: Callable) -> torch.Tensor:
        buf, out = guarded_output((a.shape[0], b.shape[1]), a.dtype, width=width)
        tiled_matmul(a, b, tiles, out=out)
        return buf

    return launch


MATMUL_PROBE_MKN = (16, 256, 16)  # fp16 tiles: 16 K tiles, so an fp16 running sum rounds where fp32 does not


def matmul_fp16_probe(tiled_matmul: Callable) -> torch.Tensor:
    """tiled_matmul's result on one fp16 product of positive terms: the second look at a launch that raised, since
    Triton raises one bare AssertionError for every tl.dot whose acc's dtype is not its out_dtype (an fp16 acc
    with out_dtype=tl.float16 on fp32 tiles from the second tile on; without out_dtype, at the first, fp16 tiles
    too)."""
    M, K, N = MATMUL_PROBE_MKN
    a = torch.rand(M, K, generator=torch.Generator().manual_seed(41)).half()
    b = torch.rand(K, N, generator=torch.Generator().manual_seed(42)).half()
    return interior(matmul_launch(a, b)(tiled_matmul), (M, N))


@pytest.mark.ex2_10
def test_matmul_of_odd_shapes_writes_only_its_tiles(impl):
    """[40, 50] @ [50, 36] in 16 x 16 x 16 tiles: every dimension ends in a partial tile, and A and B are
    transposed views (strides (1, 40) and (1, 50), as a weight stored [N, K] is used as W.t())."""
    M, K, N = 40, 50, 36
    _, a_t = guarded(randn(K, M, seed=35))
    _, b_t = guarded(randn(N, K, seed=36))
    a, b = a_t.t(), b_t.t()
    check_guarded("2.10", f"tiled_matmul [{M}, {K}] @ [{K}, {N}]", matmul_launch(a, b), "tiled_matmul", (M, N), a @ b,
                  impl.tiled_matmul, agree=matmul_fp16_probe, **TOL_MATMUL)


@pytest.mark.ex2_10
def test_matmul_into_rows_of_a_wider_output(impl):
    """C is [20, 36] cut from a [20, 50] tensor: its rows are 50 apart (stride_cm), and the 14 columns after
    each row belong to another tensor."""
    M, K, N = 20, 24, 36
    _, a = guarded(randn(M, K, seed=46))
    _, b = guarded(randn(K, N, seed=47))
    check_guarded("2.10", f"tiled_matmul [{M}, {K}] @ [{K}, {N}] into rows 50 apart", matmul_launch(a, b, width=50),
                  "tiled_matmul", (M, N), a @ b, impl.tiled_matmul, width=50, agree=matmul_fp16_probe,
                  **TOL_MATMUL)


@pytest.mark.ex2_10
@pytest.mark.parametrize("mkn", [(16, 16, 16), (32, 64, 48), (17, 20, 33)],
                         ids=["one-tile", "whole-tiles", "K-of-two-tiles"])
def test_tiled_matmul_matches_torch(impl, mkn):
    M, K, N = mkn
    _, a = guarded(randn(M, K, seed=37))
    _, b = guarded(randn(K, N, seed=38))
    for tiles in (MATMUL_TILES, MATMUL_WIDE_TILES):
        check_guarded("2.10", f"tiled_matmul [{M}, {K}] @ [{K}, {N}] in tiles {tiles}", matmul_launch(a, b, tiles),
                      "tiled_matmul", (M, N), a @ b, impl.tiled_matmul, agree=matmul_fp16_probe, **TOL_MATMUL)


@pytest.mark.ex2_10
def test_matmul_reads_only_the_tensors_it_was_given(impl):
    """[40, 50] @ [50, 36], each a contiguous tensor of its own: the last tiles' rows and columns past the
    shapes lie past the storage, where an unmasked load fails at its line (the bounds check); the guards the
    other tests put around A and B take such reads silently."""
    M, K, N = 40, 50, 36
    a, b = randn(M, K, seed=43), randn(K, N, seed=44)
    check_guarded("2.10", f"tiled_matmul [{M}, {K}] @ [{K}, {N}] of tensors of their own", matmul_launch(a, b),
                  "tiled_matmul", (M, N), a @ b, impl.tiled_matmul, agree=matmul_fp16_probe, **TOL_MATMUL)


@pytest.mark.ex2_10
def test_matmul_fp16_accumulates_in_fp32(impl):
    """fp16 [32, 512] @ [512, 32]: 32 K tiles of positive terms, sums near 128 where an fp16 ulp is 0.125."""
    M, K, N = 32, 512, 32
    _, a = guarded(torch.rand(M, K, generator=torch.Generator().manual_seed(39)).half())
    _, b = guarded(torch.rand(K, N, generator=torch.Generator().manual_seed(40)).half())
    want = (a.double() @ b.double()).half()
    check_guarded("2.10", f"tiled_matmul in fp16 [{M}, {K}] @ [{K}, {N}]", matmul_launch(a, b), "tiled_matmul",
                  (M, N), want, impl.tiled_matmul, **TOL_FP16_MATMUL)


def fp16_ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of the fp16 ulp at want (at ULP_FLOOR for |want| below it), as float64."""
    scale = want.double().abs().clamp_min(ULP_FLOOR)
    return (got.double() - want.double()).abs() / torch.exp2(torch.floor(torch.log2(scale)) - 10)


@pytest.mark.ex2_10
def test_matmul_fp16_of_zero_mean_inputs(impl):
    """fp16 [32, 512] @ [512, 32] of randn: products of both signs whose sums cancel (as activations times
    weights do), so rounding each K tile's partial sum to fp16 costs many ulps of the result. Every output must
    be within TOL_FP16_ULPS fp16 ulp of torch's (fp32 accumulation, rounded once)."""
    M, K, N = 32, 512, 32
    _, a = guarded(randn(M, K, seed=49).half())
    _, b = guarded(randn(K, N, seed=50).half())
    want = (a.float() @ b.float()).half()
    what = f"tiled_matmul in fp16 [{M}, {K}] @ [{K}, {N}] of zero-mean inputs"
    launch = matmul_launch(a, b)
    suspected = {hint: (lambda fn=fn: launch(fn)) for hint, fn in wrong_versions("tiled_matmul").items()}
    buf = launch(impl.tiled_matmul)
    check_that(guard_writes(buf, (M, N)), "2.10", f"{what} wrote outside its output (a store without its mask?):",
               actual=guards_of(buf, (M, N)), suspects=then(suspected, lambda b: guards_of(b, (M, N))),
               same=_same_guards)
    got = interior(buf, (M, N))
    off = fp16_ulps(got, want)
    bad = ~(off <= TOL_FP16_ULPS)  # NaN too
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        worst = off.nan_to_num(float("inf")).max().item()
        check_that(f"is off by more than {TOL_FP16_ULPS:g} fp16 ulp of torch's result (fp32 accumulation, rounded "
                   f"once) at {int(bad.sum())} of {bad.numel()} elements, by up to {worst:.4g} ulp; first at index "
                   f"{idx}: got {got[idx].item():.6g}, expected {want[idx].item():.6g}", "2.10", f"output of {what}",
                   actual=got, suspects=then(suspected, lambda b: interior(b, (M, N))), same=_same_guards)


# ---- 2.11 online softmax over tiles --------------------------------------------------------------
ONLINE_BLOCK_N = 16  # keys per tile: 100 keys take 7 tiles, the last one 4 keys long
ONLINE_ROWS, ONLINE_DIM = 5, 24  # head_dim 24: the values tile [16, 32] is masked on its columns too
# the scores' ramp runs from -4 to 4: the max grows by ~8 over the keys (a running sum that is not
# rescaled is off by up to e**8), and padded keys scored 0 instead of -inf would weigh e**-9 or more each
ONLINE_RAMP = 4.0
ONLINE_FAR = 200.0  # 'far-below-zero' shifts every score down by this: exp(s - 0) underflows fp32, exp(s - max) not
# ('far-above-zero' shifts some rows up by it: exp(s) overflows fp32 past 88, exp(s - max) not)
ONLINE_DROP = 100.0  # 'later-tiles-far-lower': keys from ONLINE_DROP_AT on score this much lower (exp(100) overflows
ONLINE_DROP_AT = 48  # fp32), from the start of a tile (of 16 keys, and of 32 + 16)
ONLINE_MASKED = (32, 64)  # 'masked-tile': these keys score -inf (masked), a whole tile of 16 and of 32 mid-row
# the last three cases change only these rows: a bug shows in them alone (NaN there, where a bug that is
# wrong everywhere is NaN in every row)
ONLINE_CHANGED_ROWS = slice(0, None, 2)


def online_scores(case: str, n_keys: int) -> torch.Tensor:
    """Scores [ONLINE_ROWS, n_keys]: noise plus a ramp, so the max grows (or shrinks) tile by tile
    and the running sums must be rescaled."""
    noise = randn(ONLINE_ROWS, n_keys, seed=41) * 2
    ramp = torch.linspace(-ONLINE_RAMP, ONLINE_RAMP, n_keys)
    if case == "far-below-zero":
        return noise + ramp - ONLINE_FAR
    scores = noise + (ramp.flip(0) if case in ("max-first", "later-tiles-far-lower") else ramp)
    if case == "far-above-zero":
        scores[ONLINE_CHANGED_ROWS] += ONLINE_FAR
    if case == "later-tiles-far-lower":
        scores[ONLINE_CHANGED_ROWS, ONLINE_DROP_AT:] -= ONLINE_DROP
    if case == "masked-tile":
        scores[ONLINE_CHANGED_ROWS, ONLINE_MASKED[0]:ONLINE_MASKED[1]] = float("-inf")
    return scores


@pytest.mark.ex2_11
@pytest.mark.parametrize("case", ["max-grows", "max-first", "one-partial-tile", "far-below-zero", "far-above-zero",
                                  "later-tiles-far-lower", "masked-tile"])
def test_softmax_weighted_sum_matches_torch(impl, case):
    """Rows of scores 104 elements apart (a slice), values rows 32 apart (a slice), 100 keys in tiles
    of 16; 'one-partial-tile' has 5 keys: a single tile, mostly masked; 'far-below-zero' every score near -200.
    In rows 0, 2 and 4: 'far-above-zero' every score near +200; 'later-tiles-far-lower' the keys from 48 on score
    100 lower, so a later tile's max is far below the running max; 'masked-tile' keys 32-63 score -inf (masked
    keys), whole tiles of -inf after tiles of real scores."""
    n_keys = 5 if case == "one-partial-tile" else 100
    _, wide_scores = guarded(torch.cat([online_scores(case, n_keys), torch.zeros(ONLINE_ROWS, 4)], dim=1))
    _, wide_values = guarded(randn(n_keys, 32, seed=42))
    scores, values = wide_scores[:, :n_keys], wide_values[:, :ONLINE_DIM]

    def launch(softmax_weighted_sum: Callable) -> torch.Tensor:
        buf, out = guarded_output((ONLINE_ROWS, ONLINE_DIM))
        softmax_weighted_sum(scores, values, block_n=ONLINE_BLOCK_N, out=out)
        return buf

    check_guarded("2.11", f"softmax_weighted_sum of {n_keys} keys in tiles of {ONLINE_BLOCK_N} ({case})", launch,
                  "softmax_weighted_sum", (ONLINE_ROWS, ONLINE_DIM), torch.softmax(scores, dim=-1) @ values,
                  impl.softmax_weighted_sum, **TOL_ONLINE)


@pytest.mark.ex2_11
def test_softmax_weighted_sum_in_tiles_of_32(impl):
    """The 'max-grows' scores of 100 keys in tiles of 32 (the last one 4 keys long): the kernel must use the
    tiles it is given."""
    n_keys, block_n = 100, 32
    scores, values = online_scores("max-grows", n_keys), randn(n_keys, ONLINE_DIM, seed=51)

    def launch(softmax_weighted_sum: Callable) -> torch.Tensor:
        buf, out = guarded_output((ONLINE_ROWS, ONLINE_DIM))
        softmax_weighted_sum(scores, values, block_n=block_n, out=out)
        return buf

    check_guarded("2.11", f"softmax_weighted_sum of {n_keys} keys in tiles of {block_n}", launch,
                  "softmax_weighted_sum", (ONLINE_ROWS, ONLINE_DIM), torch.softmax(scores, dim=-1) @ values,
                  impl.softmax_weighted_sum, **TOL_ONLINE)


@pytest.mark.ex2_11
def test_softmax_weighted_sum_into_rows_of_a_wider_output(impl):
    """The output is [5, 24] cut from a [5, 40] tensor: its rows are 40 apart (stride_out)."""
    n_keys = 40
    scores, values = online_scores("max-grows", n_keys), randn(n_keys, ONLINE_DIM, seed=48)

    def launch(softmax_weighted_sum: Callable) -> torch.Tensor:
        buf, out = guarded_output((ONLINE_ROWS, ONLINE_DIM), width=40)
        softmax_weighted_sum(scores, values, block_n=ONLINE_BLOCK_N, out=out)
        return buf

    check_guarded("2.11", f"softmax_weighted_sum of {n_keys} keys into rows 40 apart", launch,
                  "softmax_weighted_sum", (ONLINE_ROWS, ONLINE_DIM), torch.softmax(scores, dim=-1) @ values,
                  impl.softmax_weighted_sum, width=40, **TOL_ONLINE)


@pytest.mark.ex2_11
def test_softmax_weighted_sum_reads_only_the_tensors_it_was_given(impl):
    """Scores [5, 100] and values [100, 24], contiguous tensors of their own: the last tile's keys 100-111 and
    the values' columns 24-31 lie past the storage, where an unmasked load fails at its line (the bounds
    check); the slices of wider, guarded buffers in the test above take such reads silently."""
    n_keys = 100
    scores, values = online_scores("max-grows", n_keys), randn(n_keys, ONLINE_DIM, seed=45)

    def launch(softmax_weighted_sum: Callable) -> torch.Tensor:
        buf, out = guarded_output((ONLINE_ROWS, ONLINE_DIM))
        softmax_weighted_sum(scores, values, block_n=ONLINE_BLOCK_N, out=out)
        return buf

    check_guarded("2.11", f"softmax_weighted_sum of {n_keys} keys of tensors of their own", launch,
                  "softmax_weighted_sum", (ONLINE_ROWS, ONLINE_DIM), torch.softmax(scores, dim=-1) @ values,
                  impl.softmax_weighted_sum, **TOL_ONLINE)
