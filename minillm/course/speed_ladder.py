"""Chapter 5's speed ladder (notebooks/05_engine_performance.ipynb): the levers the engine pulls at
batch 1, each one switchable, and a profile of the CUDA kernels a step runs, grouped by kind.

    with rung_settings(LADDER[2]):               # graphs on, chapter 2's torch layer, PDL off
        llm = LLM(model, **LADDER[2].engine_kwargs())
    prof = profile_kernels(lambda: llm.generate(...))
    print(prof.table(per=16))                    # kernels and microseconds per token, by class
    batch1_ablation(llm, prompt)                 # us per batch-1 step with pieces of attention taken out

The engine chooses each lever itself (`layer_forward_for`, `pdl_supported`, `async_scheduling`);
these switches only replace that choice while an engine is built and run, for a measurement.
Course material, not engine code (tests/gpu/profile_steps.py uses the profile too).
"""
from __future__ import annotations

import collections
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch

from minillm.engine import model_runner
from minillm.kernels import decode_b1
from minillm.kernels.gemv import pdl_supported
from minillm.models import qwen3
from minillm.timing import time_fn

# kernel class: substrings of the CUDA kernel names (lower case; the first class that matches wins)
KERNEL_CLASSES = [("attention", ("paged_decode", "decode_b1", "prefill_attention", "flash", "attention")),
                  ("gemv", ("gemv",)), ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas")),
                  ("norm", ("rms",)), ("qk_norm_rope", ("qk_norm_rope", "rotary", "rope")),
                  ("silu", ("silu",)), ("store_kv", ("store_kv",)), ("sample", ("sample",)),
                  ("embed", ("indexselect", "gather", "embedding")),
                  ("copy", ("memcpy", "memset", "copy", "fill"))]

# the engine's layer implementations (minillm/models/qwen3.py), from chapter 2's to the batch-1 path
LAYER_PATHS: dict[str, Callable] = {
    "torch": qwen3.eager_decoder_layer,  # chapter 2's decoder_layer (a one-token projection: the GEMV kernel)
    "fused": qwen3.decoder_layer_fused,  # add+RMSNorm, QK-norm+RoPE+KV store, SiLU-and-mul kernels
    "gemv": partial(qwen3.decoder_layer_fused_b1, attention_b1=False),  # GEMVs with norm / SiLU prologues
    "b1": partial(qwen3.decoder_layer_fused_b1, attention_b1=True),  # + QK-norm, RoPE, store, attention in one
}


def kernel_class(name: str) -> str:
    """'attention', 'gemm', 'gemv', 'norm', ... or 'other' for a CUDA kernel's name."""
    low = name.lower()
    return next((c for c, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


@dataclass
class KernelProfile:
    """The CUDA kernels one profiled call launched: name -> (launches, device microseconds)."""
    kernels: dict[str, tuple[int, float]]
    wall_s: float

    @property
    def count(self) -> int:
        return sum(n for n, _ in self.kernels.values())

    @property
    def busy_us(self) -> float:
        return sum(us for _, us in self.kernels.values())

    def by_class(self) -> dict[str, tuple[int, float]]:
        """class -> (launches, device microseconds), the most time first."""
        out: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        for name, (n, us) in self.kernels.items():
            out[kernel_class(name)][0] += n
            out[kernel_class(name)][1] += us
        return {c: (n, us) for c, (n, us) in sorted(out.items(), key=lambda kv: -kv[1][1])}

    def table(self, per: int = 1, floors_us: dict[str, float] | None = None, top: int = 0) -> str:
        """Launches and microseconds by class, divided by `per` (steps or tokens); with floors_us
        (class -> floor microseconds per `per`), each class's share of its floor; with top, the
        `top` kernels that took the most time."""
        floors_us = floors_us or {}
        lines = [f"{'class':<14}{'kernels':>9}{'us':>10}{'share':>7}   of its floor"]
        for c, (n, us) in self.by_class().items():
            share = f"{100 * floors_us[c] / (us / per):5.0f}% ({floors_us[c]:.1f} us)" if c in floors_us else ""
            lines.append(f"{c:<14}{n / per:9.1f}{us / per:10.1f}{100 * us / self.busy_us:6.1f}%   {share}")
        lines.append(f"{'all':<14}{self.count / per:9.1f}{self.busy_us / per:10.1f}")
        for name, (n, us) in sorted(self.kernels.items(), key=lambda kv: -kv[1][1])[:top]:
            lines.append(f"  {us / per:9.1f} us {n / per:6.1f}x  {name[:90]}")
        return "\n".join(lines)


def profile_kernels(fn: Callable[[], object]) -> KernelProfile:
    """Run fn() once under the torch profiler (CUDA activity) and collect its kernels, those that a
    CUDA graph replays included. Needs a CUDA device: on a CPU there are no kernels to count."""
    from torch.profiler import ProfilerActivity, profile
    if not torch.cuda.is_available():
        raise ValueError("profile_kernels needs a CUDA device; on a CPU time the call with minillm.timing instead")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name][0] += 1
            kernels[e.name][1] += e.device_time_total
    return KernelProfile({k: (n, us) for k, (n, us) in kernels.items()}, wall)


@contextlib.contextmanager
def layer_path(name: str) -> Iterator[None]:
    """Engines built inside run the decoder layer `name` (a key of LAYER_PATHS) instead of the one
    layer_forward_for would choose. The choice is made once, when an engine is built."""
    if name not in LAYER_PATHS:
        raise ValueError(f"layer path {name!r}: choose one of {', '.join(LAYER_PATHS)}")
    saved = model_runner.layer_forward_for
    model_runner.layer_forward_for = lambda *args, **kw: LAYER_PATHS[name]
    try:
        yield
    finally:
        model_runner.layer_forward_for = saved


@contextlib.contextmanager
def pdl(on: bool) -> Iterator[None]:
    """Programmatic dependent launch on or off (MINILLM_PDL) for every kernel launched or captured
    inside; a GPU without it (compute capability < 9.0) stays off either way."""
    saved = os.environ.get("MINILLM_PDL")
    os.environ["MINILLM_PDL"] = "1" if on else "0"
    pdl_supported.cache_clear()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MINILLM_PDL")
        else:
            os.environ["MINILLM_PDL"] = saved
        pdl_supported.cache_clear()


@dataclass(frozen=True)
class Rung:
    """One step of the batch-1 ladder: the engine's levers after this optimisation."""
    name: str
    cuda_graphs: bool
    layer: str  # a key of LAYER_PATHS
    pdl: bool
    async_scheduling: bool

    def engine_kwargs(self) -> dict:
        return dict(enforce_eager=not self.cuda_graphs, async_scheduling=self.async_scheduling)


# each rung adds one lever to the one before it; the last is the engine as it ships (on CUDA, TP=1, triton)
LADDER = [Rung("eager, chapter 2's layer", False, "torch", False, False),
          Rung("+ CUDA graphs", True, "torch", False, False),
          Rung("+ fused norm/RoPE/SiLU kernels", True, "fused", False, False),
          Rung("+ GEMVs with norm/SiLU prologues", True, "gemv", False, False),
          Rung("+ one-kernel attention (decode_b1)", True, "b1", False, False),
          Rung("+ programmatic dependent launch", True, "b1", True, False),
          Rung("+ async scheduling", True, "b1", True, True)]


@contextlib.contextmanager
def rung_settings(rung: Rung) -> Iterator[None]:
    """The rung's layer path and PDL switch, for building and running an engine inside."""
    with layer_path(rung.layer), pdl(rung.pdl):
        yield


# ---- what is left at batch 1: take pieces out of the captured step ---------------------------------
class _NoLaunch:
    """Stands in for a Triton kernel: indexing it by a grid gives a launch that does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _no_attention(qkv, positions, cos_sin, q_weight, k_weight, eps, k_cache, v_cache, slot_mapping, block_tables,
                  context_lens, scale, num_heads, num_kv_heads, head_dim, num_splits=None) -> torch.Tensor:
    """decode_attention_b1's signature and output shape, with no kernel at all (torch.empty launches
    none): the layer goes from qkv_proj straight to o_proj."""
    return torch.empty(1, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)


# label -> the module attributes replaced while that variant's graph is captured. Every variant but the
# first computes a wrong token: it only times what the step costs without the piece.
ABLATIONS: dict[str, dict[tuple[object, str], object]] = {
    "the engine's step": {},
    "attention without PDL": {(decode_b1, "pdl_args"): lambda device: {"USE_PDL": False}},
    "no split merge (wrong output)": {(decode_b1, "paged_decode_combine_kernel"): _NoLaunch()},
    "no attention (wrong output)": {(qwen3, "decode_attention_b1"): _no_attention},
}


@contextlib.contextmanager
def _replaced(attrs: dict[tuple[object, str], object]) -> Iterator[None]:
    saved = {key: getattr(*key) for key in attrs}
    for (obj, name), value in attrs.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for (obj, name), value in saved.items():
            setattr(obj, name, value)


def batch1_ablation(llm, prompt: list[int], n_tokens: int = 256) -> dict[str, float]:
    """Microseconds per batch-1 decode step with pieces of the attention taken out (ABLATIONS).

    Decodes n_tokens of `prompt` first, so the batch-1 CUDA graph's inputs hold that request's last
    step (context len(prompt) + n_tokens); then, for each variant, captures the batch-1 step again
    with the variant's replacements and times its replays. The engine's own graphs are left as they
    were (it generates the same tokens afterwards). Needs a CUDA engine with CUDA graphs and the
    batch-1 attention kernel (TP=1, the triton backend)."""
    from minillm import SamplingParams
    from minillm.context import reset_context
    graphs = llm.engine.model_runner.graphs
    if graphs is None or not torch.cuda.is_available():
        raise ValueError("batch1_ablation times CUDA-graph replays: build the engine on a CUDA device "
                         "without enforce_eager")
    layer = llm.engine.model_runner.model.model.layers[0].layer_forward
    b1_path = isinstance(layer, partial) and layer.func is qwen3.decoder_layer_fused_b1
    if not (b1_path and layer.keywords["attention_b1"]):
        raise ValueError("batch1_ablation takes pieces out of the batch-1 attention kernel's path: build the engine "
                         "with tensor_parallel_size=1 and attention_backend='triton'")
    llm.generate(prompt, SamplingParams(max_tokens=n_tokens, ignore_eos=True), use_tqdm=False)
    kept_logits = graphs.logits[1]  # capturing again re-points it: the engine's graph writes this one
    out = {}
    try:
        for label, attrs in ABLATIONS.items():
            with _replaced(attrs):
                graphs._set_context(1)
                graphs._forward(1)  # compiles what the variant launches, outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, graphs.pool):
                    graphs._forward(1)
                reset_context()
            out[label] = 1e3 * time_fn(graph.replay, warmup=20)  # us per replay, median of CUDA-event timings
            del graph
    finally:
        graphs.logits[1] = kept_logits
        reset_context()
    return out
