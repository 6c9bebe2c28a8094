"""Chapter 5 exercises: YOUR file. Fill in the bodies below, then grade one exercise with
    make grade EX=5.1            (or: pytest tests/exercises -m ex5_1)
(Generated from minillm/ by `make exercises`, which refuses to overwrite a file holding your code.)

Exercise 5.1: graph_batch_sizes, graph_size_for, pad_graph_inputs  (notebooks/05_engine_performance.ipynb, section '3. CUDA graphs')
Exercise 5.2: append_placeholders, fill_placeholders  (notebooks/05_engine_performance.ipynb, section '4. Async scheduling: the CPU works while the GPU runs')
Exercise 5.3: apply_top_k_top_p, gumbel_sample  (notebooks/05_engine_performance.ipynb, section 'Sampling without a host sync: the Gumbel-max trick')
Exercise 5.4: model_bytes, workload_floor  (notebooks/05_engine_performance.ipynb, section '1. The floor: what "fast" can mean')
"""
from __future__ import annotations

import numpy as np
import torch
from minillm.context import PAD_BLOCK
from minillm.context import SKIP_SLOT
from minillm.engine.sequence import PLACEHOLDER_TOKEN
from minillm.sampling_params import SamplingParams


# ---- Exercise 5.1 (notebooks/05_engine_performance.ipynb, section '3. CUDA graphs'), from minillm.engine.cuda_graph ----
def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a decode graph: 1, 2, 4, 8, then every multiple of 16 up to
    max_num_seqs, and max_num_seqs itself (nano-vLLM's choice), ascending, each once, none larger
    than max_num_seqs.  e.g. 64 -> [1, 2, 4, 8, 16, 32, 48, 64];  20 -> [1, 2, 4, 8, 16, 20];  3 -> [1, 2, 3]

    Every size costs a capture at start-up and memory for its outputs; a batch runs the graph of the
    next size up, so the gaps between sizes are rows of wasted work.
    """
    raise NotImplementedError("Exercise 5.1: implement graph_batch_sizes in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section '3. CUDA graphs')")


def graph_size_for(sizes: list[int], batch_size: int) -> int | None:
    """The captured size that runs a decode batch of batch_size rows: the smallest of `sizes` (ascending)
    that is >= batch_size, or None when batch_size is larger than all of them (the batch runs eagerly).
    e.g. sizes [1, 2, 4, 8, 16, 32]: 3 -> 4, 16 -> 16, 17 -> 32, 33 -> None.
    """
    raise NotImplementedError("Exercise 5.1: implement graph_size_for in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section '3. CUDA graphs')")


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
    raise NotImplementedError("Exercise 5.1: implement pad_graph_inputs in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section '3. CUDA graphs')")


# ---- Exercise 5.2 (notebooks/05_engine_performance.ipynb, section '4. Async scheduling: the CPU works while the GPU runs'), from minillm.engine.llm_engine ----
def append_placeholders(token_lists: list[list[int]], num_prompt_tokens: list[int], max_tokens: list[int],
                        max_model_len: int) -> tuple[list[int], list[bool]]:
    """Give every sequence of a step just launched a placeholder for the token that step will sample.

    token_lists[i]: sequence i's tokens, prompt then completion (it may already end in the
    placeholder of the step launched before, PLACEHOLDER_TOKEN = -1, not read back yet);
    num_prompt_tokens[i], max_tokens[i]: its prompt length and its SamplingParams.max_tokens (the
    caller passes max_model_len where that is None);
    max_model_len: no sequence may grow longer than this.
    In place: appends PLACEHOLDER_TOKEN to every list.
    -> (positions, at_limit), one per sequence: positions[i] is the index of its new placeholder;
       at_limit[i] is True when that placeholder is its last token: with it the completion
       (tokens after the prompt) has max_tokens[i] tokens, or the sequence has max_model_len tokens.
       The engine schedules such a sequence no more: its length is known now, its last token later.

    Hints: a placeholder counts like a token; decide at_limit after appending it.
    """
    raise NotImplementedError("Exercise 5.2: implement append_placeholders in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section '4. Async scheduling: the CPU works while the GPU runs')")


def fill_placeholders(token_lists: list[list[int]], positions: list[int], sampled: list[int],
                      at_limit: list[bool], eos_token_ids: set[int], params: list[SamplingParams]) -> list[str | None]:
    """Write a step's sampled tokens over their placeholders, one step after it was launched.

    With async scheduling the tokens of step n are read back while step n+1 runs, so a sequence can
    end in two placeholders: step n's at positions[i] and step n+1's after it.
    token_lists[i]: sequence i's tokens as they are now; positions[i]: the index of step n's
    placeholder (append_placeholders' positions); sampled[i]: the token step n sampled there;
    at_limit[i]: the sequence has reached its length limit (append_placeholders said so for its
    newest placeholder); eos_token_ids: the model's EOS ids; params[i]: its SamplingParams
    (ignore_eos, stop_token_ids).
    -> one outcome per sequence, and in place:
      "dropped": the sequence ended before this token (a stop one step earlier, an abort): an ended
                 sequence keeps no placeholder, so positions[i] is past its end or holds a real
                 token. Nothing is written.
      "stop":    the token is written and stops the sequence: it is in eos_token_ids (unless
                 params[i].ignore_eos) or in params[i].stop_token_ids. The placeholders after it
                 are removed: the step launched meanwhile computed a token nobody will read.
      "length":  the token is written and is the sequence's last: at_limit[i] and positions[i] is
                 its last index. A stop token there is a "stop".
      None:      the token is written; the sequence goes on.
    (Stop strings need the decoded text: the engine checks them afterwards.)

    Hints: the order of the checks above matters; `del tokens[i:]` removes a tail in place.
    """
    raise NotImplementedError("Exercise 5.2: implement fill_placeholders in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section '4. Async scheduling: the CPU works while the GPU runs')")


# ---- Exercise 5.3 (notebooks/05_engine_performance.ipynb, section 'Sampling without a host sync: the Gumbel-max trick'), from minillm.layers.sampler ----
def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask each row to its top-k and nucleus (top-p) tokens.

    logits: [B, V] fp32 (already divided by the temperature); top_k: [B] int (V for off) or None;
    top_p: [B] float in (0, 1] (1.0 for off) or None.
    -> [B, V]: logits with every token outside the row's kept set at -inf, the rest unchanged (a new
    tensor: the caller's logits stay as they were).
    Top-k keeps the k largest logits of the row. Top-p is applied after top-k, to the softmax of the
    logits top-k kept: rank those tokens by probability, and keep each token whose strictly
    better-ranked tokens hold less than top_p of the mass (the smallest prefix whose mass reaches
    top_p; the best token always stays). These are transformers' TopKLogitsWarper then
    TopPLogitsWarper, per row, but for ties at the k-th value: keep exactly k tokens (the first k of
    the sort), where transformers keeps every token tied with the k-th (the grader avoids ties).

    Hints: sort each row once (descending), build a boolean drop mask in sorted order, and scatter
    the masked values back through the sort's indices; probs.cumsum(-1) - probs is the mass before.
    """
    raise NotImplementedError("Exercise 5.3: implement apply_top_k_top_p in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section 'Sampling without a host sync: the Gumbel-max trick')")


def gumbel_sample(logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor | None = None,
                  top_p: torch.Tensor | None = None, generators: list | None = None,
                  any_greedy: bool | None = None) -> torch.Tensor:
    """Sample one token per row with the Gumbel-max trick: no softmax, no cumulative sum, no host sync.

    logits: [B, V] fp32; temperatures: [B] fp32 (0 = greedy: that row takes its plain argmax);
    top_k, top_p: as apply_top_k_top_p, or None; generators: None, or per row a torch.Generator
    (a seeded request's own stream) or None; any_greedy: False when the caller knows no row is
    greedy (the argmax is then skipped), else None or True.
    -> [B] int64 token ids. Row b is drawn from softmax(logits[b] / T_b) restricted to its
    top-k / top-p set, because argmax_i (x_i + G_i) with independent Gumbel noise
    G_i = -log(-log U_i), U_i ~ Uniform(0, 1), is distributed as softmax(x).
    The noise is drawn exactly this way, so a seeded request gets the same tokens whatever else is
    in the batch: U = torch.rand_like(logits) for the whole batch (the global generator), then
    each row b with generators[b] not None replaces its row with
    torch.rand(V, generator=generators[b], device=logits.device) (one draw per call).

    Hints: divide by temperatures.clamp_min(1e-6)[:, None] so a greedy row does not divide by
    zero; mask after dividing (top-p is defined on the tempered distribution); argmax(x - log(-log U)).
    """
    raise NotImplementedError("Exercise 5.3: implement gumbel_sample in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section 'Sampling without a host sync: the Gumbel-max trick')")


# ---- Exercise 5.4 (notebooks/05_engine_performance.ipynb, section '1. The floor: what "fast" can mean'), from minillm.bench ----
def model_bytes(mc, dtype_bytes: int) -> tuple[float, float, float]:
    """What one decode step must read, for a model config (minillm.config.ModelConfig).

    mc: hidden_size h, intermediate_size i, num_hidden_layers L, num_attention_heads H,
    num_key_value_heads Hkv, head_dim d, vocab_size, and the flags qk_norm (Qwen3: an RMSNorm
    weight of d on q and one on k, per layer), qkv_bias (a bias on q, k and v), o_bias (a bias on
    o_proj); dtype_bytes: bytes per weight and per cached K/V element (2 for bf16).
    -> (weight bytes read per decode step, K/V bytes per token, non-embedding parameters).
    Non-embedding parameters: every weight of the L decoder layers (q, k, v, o projections; the
    MLP's gate, up and down; the two RMSNorms; QK-norms and biases when the flags say so) and the
    final norm, i.e. everything but the embedding table and the LM head.
    A decode step reads every non-embedding weight and the whole LM head (vocab_size x h: it
    scores the entire vocabulary), but only B rows of the embedding table: count those as nothing.
    With tied embeddings the LM head IS the embedding table; it is read once, as the LM head.
    K/V bytes per token: the key and the value of every KV head of every layer.
    Returns floats or ints (they are compared as numbers).
    """
    raise NotImplementedError('Exercise 5.4: implement model_bytes in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section \'1. The floor: what "fast" can mean\')')


def workload_floor(mc, dtype_bytes: int, prompt_lens, output_lens, copy_gbps: float, matmul_tflops: float) -> dict:
    """Seconds the device needs for a workload at its ceilings: the bench's floor.

    prompt_lens, output_lens: iterables of ints, one per request (request r prefills p_r tokens and
    outputs o_r >= 1 tokens); copy_gbps: bytes/s / 1e9 the device moves; matmul_tflops: FLOP/s / 1e12.
    Assume every request starts at once. The first token of each request comes from its prefill;
    decode step t = 1, 2, ..., max(o) - 1 then makes one token for every request with o_r > t,
    reading all weights once (model_bytes) plus the K/V of the p_r + t tokens each of them holds.
    Prefill costs FLOPs only: 2 x non-embedding parameters per prompt token, plus attention,
    2 x p_r^2 x H x d per layer for request r (QK^T and PV over the causal half).
    -> {"floor_decode_s": decode bytes / copy rate, "floor_prefill_s": prefill FLOPs / matmul rate,
        "floor_s": their sum, "floor_tok_s": total output tokens / floor_s}, floats.

    Hints: the sums have closed forms per request; numpy float64 keeps 256 requests exact enough.
    """
    raise NotImplementedError('Exercise 5.4: implement workload_floor in exercises/ch5.py (see notebooks/05_engine_performance.ipynb, section \'1. The floor: what "fast" can mean\')')
