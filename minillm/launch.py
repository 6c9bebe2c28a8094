"""Tensor parallel under torchrun (several processes, or several nodes):

    torchrun --nproc-per-node N -m minillm.launch your_script.py [args ...]

Every rank starts here and joins the process group. Rank 0 runs your script. Each
`LLM(..., tensor_parallel_size=N)` it creates sends its configuration to ranks 1..N-1, which build
their shards and serve that engine until it shuts down, then wait for the next one. When the script
ends (or raises), the other ranks leave too. Your script never runs on ranks above 0.
"""
from __future__ import annotations

import os
import runpy
import sys

import torch

from minillm.distributed import join_group, launched_by_torchrun, leave_group
from minillm.engine import tp
from minillm.engine.model_runner import _LIVE_RUNNERS

USAGE = "usage: torchrun --nproc-per-node N -m minillm.launch your_script.py [args ...]"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(USAGE)
    if not launched_by_torchrun():
        raise SystemExit(f"minillm.launch runs under torchrun (RANK, WORLD_SIZE, MASTER_ADDR are not set); {USAGE}")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    if cuda:  # before the group forms: NCCL binds each rank to its GPU
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", rank)), torch.cuda.device_count()
        if local_rank >= gpus:
            raise SystemExit(f"minillm.launch: rank {rank} (local rank {local_rank}) has no GPU: this node has {gpus}. "
                             f"Start at most {gpus} ranks per node, or set CUDA_VISIBLE_DEVICES= to run every rank "
                             f"on the CPU (gloo)")
        torch.cuda.set_device(local_rank)
    join_group(rank, world, "cuda" if cuda else "cpu")
    tp._TORCHRUN = channel = tp.BroadcastChannel()
    clean = False
    try:
        if rank == 0:
            try:
                sys.argv = list(argv)
                runpy.run_path(argv[0], run_name="__main__")
            finally:  # the script is over: stop the engines it left running, in order, then the ranks
                for runner in list(_LIVE_RUNNERS):
                    runner.shutdown()
                channel.send(tp.EXIT)
        else:
            tp.serve_torchrun(channel)
        clean = True
    finally:
        tp._TORCHRUN = None
        del channel  # nothing may hold a ProcessGroup when it is destroyed
        leave_group(abort=not clean)


if __name__ == "__main__":
    main()
