"""Chapter 4 (tensor parallel), graded with two gloo processes on CPU against single-process
references nobody here wrote: transformers' Qwen3 MLP and attention projections, torch's
nn.Embedding / nn.Linear, torch.chunk.

Each test first runs the function with one rank (a 1-process gloo group in this process: quick, and
a stub fails here), then spawns two ranks (minillm.course.ranks.run_on_ranks) that run the function
under test on their shards; the results come back and are compared here.

The collectives are also graded on two ranks inside this process (two threads joined by torch's
in-process "threaded" process group, the one torch's own distributed tests use): quick, and able
to run any function given to the test, so a wrong result is compared with the known wrong versions
in mistakes_ch4.py on the same input and a failure that matches one of them names the bug.

    pytest tests/exercises -m ex4_1 --impl=exercises
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import linecache
import os
import sys
import threading

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from minillm.course.exercises import REPO_DIR, load_impl
from minillm.course.grading import check_close, check_equal, check_that, check_type, check_unmodified
from minillm.course.ranks import run_on_ranks
from minillm.distributed import tensor_parallel
from mistakes import call_pure, copied, suspects, suspects_of, wrong_versions
from properties import outcome

TP = 2
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 96, 4, 2, 16, 512
ATOL, RTOL = 1e-5, 1e-4  # fp32; the all-reduce sums partial products in another order
BF16_TOL = (2e-2, 2e-2)  # bfloat16 (8 bits of mantissa): partial products and their sum rounded, a few ulps
THREAD_RANKS_TIMEOUT_S = 60.0  # a rank waiting in a collective the other rank never calls gives up after this


@pytest.fixture(scope="module")
def hf():
    return hf_modules()


@functools.cache
def hf_modules():
    """Transformers' own Qwen3 MLP and attention projections from a tiny config, random weights."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3MLP
    cfg = Qwen3Config(hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB)
    torch.manual_seed(0)
    mlp, attn = Qwen3MLP(cfg).eval(), Qwen3Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in list(mlp.parameters()) + list(attn.parameters()):
            p.normal_(0, 0.1)
    return mlp, attn


def chunk(t: torch.Tensor, dim: int, rank: int) -> torch.Tensor:
    return t.chunk(TP, dim=dim)[rank].contiguous()


TP_GROUPS = [[0, 1], [2, 3]]  # two tensor-parallel groups of TP ranks in a world of 4 (neither is WORLD)
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "gather", "reduce", "send", "recv")
# the collectives torch's threaded process group runs, each of which returns a handle with async_op=True
ASYNC_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                     "broadcast", "gather", "scatter", "all_to_all", "barrier")
POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv")  # the threaded group has none of these
NOT_WAITED = ("called torch.distributed.{op}(..., async_op=True) and never called .wait() on the handle it "
              "returned: the collective returned before the data arrived (these thread ranks happen to finish it "
              "first; between processes the tensor is read while the other ranks' parts are still on their way). "
              "Call it without async_op, or call .wait() on its result before using the tensor")
REDUCED_TO_ONE = ("called torch.distributed.reduce, which leaves the sum on rank {to} of the group alone, and rank "
                  "{other} needs the sum too: all_reduce, not reduce")
GATHER_LIST_SIZE = ("passed torch.distributed.gather a gather_list of {n} tensors in a group of {size} ranks: gloo and "
                    "NCCL refuse it (these thread ranks would not); the list holds one tensor per rank of the group, "
                    "dist.get_world_size(group) of them")
NOT_CONTIGUOUS = ("passed torch.distributed.{op} a tensor that is not contiguous ({name}, strides {strides}): NCCL, the "
                  "backend of GPUs, refuses it ('Tensors must be contiguous'; gloo and these thread ranks take it). "
                  "Make it contiguous first (.contiguous(), or compute it in the layout it is sent in)")
POINT_TO_POINT_CALLED = ("called torch.distributed.{op}, which moves a tensor from one rank to one other: this "
                         "exercise needs a collective that every rank of the group calls, the same one on each "
                         "(all_reduce, all_gather, gather, with group=group)")


class CollectiveMisuse(Exception):
    """A rank's call of torch.distributed that the thread ranks refuse (one they cannot run: reduce, send, recv),
    or a collective's handle never waited on: what the bug is, in the same words for every rank and input (so
    a known wrong version that does the same is named); site: the line of the call, when the error is raised
    after it returned (a handle found un-waited once the function has returned)."""

    def __init__(self, message: str, site: str = ""):
        super().__init__(message)
        self.site = site


class _Handle:
    """A collective's async_op=True handle (torch's Work) that remembers whether .wait() was called."""

    def __init__(self, work, op: str, site: str):
        self._work, self.op, self.site, self.waited = work, op, site, False

    def wait(self, *args, **kwargs):
        self.waited = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _call_site(frame) -> str:
    """'exercises/ch4.py:57 in row_parallel_linear: <that line>' for a frame of the caller."""
    path = os.path.relpath(frame.f_code.co_filename, REPO_DIR).replace(os.sep, "/")
    return (f"{path}:{frame.f_lineno} in {frame.f_code.co_name}: "
            f"{linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()}")


def _reduce_refused(args: dict) -> CollectiveMisuse:
    """reduce's CollectiveMisuse: names its destination (rank `to` of the group) and a rank left without the sum."""
    to = args.get("group_dst")
    if to is None:
        try:
            to = dist.get_group_rank(args.get("group") or dist.group.WORLD, args.get("dst") or 0)
        except Exception:  # noqa: BLE001 -- a dst outside the group: torch's own error would follow
            to = 0
    return CollectiveMisuse(REDUCED_TO_ONE.format(to=to, other=1 if to == 0 else 0))


@contextlib.contextmanager
def checked_collectives(handles: threading.local):
    """While it lasts, a rank's torch.distributed calls are checked for what the thread ranks would hide or cannot
    run: a collective called with async_op=True returns a _Handle, listed in handles.pending of the rank's thread
    (_thread_ranks fails a rank that returns with one not waited on: the threaded group finishes a collective
    before returning, so the missing wait() that races between processes passes here); reduce and the
    point-to-point calls raise CollectiveMisuse (the threaded group has none of them, and none is what a
    chapter 4 exercise needs)."""
    real = {op: getattr(dist, op) for op in ASYNC_COLLECTIVES + POINT_TO_POINT + ("reduce",)}
    signature = {op: inspect.signature(fn) for op, fn in real.items()}

    def refused(op):
        def call(*args, **kwargs):
            if op == "reduce":
                raise _reduce_refused(signature[op].bind(*args, **kwargs).arguments)
            raise CollectiveMisuse(POINT_TO_POINT_CALLED.format(op=op))
        return call

    def handled(op):
        def call(*args, **kwargs):
            bound = signature[op].bind(*args, **kwargs).arguments
            for name, value in bound.items():  # every tensor a collective sends or fills, lists' included
                for t in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(t, torch.Tensor) and not t.is_contiguous():
                        raise CollectiveMisuse(NOT_CONTIGUOUS.format(op=op, name=name, strides=tuple(t.stride())))
            if op == "gather":  # the threaded group takes a gather_list of any length; the real backends do not
                bound = signature[op].bind(*args, **kwargs).arguments
                parts, size = bound.get("gather_list"), dist.get_world_size(bound.get("group"))
                if parts and len(parts) != size:
                    raise CollectiveMisuse(GATHER_LIST_SIZE.format(n=len(parts), size=size))
            result = real[op](*args, **kwargs)
            if not signature[op].bind(*args, **kwargs).arguments.get("async_op"):
                return result
            handle = _Handle(result, op, _call_site(sys._getframe(1)))
            getattr(handles, "pending", []).append(handle)
            return handle
        return call
    for op in real:
        setattr(dist, op, handled(op) if op in ASYNC_COLLECTIVES else refused(op))
    try:
        yield
    finally:
        for op, fn in real.items():
            setattr(dist, op, fn)


def _wake_ranks(group_class) -> None:
    """Release every rank waiting in a collective of the threaded group (they leave with SystemExit):
    ProcessLocalGroup.exception_handle, except that the collectives are listed under the group's own lock.
    torch's version iterates them while other ranks add and remove theirs, and once raised "dictionary
    changed size during iteration" in a rank's thread (make test, 2026-12-06): a rank it did not notify
    would then wait out THREAD_RANKS_TIMEOUT_S. A collective begun after the listing sees the terminate
    flag, set first, before it waits."""
    group_class._terminate.set()
    with group_class._coll_lock:
        collectives = list(group_class._cur_coll_on_pgs.values())
    for coll in collectives:
        with coll._start_cond:
            coll._start_cond.notify()
        with coll._done_cond:
            coll._done_cond.notify_all()


def _thread_ranks(fn, rank_calls: list[tuple], groups: list[list[int]] | None = None) -> tuple[list, list]:
    """Rank r (a thread of this process) runs fn(*rank_calls[r], group), the ranks joined by torch's
    in-process "threaded" process group: every torch.distributed call works as between processes.
    group: WORLD, or with `groups` (lists of ranks covering the world) the one holding rank r, made by
    dist.new_group on every rank. -> (the ranks' outputs, the errors they raised: None, or the error; a
    rank released from a collective by another rank's error raises SystemExit; one that returned with an
    async_op=True handle it never waited on gets a CollectiveMisuse, as do calls the threaded group cannot
    run: checked_collectives)."""
    from torch.testing._internal.distributed.multi_threaded_pg import (ProcessLocalGroup, _install_threaded_pg,
                                                                        _uninstall_threaded_pg)
    store, size = dist.HashStore(), len(rank_calls)
    outputs, errors = [None] * size, [None] * size
    handles = threading.local()  # each rank's async_op=True handles (checked_collectives)

    def rank_main(rank: int) -> None:
        try:
            dist.init_process_group("threaded", rank=rank, world_size=size, store=store)
            try:
                group = dist.group.WORLD
                if groups is not None:
                    made = [dist.new_group(ranks) for ranks in groups]  # every rank makes every group, in order
                    group = next(g for g, ranks in zip(made, groups) if rank in ranks)
                handles.pending = []
                with torch.no_grad():
                    outputs[rank] = fn(*rank_calls[rank], group)
            finally:
                dist.destroy_process_group()
        except BaseException as e:  # noqa: BLE001 -- raised in the caller's thread (on_thread_ranks)
            errors[rank] = e
            _wake_ranks(ProcessLocalGroup)  # the other ranks out of their collectives
            return
        not_waited = next((h for h in handles.pending if not h.waited), None)
        if not_waited is not None:  # the rank's error, though it returned: the others go on as after a return
            errors[rank] = CollectiveMisuse(NOT_WAITED.format(op=not_waited.op), not_waited.site)

    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # each thread keeps its own group names
    _install_threaded_pg()
    try:
        with checked_collectives(handles):
            threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(THREAD_RANKS_TIMEOUT_S)
            stuck = [r for r, t in enumerate(threads) if t.is_alive()]
            if stuck:
                _wake_ranks(ProcessLocalGroup)
                for t in threads:
                    t.join(5.0)
                raise TimeoutError(f"ranks {stuck} still wait after {THREAD_RANKS_TIMEOUT_S:.0f} s: a collective "
                                   f"that not every rank calls?")
    finally:
        _uninstall_threaded_pg()
        ProcessLocalGroup.reset()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    return outputs, errors


def on_thread_ranks(fn, rank_calls: list[tuple], groups: list[list[int]] | None = None) -> list:
    """fn on thread ranks (_thread_ranks) -> [rank 0's output, rank 1's output, ...]. The first error a
    rank raised is raised here (the other ranks are released from any collective they wait in)."""
    outputs, errors = _thread_ranks(fn, rank_calls, groups)
    for e in errors:
        if e is not None and not isinstance(e, SystemExit):  # SystemExit: a rank released by another's error
            raise e
    return outputs


def rank_error(fn, rank_calls: list[tuple], groups: list[list[int]] | None = None) -> str | None:
    """The errors ranks raised running fn on thread ranks, as 'rank 0: Type: message' for each rank that
    raised one of its own (not one released from a collective by another's error); None if none did.
    Which ranks raise is part of the result: a known bug that raises the same error on other ranks is
    another bug (an IndexError on rank 1 from unshifted ids is not one on rank 0 from a mask one too wide)."""
    return errors_named(_thread_ranks(fn, rank_calls, groups)[1])


def errors_named(errors: list) -> str | None:
    """'rank 0: Type: message; ...' for each rank whose error is its own (not SystemExit); None if none is."""
    own = [f"rank {r}: {type(e).__name__}: {e}" for r, e in enumerate(errors)
           if e is not None and not isinstance(e, SystemExit)]
    return "; ".join(own) or None


@contextlib.contextmanager
def recording_collectives():
    """Records the torch.distributed collectives each rank calls while it lasts: -> {global rank: [the
    names of the collectives it called, in order]} (filled in as they are called)."""
    calls: dict[int, list[str]] = {}
    real = {op: getattr(dist, op) for op in COLLECTIVES}

    def recorded(op):
        def call(*args, **kwargs):
            calls.setdefault(dist.get_rank(), []).append(op)
            return real[op](*args, **kwargs)
        return call
    for op in COLLECTIVES:
        setattr(dist, op, recorded(op))
    try:
        yield calls
    finally:
        for op, fn in real.items():
            setattr(dist, op, fn)


def collectives_on_thread_ranks(fn, rank_calls: list[tuple]) -> list | str:
    """The collectives each rank called running fn on thread ranks: [rank 0's names, rank 1's, ...], or
    what a rank raised."""
    with recording_collectives() as calls:
        error = rank_error(fn, rank_calls)
    return error or [calls.get(r, []) for r in range(len(rank_calls))]


def copies_of(rank_calls: list[tuple]) -> list[tuple]:
    """Each rank's arguments with its own copy of every tensor (ranks may be given one shared tensor)."""
    return [tuple(map(copied, call)) for call in rank_calls]


def graded_on_thread_ranks(impl, name: str, rank_calls: list[tuple], exercise_id: str,
                           groups: list[list[int]] | None = None, also: tuple[list[tuple], ...] = ()) -> list:
    """Your `name` on thread ranks (groups: as _thread_ranks) -> the ranks' outputs. Each rank gets its
    own copies of the tensors of rank_calls, which it must leave as they were (a rank that writes into an
    input fails the test, naming the input). An error a rank raises (other than a stub's
    NotImplementedError) fails the test, naming a known bug that raises the same errors on the same
    ranks; an error that minillm's own version raises too is this machine's, and is raised as it is.
    also: the test's other inputs (rank_calls each): a known bug is named for an error only where it also does
    what your code does on them (the same error on another input can be another bug's)."""
    given = copies_of(rank_calls)
    outputs, errors = _thread_ranks(getattr(impl, name), given, groups)
    raised = [e for e in errors if e is not None and not isinstance(e, SystemExit)]
    if raised:
        if isinstance(raised[0], NotImplementedError):
            raise raised[0]
        ref_error = rank_error(getattr(load_impl("ref"), name), copies_of(rank_calls), groups)
        if ref_error is not None:
            raise RuntimeError(f"thread ranks fail here for minillm's own {name} as well ({ref_error}): this "
                               f"machine's torch.distributed, not the code under test") from raised[0]
        elsewhere = lambda fn: [rank_error(fn, copies_of(calls), groups) for calls in also]  # noqa: E731
        suspected = suspects_of(name, lambda fn: rank_error(fn, copies_of(rank_calls), groups),
                                agree=(elsewhere, lambda: elsewhere(getattr(impl, name))) if also else None)
        misuse = next(((r, e) for r, e in enumerate(errors) if isinstance(e, CollectiveMisuse)), None)
        try:
            if misuse is not None:  # the harness's own words name the bug (and the line, for a handle not waited on)
                rank, error = misuse
                check_that(f"{error}" + (f"\n  the call: {error.site}" if error.site else ""), exercise_id,
                           f"{name} on rank {rank} of {len(rank_calls)}{groups_named(groups)}",
                           actual=errors_named(errors), suspects=suspected)
            check_equal(errors_named(errors), "no error", exercise_id,
                        f"what {name} did on {len(rank_calls)} ranks{groups_named(groups)}", suspects=suspected)
        except AssertionError as failure:
            raise failure from (misuse[1] if misuse is not None else raised[0])
    names = list(inspect.signature(getattr(load_impl("ref"), name)).parameters)

    def left_in(fn, rank: int, i: int):
        """What fn leaves in argument i of rank `rank` when the ranks run it on fresh copies."""
        fresh = copies_of(rank_calls)
        on_thread_ranks(fn, fresh, groups)
        return fresh[rank][i]

    for rank, (call, after) in enumerate(zip(rank_calls, given)):
        for i, (before, now) in enumerate(zip(call, after)):
            if isinstance(before, torch.Tensor):
                check_unmodified(before, now, exercise_id, name, names[i], where=f" on rank {rank}",
                                 suspects={hint: (lambda fn=fn, rank=rank, i=i: left_in(fn, rank, i))
                                           for hint, fn in wrong_versions(name).items()})
    return outputs


def groups_named(groups: list[list[int]] | None) -> str:
    """' in the tensor-parallel groups of ranks [0, 1] and [2, 3] (...)' for a message ('' for WORLD)."""
    return "" if groups is None else (" in the tensor-parallel groups of ranks " + " and ".join(map(str, groups)) +
                                      ", two groups running at once (each rank is given its own group: every "
                                      "collective needs group=group, and the rank in it is dist.get_rank(group))")


class RankOutputs(list):
    """Every rank's outputs, equal to another's where each rank's is: None for None, tensors of one shape and
    dtype with values within BF16_TOL (a rounding apart, not another bug), anything else by ==."""

    __hash__ = None

    def __eq__(self, other) -> bool:
        return isinstance(other, list) and len(self) == len(other) and all(map(_same_output, self, other))


def _same_output(a, b) -> bool:
    """RankOutputs' test for one rank's outputs."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        atol, rtol = BF16_TOL
        return (a.shape == b.shape and a.dtype == b.dtype
                and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return a == b


def everywhere_suspects(name: str, rank_calls: list[tuple], outputs: list, part, groups=None) -> dict:
    """diagnosis -> part(every rank's output) of each known wrong version of `name` on thread ranks (each run on
    fresh copies of the inputs), for those whose outputs match `outputs` (the code under test's) on EVERY rank:
    one that matches on the rank checked alone is another bug (a right gather that returns a tensor on rank 1 is
    not a missing gather, though rank 1's tensor is the same)."""
    ran = functools.cache(lambda fn: RankOutputs(on_thread_ranks(fn, copies_of(rank_calls), groups)))
    return suspects_of(name, lambda fn: part(ran(fn)), agree=(ran, lambda: RankOutputs(outputs)))


def check_tensor_on_rank(y, name: str, rank_calls: list[tuple], rank: int, outputs: list, exercise_id: str,
                         what: str, groups: list[list[int]] | None = None) -> None:
    """Rank `rank`'s output y (outputs: every rank's) must be a tensor (checked before its values: check_close
    cannot name a known bug that returns None); a known wrong version that returns what your code does on
    every rank is named."""
    check_type(y, torch.Tensor, exercise_id, f"{name} must return a tensor on every rank: {what}",
               f"{name} on rank {rank}",
               suspects=everywhere_suspects(name, rank_calls, outputs, lambda out: type(out[rank]).__name__, groups))


def rank_suspects(name: str, rank_calls: list[tuple], rank: int, outputs: list,
                  groups: list[list[int]] | None = None) -> dict:
    """diagnosis -> rank `rank`'s output of each known wrong version of `name` on thread ranks whose outputs
    match `outputs` (your code's, every rank's) on every rank (everywhere_suspects)."""
    return everywhere_suspects(name, rank_calls, outputs, lambda out: out[rank], groups)


def check_none_on_rank(y, name: str, rank: int, exercise_id: str, where: str, suspected: dict) -> None:
    """Rank `rank` (not its group's first; where: e.g. " of 2") must return None (parallel_lm_head): a tensor
    there is named as one, with why the rank returns None, not printed as a list of values."""
    got = None if y is None else (f"a tensor of shape {tuple(y.shape)}" if isinstance(y, torch.Tensor)
                                  else f"a {type(y).__name__}")
    check_that(None if y is None else f"(it returned {got})", exercise_id,
               f"{name} must return None on rank {rank}{where}: rank 0 of the group alone holds the full logits "
               f"(it samples); every other rank returns None, as vLLM's LM head does", actual=y, suspects=suspected)


@contextlib.contextmanager
def one_rank_group():
    """A 1-process gloo group in the test process (removed afterwards)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


# ---- what the ranks run (spawn imports this module by name) ----------------------------------------
def _impl_fn(impl_name: str, name: str):
    return getattr(load_impl(impl_name), name)


def _rank_sharded_layers(impl_name: str, weights: dict, x: torch.Tensor, z: torch.Tensor) -> dict:
    """Exercise 4.1 inside the engine: the parallel layers' weight loaders call shard_weight and
    shard_packed; swap in the implementation under test, load full checkpoint tensors, run."""
    from minillm.layers.activation import silu_and_mul
    from minillm.layers.embed_head import VocabParallelEmbedding
    from minillm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    for mod in ("minillm.layers.linear", "minillm.layers.embed_head"):
        m = importlib.import_module(mod)
        for name in ("shard_weight", "shard_packed"):
            if hasattr(m, name):
                setattr(m, name, _impl_fn(impl_name, name))
    rank = dist.get_rank()
    with tensor_parallel():
        qkv = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS)
        qkv_packed = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS)
        o = RowParallelLinear(HEADS * HEAD_DIM, HIDDEN)
        gate_up = MergedColumnParallelLinear(HIDDEN, [INTER, INTER])
        gate_up_packed = MergedColumnParallelLinear(HIDDEN, [INTER, INTER])
        down = RowParallelLinear(INTER, HIDDEN)
        embed = VocabParallelEmbedding(VOCAB, HIDDEN)
    w = weights
    with torch.no_grad():
        for sid in ("q", "k", "v"):
            qkv.weight.weight_loader(qkv.weight, w[f"{sid}_proj"], sid)
        qkv_packed.weight.weight_loader(qkv_packed.weight, torch.cat([w["q_proj"], w["k_proj"], w["v_proj"]]))
        o.weight.weight_loader(o.weight, w["o_proj"])
        gate_up.weight.weight_loader(gate_up.weight, w["gate_proj"], 0)
        gate_up.weight.weight_loader(gate_up.weight, w["up_proj"], 1)
        gate_up_packed.weight.weight_loader(gate_up_packed.weight, torch.cat([w["gate_proj"], w["up_proj"]]))
        down.weight.weight_loader(down.weight, w["down_proj"])
        embed.weight.weight_loader(embed.weight, w["embed"])
        return {
            "qkv": qkv(x), "qkv_packed_weight": qkv_packed.weight.clone(), "qkv_weight": qkv.weight.clone(),
            "gate_up": gate_up(x), "gate_up_packed_weight": gate_up_packed.weight.clone(),
            "gate_up_weight": gate_up.weight.clone(),
            "o": o(z.chunk(TP, dim=-1)[rank]),  # the row layer sees this rank's slice of its input
            "mlp": down(silu_and_mul(gate_up(x))),
            "embed_weight": embed.weight.clone(),
        }


def _rank_call(impl_name: str, name: str, rank_calls: list[list[tuple]], count_collectives: bool = False):
    """Rank r calls fn(*args, group) for each args in rank_calls[r]; -> the outputs (each with the
    collectives that call made, if asked)."""
    fn = _impl_fn(impl_name, name)
    calls = []
    if count_collectives:
        for op in COLLECTIVES:
            real = getattr(dist, op)
            setattr(dist, op, lambda *a, _real=real, _op=op, **k: (calls.append(_op), _real(*a, **k))[1])
    outs = []
    for args in rank_calls[dist.get_rank()]:
        calls.clear()
        with torch.no_grad():
            out = fn(*args, dist.group.WORLD)
        outs.append((out, list(calls)) if count_collectives else out)
    return outs


# ---- 4.1 ---------------------------------------------------------------------------------------------
@pytest.mark.ex4_1
def test_shard_weight_and_packed_match_torch_chunk(impl):
    torch.manual_seed(0)
    for shape, dim, n in (((12, 8), 0, 2), ((12, 8), 1, 4), ((6,), 0, 3), ((4, 6, 10), 2, 5)):
        w = torch.randn(shape)
        for r in range(n):
            check_equal(call_pure(impl.shard_weight, "shard_weight", "4.1", w, dim, r, n), w.chunk(n, dim=dim)[r],
                        "4.1",
                        f"shard_weight(shape {shape}, dim={dim}, rank={r}, world_size={n})",
                        suspects=suspects("shard_weight", w, dim, r, n))
    uneven = torch.randn(10, 4)  # 10 rows do not split into 3 equal shards

    def refused(fn) -> str:
        """What fn does with a dim that world_size does not divide: the error's type, or the shape it returned."""
        got = outcome(lambda: fn(uneven.clone(), 0, 0, 3))
        return got.split(":")[0] if isinstance(got, str) else f"returned a shard of shape {tuple(got.shape)}"
    check_equal(refused(impl.shard_weight), "raised ValueError", "4.1",
                "shard_weight(shape (10, 4), dim=0, rank=0, world_size=3): 10 rows do not split into 3 equal shards",
                suspects=suspects_of("shard_weight", refused))
    message = str(outcome(lambda: impl.shard_weight(uneven.clone(), 0, 0, 3)))
    check_equal(("10" in message, "3" in message), (True, True), "4.1",
                f"(the size 10, the world_size 3) named in shard_weight's ValueError, as the docstring asks (a reader "
                f"of a failed load needs them): {message!r}")
    q, k, v = torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 4)
    for r in range(2):
        want = torch.cat([q.chunk(2)[r], k.chunk(2)[r], v.chunk(2)[r]])
        packed = torch.cat([q, k, v])
        check_equal(call_pure(impl.shard_packed, "shard_packed", "4.1", packed, [8, 4, 4], r, 2), want, "4.1",
                    f"shard_packed([q | k | v], rank={r}): rank r's heads of q, then of k, then of v",
                    suspects=suspects("shard_packed", packed, [8, 4, 4], r, 2))
    too_long = torch.randn(17, 4)  # 17 rows for parts of [8, 4, 4]: a tensor of another layer, or a wrong config

    def packed_refused(fn) -> str:
        """What fn does with a packed tensor whose rows are not sum(output_sizes): the error's type, or the shape."""
        got = outcome(lambda: fn(too_long.clone(), [8, 4, 4], 0, 2))
        return got.split(":")[0] if isinstance(got, str) else f"returned a shard of shape {tuple(got.shape)}"
    # a second look before a bug is named: its shard of a right packed tensor (a version that splits the columns
    # fails here the same way, inside torch's split)
    shard_of_packed = lambda fn: outcome(lambda: fn(packed.clone(), [8, 4, 4], 0, 2))  # noqa: E731
    check_equal(packed_refused(impl.shard_packed), "raised ValueError", "4.1",
                "shard_packed(a tensor of 17 rows, output_sizes=[8, 4, 4], rank=0, world_size=2): 17 rows cannot hold "
                "parts of 8 + 4 + 4 = 16, and the docstring asks for a ValueError",
                suspects=suspects_of("shard_packed", packed_refused,
                                     agree=(shard_of_packed, lambda: shard_of_packed(impl.shard_packed))))


@pytest.mark.ex4_1
def test_sharded_layers_on_two_ranks_equal_transformers(impl, impl_name, hf):
    mlp, attn = hf
    torch.manual_seed(1)
    x, z = torch.randn(5, HIDDEN), torch.randn(5, HEADS * HEAD_DIM)
    embed = torch.nn.Embedding(VOCAB, HIDDEN)
    weights = {n: getattr(attn, n).weight.detach() for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    weights.update({n: getattr(mlp, n).weight.detach() for n in ("gate_proj", "up_proj", "down_proj")})
    weights["embed"] = embed.weight.detach()
    impl.shard_weight(weights["o_proj"], 1, 0, TP)  # a stub fails here, before any process starts
    outs = run_on_ranks(_rank_sharded_layers, TP, impl_name, weights, x, z)
    with torch.no_grad():
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        o_full, mlp_full = attn.o_proj(z), mlp(x)
    for r, out in enumerate(outs):
        check_close(out["qkv"], torch.cat([chunk(q, 1, r), chunk(k, 1, r), chunk(v, 1, r)], dim=1), "4.1",
                    f"QKVParallelLinear on rank {r}: [its q heads | its k heads | its v heads]", ATOL, RTOL)
        check_close(out["gate_up"], torch.cat([chunk(gate, 1, r), chunk(up, 1, r)], dim=1), "4.1",
                    f"MergedColumnParallelLinear on rank {r}: [its gate slice | its up slice]", ATOL, RTOL)
        check_close(out["o"], o_full, "4.1", f"RowParallelLinear (o_proj) after the all-reduce, rank {r}", ATOL, RTOL)
        check_close(out["mlp"], mlp_full, "4.1", f"the sharded MLP against transformers' Qwen3MLP, rank {r}",
                    ATOL, RTOL)
        check_equal(out["qkv_packed_weight"], out["qkv_weight"], "4.1",
                    f"a packed [q|k|v] checkpoint tensor loaded through shard_packed, rank {r}")
        check_equal(out["gate_up_packed_weight"], out["gate_up_weight"], "4.1",
                    f"a packed [gate|up] checkpoint tensor loaded through shard_packed, rank {r}")
        check_equal(out["embed_weight"], chunk(embed.weight.detach(), 0, r), "4.1",
                    f"the embedding's vocabulary rows on rank {r}")


# ---- 4.2 ---------------------------------------------------------------------------------------------
def row_parallel_case(seed: int = 2):
    """The MLP as Megatron runs it, and a row-parallel layer with a bias. -> (h, down, want_mlp,
    mlp_calls, biased_calls, want_biased): h the whole intermediate activation (one rank),
    mlp_calls[r] = rank r's (its slice of h, its columns of down_proj, None), biased_calls[r] the
    same for the biased layer (with its full bias). seed: the tokens (the weights stay)."""
    mlp, _ = hf_modules()
    torch.manual_seed(seed)
    x, z = torch.randn(7, HIDDEN), torch.randn(4, INTER)
    gate, up, down = (getattr(mlp, n).weight.detach() for n in ("gate_proj", "up_proj", "down_proj"))
    biased = torch.nn.Linear(INTER, HIDDEN)  # a row-parallel layer with a bias (o_proj of some models)
    w_b, b_b = biased.weight.detach(), biased.bias.detach()
    with torch.no_grad():
        want_mlp, want_biased = mlp(x), biased(z)
        h = F.silu(x @ gate.T) * (x @ up.T)  # the column half on one rank: all intermediate features
        # rank r's column half: its slice of the intermediate features, computed without any communication
        h_r = [F.silu(x @ chunk(gate, 0, r).T) * (x @ chunk(up, 0, r).T) for r in range(TP)]
    mlp_calls = [(h_r[r], chunk(down, 1, r), None) for r in range(TP)]
    biased_calls = [(chunk(z, 1, r), chunk(w_b, 1, r), b_b) for r in range(TP)]
    return h, down, want_mlp, mlp_calls, biased_calls, want_biased


@pytest.mark.ex4_2
def test_row_parallel_linear_on_two_thread_ranks(impl):
    """down_proj after each rank's column half of the MLP, then a row layer with a bias (added once),
    on two ranks in this process."""
    _, _, want_mlp, mlp_calls, biased_calls, want_biased = row_parallel_case()
    for calls, want, what in ((mlp_calls, want_mlp, "the MLP's output (column half, then your row_parallel_linear) "
                               "against transformers' Qwen3MLP"),
                              (biased_calls, want_biased, "a row-parallel layer with a bias against nn.Linear")):
        outs = graded_on_thread_ranks(impl, "row_parallel_linear", calls, "4.2")
        for r, y in enumerate(outs):
            check_tensor_on_rank(y, "row_parallel_linear", calls, r, outs, "4.2", what)
            check_close(y, want, "4.2", f"{what}, rank {r} of {TP}", ATOL, RTOL,
                        suspects=rank_suspects("row_parallel_linear", calls, r, outs))
    # bfloat16, as the engine runs it: the result is in x's dtype (rounding: each rank's partial product, the sum)
    calls = [tuple(t.bfloat16() if isinstance(t, torch.Tensor) else t for t in call) for call in biased_calls]
    z16, w16 = (torch.cat([call[i] for call in calls], dim=-1) for i in (0, 1))  # the whole layer, in bfloat16
    want = F.linear(z16.float(), w16.float(), calls[0][2].float()).bfloat16()
    outs = graded_on_thread_ranks(impl, "row_parallel_linear", calls, "4.2")
    for r, y in enumerate(outs):
        check_close(y, want, "4.2", f"a row-parallel layer with a bias in bfloat16, rank {r} of {TP} (vs F.linear in "
                    f"fp32 on the same bfloat16 values, rounded to bfloat16: the result in x's dtype)", *BF16_TOL,
                    suspects=rank_suspects("row_parallel_linear", calls, r, outs))
    # two tensor-parallel groups at once (ranks 0-1 and 2-3 of 4), each on its own tokens: each sums its own, and
    # each adds its bias once (a rank chosen by its place in the group, not in the world)
    _, _, want_b, mlp_calls_b, biased_calls_b, want_biased_b = row_parallel_case(seed=5)
    for calls, wants, what in ((mlp_calls + mlp_calls_b, [want_mlp] * TP + [want_b] * TP, "the MLP's output"),
                               (biased_calls + biased_calls_b, [want_biased] * TP + [want_biased_b] * TP,
                                "a row-parallel layer with a bias")):
        outs = graded_on_thread_ranks(impl, "row_parallel_linear", calls, "4.2", TP_GROUPS)
        for r, (y, want) in enumerate(zip(outs, wants)):
            check_close(y, want, "4.2", f"{what} on rank {r} of 4{groups_named(TP_GROUPS)}, each group on its own "
                        f"tokens", ATOL, RTOL, suspects=rank_suspects("row_parallel_linear", calls, r, outs, TP_GROUPS))


@pytest.mark.ex4_2
def test_column_then_row_mlp_equals_transformers_with_one_all_reduce(impl, impl_name):
    """The MLP as Megatron runs it: each rank's column half (gate, up: no communication), then the
    student's row_parallel_linear for down_proj; and a row layer with a bias (added once)."""
    h, down, want_mlp, mlp_calls, biased_calls, want_biased = row_parallel_case()
    with one_rank_group() as group, torch.no_grad():  # p = 1: the whole layer on one rank
        check_close(impl.row_parallel_linear(h, down, None, group), want_mlp, "4.2",
                    "row_parallel_linear with one rank (down_proj of the whole MLP)", ATOL, RTOL)
    rank_calls = [[mlp_calls[r], biased_calls[r]] for r in range(TP)]
    outs = run_on_ranks(_rank_call, TP, impl_name, "row_parallel_linear", rank_calls, True)
    for r, ((y, calls), (y_b, calls_b)) in enumerate(outs):
        check_close(y, want_mlp, "4.2", f"the MLP's output on rank {r} of 2 (column half, then your "
                    f"row_parallel_linear) against transformers' Qwen3MLP", ATOL, RTOL)
        check_equal(calls, ["all_reduce"], "4.2", f"the collectives rank {r} called (Megatron needs exactly one)")
        check_close(y_b, want_biased, "4.2", f"a row-parallel layer with a bias on rank {r} of 2 against "
                    f"nn.Linear (add the bias once, after the sum)", ATOL, RTOL)
        check_equal(calls_b, ["all_reduce"], "4.2", f"the collectives rank {r} called with a bias")


# ---- 4.3 ---------------------------------------------------------------------------------------------
def embedding_case():
    """-> (ids on both sides of the vocabulary cut, the full embedding weight, nn.Embedding's rows)."""
    torch.manual_seed(3)
    embed = torch.nn.Embedding(VOCAB, HIDDEN)
    half = VOCAB // TP
    ids = torch.tensor([0, 1, half - 1, half, half + 1, VOCAB - 1, 7, 300, 255, 256, 7])  # both sides of the cut
    with torch.no_grad():
        want = embed(ids)
    return ids, embed.weight.detach(), want


@pytest.mark.ex4_3
def test_vocab_parallel_embed_on_two_thread_ranks(impl):
    ids, weight, want = embedding_case()
    half = VOCAB // TP
    # first ids on both sides but none at the cut (id V/p, the first of rank 1's slice): each shard's mask needs
    # its upper bound here, and a bound one id too wide (<=) is still right
    away = torch.tensor([5, 300, half - 2, VOCAB - 1, half + 1, 100])
    away_calls = calls = [(away, chunk(weight, 0, r), r * half) for r in range(TP)]
    outs = graded_on_thread_ranks(impl, "vocab_parallel_embed", calls, "4.3")
    for r, y in enumerate(outs):
        what = f"vocab_parallel_embed of ids away from the cut ({away.tolist()}) on rank {r} of {TP}"
        check_tensor_on_rank(y, "vocab_parallel_embed", calls, r, outs, "4.3", what)
        check_close(y, F.embedding(away, weight), "4.3", f"{what} against nn.Embedding",
                    suspects=rank_suspects("vocab_parallel_embed", calls, r, outs))
    calls = [(ids, chunk(weight, 0, r), r * half) for r in range(TP)]
    outs = graded_on_thread_ranks(impl, "vocab_parallel_embed", calls, "4.3", also=(away_calls,))
    for r, y in enumerate(outs):
        check_close(y, want, "4.3", f"vocab_parallel_embed on rank {r} of {TP} against nn.Embedding",
                    suspects=rank_suspects("vocab_parallel_embed", calls, r, outs))
    # bfloat16, as the engine runs it: rows of the table in its own dtype (a lookup and a sum with zeros: exact)
    weight16 = weight.bfloat16()
    calls16 = [(ids, chunk(weight16, 0, r), r * half) for r in range(TP)]
    outs = graded_on_thread_ranks(impl, "vocab_parallel_embed", calls16, "4.3")
    for r, y in enumerate(outs):
        check_close(y, F.embedding(ids, weight16), "4.3", f"vocab_parallel_embed of a bfloat16 table on rank {r} of "
                    f"{TP} against nn.Embedding (the rows in weight_shard's dtype)", atol=0, rtol=0,
                    suspects=rank_suspects("vocab_parallel_embed", calls16, r, outs))
    # two tensor-parallel groups at once (ranks 0-1 and 2-3 of 4), each embedding its own ids
    ids_b = ids.flip(0)
    calls = calls + [(ids_b, chunk(weight, 0, r), r * half) for r in range(TP)]
    wants = [want] * TP + [F.embedding(ids_b, weight)] * TP
    outs = graded_on_thread_ranks(impl, "vocab_parallel_embed", calls, "4.3", TP_GROUPS)
    for r, (y, w) in enumerate(zip(outs, wants)):
        check_close(y, w, "4.3", f"vocab_parallel_embed on rank {r} of 4{groups_named(TP_GROUPS)}, each group "
                    f"embedding its own ids, against nn.Embedding",
                    suspects=rank_suspects("vocab_parallel_embed", calls, r, outs, TP_GROUPS))


@pytest.mark.ex4_3
def test_vocab_parallel_embed_equals_nn_embedding(impl, impl_name):
    ids, weight, want = embedding_case()
    half = VOCAB // TP
    with one_rank_group() as group, torch.no_grad():
        check_close(impl.vocab_parallel_embed(ids, weight, 0, group), want, "4.3", "vocab_parallel_embed with one rank")
    rank_calls = [[(ids, chunk(weight, 0, r), r * half)] for r in range(TP)]
    for r, (y,) in enumerate(run_on_ranks(_rank_call, TP, impl_name, "vocab_parallel_embed", rank_calls)):
        check_close(y, want, "4.3", f"vocab_parallel_embed on rank {r} (2 ranks) against nn.Embedding")


# ---- 4.4 ---------------------------------------------------------------------------------------------
def lm_head_case():
    """-> (hidden states, the full LM head weight, nn.Linear's logits)."""
    torch.manual_seed(4)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(3, HIDDEN)
    with torch.no_grad():
        want = head(hidden)
    return hidden, head.weight.detach(), want


@pytest.mark.ex4_4
def test_parallel_lm_head_on_two_thread_ranks(impl):
    hidden, weight, want = lm_head_case()
    calls = [(hidden, chunk(weight, 0, r)) for r in range(TP)]
    outs = graded_on_thread_ranks(impl, "parallel_lm_head", calls, "4.4")
    logits0, logits1 = outs
    check_close(logits0, want, "4.4", f"parallel_lm_head's logits on rank 0 ({TP} ranks) against nn.Linear", ATOL, RTOL,
                suspects=rank_suspects("parallel_lm_head", calls, 0, outs))
    check_none_on_rank(logits1, "parallel_lm_head", 1, "4.4", f" of {TP}",
                       rank_suspects("parallel_lm_head", calls, 1, outs))
    returned = lambda fn: outcome(lambda: [None if y is None else tuple(y.shape)  # noqa: E731 -- what each rank
                                           for y in on_thread_ranks(fn, copies_of(calls))])  # returned, by shape
    # bfloat16, as the engine runs it: the logits in hidden's dtype (each one a dot product rounded once)
    calls16 = [(hidden.bfloat16(), chunk(weight, 0, r).bfloat16()) for r in range(TP)]
    want16 = F.linear(hidden.bfloat16().float(), weight.bfloat16().float()).bfloat16()
    outs16 = graded_on_thread_ranks(impl, "parallel_lm_head", calls16, "4.4")
    check_close(outs16[0], want16, "4.4",
                f"parallel_lm_head's logits of bfloat16 hidden states on rank 0 ({TP} ranks) against F.linear in fp32 "
                f"on the same bfloat16 values, rounded to bfloat16 (the logits in hidden's dtype)", *BF16_TOL,
                suspects=rank_suspects("parallel_lm_head", calls16, 0, outs16))
    check_equal(collectives_on_thread_ranks(impl.parallel_lm_head, copies_of(calls)), [["gather"]] * TP, "4.4",
                "the collectives each rank called (rank 0 alone needs the logits: one torch.distributed.gather to "
                "it on every rank, not an all-gather, which sends every rank all of them)",
                suspects=suspects_of("parallel_lm_head", lambda fn: collectives_on_thread_ranks(fn, copies_of(calls)),
                                     agree=(returned, lambda: returned(impl.parallel_lm_head))))
    # two tensor-parallel groups at once (ranks 0-1 and 2-3 of 4), each on its own hidden states: rank 0 of
    # each group (ranks 0 and 2) gets its group's logits
    hidden_b = hidden.flip(0)
    calls = calls + [(hidden_b, chunk(weight, 0, r)) for r in range(TP)]
    wants = [want, None, F.linear(hidden_b, weight), None]
    outs = graded_on_thread_ranks(impl, "parallel_lm_head", calls, "4.4", TP_GROUPS)
    for r, (y, w) in enumerate(zip(outs, wants)):
        where = f" of 4{groups_named(TP_GROUPS)}, each group on its own hidden states (rank {r % TP} of its group)"
        suspected = rank_suspects("parallel_lm_head", calls, r, outs, TP_GROUPS)
        if w is None:
            check_none_on_rank(y, "parallel_lm_head", r, "4.4", where, suspected)
        else:
            check_close(y, w, "4.4", f"parallel_lm_head's result on rank {r}{where}: the logits", ATOL, RTOL,
                        suspects=suspected)


@pytest.mark.ex4_4
def test_parallel_lm_head_gathers_full_logits_on_rank_0(impl, impl_name):
    hidden, weight, want = lm_head_case()
    with one_rank_group() as group, torch.no_grad():
        check_close(impl.parallel_lm_head(hidden, weight, group), want, "4.4", "parallel_lm_head with one rank",
                    ATOL, RTOL)
    rank_calls = [[(hidden, chunk(weight, 0, r))] for r in range(TP)]
    ((logits0, calls0),), ((logits1, calls1),) = run_on_ranks(_rank_call, TP, impl_name, "parallel_lm_head",
                                                              rank_calls, True)
    check_close(logits0, want, "4.4", "parallel_lm_head's logits on rank 0 (2 ranks) against nn.Linear", ATOL, RTOL)
    check_equal(logits1, None, "4.4", "parallel_lm_head's result on rank 1 (only rank 0 samples)")
    check_equal([calls0, calls1], [["gather"]] * TP, "4.4", "the collectives each rank called (one gather to rank 0, "
                "not an all-gather)")
