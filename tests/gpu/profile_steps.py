"""Where minillm's GPU time goes on the bench workload (one H200): the engine steps by batch size
(unprofiled wall time), then the torch profiler's CUDA kernels grouped by class (attention, GEMM,
GEMV, norms, QK-norm + RoPE, SiLU, sampler, ...) for the full bench run, a batch-1 decode of 257
tokens and a prefill-only run of the 256 prompts. Writes $OUT/profile_steps.json.

    source tests/gpu/env.sh && OUT=/tmp python tests/gpu/profile_steps.py
"""
import collections
import json
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minillm import LLM, SamplingParams
from minillm.bench import BATCH1_PROMPT, Workload, make_workload, timed

# kernel class: substrings of the kernel names (first match wins)
CLASSES = [("attention", ("paged_decode", "decode_b1", "prefill_attention", "flash")),
           ("gemv", ("gemv",)), ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas")),
           ("norm", ("rms",)), ("qk_norm_rope", ("qk_norm_rope",)), ("silu", ("silu",)),
           ("store_kv", ("store_kv",)), ("sample", ("sample",)), ("embed", ("indexselect", "gather")),
           ("copy", ("memcpy", "memset", "copy", "fill"))]


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CLASSES if any(k in low for k in keys)), "other")


def summarize(prof, wall_s: float, label: str) -> dict:
    by_name = collections.defaultdict(lambda: [0, 0.0])  # kernel -> [launches, microseconds]
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += 1
            by_name[e.name][1] += e.device_time_total
    by_class = collections.defaultdict(lambda: [0, 0.0])
    for name, (n, us) in by_name.items():
        by_class[kernel_class(name)][0] += n
        by_class[kernel_class(name)][1] += us
    busy = sum(us for _, us in by_class.values()) / 1e6
    print(f"\n=== {label}: wall {wall_s:.3f} s, GPU kernel time {busy:.3f} s ({100 * busy / wall_s:.1f}% of the wall)")
    for c, (n, us) in sorted(by_class.items(), key=lambda kv: -kv[1][1]):
        print(f"  {c:14s} {n:8d} kernels {us / 1e3:10.1f} ms  {100 * us / 1e6 / busy:5.1f}%")
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
    for name, (n, us) in top:
        print(f"    {us / 1e3:9.1f} ms {n:7d}x {us / max(n, 1):8.1f} us  {name[:110]}")
    return {"wall_s": wall_s, "kernel_s": busy, "by_class": dict(by_class), "top": [(k, n, us) for k, (n, us) in top]}


def main() -> None:
    out = os.environ.get("OUT", "/tmp")
    llm = LLM("qwen3-0.6b-random", dtype="bfloat16", max_model_len=4096)
    work = Workload(*make_workload(256, 100, 1024, 1024))

    def gen(w: Workload):
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in w.output_lens]
        return llm.generate(w.prompts, params, use_tqdm=False)
    for _ in range(2):
        llm.generate(work.warmup().prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    print(f"unprofiled run {work.output_tokens / timed(lambda: gen(work))[1]:,.0f} tok/s")
    engine, steps, step = llm.engine, [], llm.engine.step

    def logged_step():  # each step's wall time and the number of running sequences after it
        t0 = time.perf_counter()
        r = step()
        steps.append((time.perf_counter() - t0, len(engine.scheduler.running)))
        return r
    engine.step = logged_step
    wall = timed(lambda: gen(work.fresh()))[1]
    engine.step = step
    print(f"step-logged run {work.output_tokens / wall:,.0f} tok/s; {len(steps)} steps")
    hist = collections.defaultdict(lambda: [0, 0.0])
    for dt, b in steps:
        key = 0 if b <= 0 else min(256, 1 << (b - 1).bit_length())
        hist[key][0] += 1
        hist[key][1] += dt
    for k in sorted(hist):
        n, s = hist[k]
        print(f"  running <= {k:4d}: {n:5d} steps {s:7.3f} s  {1e3 * s / n:7.3f} ms/step")
    res = {"steps_by_running": dict(hist)}
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        wall = timed(lambda: gen(work.fresh().fresh()))[1]
    res["full"] = summarize(prof, wall, "full bench workload (profiled)")

    def one():
        return llm.generate(BATCH1_PROMPT, SamplingParams(temperature=0.6, max_tokens=257, ignore_eos=True),
                            use_tqdm=False)
    one()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = timed(one)[1]
    res["batch1"] = summarize(prof, wall, "batch-1, 257 tokens")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        prompts_only = Workload(work.fresh().fresh().fresh().prompts, [1] * work.num_seqs)
        wall = timed(lambda: gen(prompts_only))[1]
    res["prefill"] = summarize(prof, wall, "prefill only: 256 prompts, 1 token each")
    with open(f"{out}/profile_steps.json", "w") as f:
        json.dump(res, f, default=str)
    llm.shutdown()


if __name__ == "__main__":
    main()
