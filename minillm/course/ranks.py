"""Running one function on N ranks, for the course: the exercises' graders, the notebooks and the
tests start a few processes, run a function in each and look at what every rank returned. The engine
does not use this (its workers are minillm.engine.tp's); it builds on minillm.distributed's plumbing.

    run_on_ranks(fn, n, *args)              n fresh processes in one gloo (CPU) or NCCL (one GPU per
                                            rank) group on a free port; -> [fn(*args) of rank 0, 1, ...]
    run_on_ranks(call_sharded, n, fn, rank_args)    rank r runs fn(*rank_args[r], group)
    run_on_ranks(all_reduce_benchmark, n, sizes)    notebook 04's all-reduce timings

An exception in a rank is raised here with its own type and message.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

from minillm.distributed import (exit_description, join_group, leave_group, pack_error, recv_message,
                                 remote_error, send_message, set_cpu_threads, start_store)


def _rank_main(fn, args, rank: int, world_size: int, port: int, device: str, timeout_s: float, conn) -> None:
    ok = False
    try:
        if device == "cuda":
            torch.cuda.set_device(rank)
        else:
            set_cpu_threads(world_size)
        join_group(rank, world_size, device, port, timeout_s)
        result = fn(*args)
        ok = True
        send_message(conn, ("ok", result))
    except BaseException as e:  # noqa: BLE001 -- everything goes back to the parent
        with contextlib.suppress(Exception):
            send_message(conn, ("error", *pack_error(e)))
    finally:
        leave_group(abort=not ok)  # a failed rank's peers may sit in a collective it never joins
        conn.close()


def run_on_ranks(fn, world_size: int, *args, device: str = "cpu", timeout_s: float = 120.0) -> list:
    """Run fn(*args) on world_size new processes joined in one group. -> [result of rank 0, 1, ...].

    fn must be importable by name (a module-level function, not one defined in a notebook) and return
    picklable CPU objects; inside it, dist.get_rank() tells the rank. device='cpu' uses gloo,
    'cuda' NCCL with GPU r for rank r. The first exception a rank raises is raised here with its
    type and message (the others usually fail because of it); a rank that dies raises RuntimeError.
    """
    ctx = torch.multiprocessing.get_context("spawn")
    store = start_store(timeout_s)
    procs, conns = [], []
    for rank in range(world_size):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_main, args=(fn, args, rank, world_size, store.port, device, timeout_s, send),
                        name=f"minillm-rank{rank}")
        p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    results: dict[int, object] = {}
    first_error = None
    pending = set(range(world_size))
    try:
        while pending:
            ready = wait([conns[r] for r in pending] + [procs[r].sentinel for r in pending],
                         timeout=timeout_s if first_error is None else 5.0)
            if not ready:
                raise first_error or TimeoutError(f"ranks {sorted(pending)} did not finish within {timeout_s:.0f} s")
            for r in sorted(pending):
                if conns[r] in ready or procs[r].sentinel in ready:
                    try:
                        kind, *payload = recv_message(conns[r])
                    except EOFError:  # died without a word
                        procs[r].join(timeout=5)
                        kind, payload = "dead", [RuntimeError(f"rank {r} (pid {procs[r].pid}) "
                                                              f"{exit_description(procs[r].exitcode)}")]
                    pending.discard(r)
                    if kind == "ok":
                        results[r] = payload[0]
                    elif first_error is None:
                        first_error = payload[0] if kind == "dead" else remote_error(*payload, f"rank {r}")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for c in conns:
            c.close()
    if first_error is not None:
        raise first_error
    return [results[r] for r in range(world_size)]


def call_sharded(fn, rank_args: list[tuple]):
    """For run_on_ranks: rank r returns fn(*rank_args[r], group) with group = the whole world."""
    return fn(*rank_args[dist.get_rank()], dist.group.WORLD)


def all_reduce_benchmark(sizes_bytes: list[int], device: str = "cpu", dtype: torch.dtype = torch.float32,
                         inner: int = 10, rep: int = 10) -> list[float]:
    """For run_on_ranks: the median milliseconds of one all-reduce of each message size (rep timings
    of inner back-to-back calls, after a warm-up). Every rank makes exactly the same calls: a timer
    that picks its call count from a measured first call (time_fn on a CUDA machine does) picks a
    different count on each rank, and the rank with more calls then waits forever in a collective
    the others never start."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(10):  # line the ranks up and set up the connections before timing anything
        dist.all_reduce(torch.ones(1, device=device))
    dist.barrier()
    out = []
    for size in sizes_bytes:
        x = torch.ones(max(1, size // dtype.itemsize), dtype=dtype, device=device)
        for _ in range(inner):
            dist.all_reduce(x)
        times = []
        for _ in range(rep):
            sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                dist.all_reduce(x)
            sync()
            times.append((time.perf_counter() - t0) * 1e3 / inner)
        out.append(statistics.median(times))
    return out
