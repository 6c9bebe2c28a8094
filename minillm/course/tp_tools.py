"""Looking inside a tensor-parallel engine, for notebook 04 and the tests: functions that every rank
runs through `runner.collective_rpc(fn, *args)` (the engine's API, as in vLLM). They live here, not in
the engine, which never calls them; they are module-level functions, so a spawned worker imports them
by name.

    runner = llm.engine.model_runner
    runner.collective_rpc(shard_summary)                          # what each rank holds
    runner.collective_rpc(exercise_code, 4)                       # whose 4.x functions each rank runs
    runner.collective_rpc(decode_step_times, [1, 8], 128)         # ms per decode step, and in collectives
    decode_step_times(runner, [1, 8], 128)                        # the same on a one-rank engine
"""
from __future__ import annotations

import importlib
import statistics

import numpy as np
import torch
import torch.distributed as dist

from minillm.config import ModelConfig
from minillm.course.exercises import find_exercises
from minillm.engine.model_runner import Batch
from minillm.engine.tp import ShardRunner


def exercise_code(runner: ShardRunner, chapter: int) -> dict[str, str]:
    """For collective_rpc: whose code this rank's engine runs for the chapter's exercise functions, as the
    module each came from ('minillm.layers.linear' for minillm's; 'exercises.ch4' for a reader's
    swapped in by the notebook switch). -> {function name: module}"""
    return {name: getattr(importlib.import_module(e.module), name).__module__
            for e in find_exercises() if e.chapter == chapter for name in e.stubbed}


def shard_summary(runner: ShardRunner) -> dict:
    """For collective_rpc: what one rank holds (its rank, parameter count, KV-cache shape)."""
    return {"rank": dist.get_rank(runner.group), "parameters": sum(p.numel() for p in runner.model.parameters()),
            "kv_cache": tuple(runner.kv_cache.shape)}


# ---- timing a decode step (notebook 04), the same calls on every rank -----------------------------
def decode_step_times(runner: ShardRunner, batch_sizes: list[int], context_len: int, iters: int = 20) -> dict:
    """For collective_rpc (or a plain ModelRunner): milliseconds per decode step at each batch size,
    and for tensor parallel the part of it spent in collectives. Needs CUDA graphs.

    A step is one replay of the decode graph of that size, every row at `context_len` tokens in blocks
    of its own (as many as the cache holds: rows reading the same blocks would hit in L2). The
    collectives alone are a
    graph of the same all-reduces and gather the step makes (2 per layer, 1 for the embedding, the LM
    head's gather), on tensors of the step's shapes. Every rank replays the same graphs the same number
    of times (a count picked from a measurement would differ between ranks and hang them).
    -> {"batch_sizes", "step_ms", "comm_ms"} (comm_ms all 0.0 at one rank)."""
    graphs = runner.graphs
    if graphs is None:
        raise ValueError("decode_step_times replays the decode CUDA graphs: run on CUDA without enforce_eager")
    group = runner.memory.group  # None on a one-process engine
    size = dist.get_world_size(group) if group is not None else 1
    mc, blocks, num_blocks = runner.model_config, -(-context_len // runner.block_size), runner.num_kvcache_blocks
    if blocks > min(num_blocks, graphs.max_blocks):
        raise ValueError(f"context_len={context_len} needs {blocks} KV blocks per row; a row can have "
                         f"{min(num_blocks, graphs.max_blocks)}")
    step_ms, comm_ms = [], []
    for bs in batch_sizes:
        padded = graphs.padded_size(bs)
        if padded is None:
            raise ValueError(f"batch {bs} is larger than the largest decode graph ({graphs.sizes[-1]})")
        lens = np.full(bs, context_len, dtype=np.int32)
        batch = Batch(is_prefill=False, input_ids=np.zeros(bs, dtype=np.int64),
                      positions=lens.astype(np.int64) - 1, slot_mapping=np.full(bs, -1, dtype=np.int64),
                      context_lens=lens,
                      block_tables=((np.arange(bs)[:, None] * blocks + np.arange(blocks)) % num_blocks).astype(np.int32))
        greedy = {"temperatures": np.zeros(bs, dtype=np.float32), "seeds": np.zeros(bs, dtype=np.int64)}
        step_ms.append(_replay_ms(lambda: graphs.run(batch, None, None, greedy), iters))
        if size == 1:
            comm_ms.append(0.0)
            continue
        comm = _collectives_graph(padded, mc, runner.dtype, size, group)
        comm_ms.append(_replay_ms(comm.replay, iters))
        del comm
    return {"batch_sizes": list(batch_sizes), "step_ms": step_ms, "comm_ms": comm_ms}


def _replay_ms(fn, iters: int) -> float:
    """Median milliseconds of fn over `iters` timed calls after 3 warm-up calls (CUDA events)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _collectives_graph(bs: int, mc: ModelConfig, dtype: torch.dtype, size: int, group) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one decode step's collectives at batch bs: (2 x layers + 1) all-reduces of
    [bs, hidden] and the LM head's gather of [bs, vocab / size] to rank 0."""
    hidden = torch.zeros(bs, mc.hidden_size, dtype=dtype, device="cuda")
    logits = torch.zeros(bs, mc.vocab_size // size, dtype=dtype, device="cuda")
    parts = [torch.empty_like(logits) for _ in range(size)] if dist.get_rank(group) == 0 else None

    def collectives():
        for _ in range(2 * mc.num_hidden_layers + 1):
            dist.all_reduce(hidden, group=group)
        dist.gather(logits, parts, group_dst=0, group=group)
    collectives()  # warm-up outside the graph (NCCL sets up its channels on first use)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        collectives()
    graph.keep_alive = (hidden, logits, parts)  # the graph reads and writes them
    return graph
