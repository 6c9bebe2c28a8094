"""Tensor parallelism's plumbing: which rank a layer belongs to, how processes form a group, and how
they send each other messages and errors.

A model is built inside `tensor_parallel(group)`. Every parallel layer reads tp_rank(), tp_size()
and tp_group() once, when it is constructed, and keeps them; outside that block a layer is rank 0 of
1 and skips every collective. So a single-process model and a sharded one can live in one process.

    with tensor_parallel(dist.group.WORLD):
        model = Qwen3ForCausalLM(cfg)        # each layer holds its shard and its group

Forming a group (join_group, leave_group, start_store), messages between processes and errors sent
across them serve the engine's tensor-parallel runner (minillm.engine.tp). The course's
`run_on_ranks(fn, n, *args)`, which runs a function on n fresh ranks, lives in minillm.course.ranks.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import signal
import traceback
from dataclasses import dataclass
from datetime import timedelta

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


# ---- messages between processes ------------------------------------------------------------------
# Messages between processes are plain pickles: multiprocessing's own pickler would share tensors
# through file descriptors that vanish when the sending process exits.
def send_message(conn, obj) -> None:
    conn.send_bytes(pickle.dumps(obj))


def recv_message(conn):
    return pickle.loads(conn.recv_bytes())
