"""Tensor-parallel model runner: rank 0 (this process) schedules and samples; ranks 1..N-1 are worker
processes that hold their shard of every layer and run the same forward on the inputs rank 0 sends.

    rank 0 (the user's process)                        rank r (a worker)
    scheduler -> build_batch (numpy) -- send_batch: pipe --> load_batch (or the decode CUDA graph's inputs)
    load_batch, forward <== one all-reduce per attention / MLP block ==> forward
    LM head: logits of its vocabulary slice <=== gather to rank 0 ====== logits of its slice
    sampler -> token ids

On CUDA every rank captures the same decode CUDA graphs (minillm.engine.cuda_graph), collectives
inside, and replays the same one for a step: a decode step costs each rank one graph launch.

Launch. By default rank 0 spawns the workers (torch.multiprocessing, spawn) and hosts the rendezvous
on a port the OS picks. Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set: several nodes work) every
rank runs the user's script: rank 0 goes on as above, ranks > 0 serve inside LLM(...) and exit when
rank 0 shuts the engine down.

Shutdown, in this order, so that no rank is ever left inside a collective (NCCL's
destroy_process_group waits for its peers; a rank that destroys its group while a peer still waits
for a message hangs):
    1. rank 0 frees its device memory (its CUDA graphs before the communicator they captured);
    2. rank 0 tells every worker to stop; each frees its memory, answers "stopped" and leaves the group;
    3. once every worker has answered, rank 0 leaves the group and joins the worker processes.
A worker that does not answer in time, or an engine already broken by an error (a worker may then sit
in a collective that will never complete), is killed instead, and rank 0 aborts its group (an abort
does not wait for peers). Leaving a group also drops every reference to its ProcessGroup objects, so
they are destroyed right there: destroy_process_group() alone leaves a gloo group's threads running,
and one that drops the last collective's tensors while the interpreter exits aborts the process
("terminate called without an active exception").

Failure. A worker that raises sends its exception back and exits; rank 0 raises it with its type and
message. A worker that dies (killed, crashed) makes the current or the next step raise RuntimeError
naming its rank: gloo reports a closed peer at once, and rank 0 checks the workers' liveness before
every step and while it waits. After an error inside a step the ranks are out of step, so the engine
stops its workers and refuses further steps (create a new LLM). Workers exit when rank 0's process
does, even from inside a collective (each watches its parent).
"""
from __future__ import annotations

import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

from minillm.config import EngineConfig, ModelConfig
from minillm.context import reset_context
from minillm.distributed import (exit_description, join_group, launched_by_torchrun, leave_group, pack_error,
                                 recv_message, remote_error, send_message, set_cpu_threads, start_store,
                                 tensor_parallel)
from minillm.engine.model_runner import Batch, ModelRunner

STARTUP_TIMEOUT_S = 300.0  # a worker must import torch and minillm within this
ERROR_GRACE_S = 3.0  # how long rank 0 waits for a failing worker's own report
STOP_TIMEOUT_S = 30.0  # a stopping worker frees its memory and answers within this, or it is killed
JOIN_TIMEOUT_S = 10.0  # a worker that answered "stopped" leaves its group and exits within this
PARENT_POLL_S = 1.0  # how often a spawned worker checks that rank 0's process is still there
# What every worker spawned from now on, and every torchrun rank serving an engine created from now on,
# runs first, before it builds its shard: picklable callables (a module-level function or a
# functools.partial of one; a torchrun rank outlives the engine, so it calls .restore() on what each
# returned once that engine stops). The course's notebook switch (use_my_code) puts a reader's exercise
# functions into the other ranks this way, as it does into rank 0's process.
WORKER_SETUP: list[Callable[[], object]] = []
STOP = ("stop",)  # rank 0 -> workers: free your memory, answer, leave the group, exit
EXIT = ("exit",)  # minillm.launch's rank 0 -> the other ranks: the script has ended


class ShardRunner(ModelRunner):
    """One rank's ModelRunner: its model is built inside tensor_parallel(group), so every layer holds
    this rank's shard, and all ranks agree on the number of KV-cache blocks."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, model_path: str, group):
        with tensor_parallel(group):  # the layers and the DeviceMemory take the group from here
            super().__init__(config, model_config, model_path)

    @property
    def group(self):
        """This rank's process group; None once its memory is released (the module docstring says why)."""
        return self.memory.group

    def kv_budget_blocks(self) -> int:
        # rank 0's scheduler hands out block ids for every rank: all must hold the same number
        n = torch.tensor([super().kv_budget_blocks()], dtype=torch.int64)
        dist.all_reduce(n, op=dist.ReduceOp.MIN, group=self.memory.group)  # a CPU tensor: gloo, on every backend
        return int(n.item())

    @torch.inference_mode()
    def execute(self, batch: Batch) -> None:
        """A worker's half of a step: the same forward as rank 0 on the same Batch (the same decode
        graph when rank 0 replays one: same size, same collectives), no sampling."""
        try:
            self.copy_blocks(batch.block_copies)
            if not batch.is_prefill and self.graphs is not None and self.graphs.padded_size(len(batch.input_ids)):
                self.graphs.run(batch)
            else:
                self.forward_batch(batch)
        finally:
            reset_context()

    def serve(self, channel) -> bool:
        """A worker's loop: run what rank 0 sends until it says STOP (-> True) or goes away (-> False)."""
        while (msg := channel.recv()) is not None:
            if msg[0] == "step":
                self.execute(msg[1])
            elif msg[0] == "rpc":
                fn, args = msg[1], msg[2]
                channel.reply(fn(self, *args))
            elif msg == STOP:
                return True
            elif msg == EXIT:  # rank 0's script ended without stopping this engine
                return False
        return False


# ---- how rank 0 talks to the workers -------------------------------------------------------------
class PipeChannel:
    """Spawned workers: one pipe each. Rank 0 pickles a message once and writes it to every pipe."""

    def __init__(self, conns, procs=()):
        self.conns, self.procs = list(conns), list(procs)

    def send(self, msg) -> None:
        data = pickle.dumps(msg)
        for c in self.conns:
            c.send_bytes(data)

    def replies(self, timeout_s: float | None = None) -> list:
        out = []
        for conn, proc in zip(self.conns, self.procs):
            if not wait([conn, proc.sentinel], timeout=timeout_s):
                raise TimeoutError(f"worker {proc.name} did not answer within {timeout_s:.0f} s")
            kind, *payload = recv_message(conn)  # EOFError when it died: the caller names the rank
            if kind == "error":
                raise remote_error(*payload, proc.name)
            out.append(payload[0])
        return out

    # the worker's side (one conn)
    def recv(self):
        try:
            return recv_message(self.conns[0])
        except (EOFError, OSError):  # rank 0 has gone: stop serving
            return None

    def reply(self, value) -> None:
        send_message(self.conns[0], ("ok", value))


class BroadcastChannel:
    """torchrun: messages go over a gloo group of their own with a long timeout (an idle engine waits)."""

    def __init__(self):
        self.group = dist.new_group(backend="gloo", timeout=timedelta(days=365))

    def send(self, msg) -> None:
        dist.broadcast_object_list([msg], src=0, group=self.group)

    def recv(self):
        box = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except RuntimeError:  # gloo: rank 0 has gone
            return None
        return box[0]

    def replies(self, timeout_s: float | None = None) -> list:
        out = [None] * dist.get_world_size(self.group)
        dist.gather_object(None, out, dst=0, group=self.group)
        return out[1:]

    def reply(self, value) -> None:
        dist.gather_object(value, None, dst=0, group=self.group)


# ---- the workers ---------------------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    """A spawned worker's daemon thread: exit when rank 0's process is gone. A worker waiting in an
    NCCL collective would otherwise wait for a dead peer until the group's timeout."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def use_device(config: EngineConfig, rank: int, world_size: int) -> None:
    """A rank's device: its own GPU, or its share of the CPU cores (oversubscribed OpenMP threads crawl)."""
    if config.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        set_cpu_threads(world_size)


def serve_engine(channel, config: EngineConfig, model_config: ModelConfig, model_path: str) -> bool:
    """A worker's life with one engine: build this rank's shard, run what rank 0 sends, and on STOP
    free the device and answer "stopped" (-> True); -> False when rank 0 went away first."""
    runner = None
    try:
        runner = ShardRunner(config, model_config, model_path, dist.group.WORLD)
        if runner.serve(channel):
            runner.shutdown()  # the memory is back before rank 0 hears "stopped"
            channel.reply("stopped")
            return True
        return False
    finally:
        if runner is not None:
            runner.shutdown()
        del runner  # nothing may hold the ProcessGroup when it is destroyed


def _worker_main(rank: int, world_size: int, port: int, config: EngineConfig, model_config: ModelConfig,
                 model_path: str, conn, parent_pid: int, setup: tuple[Callable[[], object], ...]) -> None:
    """A spawned worker process (rank >= 1): run `setup` (WORKER_SETUP's callables when it was spawned),
    join the group, serve rank 0's engine (serve_engine), then leave the group (see the module docstring)."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="minillm-watch-rank0").start()
    channel, stopped = PipeChannel([conn]), False
    try:
        for fn in setup:  # first: an error here is what rank 0 reads instead of the hello, and raises
            fn()
        send_message(conn, ("hello", os.getpid()))  # the interpreter is up: rank 0 may enter the rendezvous
        use_device(config, rank, world_size)
        join_group(rank, world_size, config.device, port)
        stopped = serve_engine(channel, config, model_config, model_path)
    except BaseException as e:  # noqa: BLE001 -- reported to rank 0, which raises it
        try:
            send_message(conn, ("error", *pack_error(e)))
        except Exception:
            pass
    finally:
        del channel
        leave_group(abort=not stopped)  # out of step with rank 0: do not wait for it
        conn.close()


# ---- torchrun (minillm.launch) -------------------------------------------------------------------
_TORCHRUN: BroadcastChannel | None = None  # minillm.launch opens it on every rank before anything else


def serve_torchrun(channel: BroadcastChannel) -> None:
    """A torchrun rank > 0 under minillm.launch: serve every engine rank 0's script creates, one after
    another, until the script ends (EXIT) or rank 0 goes away."""
    rank, world = dist.get_rank(), dist.get_world_size()
    while (msg := channel.recv()) is not None and msg[0] == "engine":
        config, model_config, model_path, setup = msg[1:]
        # rank 0's WORKER_SETUP when it created this engine (the notebook switch's swap): on for this
        # engine alone, as in a spawned worker, since this process goes on to serve the next engine
        done = [fn() for fn in setup]
        try:
            use_device(config, rank, world)
            if not serve_engine(channel, config, model_config, model_path):
                return
        finally:
            for undo in reversed(done):
                if hasattr(undo, "restore"):
                    undo.restore()


class _Workers:
    """What shutting down needs, kept apart from the runner so a finalizer can hold it."""

    def __init__(self):
        self.procs, self.conns, self.channel = [], [], None
        self.store = None  # the rendezvous server: it lives as long as the group
        self.threads = None  # this process's torch thread count before the engine shared the cores
        self.memory = None  # rank 0's DeviceMemory, freed first
        self.owns_group = False
        self.broken = False  # an error left the ranks out of step: kill, do not ask
        self.closed = False

    def close(self) -> None:
        """The ordered teardown of the module docstring; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.memory is not None:
            self.memory.release()
        stopped = not self.broken and self._stop_workers()
        if not stopped:  # a worker may sit in a collective that never completes: nothing to wait for
            for p in self.procs:
                if p.exitcode is None:
                    p.kill()
        self.channel = None  # the torchrun channel holds a gloo group of its own
        if self.owns_group:
            leave_group(abort=not stopped)
        for p in self.procs:
            p.join(timeout=JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()
        self.store = None
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def _stop_workers(self) -> bool:
        """Send STOP; -> True once every worker has answered (it is leaving the group), False when one
        died, failed or did not answer within STOP_TIMEOUT_S."""
        if self.channel is None:
            return True
        if any(p.exitcode is not None for p in self.procs):
            return False
        try:
            self.channel.send(STOP)
            self.channel.replies(timeout_s=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 -- a dead pipe, an error report, a timeout: all mean "kill"
            return False
        return True


class TPModelRunner(ShardRunner):
    """Rank 0 of a tensor-parallel engine: LLMEngine uses it like a ModelRunner (launch / resolve,
    num_kvcache_blocks, shutdown)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, model_path: str):
        size = config.tensor_parallel_size
        self.broken: str | None = None
        self._starting = True  # until the end of __init__: a failure frees only what rank 0 built
        self.memory = None  # ModelRunner.__init__ builds it (a failure before that has none to free)
        self._workers = w = _Workers()
        self._finalizer = weakref.finalize(self, w.close)
        if launched_by_torchrun():
            self._start_torchrun(config, model_config, model_path)
        else:
            self._spawn_workers(size, config, model_config, model_path)
        try:
            super().__init__(config, model_config, model_path, dist.group.WORLD)
        except BaseException as e:
            self._fail(e)
        # one finalizer for everything, in the teardown's order: rank 0's memory, then the workers
        self._release.detach()
        w.memory, self._release = self.memory, self._finalizer
        self._starting = False

    # ---- start-up -------------------------------------------------------------------------------
    def _start_torchrun(self, config: EngineConfig, model_config: ModelConfig, model_path: str) -> None:
        """Rank 0 of a torchrun job run through minillm.launch: the other ranks wait in serve_torchrun
        for this engine's configuration."""
        size, world = config.tensor_parallel_size, int(os.environ["WORLD_SIZE"])
        if _TORCHRUN is None:
            raise ValueError("under torchrun, start your script through minillm's launcher, which makes rank 0 run "
                             "it and the other ranks serve its engines: torchrun --nproc-per-node N -m "
                             "minillm.launch your_script.py [args]")
        if world != size:
            raise ValueError(f"launched with WORLD_SIZE={world} but tensor_parallel_size={size}; "
                             f"start torchrun with as many processes as tensor_parallel_size")
        use_device(config, 0, size)
        self._workers.channel = _TORCHRUN
        _TORCHRUN.send(("engine", config, model_config, model_path, tuple(WORKER_SETUP)))

    def _spawn_workers(self, size: int, config, model_config, model_path) -> None:
        if dist.is_initialized():
            raise RuntimeError("this process already has a torch.distributed process group: another "
                               "tensor-parallel LLM is still alive. Call .shutdown() on it first (in a notebook: "
                               "run `llm.shutdown()` before re-running `llm = LLM(...)`, or create engines with "
                               "`with LLM(...) as llm:`)")
        w = self._workers
        ctx = torch.multiprocessing.get_context("spawn")
        w.store = store = start_store()
        for rank in range(1, size):
            mine, theirs = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_worker_main, name=f"tensor-parallel worker rank {rank}",
                            args=(rank, size, store.port, config, model_config, model_path, theirs, os.getpid(),
                                  tuple(WORKER_SETUP)))
            p.start()
            theirs.close()
            w.procs.append(p)
            w.conns.append(mine)
        w.channel = PipeChannel(w.conns, w.procs)
        try:  # every worker says hello before this process blocks in the rendezvous
            w.channel.replies(timeout_s=STARTUP_TIMEOUT_S)
            if config.device == "cuda":
                torch.cuda.set_device(0)
            else:  # N processes share this machine's cores (oversubscribed OpenMP threads crawl)
                w.threads = torch.get_num_threads()
                set_cpu_threads(size)
            join_group(0, size, config.device, store.port)
            w.owns_group = True
        except BaseException as e:
            self._fail(e)

    # ---- steps ----------------------------------------------------------------------------------
    def send_batch(self, batch: Batch) -> None:
        self._workers.channel.send(("step", batch))  # the workers run the same forward on it

    def launch(self, *args, **kwargs):
        return self._guarded(super().launch, *args, **kwargs)

    def resolve(self, pending):
        event = pending.event
        if event is not None:  # NCCL waits forever on a dead peer: poll the workers while the GPU works
            self._guarded(self._wait_event, event)
        return self._guarded(super().resolve, pending)

    def _wait_event(self, event) -> None:
        last = time.monotonic()
        while not event.query():
            if time.monotonic() - last > 0.01:
                self._check_workers()
                last = time.monotonic()

    def collective_rpc(self, fn, *args) -> list:
        """Run fn(runner, *args) on every rank (fn importable by name). -> the results, by rank."""
        def call():
            self._workers.channel.send(("rpc", fn, args))
            mine = fn(self, *args)
            return [mine] + self._workers.channel.replies()
        return self._guarded(call)

    @property
    def worker_processes(self) -> list:
        return list(self._workers.procs)

    def _free_device(self) -> None:
        if not self._starting:  # one finalizer frees rank 0's memory, then stops the workers
            return super()._free_device()
        # start-up failed: free what rank 0 built; the workers go once _fail has read their own errors
        self.model = self.graphs = self.kv_cache = None
        self.attention_layers = []
        if self.memory is not None:
            self.memory.release()
        if self.broken:
            self._finalizer()

    # ---- failure --------------------------------------------------------------------------------
    def _guarded(self, fn, *args, **kwargs):
        if self.broken:
            raise RuntimeError(f"the tensor-parallel engine has stopped after an error ({self.broken}); "
                               f"create a new LLM")
        self._check_alive()
        self._check_workers()
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            if self.broken:  # _fail has run (inside fn) and raised this: the engine is already stopped
                raise
            self._fail(e)

    def _check_workers(self) -> None:
        if any(p.exitcode is not None for p in self._workers.procs):
            self._fail(None)

    def _worker_failure(self, grace_s: float) -> BaseException | None:
        """A worker's own error report, or a RuntimeError naming a dead worker; None if all look fine."""
        w = self._workers
        deadline = time.monotonic() + grace_s
        while True:
            for rank, (conn, p) in enumerate(zip(w.conns, w.procs), start=1):
                try:
                    if conn.poll():
                        kind, *payload = recv_message(conn)
                        if kind == "error":
                            return remote_error(*payload, f"tensor-parallel worker rank {rank}")
                except (EOFError, OSError):
                    pass
            for rank, p in enumerate(w.procs, start=1):
                if p.exitcode is not None:
                    hint = (" while starting (its error is printed above; a script must create a tensor-parallel "
                            "LLM under `if __name__ == '__main__':`, since spawned workers import the main "
                            "module)") if self._starting else "; the engine cannot continue"
                    return RuntimeError(f"tensor-parallel worker rank {rank} (pid {p.pid}) "
                                        f"{exit_description(p.exitcode)}{hint}")
            left = deadline - time.monotonic()
            if left <= 0 or not w.procs:
                return None
            wait(w.conns + [p.sentinel for p in w.procs], timeout=left)

    def _fail(self, exc: BaseException | None):
        """Stop everything and raise the error that explains it best."""
        # a collective that failed (RuntimeError, OSError) or a dead pipe points at a worker
        blame_workers = exc is None or isinstance(exc, (RuntimeError, OSError, EOFError, TimeoutError))
        worker_exc = self._worker_failure(ERROR_GRACE_S) if blame_workers else None
        chosen = worker_exc if worker_exc is not None else exc
        if chosen is None:
            chosen = RuntimeError("the tensor-parallel engine failed for an unknown reason")
        self.broken = f"{type(chosen).__name__}: {str(chosen).splitlines()[0] if str(chosen) else ''}"
        self._workers.broken = True
        self.shutdown()
        if chosen is exc:
            raise exc
        raise chosen from exc
