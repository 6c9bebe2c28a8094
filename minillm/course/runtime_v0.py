"""Runtime v0: the simplest code that turns weights into tokens. One sequence, greedy, no scheduler.

    forward_pipeline(model, input_ids, positions)    ids -> embed_tokens -> layers -> norm -> lm_head -> logits
    greedy_generate_naive(runner, prompt, n)         every step recomputes the whole prefix
    greedy_generate_cached(runner, prompt, n)        prefill once into a KV cache, then one token per step

It is the chapter-1 baseline the engine is measured against, and it reuses the engine's parts rather
than a second model: `one_sequence_runner` builds the engine's ModelRunner (model, weights, KV cache);
a `Batch` carries one step's inputs and `runner.load_batch` sets the attention context that every
Attention layer reads (is it a prefill? where do this step's K/V go? which keys to attend to?).

A contiguous KV cache for one sequence is the engine's paged cache with the identity block table
[0, 1, 2, ...]: token t's K/V live in slot t (block t // block_size, row t % block_size).
"""
from __future__ import annotations

import numpy as np
import torch

from minillm.config import EngineConfig, ModelConfig
from minillm.context import reset_context
from minillm.engine.model_runner import Batch, ModelRunner
from minillm.course.speed_ladder import layer_path
from minillm.model_zoo import resolve_model


def one_sequence_runner(model: str, device: str = "auto", dtype: str = "auto", max_model_len: int = 1024,
                        block_size: int = 16, attention_backend: str = "torch") -> ModelRunner:
    """The engine's ModelRunner sized for ONE sequence of up to max_model_len tokens: the model with
    its weights loaded and a KV cache of exactly ceil(max_model_len / block_size) blocks, its layers
    chapter 2's decoder_layer (torch ops; on a GPU too, where an engine would build the fused kernels).
    model: an embedded name or a model folder. attention_backend 'torch' is the readable reference."""
    path = resolve_model(model)
    mc = ModelConfig.from_folder(path)
    num_blocks = -(-max_model_len // block_size)
    cfg = EngineConfig(model=model, device=device, dtype=dtype, max_model_len=max_model_len, max_num_seqs=1,
                       max_num_batched_tokens=max_model_len, kvcache_block_size=block_size,
                       num_kvcache_blocks=num_blocks, attention_backend=attention_backend, enforce_eager=True,
                       enable_prefix_caching=False)
    cfg.validate(mc)
    with layer_path("torch"):  # the baseline is the plain layer: chapters 2-5 measure what fusing buys
        runner = ModelRunner(cfg, mc, path)
    # unwritten slots hold whatever torch.empty returned (NaN bit patterns included), and a decode
    # that reads whole blocks must then mask them perfectly: start this toy runtime from a clean cache
    runner.kv_cache.zero_()
    return runner


def prefill_batch(token_ids: list[int], slot_mapping: np.ndarray | None = None) -> Batch:
    """One sequence's tokens as one prefill step at positions 0..L-1. slot_mapping: [L] cache slots
    to store their K/V in, or None to store nothing (attention then reads only these L keys)."""
    n = len(token_ids)
    cu = np.array([0, n], dtype=np.int32)
    return Batch(is_prefill=True, input_ids=np.asarray(token_ids, dtype=np.int64),
                 positions=np.arange(n, dtype=np.int64), slot_mapping=slot_mapping,
                 cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n, max_seqlen_k=n)


def check_batch(batch: Batch, num_slots: int | None = None, block_size: int | None = None) -> None:
    """ValueError, naming the field, when a hand-built step's arrays do not have the shapes Batch documents
    (a 1-D block table reaches the attention as an IndexError deep inside it otherwise); given the cache's
    num_slots, when a slot lies past the cache (a sequence grown past max_model_len); given block_size, when a
    decode row's context is longer than its block table covers (its attention would read fewer keys)."""
    n = len(batch.input_ids)
    phase = "prefill" if batch.is_prefill else "decode"
    want = {"input_ids": (batch.input_ids, 1, n), "positions": (batch.positions, 1, n),
            "slot_mapping": (batch.slot_mapping, 1, n)}
    if batch.is_prefill:
        want.update(cu_seqlens_q=(batch.cu_seqlens_q, 1, None), cu_seqlens_k=(batch.cu_seqlens_k, 1, None))
    else:
        want.update(context_lens=(batch.context_lens, 1, n), block_tables=(batch.block_tables, 2, n))
    for field, (value, ndim, rows) in want.items():
        if value is None:
            if field == "slot_mapping" and batch.is_prefill:
                continue  # a prefill that stores nothing
            raise ValueError(f"Batch.{field} is None: a {phase} step needs it")
        shape = np.shape(value)
        if len(shape) != ndim or (rows is not None and shape[0] != rows):
            need = (f"[{rows}, num_blocks]: a row per sequence (np.arange(num_blocks)[None, :] for one)"
                    if field == "block_tables" else f"[{rows if rows is not None else 'num_seqs + 1'}]")
            raise ValueError(f"Batch.{field} has shape {shape}; a {phase} step of {n} token{'' if n == 1 else 's'} "
                             f"needs {need} (see Batch in minillm/engine/model_runner.py)")
    if block_size is not None and not batch.is_prefill and len(batch.context_lens):
        longest, width = int(np.max(batch.context_lens)), np.shape(batch.block_tables)[1]
        if longest > width * block_size:
            raise ValueError(f"Batch.context_lens holds {longest} keys, but block_tables has {width} column"
                             f"{'' if width == 1 else 's'} of {block_size}-token blocks ({width * block_size} keys): "
                             f"a row needs ceil(context_len / block_size) blocks in its table")
    if num_slots is not None and batch.slot_mapping is not None and len(batch.slot_mapping) \
            and int(np.max(batch.slot_mapping)) >= num_slots:
        raise ValueError(f"Batch.slot_mapping holds slot {int(np.max(batch.slot_mapping))}, past the KV cache's "
                         f"{num_slots} slots: the sequence has grown longer than the runner's max_model_len (a loop "
                         f"that never stops? a list that grows while you iterate or append to it?)")


@torch.inference_mode()
def last_logits(runner: ModelRunner, batch: Batch) -> torch.Tensor:
    """Run one step through the engine's model and return the logits of the batch's LAST row: [vocab] fp32.
    (load_batch copies the batch to the device and sets the attention context; it is reset after.)
    A step whose arrays do not have Batch's shapes raises ValueError naming the field (check_batch)."""
    check_batch(batch, runner.num_kvcache_blocks * runner.block_size, runner.block_size)
    input_ids, positions = runner.load_batch(batch)
    try:
        hidden = runner.model(input_ids, positions)
        return runner.model.compute_logits(hidden[-1:])[0].float()
    finally:
        reset_context()


# >>> exercise 1.4 | notebooks/01_vocab_weights_runtime.ipynb | 8. The runtime: the forward pipeline
def forward_pipeline(model, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The whole forward of a decoder-only model, written out.

    model: the engine's Qwen3ForCausalLM (model.model.embed_tokens, model.model.layers,
    model.model.norm, model.lm_head); input_ids, positions: [N] int64 on the model's device.
    -> logits [N, vocab] in the model's dtype.
    Each decoder layer is called as layer(positions, hidden, residual) -> (hidden, residual); the
    first layer gets residual=None. The final norm is called as norm(hidden, residual) and returns
    (normed, residual): it adds the last layer's output to the residual stream before normalizing.
    The caller has set the attention context (runner.load_batch) the layers read.
    Hints: four steps, one loop; compare with Qwen3Model.forward and compute_logits.
    """
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, residual)
    hidden, _ = model.model.norm(hidden, residual)
    return model.lm_head(hidden)
# <<< exercise 1.4


# >>> exercise 1.5 | notebooks/01_vocab_weights_runtime.ipynb | 9. A generate loop without a cache
def greedy_generate_naive(runner: ModelRunner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding that recomputes everything: each step runs the model over the WHOLE sequence so
    far (prompt + tokens generated until now) and appends the argmax of the last position's logits.

    runner: from one_sequence_runner; prompt_ids: the prompt's token ids.
    -> the max_new_tokens generated ids (EOS is not special here).
    Hints: prefill_batch(ids) builds one step with no cache (slot_mapping None);
    last_logits(runner, batch) runs it; int(logits.argmax()).
    """
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(last_logits(runner, prefill_batch(ids)).argmax()))
    return ids[len(prompt_ids):]
# <<< exercise 1.5


# >>> exercise 1.6 | notebooks/01_vocab_weights_runtime.ipynb | 10. A KV cache
def greedy_generate_cached(runner: ModelRunner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding with a contiguous KV cache: the same computation as greedy_generate_naive (in
    fp32, the same tokens), but each token's keys and values are computed once. In bf16 on a GPU the
    two loops run different kernels, which round differently, so a near-tie between the two best
    candidates can go either way and the texts part there (notebook 01, section 11 shows where).

    Prefill: run the L prompt tokens once, storing their K/V in cache slots 0..L-1; its last logits
    give the first new token. Decode: run ONLY the newest token, at position n - 1 (n = tokens so
    far), storing its K/V in slot n - 1, attending to all n cached keys; repeat until
    max_new_tokens tokens exist. The cache is the runner's paged cache used contiguously: the
    identity block table [0, 1, ..., runner.num_kvcache_blocks - 1], so slot = position.
    runner: from one_sequence_runner (prompt + new tokens must fit in its max_model_len).
    -> the max_new_tokens generated ids ([] for max_new_tokens 0, without running the model).
    Hints: prefill_batch(ids, slot_mapping=...); a decode step is a Batch(is_prefill=False, ...)
    with input_ids, positions, slot_mapping of length 1, context_lens [n] (int32) and
    block_tables [1, num_blocks] (int32); see Batch in minillm/engine/model_runner.py.
    """
    ids = list(prompt_ids)
    if max_new_tokens < 1:
        return []
    block_table = np.arange(runner.num_kvcache_blocks, dtype=np.int32)[None, :]
    logits = last_logits(runner, prefill_batch(ids, slot_mapping=np.arange(len(ids), dtype=np.int64)))
    ids.append(int(logits.argmax()))
    while len(ids) - len(prompt_ids) < max_new_tokens:
        pos = np.array([len(ids) - 1], dtype=np.int64)
        step = Batch(is_prefill=False, input_ids=np.array(ids[-1:], dtype=np.int64), positions=pos,
                     slot_mapping=pos, context_lens=np.array([len(ids)], dtype=np.int32), block_tables=block_table)
        ids.append(int(last_logits(runner, step).argmax()))
    return ids[len(prompt_ids):]
# <<< exercise 1.6
