"""Batch-1 decode on one H200: how far programmatic dependent launch (PDL) runs ahead, whether staging
the GEMVs' weights in shared memory that far ahead pays, and the GEMV launch shapes of the engine's
step. docs/performance.md ("Running further ahead") quotes these runs.

    source tests/gpu/env.sh && python tests/gpu/batch1_probes.py cascade staged configs persistent

* cascade: 12 kernels in a CUDA graph, each launched with PDL, each CTA stamping (with %globaltimer)
  when it starts, when gdc_wait() releases it and when it ends (a 3 us spin). How many kernels have
  started before a given one ends: the depth PDL runs ahead, at three grid sizes.
* staged: the 112 GEMVs of a step (28 layers of Qwen3-0.6B's shapes, the engine's prologues: add+RMSNorm
  before qkv_proj and gate_up_proj, SiLU-and-mul before down_proj, no attention), in a CUDA graph:
  the engine's kernels against a Gluon GEMV that copies its whole weight slab into shared memory with
  cp.async *before* gdc_wait(), so later kernels hold their weights on chip while earlier ones run.
  Then one staged chain again with every CTA stamping start, release, weights landed and end.
* configs: the engine's batch-1 step (qwen3-0.6b-random, the bench's 128-token prompt then 256 and
  3,800 decode tokens) captured again with each GEMV launch shape of CONFIG_PLANS, two interleaved
  rounds of replays; the logits compared to the bit with the engine's.
* persistent: the same 112 GEMVs (no prologues) as the engine's GEMV kernels chained with PDL, against
  one persistent kernel of 128 programs with a grid barrier between GEMVs, the next GEMV's weights
  loaded into registers before the barrier's arrive, between its arrive and its wait, two GEMVs ahead,
  or not at all; then a Gluon form with the slabs copied (cp.async) into shared memory a layer ahead,
  with the one-counter barrier or with a flag a program.
* tma: the staged form with the slabs copied by the Tensor Memory Accelerator (bulk copies one thread
  issues, completing on an mbarrier) instead of cp.async; then the same kernel without its grid barrier
  (the weights streamed and the dots done, the outputs wrong: what the memory side alone takes) and
  without its weight copies after the first layer (the barriers and dots alone: the chain's latency); then
  one replay with every program stamping, each GEMV, when its weights were ready, its arrive and its
  release (stamp_report: where a GEMV's time goes).
"""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from minillm.kernels import gemv as G
from minillm.timing import device_ceilings, time_fn

DEV, DT = "cuda", torch.bfloat16
SPIN_NS = 3000  # cascade: each kernel's work after its release
LAYERS = 28
SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # qkv, o, gate_up, down: (N, K)
NAMES = ["qkv", "o", "gate_up", "down"]
NONE, RMSNORM, ADD_RMSNORM, SILU_MUL = G.NONE, G.RMSNORM, G.ADD_RMSNORM, G.SILU_MUL
STAGED_PLANS = {  # (BLOCK_N, num_warps) per shape of SHAPES
    "16 rows, 4 warps; down 8 warps": [(16, 4), (8, 4), (16, 4), (8, 8)],
    "16 rows, 8 warps": [(16, 8)] * 4,
    "32/8/32/8 rows, 8 warps": [(32, 8), (8, 8), (32, 8), (8, 8)],
    "32/16/32/16 rows, 8 warps": [(32, 8), (16, 8), (32, 8), (16, 8)],
}
CONFIG_PLANS = {  # the engine's GEMV (BLOCK_N, num_warps) per shape of SHAPES
    "8 rows (the rule before 2026-12-03)": [(8, 4), (8, 8), (8, 4), (4, 8)],
    "16 rows for 1k-long rows (the rule now)": [(16, 4), (8, 8), (16, 4), (4, 8)],
    "16 rows everywhere, 8 for down": [(16, 4), (16, 8), (16, 4), (8, 8)],
    "16 rows but gate_up 8": [(16, 4), (16, 8), (8, 4), (8, 8)],
    "8 rows, 2/4 warps": [(8, 2), (8, 4), (8, 2), (4, 4)],
}


def graph_us(fn) -> float:
    """Microseconds per replay of fn captured in a CUDA graph (median of CUDA-event timings)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return 1e3 * time_fn(g.replay, warmup=10)


# ------------------------------------------------------------------------------------------------ cascade
@triton.jit
def _stamp_kernel(buf, i, SPIN: tl.constexpr):
    t0 = tl.extra.cuda.globaltimer()
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()
    t1 = tl.extra.cuda.globaltimer()
    t = t1
    while t - t1 < SPIN:
        t = tl.extra.cuda.globaltimer()
    base = buf + (i * tl.num_programs(0) + tl.program_id(0)) * 3
    tl.store(base, t0)
    tl.store(base + 1, t1)
    tl.store(base + 2, t)


def cascade(n: int = 12) -> None:
    print("== cascade: kernels launched with PDL, each spinning 3 us after its release")
    for ctas, warps in ((132, 1), (264, 4), (1024, 4)):
        buf = torch.zeros(n, ctas, 3, dtype=torch.int64, device=DEV)

        def run(ctas=ctas, buf=buf, warps=warps):
            for i in range(n):
                _stamp_kernel[(ctas,)](buf, i, SPIN=SPIN_NS, num_warps=warps, launch_pdl=True)
        run()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        g.replay()
        torch.cuda.synchronize()
        b = buf.cpu().double()
        b -= b[0, :, 0].min()
        ahead = [sum(1 for j in range(i + 1, n) if b[j, :, 0].min() < b[i, :, 2].max()) for i in range(n)]
        gaps = [(b[i + 1, :, 1].min() - b[i, :, 2].max()).item() / 1e3 for i in range(n - 1)]
        print(f"  {ctas} CTAs of {warps} warp(s): kernel 12 started {b[-1, :, 0].min() / 1e3:.2f} us into the chain "
              f"(the first ended at {b[0, :, 2].max() / 1e3:.2f}); kernels started before the first ended: {ahead[0]}, "
              f"most ahead of any: {max(ahead)}; release after the kernel before ends: "
              f"{sum(gaps) / len(gaps):.2f} us on average")


# ------------------------------------------------------------------------------------------------ staged
@gluon.jit
def _asm_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _asm_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _asm_timer():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _staged_input(x_ptr, r_ptr, r_out_ptr, pid, cols, K: gl.constexpr, PROLOGUE: gl.constexpr):
    """The GEMV's input at columns cols, rounded as the engine's prologues round it (before the RMS)."""
    dtype = x_ptr.dtype.element_ty
    if PROLOGUE == 3:  # SiLU-and-mul: x_ptr holds [gate | up]
        gate = gl.load(x_ptr + cols).to(gl.float32)
        up = gl.load(x_ptr + K + cols).to(gl.float32)
        x = ((gate / (1.0 + gl.exp(-gate))).to(dtype).to(gl.float32) * up).to(dtype).to(gl.float32)
    else:
        x = gl.load(x_ptr + cols).to(gl.float32)
    if PROLOGUE == 2:  # residual add
        x = (x + gl.load(r_ptr + cols).to(gl.float32)).to(dtype).to(gl.float32)
        gl.store(r_out_ptr + cols, x.to(dtype), mask=(cols < K) & (pid == 0))
    return x


@gluon.jit
def _staged_norm(x, nw_ptr, cols, rstd, dtype):
    nw = gl.load(nw_ptr + cols).to(gl.float32)
    return ((x * rstd).to(dtype).to(gl.float32) * nw).to(dtype).to(gl.float32)


@gluon.jit
def _staged_gemv_kernel(x_ptr, r_ptr, nw_ptr, r_out_ptr, w_ptr, y_ptr, stamp_ptr, N, eps,
                        K: gl.constexpr, K1: gl.constexpr, K2: gl.constexpr, PROLOGUE: gl.constexpr,
                        BLOCK_N: gl.constexpr, STAMP: gl.constexpr, num_warps: gl.constexpr):
    """y[1, N] = prologue(x) @ W[N, K]^T; the program's [BLOCK_N, K] slab of W goes to shared memory by
    cp.async before gdc_wait(). K = K1 + K2, two powers of two (K2 may be 0: 3072 = 2048 + 1024)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])  # a warp per row
    smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    pid = gl.program_id(0)
    if STAMP:
        t0 = _asm_timer()
    rows = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    c1 = gl.arange(0, K1, layout=gl.SliceLayout(0, layout))
    in_rows = (rows < N)[:, None]
    w_rows = w_ptr + rows.to(gl.int64)[:, None] * K
    s1 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, K1], smem)
    async_copy.async_copy_global_to_shared(s1, w_rows + c1[None, :], mask=in_rows & (c1 < K1)[None, :])
    if K2 > 0:
        c2 = K1 + gl.arange(0, K2, layout=gl.SliceLayout(0, layout))
        s2 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, K2], smem)
        async_copy.async_copy_global_to_shared(s2, w_rows + c2[None, :], mask=in_rows & (c2 < K)[None, :])
    async_copy.commit_group()
    _asm_launch_dependents()
    _asm_wait()
    if STAMP:
        t1 = _asm_timer()
    dtype = y_ptr.dtype.element_ty
    x1 = _staged_input(x_ptr, r_ptr, r_out_ptr, pid, c1, K, PROLOGUE)
    if K2 > 0:
        x2 = _staged_input(x_ptr, r_ptr, r_out_ptr, pid, c2, K, PROLOGUE)
    if PROLOGUE == 1 or PROLOGUE == 2:
        ss = gl.sum(x1 * x1, axis=0)
        if K2 > 0:
            ss += gl.sum(x2 * x2, axis=0)
        rstd = gl.rsqrt(ss / K + eps)
        x1 = _staged_norm(x1, nw_ptr, c1, rstd, dtype)
        if K2 > 0:
            x2 = _staged_norm(x2, nw_ptr, c2, rstd, dtype)
    async_copy.wait_group(0)
    if STAMP:
        t2 = _asm_timer()
    for g in gl.static_range(BLOCK_N // num_warps):  # num_warps rows at a time, each warp one row
        acc = gl.sum(s1.slice(g * num_warps, num_warps, dim=0).load(layout).to(gl.float32) * x1[None, :], axis=1)
        if K2 > 0:
            acc += gl.sum(s2.slice(g * num_warps, num_warps, dim=0).load(layout).to(gl.float32) * x2[None, :], axis=1)
        r = pid * BLOCK_N + g * num_warps + gl.arange(0, num_warps, layout=gl.SliceLayout(1, layout))
        gl.store(y_ptr + r, acc.to(dtype), mask=r < N)
    if STAMP:
        t3 = _asm_timer()
        sp = stamp_ptr + pid * 4
        gl.store(sp, t0)
        gl.store(sp + 1, t1)
        gl.store(sp + 2, t2)
        gl.store(sp + 3, t3)


def staged_gemv(x, weight, prologue=NONE, residual=None, norm_weight=None, eps=0.0, config=(16, 4), stamps=None):
    """The engine's _launch for batch 1, with the staged kernel: -> (y [1, N], the new residual or None)."""
    n, k = weight.shape
    k1 = 1 << (k.bit_length() - 1)
    block_n, warps = config
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    r_out = torch.empty(1, k, dtype=x.dtype, device=x.device) if prologue == ADD_RMSNORM else None
    _staged_gemv_kernel[(triton.cdiv(n, block_n),)](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else x,
        r_out if r_out is not None else y, weight, y, stamps if stamps is not None else y, n, eps, K=k, K1=k1,
        K2=k - k1, PROLOGUE=prologue, BLOCK_N=block_n, STAMP=stamps is not None, num_warps=warps, launch_pdl=True)
    return y, r_out


def staged() -> None:
    torch.manual_seed(0)
    bw = device_ceilings().copy_gbps
    layers = [{"w": [torch.randn(n, k, device=DEV, dtype=DT) * k ** -0.5 for n, k in SHAPES],
               "n1": torch.rand(1024, device=DEV, dtype=DT) + 0.5, "n2": torch.rand(1024, device=DEV, dtype=DT) + 0.5}
              for _ in range(LAYERS)]
    floor = sum(w.numel() * 2 for L in layers for w in L["w"]) / bw / 1e3
    h0 = torch.randn(1, 1024, device=DEV, dtype=DT)

    def engine_chain():
        h, r = h0, None
        for L in layers:
            qkv, r = G.gemv_rms_norm(h, L["n1"], 1e-6, L["w"][0], None, r)
            a = G.gemv(qkv[:, :2048], L["w"][1])
            gu, r = G.gemv_rms_norm(a, L["n2"], 1e-6, L["w"][2], None, r)
            h = G.gemv_silu_mul(gu, L["w"][3])
        return h

    def staged_chain(plan, stamps=None):
        def run():
            h, r = h0, None
            for i, L in enumerate(layers):
                st = (lambda j: None) if stamps is None else (lambda j, i=i: stamps[4 * i + j])
                qkv, r_new = staged_gemv(h, L["w"][0], RMSNORM if r is None else ADD_RMSNORM, r, L["n1"], 1e-6,
                                         plan[0], st(0))
                r = h if r is None else r_new
                a, _ = staged_gemv(qkv[:, :2048], L["w"][1], config=plan[1], stamps=st(1))
                gu, r = staged_gemv(a, L["w"][2], ADD_RMSNORM, r, L["n2"], 1e-6, plan[2], st(2))
                h, _ = staged_gemv(gu, L["w"][3], SILU_MUL, config=plan[3], stamps=st(3))
            return h
        return run

    print(f"== staged: 112 GEMVs with the engine's prologues, no attention; weights {floor * bw / 1e3:.0f} MB, "
          f"floor {floor:.1f} us at {bw:,.0f} GB/s")
    want = engine_chain().float()
    t = graph_us(engine_chain)
    print(f"  the engine's GEMVs                    {t:7.1f} us  {100 * floor / t:5.1f}% of the floor")
    for label, plan in STAGED_PLANS.items():
        diff = (staged_chain(plan)().float() - want).abs().max().item()
        t = graph_us(staged_chain(plan))
        print(f"  staged, {label:30s} {t:7.1f} us  {100 * floor / t:5.1f}%   max |output - engine's| {diff:.3g}")
    plan = next(iter(STAGED_PLANS.values()))
    stamps = [torch.zeros(triton.cdiv(SHAPES[j % 4][0], plan[j % 4][0]), 4, dtype=torch.int64, device=DEV)
              for j in range(4 * LAYERS)]
    staged_chain(plan, stamps)()
    graph_us(staged_chain(plan, stamps))
    print(f"  staged ({next(iter(STAGED_PLANS))}), stamped; per kernel, mean of layers 1-27 in us: started ahead "
          "of the kernel before's end | release after it | weights landed after release | release to end")
    for j, name in enumerate(NAMES):
        rows = []
        for i in range(4 + j, 4 * LAYERS, 4):
            s, p = stamps[i].cpu().double() / 1e3, stamps[i - 1].cpu().double() / 1e3
            release = s[:, 1].min()
            rows.append((p[:, 3].max() - s[:, 0].min(), release - p[:, 3].max(),
                         max(0.0, s[:, 2].max() - release), s[:, 3].max() - release))
        print(f"    {name:8s} " + " ".join(f"{sum(r[c] for r in rows) / len(rows):8.2f}" for c in range(4)))


# ------------------------------------------------------------------------------------------------ configs
def configs() -> None:
    from minillm import LLM, SamplingParams
    from minillm.bench import BATCH1_PROMPT
    from minillm.context import reset_context
    llm = LLM("qwen3-0.6b-random", max_model_len=4096)
    graphs = llm.engine.model_runner.graphs
    for n_tokens in (256, 3800):
        llm.generate([BATCH1_PROMPT], SamplingParams(max_tokens=n_tokens, ignore_eos=True), use_tqdm=False)
        kept, ref, times = graphs.logits[1], None, {label: [] for label in CONFIG_PLANS}
        try:
            for _ in range(2):
                for label, plan in CONFIG_PLANS.items():
                    G.GEMV_CONFIGS.clear()
                    G.GEMV_CONFIGS.update(zip(SHAPES, plan))
                    graphs._set_context(1)
                    graphs._forward(1)  # compiles outside the capture
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, graphs.pool):
                        graphs._forward(1)
                    reset_context()
                    times[label].append(1e3 * time_fn(g.replay, warmup=20))
                    g.replay()
                    logits = graphs.logits[1].float().clone()
                    ref = logits if ref is None else ref
                    if not torch.equal(logits, ref):
                        print(f"  {label}: logits differ from the first plan's by {(logits - ref).abs().max():.3g}")
                    del g
        finally:
            G.GEMV_CONFIGS.clear()
            graphs.logits[1] = kept
            reset_context()
        print(f"== configs: the batch-1 step at a {len(BATCH1_PROMPT) + n_tokens}-token context, us per replay "
              "(two rounds)")
        for label, ts in times.items():
            print(f"  {label:42s} " + " ".join(f"{t:7.1f}" for t in ts))


# ------------------------------------------------------------------------------------------------ persistent
# where a program loads the next phase's weights (literals in the kernel); TWO_AHEAD: the phase after next,
# between arrive and wait (two phases' weights in flight)
NO_PREFETCH, BEFORE_ARRIVE, AFTER_ARRIVE, TWO_AHEAD = 0, 1, 2, 3


@triton.jit
def _tile(w_ptr, row0, n_rows: tl.constexpr, col0, n_cols: tl.constexpr, K: tl.constexpr):
    """[n_rows, n_cols] of a row-major [N, K] weight from (row0, col0): always in bounds here."""
    rows = row0 + tl.arange(0, n_rows)
    return tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + col0 + tl.arange(0, n_cols)[None, :])


@triton.jit
def _rows_dot(w, x_ptr, col0, n_cols: tl.constexpr):
    x = tl.load(x_ptr + col0 + tl.arange(0, n_cols)).to(tl.float32)
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1)


@triton.jit
def _store_rows(y_ptr, row0, acc, n_rows: tl.constexpr):
    tl.store(y_ptr + row0 + tl.arange(0, n_rows), acc.to(tl.bfloat16))


@triton.jit
def _arrive(count_ptr):
    tl.debug_barrier()  # every thread's stores of this phase come before the release
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(count_ptr, target):
    c = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    while c < target:
        c = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _persistent_chain_kernel(w_qkv, w_o, w_gu, w_d, y_qkv, y_o, y_gu, y_d, count_ptr, n_layers,
                             PREFETCH: tl.constexpr):
    """The 112 GEMVs of a batch-1 step (Qwen3-0.6B's shapes; each GEMV's input the first K outputs of
    the one before) in one kernel of 128 programs, a grid barrier between GEMVs: qkv 32 rows a program,
    o_proj 8 rows of 2,048, gate_up 48 rows (32 + 16), down 8 rows of 3,072 (2,048 + 1,024 columns)."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    S_QKV: tl.constexpr = 4096 * 1024
    S_O: tl.constexpr = 1024 * 2048
    S_GU: tl.constexpr = 6144 * 1024
    S_D: tl.constexpr = 1024 * 3072
    wq = _tile(w_qkv, pid * 32, 32, 0, 1024, 1024)
    if PREFETCH == 3:
        wo = _tile(w_o, pid * 8, 8, 0, 2048, 2048)
    phase = 0
    for layer in range(n_layers):
        lq, lo, lg, ld = w_qkv + layer * S_QKV, w_o + layer * S_O, w_gu + layer * S_GU, w_d + layer * S_D
        if PREFETCH == 0:
            wq = _tile(lq, pid * 32, 32, 0, 1024, 1024)
        _store_rows(y_qkv, pid * 32, _rows_dot(wq, y_d, 0, 1024), 32)
        # ---- o_proj
        if PREFETCH == 1:
            wo = _tile(lo, pid * 8, 8, 0, 2048, 2048)
        _arrive(count_ptr)
        if PREFETCH == 2:
            wo = _tile(lo, pid * 8, 8, 0, 2048, 2048)
        if PREFETCH == 3:
            wg1 = _tile(lg, pid * 48, 32, 0, 1024, 1024)
            wg2 = _tile(lg, pid * 48 + 32, 16, 0, 1024, 1024)
        phase += 1
        _wait(count_ptr, phase * G)
        if PREFETCH == 0:
            wo = _tile(lo, pid * 8, 8, 0, 2048, 2048)
        _store_rows(y_o, pid * 8, _rows_dot(wo, y_qkv, 0, 2048), 8)
        # ---- gate_up
        if PREFETCH == 1:
            wg1 = _tile(lg, pid * 48, 32, 0, 1024, 1024)
            wg2 = _tile(lg, pid * 48 + 32, 16, 0, 1024, 1024)
        _arrive(count_ptr)
        if PREFETCH == 2:
            wg1 = _tile(lg, pid * 48, 32, 0, 1024, 1024)
            wg2 = _tile(lg, pid * 48 + 32, 16, 0, 1024, 1024)
        if PREFETCH == 3:
            wd1 = _tile(ld, pid * 8, 8, 0, 2048, 3072)
            wd2 = _tile(ld, pid * 8, 8, 2048, 1024, 3072)
        phase += 1
        _wait(count_ptr, phase * G)
        if PREFETCH == 0:
            wg1 = _tile(lg, pid * 48, 32, 0, 1024, 1024)
            wg2 = _tile(lg, pid * 48 + 32, 16, 0, 1024, 1024)
        _store_rows(y_gu, pid * 48, _rows_dot(wg1, y_o, 0, 1024), 32)
        _store_rows(y_gu, pid * 48 + 32, _rows_dot(wg2, y_o, 0, 1024), 16)
        # ---- down
        nq = w_qkv + tl.minimum(layer + 1, n_layers - 1) * S_QKV  # the last layer loads its own again
        no = w_o + tl.minimum(layer + 1, n_layers - 1) * S_O
        if PREFETCH == 1:
            wd1 = _tile(ld, pid * 8, 8, 0, 2048, 3072)
            wd2 = _tile(ld, pid * 8, 8, 2048, 1024, 3072)
        _arrive(count_ptr)
        if PREFETCH == 2:
            wd1 = _tile(ld, pid * 8, 8, 0, 2048, 3072)
            wd2 = _tile(ld, pid * 8, 8, 2048, 1024, 3072)
        if PREFETCH == 3:
            wq = _tile(nq, pid * 32, 32, 0, 1024, 1024)
        phase += 1
        _wait(count_ptr, phase * G)
        if PREFETCH == 0:
            wd1 = _tile(ld, pid * 8, 8, 0, 2048, 3072)
            wd2 = _tile(ld, pid * 8, 8, 2048, 1024, 3072)
        _store_rows(y_d, pid * 8, _rows_dot(wd1, y_gu, 0, 2048) + _rows_dot(wd2, y_gu, 2048, 1024), 8)
        # ---- the next layer's qkv
        if PREFETCH == 1:
            wq = _tile(nq, pid * 32, 32, 0, 1024, 1024)
        _arrive(count_ptr)
        if PREFETCH == 2:
            wq = _tile(nq, pid * 32, 32, 0, 1024, 1024)
        if PREFETCH == 3:
            wo = _tile(no, pid * 8, 8, 0, 2048, 2048)
        phase += 1
        _wait(count_ptr, phase * G)


@gluon.jit
def _slab_copy(buf, w_ptr, row0, N_ROWS: gl.constexpr, col0, N_COLS: gl.constexpr, K: gl.constexpr,
               layout: gl.constexpr):
    """cp.async of W[row0 : row0 + N_ROWS, col0 : col0 + N_COLS] (row-major, K columns) into buf."""
    rows = row0 + gl.arange(0, N_ROWS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, N_COLS, layout=gl.SliceLayout(0, layout))
    async_copy.async_copy_global_to_shared(buf, w_ptr + rows.to(gl.int64)[:, None] * K + cols[None, :])


@gluon.jit
def _slab_rows(buf, g: gl.constexpr, layout: gl.constexpr, num_warps: gl.constexpr):
    """Rows [g * num_warps, (g + 1) * num_warps) of the slab in buf (a warp a row), in fp32. (The dot
    products are summed in the kernel itself: a reduction in a helper has no warp count in 3.6.)"""
    return buf.slice(g * num_warps, num_warps, dim=0).load(layout).to(gl.float32)


@gluon.jit
def _x_part(x_ptr, col0, N_COLS: gl.constexpr, layout: gl.constexpr):
    return gl.load(x_ptr + col0 + gl.arange(0, N_COLS, layout=gl.SliceLayout(0, layout))).to(gl.float32)


@gluon.jit
def _row_store(y_ptr, row0, acc, layout: gl.constexpr, num_warps: gl.constexpr):
    gl.store(y_ptr + row0 + gl.arange(0, num_warps, layout=gl.SliceLayout(1, layout)), acc.to(gl.bfloat16))


@gluon.jit
def _grid_arrive(count_ptr):
    gl.thread_barrier()  # every thread's stores of this phase come before the release
    gl.atomic_add(count_ptr, 1, sem="release", scope="gpu")


@gluon.jit
def _grid_wait(count_ptr, target):
    c = gl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    while c < target:
        c = gl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _asm_fence():
    gl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _sync_arrive(count_ptr, phase, FLAGS: gl.constexpr):
    """The grid barrier after `phase`, first half. FLAGS: each program writes phase to its own flag
    (count_ptr[pid]: no two programs on one address); else one counter every program adds 1 to."""
    if FLAGS:
        gl.thread_barrier()
        gl.atomic_xchg(count_ptr + gl.program_id(0), phase, sem="release", scope="gpu")
    else:
        _grid_arrive(count_ptr)


@gluon.jit
def _sync_wait(count_ptr, phase, G, FLAGS: gl.constexpr, num_warps: gl.constexpr):
    """The second half: FLAGS polls the 128 flags (volatile loads, then a fence), else the counter."""
    if FLAGS:
        offs = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
        f = gl.load(count_ptr + offs, volatile=True)
        while gl.min(f, axis=0) < phase:
            f = gl.load(count_ptr + offs, volatile=True)
        _asm_fence()
        gl.thread_barrier()
    else:
        _grid_wait(count_ptr, phase * G)


@gluon.jit
def _staged_chain_kernel(w_qkv, w_o, w_gu, w_d, y_qkv, y_o, y_gu, y_d, count_ptr, n_layers,
                         num_warps: gl.constexpr, FLAGS: gl.constexpr = False):
    """_persistent_chain_kernel's GEMVs (the same rows a program) with the qkv, gate_up and down slabs
    in shared memory, each copied (cp.async) a whole layer ahead: right after the program used that
    slab's buffer for this layer. o_proj's slab goes to registers between arrive and wait, as there.
    208 KB of shared memory a program; copies complete in the order issued, so before each GEMV
    wait_group(2) leaves the two copies issued after its own in flight; every copy is issued between
    a barrier's arrive and its wait. FLAGS: the barrier of _sync_arrive/_sync_wait."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])  # a warp per row
    smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    S_QKV: gl.constexpr = 4096 * 1024
    S_O: gl.constexpr = 1024 * 2048
    S_GU: gl.constexpr = 6144 * 1024
    S_D: gl.constexpr = 1024 * 3072
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    sq = gl.allocate_shared_memory(gl.bfloat16, [32, 1024], smem)
    sg1 = gl.allocate_shared_memory(gl.bfloat16, [32, 1024], smem)
    sg2 = gl.allocate_shared_memory(gl.bfloat16, [16, 1024], smem)
    sd1 = gl.allocate_shared_memory(gl.bfloat16, [8, 2048], smem)
    sd2 = gl.allocate_shared_memory(gl.bfloat16, [8, 1024], smem)
    _slab_copy(sq, w_qkv, pid * 32, 32, 0, 1024, 1024, layout)
    async_copy.commit_group()
    _slab_copy(sg1, w_gu, pid * 48, 32, 0, 1024, 1024, layout)
    _slab_copy(sg2, w_gu, pid * 48 + 32, 16, 0, 1024, 1024, layout)
    async_copy.commit_group()
    _slab_copy(sd1, w_d, pid * 8, 8, 0, 2048, 3072, layout)
    _slab_copy(sd2, w_d, pid * 8, 8, 2048, 1024, 3072, layout)
    async_copy.commit_group()
    o_rows = pid * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, layout))
    o_cols = gl.arange(0, 2048, layout=gl.SliceLayout(0, layout))
    o_offs = o_rows.to(gl.int64)[:, None] * 2048 + o_cols[None, :]
    wo = gl.load(w_o + o_offs)
    phase = 0
    for layer in range(n_layers):
        nxt = gl.minimum(layer + 1, n_layers - 1)  # the last layer copies its own slabs again
        # ---- qkv_proj
        async_copy.wait_group(2)
        gl.thread_barrier()
        x = _x_part(y_d, 0, 1024, layout)
        for g in gl.static_range(32 // num_warps):
            acc = gl.sum(_slab_rows(sq, g, layout, num_warps) * x[None, :], axis=1)
            _row_store(y_qkv, pid * 32 + g * num_warps, acc, layout, num_warps)
        phase += 1
        _sync_arrive(count_ptr, phase, FLAGS)
        _slab_copy(sq, w_qkv + nxt * S_QKV, pid * 32, 32, 0, 1024, 1024, layout)
        async_copy.commit_group()
        _sync_wait(count_ptr, phase, G, FLAGS, num_warps)
        # ---- o_proj, from registers
        x = _x_part(y_qkv, 0, 2048, layout)
        _row_store(y_o, pid * 8, gl.sum(wo.to(gl.float32) * x[None, :], axis=1), layout, num_warps)
        phase += 1
        _sync_arrive(count_ptr, phase, FLAGS)
        wo = gl.load(w_o + nxt * S_O + o_offs)
        _sync_wait(count_ptr, phase, G, FLAGS, num_warps)
        # ---- gate_up_proj
        async_copy.wait_group(2)
        gl.thread_barrier()
        x = _x_part(y_o, 0, 1024, layout)
        for g in gl.static_range(32 // num_warps):
            acc = gl.sum(_slab_rows(sg1, g, layout, num_warps) * x[None, :], axis=1)
            _row_store(y_gu, pid * 48 + g * num_warps, acc, layout, num_warps)
        for g in gl.static_range(16 // num_warps):
            acc = gl.sum(_slab_rows(sg2, g, layout, num_warps) * x[None, :], axis=1)
            _row_store(y_gu, pid * 48 + 32 + g * num_warps, acc, layout, num_warps)
        phase += 1
        _sync_arrive(count_ptr, phase, FLAGS)
        _slab_copy(sg1, w_gu + nxt * S_GU, pid * 48, 32, 0, 1024, 1024, layout)
        _slab_copy(sg2, w_gu + nxt * S_GU, pid * 48 + 32, 16, 0, 1024, 1024, layout)
        async_copy.commit_group()
        _sync_wait(count_ptr, phase, G, FLAGS, num_warps)
        # ---- down_proj
        async_copy.wait_group(2)
        gl.thread_barrier()
        x1 = _x_part(y_gu, 0, 2048, layout)
        x2 = _x_part(y_gu, 2048, 1024, layout)
        for g in gl.static_range(8 // num_warps):
            acc = gl.sum(_slab_rows(sd1, g, layout, num_warps) * x1[None, :], axis=1) + gl.sum(
                _slab_rows(sd2, g, layout, num_warps) * x2[None, :], axis=1)
            _row_store(y_d, pid * 8 + g * num_warps, acc, layout, num_warps)
        phase += 1
        _sync_arrive(count_ptr, phase, FLAGS)
        _slab_copy(sd1, w_d + nxt * S_D, pid * 8, 8, 0, 2048, 3072, layout)
        _slab_copy(sd2, w_d + nxt * S_D, pid * 8, 8, 2048, 1024, 3072, layout)
        async_copy.commit_group()
        _sync_wait(count_ptr, phase, G, FLAGS, num_warps)
    async_copy.wait_group(0)


def chain_case():
    """The 112 GEMVs' case: (layers, shapes, weights [L, N, K] by name, copy GB/s, floor us, input x0, output
    buffers, a zeroed barrier counter, chain: the engine's GEMV kernels run over it, PDL-chained)."""
    L = LAYERS
    g = torch.Generator(device=DEV).manual_seed(0)
    shapes = dict(zip(NAMES, SHAPES))
    w = {n: (torch.randn(L, N, K, device=DEV, generator=g) / K ** 0.5).to(DT) for n, (N, K) in shapes.items()}
    bw = device_ceilings().copy_gbps
    floor = sum(t.numel() * 2 for t in w.values()) / bw / 1e3
    x0 = torch.randn(1, 1024, device=DEV, generator=g).to(DT)
    ys = {n: torch.zeros(1, N, device=DEV, dtype=DT) for n, (N, K) in shapes.items()}
    count = torch.zeros(1, device=DEV, dtype=torch.int32)

    def chain():
        y = x0
        for i in range(L):
            q = G.gemv(y, w["qkv"][i])
            o = G.gemv(q[:, :2048], w["o"][i])
            gu = G.gemv(o, w["gate_up"][i])
            y = G.gemv(gu[:, :3072], w["down"][i])
        return y
    return L, shapes, w, bw, floor, x0, ys, count, chain


def persistent() -> None:
    """The 112 GEMVs of a step as the engine's GEMV kernels (PDL) against one persistent kernel with a
    grid barrier between GEMVs, the next GEMV's weights loaded before the barrier's arrive, between its
    arrive and its wait (a release must wait for the loads before it; an acquire does not hold back the
    loads issued before it), or after the wait. Earlier probe (2026-12-03): loading ahead did not pay."""
    L, shapes, w, bw, floor, x0, ys, count, chain = chain_case()

    def persistent_run(prefetch, warps):
        def run():
            count.zero_()
            ys["down"].copy_(x0)
            _persistent_chain_kernel[(128,)](w["qkv"], w["o"], w["gate_up"], w["down"], ys["qkv"], ys["o"],
                                             ys["gate_up"], ys["down"], count, L, PREFETCH=prefetch,
                                             num_warps=warps, num_stages=1)
            return ys["down"]
        return run

    flags = torch.zeros(128, device=DEV, dtype=torch.int32)

    def staged_run(warps, use_flags=False):
        def run():
            sync = flags if use_flags else count
            sync.zero_()
            ys["down"].copy_(x0)
            _staged_chain_kernel[(128,)](w["qkv"], w["o"], w["gate_up"], w["down"], ys["qkv"], ys["o"],
                                         ys["gate_up"], ys["down"], sync, L, num_warps=warps, FLAGS=use_flags)
            return ys["down"]
        return run

    want = chain().float()
    print(f"== persistent: 112 GEMVs, no prologues, weights {floor * bw / 1e3:.0f} MB, floor {floor:.1f} us at "
          f"{bw:,.0f} GB/s ({torch.cuda.get_device_name()})")
    plans = {"the engine's GEMV kernels, PDL": chain}
    for warps in (8, 16):
        for prefetch, label in ((NO_PREFETCH, "no loading ahead"), (BEFORE_ARRIVE, "loads before the arrive"),
                                (AFTER_ARRIVE, "loads between arrive and wait"),
                                (TWO_AHEAD, "two phases ahead, between arrive and wait")):
            plans[f"persistent, {warps} warps, {label}"] = persistent_run(prefetch, warps)
    plans["persistent Gluon, 8 warps, slabs in shared memory a layer ahead"] = staged_run(8)  # 8 rows: 8 warps
    plans["the same, a flag a program for the barrier"] = staged_run(8, use_flags=True)
    times = {label: [] for label in plans}
    for _ in range(2):
        for label, fn in plans.items():
            times[label].append(graph_us(fn))
    for label, fn in plans.items():
        diff = (fn().float() - want).abs().max().item()
        ts = " ".join(f"{t:7.1f}" for t in times[label])
        print(f"  {label:52s} {ts} us  {100 * floor / min(times[label]):5.1f}%   max |y - chain's| {diff:.3g}")


# ---------------------------------------------------------------------------------------------------- tma
BOX_K = gl.constexpr(256)  # a TMA box's columns: an unswizzled box's inner dimension holds at most 256 elements


@gluon.jit
def _tma_rows(desc, bar, buf, row0, BOXES_R: gl.constexpr, BOX_R: gl.constexpr, SEGS: gl.constexpr):
    """Bulk copies of rows [row0, row0 + BOXES_R * BOX_R) x all SEGS * 256 columns of desc's matrix into
    buf [BOXES_R * SEGS, BOX_R, 256], box (r, s) at index r * SEGS + s; they complete on bar."""
    mbarrier.expect(bar, BOXES_R * SEGS * BOX_R * BOX_K * 2)
    for r in gl.static_range(BOXES_R):
        for s in gl.static_range(SEGS):
            tma.async_copy_global_to_shared(desc, [row0 + r * BOX_R, s * BOX_K], bar, buf.index(r * SEGS + s))


@gluon.jit
def _tma_chain_kernel(d_qkv, d_gu, d_d, w_o, y_qkv, y_o, y_gu, y_d, count_ptr, n_layers, stamp_ptr,
                      num_warps: gl.constexpr, SYNC: gl.constexpr, LOAD: gl.constexpr, LOAD_O: gl.constexpr = True,
                      STAMP: gl.constexpr = False):
    """_staged_chain_kernel's GEMVs (the same rows a program) with each slab brought by TMA copies a whole
    layer ahead: qkv 32 rows (2 x 4 boxes of 16 x 256), gate_up 48 (3 x 4 boxes), down 8 rows of 3,072
    (12 boxes of 8 x 256); o_proj's 8 rows of 2,048 in registers as there. The copies of a slab are issued
    by one thread between the grid barrier's arrive and its wait, right after the program read the slab's
    buffer for this layer. SYNC=False: no grid barrier (the outputs are then wrong). LOAD=False: the first
    layer's weights only, reused (the outputs are then wrong). LOAD_O=False: o_proj's alone reused (a
    release waits for the loads before it: does reloading o_proj's registers hold the barriers back?).
    STAMP: each program writes %globaltimer three times a GEMV (its weights ready, its barrier arrive, its
    release) to stamp_ptr[pid, 4 * layer + gemv, 0..2]."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    box16: gl.constexpr = d_qkv.layout
    box8: gl.constexpr = d_d.layout
    xl: gl.constexpr = gl.SliceLayout(0, layout)
    rl: gl.constexpr = gl.SliceLayout(1, layout)
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    sq = gl.allocate_shared_memory(gl.bfloat16, [8, 16, BOX_K], box16)
    sg = gl.allocate_shared_memory(gl.bfloat16, [12, 16, BOX_K], box16)
    sd = gl.allocate_shared_memory(gl.bfloat16, [12, 8, BOX_K], box8)
    bars = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(3):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    _tma_rows(d_qkv, bars.index(0), sq, pid * 32, 2, 16, 4)
    _tma_rows(d_gu, bars.index(1), sg, pid * 48, 3, 16, 4)
    _tma_rows(d_d, bars.index(2), sd, pid * 8, 1, 8, 12)
    o_rows = pid * 8 + gl.arange(0, 8, layout=rl)
    o_offs = o_rows.to(gl.int64)[:, None] * 2048 + gl.arange(0, 2048, layout=xl)[None, :]
    wo = gl.load(w_o + o_offs)
    cols = gl.arange(0, BOX_K, layout=xl)
    phase = 0
    for layer in range(n_layers):
        nxt = gl.minimum(layer + 1, n_layers - 1)  # the last layer copies its own slabs again
        ready = layer % 2
        # ---- qkv_proj
        if LOAD:
            mbarrier.wait(bars.index(0), ready)
        elif layer == 0:
            mbarrier.wait(bars.index(0), 0)
        _stamp(stamp_ptr, pid, n_layers, 4 * layer, 0, STAMP)
        for r in gl.static_range(2):
            acc = gl.zeros([16], gl.float32, rl)
            for s in gl.static_range(4):
                x = gl.load(y_d + s * BOX_K + cols).to(gl.float32)
                acc += gl.sum(sq.index(r * 4 + s).load(layout).to(gl.float32) * x[None, :], axis=1)
            gl.store(y_qkv + pid * 32 + r * 16 + gl.arange(0, 16, layout=rl), acc.to(gl.bfloat16))
        phase += 1
        _stamp(stamp_ptr, pid, n_layers, 4 * layer, 1, STAMP)
        _tma_sync_arrive(count_ptr, SYNC)
        if LOAD:
            fence_async_shared()
            _tma_rows(d_qkv, bars.index(0), sq, nxt * 4096 + pid * 32, 2, 16, 4)
        _tma_sync_wait(count_ptr, phase * G, SYNC)
        _stamp(stamp_ptr, pid, n_layers, 4 * layer, 2, STAMP)
        # ---- o_proj, from registers
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 1, 0, STAMP)
        x = gl.load(y_qkv + gl.arange(0, 2048, layout=xl)).to(gl.float32)
        acc = gl.sum(wo.to(gl.float32) * x[None, :], axis=1)
        gl.store(y_o + pid * 8 + gl.arange(0, 8, layout=rl), acc.to(gl.bfloat16))
        phase += 1
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 1, 1, STAMP)
        _tma_sync_arrive(count_ptr, SYNC)
        if LOAD and LOAD_O:
            wo = gl.load(w_o + nxt * (1024 * 2048) + o_offs)
        _tma_sync_wait(count_ptr, phase * G, SYNC)
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 1, 2, STAMP)
        # ---- gate_up_proj
        if LOAD:
            mbarrier.wait(bars.index(1), ready)
        elif layer == 0:
            mbarrier.wait(bars.index(1), 0)
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 2, 0, STAMP)
        for r in gl.static_range(3):
            acc = gl.zeros([16], gl.float32, rl)
            for s in gl.static_range(4):
                x = gl.load(y_o + s * BOX_K + cols).to(gl.float32)
                acc += gl.sum(sg.index(r * 4 + s).load(layout).to(gl.float32) * x[None, :], axis=1)
            gl.store(y_gu + pid * 48 + r * 16 + gl.arange(0, 16, layout=rl), acc.to(gl.bfloat16))
        phase += 1
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 2, 1, STAMP)
        _tma_sync_arrive(count_ptr, SYNC)
        if LOAD:
            fence_async_shared()
            _tma_rows(d_gu, bars.index(1), sg, nxt * 6144 + pid * 48, 3, 16, 4)
        _tma_sync_wait(count_ptr, phase * G, SYNC)
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 2, 2, STAMP)
        # ---- down_proj
        if LOAD:
            mbarrier.wait(bars.index(2), ready)
        elif layer == 0:
            mbarrier.wait(bars.index(2), 0)
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 3, 0, STAMP)
        acc = gl.zeros([8], gl.float32, rl)
        for s in gl.static_range(12):
            x = gl.load(y_gu + s * BOX_K + cols).to(gl.float32)
            acc += gl.sum(sd.index(s).load(layout).to(gl.float32) * x[None, :], axis=1)
        gl.store(y_d + pid * 8 + gl.arange(0, 8, layout=rl), acc.to(gl.bfloat16))
        phase += 1
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 3, 1, STAMP)
        _tma_sync_arrive(count_ptr, SYNC)
        if LOAD:
            fence_async_shared()
            _tma_rows(d_d, bars.index(2), sd, nxt * 1024 + pid * 8, 1, 8, 12)
        _tma_sync_wait(count_ptr, phase * G, SYNC)
        _stamp(stamp_ptr, pid, n_layers, 4 * layer + 3, 2, STAMP)
    if LOAD:  # the last layer's copies of its own slabs again: let them land before the kernel ends
        for i in gl.static_range(3):
            mbarrier.wait(bars.index(i), n_layers % 2)


@gluon.jit
def _stamp(stamp_ptr, pid, n_layers, gemv, j: gl.constexpr, STAMP: gl.constexpr):
    if STAMP:
        gl.store(stamp_ptr + (pid * 4 * n_layers + gemv) * 3 + j, _asm_timer())


@gluon.jit
def _tma_sync_arrive(count_ptr, SYNC: gl.constexpr):
    if SYNC:
        _grid_arrive(count_ptr)
    else:
        gl.thread_barrier()  # the slab's buffer is read by every warp before a copy overwrites it


@gluon.jit
def _tma_sync_wait(count_ptr, target, SYNC: gl.constexpr):
    if SYNC:
        _grid_wait(count_ptr, target)


def tma_probe() -> None:
    """The persistent chain with TMA copies, and the same kernel without its barrier or without its copies."""
    L, shapes, w, bw, floor, x0, ys, count, chain = chain_case()
    unswizzled = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    desc = {n: TensorDescriptor.from_tensor(w[n].view(L * N, K), [r, BOX_K.value], unswizzled)
            for n, (N, K), r in ((n, shapes[n], r) for n, r in (("qkv", 16), ("gate_up", 16), ("down", 8)))}

    def staged_run():
        count.zero_()
        ys["down"].copy_(x0)
        _staged_chain_kernel[(128,)](w["qkv"], w["o"], w["gate_up"], w["down"], ys["qkv"], ys["o"],
                                     ys["gate_up"], ys["down"], count, L, num_warps=8)
        return ys["down"]

    stamps = torch.zeros(128, 4 * L, 3, dtype=torch.int64, device=DEV)

    def tma_run(sync=True, load=True, load_o=True, warps=8, stamp=False):
        def run():
            count.zero_()
            ys["down"].copy_(x0)
            _tma_chain_kernel[(128,)](desc["qkv"], desc["gate_up"], desc["down"], w["o"], ys["qkv"], ys["o"],
                                      ys["gate_up"], ys["down"], count, L, stamps, num_warps=warps, SYNC=sync,
                                      LOAD=load, LOAD_O=load_o, STAMP=stamp)
            return ys["down"]
        return run

    want = chain().float()
    print(f"== tma: 112 GEMVs, no prologues, weights {floor * bw / 1e3:.0f} MB, floor {floor:.1f} us at "
          f"{bw:,.0f} GB/s ({torch.cuda.get_device_name()})")
    plans = {"the engine's GEMV kernels, PDL": chain,
             "persistent Gluon, cp.async a layer ahead (staged)": staged_run,
             "persistent Gluon, TMA a layer ahead": tma_run(),
             "  the same, 16 warps": tma_run(warps=16),
             "  the same (8 warps), o_proj's weights not reloaded (wrong outputs)": tma_run(load_o=False),
             "  the same without the grid barrier (wrong outputs)": tma_run(sync=False),
             "  the same without weight copies (wrong outputs)": tma_run(load=False)}
    times = {label: [] for label in plans}
    for _ in range(3):
        for label, fn in plans.items():
            times[label].append(graph_us(fn))
    for label, fn in plans.items():
        diff = (fn().float() - want).abs().max().item()
        ts = " ".join(f"{t:7.1f}" for t in times[label])
        print(f"  {label:66s} {ts} us  {100 * floor / min(times[label]):5.1f}%   max |y - chain's| {diff:.3g}")
    tma_stamps(tma_run(stamp=True), stamps, floor)


def tma_stamps(run, stamps: torch.Tensor, floor: float) -> None:
    """Where a GEMV's time goes in the TMA chain, from each program's stamps (weights ready, arrive, release)."""
    graph_us(run)  # warmed, captured, replayed: the last replay's stamps stay
    print(stamp_report(stamps.cpu().double() / 1e3, floor))


def stamp_report(st: torch.Tensor, floor: float) -> str:
    """st [programs, GEMVs, (ready, arrive, release)] in us -> per kind of GEMV, medians over its 28: the whole
    GEMV (release to release), the spread of the programs' weights becoming ready, how long after the GEMV
    began the last program's were, the dot (ready to arrive, median program), and the barrier (the last
    arrive to the first release)."""
    ready, arrive, release = st[..., 0], st[..., 1], st[..., 2]
    step = release.min(0).values  # a GEMV ends when the first program leaves its barrier
    start = torch.cat([ready.min(0).values[:1], step[:-1]])
    total = (step[-1] - ready[:, 0].min()).item()
    lines = [f"  stamped replay: {total:.1f} us for the {st.shape[1]} GEMVs ({100 * floor / total:.1f}% of the floor)"]
    parts = {"whole": step - start, "ready spread": ready.max(0).values - ready.min(0).values,
             "last ready": ready.max(0).values - start, "dot": (arrive - ready).median(0).values,
             "barrier": step - arrive.max(0).values}
    lines.append("    us (median of 28)  " + "".join(f"{k:>14s}" for k in parts))
    for g, name in enumerate(NAMES):
        lines.append(f"    {name:19s}" + "".join(f"{v[g::4].median().item():14.2f}" for v in parts.values()))
    return "\n".join(lines)

if __name__ == "__main__":
    steps = {"cascade": cascade, "staged": staged, "configs": configs, "persistent": persistent, "tma": tma_probe}
    for step in sys.argv[1:] or list(steps):
        steps[step]()
