"""CUDA graphs for decode: record the whole decode step once per batch size, then replay it.

A decode step of a 0.6B model launches ~200 small kernels; launched one by one from Python each
costs a few microseconds of CPU, more than the GPU needs to run it at small batch. A CUDA graph
replays the recorded launches with one call. The graph holds the whole step, from input ids to
sampled tokens: the forward, the LM head and the fused sampler (minillm.kernels.sampling).
Everything a graph reads must live at fixed addresses, so each step copies its inputs into static
buffers, all of them with one copy:

    seeds                                [max_bs] int64   the fused sampler's Philox keys
    input_ids, positions, slot_mapping   [max_bs]
    context_lens                         [max_bs]
    src                                  [max_bs]         async: row i's token is tokens[src[i]], unless NO_SOURCE_ROW
    temperatures                         [max_bs] fp32    the fused sampler's temperatures
    block_tables                         [max_bs, max_blocks]   max_blocks = ceil(max_model_len / block_size)

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

import numpy as np
import torch

from minillm.context import PAD_BLOCK, SKIP_SLOT, reset_context, set_context
from minillm.kernels.sampling import pick_input_ids, sample_triton

HEAD = 8  # int32 slots per row before the block table: seeds (2), ids, positions, slots, lens, src, temperatures
NO_SOURCE_ROW = -1  # a src entry: the row's input token is on the host (input_ids), not a previous sample


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


class DecodeGraphs:
    def __init__(self, model, max_num_seqs: int, max_blocks: int, device: torch.device):
        self.model = model
        self.sizes = graph_batch_sizes(max_num_seqs)
        n, self.max_blocks = self.sizes[-1], max_blocks
        # All inputs in one int32 buffer, so a step is one host->device copy from a pinned staging
        # twin. Two staging buffers alternate: with async scheduling the CPU fills step n+1's while
        # step n's copy may still be queued.
        pinned = device.type == "cuda"  # (a CPU stand-in of the graphs, in the tests, has no pinned memory)
        self.staging = [torch.zeros(n * (HEAD + max_blocks), dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self.hosts = [self._views(st.numpy(), n) for st in self.staging]
        self.step = 0
        self.buffer = torch.zeros_like(self.staging[0], device=device)
        (self.seeds, self.input_ids, self.positions, self.slot_mapping, self.context_lens, self.src,
         self.temperatures, self.block_tables) = self._views(self.buffer, n)
        self.tokens = torch.zeros(n, dtype=torch.int64, device=device)  # the sampled ids (the graphs write them)
        self.logits: dict[int, torch.Tensor] = {}  # per graph: its logits [bs, vocab], in the graphs' memory pool
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self._capture_all()

    def _views(self, flat, n: int):
        """The int32 buffer cut into its fields (seeds first: an int64 view needs 8-byte alignment)."""
        as_i64, as_f32 = (np.int64, np.float32) if isinstance(flat, np.ndarray) else (torch.int64, torch.float32)
        f = [flat[i * n:(i + 1) * n] for i in range(2, HEAD)]
        return (flat[:2 * n].view(as_i64), *f[:5], f[5].view(as_f32), flat[HEAD * n:].reshape(n, self.max_blocks))

    def _forward(self, bs: int) -> None:
        ids = pick_input_ids(self.input_ids[:bs], self.src[:bs], self.tokens)
        self.logits[bs] = logits = self.model.compute_logits(self.model(ids, self.positions[:bs]))
        if logits is not None:  # None on tensor-parallel ranks > 0: rank 0 alone samples
            sample_triton(logits, self.temperatures[:bs], self.seeds[:bs], out=self.tokens[:bs])

    def _set_context(self, bs: int) -> None:
        set_context(is_prefill=False, slot_mapping=self.slot_mapping[:bs], context_lens=self.context_lens[:bs],
                    block_tables=self.block_tables[:bs])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self.slot_mapping.fill_(SKIP_SLOT)
        self.block_tables.fill_(PAD_BLOCK)
        self.src.fill_(NO_SOURCE_ROW)
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
        self.staging, self.hosts = [], []
        (self.seeds, self.input_ids, self.positions, self.slot_mapping, self.context_lens, self.src,
         self.temperatures, self.block_tables) = (None,) * 8

    def padded_size(self, bs: int) -> int | None:
        """The captured size that runs a batch of bs, or None when bs is larger than any."""
        return graph_size_for(self.sizes, bs)

    def run(self, batch, prev_ids: torch.Tensor | None = None, src_index=None, temperatures=None,
            seeds=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode Batch (B rows, host numpy) -> (logits [B, vocab], sampled token ids [B] int64).

        prev_ids/src_index: with async scheduling, row i's input token is still on the device when
        src_index[i] != NO_SOURCE_ROW: it is prev_ids[src_index[i]], the previous step's sample.
        temperatures/seeds: host arrays [B] for the fused sampler, copied with the inputs. Without
        them the sampled ids are meaningless: sample the logits outside the graph. Both outputs are
        valid until the next replay; on tensor-parallel ranks > 0 the logits are None."""
        bs = len(batch.input_ids)
        padded = self.padded_size(bs)
        self.step ^= 1
        seed_h, ids, pos, slots, lens, src, temps, tables = self.hosts[self.step]
        pad_graph_inputs(batch.input_ids, batch.positions, batch.slot_mapping, batch.context_lens,
                         batch.block_tables, padded, (ids, pos, slots, lens, tables))
        src[:padded] = NO_SOURCE_ROW
        if src_index is not None:
            src[:bs] = src_index
            if prev_ids.data_ptr() != self.tokens.data_ptr():  # not the last replay's own samples
                self.tokens[:len(prev_ids)].copy_(prev_ids)
        if temperatures is not None:
            temps[:bs], seed_h[:bs] = temperatures, seeds
        used = HEAD * self.sizes[-1] + padded * self.max_blocks  # copy only the rows this graph reads
        self.buffer[:used].copy_(self.staging[self.step][:used], non_blocking=True)
        self.graphs[padded].replay()
        logits = self.logits[padded]
        return (None if logits is None else logits[:bs]), self.tokens[:bs]
