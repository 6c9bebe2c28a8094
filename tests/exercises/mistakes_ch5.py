"""Chapter 5's known wrong versions (see mistakes.py): the engine at speed.

Each function below is an exercise function written the way students get it wrong: a CUDA-graph
bucket rounded the wrong way or padding rows that keep an old step's inputs (5.1), a placeholder
resolved at the wrong time (5.2), a Gumbel-max sampler whose distribution is off (5.3), a floor that
counts the wrong bytes or FLOPs (5.4).
"""
from __future__ import annotations

import numpy as np
import torch

from minillm.bench import model_bytes as right_model_bytes
from minillm.engine.sequence import PLACEHOLDER_TOKEN
from minillm.layers.sampler import apply_top_k_top_p as right_top_k_top_p
from mistakes import Mistake


# ---- 5.1 CUDA-graph buckets and padding ---------------------------------------------------------------
def graph_batch_sizes_without_max(max_num_seqs):
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs + 1, 16))
    return sorted(set(sizes))  # the bug: max_num_seqs itself is not a size when it is not a multiple of 16


def graph_size_rounds_down(sizes, batch_size):
    fits = [s for s in sizes if s <= batch_size]  # the bug: the largest size <= B, not the smallest >= B
    return fits[-1] if fits else None


def graph_size_strictly_larger(sizes, batch_size):
    return next((s for s in sizes if s > batch_size), None)  # the bug: >, so a batch of exactly size s skips its graph


def _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, *, pad_slot=-1,
         pad_rows=True, clear_columns=True):
    """pad_graph_inputs with one rule switched off."""
    ids, pos, slots, lens, tables = out
    bs = len(input_ids)
    ids[:bs], pos[:bs], slots[:bs], lens[:bs] = input_ids, positions, slot_mapping, context_lens
    width = block_tables.shape[1]
    tables[:bs, :width] = block_tables
    if clear_columns:
        tables[:bs, width:] = -1
    if pad_rows:
        ids[bs:padded], pos[bs:padded], slots[bs:padded], lens[bs:padded] = 0, 0, pad_slot, 0
        tables[bs:padded] = -1


def pad_graph_inputs_slot_zero(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, pad_slot=0)


def pad_graph_inputs_stale_rows(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, pad_rows=False)


def pad_graph_inputs_stale_columns(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, clear_columns=False)


# ---- 5.2 async placeholders ---------------------------------------------------------------------------
def append_placeholders_limit_before(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    positions, at_limit = [], []
    for tokens, prompt_len, limit in zip(token_lists, num_prompt_tokens, max_tokens):
        positions.append(len(tokens))
        # the bug: the limit is checked before the placeholder is counted
        at_limit.append(len(tokens) - prompt_len >= limit or len(tokens) >= max_model_len)
        tokens.append(PLACEHOLDER_TOKEN)
    return positions, at_limit


def _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, *, eos_always=False,
          length_at_any_position=False, drop_next=True, length_first=False):
    """fill_placeholders with one rule switched off."""
    outcomes = []
    for tokens, pos, tok, limit, p in zip(token_lists, positions, sampled, at_limit, params):
        if pos >= len(tokens) or tokens[pos] != PLACEHOLDER_TOKEN:
            outcomes.append("dropped")
            continue
        tokens[pos] = tok
        stop = ((eos_always or not p.ignore_eos) and tok in eos_token_ids) or tok in p.stop_token_ids
        last = limit and (length_at_any_position or pos == len(tokens) - 1)
        if length_first and last:
            outcomes.append("length")
        elif stop:
            if drop_next:
                del tokens[pos + 1:]
            outcomes.append("stop")
        elif last:
            outcomes.append("length")
        else:
            outcomes.append(None)
    return outcomes


def fill_placeholders_eos_despite_ignore_eos(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, eos_always=True)


def fill_placeholders_length_too_early(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, length_at_any_position=True)


def fill_placeholders_keeps_next_placeholder(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, drop_next=False)


def fill_placeholders_length_before_stop(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, length_first=True)


# ---- 5.3 the Gumbel-max sampler ----------------------------------------------------------------------
def _mask(logits, top_k, top_p, *, k_extra=0, mass_with_self=False):
    """apply_top_k_top_p with one rule changed."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        drop |= ranks[None, :] >= top_k[:, None] + k_extra
    if top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        mass = probs.cumsum(dim=-1) if mass_with_self else probs.cumsum(dim=-1) - probs
        drop |= mass >= top_p[:, None]
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def top_k_keeps_one_more(logits, top_k, top_p):
    return _mask(logits, top_k, top_p, k_extra=1)


def top_p_drops_the_crossing_token(logits, top_k, top_p):
    return _mask(logits, top_k, top_p, mass_with_self=True)


def top_k_top_p_fills_minus_1e9(logits, top_k, top_p):
    masked = _mask(logits, top_k, top_p)
    return masked.masked_fill(torch.isneginf(masked), -1e9)  # the bug: a large negative number, not -inf


def top_k_top_p_left_sorted(logits, top_k, top_p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        drop |= torch.arange(logits.shape[-1], device=logits.device)[None, :] >= top_k[:, None]
    if top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        drop |= probs.cumsum(dim=-1) - probs >= top_p[:, None]
    return sorted_logits.masked_fill(drop, float("-inf"))  # the bug: still in sorted order, never scattered back


def _gumbel(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None, *,
            temperature_after_noise=False, noise_sign=1.0, mask_before_temperature=False, use_generators=True,
            divide_in_place=False, greedy_argmax=True, argmax_if_truthy=False):
    """gumbel_sample with one bug switched on (the noise is drawn exactly as the right version draws it)."""
    told = bool(any_greedy) if argmax_if_truthy else any_greedy is not False
    greedy = logits.argmax(dim=-1) if told and greedy_argmax else None
    t = temperatures.clamp_min(1e-6)[:, None]
    if mask_before_temperature and (top_k is not None or top_p is not None):
        logits = right_top_k_top_p(logits, top_k, top_p)
    if divide_in_place:  # the bug: the caller's logits are divided
        logits.div_(t)
    elif not temperature_after_noise:
        logits = logits / t
    if not mask_before_temperature and (top_k is not None or top_p is not None):
        logits = right_top_k_top_p(logits, top_k, top_p)
    uniform = torch.rand_like(logits)
    if generators and use_generators:
        for row, gen in enumerate(generators):
            if gen is not None:
                uniform[row] = torch.rand(logits.shape[1], generator=gen, device=logits.device)
    noisy = logits - noise_sign * uniform.log().neg().log()
    if temperature_after_noise:
        noisy = noisy / t
    sampled = noisy.argmax(dim=-1)
    return sampled if greedy is None else torch.where(temperatures > 0, sampled, greedy)


def gumbel_temperature_after_noise(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, temperature_after_noise=True)


def gumbel_noise_sign_flipped(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, noise_sign=-1.0)


def gumbel_mask_before_temperature(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, mask_before_temperature=True)


def gumbel_ignores_generators(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, use_generators=False)


def gumbel_divides_in_place(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, divide_in_place=True)


def gumbel_greedy_by_clamp(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    # the bug: no argmax for temperature 0; logits / 1e-6 is trusted to swamp the noise (it does not between ties)
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, greedy_argmax=False)


def gumbel_argmax_only_if_any_greedy(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    # the bug: `if any_greedy:` reads None ("not known") as False, so a caller that does not say gets no argmax
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, argmax_if_truthy=True)


def fill_placeholders_overwrites_real_token(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    outcomes = []
    for tokens, pos, tok, limit, p in zip(token_lists, positions, sampled, at_limit, params):
        if pos >= len(tokens):  # the bug: a position that holds a real token is written over
            outcomes.append("dropped")
            continue
        tokens[pos] = tok
        if (not p.ignore_eos and tok in eos_token_ids) or tok in p.stop_token_ids:
            del tokens[pos + 1:]
            outcomes.append("stop")
        elif limit and pos == len(tokens) - 1:
            outcomes.append("length")
        else:
            outcomes.append(None)
    return outcomes


# ---- 5.4 the bench's floor ---------------------------------------------------------------------------
def model_bytes_reads_the_embedding(mc, dtype_bytes):
    weights, kv, params = right_model_bytes(mc, dtype_bytes)
    return weights + mc.vocab_size * mc.hidden_size * dtype_bytes, kv, params  # the bug: the table read whole


def model_bytes_without_lm_head(mc, dtype_bytes):
    weights, kv, params = right_model_bytes(mc, dtype_bytes)
    return params * dtype_bytes, kv, params  # the bug: the LM head is not read


def model_bytes_kv_of_query_heads(mc, dtype_bytes):
    weights, _, params = right_model_bytes(mc, dtype_bytes)
    return weights, 2 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim * dtype_bytes, params


def model_bytes_keys_only(mc, dtype_bytes):
    weights, kv, params = right_model_bytes(mc, dtype_bytes)
    return weights, kv // 2, params  # the bug: the values are not counted


def _floor(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, *, first_step=1, causal=2):
    weights, kv_tok, params = right_model_bytes(mc, dtype_bytes)
    p, o = np.asarray(list(prompt_lens), dtype=np.float64), np.asarray(list(output_lens))
    decode_bytes = 0.0
    for t in range(first_step, int(o.max())):
        active = o > t
        decode_bytes += weights + ((p[active] + t) * kv_tok).sum()
    H, d, L = mc.num_attention_heads, mc.head_dim, mc.num_hidden_layers
    prefill_flops = 2 * params * p.sum() + (2 * causal * p ** 2 * H * d * L).sum() / 2
    decode_s, prefill_s = decode_bytes / (copy_gbps * 1e9), prefill_flops / (matmul_tflops * 1e12)
    return {"floor_s": decode_s + prefill_s, "floor_decode_s": decode_s, "floor_prefill_s": prefill_s,
            "floor_tok_s": float(o.sum()) / (decode_s + prefill_s)}


def workload_floor_decodes_the_first_token(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, first_step=0)


def workload_floor_full_attention(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, causal=4)


MISTAKES = [
    # 5.1
    Mistake("ch5_graph_sizes_without_max", "5.1", {"graph_batch_sizes": graph_batch_sizes_without_max},
            "max_num_seqs itself is missing from the sizes when it is not a multiple of 16 (e.g. 20 gives "
            "[1, 2, 4, 8, 16]): a full batch of max_num_seqs would then have no graph and run eagerly. Add "
            "max_num_seqs to the list",
            "test_ch5.py::test_graph_batch_sizes"),
    Mistake("ch5_graph_size_rounds_down", "5.1", {"graph_size_for": graph_size_rounds_down},
            "the batch gets the largest captured size <= B: a graph of fewer rows than the batch has no row for "
            "its last sequences. Take the smallest size >= B (None when B is larger than every size)",
            "test_ch5.py::test_graph_size_for"),
    Mistake("ch5_graph_size_strictly_larger", "5.1", {"graph_size_for": graph_size_strictly_larger},
            "a batch of exactly a captured size runs the next size up (the sizes > B are searched): the graph of "
            "B rows fits it with no padding at all, and the largest size is then never used (B = max_num_seqs runs "
            "eagerly). Take the smallest size >= B",
            "test_ch5.py::test_graph_size_for"),
    Mistake("ch5_pad_slot_zero", "5.1", {"pad_graph_inputs": pad_graph_inputs_slot_zero},
            "padding rows get slot 0: their K/V is then stored into row 0 of block 0, a real sequence's cache. "
            "A padding row's slot is -1, which the KV store skips",
            "test_ch5.py::test_pad_graph_inputs"),
    Mistake("ch5_pad_stale_rows", "5.1", {"pad_graph_inputs": pad_graph_inputs_stale_rows},
            "the padding rows B..padded-1 keep what an earlier step wrote there: the graph runs them, and a stale "
            "row's slot is a real sequence's cache row (its K/V gets overwritten) and its context length makes it "
            "attend. Write every padding row: token 0, position 0, slot -1, context length 0, block table -1",
            "test_ch5.py::test_pad_graph_inputs"),
    Mistake("ch5_pad_stale_columns", "5.1", {"pad_graph_inputs": pad_graph_inputs_stale_columns},
            "a row's block table is copied into its first W columns only: the columns W..max_blocks-1 keep an "
            "earlier step's block ids (a longer sequence's). Set them to -1",
            "test_ch5.py::test_pad_graph_inputs"),
    # 5.2
    Mistake("ch5_append_limit_before_placeholder", "5.2", {"append_placeholders": append_placeholders_limit_before},
            "at_limit lags one token, so a request gets max_tokens + 1 tokens: it is decided before the "
            "placeholder is appended, or after appending it with > instead of >= (the same result). The placeholder "
            "counts like a token: append it, then at_limit = completion length >= max_tokens or length >= "
            "max_model_len",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_fill_eos_despite_ignore_eos", "5.2", {"fill_placeholders": fill_placeholders_eos_despite_ignore_eos},
            "an EOS token stops a request that set ignore_eos=True: ignore_eos switches off the EOS ids only "
            "(stop_token_ids still stop it)",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_fill_length_too_early", "5.2", {"fill_placeholders": fill_placeholders_length_too_early},
            "a request at its length limit finishes at the first token read back after the limit was set: its "
            "newest placeholder is still to come, so it loses its last token. Finish with 'length' only when "
            "positions[i] is the last index of its tokens",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_fill_keeps_next_placeholder", "5.2", {"fill_placeholders": fill_placeholders_keeps_next_placeholder},
            "a request that stops keeps the placeholder of the step launched after its stop token: remove every "
            "token after the stop token (del tokens[pos + 1:]); that step's token is dropped when it comes back",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_fill_length_before_stop", "5.2", {"fill_placeholders": fill_placeholders_length_before_stop},
            "a request whose last allowed token is a stop token finishes with 'length': check the stop tokens "
            "first; 'length' is for a last token that does not stop the request",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_fill_overwrites_real_token", "5.2", {"fill_placeholders": fill_placeholders_overwrites_real_token},
            "only a position past the end counts as dropped: a position that holds a real token (the request "
            "ended, and its placeholder was filled or is gone) was written over. A sequence that ended keeps no "
            "placeholder, so drop the row also when tokens[pos] != PLACEHOLDER_TOKEN",
            "test_ch5.py::test_fill_placeholders"),
    # 5.3
    Mistake("ch5_top_k_keeps_one_more", "5.3", {"apply_top_k_top_p": top_k_keeps_one_more},
            "top-k keeps k + 1 tokens: rank r (0 for the best) is kept when r < k",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_p_drops_the_crossing_token", "5.3", {"apply_top_k_top_p": top_p_drops_the_crossing_token},
            "top-p drops the token that crosses top_p (its mass including itself is compared): keep a token "
            "when the mass of the tokens ranked strictly before it is < top_p (probs.cumsum(-1) - probs), so "
            "the kept set's mass reaches top_p and the best token always stays",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_k_top_p_fills_minus_1e9", "5.3", {"apply_top_k_top_p": top_k_top_p_fills_minus_1e9},
            "dropped tokens are set to -1e9, not -inf: -1e9 is still a finite logit (isfinite() counts it as kept, "
            "and it changes under another division or a cast to fp16); fill with float(\"-inf\"), as "
            "transformers' warpers do, which softmax and exp turn into exactly 0",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_k_top_p_left_sorted", "5.3", {"apply_top_k_top_p": top_k_top_p_left_sorted},
            "the masked logits come back in sorted order: the drop mask belongs to the sorted row, but column j of the "
            "result must score token j. Put the masked values back at their tokens' indices through the sort's "
            "indices (Tensor.scatter on the last dim)",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_gumbel_temperature_after_noise", "5.3", {"gumbel_sample": gumbel_temperature_after_noise},
            "the temperature divides logits + noise, which does not change the argmax: every temperature samples "
            "softmax(logits). Divide the logits by T first, then add the Gumbel noise",
            "test_ch5.py::test_sampling_distribution"),
    Mistake("ch5_gumbel_noise_sign_flipped", "5.3", {"gumbel_sample": gumbel_noise_sign_flipped},
            "the noise is added with the wrong sign: Gumbel noise is G = -log(-log U), so the sample is "
            "argmax(x - log(-log U)); x + log(-log U) is not distributed as softmax(x)",
            "test_ch5.py::test_sampling_distribution"),
    Mistake("ch5_gumbel_mask_before_temperature", "5.3", {"gumbel_sample": gumbel_mask_before_temperature},
            "top-k / top-p are applied before dividing by the temperature: the nucleus must be the one of "
            "softmax(logits / T), the distribution that is sampled. Divide first, then mask",
            "test_ch5.py::test_sampling_distribution"),
    Mistake("ch5_gumbel_ignores_generators", "5.3", {"gumbel_sample": gumbel_ignores_generators},
            "a seeded row draws its noise from the global generator, so its token depends on the rest of the "
            "batch: replace row b's noise with torch.rand(V, generator=generators[b], device=...) when "
            "generators[b] is not None",
            "test_ch5.py::test_seeded_rows_ignore_the_rest_of_the_batch"),
    Mistake("ch5_gumbel_divides_in_place", "5.3", {"gumbel_sample": gumbel_divides_in_place},
            "the caller's logits are divided by the temperature in place (logits.div_ or logits /= ...): the "
            "sampler computes the logprobs from those same logits after sampling, so they come out tempered; "
            "divide into a new tensor, logits = logits / temperatures.clamp_min(1e-6)[:, None]",
            "test_ch5.py::test_greedy_rows_and_top_k_1_take_the_argmax"),
    Mistake("ch5_gumbel_greedy_by_clamp", "5.3", {"gumbel_sample": gumbel_greedy_by_clamp},
            "temperature 0 has no argmax of its own: logits / 1e-6 (the clamp) swamps the noise only between "
            "logits that differ, and where the top logits tie exactly (common in bf16) the noise picks among them. "
            "Take the plain argmax for those rows: greedy = logits.argmax(-1) before any division, then "
            "torch.where(temperatures > 0, sampled, greedy)",
            "test_ch5.py::test_greedy_rows_and_top_k_1_take_the_argmax"),
    Mistake("ch5_gumbel_argmax_only_if_any_greedy", "5.3", {"gumbel_sample": gumbel_argmax_only_if_any_greedy},
            "the argmax of the temperature-0 rows is taken only when any_greedy is truthy, but its default None means "
            "'not known', not 'no greedy row': a caller that does not pass it gets its greedy rows sampled from "
            "logits / 1e-6, and where the top logits tie exactly the noise picks among them. Skip the argmax only "
            "when any_greedy is False",
            "test_ch5.py::test_greedy_rows_and_top_k_1_take_the_argmax"),
    # 5.4
    Mistake("ch5_bytes_reads_the_embedding", "5.4", {"model_bytes": model_bytes_reads_the_embedding},
            "a decode step reads the embedding table whole: it reads only the B rows of the batch's tokens "
            "(nothing, next to the weights). Count the non-embedding weights and the LM head, once even when it "
            "is tied to the embedding",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_without_lm_head", "5.4", {"model_bytes": model_bytes_without_lm_head},
            "the LM head is not counted: every decode step multiplies the hidden state by the whole vocab_size x "
            "hidden_size matrix to score every token (Qwen3-0.6B: 311 MB in bf16, a quarter of the step)",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_kv_of_query_heads", "5.4", {"model_bytes": model_bytes_kv_of_query_heads},
            "the K/V per token counts num_attention_heads: with grouped-query attention only "
            "num_key_value_heads heads of K and V are cached",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_kv_keys_only", "5.4", {"model_bytes": model_bytes_keys_only},
            "the K/V per token counts the keys only: the cache holds a key AND a value per KV head and layer "
            "(2 x layers x kv heads x head_dim x bytes)",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_floor_decodes_the_first_token", "5.4", {"workload_floor": workload_floor_decodes_the_first_token},
            "the floor decodes every request's first token too: that token comes from the prefill, so the "
            "decode steps are t = 1 .. max(o) - 1 (a request with o tokens is decoded o - 1 times)",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_full_attention", "5.4", {"workload_floor": workload_floor_full_attention},
            "prefill attention is counted over the whole p x p score matrix: causal attention computes the "
            "lower half, 2 x p^2 x H x d FLOPs per layer for QK^T and PV together",
            "test_ch5.py::test_workload_floor_closed_form"),
]
