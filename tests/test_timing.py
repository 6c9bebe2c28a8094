"""minillm.timing.time_fn, where a notebook's timing cell meets a student's function.

A timing cell with graph=True captured whatever it was given. A function that reads a value back
(`int(context_lens.max())`, `.item()`) cannot be captured: the capture broke, time_fn fell back to
eager launches, and the broken capture left the capture stream current and torch's CUDA generator in
capture mode, so the notebook's next `torch.randn(..., device="cuda")` raised "Offset increment outside
graph capture encountered unexpectedly" (notebook 03 on an H200, 2026-12-06; reproduced on an H100:
`CUDAGraph.reset()` does not mend it, a fresh copy of the generator's state does). Now time_fn puts
both back, times the function without a graph, and warns, naming the cause.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from minillm.timing import time_fn


def test_cpu_timing_is_a_positive_median_and_ignores_graph():
    x = torch.randn(256, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about on a CPU
        ms = time_fn(lambda: x @ x, graph=True, device="cpu", rep=5)
    assert 0 < ms < 1_000


@pytest.mark.gpu
def test_a_function_that_reads_back_is_timed_without_a_graph_and_leaves_the_generator_usable():
    x = torch.randn(1 << 20, device="cuda")
    stream = torch.cuda.current_stream()

    def reads_back(t):
        n = int((t > 0).sum())  # a host read, as a student's paged decode might do for its longest context
        return t[:n] * 2

    with pytest.warns(UserWarning, match=r"cannot hold reads_back: it waits for the GPU .* timed without a graph"):
        ms = time_fn(reads_back, (x,), graph=True, rep=5)
    assert ms > 0
    assert torch.cuda.current_stream() == stream  # not the broken capture's stream
    # the generator works (it raised "Offset increment outside graph capture" after a broken capture)
    assert torch.randn(8, device="cuda").isfinite().all()
    assert torch.cuda.get_sync_debug_mode() == 0  # the debug mode the diagnosis set is put back
    # capturable functions are still timed from a graph, with no warning (index_copy_, as notebook 03
    # times it, among them)
    cache, slots = torch.zeros(4096, 8, device="cuda"), torch.randperm(4096, device="cuda")[:1024]
    src = x[:8192].view(1024, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert time_fn(lambda t: t * 2, (x,), graph=True, rep=5) > 0
        assert time_fn(lambda: cache.index_copy_(0, slots, src), graph=True, rep=5) > 0
    assert torch.equal(cache[slots], src)


def test_a_cpu_roofline_says_why_a_cached_working_set_beats_the_memory_floor(monkeypatch):
    """On a CPU a model whose weights fit the last-level cache is read from it between repeated runs and
    can beat the memory floor (notebook 01's toy model did, 112-121%): the table says so, and only then."""
    from minillm import timing
    monkeypatch.setattr(timing, "last_level_cache_bytes", lambda: 100 << 20)
    cpu = timing.Ceilings("cpu (2 threads, torch)", copy_gbps=20.0, matmul_tflops=1.0)
    roof = timing.Roofline(cpu)
    roof.add("fits, beats the floor", ms=1.0, bytes=40e6)  # floor 2 ms
    assert ("(above 100%: fits, beats the floor: their bytes (at most 40.0 MB) fit in this CPU's 104.9 MB "
            "last-level cache") in roof.table()
    for name, ms, nbytes in (("fits, under the floor", 2.5, 40e6), ("too big for the cache", 1.0, 400e6),
                             ("within the noise", 1.95, 40e6)):
        other = timing.Roofline(cpu)
        other.add(name, ms=ms, bytes=nbytes)
        assert "last-level cache" not in other.table(), name
    gpu = timing.Roofline(timing.Ceilings("NVIDIA H200 (cuda)", copy_gbps=4000.0, matmul_tflops=700.0))
    gpu.add("a GPU point", ms=0.001, bytes=40e6)
    assert "last-level cache" not in gpu.table()
