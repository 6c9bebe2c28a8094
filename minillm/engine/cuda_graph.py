"""CUDA graphs for decode: record the whole decode step once per batch size, then replay it.

A decode step of a 0.6B model launches ~200 small kernels; launched one by one from Python each
costs tens of microseconds of CPU, far more than the GPU needs to run it at small batch (notebook 05's
H200 run: an eager batch-1 forward of 7.435 ms for the 177 kernels a token of that path, about 42 µs
a kernel by that quotient, where a kernel replayed from a graph costs about 2 µs). A CUDA graph
replays the recorded launches with one call. The graph holds the whole step, from input ids to
sampled tokens: the forward, the LM head and the fused sampler (minillm.kernels.sampling).
Everything a graph reads must live at fixed addresses, so each step copies its inputs into static
buffers, all of them with one copy: one byte buffer cut into named fields (GRAPH_INPUTS, laid out
once by graph_input_layout), rows = the largest graph's batch:

    seeds                                [rows] int64   the fused sampler's Philox keys
    input_ids, positions, slot_mapping   [rows] int32
    context_lens                         [rows] int32
    src                                  [rows] int32   async: row i's token is tokens[src[i]], unless NO_SOURCE_ROW
    temperatures                         [rows] fp32    the fused sampler's temperatures
    block_tables                         [rows, max_blocks] int32   max_blocks = ceil(max_model_len / block_size)

The graph writes its samples to `tokens`; with async scheduling the next step's input token of a
row may be one of them, still on the device: the next replay picks it out of `tokens` itself (one
small kernel), so a step copies nothing but its inputs. A batch whose sampling the fused sampler
cannot do (top-k / top-p, or per-request generators) samples the graph's logits outside it.

A batch of B sequences runs the graph captured for the smallest size >= B; rows past B are padding
(slot SKIP_SLOT: nothing stored; context length 0; their outputs are dropped). The block-table width is
fixed at the longest possible sequence, so no sequence can outgrow it.

Tensor parallel: every rank captures the same sizes in the same order, and each replay holds the
step's collectives (the row-parallel all-reduces, the embedding's all-reduce, the LM head's gather),
so every rank replays the same graph for a step. Only rank 0 gets logits and samples: the other
ranks' graphs end with their part of the gather.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from minillm.context import PAD_BLOCK, SKIP_SLOT, reset_context, set_context
from minillm.kernels.sampling import pick_input_ids, sample_triton
from minillm.layers.sampler import Sampler

NO_SOURCE_ROW = -1  # a src entry: the row's input token is on the host (input_ids), not a previous sample
# (name, dtype, entries per row) of each graph input, in buffer order; block_tables last, so that a
# smaller graph's step copies a prefix of the buffer
GRAPH_INPUTS = (("seeds", torch.int64, 1), ("input_ids", torch.int32, 1), ("positions", torch.int32, 1),
                ("slot_mapping", torch.int32, 1), ("context_lens", torch.int32, 1), ("src", torch.int32, 1),
                ("temperatures", torch.float32, 1), ("block_tables", torch.int32, None))  # None: max_blocks
ALIGN = 8  # bytes: every field starts where its dtype may be viewed (int64 needs 8)


# >>> exercise 5.1 | notebooks/05_engine_performance.ipynb | 3. CUDA graphs
def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a decode graph: 1, 2, 4, 8, then every multiple of 16 up to
    max_num_seqs, and max_num_seqs itself (nano-vLLM's choice), ascending, each once, none larger
    than max_num_seqs.  e.g. 64 -> [1, 2, 4, 8, 16, 32, 48, 64];  20 -> [1, 2, 4, 8, 16, 20];  3 -> [1, 2, 3]

    Every size costs a capture at start-up and memory for its outputs; a batch runs the graph of the
    next size up, so the gaps between sizes are rows of wasted work.
    """
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs + 1, 16))
    return sorted(set(sizes + [max_num_seqs]))


def graph_size_for(sizes: list[int], batch_size: int) -> int | None:
    """The captured size that runs a decode batch of batch_size rows: the smallest of `sizes` (ascending)
    that is >= batch_size, or None when batch_size is larger than all of them (the batch runs eagerly).
    e.g. sizes [1, 2, 4, 8, 16, 32]: 3 -> 4, 16 -> 16, 17 -> 32, 33 -> None.
    """
    return next((s for s in sizes if s >= batch_size), None)


def pad_graph_inputs(input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
                     context_lens: np.ndarray, block_tables: np.ndarray, padded: int,
                     out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Write a decode batch of B rows into a graph's host input buffers, padded to `padded` rows.

    input_ids, positions, slot_mapping: [B] int64; context_lens: [B] int32;
    block_tables: [B, W] int32 (PAD_BLOCK past each sequence's last block), W <= max_blocks; B <= padded.
    out = (ids, pos, slots, lens, tables): the host buffers, [n] int32 each and tables [n, max_blocks]
    int32, n >= padded. They still hold whatever an earlier step wrote.
    Rows 0..B-1 get the batch, each block table followed by PAD_BLOCK up to max_blocks columns.
    Rows B..padded-1 are padding, run by the graph but never read back: token 0 at position 0,
    slot SKIP_SLOT (the KV store skips it), context length 0 (attends to nothing), block table all PAD_BLOCK.
    Rows from `padded` on are left alone (the graph of that size never reads them). Returns nothing.

    Hints: numpy slice assignment casts int64 to the buffers' int32; a stale padding row is not
    harmless: its old slot is a real sequence's cache row.
    """
    ids, pos, slots, lens, tables = out
    bs = len(input_ids)
    ids[:bs], pos[:bs], slots[:bs], lens[:bs] = input_ids, positions, slot_mapping, context_lens
    # padding rows: a valid token at position 0 that stores nothing and attends to nothing
    ids[bs:padded], pos[bs:padded], slots[bs:padded], lens[bs:padded] = 0, 0, SKIP_SLOT, 0
    width = block_tables.shape[1]
    tables[:bs, :width] = block_tables
    tables[:bs, width:] = PAD_BLOCK
    tables[bs:padded] = PAD_BLOCK  # as at capture: a padding row points at no block
# <<< exercise 5.1


def to_device(value, device: torch.device):
    """A host numpy array -> a tensor on `device` (to CUDA through pinned memory, without waiting for
    the copy); a dict, each of its values so; any other value (a flag, generators) as it is."""
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if not isinstance(value, np.ndarray):
        return value
    t = torch.from_numpy(value)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


class GraphInput(NamedTuple):
    name: str
    dtype: torch.dtype
    offset: int  # bytes into the buffer
    shape: tuple[int, ...]  # (rows,) or (rows, max_blocks)


def graph_input_layout(rows: int, max_blocks: int) -> tuple[list[GraphInput], int]:
    """Where each of GRAPH_INPUTS lives in the one input buffer -> (fields, total bytes)."""
    fields, offset = [], 0
    for name, dtype, per_row in GRAPH_INPUTS:
        shape = (rows,) if per_row == 1 else (rows, per_row or max_blocks)
        fields.append(GraphInput(name, dtype, offset, shape))
        offset += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return fields, offset


def field_views(buffer, fields: list[GraphInput]) -> dict:
    """A byte buffer (a torch uint8 tensor, or its numpy twin) -> {name: a typed view of its field}."""
    views = {}
    for f in fields:
        nbytes = math.prod(f.shape) * f.dtype.itemsize
        dtype = f.dtype if isinstance(buffer, torch.Tensor) else torch.empty(0, dtype=f.dtype).numpy().dtype
        views[f.name] = buffer[f.offset:f.offset + nbytes].view(dtype).reshape(f.shape)
    return views


class DecodeGraphs:
    """The decode CUDA graphs of one runner: captured at start-up, then per step prepare (inputs into
    the static buffer), replay, sample."""

    def __init__(self, model, max_num_seqs: int, max_blocks: int, device: torch.device):
        self.model = model
        self.sizes = graph_batch_sizes(max_num_seqs)
        rows, self.max_blocks = self.sizes[-1], max_blocks
        self.fields, nbytes = graph_input_layout(rows, max_blocks)
        self.tables = next(f for f in self.fields if f.name == "block_tables")  # the buffer's last field
        # One host->device copy per step, from a pinned staging twin. Two staging buffers alternate:
        # with async scheduling the CPU fills step n+1's while step n's copy may still be queued.
        pinned = device.type == "cuda"  # (a CPU stand-in of the graphs, in the tests, has no pinned memory)
        self.staging = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        self.hosts = [field_views(st.numpy(), self.fields) for st in self.staging]
        self.step = 0
        self.buffer = torch.zeros_like(self.staging[0], device=device)
        self.inputs = field_views(self.buffer, self.fields)  # what the graphs read
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)  # the sampled ids (the graphs write them)
        self.logits: dict[int, torch.Tensor] = {}  # per graph: its logits [bs, vocab], in the graphs' memory pool
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.sampler = Sampler()  # for what the graphs' fused sampler cannot do (top-k/top-p, generators)
        self._capture_all()

    def _forward(self, bs: int) -> None:
        x = self.inputs
        ids = pick_input_ids(x["input_ids"][:bs], x["src"][:bs], self.tokens)
        self.logits[bs] = logits = self.model.compute_logits(self.model(ids, x["positions"][:bs]))
        if logits is not None:  # None on tensor-parallel ranks > 0: rank 0 alone samples
            sample_triton(logits, x["temperatures"][:bs], x["seeds"][:bs], out=self.tokens[:bs])

    def _set_context(self, bs: int) -> None:
        x = self.inputs
        set_context(is_prefill=False, slot_mapping=x["slot_mapping"][:bs], context_lens=x["context_lens"][:bs],
                    block_tables=x["block_tables"][:bs])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self.inputs["slot_mapping"].fill_(SKIP_SLOT)
        self.inputs["block_tables"].fill_(PAD_BLOCK)
        self.inputs["src"].fill_(NO_SOURCE_ROW)
        # capture the largest first: later (smaller) graphs reuse its memory pool
        for bs in reversed(self.sizes):
            self._set_context(bs)
            self._forward(bs)  # warm-up, compiles kernels
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, self.pool):
                self._forward(bs)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()
        reset_context()

    def release(self) -> None:
        """Destroy the graphs and drop every buffer, so their memory pool can go back to the device."""
        for graph in self.graphs.values():
            graph.reset()
        # the logits live in the pool; the field views share `buffer`: drop every reference
        self.graphs, self.logits, self.pool, self.model = {}, {}, None, None
        self.buffer = self.tokens = None
        self.staging, self.hosts, self.inputs = [], [], {}

    def padded_size(self, bs: int) -> int | None:
        """The captured size that runs a batch of bs, or None when bs is larger than any."""
        return graph_size_for(self.sizes, bs)

    def prepare(self, batch, prev_ids: torch.Tensor | None = None, src_index=None, temperatures=None,
                seeds=None) -> int:
        """Copy one decode Batch (B rows, host numpy) into the graphs' input buffer -> the graph size
        that runs it.

        prev_ids/src_index: with async scheduling, row i's input token is still on the device when
        src_index[i] != NO_SOURCE_ROW: it is prev_ids[src_index[i]], the previous step's sample.
        temperatures/seeds: host arrays [B] for the fused sampler, copied with the inputs."""
        bs = len(batch.input_ids)
        padded = self.padded_size(bs)
        self.step ^= 1
        h = self.hosts[self.step]
        pad_graph_inputs(batch.input_ids, batch.positions, batch.slot_mapping, batch.context_lens,
                         batch.block_tables, padded,
                         (h["input_ids"], h["positions"], h["slot_mapping"], h["context_lens"], h["block_tables"]))
        h["src"][:padded] = NO_SOURCE_ROW
        if src_index is not None:
            h["src"][:bs] = src_index
            if prev_ids.data_ptr() != self.tokens.data_ptr():  # not the last replay's own samples
                self.tokens[:len(prev_ids)].copy_(prev_ids)
        if temperatures is not None:
            h["temperatures"][:bs], h["seeds"][:bs] = temperatures, seeds
        # copy only the block-table rows this graph reads
        used = self.tables.offset + padded * self.max_blocks * self.tables.dtype.itemsize
        self.buffer[:used].copy_(self.staging[self.step][:used], non_blocking=True)
        return padded

    def replay(self, padded: int, bs: int) -> torch.Tensor | None:
        """Run the graph of size `padded` on the prepared inputs -> its logits [bs, vocab] (None on
        tensor-parallel ranks > 0), valid until the next replay."""
        self.graphs[padded].replay()
        logits = self.logits[padded]
        return None if logits is None else logits[:bs]

    def run(self, batch, prev_ids: torch.Tensor | None = None, src_index=None, sample_args: dict | None = None
            ) -> torch.Tensor | None:
        """One decode step: prepare, replay, sample -> the sampled token ids [B] int64 on the device
        (None without sample_args: a tensor-parallel worker's half of the step).
        sample_args: the runner's prepare_sample(..., on_device=False). The graph's own fused sampler
        does temperature sampling with per-row seeds; anything else samples its logits outside it."""
        bs, fused = len(batch.input_ids), sample_args is not None and "seeds" in sample_args
        fused_args = (sample_args["temperatures"], sample_args["seeds"]) if fused else ()
        logits = self.replay(self.prepare(batch, prev_ids, src_index, *fused_args), bs)
        if sample_args is None:
            return None
        if fused:
            return self.tokens[:bs]
        return self.sampler(logits, **{k: to_device(v, self.tokens.device) for k, v in sample_args.items()})
