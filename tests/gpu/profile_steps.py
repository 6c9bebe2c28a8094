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

from minillm import LLM, SamplingParams
from minillm.bench import BATCH1_PROMPT, Workload, make_workload, timed
from minillm.course.speed_ladder import profile_kernels


def summarize(fn, label: str) -> dict:
    """Profile fn() and print its CUDA kernels by class and the 25 that took the most time."""
    prof = profile_kernels(fn)
    busy = prof.busy_us / 1e6
    print(f"\n=== {label}: wall {prof.wall_s:.3f} s, GPU kernel time {busy:.3f} s "
          f"({100 * busy / prof.wall_s:.1f}% of the wall)")
    print(prof.table(top=25))
    top = sorted(prof.kernels.items(), key=lambda kv: -kv[1][1])[:25]
    return {"wall_s": prof.wall_s, "kernel_s": busy, "by_class": prof.by_class(),
            "top": [(k, n, us) for k, (n, us) in top]}


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
    res["full"] = summarize(lambda: gen(work.fresh().fresh()), "full bench workload (profiled)")

    def one():
        return llm.generate(BATCH1_PROMPT, SamplingParams(temperature=0.6, max_tokens=257, ignore_eos=True),
                            use_tqdm=False)
    one()
    res["batch1"] = summarize(one, "batch-1, 257 tokens")
    prompts_only = Workload(work.fresh().fresh().fresh().prompts, [1] * work.num_seqs)
    res["prefill"] = summarize(lambda: gen(prompts_only), "prefill only: 256 prompts, 1 token each")
    with open(f"{out}/profile_steps.json", "w") as f:
        json.dump(res, f, default=str)
    llm.shutdown()


if __name__ == "__main__":
    main()
