"""minillm.course.kernel_bounds: under Triton's interpreter, a load or store outside every tensor a kernel
was given raises KernelOutOfBounds at the kernel's line, before it touches the process's memory; masked
accesses and accesses inside a wider storage (a view's guard regions) run as before."""
import os

import pytest
import torch
import triton
import triton.language as tl

from minillm.course.kernel_bounds import KernelOutOfBounds, checked_bounds

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the check is of Triton's interpreter (the CPU suite runs it)")
N, BLOCK = 10, 16  # a block wider than the tensor: its last 6 lanes must be masked


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, MASK_STORE: tl.constexpr,
                 SHIFT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    else:
        x = tl.load(x_ptr + offs)
    if MASK_STORE:
        tl.store(out_ptr + offs - SHIFT, x, mask=offs < n)
    else:
        tl.store(out_ptr + offs - SHIFT, x)


def copy(x: torch.Tensor, out: torch.Tensor, mask_load=True, mask_store=True, shift=0) -> torch.Tensor:
    _copy_kernel[(1,)](x, out, N, BLOCK=BLOCK, MASK_LOAD=mask_load, MASK_STORE=mask_store, SHIFT=shift)
    return out


def test_masked_accesses_run_and_give_the_copy():
    x = torch.arange(N, dtype=torch.float32)
    with checked_bounds() as hooked:
        assert hooked
        torch.testing.assert_close(copy(x, torch.zeros(N)), x, rtol=0, atol=0)


def test_an_unmasked_store_past_the_end_raises_before_writing():
    x, out = torch.arange(N, dtype=torch.float32), torch.zeros(N)
    with checked_bounds(), pytest.raises(Exception) as failure:
        copy(x, out, mask_store=False)
    err = failure.value.__cause__
    assert isinstance(err, KernelOutOfBounds), repr(failure.value)
    assert f"{BLOCK - N} of the {BLOCK} addresses" in str(err) and "1 element(s) past the end of out_ptr's" in str(err)
    assert torch.equal(out, torch.zeros(N)), "nothing may be written before the check"


def test_an_unmasked_load_and_a_store_before_the_start_are_named():
    x = torch.arange(N, dtype=torch.float32)
    with checked_bounds(), pytest.raises(Exception) as failure:
        copy(x, torch.zeros(N), mask_load=False)
    assert "tl.load outside" in str(failure.value.__cause__) and "x_ptr's storage" in str(failure.value.__cause__)
    with checked_bounds(), pytest.raises(Exception) as failure:
        copy(x, torch.zeros(N), shift=3)
    assert "3 element(s) before the start of out_ptr's storage" in str(failure.value.__cause__)


def test_a_view_may_reach_into_its_storage():
    """The graded tests' guard regions: an output view inside a wider buffer. A store past the view but inside
    the buffer is the guards' to catch (they name it), not this check's."""
    buf = torch.full((N + BLOCK,), -1.0)
    out = buf[:N]
    with checked_bounds():
        copy(torch.arange(N, dtype=torch.float32), out, mask_store=False)  # lanes 10..15 land in buf[10:16]
    assert torch.equal(buf[:N], torch.arange(N, dtype=torch.float32))


def test_the_notebook_switch_checks_while_it_is_on():
    """use_my_code / swap_in: a student's kernel runs in the notebook's own process, so the check is on while
    their code is swapped in, and off again after restore()."""
    from triton.runtime import interpreter

    from minillm.course.exercises import swap_in
    before = interpreter.InterpreterBuilder.create_masked_store
    swap = swap_in("solutions", exercises={"2.7"})
    try:
        assert swap.swapped == ["2.7"] and interpreter.InterpreterBuilder.create_masked_store is not before
        with pytest.raises(Exception) as failure:
            copy(torch.arange(N, dtype=torch.float32), torch.zeros(N), mask_store=False)
        assert isinstance(failure.value.__cause__, KernelOutOfBounds), repr(failure.value)
    finally:
        swap.restore()
    assert interpreter.InterpreterBuilder.create_masked_store is before
