"""ModelRunner: owns the model, the KV cache and the device. Turns a batch of sequences into
tensors (input_ids, positions, slot_mapping, cu_seqlens, block_tables), runs the forward and samples.

Device memory. A runner keeps its weights, KV cache and CUDA graphs (with their memory pool) in a
DeviceMemory; shutdown() frees all of it at once, and so does the garbage collector when a runner is
dropped without shutdown() (a finalizer holds the DeviceMemory, not the runner). On CUDA the KV cache
gets what is left of this engine's share of the device (gpu_memory_utilization x total, minus its own
weights and activation peak), but never more than what is free right now: a second engine in the
same process (a notebook cell `llm = LLM(...)` run again keeps the old engine alive until the new
one is assigned) gets a smaller cache and a warning, or an error saying what to do when nothing fits.
"""
from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from minillm.config import EngineConfig, ModelConfig
from minillm.context import PAD_BLOCK, reset_context, set_context
from minillm.distributed import tp_group
from minillm.engine.cuda_graph import NO_SOURCE_ROW, DecodeGraphs, to_device
from minillm.engine.sequence import PLACEHOLDER_TOKEN, Sequence
from minillm.layers.attention import Attention, backend_for
from minillm.layers.linear import column_major_weights
from minillm.layers.sampler import Sampler, TokenLogprobs, token_logprobs
from minillm.loader import load_model
from minillm.models.qwen3 import Qwen3ForCausalLM, layer_forward_for
from minillm.sampling_params import SamplingParams

GIB = 1 << 30
# Kept free when the free memory (not this engine's share) limits the KV cache: room for the CUDA
# graphs' pool, NCCL's buffers and allocator fragmentation, which appear after the cache is sized.
FREE_MEMORY_RESERVE = 1 * GIB


# >>> exercise 3.1 | notebooks/03_paged_kv_cache.ipynb | 2. Block tables and slot mapping
def slot_mapping_for(block_table: np.ndarray, start: int, end: int, block_size: int) -> np.ndarray:
    """The flat cache slots of token positions start..end-1 of one sequence.

    The KV cache is num_blocks blocks of block_size token rows; flat slot s is row s % block_size of
    physical block s // block_size. A sequence's logical block i (its positions
    i*block_size .. i*block_size + block_size - 1) lives in physical block block_table[i].
    block_table: [>= ceil(end / block_size)] int physical block ids; 0 <= start <= end
    -> [end - start] int64: slot of position pos = block_table[pos // block_size] * block_size + pos % block_size.
    (start > 0 when the first tokens' K/V came from the prefix cache or were computed in an earlier step.)

    Hints: vectorize with numpy (np.arange of the positions, integer division and modulo, fancy
    indexing into block_table); cast to int64 before multiplying (block ids may be int32).
    """
    pos = np.arange(start, end, dtype=np.int64)
    return block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size
# <<< exercise 3.1


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, model_path: str):
        self.config, self.model_config = config, model_config
        self.device = torch.device(config.device)
        self.dtype = config.torch_dtype
        self.block_size = config.kvcache_block_size
        torch.manual_seed(config.seed)
        self.seed_rng = np.random.default_rng(config.seed)  # Philox keys of the fused sampler
        self.memory = DeviceMemory(self.device, tp_group())  # the group: inside tensor_parallel(group), else None
        self.model = self.kv_cache = self.graphs = None
        self.attention_layers = []
        self._release: weakref.finalize | None = None  # set once everything is built
        out_of_memory = None
        try:
            self._build(model_path)
        except torch.OutOfMemoryError as e:  # raised below, outside this block: its frames hold half-built tensors
            out_of_memory = str(e).splitlines()[0]
        except BaseException:
            self._free_device()  # nothing half-built stays on the device while the error is around
            raise
        if out_of_memory is not None:
            self._free_device()
            raise self._out_of_memory_error(out_of_memory)
        self._release = weakref.finalize(self, self.memory.release)  # also runs when collected without shutdown()
        _LIVE_RUNNERS.add(self)

    def _build(self, model_path: str) -> None:
        """Weights, KV cache, CUDA graphs: everything this runner puts on its device."""
        config, cuda = self.config, self.device.type == "cuda"
        before = torch.cuda.memory_allocated(self.device) if cuda else 0
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        self.backend = backend_for(config)
        layer_forward = layer_forward_for(config.device, self.backend, config.tensor_parallel_size, self.model_config)
        try:
            with torch.device(self.device):
                self.model = self.memory.model = Qwen3ForCausalLM(self.model_config, self.backend, layer_forward)
        finally:
            torch.set_default_dtype(default_dtype)
        load_model(self.model, model_path)
        if not cuda:  # the layout a CPU's matrix-vector product reads fastest
            column_major_weights(self.model)
        # this engine's own weights: what other engines in this process hold is not ours to count
        self.weight_bytes = torch.cuda.memory_allocated(self.device) - before if cuda else 0
        self.model.eval()
        self.sampler = Sampler()
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.num_kvcache_blocks = self.allocate_kv_cache()
        if cuda and not config.enforce_eager and self.backend.name != "torch":
            # the torch reference backend's store selects rows with a boolean mask (a host sync)
            self.graphs = self.memory.graphs = DecodeGraphs(self.model, config.max_num_seqs,
                                                            config.blocks_per_seq(), self.device)

    def shutdown(self) -> None:
        """Free everything this runner holds on its device (CUDA graphs and their pool, KV cache,
        weights) and hand the memory back to the device. Idempotent; the runner cannot run after it."""
        self._free_device()

    def _free_device(self) -> None:
        self.model = self.graphs = self.kv_cache = None
        self.attention_layers = []
        (self._release or self.memory.release)()  # no finalizer yet while __init__ runs

    def _check_alive(self) -> None:
        if self.model is None:
            raise RuntimeError("this engine has been shut down (llm.shutdown()); create a new LLM")

    def _out_of_memory_error(self, detail: str) -> Exception:
        others = other_engines_memory(self)
        if not others:
            return torch.OutOfMemoryError(f"out of memory on {self.device} while building the engine: {detail}")
        return ValueError(f"out of memory on {self.device} while building the engine: {others}. To fix it, "
                          f"{FREE_OTHERS}, then create this one again")

    # ---- KV cache -------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        mc = self.model_config
        per_token = 2 * mc.num_hidden_layers * (mc.num_key_value_heads // self.config.tensor_parallel_size) * mc.head_dim
        return per_token * self.block_size * self.dtype.itemsize

    def kv_budget_blocks(self) -> int:
        c = self.config
        if c.num_kvcache_blocks is not None:
            return c.num_kvcache_blocks
        if c.kv_cache_memory is not None:
            return c.kv_cache_memory // self.kv_bytes_per_block()
        if self.device.type == "cuda":
            return self.cuda_budget_bytes() // self.kv_bytes_per_block()
        # CPU: enough for every sequence at full length, at most 2 GiB
        want = c.max_num_seqs * c.blocks_per_seq()
        return max(c.blocks_per_seq(), min(want, (2 << 30) // self.kv_bytes_per_block()))

    def cuda_budget_bytes(self) -> int:
        """KV-cache bytes on CUDA: this engine's share of the device (gpu_memory_utilization x total,
        minus its own weights and activation peak), at most what is free now minus that peak and
        FREE_MEMORY_RESERVE. Warns when the free memory is what limits it; raises ValueError when not
        even one sequence of max_model_len fits."""
        peak = self.profile_peak_memory()  # ends with an empty allocator cache: mem_get_info sees what is free
        free, total = torch.cuda.mem_get_info(self.device)
        share = int(self.config.gpu_memory_utilization * total) - self.weight_bytes - peak
        available = free - peak - FREE_MEMORY_RESERVE
        if available >= share:
            return share
        others = other_engines_memory(self)
        why = others or "other processes use the rest"
        need = self.config.blocks_per_seq() * self.kv_bytes_per_block()
        if available < need:
            fix = FREE_OTHERS if others else "free the device, or lower max_model_len"
            raise ValueError(
                f"the KV cache needs {need / GIB:.2f} GiB for one sequence of max_model_len={self.config.max_model_len}, "
                f"but only {max(available, 0) / GIB:.2f} GiB of {self.device} is left for it ({free / GIB:.1f} GiB free, "
                f"{peak / GIB:.1f} GiB kept for activations, {FREE_MEMORY_RESERVE / GIB:.0f} GiB reserve): {why}. "
                f"To fix it, {fix}")
        if available < 0.95 * share:
            warnings.warn(f"the KV cache gets {available / GIB:.1f} GiB instead of this engine's share of "
                          f"{share / GIB:.1f} GiB: only {free / GIB:.1f} GiB of {self.device} is free ({why}). "
                          f"To give the next engine its whole share, {FREE_OTHERS}", stacklevel=2)
        return available

    def profile_peak_memory(self) -> int:
        """Activation memory of the largest prefill batch, measured by running one (no KV cache yet)."""
        c = self.config
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        # the most tokens one step computes: whole prompts of max_model_len, or (chunked prefill, a budget
        # below max_model_len) one chunk of max_num_batched_tokens
        n = min(c.max_num_batched_tokens, c.max_num_seqs * c.max_model_len)
        length = min(c.max_model_len, n)
        seqs = [Sequence([0] * length, _GREEDY, self.block_size) for _ in range(max(1, n // length))]
        for s in seqs:
            s.num_computed_tokens = s.num_new_tokens = length
        self.forward_batch(build_prefill_batch(seqs, self.block_size))
        reset_context()
        peak = torch.cuda.max_memory_allocated(self.device) - before
        torch.cuda.empty_cache()
        return peak

    def allocate_kv_cache(self) -> int:
        mc = self.model_config
        num_blocks = self.kv_budget_blocks()
        self.config.check_kv_blocks(num_blocks)
        kv_heads = mc.num_key_value_heads // self.config.tensor_parallel_size
        # one tensor for all layers: [2, layers, blocks, block_size, kv_heads, head_dim]
        self.kv_cache = self.memory.kv_cache = torch.empty(
            2, mc.num_hidden_layers, num_blocks, self.block_size, kv_heads, mc.head_dim, dtype=self.dtype,
            device=self.device)
        for i, layer in enumerate(self.attention_layers):
            layer.k_cache, layer.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
        return num_blocks

    # ---- inputs ---------------------------------------------------------------------------
    # A step's inputs are built on the host as a Batch of numpy arrays (cheap to make, to pickle
    # to tensor-parallel workers, and to copy into CUDA-graph buffers), then loaded to the device.
    def build_batch(self, seqs: list[Sequence], is_prefill: bool, block_copies=()) -> "Batch":
        """block_copies: the (src, dst) block copies (copy on write) the step does first."""
        batch = build_prefill_batch(seqs, self.block_size) if is_prefill else build_decode_batch(seqs, self.block_size)
        if block_copies:
            batch.block_copies = np.asarray(block_copies, dtype=np.int64).reshape(-1, 2)
        return batch

    def send_batch(self, batch: "Batch") -> None:
        """Tensor parallel: hand this step's Batch to the other ranks, which run the same forward on it
        (engine/tp.py). One process: there is nobody to send it to."""

    def load_batch(self, b: "Batch") -> tuple[torch.Tensor, torch.Tensor]:
        """Copy a Batch to the device and set the attention context. -> (input_ids, positions)."""
        dev = partial(to_device, device=self.device)
        opt = lambda a: None if a is None else dev(a)  # noqa: E731
        set_context(
            is_prefill=b.is_prefill,
            cu_seqlens_q=opt(b.cu_seqlens_q), cu_seqlens_k=opt(b.cu_seqlens_k),
            max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k,
            slot_mapping=opt(b.slot_mapping), context_lens=opt(b.context_lens), block_tables=opt(b.block_tables),
            cu_seqlens_q_host=None if b.cu_seqlens_q is None else b.cu_seqlens_q.tolist(),
            cu_seqlens_k_host=None if b.cu_seqlens_k is None else b.cu_seqlens_k.tolist(),
            context_lens_host=None if b.context_lens is None else b.context_lens.tolist(),
        )
        return dev(b.input_ids), dev(b.positions)

    def forward_batch(self, b: "Batch") -> torch.Tensor:
        """load_batch, then run_model on the rows whose logits the step needs -> logits."""
        return self.run_model(*self.load_batch(b), None if b.logits_rows is None else to_device(b.logits_rows, self.device))

    def copy_blocks(self, copies: np.ndarray | None) -> None:
        """Copy on write: copy each (src, dst) block's K/V rows, in every layer, before the step writes."""
        if copies is not None:
            src, dst = to_device(copies[:, 0].copy(), self.device), to_device(copies[:, 1].copy(), self.device)
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    def prepare_sample(self, seqs: list[Sequence], on_device: bool = True, partial: list[bool] | None = None):
        """-> keyword arguments of Sampler.forward; the per-row arrays as device tensors (no device
        sync), or as host numpy arrays when on_device is False. partial[i]: row i is a prefill chunk
        short of its prompt's end, whose token nobody keeps (it uses no request's generator)."""
        ps = [s.params for s in seqs]
        temps = np.asarray([p.temperature for p in ps], dtype=np.float32)
        args = dict(temperatures=temps, all_greedy=bool((temps == 0).all()), any_greedy=bool((temps == 0).any()))
        if any(p.top_k > 0 for p in ps):
            vocab = self.model_config.vocab_size
            args["top_k"] = np.asarray([p.top_k if p.top_k > 0 else vocab for p in ps])
        if any(p.top_p < 1.0 for p in ps):
            args["top_p"] = np.asarray([p.top_p for p in ps], dtype=np.float32)
        if any(s.slow_sampling for s in seqs):  # see SamplingParams
            args["processors"] = logits_inputs(seqs, self.model_config.vocab_size)
            if any(p.min_p > 0 for p in ps):
                args["min_p"] = np.asarray([p.min_p for p in ps], dtype=np.float32)
            if any(p.logprobs is not None for p in ps):
                args["num_logprobs"] = max(p.logprobs or 0 for p in ps)
                args["logprobs_mode"] = self.config.logprobs_mode
        if self.device.type == "cuda" and not args.keys() & {"top_k", "top_p", "processors"}:
            # the fused sampler: one Philox key per row and step, from the request's seed when it has
            # one (reproducible whatever else is in the batch), else from the engine's own stream
            keys = self.seed_rng.integers(0, 2**31 - 1, size=len(seqs))
            for i, (p, seq) in enumerate(zip(ps, seqs)):
                if p.seed is not None:
                    keys[i] = (p.seed * 1_000_003 + seq.num_tokens) % (2**31 - 1)
            args["seeds"] = keys.astype(np.int64)
        elif any(p.seed is not None for p in ps):
            args["generators"] = [None if partial and partial[i] else self.generator_for(s) for i, s in enumerate(seqs)]
        return {k: to_device(v, self.device) for k, v in args.items()} if on_device else args

    def generator_for(self, seq: Sequence):
        if seq.params.seed is None or seq.params.temperature == 0:
            return None
        if seq.generator is None:
            seq.generator = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        return seq.generator

    # ---- forward --------------------------------------------------------------------------
    @torch.inference_mode()
    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor,
                  logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """-> the logits of the rows in logits_rows (prefill: each sequence's last position, every
        position of a prompt_logprobs request), or of every row."""
        hidden = self.model(input_ids, positions)
        return self.model.compute_logits(hidden if logits_rows is None else hidden[logits_rows])

    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], is_prefill: bool, prev: "Pending | None" = None,
               block_copies=()) -> "Pending":
        """Queue one step on the device and return without waiting for it: build and send the batch,
        copy the blocks copy-on-write asks for, run it (a decode graph's replay when one fits, else
        the eager forward), sample."""
        self._check_alive()
        batch = self.build_batch(seqs, is_prefill, block_copies)
        self.send_batch(batch)
        self.copy_blocks(batch.block_copies)
        src = self.input_sources(seqs, batch, prev)
        graphed = not is_prefill and self.graphs is not None and self.graphs.padded_size(len(seqs))
        # a chunk short of its prompt's end samples a token nobody keeps: it must not draw on the
        # request's own random stream (a seeded request's tokens do not depend on chunking)
        partial = [s.num_computed_tokens < s.num_tokens for s in seqs] if is_prefill else None
        sample_args = self.prepare_sample(seqs, on_device=not graphed, partial=partial)
        if "processors" in sample_args and src is not None:  # queued before a replay overwrites prev's tokens
            sample_args["processors"]["last_ids"] = self.last_ids(prev, src)
        if graphed:
            sampled = self.graphs.run(batch, None if src is None else prev.token_ids, src, sample_args)
            prompt_logprobs = []
        else:
            sampled, prompt_logprobs = self.eager_step(batch, prev, src, sample_args)
        token_ids, logprobs = sampled if isinstance(sampled, tuple) else (sampled, None)
        pending = self.pending(seqs, is_prefill, token_ids)
        pending.logprobs, pending.prompt_logprobs = logprobs, prompt_logprobs
        return pending

    def input_sources(self, seqs: list[Sequence], batch: "Batch", prev: "Pending | None") -> np.ndarray | None:
        """With async scheduling a decode sequence's newest token may still be on the device (its host
        value is PLACEHOLDER_TOKEN): -> per row, the row of prev that sampled it (NO_SOURCE_ROW: the
        token is on the host), or None when every input token is known."""
        if not (batch.input_ids == PLACEHOLDER_TOKEN).any():
            return None
        if batch.is_prefill or prev is None:
            raise RuntimeError("a step's input tokens are not known yet; resolve the previous step first")
        return np.asarray([prev.rows.get(s.seq_id, NO_SOURCE_ROW) if s.last_token == PLACEHOLDER_TOKEN
                           else NO_SOURCE_ROW for s in seqs])

    def last_ids(self, prev: "Pending", src: np.ndarray) -> torch.Tensor:
        """Per row, the token prev sampled for it (still on the device), or the padding id V."""
        idx = to_device(src, self.device)
        return torch.where(idx != NO_SOURCE_ROW, prev.token_ids[idx.clamp_min(0)], self.model_config.vocab_size)

    def eager_step(self, batch: "Batch", prev: "Pending | None", src: np.ndarray | None,
                   sample_args: dict) -> tuple:
        """The forward launched op by op (prefill; decode without a graph) -> (what the sampler returns:
        ids [B] on the device, or (ids, TokenLogprobs)), the prompt logprobs [(row, first position,
        TokenLogprobs)]."""
        input_ids, positions = self.load_batch(batch)
        logits_rows = None if batch.logits_rows is None else to_device(batch.logits_rows, self.device)
        if src is not None:
            idx = to_device(src, self.device)
            input_ids = torch.where(idx != NO_SOURCE_ROW, prev.token_ids[idx.clamp_min(0)], input_ids)
        try:
            logits = self.run_model(input_ids, positions, logits_rows)
            # prompt tokens go through no logits processor: raw and processed modes alike score the raw logits
            mode = self.config.logprobs_mode
            prompt_logprobs = [(row, pos, token_logprobs(logits[first:first + len(targets)],
                                                         to_device(targets, self.device), k, mode))
                               for row, first, pos, targets, k in batch.prompt_logprobs]
            if batch.sample_rows is not None:
                logits = logits[to_device(batch.sample_rows, self.device)]
            return self.sampler(logits, **sample_args), prompt_logprobs
        finally:
            reset_context()

    def pending(self, seqs: list[Sequence], is_prefill: bool, token_ids: torch.Tensor) -> "Pending":
        """A launched step; on CUDA its sampled ids start their copy to pinned host memory."""
        pending = Pending(seqs, is_prefill, token_ids, {s.seq_id: i for i, s in enumerate(seqs)})
        if self.device.type == "cuda":  # (logprobs, the slow path, are read back with a plain copy)
            pending.host = torch.empty(token_ids.shape, dtype=token_ids.dtype, pin_memory=True)
            pending.host.copy_(token_ids, non_blocking=True)
            pending.event = torch.cuda.Event()
            pending.event.record()
        return pending

    def resolve(self, pending: "Pending") -> list[int]:
        """Wait for a launched step; -> its sampled token ids (host ints). Its logprobs, if any, are
        then on the host too."""
        if pending.logprobs is not None:
            pending.logprobs = TokenLogprobs(*(t.cpu() for t in pending.logprobs))
        pending.prompt_logprobs = [(row, pos, TokenLogprobs(*(t.cpu() for t in lp)))
                                   for row, pos, lp in pending.prompt_logprobs]
        if pending.event is not None:
            pending.event.synchronize()
            return pending.host.tolist()
        return pending.token_ids.tolist()


class DeviceMemory:
    """What one runner holds on its device: the weights (its model), the KV cache, the CUDA graphs,
    and under tensor parallelism its process group. Kept apart from the runner so that a finalizer
    can hold it and free it when the runner is collected."""

    def __init__(self, device: torch.device, group=None):
        self.device = device
        self.group = group  # the tensor-parallel ProcessGroup (None for one process)
        self.model = self.kv_cache = self.graphs = None

    def nbytes(self) -> int:
        """Bytes of weights and KV cache (the graphs' pool is small beside them)."""
        tensors = [*self.model.parameters(), *self.model.buffers()] if self.model is not None else []
        tensors += [self.kv_cache] if self.kv_cache is not None else []
        return sum(t.numel() * t.element_size() for t in tensors)

    def release(self) -> None:
        """Free it all, even where something else still refers to the model or the cache (a user's
        variable, a traceback): their tensors are emptied in place."""
        graphs, model, kv_cache = self.graphs, self.model, self.kv_cache
        # no reference to the process group may outlive the group (minillm/engine/tp.py says why)
        self.graphs = self.model = self.kv_cache = self.group = None
        if graphs is not None:  # first: their pool holds their outputs, and their captured NCCL calls
            graphs.release()    # must not outlive the process group
        if model is not None:
            for p in model.parameters():
                # a weight_loader is a bound method of its layer (layer -> parameter -> layer): a cycle
                p.__dict__.pop("weight_loader", None)
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            for b in model.buffers():
                b.data = torch.empty(0, dtype=b.dtype, device=b.device)
            for m in model.modules():
                if isinstance(m, Attention):  # its views of the KV cache
                    m.k_cache = m.v_cache = torch.tensor([])
                if getattr(m, "tp_group", None) is not None:  # a parallel layer's process group
                    m.tp_group = None
        if kv_cache is not None:
            kv_cache.data = torch.empty(0, dtype=kv_cache.dtype, device=kv_cache.device)
        del graphs, model, kv_cache
        reset_context()  # a step that raised may have left its tensors in the attention context
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # back to the device, where mem_get_info (and other processes) see it


# every runner alive in this process: a new engine that finds too little memory names them
_LIVE_RUNNERS: weakref.WeakSet = weakref.WeakSet()
FREE_OTHERS = ("call .shutdown() on the engine you no longer need (in a notebook: run `llm.shutdown()` before "
               "re-running `llm = LLM(...)`, or create engines with `with LLM(...) as llm:`)")


def other_engines_memory(runner: ModelRunner) -> str:
    """'' when no other live runner holds memory on runner's device, else a phrase saying how much."""
    others = [r for r in list(_LIVE_RUNNERS)
              if r is not runner and r.device == runner.device and r.memory.model is not None]
    if not others:
        return ""
    held = sum(r.memory.nbytes() for r in others) / GIB
    return f"{len(others)} other minillm engine(s) in this process still hold {held:.1f} GiB of it"


@dataclass
class Pending:
    """A launched step: its sequences, the sampled ids on the device, and their host copy once ready."""

    seqs: list[Sequence]
    is_prefill: bool
    token_ids: torch.Tensor  # [B] int64, on the device
    rows: dict[int, int]  # seq_id -> row in this step
    # the index of each sequence's placeholder for this step's token: the engine appends them after launch
    # (None: a prefill chunk short of its prompt's end, whose sampled token nobody reads)
    positions: list[int | None] = field(default_factory=list)
    host: torch.Tensor | None = None  # pinned host copy (CUDA)
    event: torch.cuda.Event | None = None
    logprobs: TokenLogprobs | None = None  # per row (SamplingParams.logprobs)
    # (row, position of the first token scored, TokenLogprobs) per prompt_logprobs request
    prompt_logprobs: list[tuple[int, int, TokenLogprobs]] = field(default_factory=list)


@dataclass
class Batch:
    """One step's model inputs on the host. Prefill packs the tokens each sequence computes in this
    step (its uncached prompt, or one chunk of it); decode has one token per sequence. Arrays are numpy; None where a phase does not use them."""

    is_prefill: bool
    input_ids: np.ndarray  # [N] int64
    positions: np.ndarray  # [N] int64
    slot_mapping: np.ndarray | None  # [N] int64
    cu_seqlens_q: np.ndarray | None = None  # [B+1] int32 (prefill)
    cu_seqlens_k: np.ndarray | None = None  # [B+1] int32 (prefill)
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    context_lens: np.ndarray | None = None  # [B] int32 (decode)
    block_tables: np.ndarray | None = None  # [B, max_blocks] int32, PAD_BLOCK-padded (decode; prefill with keys
    #                                         before its queries: prefix hits, or the chunks of earlier steps)
    block_copies: np.ndarray | None = None  # [K, 2] int64 (src, dst) blocks to copy first (copy on write)
    # prefill: the rows of the forward whose logits are needed, and each sequence's row among them
    # (a sample forked in this step shares its parent's)
    logits_rows: np.ndarray | None = None  # [R] int64
    sample_rows: np.ndarray | None = None  # [B] int64, None when row i is logits row i
    # prefill, prompt_logprobs requests: (row in the step, first logits row, first position scored,
    # the prompt tokens scored [n] int64, k); only rank 0 reads it
    prompt_logprobs: list[tuple[int, int, int, np.ndarray, int]] = field(default_factory=list)


def bad_words_bans(s: Sequence) -> tuple[list[int], list[tuple[int, int]]]:
    """The tokens s's bad words ban at its next step, vLLM's rule: a word's last token when the tokens
    generated last are the rest of it (only generated tokens count: a longer prefix bans nothing).
    With async scheduling the newest token may be a placeholder, known only on the device.
    -> (tokens banned now, (token, newest) pairs: banned when the newest token turns out to be `newest`)."""
    banned, pending = [], []
    for ids in s.bad_words_ids:
        n = len(ids) - 1  # the prefix
        if n > s.num_completion_tokens:
            continue
        recent = s.token_ids[s.num_tokens - n:] if n else []
        if any(t != want for t, want in zip(recent, ids) if t != PLACEHOLDER_TOKEN):
            continue
        if recent and recent[-1] == PLACEHOLDER_TOKEN:  # (only the newest token can be one)
            pending.append((ids[-1], ids[-2]))
        else:
            banned.append(ids[-1])
    return banned, pending


def logits_inputs(seqs: list[Sequence], vocab_size: int) -> dict:
    """One step's inputs of apply_logits_processors (minillm.layers.logits_processors), host numpy:
    each row's bias triples, the tokens min_tokens and bad words ban, the bad-word bans that wait for
    the newest token (bad_words_bans), and for its penalties its generated tokens (output_ids) and its
    prompt and generated tokens (seen_ids), padded with vocab_size; a placeholder stays negative (the
    device fills it in)."""
    bias, banned, allowed, outputs, seen, pending = [], [], [], [], [], []
    for row, s in enumerate(seqs):
        p = s.params
        bias += [(row, t, b) for t, b in (p.logit_bias or {}).items()]
        allowed += [(row, t) for t in p.allowed_token_ids or ()]
        if s.num_completion_tokens < p.min_tokens:  # placeholders count: they are tokens already sampled
            banned += [(row, t) for t in s.min_tokens_blocked]
        if s.bad_words_ids:
            now, later = bad_words_bans(s)
            banned += [(row, t) for t in now]
            pending += [(row, t, newest) for t, newest in later]
        outputs.append(s.completion_token_ids if p.presence_penalty or p.frequency_penalty else [])
        seen.append(s.token_ids if p.repetition_penalty != 1.0 else [])

    def padded(lists: list[list[int]]) -> np.ndarray:
        out = np.full((len(lists), max(1, *map(len, lists))), vocab_size, dtype=np.int64)
        for i, ids in enumerate(lists):
            out[i, :len(ids)] = ids
        return out
    b, x = np.asarray(bias, dtype=np.float64).reshape(-1, 3), np.asarray(banned, dtype=np.int64).reshape(-1, 2)
    a = np.asarray(allowed, dtype=np.int64).reshape(-1, 2)
    w = np.asarray(pending, dtype=np.int64).reshape(-1, 3)
    f32 = lambda name: np.asarray([getattr(s.params, name) for s in seqs], dtype=np.float32)  # noqa: E731
    return dict(bias_rows=b[:, 0].astype(np.int64), bias_cols=b[:, 1].astype(np.int64),
                bias_values=b[:, 2].astype(np.float32), banned_rows=x[:, 0].copy(), banned_cols=x[:, 1].copy(),
                allowed_rows=a[:, 0].copy(), allowed_cols=a[:, 1].copy(),
                bad_rows=w[:, 0].copy(), bad_cols=w[:, 1].copy(), bad_after=w[:, 2].copy(),
                output_ids=padded(outputs), seen_ids=padded(seen), presence=f32("presence_penalty"),
                frequency=f32("frequency_penalty"), repetition=f32("repetition_penalty"))


def block_tables_array(seqs: list[Sequence]) -> np.ndarray:
    width = max(len(s.block_table) for s in seqs)
    table = np.full((len(seqs), width), PAD_BLOCK, dtype=np.int32)
    for i, s in enumerate(seqs):
        table[i, :len(s.block_table)] = s.block_table
    return table


def build_prefill_batch(seqs: list[Sequence], block_size: int) -> Batch:
    """Each sequence computes positions num_computed_tokens - num_new_tokens .. num_computed_tokens - 1
    (the scheduler set both): its whole uncached prompt, or one chunk of a long one. Its keys are all
    its tokens up to the chunk's end: those before the chunk (prefix-cache hits, earlier chunks) are
    read from the KV cache through the block tables."""
    input_ids, positions, slots = [], [], []
    cu_q, cu_k = [0], [0]
    logits_rows, sample_rows, prompt_logprobs = [], [], []
    row_of: dict[int, int] = {}  # seq_id -> its sample row
    computed = []  # the sequences the forward runs
    for row, s in enumerate(seqs):
        if s.fork_of is not None:  # forked from a sample earlier in this step: no tokens of its own
            sample_rows.append(row_of[s.fork_of.seq_id])
            continue
        computed.append(s)
        end = s.num_computed_tokens
        start = end - s.num_new_tokens
        assert 0 <= start < end <= s.num_tokens, "a prefill sequence computes at least one new token"
        input_ids.append(np.asarray(s.token_ids[start:end], dtype=np.int64))
        positions.append(np.arange(start, end, dtype=np.int64))
        cu_q.append(cu_q[-1] + end - start)
        cu_k.append(cu_k[-1] + end)
        if s.block_table:  # empty during the warm-up run that measures memory
            slots.append(slot_mapping_for(np.asarray(s.block_table), start, end, block_size))
        k = s.params.prompt_logprobs
        scored = s.token_ids[start + 1:min(end + 1, s.num_prompt_tokens)]  # position p scores token p + 1
        if k is not None and scored:
            prompt_logprobs.append((row, len(logits_rows), start + 1, np.asarray(scored, dtype=np.int64), k))
            logits_rows.extend(range(cu_q[-2], cu_q[-2] + len(scored)))
        logits_rows.append(cu_q[-1] - 1)  # the last position: the next token's logits
        row_of[s.seq_id] = len(logits_rows) - 1
        sample_rows.append(row_of[s.seq_id])
    prefix_hit = cu_k[-1] > cu_q[-1]  # keys longer than queries: read them through the block tables
    return Batch(
        is_prefill=True, input_ids=np.concatenate(input_ids), positions=np.concatenate(positions),
        slot_mapping=np.concatenate(slots) if slots else None,
        cu_seqlens_q=np.asarray(cu_q, dtype=np.int32), cu_seqlens_k=np.asarray(cu_k, dtype=np.int32),
        max_seqlen_q=max(b - a for a, b in zip(cu_q, cu_q[1:])), max_seqlen_k=max(b - a for a, b in zip(cu_k, cu_k[1:])),
        block_tables=block_tables_array(computed) if prefix_hit else None,
        logits_rows=np.asarray(logits_rows, dtype=np.int64),
        sample_rows=None if sample_rows == list(range(len(seqs))) else np.asarray(sample_rows, dtype=np.int64),
        prompt_logprobs=prompt_logprobs,
    )


def build_decode_batch(seqs: list[Sequence], block_size: int) -> Batch:
    context_lens = np.asarray([s.num_tokens for s in seqs], dtype=np.int32)
    last_blocks = np.asarray([s.block_table[-1] for s in seqs], dtype=np.int64)
    return Batch(
        is_prefill=False,
        input_ids=np.asarray([s.last_token for s in seqs], dtype=np.int64),
        positions=context_lens.astype(np.int64) - 1,
        slot_mapping=last_blocks * block_size + (context_lens.astype(np.int64) - 1) % block_size,
        context_lens=context_lens,
        block_tables=block_tables_array(seqs),
    )


_GREEDY = SamplingParams(temperature=0.0, max_tokens=1)
