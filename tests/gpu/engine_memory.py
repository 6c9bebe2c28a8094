"""Rank 0's (this process's) GPU 0 free memory across engines started and shut down one after another,
with torch's own view beside it: is memory lost per engine, or once per process?

    python tests/gpu/engine_memory.py tp1|tp2|tp2eager [engines]     # tp2*: needs two CUDA GPUs

2 x H200 (torch 2.11.0+cu130), qwen3-tiny fp32, 4 engines each (3 for tp1), free GiB at the start ->
after engine 0's shutdown -> after each later one: tp1 139.286 -> 137.413 -> 137.413; tp2eager
139.286 -> 137.349 -> 137.349; tp2 (decode graphs on both ranks) 139.286 -> 137.314 -> 137.314. torch
reserves 0.03-0.06 GiB after each shutdown. So the ~1.9 GiB is the process's one-time cost (kernels
loaded lazily into the CUDA context, cuBLAS handles: reserved by no torch allocation), not the engine's;
test_tp.py::test_nccl_shutdown_five_times_in_a_row measures later engines from after the first.
"""
import gc
import sys

import torch
import torch.distributed as dist

from minillm import LLM, SamplingParams

ARGS = dict(device="cuda", dtype="float32", kvcache_block_size=16, max_model_len=256, max_num_seqs=8,
            gpu_memory_utilization=0.3)
GIB = 2**30


def report(mode: str, tag: str) -> float:
    gc.collect()
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(0)[0] / GIB
    print(f"[{mode}] {tag}: GPU 0 free {free:.3f} GiB, torch reserved {torch.cuda.memory_reserved(0) / GIB:.3f}"
          f" allocated {torch.cuda.memory_allocated(0) / GIB:.3f}", flush=True)
    return free


def main(mode: str, engines: int) -> None:
    args = dict(ARGS, enforce_eager=mode == "tp2eager")
    torch.cuda.init()
    for d in range(torch.cuda.device_count()):  # the contexts the TP engine will create, before the baseline
        torch.cuda.mem_get_info(d)
    start = report(mode, "start")
    for i in range(engines):
        llm = LLM("qwen3-tiny", tensor_parallel_size=1 if mode == "tp1" else 2, **args)
        llm.generate(["Hello", "The capital of France is"],
                     SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        report(mode, f"engine {i} live")
        llm.shutdown()
        del llm
        free = report(mode, f"engine {i} shut down")
        print(f"    {start - free:.3f} GiB below the start; process group left: {not dist.is_initialized()}")


if __name__ == "__main__":  # spawned TP workers import this module
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
