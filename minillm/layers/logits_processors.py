"""Logits processors: what a request's SamplingParams change in its logits before sampling (vLLM's
meaning of each field), applied to a step's [B, V] logits in a few scatters and elementwise ops:

    logit_bias          logits[t] += bias[t]
    allowed_token_ids   logits[t] = -inf for every t not in the list
    repetition_penalty  t in the prompt or the output: logits[t] / r if logits[t] > 0 else logits[t] * r
    frequency_penalty   logits[t] -= frequency * (times t was generated)
    presence_penalty    logits[t] -= presence * (t was generated at all)
    min_tokens          logits[t] = -inf for EOS and stop_token_ids until min_tokens are out
    bad_words           logits[w[-1]] = -inf for each bad word w whose w[:-1] the output ends in
    min_p               after temperature: drop t with p[t] < min_p * max_t' p[t']

The engine builds each step's inputs on the host (minillm.engine.model_runner.logits_inputs): token
ids padded with the vocabulary size V (a column that is cut off), and the newest token of a row that
async scheduling has not read back yet as a negative id, filled in on the device from `last_ids`.
A bad word whose prefix ends in that token is matched on the host up to it, and on the device on it.
"""
from __future__ import annotations

import torch


def apply_logits_processors(logits: torch.Tensor, bias_rows=None, bias_cols=None, bias_values=None,
                            output_ids=None, seen_ids=None, presence=None, frequency=None, repetition=None,
                            banned_rows=None, banned_cols=None, allowed_rows=None, allowed_cols=None,
                            bad_rows=None, bad_cols=None, bad_after=None, last_ids=None) -> torch.Tensor:
    """logits: [B, V] fp32 -> a new [B, V] tensor with the processors applied.
    bias_*: [n] (row, token, bias) triples; output_ids: [B, Lo] each row's generated tokens and
    seen_ids: [B, Ls] its prompt and generated tokens (V pads, a negative id is last_ids[row]);
    presence, frequency, repetition: [B] fp32 (0, 0, 1 for a row without penalties);
    banned_*: [m] (row, token) pairs set to -inf (min_tokens, bad words); allowed_*: [k] (row, token)
    pairs, the only tokens a row that has any keeps (allowed_token_ids); bad_*: [p] (row, token, after)
    triples, token set to -inf where last_ids[row] == after (a bad word whose prefix ends in the
    newest token, not read back yet); last_ids: [B] or None."""
    B, V = logits.shape
    logits = logits.clone()  # the graph's logits live in its pool: never edit them in place
    if bias_rows is not None and len(bias_rows):
        logits.index_put_((bias_rows.long(), bias_cols.long()), bias_values.to(logits.dtype), accumulate=True)
    if output_ids is not None:
        if last_ids is not None:  # the token async scheduling has not read back yet
            output_ids = torch.where(output_ids < 0, last_ids[:, None], output_ids)
            seen_ids = torch.where(seen_ids < 0, last_ids[:, None], seen_ids)
        counts = torch.zeros(B, V + 1, device=logits.device).scatter_add_(
            1, output_ids, torch.ones(output_ids.shape, device=logits.device))[:, :V]
        seen = torch.zeros(B, V + 1, dtype=torch.bool, device=logits.device).scatter_(1, seen_ids, True)[:, :V]
        r = repetition[:, None]
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
        logits = logits - frequency[:, None] * counts - presence[:, None] * (counts > 0)
    if banned_rows is not None and len(banned_rows):
        logits[banned_rows.long(), banned_cols.long()] = float("-inf")
    if bad_rows is not None and len(bad_rows):
        rows, cols = bad_rows.long(), bad_cols.long()
        # summed, not assigned: two words may ban one token after different newest tokens
        hits = torch.zeros(B, V, device=logits.device).index_put_(
            (rows, cols), (last_ids[rows] == bad_after).float(), accumulate=True)
        logits = logits.masked_fill(hits > 0, float("-inf"))
    if allowed_rows is not None and len(allowed_rows):
        keep = torch.zeros(B, V, dtype=torch.bool, device=logits.device)
        keep[allowed_rows.long(), allowed_cols.long()] = True
        restricted = keep.any(dim=1, keepdim=True)  # a row without allowed_token_ids keeps every token
        logits = logits.masked_fill(restricted & ~keep, float("-inf"))
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Drop the tokens whose probability after temperature is below min_p x the row's largest.
    softmax(x / T)[t] < min_p * max is x[t] < max(x) + T * log(min_p), so no softmax is needed.
    logits: [B, V] fp32 (before temperature); min_p, temperatures: [B] -> [B, V], dropped at -inf.
    A row with min_p 0 keeps everything; a greedy row (T = 0) keeps its argmax."""
    floor = torch.where(min_p > 0, temperatures * torch.log(min_p.clamp_min(1e-30)), float("-inf"))
    return logits.masked_fill(logits < logits.max(dim=-1).values[:, None] + floor[:, None], float("-inf"))
