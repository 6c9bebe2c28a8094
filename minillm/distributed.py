"""Tensor parallelism's plumbing: which rank a layer belongs to, how processes form a group, and how
a function runs on several ranks at once.

A model is built inside `tensor_parallel(group)`. Every parallel layer reads tp_rank(), tp_size()
and tp_group() once, when it is constructed, and keeps them; outside that block a layer is rank 0 of
1 and skips every collective. So a single-process model and a sharded one can live in one process.

    with tensor_parallel(dist.group.WORLD):
        model = Qwen3ForCausalLM(cfg)        # each layer holds its shard and its group

`run_on_ranks(fn, n, *args)` starts n fresh processes that form a gloo (CPU) or NCCL (one GPU per
rank) group on a free port, runs fn(*args) in each and returns their results; an exception in a rank
is raised here with its own type and message. The tests, the notebook and the grader use it.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import signal
import statistics
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

# Collectives run only while every rank is inside the same step, so waits are short; a dead peer is
# reported by gloo at once (its sockets close). The timeout only catches a peer that hangs alive.
DEFAULT_TIMEOUT_S = float(os.environ.get("MINILLM_TP_TIMEOUT", "300"))


@dataclass(frozen=True)
class TPState:
    group: object = None  # a torch.distributed ProcessGroup, None when not parallel
    rank: int = 0
    size: int = 1


_STATE = TPState()


def tp_rank() -> int:
    return _STATE.rank


def tp_size() -> int:
    return _STATE.size


def tp_group():
    return _STATE.group


@contextlib.contextmanager
def tensor_parallel(group=None):
    """Layers built inside this block shard over `group` (default: the whole world)."""
    global _STATE
    group = dist.group.WORLD if group is None else group
    previous = _STATE
    _STATE = TPState(group, dist.get_rank(group), dist.get_world_size(group))
    try:
        yield _STATE
    finally:
        _STATE = previous


# ---- forming a group -----------------------------------------------------------------------------
def launched_by_torchrun() -> bool:
    """True when torchrun (or another env:// launcher) set RANK, WORLD_SIZE and MASTER_ADDR."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def start_store(timeout_s: float = DEFAULT_TIMEOUT_S) -> dist.TCPStore:
    """A rendezvous server on a port the OS picks (never a fixed one): read it from `.port`."""
    return dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)


def join_group(rank: int, world_size: int, device: str, port: int | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S):
    """Join the default process group: through the store on 127.0.0.1:port, or env:// when port is
    None (torchrun). gloo for CPU tensors; on CUDA also NCCL for CUDA tensors. -> the group."""
    timeout = timedelta(seconds=timeout_s)
    backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
    if port is None:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    else:
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return dist.group.WORLD


def leave_group(abort: bool = False) -> None:
    """Destroy this process's process groups, if any (a process that exits with one alive aborts).

    NCCL's destroy waits for the peers to destroy theirs: call it only when every rank is leaving too
    (none is inside a collective or waiting for a message). abort=True is for a rank whose peers may
    be dead or stuck: an abort drops the group without waiting for anyone."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    with contextlib.suppress(Exception):
        if abort:
            dist.distributed_c10d._abort_process_group()  # torch >= 2.3; NCCL and gloo
        else:
            dist.destroy_process_group()


def set_cpu_threads(world_size: int) -> None:
    """Share the CPU cores between the ranks of one machine instead of oversubscribing them."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


# ---- errors across processes ---------------------------------------------------------------------
def pack_error(exc: BaseException) -> tuple[BaseException, str]:
    """An exception made safe to send to another process, with its traceback as text."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    exc.__traceback__ = None
    return exc, tb


def remote_error(exc: BaseException, tb: str, where: str) -> BaseException:
    """The exception a rank sent, ready to raise here: same type and message, its traceback as a note."""
    exc.add_note(f"(raised in {where}; its traceback follows)\n{tb.rstrip()}")
    return exc


def exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


# ---- running a function on several ranks ---------------------------------------------------------
# Messages between processes are plain pickles: multiprocessing's own pickler would share tensors
# through file descriptors that vanish when the sending process exits.
def send_message(conn, obj) -> None:
    conn.send_bytes(pickle.dumps(obj))


def recv_message(conn):
    return pickle.loads(conn.recv_bytes())


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
