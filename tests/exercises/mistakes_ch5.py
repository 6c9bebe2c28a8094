"""Chapter 5's known wrong versions (see mistakes.py): the engine at speed.

Each function below is an exercise function written the way students get it wrong: a CUDA-graph
bucket rounded the wrong way or padding rows that keep an old step's inputs (5.1), a placeholder
resolved at the wrong time (5.2), a Gumbel-max sampler whose distribution is off (5.3), a floor that
counts the wrong bytes or FLOPs, or in the wrong units (5.4).
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
         pad_len=0, pad_rows=True, clear_columns=True, pad_table=-1):
    """pad_graph_inputs with one rule switched off."""
    ids, pos, slots, lens, tables = out
    bs = len(input_ids)
    ids[:bs], pos[:bs], slots[:bs], lens[:bs] = input_ids, positions, slot_mapping, context_lens
    width = block_tables.shape[1]
    tables[:bs, :width] = block_tables
    if clear_columns:
        tables[:bs, width:] = -1
    if pad_rows:
        ids[bs:padded], pos[bs:padded], slots[bs:padded], lens[bs:padded] = 0, 0, pad_slot, pad_len
        tables[bs:padded] = pad_table


def pad_graph_inputs_slot_zero(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, pad_slot=0)


def pad_graph_inputs_context_len_one(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, pad_len=1)


def pad_graph_inputs_stale_rows(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, pad_rows=False)


def pad_graph_inputs_stale_columns(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, clear_columns=False)


def pad_graph_inputs_tables_zero(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    _pad(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out, pad_table=0)


def graph_batch_sizes_duplicates(max_num_seqs):
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs + 1, 16))
    return sorted(sizes + [max_num_seqs])  # the bug: no set(), so a multiple of 16 is listed twice


def graph_batch_sizes_from_zero(max_num_seqs):
    """Takes the multiples of 16 from range(0, max_num_seqs + 1, 16): 0 is listed as a size."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(0, max_num_seqs + 1, 16))
    return sorted(set(sizes + [max_num_seqs]))


# ---- 5.2 async placeholders ---------------------------------------------------------------------------
def append_placeholders_limit_before(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    positions, at_limit = [], []
    for tokens, prompt_len, limit in zip(token_lists, num_prompt_tokens, max_tokens):
        positions.append(len(tokens))
        # the bug: the limit is checked before the placeholder is counted
        at_limit.append(len(tokens) - prompt_len >= limit or len(tokens) >= max_model_len)
        tokens.append(PLACEHOLDER_TOKEN)
    return positions, at_limit


def top_k_top_p_kth_value(logits, top_k, top_p):
    """Top-k as 'below the k-th largest value', read with gather at index top_k - 1: past the vocabulary
    when top_k > V (an index error)."""
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    kth = sorted_logits.gather(-1, (top_k[:, None] - 1).long())
    return right_top_k_top_p(logits.masked_fill(logits < kth, float("-inf")), None, top_p)


def _append(token_lists, num_prompt_tokens, max_tokens, max_model_len, at_limit_of):
    """append_placeholders with its at_limit rule replaced: at_limit_of(completion length, length, max_tokens,
    max_model_len), each taken after the placeholder is appended."""
    positions, at_limit = [], []
    for tokens, prompt_len, limit in zip(token_lists, num_prompt_tokens, max_tokens):
        positions.append(len(tokens))
        tokens.append(PLACEHOLDER_TOKEN)
        at_limit.append(at_limit_of(len(tokens) - prompt_len, len(tokens), limit, max_model_len))
    return positions, at_limit


def append_placeholders_max_tokens_strict(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    # the bug: > max_tokens, so a request's placeholder that makes max_tokens tokens is not its last
    return _append(token_lists, num_prompt_tokens, max_tokens, max_model_len,
                   lambda done, length, limit, model_len: done > limit or length >= model_len)


def append_placeholders_model_len_strict(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    # the bug: > max_model_len, so a sequence that reaches max_model_len tokens is scheduled again
    return _append(token_lists, num_prompt_tokens, max_tokens, max_model_len,
                   lambda done, length, limit, model_len: done >= limit or length > model_len)


def append_placeholders_model_len_early(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    # the bug: the placeholder counted twice for max_model_len, so the sequence stops a token short of it
    return _append(token_lists, num_prompt_tokens, max_tokens, max_model_len,
                   lambda done, length, limit, model_len: done >= limit or length + 1 >= model_len)


def append_placeholders_max_tokens_early(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    # the bug: the placeholder counted twice for max_tokens, so the completion stops a token short of it
    return _append(token_lists, num_prompt_tokens, max_tokens, max_model_len,
                   lambda done, length, limit, model_len: done + 1 >= limit or length >= model_len)


def _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, *, eos_always=False,
          length_at_any_position=False, drop_next=True, length_first=False, first_eos_only=False,
          eos_skips_stop_ids=False):
    """fill_placeholders with one rule switched off."""
    outcomes = []
    for tokens, pos, tok, limit, p in zip(token_lists, positions, sampled, at_limit, params):
        if pos >= len(tokens) or tokens[pos] != PLACEHOLDER_TOKEN:
            outcomes.append("dropped")
            continue
        tokens[pos] = tok
        eos = {min(eos_token_ids)} if first_eos_only else eos_token_ids  # (the bug: one EOS id of several)
        stop = ((eos_always or not p.ignore_eos) and tok in eos) or tok in p.stop_token_ids
        if eos_skips_stop_ids and tok in eos_token_ids:  # the bug: an EOS id is judged as EOS alone
            stop = not p.ignore_eos
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


def fill_placeholders_first_eos_only(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, first_eos_only=True)


def fill_placeholders_eos_skips_stop_ids(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, eos_skips_stop_ids=True)


def fill_placeholders_eos_despite_ignore_eos(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, eos_always=True)


def fill_placeholders_length_too_early(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, length_at_any_position=True)


def fill_placeholders_keeps_next_placeholder(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, drop_next=False)


def fill_placeholders_length_before_stop(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill(token_lists, positions, sampled, at_limit, eos_token_ids, params, length_first=True)


# ---- 5.3 the Gumbel-max sampler ----------------------------------------------------------------------
def _mask(logits, top_k, top_p, *, k_extra=0, mass_with_self=False, strict=False):
    """apply_top_k_top_p with one rule changed."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        drop |= ranks[None, :] >= top_k[:, None] + k_extra
    if top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        mass = probs.cumsum(dim=-1) if mass_with_self else probs.cumsum(dim=-1) - probs
        drop |= (mass > top_p[:, None]) if strict else (mass >= top_p[:, None])
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def top_k_keeps_one_more(logits, top_k, top_p):
    return _mask(logits, top_k, top_p, k_extra=1)


def top_p_drops_the_crossing_token(logits, top_k, top_p):
    return _mask(logits, top_k, top_p, mass_with_self=True)


def top_p_inclusive_mass_strict(logits, top_k, top_p):
    return _mask(logits, top_k, top_p, mass_with_self=True, strict=True)


def top_p_keeps_the_token_at_top_p(logits, top_k, top_p):
    return _mask(logits, top_k, top_p, strict=True)


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
            divide_in_place=False, greedy_argmax=True, argmax_if_truthy=False, where_swapped=False, noise="gumbel"):
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
    if noise == "gumbel":
        noisy = logits - noise_sign * uniform.log().neg().log()
    else:  # the bug: one of the two logs of -log(-log U) left out
        noisy = {"-log U": logits - uniform.log(), "log U": logits + uniform.log()}[noise]
    if temperature_after_noise:
        noisy = noisy / t
    sampled = noisy.argmax(dim=-1)
    if greedy is not None and where_swapped:  # the bug: the sampled rows get the argmax, the greedy ones a sample
        return torch.where(temperatures > 0, greedy, sampled)
    return sampled if greedy is None else torch.where(temperatures > 0, sampled, greedy)


def gumbel_where_swapped(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, where_swapped=True)


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


def gumbel_noise_minus_log_u(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    """Adds -log U (exponential noise) where the right version adds G = -log(-log U): argmax(x - log U)."""
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, noise="-log U")


def gumbel_noise_log_u(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    """Subtracts -log U where the right version subtracts log(-log U) (the chain's last .log() left out):
    argmax(x + log U)."""
    return _gumbel(logits, temperatures, top_k, top_p, generators, any_greedy, noise="log U")


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


def model_bytes_kv_without_dtype_bytes(mc, dtype_bytes):
    weights, kv, params = right_model_bytes(mc, dtype_bytes)
    return weights, kv // dtype_bytes, params  # the bug: the K/V per token counted in elements, not bytes


def model_bytes_keys_only(mc, dtype_bytes):
    weights, kv, params = right_model_bytes(mc, dtype_bytes)
    return weights, kv // 2, params  # the bug: the values are not counted


def _floor(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, *, first_step=1, causal=2,
           last_step_shift=0):
    weights, kv_tok, params = right_model_bytes(mc, dtype_bytes)
    p, o = np.asarray(list(prompt_lens), dtype=np.float64), np.asarray(list(output_lens))
    decode_bytes = 0.0
    for t in range(first_step, int(o.max()) + last_step_shift):
        active = o > t
        decode_bytes += weights + ((p[active] + t) * kv_tok).sum()
    H, d, L = mc.num_attention_heads, mc.head_dim, mc.num_hidden_layers
    prefill_flops = 2 * params * p.sum() + (2 * causal * p ** 2 * H * d * L).sum() / 2
    decode_s, prefill_s = decode_bytes / (copy_gbps * 1e9), prefill_flops / (matmul_tflops * 1e12)
    return {"floor_s": decode_s + prefill_s, "floor_decode_s": decode_s, "floor_prefill_s": prefill_s,
            "floor_tok_s": float(o.sum()) / (decode_s + prefill_s)}


def workload_floor_decodes_the_first_token(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, first_step=0)


def workload_floor_one_step_too_many(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, last_step_shift=1)


def workload_floor_full_attention(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, causal=4)


# ---- audit 7: more wrong versions ----------------------------------------------------------------------
# 5.1
def graph_batch_sizes_above_max(max_num_seqs):
    # the bug: 1, 2, 4, 8 are taken whatever max_num_seqs is, so max_num_seqs 3 gets sizes 4 and 8
    return sorted(set([1, 2, 4, 8] + list(range(16, max_num_seqs + 1, 16)) + [max_num_seqs]))


def graph_batch_sizes_powers_of_two(max_num_seqs):
    sizes, b = [], 1
    while b < max_num_seqs:  # the bug: powers of two, not every multiple of 16 (no 48, 80, ...)
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


def graph_size_largest_when_too_big(sizes, batch_size):
    return next((s for s in sizes if s >= batch_size), sizes[-1])  # the bug: no None: the largest graph, too small


def pad_graph_inputs_past_padded(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    ids, pos, slots, lens, tables = out
    bs, width = len(input_ids), block_tables.shape[1]
    ids[:bs], pos[:bs], slots[:bs], lens[:bs] = input_ids, positions, slot_mapping, context_lens
    ids[bs:], pos[bs:], slots[bs:], lens[bs:] = 0, 0, -1, 0  # the bug: [bs:], every row to the buffer's end
    tables[:bs, :width] = block_tables
    tables[:bs, width:] = -1
    tables[bs:] = -1


def pad_graph_inputs_padding_tables_first_columns(input_ids, positions, slot_mapping, context_lens, block_tables,
                                                  padded, out):
    ids, pos, slots, lens, tables = out
    bs, width = len(input_ids), block_tables.shape[1]
    ids[:bs], pos[:bs], slots[:bs], lens[:bs] = input_ids, positions, slot_mapping, context_lens
    ids[bs:padded], pos[bs:padded], slots[bs:padded], lens[bs:padded] = 0, 0, -1, 0
    tables[:bs, :width] = block_tables
    tables[:bs, width:] = -1
    tables[bs:padded, :width] = -1  # the bug: the padding rows' tables only up to the batch's width


def pad_graph_inputs_rebinds(input_ids, positions, slot_mapping, context_lens, block_tables, padded, out):
    ids, pos, slots, lens, tables = out
    n = padded - len(input_ids)  # the bug: new arrays are bound to the local names; the buffers stay as they were
    ids = np.concatenate([input_ids, np.zeros(n, np.int64)]).astype(np.int32)  # noqa: F841
    pos = np.concatenate([positions, np.zeros(n, np.int64)]).astype(np.int32)  # noqa: F841
    slots = np.concatenate([slot_mapping, np.full(n, -1)]).astype(np.int32)  # noqa: F841
    lens = np.concatenate([context_lens, np.zeros(n, np.int32)])  # noqa: F841


# 5.2
def append_placeholders_position_after_append(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    positions, at_limit = [], []
    for tokens, prompt_len, limit in zip(token_lists, num_prompt_tokens, max_tokens):
        tokens.append(PLACEHOLDER_TOKEN)
        positions.append(len(tokens))  # the bug: the length after appending, one past the placeholder's index
        at_limit.append(len(tokens) - prompt_len >= limit or len(tokens) >= max_model_len)
    return positions, at_limit


def append_placeholders_ignores_max_model_len(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    positions, at_limit = [], []
    for tokens, prompt_len, limit in zip(token_lists, num_prompt_tokens, max_tokens):
        positions.append(len(tokens))
        tokens.append(PLACEHOLDER_TOKEN)
        at_limit.append(len(tokens) - prompt_len >= limit)  # the bug: max_model_len is not checked
    return positions, at_limit


def append_placeholders_counts_real_tokens(token_lists, num_prompt_tokens, max_tokens, max_model_len):
    positions, at_limit = [], []
    for tokens, prompt_len, limit in zip(token_lists, num_prompt_tokens, max_tokens):
        positions.append(len(tokens))
        tokens.append(PLACEHOLDER_TOKEN)
        real = sum(t != PLACEHOLDER_TOKEN for t in tokens)  # the bug: placeholders are not counted
        at_limit.append(real - prompt_len >= limit or real >= max_model_len)
    return positions, at_limit


def _fill7(token_lists, positions, sampled, at_limit, eos_token_ids, params, *, ignore_eos_stops_all=False,
           cut_at=1, check_end=True):
    """fill_placeholders with one more rule changed."""
    outcomes = []
    for tokens, pos, tok, limit, p in zip(token_lists, positions, sampled, at_limit, params):
        if (check_end and pos >= len(tokens)) or tokens[pos] != PLACEHOLDER_TOKEN:
            outcomes.append("dropped")
            continue
        tokens[pos] = tok
        if ignore_eos_stops_all:
            stop = not p.ignore_eos and (tok in eos_token_ids or tok in p.stop_token_ids)
        else:
            stop = (not p.ignore_eos and tok in eos_token_ids) or tok in p.stop_token_ids
        if stop:
            del tokens[pos + cut_at:]
            outcomes.append("stop")
        elif limit and pos == len(tokens) - 1:
            outcomes.append("length")
        else:
            outcomes.append(None)
    return outcomes


def fill_placeholders_ignore_eos_ignores_stop_ids(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill7(token_lists, positions, sampled, at_limit, eos_token_ids, params, ignore_eos_stops_all=True)


def fill_placeholders_removes_the_stop_token(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill7(token_lists, positions, sampled, at_limit, eos_token_ids, params, cut_at=0)


def fill_placeholders_index_past_the_end(token_lists, positions, sampled, at_limit, eos_token_ids, params):
    return _fill7(token_lists, positions, sampled, at_limit, eos_token_ids, params, check_end=False)


# 5.3
def _mask7(logits, top_k, top_p, *, k_extra=0, softmax_of_whole_row=False, gather=False, one_k=False):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        k = top_k.max().expand_as(top_k) if one_k else top_k
        drop |= torch.arange(logits.shape[-1], device=logits.device)[None, :] >= k[:, None] + k_extra
    if top_p is not None:
        kept = sorted_logits if softmax_of_whole_row else sorted_logits.masked_fill(drop, float("-inf"))
        probs = kept.softmax(dim=-1)
        drop |= probs.cumsum(dim=-1) - probs >= top_p[:, None]
    masked = sorted_logits.masked_fill(drop, float("-inf"))
    return masked.gather(-1, order) if gather else logits.scatter(-1, order, masked)


def top_k_keeps_one_fewer(logits, top_k, top_p):
    return _mask7(logits, top_k, top_p, k_extra=-1)  # the bug: rank < k - 1


def top_p_ignores_top_k(logits, top_k, top_p):
    return _mask7(logits, top_k, top_p, softmax_of_whole_row=True)  # the bug: the mass of the whole row


def top_k_top_p_gathers_back(logits, top_k, top_p):
    return _mask7(logits, top_k, top_p, gather=True)  # the bug: gather(order) permutes again instead of undoing


def top_k_one_k_for_the_batch(logits, top_k, top_p):
    return _mask7(logits, top_k, top_p, one_k=True)  # the bug: the batch's largest k for every row (torch.topk's int)


def gumbel_multiplies_by_temperature(logits, temperatures, top_k=None, top_p=None, generators=None, any_greedy=None):
    greedy = logits.argmax(dim=-1) if any_greedy is not False else None
    logits = logits * temperatures.clamp_min(1e-6)[:, None]  # the bug: multiplied by T, not divided
    if top_k is not None or top_p is not None:
        logits = right_top_k_top_p(logits, top_k, top_p)
    uniform = torch.rand_like(logits)
    if generators:
        for row, gen in enumerate(generators):
            if gen is not None:
                uniform[row] = torch.rand(logits.shape[1], generator=gen, device=logits.device)
    sampled = (logits - uniform.log().neg().log()).argmax(dim=-1)
    return sampled if greedy is None else torch.where(temperatures > 0, sampled, greedy)


# 5.4
def _bytes7(mc, dtype_bytes, *, o_bias=True, qk_norm_per_head=False, q_square=False, final_norm=True,
            tied_head_unread=False, kv_bias_for_k_only=False):
    h, i, L, d = mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers, mc.head_dim
    H, Hkv = mc.num_attention_heads, mc.num_key_value_heads
    q = h * h if q_square else h * H * d  # (h x h: as if H x head_dim were hidden_size)
    per_layer = q + 2 * h * Hkv * d + H * d * h + 2 * h * i + i * h + 2 * h
    per_layer += ((H + Hkv) * d if qk_norm_per_head else 2 * d) * mc.qk_norm
    per_layer += (H + (1 if kv_bias_for_k_only else 2) * Hkv) * d * mc.qkv_bias + (h * mc.o_bias if o_bias else 0)
    non_embedding = L * per_layer + (h if final_norm else 0)
    head = 0 if tied_head_unread and mc.tie_word_embeddings else mc.vocab_size * h
    return (non_embedding + head) * dtype_bytes, 2 * L * Hkv * d * dtype_bytes, non_embedding


def model_bytes_kv_of_hidden_size(mc, dtype_bytes):
    weights, _, params = right_model_bytes(mc, dtype_bytes)
    return weights, 2 * mc.num_hidden_layers * mc.hidden_size * dtype_bytes, params  # the bug: hidden_size per token


def model_bytes_without_o_bias(mc, dtype_bytes):
    return _bytes7(mc, dtype_bytes, o_bias=False)


def model_bytes_qk_norm_per_head(mc, dtype_bytes):
    return _bytes7(mc, dtype_bytes, qk_norm_per_head=True)


def model_bytes_q_proj_square(mc, dtype_bytes):
    return _bytes7(mc, dtype_bytes, q_square=True)


def model_bytes_tied_head_unread(mc, dtype_bytes):
    return _bytes7(mc, dtype_bytes, tied_head_unread=True)


def model_bytes_qkv_bias_of_q_and_k(mc, dtype_bytes):
    return _bytes7(mc, dtype_bytes, kv_bias_for_k_only=True)


def model_bytes_without_final_norm(mc, dtype_bytes):
    return _bytes7(mc, dtype_bytes, final_norm=False)


def _floor7(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, *, weights_per_request=False,
            context_shift=0, batch_attention=False, lm_head_in_prefill=False):
    weights, kv_tok, params = right_model_bytes(mc, dtype_bytes)
    p, o = np.asarray(list(prompt_lens), dtype=np.float64), np.asarray(list(output_lens))
    decode_bytes = 0.0
    for t in range(1, int(o.max())):
        active = o > t
        decode_bytes += weights * (active.sum() if weights_per_request else 1)
        decode_bytes += ((p[active] + t + context_shift) * kv_tok).sum()
    H, d, L = mc.num_attention_heads, mc.head_dim, mc.num_hidden_layers
    attention = 2 * p.sum() ** 2 * H * d * L if batch_attention else (2 * p ** 2 * H * d * L).sum()
    linear = params + (mc.vocab_size * mc.hidden_size if lm_head_in_prefill else 0)
    prefill_flops = 2 * linear * p.sum() + attention
    decode_s, prefill_s = decode_bytes / (copy_gbps * 1e9), prefill_flops / (matmul_tflops * 1e12)
    return {"floor_s": decode_s + prefill_s, "floor_decode_s": decode_s, "floor_prefill_s": prefill_s,
            "floor_tok_s": float(o.sum()) / (decode_s + prefill_s)}


def workload_floor_weights_per_request(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor7(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, weights_per_request=True)


def workload_floor_context_one_short(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor7(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, context_shift=-1)


def workload_floor_attention_of_the_batch(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor7(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, batch_attention=True)


def workload_floor_lm_head_in_prefill(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor7(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, lm_head_in_prefill=True)


# ---- 5.4, round 8: the counts and units students get wrong ---------------------------------------------
def _bytes8(mc, dtype_bytes, *, both_tables_when_untied=False, bytes_per_element=None, weights_in_elements=False,
            kv_proj_heads="kv", kv_cache_heads="kv", kv_layers=True, mlp_matrices=3, layer_norms=True,
            table_in_params=False):
    """model_bytes with one of its counts changed (see the wrappers below)."""
    h, i, L, d = mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers, mc.head_dim
    H, Hkv = mc.num_attention_heads, mc.num_key_value_heads
    kv_proj = H if kv_proj_heads == "query" else Hkv
    per_layer = h * (H + 2 * kv_proj) * d + H * d * h + mlp_matrices * h * i + (2 * h if layer_norms else 0)
    per_layer += 2 * d * mc.qk_norm + (H + 2 * kv_proj) * d * mc.qkv_bias + h * mc.o_bias
    non_embedding = L * per_layer + h
    tables = 2 if both_tables_when_untied and not mc.tie_word_embeddings else 1
    per_element = dtype_bytes if bytes_per_element is None else bytes_per_element
    weights = (non_embedding + tables * mc.vocab_size * h) * (1 if weights_in_elements else per_element)
    kv_per_token = 2 * (L if kv_layers else 1) * (H if kv_cache_heads == "query" else Hkv) * d * per_element
    return weights, kv_per_token, non_embedding + (mc.vocab_size * h if table_in_params else 0)


def model_bytes_both_tables_when_untied(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, both_tables_when_untied=True)  # the bug: untied, the embedding is read too


def model_bytes_four_bytes_an_element(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, bytes_per_element=4)  # the bug: bf16 taken as 4 bytes (dtype_bytes unused)


def model_bytes_two_bytes_an_element(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, bytes_per_element=2)  # the bug: 2 bytes (bf16) whatever dtype_bytes says


def model_bytes_weights_in_elements(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, weights_in_elements=True)  # the bug: the weights not times dtype_bytes


def model_bytes_kv_proj_of_query_heads(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, kv_proj_heads="query")  # the bug: k_proj, v_proj with H heads


def model_bytes_query_heads_for_kv_heads(mc, dtype_bytes):
    # the bug: Hkv = num_attention_heads, for k_proj and v_proj and for the cache
    return _bytes8(mc, dtype_bytes, kv_proj_heads="query", kv_cache_heads="query")


def model_bytes_kv_of_one_layer(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, kv_layers=False)  # the bug: the K/V per token of one layer


def model_bytes_mlp_two_matrices(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, mlp_matrices=2)  # the bug: up and down, no gate


def model_bytes_without_layer_norms(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, layer_norms=False)  # the bug: the two RMSNorms of each layer not counted


def model_bytes_params_with_a_table(mc, dtype_bytes):
    return _bytes8(mc, dtype_bytes, table_in_params=True)  # the bug: the embedding (or head) among the parameters


def model_bytes_kv_head_dim_from_hidden_size(mc, dtype_bytes):
    """Counts each K/V head as hidden_size / num_attention_heads elements, not head_dim."""
    weights, _, params = right_model_bytes(mc, dtype_bytes)
    h, L = mc.hidden_size, mc.num_hidden_layers
    return weights, 2 * L * mc.num_key_value_heads * (h // mc.num_attention_heads) * dtype_bytes, params


def _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, *, bytes_per_gb=1e9,
            flops_per_tflop=1e12, seconds=1.0, tokens="output", context="prompt+made", overlap=False,
            attention_heads="query", attention_layers=True, flops_per_param=2, attention=True, finished_read=False,
            attention_factor=2):
    """workload_floor with one of its details changed (see the wrappers below)."""
    weights, kv_tok, params = right_model_bytes(mc, dtype_bytes)
    p, o = np.asarray(list(prompt_lens), dtype=np.float64), np.asarray(list(output_lens))
    decode_bytes = 0.0
    for t in range(1, int(o.max())):
        active = np.ones(len(o), dtype=bool) if finished_read else o > t
        held = {"prompt+made": p[active] + t, "prompt": p[active], "made": np.full(active.sum(), float(t))}[context]
        decode_bytes += weights + (held * kv_tok).sum()
    H = mc.num_attention_heads if attention_heads == "query" else mc.num_key_value_heads
    d, L = mc.head_dim, mc.num_hidden_layers
    attention_flops = (attention_factor * p ** 2 * H * d * (L if attention_layers else 1)).sum() if attention else 0.0
    prefill_flops = flops_per_param * params * p.sum() + attention_flops
    decode_s = decode_bytes / (copy_gbps * bytes_per_gb)
    prefill_s = prefill_flops / (matmul_tflops * flops_per_tflop)
    floor_s = max(decode_s, prefill_s) if overlap else decode_s + prefill_s
    counted = {"output": o.sum(), "prompt+output": p.sum() + o.sum(), "decoded": (o - 1).sum()}[tokens]
    return {"floor_s": floor_s * seconds, "floor_decode_s": decode_s * seconds, "floor_prefill_s": prefill_s * seconds,
            "floor_tok_s": float(counted) / (floor_s * seconds)}


def workload_floor_attention_without_the_2(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, attention_factor=1)


def workload_floor_tok_s_of_every_token(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, tokens="prompt+output")


def workload_floor_tok_s_of_decoded_tokens(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, tokens="decoded")


def workload_floor_copy_rate_in_gib(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, bytes_per_gb=2 ** 30)


def workload_floor_in_milliseconds(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, seconds=1e3)


def workload_floor_overlapped(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, overlap=True)


def workload_floor_prompt_kv_only(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, context="prompt")


def workload_floor_generated_kv_only(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, context="made")


def workload_floor_tflops_times_1e9(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, flops_per_tflop=1e9)


def workload_floor_attention_of_kv_heads(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, attention_heads="kv")


def workload_floor_attention_of_one_layer(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, attention_layers=False)


def workload_floor_one_flop_per_parameter(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, flops_per_param=1)


def workload_floor_without_attention(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, attention=False)


def workload_floor_finished_requests_read(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops):
    return _floor8(mc, dtype_bytes, prompt_lens, output_lens, copy_gbps, matmul_tflops, finished_read=True)



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
    Mistake("ch5_pad_context_len_one", "5.1", {"pad_graph_inputs": pad_graph_inputs_context_len_one},
            "padding rows get context length 1 (as if a padding token attended to itself): a padding row's "
            "context length is 0, so the attention kernel reads no key for it. With 1 it reads key 0 through its "
            "block table, whose entries are all -1 (PAD_BLOCK): a load from block -1, outside the cache. Write "
            "lens[bs:padded] = 0",
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
    Mistake("ch5_graph_sizes_above_max", "5.1", {"graph_batch_sizes": graph_batch_sizes_above_max},
            "sizes larger than max_num_seqs are listed (1, 2, 4, 8 are taken whatever max_num_seqs is: 3 gives "
            "[1, 2, 3, 4, 8]): each costs a capture and memory for a batch that can never happen. Keep only the "
            "sizes <= max_num_seqs (b < max_num_seqs for 1, 2, 4, 8, then max_num_seqs itself)",
            "test_ch5.py::test_graph_batch_sizes"),
    Mistake("ch5_graph_sizes_powers_of_two", "5.1", {"graph_batch_sizes": graph_batch_sizes_powers_of_two},
            "the sizes double (1, 2, 4, ..., 32, 64): past 16 the rule is every multiple of 16 (16, 32, 48, 64, "
            "...), so a batch of 33 pads to 48 rows, not 64. Use range(16, max_num_seqs + 1, 16) after 1, 2, 4, 8",
            "test_ch5.py::test_graph_batch_sizes"),
    Mistake("ch5_graph_size_largest_when_too_big", "5.1", {"graph_size_for": graph_size_largest_when_too_big},
            "a batch larger than every captured size gets the largest size: that graph has fewer rows than the "
            "batch, so its last sequences are not run. Return None then (the batch runs eagerly)",
            "test_ch5.py::test_graph_size_for"),
    Mistake("ch5_pad_rows_past_padded", "5.1", {"pad_graph_inputs": pad_graph_inputs_past_padded},
            "the padding is written to every row from B to the end of the buffers ([bs:]), not to rows "
            "B..padded-1: rows from `padded` on must be left alone (the graph of that size never reads them). "
            "Slice [bs:padded]",
            "test_ch5.py::test_pad_graph_inputs"),
    Mistake("ch5_pad_tables_first_columns_only", "5.1",
            {"pad_graph_inputs": pad_graph_inputs_padding_tables_first_columns},
            "a padding row's block table is set to -1 only in the batch's W columns (tables[bs:padded, :W]): its "
            "columns W..max_blocks-1 keep an earlier step's block ids. Set the whole row: tables[bs:padded] = -1",
            "test_ch5.py::test_pad_graph_inputs"),
    Mistake("ch5_pad_rebinds_buffers", "5.1", {"pad_graph_inputs": pad_graph_inputs_rebinds},
            "new arrays are built and bound to the local names (ids = np.concatenate(...)): the graph's buffers in "
            "`out` are never written, so the graph replays the previous step's inputs. Write into them by slice "
            "assignment (ids[:bs] = input_ids, ids[bs:padded] = 0, ...)",
            "test_ch5.py::test_pad_graph_inputs"),
    Mistake("ch5_graph_sizes_duplicates", "5.1", {"graph_batch_sizes": graph_batch_sizes_duplicates},
            "max_num_seqs is listed twice when it is already a multiple of 16 (16 gives [1, 2, 4, 8, 16, 16]): "
            "each size is captured once. Remove the duplicate: sorted(set(sizes + [max_num_seqs]))",
            "test_ch5.py::test_graph_batch_sizes"),
    Mistake("ch5_pad_tables_zero", "5.1", {"pad_graph_inputs": pad_graph_inputs_tables_zero},
            "the padding rows' block tables are filled with 0, like their tokens and positions: block 0 is a real "
            "sequence's cache block. A padding row points at no block, as at capture: tables[bs:padded] = "
            "PAD_BLOCK (-1)",
            "test_ch5.py::test_pad_graph_inputs"),
    Mistake("ch5_graph_sizes_from_zero", "5.1", {"graph_batch_sizes": graph_batch_sizes_from_zero},
            "0 is listed as a size (the multiples of 16 taken from range(0, max_num_seqs + 1, 16)): no decode batch "
            "has 0 rows, so that graph is a capture at start-up that never runs. The multiples of 16 start at 16: "
            "range(16, max_num_seqs + 1, 16)",
            "test_ch5.py::test_graph_batch_sizes"),
    # 5.2
    Mistake("ch5_append_limit_before_placeholder", "5.2", {"append_placeholders": append_placeholders_limit_before},
            "at_limit lags one token, so a request gets max_tokens + 1 tokens: it is decided before the "
            "placeholder is appended, or after appending it with > instead of >= (the same result). The placeholder "
            "counts like a token: append it, then at_limit = completion length >= max_tokens or length >= "
            "max_model_len",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_append_model_len_early", "5.2", {"append_placeholders": append_placeholders_model_len_early},
            "at_limit comes one token early for max_model_len (len(tokens) + 1 >= max_model_len after appending: the "
            "placeholder counted twice), so a sequence stops at max_model_len - 1 tokens. Append the placeholder, "
            "then at_limit = ... or len(tokens) >= max_model_len",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_append_max_tokens_early", "5.2", {"append_placeholders": append_placeholders_max_tokens_early},
            "at_limit comes one token early for max_tokens (completion length + 1 >= max_tokens after appending: the "
            "placeholder counted twice), so a request gets max_tokens - 1 tokens. Append the placeholder, then "
            "at_limit = len(tokens) - prompt_len >= max_tokens or ...",
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
    Mistake("ch5_append_position_after_append", "5.2",
            {"append_placeholders": append_placeholders_position_after_append},
            "positions[i] is the list's length after appending: that is one past the placeholder's index, so the "
            "sampled token would be written after it. Take len(tokens) before appending (or len(tokens) - 1 after)",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_fill_first_eos_only", "5.2", {"fill_placeholders": fill_placeholders_first_eos_only},
            "only one of the EOS ids stops a request: eos_token_ids is a set (a model's config can list several, and "
            "the engine adds the tokenizer's), and any of them ends it: tok in eos_token_ids",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_fill_eos_skips_stop_ids", "5.2", {"fill_placeholders": fill_placeholders_eos_skips_stop_ids},
            "a token that is an EOS id is judged as EOS alone, so with ignore_eos it never stops, even when the "
            "request lists it in stop_token_ids: the two rules are separate, (not ignore_eos and tok in "
            "eos_token_ids) OR tok in stop_token_ids",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_append_model_len_strict", "5.2", {"append_placeholders": append_placeholders_model_len_strict},
            "at_limit compares the length with > max_model_len: a sequence whose placeholder makes it exactly "
            "max_model_len tokens long is at its limit (one more token would not fit), so len(tokens) >= "
            "max_model_len after appending",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_append_max_tokens_strict", "5.2", {"append_placeholders": append_placeholders_max_tokens_strict},
            "at_limit compares the completion length with > max_tokens (max_model_len is right): a placeholder "
            "that makes the completion exactly max_tokens tokens long is its last, so the request gets one token "
            "too many. len(tokens) - prompt length >= max_tokens after appending",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_append_ignores_max_model_len", "5.2",
            {"append_placeholders": append_placeholders_ignores_max_model_len},
            "at_limit ignores max_model_len: a sequence whose new placeholder makes it max_model_len tokens long is "
            "scheduled again and outgrows the model. at_limit = completion length >= max_tokens OR len(tokens) >= "
            "max_model_len (after appending)",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_append_counts_real_tokens_only", "5.2",
            {"append_placeholders": append_placeholders_counts_real_tokens},
            "at_limit counts only the tokens that are not placeholders: the placeholder just appended and the one "
            "of the step still in flight are tokens the sequence will have, so a request runs up to two steps past "
            "max_tokens. Count every entry of the list, placeholders included: len(tokens) - prompt length",
            "test_ch5.py::test_append_placeholders"),
    Mistake("ch5_fill_ignore_eos_ignores_stop_ids", "5.2",
            {"fill_placeholders": fill_placeholders_ignore_eos_ignores_stop_ids},
            "ignore_eos switches off stop_token_ids too: it ignores the EOS ids only; a token in "
            "params.stop_token_ids stops the request whatever ignore_eos says",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_fill_removes_the_stop_token", "5.2", {"fill_placeholders": fill_placeholders_removes_the_stop_token},
            "the stop token itself is removed with the placeholders after it (del tokens[pos:]): it is the "
            "request's last token and stays (as transformers' output keeps its EOS). Remove from pos + 1 on",
            "test_ch5.py::test_fill_placeholders"),
    Mistake("ch5_fill_index_past_the_end", "5.2", {"fill_placeholders": fill_placeholders_index_past_the_end},
            "tokens[pos] is read for a request that ended a step earlier, whose list is shorter than pos + 1 "
            "(its placeholders were removed): IndexError. Check pos >= len(tokens) first ('dropped'), then "
            "tokens[pos] != PLACEHOLDER_TOKEN",
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
    Mistake("ch5_top_p_inclusive_mass", "5.3", {"apply_top_k_top_p": top_p_inclusive_mass_strict},
            "top-p drops a token once the mass up to and including it passes top_p (probs.cumsum(-1) > top_p): the "
            "token that crosses top_p goes too, so the kept mass can stay below top_p. Compare the mass of the "
            "tokens ranked strictly before it, probs.cumsum(-1) - probs, and drop where that is >= top_p",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_k_kth_value", "5.3", {"apply_top_k_top_p": top_k_top_p_kth_value},
            "top-k reads the k-th largest logit at index top_k - 1, past the end of the row when top_k is larger "
            "than the vocabulary (a request may ask for that; SamplingParams allows any top_k >= 1). Then every "
            "token stays: clamp top_k to V, or drop by rank (rank >= top_k), which needs no index",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_p_keeps_the_token_at_top_p", "5.3", {"apply_top_k_top_p": top_p_keeps_the_token_at_top_p},
            "top-p keeps a token whose tokens before it already hold exactly top_p of the mass (mass_before > top_p): "
            "the kept set is complete once it reaches top_p, so drop a token when mass_before >= top_p, as "
            "transformers' TopPLogitsWarper does",
            "test_ch5.py::test_top_p_exactly_at_a_partial_mass"),
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
    Mistake("ch5_top_k_keeps_one_fewer", "5.3", {"apply_top_k_top_p": top_k_keeps_one_fewer},
            "top-k keeps k - 1 tokens: ranks count from 0 (the best token), so rank r is kept when r < k (top_k = 1 "
            "keeps the argmax alone)",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_p_ignores_top_k", "5.3", {"apply_top_k_top_p": top_p_ignores_top_k},
            "top-p measures the mass with the softmax of the whole row: it is applied after top-k, to the softmax "
            "of the logits top-k kept (the dropped ones at -inf first), so a row with both keeps fewer tokens than "
            "it should. Mask top-k first, then softmax the masked sorted row",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_k_top_p_gathers_back", "5.3", {"apply_top_k_top_p": top_k_top_p_gathers_back},
            "the masked sorted row is put back with gather(-1, order), which applies the sort's permutation a "
            "second time instead of undoing it: column j of the result must score token j. Use "
            "logits.scatter(-1, order, masked) (result[order[j]] = masked[j])",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_top_k_one_k_for_the_batch", "5.3", {"apply_top_k_top_p": top_k_one_k_for_the_batch},
            "one k for the whole batch (the largest top_k, as torch.topk takes an int): each row has its own top_k. "
            "Compare each row's ranks with its own k: ranks[None, :] >= top_k[:, None]",
            "test_ch5.py::test_top_k_top_p_masks_match_transformers"),
    Mistake("ch5_gumbel_where_swapped", "5.3", {"gumbel_sample": gumbel_where_swapped},
            "the final torch.where is swapped: rows with temperature > 0 get the argmax and the temperature-0 rows a "
            "sample. torch.where(temperatures > 0, sampled, greedy): the condition picks the sampled token",
            "test_ch5.py::test_sampling_distribution"),
    Mistake("ch5_gumbel_multiplies_by_temperature", "5.3", {"gumbel_sample": gumbel_multiplies_by_temperature},
            "the logits are multiplied by the temperature: sampling softmax(logits / T) divides them (T < 1 "
            "sharpens the distribution, T > 1 flattens it)",
            "test_ch5.py::test_sampling_distribution"),
    Mistake("ch5_gumbel_noise_minus_log_u", "5.3", {"gumbel_sample": gumbel_noise_minus_log_u},
            "the noise is -log U, one log short: -log U is exponential noise, and argmax(x - log U) is not "
            "distributed as softmax(x). Gumbel noise is G = -log(-log U): the sample is argmax(x - log(-log U)) "
            "(argmax(softmax(x) / (-log U)) is the same draw)",
            "test_ch5.py::test_sampling_distribution"),
    Mistake("ch5_gumbel_noise_log_u", "5.3", {"gumbel_sample": gumbel_noise_log_u},
            "the noise is log U: the last log of the chain is left out (x - (-log U), i.e. "
            "logits - u.log().neg()), and argmax(x + log U) is not distributed as softmax(x). Subtract log(-log U): "
            "argmax(x - u.log().neg().log()), Gumbel noise G = -log(-log U)",
            "test_ch5.py::test_sampling_distribution"),
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
    Mistake("ch5_model_bytes_kv_without_dtype_bytes", "5.4", {"model_bytes": model_bytes_kv_without_dtype_bytes},
            "the K/V per token is counted in elements, not bytes: times dtype_bytes (2 x layers x kv heads x "
            "head_dim x bytes); in bf16 this looks like counting the keys only, in fp32 it is a quarter",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_floor_decodes_the_first_token", "5.4", {"workload_floor": workload_floor_decodes_the_first_token},
            "the floor decodes every request's first token too: that token comes from the prefill, so the "
            "decode steps are t = 1 .. max(o) - 1 (a request with o tokens is decoded o - 1 times)",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_one_step_too_many", "5.4", {"workload_floor": workload_floor_one_step_too_many},
            "the floor runs one decode step past the last: at t = max(o) no request is left, but the step still "
            "reads the weights once more. The decode steps are t = 1 .. max(o) - 1: range(1, max(o))",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_full_attention", "5.4", {"workload_floor": workload_floor_full_attention},
            "prefill attention is counted over the whole p x p score matrix: causal attention computes the "
            "lower half, 2 x p^2 x H x d FLOPs per layer for QK^T and PV together",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_kv_of_hidden_size", "5.4", {"model_bytes": model_bytes_kv_of_hidden_size},
            "the K/V per token counts hidden_size per layer for K and for V: the cache holds num_key_value_heads x "
            "head_dim per layer for each (Qwen3-0.6B: 8 x 128 = 1024 = hidden_size, but Qwen3-8B's 8 KV heads of "
            "128 are 1024 against a hidden_size of 4096): 2 x layers x kv heads x head_dim x bytes",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_without_o_bias", "5.4", {"model_bytes": model_bytes_without_o_bias},
            "the o_proj bias is not counted: with o_bias (attention_bias=True in Llama or Qwen3 configs) every "
            "layer has a bias of hidden_size on o_proj. Add h * o_bias per layer",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_qk_norm_per_head", "5.4", {"model_bytes": model_bytes_qk_norm_per_head},
            "the QK-norm weights are counted per head ((H + Hkv) x head_dim): q_norm and k_norm are one RMSNorm "
            "weight of head_dim each, shared by every head: 2 x head_dim per layer",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_q_proj_square", "5.4", {"model_bytes": model_bytes_q_proj_square},
            "q_proj (or o_proj) is counted as hidden_size x hidden_size: it maps hidden_size to "
            "num_attention_heads x head_dim, which need not be hidden_size (Qwen3: 16 x 128 = 2048 against 1024). "
            "Count h x H x d for q_proj and H x d x h for o_proj",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_tied_head_unread", "5.4", {"model_bytes": model_bytes_tied_head_unread},
            "with tied embeddings the LM head is not counted as read: tied means one table in memory, but every "
            "step still reads all of it as the head (vocab_size x hidden_size), while the embedding reads only a "
            "few rows. Count the head whether or not it is tied",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_qkv_bias_of_q_and_k", "5.4", {"model_bytes": model_bytes_qkv_bias_of_q_and_k},
            "the QKV bias (Qwen2) is counted for q and k only: v_proj has a bias too, (H + 2 x Hkv) x head_dim "
            "values a layer",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_without_final_norm", "5.4", {"model_bytes": model_bytes_without_final_norm},
            "the final RMSNorm (model.norm, hidden_size weights after the last layer) is not counted: it is a "
            "non-embedding weight that every step reads. non_embedding = L x per_layer + hidden_size",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_floor_weights_per_request", "5.4", {"workload_floor": workload_floor_weights_per_request},
            "a decode step reads the weights once per active request: a batched step reads them once for the "
            "whole batch (that is what batching buys); only the K/V is read per request",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_context_one_short", "5.4", {"workload_floor": workload_floor_context_one_short},
            "decode step t reads the K/V of p_r + t - 1 tokens: at step t a request holds its p_r prompt tokens and "
            "the t tokens made so far, the one being decoded included (its K/V is written, then read): p_r + t",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_attention_of_the_batch", "5.4", {"workload_floor": workload_floor_attention_of_the_batch},
            "prefill attention is counted over the whole batch as one sequence ((sum of p_r)^2): each request "
            "attends to its own tokens only, so sum over r of 2 x p_r^2 x H x d per layer",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_lm_head_in_prefill", "5.4", {"workload_floor": workload_floor_lm_head_in_prefill},
            "prefill counts the LM head for every prompt token: the prefill FLOPs are 2 x the non-embedding "
            "parameters per prompt token, plus attention (the LM head scores the last prompt token only: counted "
            "as nothing)",
            "test_ch5.py::test_workload_floor_closed_form"),
    # 5.4, round 8
    Mistake("ch5_bytes_both_tables_when_untied", "5.4", {"model_bytes": model_bytes_both_tables_when_untied},
            "with untied embeddings both vocab_size x hidden_size tables are counted as read: the LM head is read "
            "whole every step, but the embedding table only at the B rows of the batch's tokens (counted as "
            "nothing). Count vocab_size x hidden_size once, tied or not",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_four_bytes_an_element", "5.4", {"model_bytes": model_bytes_four_bytes_an_element},
            "every element is counted as 4 bytes, whatever dtype_bytes: a bf16 weight or cached K/V element is 2 "
            "bytes (fp32's 4 doubles the bf16 counts). Multiply the weights and the K/V by dtype_bytes",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_two_bytes_an_element", "5.4", {"model_bytes": model_bytes_two_bytes_an_element},
            "every element is counted as 2 bytes (bf16's), whatever dtype_bytes: an fp32 model has 4 bytes an "
            "element. Multiply the weights and the K/V by dtype_bytes, the argument",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_weights_in_elements", "5.4", {"model_bytes": model_bytes_weights_in_elements},
            "the weight bytes are counted in elements, not bytes: multiply the weights a step reads (the "
            "non-embedding parameters and the LM head) by dtype_bytes",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_kv_proj_of_query_heads", "5.4", {"model_bytes": model_bytes_kv_proj_of_query_heads},
            "k_proj and v_proj are counted with num_attention_heads: with grouped-query attention each has "
            "num_key_value_heads x head_dim outputs (Qwen3-0.6B: 8 x 128, not 16 x 128), so q, k and v together "
            "are hidden_size x (H + 2 x Hkv) x head_dim (and their biases (H + 2 x Hkv) x head_dim)",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_query_heads_for_kv_heads", "5.4", {"model_bytes": model_bytes_query_heads_for_kv_heads},
            "num_attention_heads is used for the K/V heads, in k_proj and v_proj and in the cache: with grouped-query "
            "attention K and V have num_key_value_heads heads, each shared by H / Hkv query heads. Use "
            "num_key_value_heads for k_proj, v_proj and the K/V bytes per token",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_kv_of_one_layer", "5.4", {"model_bytes": model_bytes_kv_of_one_layer},
            "the K/V per token counts one layer: every layer caches its own key and value of each token, "
            "2 x num_hidden_layers x kv heads x head_dim x bytes",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_kv_head_dim_from_hidden_size", "5.4", {"model_bytes": model_bytes_kv_head_dim_from_hidden_size},
            "the K/V per token takes a head as hidden_size / num_attention_heads elements (2 x layers x hidden_size x "
            "Hkv / H x bytes, a formula for models whose heads split hidden_size): Qwen3 sets head_dim on its own "
            "(Qwen3-0.6B: 128, where 1024 / 16 = 64). Use mc.head_dim: 2 x layers x kv heads x head_dim x bytes",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_mlp_two_matrices", "5.4", {"model_bytes": model_bytes_mlp_two_matrices},
            "the MLP is counted as two matrices: SwiGLU has three, gate_proj and up_proj (hidden_size x "
            "intermediate_size each) and down_proj (intermediate_size x hidden_size), 3 x h x i a layer",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_bytes_without_layer_norms", "5.4", {"model_bytes": model_bytes_without_layer_norms},
            "the two RMSNorm weights of each layer (input_layernorm and post_attention_layernorm, hidden_size each) "
            "are not counted: they are non-embedding weights every step reads, 2 x hidden_size a layer",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_params_with_a_table", "5.4", {"model_bytes": model_bytes_params_with_a_table},
            "the non-embedding parameters include a vocab_size x hidden_size table (the embedding or the LM head): "
            "they are the decoder layers' weights and the final norm only (prefill counts 2 FLOPs for each per "
            "token); the LM head is added to the weight bytes a step reads, not to the parameters",
            "test_ch5.py::test_model_bytes_match_transformers"),
    Mistake("ch5_floor_tok_s_of_every_token", "5.4", {"workload_floor": workload_floor_tok_s_of_every_token},
            "floor_tok_s counts the prompt tokens too: it is the output rate, the total output tokens (sum of "
            "o_r) / floor_s, as the bench's tok/s counts what the engine generates",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_tok_s_of_decoded_tokens", "5.4", {"workload_floor": workload_floor_tok_s_of_decoded_tokens},
            "floor_tok_s counts only the tokens the decode steps make (o_r - 1 a request): the first token of each "
            "request, made by its prefill, is an output token too: sum of o_r / floor_s",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_copy_rate_in_gib", "5.4", {"workload_floor": workload_floor_copy_rate_in_gib},
            "copy_gbps is taken as GiB/s (x 2**30 bytes): it is GB/s, 1e9 bytes a second, so the decode floor is "
            "decode bytes / (copy_gbps * 1e9) (GiB makes it 7% short)",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_in_milliseconds", "5.4", {"workload_floor": workload_floor_in_milliseconds},
            "the floors are in milliseconds (x 1000, and floor_tok_s per ms): floor_s, floor_decode_s and "
            "floor_prefill_s are seconds, bytes / (copy_gbps * 1e9) and FLOPs / (matmul_tflops * 1e12) as they are",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_overlapped", "5.4", {"workload_floor": workload_floor_overlapped},
            "floor_s is the larger of the decode and prefill floors, as if they overlapped: the floor runs the "
            "prefill FLOPs and the decode bytes one after the other, floor_s = floor_decode_s + floor_prefill_s",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_prompt_kv_only", "5.4", {"workload_floor": workload_floor_prompt_kv_only},
            "decode step t reads the K/V of the prompt only (p_r tokens): a request also holds the t tokens made so "
            "far, the one being decoded included, so step t reads p_r + t tokens' K/V",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_generated_kv_only", "5.4", {"workload_floor": workload_floor_generated_kv_only},
            "decode step t reads the K/V of the t tokens made so far only: the prompt's K/V is in the cache too, and "
            "every step attends to it, so step t reads p_r + t tokens' K/V for request r",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_tflops_times_1e9", "5.4", {"workload_floor": workload_floor_tflops_times_1e9},
            "matmul_tflops is scaled by 1e9 (as copy_gbps is): it is TFLOP/s, 1e12 FLOPs a second, so the prefill "
            "floor is prefill FLOPs / (matmul_tflops * 1e12), 1000x shorter",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_attention_of_kv_heads", "5.4", {"workload_floor": workload_floor_attention_of_kv_heads},
            "prefill attention is counted with num_key_value_heads: every query head computes its own scores and "
            "weighted sum (grouped-query attention shares K and V, not the work), 2 x p_r^2 x "
            "num_attention_heads x head_dim per layer",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_attention_without_the_2", "5.4",
            {"workload_floor": workload_floor_attention_without_the_2},
            "prefill attention is counted as p_r^2 x H x d per layer, without its factor 2: QK^T and PV over the "
            "causal half are two matmuls of p^2/2 x d multiply-adds for each head, 2 FLOPs each, so 2 x p_r^2 x "
            "num_attention_heads x head_dim per layer",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_attention_of_one_layer", "5.4", {"workload_floor": workload_floor_attention_of_one_layer},
            "prefill attention is counted for one layer: every layer attends, 2 x p_r^2 x H x d x num_hidden_layers "
            "for request r",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_one_flop_per_parameter", "5.4", {"workload_floor": workload_floor_one_flop_per_parameter},
            "prefill counts one FLOP per parameter per token: each weight does a multiply and an add for every "
            "token, 2 x the non-embedding parameters per prompt token",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_without_attention", "5.4", {"workload_floor": workload_floor_without_attention},
            "prefill FLOPs leave attention out: besides 2 x the parameters per token, QK^T and PV cost "
            "2 x p_r^2 x H x d per layer for request r (the causal half)",
            "test_ch5.py::test_workload_floor_closed_form"),
    Mistake("ch5_floor_finished_requests_read", "5.4", {"workload_floor": workload_floor_finished_requests_read},
            "every decode step reads the K/V of every request, finished or not: step t decodes only the requests "
            "with o_r > t (one that has made its o_r tokens has left the batch), so only their K/V is read",
            "test_ch5.py::test_workload_floor_closed_form"),
]
