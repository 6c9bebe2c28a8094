"""Does torch + NCCL itself leave sockets open, or GPU memory held, across init_process_group /
destroy_process_group cycles?

Rank 0 is this process (as in minillm's TP engine), rank 1 a spawned process; each cycle runs one
all_reduce and a barrier, then destroys the group; five cycles, printing the descriptors that are new
since cycle 0 and GPU 0's free memory (after empty_cache). No minillm code is involved. Needs two
CUDA GPUs:

    python tests/gpu/nccl_fds.py nccl "cpu:gloo,cuda:nccl"
    NCCL_FDS_SHUTDOWN=1 python tests/gpu/nccl_fds.py nccl   # rank 0 first shuts its NCCL backend down
                                                            # itself: does that give the memory back?

On 2 x H200 (torch 2.11.0+cu130) both backends left one more socket per cycle: the allowance
NCCL_SOCKETS_PER_SHUTDOWN of tests/test_tp.py; NCCL_FDS_SHUTDOWN=1 changes nothing (still one socket
per cycle). GPU 0's free memory stayed at 138.85 GiB in every cycle, with and without it: bare NCCL
gives its memory back. (The 2.0 GiB that five TP=2 engines left missing is the process's one-time
kernel loading, the same with TP=1: see tests/gpu/engine_memory.py.)
"""
import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = timedelta(seconds=60)
CYCLES = 5


def open_fds() -> dict[int, str]:
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # listdir's own descriptor, closed by now
            pass
    return fds


def join_and_leave(rank: int, port: int, backend: str) -> None:
    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT)
    dist.init_process_group(backend, store=store, rank=rank, world_size=2)
    x = torch.ones(4, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    if os.environ.get("NCCL_FDS_SHUTDOWN") == "1":  # the NCCL communicator's own shutdown, explicitly
        dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda")).shutdown()
    dist.destroy_process_group()


def cycle(backend: str) -> None:
    master = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)
    peer = mp.get_context("spawn").Process(target=join_and_leave, args=(1, master.port, backend))
    peer.start()
    join_and_leave(0, master.port, backend)
    peer.join()
    del master
    gc.collect()


if __name__ == "__main__":
    for backend in sys.argv[1:] or ["nccl"]:
        base = None
        for i in range(CYCLES):
            cycle(backend)
            now = open_fds()
            base = base or now
            torch.cuda.empty_cache()
            free_gib = torch.cuda.mem_get_info(0)[0] / 2**30
            print(f"{backend} cycle {i}: GPU 0 free {free_gib:.2f} GiB; {len(now)} descriptors; new since "
                  f"cycle 0: { {fd: t for fd, t in now.items() if base.get(fd) != t} }", flush=True)
