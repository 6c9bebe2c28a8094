"""Timing for the notebooks and the bench: one way to time a callable, the device's measured ceilings,
a roofline.

    t = time_fn(fn)                       # median milliseconds (CUDA events on GPU, perf_counter on CPU)
    c = device_ceilings()                 # measured copy GB/s and matmul TFLOP/s of this device
    r = Roofline(c); r.add("rmsnorm", ms=t, bytes=..., flops=...); r.plot(); r.table()

Rules (the device's METHOD): warm up first; take the median of many runs; never time zeros; rotate
inputs bigger than the L2 cache (pass several argument sets) so repeated runs do not hit in cache.
"""
from __future__ import annotations

import glob
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from minillm.config import readable_bytes


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def describe_device(device: str | None = None) -> str:
    """'NVIDIA H200 (cuda, torch 2.11.0+cu130, triton 3.6.0)' or 'cpu (...)'; device: this machine's
    GPU when it has one, unless 'cpu'."""
    import triton
    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    if (device or default_device()) != "cpu":
        return f"{torch.cuda.get_device_name()} (cuda, {versions})"
    return f"cpu ({torch.get_num_threads()} threads, {versions})"


def time_fn(fn: Callable, *arg_sets: Sequence, warmup: int = 5, rep: int = 50, max_seconds: float = 2.0,
            graph: bool = False, device: str | None = None) -> float:
    """Median milliseconds of one call of fn(*args), rotating through arg_sets (fn() when none).

    On CUDA, one timing covers several back-to-back calls (about 1 ms of work, every arg set at least
    once), between two CUDA events. graph=True replays those calls from a CUDA graph: the figure is
    then the GPU's time alone, with no Python or launch overhead, which for a 30-microsecond kernel is
    most of what an eager timing shows. Use it only for pure device work (kernels on tensors that
    stay alive): a graph replays fixed addresses, so host copies, allocations of pinned memory or
    random numbers inside fn are wrong there. A fn that cannot be captured (one that waits for the GPU:
    x.item(), int(x), x.cpu(), nonzero) is timed without a graph, with a warning that says why. On CPU (or device='cpu' on a machine
    with a GPU): perf_counter per call.
    """
    arg_sets = arg_sets or ((),)
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    if (device or default_device()) == "cpu":
        times, start_all = [], time.perf_counter()
        for i in range(rep):
            t0 = time.perf_counter()
            fn(*arg_sets[i % len(arg_sets)])
            times.append((time.perf_counter() - t0) * 1e3)
            if time.perf_counter() - start_all > max_seconds and len(times) >= 5:
                break
        return statistics.median(times)
    torch.cuda.synchronize()
    once = _events(lambda: fn(*arg_sets[0]))  # an upper bound: includes the launch
    inner = max(len(arg_sets), min(64, int(1.0 / max(once, 1e-3)) + 1))
    calls = [arg_sets[i % len(arg_sets)] for i in range(inner)]
    run = (lambda: [fn(*a) for a in calls])
    if graph:
        run = _graph_of(fn, calls) or run
    run()
    times, start_all = [], time.perf_counter()
    for _ in range(rep):
        times.append(_events(run) / inner)
        if time.perf_counter() - start_all > max_seconds and len(times) >= 5:
            break
    return statistics.median(times)


def _graph_of(fn: Callable, calls: list) -> Callable[[], None] | None:
    """calls of fn captured in one CUDA graph -> its replay; None, with a warning that names the cause,
    when fn cannot be captured. A broken capture leaves torch (2.11) half in capture mode: the capture
    stream still current and the CUDA generator's state still capturing, so that the process's next
    torch.randn on the GPU raised "Offset increment outside graph capture encountered unexpectedly"
    (notebook 03 on an H200). Both are put back here."""
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    clean, stream = gen.clone_state(), torch.cuda.current_stream()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            for a in calls:
                fn(*a)
        return g.replay
    except Exception as e:  # noqa: BLE001 -- any failure to capture: time eager launches instead
        torch.cuda.set_stream(stream)
        gen.graphsafe_set_state(clean)
        torch.cuda.synchronize()
        why = (f"it waits for the GPU (x.item(), int(x), x.cpu(), x.tolist(), torch.nonzero...)"
               if _waits_for_the_gpu(fn, calls[0]) else f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        warnings.warn(f"time_fn: a CUDA graph cannot hold {getattr(fn, '__name__', 'fn')}: {why}; timed "
                      f"without a graph, host work and launches included", stacklevel=3)
        return None


def _waits_for_the_gpu(fn: Callable, args: Sequence) -> bool:
    """Whether one call of fn(*args) makes the host wait for the GPU, by CUDA's sync debug mode."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn(*args)
        except RuntimeError as e:
            if "synchroniz" not in str(e):
                raise
            return True
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            torch.cuda.synchronize()
    return False


def _events(fn: Callable) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@dataclass
class Ceilings:
    device: str
    copy_gbps: float  # device-to-device copy, bytes read + written per second / 1e9
    matmul_tflops: float  # dense matmul in `dtype`

    def __str__(self) -> str:
        return f"{self.device}: copy {self.copy_gbps:,.0f} GB/s, matmul {self.matmul_tflops:,.1f} TFLOP/s"


_CEILINGS: dict = {}


def device_ceilings(dtype: torch.dtype | None = None, device: str | None = None) -> Ceilings:
    """Measure (once per process and device) the two ceilings every timing is compared with:
    a large copy (bytes read + written) and a large random matmul. device: this machine's GPU when it
    has one, unless 'cpu' (a CPU run on a GPU machine is held to the CPU's ceilings)."""
    dev = "cpu" if (device or default_device()) == "cpu" else "cuda"
    cuda = dev == "cuda"
    dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
    if (dev, dtype) in _CEILINGS:
        return _CEILINGS[dev, dtype]
    n_copy = (1 << 30) if cuda else (1 << 25)  # 2 GiB (bf16) on GPU, far beyond the L2
    src = torch.randn(n_copy, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    # no graph: inside a CUDA graph a plain copy becomes a copy-engine (DMA) node, about a third
    # slower than the SM copy kernel eager PyTorch launches; 2 ms calls need no graph anyway
    ms = time_fn(lambda: dst.copy_(src), rep=20, device=dev)
    copy_gbps = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
    del src, dst
    n = 8192 if cuda else 512
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    ms = time_fn(lambda: a @ b, rep=20, device=dev)
    c = Ceilings(describe_device(dev), copy_gbps, 2 * n ** 3 / (ms * 1e-3) / 1e12)
    _CEILINGS[dev, dtype] = c
    return c


@dataclass
class Point:
    name: str
    ms: float
    bytes: float
    flops: float

    @property
    def gbps(self) -> float:
        return self.bytes / (self.ms * 1e-3) / 1e9

    @property
    def tflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e12

    @property
    def intensity(self) -> float:
        return self.flops / max(self.bytes, 1)


BEATEN_FLOOR = 1.05  # a time this much under its floor is no timing noise: the bytes did not come from memory


def last_level_cache_bytes() -> int | None:
    """The size of this CPU's largest cache (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip().upper()
            sizes.append(int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0))
        except (OSError, ValueError):
            pass
    return max(sizes, default=None)


@dataclass
class Roofline:
    """Collect timed ops with the bytes they must move and FLOPs they must do; compare to the ceilings."""

    ceilings: Ceilings
    points: list[Point] = field(default_factory=list)

    def add(self, name: str, ms: float, bytes: float, flops: float = 0.0) -> Point:
        p = Point(name, ms, bytes, flops)
        self.points.append(p)
        return p

    def floor_ms(self, p: Point) -> float:
        """The larger of bytes / copy bandwidth and FLOPs / matmul rate."""
        c = self.ceilings
        return max(p.bytes / (c.copy_gbps * 1e9), p.flops / (c.matmul_tflops * 1e12)) * 1e3

    def table(self) -> str:
        rows = [f"{'op':<34}{'ms':>10}{'GB/s':>10}{'TFLOP/s':>10}{'floor ms':>10}{'% of floor':>11}"]
        for p in self.points:
            f = self.floor_ms(p)
            rows.append(f"{p.name:<34}{p.ms:>10.4f}{p.gbps:>10.0f}{p.tflops:>10.2f}{f:>10.4f}{100 * f / p.ms:>10.0f}%")
        llc = last_level_cache_bytes() if self.ceilings.device.startswith("cpu") else None
        beaten = [p for p in self.points if p.ms < self.floor_ms(p) / BEATEN_FLOOR and p.bytes <= (llc or 0)]
        if beaten:
            names = ", ".join(p.name for p in beaten)
            rows.append(f"(above 100%: {names}: their bytes (at most {readable_bytes(max(p.bytes for p in beaten))}) fit "
                        f"in this CPU's {readable_bytes(llc)} last-level cache, so each repeated run reads them from the "
                        f"cache, faster than memory; the floor assumes memory)")
        return "\n".join(rows)

    def plot(self, ax=None, title: str | None = None):
        """Log-log roofline: attainable TFLOP/s vs arithmetic intensity, one dot per op."""
        import matplotlib.pyplot as plt
        import numpy as np
        c = self.ceilings
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4.5))
        xs = np.logspace(-2, 4, 200)
        ax.plot(xs, np.minimum(xs * c.copy_gbps / 1e3, c.matmul_tflops), "k-", lw=1.5, label="measured ceiling")
        for p in self.points:
            x = max(p.intensity, 1e-2)
            ax.scatter([x], [max(p.tflops, 1e-6)], s=40, zorder=3)
            ax.annotate(p.name, (x, max(p.tflops, 1e-6)), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.set_title(title or f"Roofline on {c.device.split(' (')[0]}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        return ax
