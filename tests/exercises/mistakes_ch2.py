"""Chapter 2's known wrong versions (see mistakes.py).

Each function below is an exercise written the way students get it wrong; its docstring says the
one thing that differs from the right version. The hints are what the grader prints.
"""
from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from minillm.course import triton_primer as primer
from minillm.kernels import rmsnorm as rmsnorm_kernels
from minillm.layers.activation import silu_and_mul
from minillm.layers.layernorm import apply_rms_norm, rms_norm
from minillm.layers.rotary import apply_rotary
from mistakes import Mistake


# ---- 2.1 RMSNorm ---------------------------------------------------------------------------------
def rms_norm_in_input_dtype(x, weight, eps):
    """Computes the statistics in x's own dtype: no fp32 upcast."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps))


def rms_norm_eps_outside_sqrt(x, weight, eps):
    """Divides by sqrt(mean(x**2)) + eps: eps added outside the square root."""
    xf = x.float()
    return weight * (xf / (xf.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)).to(x.dtype)


def rms_norm_eps_after_rsqrt(x, weight, eps):
    """Multiplies by rsqrt(mean(x**2)) + eps: eps added after the reciprocal root."""
    xf = x.float()
    return weight * (xf * (torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True)) + eps)).to(x.dtype)


def rms_norm_sum_not_mean(x, weight, eps):
    """Divides by the root of the SUM of squares (the L2 norm), not of their mean."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm_scales_x_in_place(x, weight, eps):
    """Normalizes with x.mul_ on x.float(), which for an fp32 x is x itself: the caller's tensor changes."""
    orig_dtype = x.dtype
    x = x.float()
    x.mul_(torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps))
    return weight * x.to(orig_dtype)


def rms_norm_weight_before_cast(x, weight, eps):
    """Multiplies by weight in fp32 and casts to x.dtype once, at the end: bf16 rounds weight * x_normed, not
    x_normed."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps))).to(x.dtype)


def rms_norm_mean_over_everything(x, weight, eps):
    """x.pow(2).mean() without dim=-1: one mean square over the whole tensor, not one per row."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean() + eps)).to(x.dtype)


def rms_norm_mean_over_dim_1(x, weight, eps):
    """Means over dim=1, "the hidden dimension" of a [tokens, hidden] input: of [tokens, heads, head_dim] it is
    the heads."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + eps)).to(x.dtype)


def rms_norm_centered(x, weight, eps):
    """Subtracts each row's mean first, as LayerNorm does."""
    xf = x.float()
    xf = xf - xf.mean(dim=-1, keepdim=True)
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm_without_eps(x, weight, eps):
    """Never adds eps: rsqrt(mean(x**2))."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True))).to(x.dtype)


def rms_norm_in_weight_dtype(x, weight, eps):
    """Casts the normalized x to weight.dtype (not x.dtype) before the scale: a mixed pair gives weight's dtype."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(weight.dtype)


def rms_norm_result_in_x_dtype(x, weight, eps):
    """Casts the result to x.dtype: fp32 weights over bf16 x give bf16, where torch's promotion gives fp32."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)).to(x.dtype)


def rms_norm_weight_in_x_dtype(x, weight, eps):
    """Casts the weight to x.dtype before the product: fp32 weights over bf16 x give bf16 (rounded weights)."""
    xf = x.float()
    return weight.to(x.dtype) * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm_mean_without_keepdim(x, weight, eps):
    """x.pow(2).mean(dim=-1) without keepdim=True: the [..., 1] column of mean squares becomes [...], which
    broadcasts against x's LAST dimension (an error, or a silent wrong result where the sizes agree)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1) + eps)).to(x.dtype)


# ---- 2.2 fused add + RMSNorm ---------------------------------------------------------------------
def add_rms_norm_sum_in_residual_dtype(x, residual, weight, eps):
    """Casts the sum to residual.dtype: a bf16 stream under an fp32 block output stays bf16."""
    new_residual = (x + residual).to(residual.dtype)
    return rms_norm(new_residual, weight, eps), new_residual


def add_rms_norm_sum_in_x_dtype(x, residual, weight, eps):
    """Casts the sum to x.dtype: an fp32 stream under a bf16 block output drops to bf16."""
    new_residual = (x + residual).to(x.dtype)
    return rms_norm(new_residual, weight, eps), new_residual


def add_rms_norm_returns_normed_twice(x, residual, weight, eps):
    """Returns the normalized sum as both outputs: (normed, normed)."""
    normed = rms_norm(x + residual, weight, eps)
    return normed, normed


def add_rms_norm_returns_old_residual(x, residual, weight, eps):
    """Normalizes the sum but returns the residual it was given, not the sum."""
    return rms_norm(x + residual, weight, eps), residual


def add_rms_norm_of_x_only(x, residual, weight, eps):
    """Returns the right new residual but normalizes x alone, not x + residual."""
    return rms_norm(x, weight, eps), x + residual


def add_rms_norm_of_residual_only(x, residual, weight, eps):
    """Normalizes the residual it was given, before adding x: returns the right new residual, but the norm of
    the old stream, not of x + residual."""
    normed = rms_norm(residual, weight, eps)
    residual = x + residual
    return normed, residual


def add_rms_norm_in_place(x, residual, weight, eps):
    """Adds into the caller's residual tensor in place (residual += x)."""
    residual += x
    return rms_norm(residual, weight, eps), residual


def add_rms_norm_sum_in_fp32(x, residual, weight, eps):
    """Adds in fp32 (x.float() + residual.float()) and returns that fp32 sum as the new residual."""
    new_residual = x.float() + residual.float()
    return rms_norm(new_residual, weight, eps), new_residual


def add_rms_norm_normalizes_the_fp32_sum(x, residual, weight, eps):
    """Adds in fp32 and normalizes that unrounded sum, rounding to x.dtype only at the end (and the returned
    residual once): the norm reads another tensor than the residual it returns."""
    total = x.float() + residual.float()
    return rms_norm(total, weight, eps).to(x.dtype), total.to(x.dtype)


def add_rms_norm_fixed_eps(x, residual, weight, eps):
    """Normalizes with eps = 1e-6 written in (Qwen3's), not the eps it is given."""
    new_residual = x + residual
    return rms_norm(new_residual, weight, 1e-6), new_residual


def add_rms_norm_outputs_swapped(x, residual, weight, eps):
    """Returns (new_residual, normed) instead of (normed, new_residual)."""
    new_residual = x + residual
    return new_residual, rms_norm(new_residual, weight, eps)


# ---- 2.3 rotary embedding ------------------------------------------------------------------------
def rope_cos_sin_exponent_halved(head_dim, max_position, base):
    """theta_j = base ** (-j / d) for j < d/2: the exponent lacks its factor 2."""
    inv_freq = 1.0 / (base ** (torch.arange(head_dim // 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def rope_cos_sin_in_fp64(head_dim, max_position, base):
    """The angles in fp64, the table cast to fp32 at the end: more accurate than transformers' fp32, so not its bits."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def rope_cos_sin_from_position_1(head_dim, max_position, base):
    """Row p holds position p + 1's rotation: the positions counted from 1 (torch.arange(1, P + 1))."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(1, max_position + 1, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def rope_cos_sin_negative_power(head_dim, max_position, base):
    """inv_freq = base ** (-2j / d) in fp32: the same number as 1.0 / base ** (2j / d), rounded differently."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def rope_cos_sin_not_inverted(head_dim, max_position, base):
    """inv_freq = base ** (2j / d), without the 1.0 / : frequencies that grow instead of shrink."""
    inv_freq = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def rope_cos_sin_transformers_layout(head_dim, max_position, base):
    """Copies Qwen3RotaryEmbedding's layout: emb = cat(angles, angles), the table [cos(emb) | sin(emb)] of
    shape [P, 2d] (each of the d/2 angles twice in cos and twice in sin), not [P, d]."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return torch.cat([emb.cos(), emb.sin()], dim=-1)


def apply_rotary_cos_sin_swapped(x, positions, cos_sin):
    """Unpacks the cache row as sin, cos = ...chunk(2): the cache holds [cos | sin]."""
    sin, cos = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def apply_rotary_second_half_sign(x, positions, cos_sin):
    """Second half x2 * cos - x1 * sin: the first half is right, the second rotates the other way."""
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos - x1 * sin], dim=-1).to(x.dtype)


def apply_rotary_sign_flipped(x, positions, cos_sin):
    """Rotates the wrong way: [x1 cos + x2 sin | x2 cos - x1 sin]."""
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1).to(x.dtype)


def apply_rotary_interleaved(x, positions, cos_sin):
    """GPT-J layout: rotates the pairs (x[0], x[1]), (x[2], x[3]), ... instead of the two halves."""
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2).to(x.dtype)


def apply_rotary_pair_frequencies_on_halves(x, positions, cos_sin):
    """Rotates the halves in transformers' form, x * cos + rotate_half(x) * sin, but widens cos and sin to d
    with repeat_interleave(2) (each frequency twice in a row, as for GPT-J's interleaved pairs), where the
    halves need them repeated whole, cat([cos, cos]): element j turns by frequency j // 2, not j mod d/2."""
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)  # [N, 1, d/2] each
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)  # [N, 1, d]
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


def apply_rotary_table_in_input_dtype(x, positions, cos_sin):
    """Rounds the cos/sin rows to x's dtype (bf16 here) before the rotation, which itself runs in fp32."""
    cos, sin = cos_sin[positions].to(x.dtype).unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def apply_rotary_positions_from_the_first(x, positions, cos_sin):
    """Counts positions from the batch's first token (positions - positions[0])."""
    cos, sin = cos_sin[positions - positions[0]].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def apply_rotary_in_the_input_dtype(x, positions, cos_sin):
    """The rotation computed in x's dtype (bf16 here): the table rounded to it, every product rounded."""
    cos, sin = cos_sin[positions].to(x.dtype).unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def apply_rotary_ignoring_positions(x, positions, cos_sin):
    """Takes row i of the cache for the i-th token of the packed batch, not the token's position."""
    cos, sin = cos_sin[:x.shape[0]].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# ---- 2.4 causal attention ------------------------------------------------------------------------
def _attention(q, k, v, scale, diagonal_shift=0, align_to_end=True, tile_kv_heads=False, mask_after_softmax=False,
               softmax_dim=-1, negate_diagonal=False, invert_mask=False, in_fp32=True, fill=float("-inf"),
               kv_head_by_count=False, reshaped_not_permuted=False, exp_over_sum=False,
               weights_in_input_dtype=False, tile_k_only=False, mask_only_if_square=False):
    """The right causal_attention, with one of its details changed."""
    Lq, H, _ = q.shape
    Lk, Hkv, _ = k.shape
    upcast = (lambda t: t.float()) if in_fp32 else (lambda t: t)
    if tile_kv_heads:  # query head h reads KV head h % Hkv
        k, v = upcast(k).repeat(1, H // Hkv, 1), upcast(v).repeat(1, H // Hkv, 1)
    elif tile_k_only:  # k tiled (head h reads KV head h % Hkv's keys), v interleaved as it should be
        k, v = upcast(k).repeat(1, H // Hkv, 1), upcast(v).repeat_interleave(H // Hkv, dim=1)
    elif kv_head_by_count:  # query head h reads KV head h // Hkv: the count of KV heads taken for the group size
        kv_head = torch.arange(H) // Hkv
        k, v = upcast(k)[:, kv_head], upcast(v)[:, kv_head]
    else:
        k, v = upcast(k).repeat_interleave(H // Hkv, dim=1), upcast(v).repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", upcast(q), k) * scale
    diagonal = (Lk - Lq if align_to_end else 0) + diagonal_shift
    visible = torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=-diagonal if negate_diagonal else diagonal)
    if invert_mask:
        visible = ~visible
    if mask_only_if_square and Lq != Lk:  # the mask skipped unless Lq == Lk: every key visible
        visible = torch.ones(Lq, Lk, dtype=torch.bool)
    if softmax_dim != -1:  # each key's weights normalized over the queries
        weights = scores.masked_fill(~visible, float("-inf")).softmax(dim=softmax_dim)
        return torch.einsum("hqk,khd->qhd", weights, v).to(q.dtype)
    if mask_after_softmax:  # the future keys' weights zeroed after the softmax: the rows no longer sum to 1
        return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1).masked_fill(~visible, 0.0), v).to(q.dtype)
    scores = scores.masked_fill(~visible, fill)
    if reshaped_not_permuted:  # [H, Lq, D] reshaped to [Lq, H, D]: the rows come out in the wrong order
        return torch.einsum("hqk,khd->hqd", scores.softmax(dim=-1), v).reshape(Lq, H, -1).to(q.dtype)
    if weights_in_input_dtype:  # the softmax's weights rounded to q's dtype before the product with v
        return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1).to(q.dtype).float(), v).to(q.dtype)
    if exp_over_sum:  # the softmax as exp(s) / sum(exp(s)), no max subtracted: past 88.7 fp32's exp is inf
        e = scores.exp()
        return torch.einsum("hqk,khd->qhd", e / e.sum(dim=-1, keepdim=True), v).to(q.dtype)
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).to(q.dtype)


def attention_sees_next_key(q, k, v, scale):
    """The causal mask's diagonal is one too high: each query also sees the key after it."""
    return _attention(q, k, v, scale, diagonal_shift=1)


def attention_mask_not_aligned_to_end(q, k, v, scale):
    """tril(diagonal=0): query i sees keys 0..i, as if the queries started at position 0."""
    return _attention(q, k, v, scale, align_to_end=False)


def attention_kv_heads_tiled(q, k, v, scale):
    """k.repeat(...) instead of repeat_interleave: query head h reads KV head h % Hkv."""
    return _attention(q, k, v, scale, tile_kv_heads=True)


def attention_kv_head_by_count(q, k, v, scale):
    """Query head h reads KV head h // Hkv (the number of KV heads taken for the group size H // Hkv)."""
    return _attention(q, k, v, scale, kv_head_by_count=True)


def attention_weights_in_input_dtype(q, k, v, scale):
    """Rounds the softmax's weights to q's dtype (bf16) before the product with v."""
    return _attention(q, k, v, scale, weights_in_input_dtype=True)


def attention_k_tiled_only(q, k, v, scale):
    """k.repeat(...) for the keys, repeat_interleave for the values: query head h's scores and values come from
    different KV heads."""
    return _attention(q, k, v, scale, tile_k_only=True)


def attention_softmax_without_max(q, k, v, scale):
    """The softmax written as exp(s) / exp(s).sum(): right until a score passes 88.7, where fp32's exp is inf."""
    return _attention(q, k, v, scale, exp_over_sum=True)


def attention_reshaped_not_permuted(q, k, v, scale):
    """Computes the output as [H, Lq, D] and reshapes it to [Lq, H, D] instead of permuting it."""
    return _attention(q, k, v, scale, reshaped_not_permuted=True)


def attention_masks_only_a_prefill(q, k, v, scale):
    """Applies the causal mask only when Lq == Lk (`if Lq == Lk:`): fewer queries than keys get no mask."""
    return _attention(q, k, v, scale, mask_only_if_square=True)


def attention_without_scale(q, k, v, scale):
    """Never multiplies the scores by scale."""
    return _attention(q, k, v, 1.0)


def attention_scale_from_head_dim(q, k, v, scale):
    """Ignores the scale argument and uses head_dim ** -0.5 (what scale usually is)."""
    return _attention(q, k, v, q.shape[-1] ** -0.5)


def attention_mask_after_softmax(q, k, v, scale):
    """Takes the softmax over every key, then zeroes the weights of the keys the query must not see."""
    return _attention(q, k, v, scale, mask_after_softmax=True)


def attention_scales_q_in_place(q, k, v, scale):
    """Scales the queries with q.mul_(scale) on q.float(), which for an fp32 q is q itself."""
    dtype, q = q.dtype, q.float()
    q.mul_(scale)
    return _attention(q, k, v, 1.0).to(dtype)


def attention_scale_on_q_and_k(q, k, v, scale):
    """Multiplies q and k each by scale: the scores come out scaled by scale ** 2."""
    return _attention(q, k, v, scale * scale)


def attention_softmax_over_heads(q, k, v, scale):
    """softmax(dim=0) on the [H, Lq, Lk] scores: each (query, key) pair's weights sum to 1 over the heads."""
    return _attention(q, k, v, scale, softmax_dim=0)


def attention_softmax_over_queries(q, k, v, scale):
    """softmax(dim=-2) on the [H, Lq, Lk] scores: each KEY's weights sum to 1 over the queries."""
    return _attention(q, k, v, scale, softmax_dim=-2)


def attention_masks_with_zero(q, k, v, scale):
    """masked_fill(~visible, 0.0): a masked score of 0 still gets weight exp(0 - max) in the softmax."""
    return _attention(q, k, v, scale, fill=0.0)


def attention_misses_its_own_key(q, k, v, scale):
    """tril(diagonal=Lk - Lq - 1): each query misses its own key, and the first sees none (NaN)."""
    return _attention(q, k, v, scale, diagonal_shift=-1)


def attention_mask_inverted(q, k, v, scale):
    """masked_fill(visible, -inf) instead of masked_fill(~visible, -inf): the PAST is masked out."""
    return _attention(q, k, v, scale, invert_mask=True)


def attention_divides_by_scale(q, k, v, scale):
    """Divides the scores by scale (as by sqrt(d)): scale is already head_dim ** -0.5."""
    return _attention(q, k, v, 1.0 / scale)


def attention_mask_diagonal_negated(q, k, v, scale):
    """tril(diagonal=Lq - Lk): the offset's sign is flipped, so with fewer queries than keys each query
    sees Lk - Lq keys too few (a decode query sees none)."""
    return _attention(q, k, v, scale, negate_diagonal=True)


def attention_math_in_input_dtype(q, k, v, scale):
    """Computes the products and the softmax in q's dtype: no .float() (bf16 rounds every step)."""
    return _attention(q, k, v, scale, in_fp32=False)


def attention_scale_in_input_dtype(q, k, v, scale):
    """Multiplies q by scale in q's dtype, then upcasts: in bf16 the scaled q is rounded."""
    return _attention(q * scale, k, v, 1.0)


def attention_returns_fp32(q, k, v, scale):
    """Returns the fp32 result: no .to(q.dtype) at the end."""
    return _attention(q.float(), k, v, scale)


# ---- 2.5 SiLU-and-mul ----------------------------------------------------------------------------
def silu_on_up(x):
    """Applies SiLU to the second half (up) and multiplies by the first (gate)."""
    gate, up = x.chunk(2, dim=-1)
    return gate * F.silu(up)


def silu_interleaved(x):
    """Takes gate and up from the even and odd columns instead of the two halves."""
    return F.silu(x[..., 0::2]) * x[..., 1::2]


def sigmoid_instead_of_silu(x):
    """Uses sigmoid(gate) * up: SiLU is gate * sigmoid(gate)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.sigmoid(gate) * up


def silu_chunk_along_tokens(x):
    """x.chunk(2) without dim=: the halves are taken along dim 0 (the tokens), not the last dimension."""
    gate, up = x.chunk(2)
    return F.silu(gate) * up


def silu_on_both_halves(x):
    """silu(gate) * silu(up): SiLU on the up half too."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * F.silu(up)


def silu_and_mul_in_fp32(x):
    """Computes in fp32 for accuracy and returns that fp32 result, not x.dtype."""
    gate, up = x.float().chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_plus_up(x):
    """silu(gate) + up: the gate's output added to up, not multiplied."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) + up


def gelu_instead_of_silu(x):
    """gelu(gate) * up (GPT-2's activation): Qwen's MLP uses SiLU."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate) * up


# ---- 2.6 the decoder layer -----------------------------------------------------------------------
def _layer(positions, hidden_states, residual, p, qk_norm_after_rope=False, restart_residual=False,
           post_norm_without_residual=False, skip_qk_norm=False, first_residual_normed=False,
           qk_norms_swapped=False, rope_on_v=False, post_residual_discarded=False, return_sum=False,
           kv_swapped=False, fixed_eps=False, first_residual_doubled=False, qk_fixed_eps=False,
           k_with_q_norm=False, rope_on_q_only=False, post_norm_is_input_norm=False, k_norm_on_v=False,
           attn_out_transposed=False):
    """The right decoder_layer, with one of its steps changed."""
    if fixed_eps:  # the bug: Qwen3's rms_norm_eps written in, not the model's p.eps
        p = p._replace(eps=1e-6)
    if first_residual_doubled and residual is None:  # the bug: residual = hidden_states, then added again
        residual = hidden_states
    if residual is None or restart_residual:
        h = apply_rms_norm(hidden_states, p.input_norm, p.eps)
        residual = h if first_residual_normed else hidden_states
    else:
        h, residual = apply_rms_norm(hidden_states, p.input_norm, p.eps, residual)
    n, H, Hkv, D = h.shape[0], p.num_heads, p.num_kv_heads, p.head_dim
    q, k, v = p.qkv_proj(h).split([H * D, Hkv * D, Hkv * D], dim=-1)
    if kv_swapped:  # q, v, k = ...split(...)
        k, v = v, k
    q, k, v = q.reshape(n, H, D), k.reshape(n, Hkv, D), v.reshape(n, Hkv, D)
    q_norm, k_norm = (p.k_norm, p.q_norm) if qk_norms_swapped else (p.q_norm, p.k_norm)
    if k_with_q_norm:  # the bug: k normalized with q_norm's weight
        k_norm = p.q_norm
    if post_norm_is_input_norm:  # the bug: the input norm's weight before the MLP too
        p = p._replace(post_norm=p.input_norm)
    if p.q_norm is not None and not (qk_norm_after_rope or skip_qk_norm):
        qk_eps = 1e-6 if qk_fixed_eps else p.eps  # the bug: Qwen3's eps written into the QK-norms only
        q, k = apply_rms_norm(q, q_norm, qk_eps), apply_rms_norm(k, k_norm, qk_eps)
    q = apply_rotary(q, positions, p.cos_sin)
    if not rope_on_q_only:  # (the bug: k keeps no position)
        k = apply_rotary(k, positions, p.cos_sin)
    if rope_on_v:
        v = apply_rotary(v, positions, p.cos_sin)
    if k_norm_on_v and p.k_norm is not None:  # the bug: v normalized too
        v = apply_rms_norm(v, p.k_norm, p.eps)
    if p.q_norm is not None and qk_norm_after_rope:
        q, k = apply_rms_norm(q, p.q_norm, p.eps), apply_rms_norm(k, p.k_norm, p.eps)
    o = p.attn(q, k, v)
    if attn_out_transposed:  # the bug: [N, H, D] transposed to [H, N, D], then reshaped to [N, H * D]
        o = o.transpose(0, 1)
    h = p.o_proj(o.reshape(n, H * D))
    if post_norm_without_residual:
        h = apply_rms_norm(h, p.post_norm, p.eps)
    elif post_residual_discarded:
        h, _ = apply_rms_norm(h, p.post_norm, p.eps, residual)
    else:
        h, residual = apply_rms_norm(h, p.post_norm, p.eps, residual)
    mlp_out = p.down_proj(silu_and_mul(p.gate_up_proj(h)))
    return (mlp_out + residual if return_sum else mlp_out), residual


def layer_k_with_q_norm(positions, hidden_states, residual, p):
    """Normalizes k with p.q_norm (q with its own)."""
    return _layer(positions, hidden_states, residual, p, k_with_q_norm=True)


def layer_rope_on_q_only(positions, hidden_states, residual, p):
    """Rotates q but not k."""
    return _layer(positions, hidden_states, residual, p, rope_on_q_only=True)


def layer_post_norm_is_input_norm(positions, hidden_states, residual, p):
    """Normalizes before the MLP with the input norm's weight (p.input_norm), not p.post_norm."""
    return _layer(positions, hidden_states, residual, p, post_norm_is_input_norm=True)


def layer_k_norm_on_v(positions, hidden_states, residual, p):
    """Normalizes v with p.k_norm as well."""
    return _layer(positions, hidden_states, residual, p, k_norm_on_v=True)


def layer_k_v_swapped(positions, hidden_states, residual, p):
    """Takes k and v out of qkv_proj's output in the wrong order."""
    return _layer(positions, hidden_states, residual, p, kv_swapped=True)


def layer_fixed_eps(positions, hidden_states, residual, p):
    """Normalizes with eps = 1e-6 (Qwen3's value) written in, not p.eps."""
    return _layer(positions, hidden_states, residual, p, fixed_eps=True)


def layer_qk_norm_fixed_eps(positions, hidden_states, residual, p):
    """The QK-norms use eps = 1e-6 written in (Qwen3's value), the other norms p.eps."""
    return _layer(positions, hidden_states, residual, p, qk_fixed_eps=True)


def layer_first_residual_doubled(positions, hidden_states, residual, p):
    """First layer: sets residual = hidden_states, then lets the fused add+norm add hidden_states to it again."""
    return _layer(positions, hidden_states, residual, p, first_residual_doubled=True)


def layer_qk_norm_after_rope(positions, hidden_states, residual, p):
    """Applies QK-norm to the rotated q and k."""
    return _layer(positions, hidden_states, residual, p, qk_norm_after_rope=True)


def layer_without_qk_norm(positions, hidden_states, residual, p):
    """Never applies QK-norm (the Llama/Qwen2 layer run on Qwen3's weights)."""
    return _layer(positions, hidden_states, residual, p, skip_qk_norm=True)


def layer_residual_not_carried(positions, hidden_states, residual, p):
    """Ignores the incoming residual: every layer starts the stream anew from its hidden_states."""
    return _layer(positions, hidden_states, residual, p, restart_residual=True)


def layer_post_norm_without_residual(positions, hidden_states, residual, p):
    """Normalizes the attention output alone before the MLP and never adds it to the residual."""
    return _layer(positions, hidden_states, residual, p, post_norm_without_residual=True)


def layer_first_residual_normed(positions, hidden_states, residual, p):
    """First layer: residual = the NORMED hidden states instead of the hidden states."""
    return _layer(positions, hidden_states, residual, p, first_residual_normed=True)


def layer_qk_norms_swapped(positions, hidden_states, residual, p):
    """Normalizes q with p.k_norm and k with p.q_norm."""
    return _layer(positions, hidden_states, residual, p, qk_norms_swapped=True)


def layer_rope_on_v(positions, hidden_states, residual, p):
    """Rotates v as well as q and k."""
    return _layer(positions, hidden_states, residual, p, rope_on_v=True)


def layer_post_norm_residual_discarded(positions, hidden_states, residual, p):
    """h, _ = apply_rms_norm(h, p.post_norm, p.eps, residual): the MLP gets the right input, but the layer
    returns the residual from before the attention add."""
    return _layer(positions, hidden_states, residual, p, post_residual_discarded=True)


def layer_attn_out_transposed(positions, hidden_states, residual, p):
    """Flattens the attention output with .transpose(0, 1).reshape(n, H * D): [N, H, D] is already token-major,
    so the transpose makes it [H, N, D] and each row of the reshape mixes heads of other tokens."""
    return _layer(positions, hidden_states, residual, p, attn_out_transposed=True)


def layer_returns_full_output(positions, hidden_states, residual, p):
    """Returns (mlp_out + residual, residual): the layer's full output where mlp_out alone is due."""
    return _layer(positions, hidden_states, residual, p, return_sum=True)


# ---- 2.7-2.11 the Triton primer (minillm.course.triton_primer) ----------------------------------
def with_kernel(launcher, kernel_name: str, kernel):
    """The given launcher `launcher`, calling `kernel` where it calls `kernel_name` (what a student's
    exercises/ch2.py does: its copy of the launcher calls the student's kernel)."""
    return types.FunctionType(launcher.__code__, {**launcher.__globals__, kernel_name: kernel},
                              launcher.__name__, launcher.__defaults__)


@triton.jit
def add_store_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Masks the loads but not the store: the last program writes all BLOCK lanes."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y)


@triton.jit
def add_load_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Masks the load of x and the store but not the load of y: the last program reads y past its end."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_offsets_without_program(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """offsets = tl.arange(0, BLOCK): every program adds the first block."""
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_offsets_not_scaled(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """offsets = program_id + tl.arange(0, BLOCK): programs start 1 element apart, not BLOCK."""
    offsets = tl.program_id(0) + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_mask_off_by_one(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """mask = offsets <= n: lane n, one past the end, is read and written too."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets <= n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_mask_of_block(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """mask = offsets < BLOCK: only program 0's lanes pass (all BLOCK of them, past n when n < BLOCK)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < BLOCK
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


FIXED_ADD_BLOCK = tl.constexpr(256)  # add_block_fixed's block: the graded tests' first block size, written in


@triton.jit
def add_block_fixed(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Tiles by 256, a number of its own, not by its BLOCK argument: offsets = pid * 256 + tl.arange(0, 256)."""
    offsets = tl.program_id(0) * FIXED_ADD_BLOCK + tl.arange(0, FIXED_ADD_BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


# _softmax_variant's X_ROWS (x's row r at r * stride_x, or at r * n_cols) and OUT_ROWS (out's row r at
# r * stride_out, r * stride_x or r * n_cols)
X_AT_STRIDE, X_N_COLS_APART = tl.constexpr(0), tl.constexpr(1)
OUT_AT_STRIDE, OUT_AT_X_STRIDE, OUT_N_COLS_APART = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _softmax_variant(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr, PAD: tl.constexpr,
                     SUBTRACT_MAX: tl.constexpr, X_ROWS: tl.constexpr, OUT_ROWS: tl.constexpr,
                     STORE_MASKED: tl.constexpr):
    """The right row softmax with one detail changed (see the wrappers below): the masked lanes loaded as PAD
    (-inf is right), the max subtracted or not, a row's place in x and in out, the store masked or not."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    if X_ROWS == X_N_COLS_APART:
        x_row = row * n_cols
    else:
        x_row = row * stride_x
    x = tl.load(x_ptr + x_row + cols, mask=mask, other=PAD).to(tl.float32)
    if SUBTRACT_MAX:
        e = tl.exp(x - tl.max(x, axis=0))
    else:
        e = tl.exp(x)
    if OUT_ROWS == OUT_N_COLS_APART:
        out_row = row * n_cols
    elif OUT_ROWS == OUT_AT_X_STRIDE:
        out_row = row * stride_x
    else:
        out_row = row * stride_out
    y = (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty)
    if STORE_MASKED:
        tl.store(out_ptr + out_row + cols, y, mask=mask)
    else:
        tl.store(out_ptr + out_row + cols, y)


@triton.jit
def softmax_pad_as_zero(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """Loads the lanes past n_cols as 0.0 (other=0.0): each adds exp(0 - max) to the denominator."""
    _softmax_variant(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N, 0.0, True, X_AT_STRIDE, OUT_AT_STRIDE,
                     True)


@triton.jit
def softmax_store_unmasked(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """Masks the loads but not the store: all BLOCK_N lanes of each row are written."""
    _softmax_variant(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N, float("-inf"), True, X_AT_STRIDE,
                     OUT_AT_STRIDE, False)


@triton.jit
def softmax_without_max(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """exp(x) / sum(exp(x)) without subtracting the row's max first."""
    _softmax_variant(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N, float("-inf"), False, X_AT_STRIDE,
                     OUT_AT_STRIDE, True)


@triton.jit
def softmax_rows_n_cols_apart(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """Finds row r of x at r * n_cols (as if x were contiguous), not r * stride_x."""
    _softmax_variant(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N, float("-inf"), True, X_N_COLS_APART,
                     OUT_AT_STRIDE, True)


@triton.jit
def softmax_out_at_x_stride(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """Stores row r at out_ptr + r * stride_x: x's row stride used for the output too."""
    _softmax_variant(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N, float("-inf"), True, X_AT_STRIDE,
                     OUT_AT_X_STRIDE, True)


@triton.jit
def softmax_out_rows_n_cols_apart(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """Stores row r at out_ptr + r * n_cols (as if out were contiguous), not r * stride_out."""
    _softmax_variant(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N, float("-inf"), True, X_AT_STRIDE,
                     OUT_N_COLS_APART, True)


# _gather_variant's BUG: which detail of the right page gather is changed (RIGHT: none)
GATHER_RIGHT, GATHER_TABLE_IGNORED, GATHER_COLUMNS_UNMASKED = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
GATHER_CONTIGUOUS_CACHE, GATHER_PAGE_ROW_SWAPPED, GATHER_OUT_N_COLS_APART = tl.constexpr(3), tl.constexpr(4), \
    tl.constexpr(5)
GATHER_PAGE_STRIDE_FROM_ROWS, GATHER_OFFSETS_INT32 = tl.constexpr(6), tl.constexpr(7)
FIXED_BLOCK_T = tl.constexpr(8)  # gather_block_t_fixed's tile: the wrapper's default block_t, written in


@triton.jit
def _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                    PAGE: tl.constexpr, TILE: tl.constexpr, BLOCK_D: tl.constexpr, BUG: tl.constexpr):
    """The right page gather, TILE tokens a program, with the detail BUG names changed (see the wrappers)."""
    tokens = tl.program_id(0) * TILE + tl.arange(0, TILE)
    cols = tl.arange(0, BLOCK_D)
    mask_t = tokens < n_tokens
    if BUG == GATHER_COLUMNS_UNMASKED:  # every BLOCK_D lane of a row
        mask = mask_t[:, None] & (cols < BLOCK_D)[None, :]
    else:
        mask = mask_t[:, None] & (cols < n_cols)[None, :]
    if BUG == GATHER_TABLE_IGNORED:  # the logical page taken for the physical one
        page = (tokens // PAGE).to(tl.int64)
    elif BUG == GATHER_PAGE_ROW_SWAPPED:
        page = tl.load(table_ptr + tokens % PAGE, mask=mask_t, other=0).to(tl.int64)
    elif BUG == GATHER_OFFSETS_INT32:  # the int32 page id, not cast: page * stride_page wraps past 2**31 - 1
        page = tl.load(table_ptr + tokens // PAGE, mask=mask_t, other=0)
    else:
        page = tl.load(table_ptr + tokens // PAGE, mask=mask_t, other=0).to(tl.int64)
    if BUG == GATHER_PAGE_ROW_SWAPPED:
        row = tokens // PAGE
    else:
        row = tokens % PAGE
    if BUG == GATHER_CONTIGUOUS_CACHE:
        src = page[:, None] * (PAGE * n_cols) + row[:, None] * n_cols + cols[None, :]
    elif BUG == GATHER_PAGE_STRIDE_FROM_ROWS:  # pages taken as PAGE rows back to back
        src = page[:, None] * (PAGE * stride_row) + row[:, None] * stride_row + cols[None, :]
    else:
        src = page[:, None] * stride_page + row[:, None] * stride_row + cols[None, :]
    rows = tl.load(cache_ptr + src, mask=mask)
    if BUG == GATHER_OUT_N_COLS_APART:
        tl.store(out_ptr + tokens[:, None] * n_cols + cols[None, :], rows, mask=mask)
    else:
        tl.store(out_ptr + tokens[:, None] * stride_out + cols[None, :], rows, mask=mask)


@triton.jit
def gather_table_ignored(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                         PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Uses the logical page t // PAGE as the physical page: never reads the page table."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    BLOCK_T, BLOCK_D, GATHER_TABLE_IGNORED)


@triton.jit
def gather_block_t_fixed(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                         PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Tiles the tokens by a number of its own (8, the default block_t), not by its BLOCK_T argument."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    FIXED_BLOCK_T, BLOCK_D, GATHER_RIGHT)


@triton.jit
def gather_columns_unmasked(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                            PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Masks the tokens but not the columns: all BLOCK_D lanes of each row are read and written."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    BLOCK_T, BLOCK_D, GATHER_COLUMNS_UNMASKED)


@triton.jit
def gather_ignores_cache_strides(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                                 PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Addresses the cache as if contiguous: page * PAGE * n_cols + row * n_cols, not its strides."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    BLOCK_T, BLOCK_D, GATHER_CONTIGUOUS_CACHE)


@triton.jit
def gather_page_and_row_swapped(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                                PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Looks up page table[t % PAGE] and row t // PAGE: the quotient and the remainder swapped."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    BLOCK_T, BLOCK_D, GATHER_PAGE_ROW_SWAPPED)


@triton.jit
def gather_out_rows_n_cols_apart(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                                 PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Stores token t at out_ptr + t * n_cols, as if out were contiguous, not t * stride_out."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    BLOCK_T, BLOCK_D, GATHER_OUT_N_COLS_APART)


@triton.jit
def gather_page_stride_from_rows(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                                 PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Takes page p to start at p * PAGE * stride_row (pages back to back), not at p * stride_page."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    BLOCK_T, BLOCK_D, GATHER_PAGE_STRIDE_FROM_ROWS)


@triton.jit
def gather_offsets_in_int32(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                            PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Keeps the page id int32 (no .to(tl.int64)): page * stride_page wraps past 2**31 - 1 elements."""
    _gather_variant(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out, PAGE,
                    BLOCK_T, BLOCK_D, GATHER_OFFSETS_INT32)


@triton.jit
def matmul_k_tail_unmasked(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                           stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Masks rows and columns but not k < K: the last K tile reads past the end of A's rows and B."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn, mask=mask_n[None, :], other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_last_tile_dropped(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                             stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Loops k0 over range(0, K // BLOCK_K * BLOCK_K, BLOCK_K): the partial tile at the end of K is skipped."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K // BLOCK_K * BLOCK_K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_half_accumulator(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                            stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Accumulates in C's dtype: the running sum is rounded to fp16 after every K tile."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=c_ptr.dtype.element_ty)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc = (acc + tl.dot(a, b)).to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_tile_rounded(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                        stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += tl.dot(a, b).to(C's dtype) (or tl.dot(..., out_dtype=a.dtype)): each K tile's product is rounded
    to fp16 before it is added to the fp32 accumulator."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b).to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_acc_in_c_dtype(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                          stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.zeros(..., dtype=c_ptr.dtype.element_ty) with acc += tl.dot(a, b): the interpreter promotes acc
    to fp32 at the first tile (the result is right there); Triton's GPU compiler refuses a loop-carried
    variable that changes type."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=c_ptr.dtype.element_ty)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _matmul_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A_CONTIGUOUS: tl.constexpr,
                    B_CONTIGUOUS: tl.constexpr, SWAP_PROGRAM_IDS: tl.constexpr, OVERWRITE: tl.constexpr,
                    C_CONTIGUOUS: tl.constexpr = False):
    """The right matmul, with one of its details changed (see the wrappers below)."""
    if SWAP_PROGRAM_IDS:
        pid_m, pid_n = tl.program_id(1), tl.program_id(0)
    else:
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        if A_CONTIGUOUS:
            a_offsets = offs_m[:, None] * K + k[None, :]
        else:
            a_offsets = offs_m[:, None] * stride_am + k[None, :] * stride_ak
        if B_CONTIGUOUS:
            b_offsets = k[:, None] * N + offs_n[None, :]
        else:
            b_offsets = k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        a = tl.load(a_ptr + a_offsets, mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + b_offsets, mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        if OVERWRITE:
            acc = tl.dot(a, b)
        else:
            acc += tl.dot(a, b)
    if C_CONTIGUOUS:  # (the bug: C's element (i, j) at i * N + j)
        c_offsets = offs_m[:, None] * N + offs_n[None, :]
    else:
        c_offsets = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptr + c_offsets, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_c_assumed_contiguous(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                                stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Stores C as if contiguous, element (i, j) at i * N + j: ignores stride_cm and stride_cn."""
    _matmul_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M, BLOCK_N, BLOCK_K, False, False, False, False, True)


@triton.jit
def matmul_a_assumed_contiguous(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                                stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Addresses A as if contiguous, element (i, k) at i * K + k: ignores stride_am and stride_ak."""
    _matmul_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M, BLOCK_N, BLOCK_K, True, False, False, False)


@triton.jit
def matmul_b_assumed_contiguous(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                                stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Addresses B as if contiguous, element (k, j) at k * N + j: ignores stride_bk and stride_bn."""
    _matmul_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M, BLOCK_N, BLOCK_K, False, True, False, False)


@triton.jit
def matmul_program_ids_swapped(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                               stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """pid_m = tl.program_id(1), pid_n = tl.program_id(0): the grid is (row tiles, column tiles)."""
    _matmul_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M, BLOCK_N, BLOCK_K, False, False, True, False)


@triton.jit
def matmul_acc_overwritten(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                           stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.dot(a, b) instead of acc += ...: only the last K tile survives."""
    _matmul_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M, BLOCK_N, BLOCK_K, False, False, False, True)


# fp16 accumulation, spelled the ways students write it. The two that the GPU compiler refuses are written out whole:
# test_compiles.py compares the compiler's last line, and an error inside a helper ends in its source's caret line.
# The sums of fp16 products (no tl.dot) are interpreted only: compiled for a GPU, Triton's passes fail on an fp16 sum
# of a [BLOCK_M, BLOCK_K, BLOCK_N] product ("PassManager::run failed", which says nothing of the bug, and other
# kernels end in it too), so there they compute tl.dot instead and compile, and the compile test names no bug for it.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


@triton.jit
def matmul_acc_zeros_fp16(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                          stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.zeros(..., dtype=tl.float16) with acc += tl.dot(a, b): the interpreter promotes acc to fp32 at the
    first tile (the result is right there); Triton's GPU compiler refuses a loop-carried variable that changes type
    (for fp32 inputs and fp16 ones alike)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float16)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_dot_out_fp16(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                        stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.zeros(..., dtype=tl.float16) with acc += tl.dot(a, b, out_dtype=tl.float16): for fp16 inputs each
    tile's product and the running sum are fp16 (a true half-precision accumulator); for fp32 ones tl.dot ignores
    out_dtype, and acc becomes fp32 at the first tile (right in the interpreter, refused by the compiler)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float16)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b, out_dtype=tl.float16)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_dot_acc_out_fp16(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                            stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.zeros(..., dtype=tl.float16) with acc = tl.dot(a, b, acc, out_dtype=tl.float16): fp16 tiles accumulate
    in fp16; fp32 tiles make tl.dot return fp32 whatever out_dtype says, so the second tile's acc is fp32 and Triton's
    interpreter fails its check that acc's dtype is out_dtype (a bare AssertionError). Written out whole, as a
    student writes it: an error raised in a helper kernel reaches the test wrapped once more."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float16)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=tl.float16)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_dot_acc_fp16(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                        stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.zeros(..., dtype=tl.float16) with acc = tl.dot(a, b, acc): tl.dot accumulates in its out_dtype,
    fp32 by default, and refuses an fp16 acc at the first tile (the same bare AssertionError), fp16 tiles or fp32.
    Written out whole (see above)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float16)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _matmul_fp16_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         HOW: tl.constexpr):
    """The right matmul but for how it accumulates: HOW names the wrong spelling (see the wrappers below)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    if HOW == "fp16_acc" or HOW == "fp16_acc_fp16_tiles" or HOW == "fp16_products":
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float16)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        if HOW == "tile_to_fp16" or HOW == "fp16_acc_fp16_tiles":
            acc += tl.dot(a, b).to(tl.float16)
        elif HOW == "acc_to_fp16":
            acc = acc.to(tl.float16) + tl.dot(a, b)
        elif HOW == "fp16_acc":
            acc = (acc + tl.dot(a, b)).to(tl.float16)
        elif INTERPRETED:  # "fp16_products", "fp16_tile_sums": no tl.dot, a sum of the tiles' products in fp16
            acc += tl.sum(a.to(tl.float16)[:, :, None] * b.to(tl.float16)[None, :, :], axis=1)
        else:  # (compiled for a GPU by test_compiles.py: see INTERPRETED)
            acc += tl.dot(a, b).to(acc.dtype)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_tile_to_fp16(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                        stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += tl.dot(a, b).to(tl.float16): each tile's product rounded to fp16, whatever C's dtype (fp32 too)."""
    _matmul_fp16_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, "tile_to_fp16")


@triton.jit
def matmul_acc_to_fp16(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                       stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = acc.to(tl.float16) + tl.dot(a, b): the running sum rounded to fp16 before each tile is added."""
    _matmul_fp16_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, "acc_to_fp16")


@triton.jit
def matmul_fp16_acc(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                    stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.zeros(..., dtype=tl.float16), acc = (acc + tl.dot(a, b)).to(tl.float16): an fp16 running sum,
    whatever C's dtype (fp32 too)."""
    _matmul_fp16_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, "fp16_acc")


@triton.jit
def matmul_fp16_acc_fp16_tiles(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                               stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = tl.zeros(..., dtype=tl.float16) with acc += tl.dot(a, b).to(tl.float16) (what makes the compiler accept
    an fp16 acc): each tile's product and the running sum rounded to fp16, whatever C's dtype."""
    _matmul_fp16_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, "fp16_acc_fp16_tiles")


@triton.jit
def matmul_fp16_products(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """No tl.dot: acc (fp16) += tl.sum(a.to(tl.float16)[:, :, None] * b.to(tl.float16)[None, :, :], axis=1)."""
    _matmul_fp16_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, "fp16_products")


@triton.jit
def matmul_fp16_tile_sums(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                          stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """No tl.dot: acc (fp32) += tl.sum(a.to(tl.float16)[:, :, None] * b.to(tl.float16)[None, :, :], axis=1)."""
    _matmul_fp16_variant(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, "fp16_tile_sums")


@triton.jit
def _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, RESCALE_SUM: tl.constexpr,
                            RESCALE_ACC: tl.constexpr, PAD_SCORE: tl.constexpr, ALPHA_INVERTED: tl.constexpr,
                            KEEP_MAX: tl.constexpr, DIVIDE: tl.constexpr, SCORES_CONTIGUOUS: tl.constexpr,
                            MAX_FROM_ZERO: tl.constexpr = False, OUT_CONTIGUOUS: tl.constexpr = False):
    """The right online softmax, with one of its details switched off (see the wrappers below)."""
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    if MAX_FROM_ZERO:  # the running max starts at 0: scores far below 0 then underflow exp(s - 0) to 0
        m = tl.full([], 0.0, tl.float32)
    else:
        m = tl.full([], float("-inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n_keys, BLOCK_N):
        keys = n0 + offs_n
        mask_n = keys < n_keys
        if SCORES_CONTIGUOUS:
            s = tl.load(scores_ptr + row * n_keys + keys, mask=mask_n, other=PAD_SCORE).to(tl.float32)
        else:
            s = tl.load(scores_ptr + row * stride_s + keys, mask=mask_n, other=PAD_SCORE).to(tl.float32)
        v = tl.load(values_ptr + keys[:, None] * stride_v + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        if ALPHA_INVERTED:
            alpha = tl.exp(m_new - m)
        else:
            alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        if RESCALE_SUM:
            l = l * alpha + tl.sum(p, axis=0)  # noqa: E741
        else:
            l = l + tl.sum(p, axis=0)  # noqa: E741
        if RESCALE_ACC:
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        else:
            acc = acc + tl.sum(p[:, None] * v, axis=0)
        if KEEP_MAX:
            m = m_new
    if DIVIDE:
        acc = acc / l
    if OUT_CONTIGUOUS:  # (the bug: output rows head_dim apart)
        tl.store(out_ptr + row * head_dim + offs_d, acc.to(out_ptr.dtype.element_ty), mask=mask_d)
    else:
        tl.store(out_ptr + row * stride_out + offs_d, acc.to(out_ptr.dtype.element_ty), mask=mask_d)


@triton.jit
def online_sum_not_rescaled(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """l = l + sum(p): the running sum is not rescaled by exp(m - m_new) when the max grows."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, False, True, float("-inf"), False, True, True, False)


@triton.jit
def online_acc_not_rescaled(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """acc = acc + sum(p * v): the weighted sum is not rescaled by exp(m - m_new) when the max grows."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, False, float("-inf"), False, True, True, False)


@triton.jit
def online_max_starts_at_zero(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """m = 0.0 at the start instead of -inf: the max never drops below 0."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, True, float("-inf"), False, True, True, False, True)


@triton.jit
def online_out_rows_head_dim_apart(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Stores output row r at out_ptr + r * head_dim, as if the output were contiguous."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, True, float("-inf"), False, True, True, False, False, True)


@triton.jit
def online_nothing_rescaled(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Sets m = m_new before alpha = exp(m - m_new), which is then 1: neither l nor acc is rescaled."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, False, False, float("-inf"), False, True, True, False)


@triton.jit
def online_pad_as_zero(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Loads the scores past n_keys as 0.0: the padded keys add exp(0 - m) to the running sum."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, True, 0.0, False, True, True, False)


@triton.jit
def online_alpha_inverted(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """alpha = exp(m_new - m): the rescale factor inverted (and exp(+inf) on the first tile)."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, True, float("-inf"), True, True, True, False)


@triton.jit
def online_max_not_kept(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Never sets m = m_new after a tile: m stays -inf, alpha = 0 and every tile wipes the ones before."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, True, float("-inf"), False, False, True, False)


@triton.jit
def online_without_final_division(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Stores acc itself: never divides by the running sum l at the end."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, True, float("-inf"), False, True, False, False)


@triton.jit
def online_scores_rows_n_keys_apart(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Finds row r of the scores at r * n_keys, as if they were contiguous, not r * stride_s."""
    _online_softmax_variant(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                            BLOCK_N, BLOCK_D, True, True, float("-inf"), False, True, True, True)


FIXED_ONLINE_TILE = tl.constexpr(16)  # online_tile_fixed's keys per tile: the graded tests' first block_n, written in


@triton.jit
def _online_softmax_v2(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BUG: tl.constexpr):
    """The right online softmax with the detail BUG names changed (see the wrappers below; 0: none)."""
    row = tl.program_id(0).to(tl.int64)
    if BUG == 3:  # keys tiled by a number of its own
        offs_n = tl.arange(0, FIXED_ONLINE_TILE)
    else:
        offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n_keys, BLOCK_N):
        keys = n0 + offs_n
        mask_n = keys < n_keys
        s = tl.load(scores_ptr + row * stride_s + keys, mask=mask_n, other=float("-inf")).to(tl.float32)
        v = tl.load(values_ptr + keys.to(tl.int64)[:, None] * stride_v + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        if BUG == 1:  # the tile's own max, not the running one
            m_new = tl.max(s, axis=0)
        else:
            m_new = tl.maximum(m, tl.max(s, axis=0))
        if BUG == 2:  # no max subtracted at all
            p = tl.exp(s)
            l = l + tl.sum(p, axis=0)  # noqa: E741
            acc = acc + tl.sum(p[:, None] * v, axis=0)
        else:
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            l = l * alpha + tl.sum(p, axis=0)  # noqa: E741
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
    tl.store(out_ptr + row * stride_out + offs_d, (acc / l).to(out_ptr.dtype.element_ty), mask=mask_d)


@triton.jit
def online_tile_max(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """m_new = tl.max(s, axis=0): the tile's own max replaces the running max (a lower tile lowers it)."""
    _online_softmax_v2(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out, BLOCK_N,
                       BLOCK_D, 1)


@triton.jit
def online_without_max(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """p = tl.exp(s), l += sum(p), acc += sum(p * v): no max is subtracted (nothing to rescale)."""
    _online_softmax_v2(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out, BLOCK_N,
                       BLOCK_D, 2)


@triton.jit
def online_tile_fixed(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """keys = n0 + tl.arange(0, 16) while the loop steps by BLOCK_N: with BLOCK_N > 16 keys are skipped."""
    _online_softmax_v2(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out, BLOCK_N,
                       BLOCK_D, 3)


@triton.jit
def online_sum_starts_as_int(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """l = 0 (an int) at the start: the interpreter makes it a float at the first tile (the result is right
    there); Triton's GPU compiler refuses a loop-carried variable that changes type."""
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    m = tl.full([], float("-inf"), tl.float32)
    l = 0  # noqa: E741
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n_keys, BLOCK_N):
        keys = n0 + offs_n
        mask_n = keys < n_keys
        s = tl.load(scores_ptr + row * stride_s + keys, mask=mask_n, other=float("-inf")).to(tl.float32)
        v = tl.load(values_ptr + keys.to(tl.int64)[:, None] * stride_v + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)  # noqa: E741
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + row * stride_out + offs_d, (acc / l).to(out_ptr.dtype.element_ty), mask=mask_d)


# ---- 2.12 the Triton kernel ----------------------------------------------------------------------
@triton.jit
def kernel_store_unmasked(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                          stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores all BLOCK_N lanes: no mask on the two stores (loads are masked)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype)
        tl.store(residual_out_ptr + row * n_cols + cols, h)
        h = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (h * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * n_cols + cols, out.to(dtype))


@triton.jit
def kernel_mean_over_block(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                           stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Divides the sum of squares by BLOCK_N instead of n_cols."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype)
        tl.store(residual_out_ptr + row * n_cols + cols, h, mask=mask)
        h = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / BLOCK_N + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (h * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * n_cols + cols, out.to(dtype), mask=mask)


@triton.jit
def kernel_input_dtype_math(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                            stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Computes in the inputs' dtype: no .to(tl.float32) after the loads."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        h = h + r
        tl.store(residual_out_ptr + row * n_cols + cols, h, mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, h * rstd * w, mask=mask)


@triton.jit
def kernel_residual_out_is_x(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                             stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores x, as loaded, into residual_out instead of x + residual."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        tl.store(residual_out_ptr + row * n_cols + cols, h.to(dtype), mask=mask)
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (h * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * n_cols + cols, out.to(dtype), mask=mask)


@triton.jit
def _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, WITH_EPS: tl.constexpr,
                        WEIGHT_BEFORE_ROUND: tl.constexpr, SUM_ROUNDED: tl.constexpr, OUT_AT_X_STRIDE: tl.constexpr,
                        RESIDUAL_AT_X_STRIDE: tl.constexpr, EPS_OUTSIDE: tl.constexpr = False,
                        RESIDUAL_OUT_ALWAYS: tl.constexpr = False):
    """The right add+RMSNorm kernel, with one of its details changed (see the wrappers below)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    out_stride = stride_x if OUT_AT_X_STRIDE else n_cols
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r_stride = stride_x if RESIDUAL_AT_X_STRIDE else stride_residual
        r = tl.load(residual_ptr + row * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
        h = h + r
        if not RESIDUAL_OUT_ALWAYS:
            tl.store(residual_out_ptr + row * out_stride + cols, h.to(dtype), mask=mask)
        if SUM_ROUNDED:
            h = h.to(dtype).to(tl.float32)
    if EPS_OUTSIDE:  # rsqrt(mean) + eps
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols) + eps
    elif WITH_EPS:
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    else:
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_BEFORE_ROUND:
        out = h * rstd * w
    else:
        out = (h * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * out_stride + cols, out.to(dtype), mask=mask)
    if RESIDUAL_OUT_ALWAYS:  # the new residual stored last, with or without a residual (then it is h = x)
        tl.store(residual_out_ptr + row * out_stride + cols, h.to(dtype), mask=mask)


@triton.jit
def kernel_eps_outside_rsqrt(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                             stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """rstd = rsqrt(mean(h**2)) + eps: eps added after the rsqrt, not under it."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, True, False, True, False, False, True, False)


@triton.jit
def kernel_residual_out_always(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                               stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores residual_out after out, whether or not there is a residual."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, True, False, True, False, False, False, True)


@triton.jit
def kernel_without_eps(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                       eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """rstd = rsqrt(mean(h**2)): eps never added."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, False, False, True, False, False)


@triton.jit
def kernel_weight_before_round(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                               stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """out = h * rstd * w in fp32, rounded once at the store: the normalized row is not rounded first."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, True, True, True, False, False)


@triton.jit
def kernel_sum_not_rounded(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                           stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores h = x + residual rounded, but normalizes the fp32 sum: the statistics see another h than torch."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, True, False, False, False, False)


@triton.jit
def kernel_rounds_only_at_the_stores(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                                     stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Neither rounding point: the fp32 sum is normalized and h * rstd * w rounded once, at the store."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, True, True, False, False, False)


@triton.jit
def kernel_out_at_x_stride(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                           stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores row r of both outputs at r * stride_x (the input's row stride), not r * n_cols."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, True, False, True, True, False)


@triton.jit
def kernel_residual_at_x_stride(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x,
                                stride_residual, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Reads row r of the residual at r * stride_x: x's row stride used for the residual too."""
    _rms_kernel_variant(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, n_cols, stride_x, stride_residual,
                        eps, HAS_RESIDUAL, BLOCK_N, True, False, True, False, True)


def launcher_of(kernel):
    """The given launcher rms_norm_triton, running `kernel` in place of add_rms_norm_kernel (what a
    student's exercises/ch2.py does: its copy of the launcher calls the student's kernel)."""
    given = rmsnorm_kernels.rms_norm_triton
    return types.FunctionType(given.__code__, {**given.__globals__, "add_rms_norm_kernel": kernel},
                              given.__name__, given.__defaults__)


NORM = "test_ch2.py::test_rms_norm_matches_qwen3_rmsnorm"
ADD_NORM = "test_ch2.py::test_add_rms_norm_matches_qwen3_rmsnorm_of_the_sum"
MIXED_NORM = "test_ch2.py::test_rms_norm_of_mixed_dtypes_matches_qwen3_rmsnorm"
MIXED_ADD = "test_ch2.py::test_add_rms_norm_of_mixed_dtypes_adds_as_torch"
ROTARY = "test_ch2.py::test_apply_rotary_on_a_packed_batch_matches_transformers"
PREFILL_ATTN = "test_ch2.py::test_causal_attention_prefill_matches_sdpa"
MLP = "test_ch2.py::test_silu_and_mul_makes_qwen3_mlp"
LAYER = "test_ch2.py::test_decoder_layer_on_a_packed_batch_matches_qwen3_decoder_layer"
TRITON_NORM = "test_ch2.py::test_triton_add_rms_norm_matches_qwen3_rmsnorm"
PRIMER = "test_ch2_primer.py::"
ADD_GUARDED = PRIMER + "test_vector_add_writes_only_its_n_elements"
ADD = PRIMER + "test_vector_add_matches_torch"
ADD_READS = PRIMER + "test_vector_add_reads_only_its_n_elements"
SOFTMAX_GUARDED = PRIMER + "test_softmax_of_strided_rows_writes_only_its_rows"
SOFTMAX = PRIMER + "test_softmax_rows_matches_torch"
GATHER_GUARDED = PRIMER + "test_gather_from_a_strided_cache_writes_only_its_tokens"
GATHER = PRIMER + "test_gather_pages_matches_torch_indexing"
MATMUL_GUARDED = PRIMER + "test_matmul_of_odd_shapes_writes_only_its_tiles"
ONLINE = PRIMER + "test_softmax_weighted_sum_matches_torch"

MISTAKES: list[Mistake] = [
    Mistake("ch2_rms_norm_no_fp32_upcast", "2.1", {"rms_norm": rms_norm_in_input_dtype},
            "rms_norm's statistics pass through the input's dtype: in fp16, x**2 (or their fp32 mean cast back "
            "to x.dtype) overflows once |x| > 256 (and bf16 loses precision); keep the squares, their mean and "
            "rsqrt on x.float(), and cast only the normalized x back to x.dtype before multiplying by weight",
            "test_ch2.py::test_rms_norm_fp16_large_activations"),
    Mistake("ch2_rms_norm_eps_outside_sqrt", "2.1", {"rms_norm": rms_norm_eps_outside_sqrt},
            "eps is added outside the square root: divide by sqrt(mean(x**2) + eps), i.e. multiply by "
            "torch.rsqrt(mean + eps)", "test_ch2.py::test_rms_norm_uses_eps"),
    Mistake("ch2_rms_norm_eps_after_rsqrt", "2.1", {"rms_norm": rms_norm_eps_after_rsqrt},
            "eps is added after the reciprocal root (torch.rsqrt(mean) + eps): it belongs inside, "
            "torch.rsqrt(mean(x**2) + eps)", "test_ch2.py::test_rms_norm_uses_eps"),
    Mistake("ch2_rms_norm_sum_not_mean", "2.1", {"rms_norm": rms_norm_sum_not_mean},
            "rms_norm divides by the root of the SUM of squares (the L2 norm): RMS is the root of their MEAN, "
            "x.pow(2).mean(dim=-1, keepdim=True)", NORM, {"shape": (18, 64)}),
    Mistake("ch2_rms_norm_scales_x_in_place", "2.1", {"rms_norm": rms_norm_scales_x_in_place},
            "rms_norm writes into its input: for an fp32 x, x.float() is x itself, so x.mul_(...) (or x *= ...) "
            "normalizes the caller's tensor in place; write x = x * torch.rsqrt(...), a new tensor", NORM,
            {"shape": (18, 64)}),
    Mistake("ch2_rms_norm_weight_before_cast", "2.1", {"rms_norm": rms_norm_weight_before_cast},
            "rms_norm multiplies by weight in fp32 and casts to x.dtype only at the end, so bf16 rounds once where "
            "transformers rounds twice (the last bit differs on about a quarter of the values): cast the normalized "
            "x back to x.dtype first, then multiply it by weight",
            "test_ch2.py::test_rms_norm_bf16_keeps_dtype_and_matches"),
    Mistake("ch2_rms_norm_mean_over_everything", "2.1", {"rms_norm": rms_norm_mean_over_everything},
            "rms_norm takes one mean square over the whole tensor (x.pow(2).mean() without a dim): each row (each "
            "token, each head) has its own RMS, so x.pow(2).mean(dim=-1, keepdim=True)", NORM, {"shape": (18, 64)}),
    Mistake("ch2_rms_norm_mean_over_dim_1", "2.1", {"rms_norm": rms_norm_mean_over_dim_1},
            "rms_norm means over dim=1: that is the hidden dimension of a [tokens, hidden] input only; rms_norm also "
            "normalizes each head of [tokens, heads, head_dim] (QK-norm), whose last dimension is the one to "
            "average: x.pow(2).mean(dim=-1, keepdim=True)", NORM, {"shape": (18, 4, 16)}),
    Mistake("ch2_rms_norm_centered", "2.1", {"rms_norm": rms_norm_centered},
            "rms_norm subtracts the row's mean first, as LayerNorm does: RMSNorm does not center, it divides x "
            "itself by sqrt(mean(x**2) + eps) (and has no bias)", NORM, {"shape": (18, 64)}),
    Mistake("ch2_rms_norm_without_eps", "2.1", {"rms_norm": rms_norm_without_eps},
            "rms_norm never adds eps: multiply by torch.rsqrt(mean(x**2) + eps), which also keeps an all-zero row "
            "from dividing by zero", "test_ch2.py::test_rms_norm_uses_eps"),
    Mistake("ch2_rms_norm_in_weight_dtype", "2.1", {"rms_norm": rms_norm_in_weight_dtype},
            "rms_norm casts the normalized x to weight.dtype: cast it back to x.dtype (the input's), then multiply by "
            "the weight, as transformers' Qwen3RMSNorm does: the result's dtype is then torch's promotion of the two "
            "(fp32 when either is fp32)", MIXED_NORM, {"dtypes": ("float32", "bfloat16")}),
    Mistake("ch2_rms_norm_result_in_x_dtype", "2.1", {"rms_norm": rms_norm_result_in_x_dtype},
            "rms_norm casts its result to x.dtype: Qwen3RMSNorm returns weight * (normalized x, cast to x.dtype) as "
            "torch multiplies them, so fp32 weights over bf16 x give fp32 (torch's promotion); drop the last cast",
            MIXED_NORM, {"dtypes": ("bfloat16", "float32")}),
    Mistake("ch2_rms_norm_weight_in_x_dtype", "2.1", {"rms_norm": rms_norm_weight_in_x_dtype},
            "rms_norm casts the weight to x.dtype (weight.to(x.dtype)): fp32 weights over bf16 x are rounded to bf16 "
            "and the result is bf16. Multiply the weight as it is by the normalized x cast to x.dtype: torch's "
            "promotion gives fp32 when either is fp32", MIXED_NORM, {"dtypes": ("bfloat16", "float32")}),
    Mistake("ch2_rms_norm_mean_without_keepdim", "2.1", {"rms_norm": rms_norm_mean_without_keepdim},
            "the mean square is taken without keepdim=True: x.pow(2).mean(dim=-1) is [N], not [N, 1], so "
            "multiplying x [N, D] by it broadcasts against the LAST dimension (an error here, a silently wrong "
            "result where N == D): x.pow(2).mean(dim=-1, keepdim=True)", NORM, {"shape": (18, 64)}),
    Mistake("ch2_add_rms_norm_sum_in_residual_dtype", "2.2", {"add_rms_norm": add_rms_norm_sum_in_residual_dtype},
            "add_rms_norm casts the sum to the residual's dtype: x + residual as torch adds it (its type promotion: "
            "fp32 when either is fp32), as the unfused `residual + hidden` gives it; no cast",
            MIXED_ADD, {"dtypes": ("float32", "bfloat16")}),
    Mistake("ch2_add_rms_norm_sum_in_x_dtype", "2.2", {"add_rms_norm": add_rms_norm_sum_in_x_dtype},
            "add_rms_norm casts the sum to x's dtype ((x + residual).to(x.dtype)): bf16 x on an fp32 residual stream "
            "drops the stream to bf16. Keep x + residual as torch adds it (fp32 when either is fp32); no cast",
            MIXED_ADD, {"dtypes": ("bfloat16", "float32")}),
    Mistake("ch2_add_rms_norm_returns_normed_twice", "2.2", {"add_rms_norm": add_rms_norm_returns_normed_twice},
            "add_rms_norm returns the normalized sum twice: the second output is the new residual itself, x + "
            "residual un-normalized, the stream the next block adds to", ADD_NORM),
    Mistake("ch2_add_rms_norm_returns_old_residual", "2.2", {"add_rms_norm": add_rms_norm_returns_old_residual},
            "add_rms_norm returns the residual it was given: return the new residual x + residual, the "
            "stream the next block adds to", ADD_NORM),
    Mistake("ch2_add_rms_norm_of_x_only", "2.2", {"add_rms_norm": add_rms_norm_of_x_only},
            "add_rms_norm normalizes x alone: normalize the sum x + residual (normed = rms_norm(new_residual, "
            "...))", ADD_NORM),
    Mistake("ch2_add_rms_norm_of_residual_only", "2.2", {"add_rms_norm": add_rms_norm_of_residual_only},
            "add_rms_norm normalizes the residual it was given (rms_norm(residual, ...) before the add): the new "
            "residual it returns is right, but the norm is of the old stream. Add first, then normalize the sum: "
            "residual = x + residual, normed = rms_norm(residual, weight, eps)", ADD_NORM),
    Mistake("ch2_add_rms_norm_in_place", "2.2", {"add_rms_norm": add_rms_norm_in_place},
            "add_rms_norm adds into the caller's residual tensor in place (residual += x or add_): write "
            "residual = x + residual, a new tensor, so the caller's inputs stay as they were",
            "test_ch2.py::test_add_rms_norm_leaves_its_inputs_alone"),
    Mistake("ch2_add_rms_norm_sum_in_fp32", "2.2", {"add_rms_norm": add_rms_norm_sum_in_fp32},
            "add_rms_norm returns the new residual in fp32 (x.float() + residual.float()): the residual stream stays "
            "in x.dtype, as the unfused `residual + hidden` keeps it, so add x + residual in their own dtype; only "
            "rms_norm's statistics run in fp32",
            "test_ch2.py::test_add_rms_norm_bf16_keeps_the_stream_in_bf16"),
    Mistake("ch2_add_rms_norm_normalizes_the_fp32_sum", "2.2", {"add_rms_norm": add_rms_norm_normalizes_the_fp32_sum},
            "the norm reads the unrounded fp32 sum (x.float() + residual.float()), not the new residual it returns: "
            "in bf16 the two differ, and so does the rounding after. Compute residual = x + residual in x.dtype "
            "first, then normed = rms_norm(residual, ...): the norm of exactly the stream you return",
            "test_ch2.py::test_add_rms_norm_bf16_keeps_the_stream_in_bf16"),
    Mistake("ch2_add_rms_norm_fixed_eps", "2.2", {"add_rms_norm": add_rms_norm_fixed_eps},
            "add_rms_norm normalizes with eps = 1e-6 written in: each model brings its own rms_norm_eps (Llama 3 and "
            "SmolLM2 1e-5); pass the eps argument to rms_norm",
            "test_ch2.py::test_add_rms_norm_uses_eps"),
    Mistake("ch2_add_rms_norm_outputs_swapped", "2.2", {"add_rms_norm": add_rms_norm_outputs_swapped},
            "add_rms_norm returns (new_residual, normed): the order is (normed, new_residual), as "
            "apply_rms_norm and the decoder layer unpack it", ADD_NORM),
    Mistake("ch2_rope_exponent_halved", "2.3", {"rope_cos_sin": rope_cos_sin_exponent_halved},
            "rope_cos_sin's frequencies use base ** (-j / d): the exponent is -2j / d for j < d/2, i.e. "
            "torch.arange(0, d, 2) / d", "test_ch2.py::test_rope_cos_sin_matches_qwen3_rotary_embedding",
            {"theta": 10000.0}),
    Mistake("ch2_rope_cos_sin_in_fp64", "2.3", {"rope_cos_sin": rope_cos_sin_in_fp64},
            "the angles are computed in fp64 and cast at the end: transformers computes them in fp32, so at Qwen3's "
            "4,096 positions the table differs from its by up to 3e-4 (3e-3 at 40,960), and the model's logits "
            "from transformers'. Follow its recipe in fp32: inv_freq = 1.0 / (base ** (torch.arange(0, d, "
            "2).float() / d)), angles = positions (fp32) x inv_freq",
            "test_ch2.py::test_rope_cos_sin_has_transformers_angles_at_qwen3s_shape"),
    Mistake("ch2_rope_cos_sin_from_position_1", "2.3", {"rope_cos_sin": rope_cos_sin_from_position_1},
            "row p of the table holds position p + 1's rotation (positions counted from 1, torch.arange(1, P + 1)): "
            "positions start at 0, so row 0 is cos 1 | sin 0, and the angles are torch.arange(P) x inv_freq",
            "test_ch2.py::test_rope_cos_sin_matches_qwen3_rotary_embedding", {"theta": 10000.0}),
    Mistake("ch2_rope_negative_power", "2.3", {"rope_cos_sin": rope_cos_sin_negative_power},
            "inv_freq is base ** (-2j / d): the same number as transformers' 1.0 / base ** (2j / d), but rounded "
            "differently in fp32, and at 4,096 positions an angle's error grows 4,096-fold (the table differs by up "
            "to 2.4e-4). Write it as transformers does: 1.0 / (base ** (torch.arange(0, d, 2).float() / d))",
            "test_ch2.py::test_rope_cos_sin_has_transformers_angles_at_qwen3s_shape"),
    Mistake("ch2_rope_inv_freq_not_inverted", "2.3", {"rope_cos_sin": rope_cos_sin_not_inverted},
            "rope_cos_sin's frequencies are base ** (2j / d), which grow with j: theta_j = base ** (-2j / d), i.e. "
            "inv_freq = 1.0 / base ** (torch.arange(0, d, 2) / d)",
            "test_ch2.py::test_rope_cos_sin_matches_qwen3_rotary_embedding", {"theta": 10000.0}),
    Mistake("ch2_rope_cos_sin_transformers_layout", "2.3", {"rope_cos_sin": rope_cos_sin_transformers_layout},
            "rope_cos_sin returns transformers' layout, [cos(emb) | sin(emb)] with emb = torch.cat([angles, angles]): "
            "a [P, 2d] table, each angle twice in cos and twice in sin. The cache is [P, d]: the d/2 cosines, then "
            "the d/2 sines, each angle once: torch.cat([angles.cos(), angles.sin()], dim=-1) of the [P, d/2] angles "
            "(apply_rotary uses each column for both halves of x)",
            "test_ch2.py::test_rope_cos_sin_matches_qwen3_rotary_embedding", {"theta": 10000.0}),
    Mistake("ch2_rope_sign_flipped", "2.3", {"apply_rotary": apply_rotary_sign_flipped},
            "apply_rotary rotates by -angle: the first half is x1 * cos - x2 * sin and the second half "
            "x2 * cos + x1 * sin (check which term carries the minus sign)", ROTARY, {"offsets": (0, 0, 0, 0)}),
    Mistake("ch2_rope_interleaved_pairs", "2.3", {"apply_rotary": apply_rotary_interleaved},
            "apply_rotary rotates interleaved pairs (x[0], x[1]), (x[2], x[3]), ... (the GPT-J layout): Qwen "
            "and Llama pair dimension j with j + d/2, so split x into its two halves with x.chunk(2, dim=-1)",
            ROTARY, {"offsets": (0, 0, 0, 0)}),
    Mistake("ch2_rope_pair_frequencies_on_halves", "2.3", {"apply_rotary": apply_rotary_pair_frequencies_on_halves},
            "apply_rotary widens cos and sin to d with repeat_interleave(2) (c0 c0 c1 c1 ..., each frequency for a "
            "GPT-J pair of neighbours) but rotates the two halves (x * cos + rotate_half(x) * sin): element j then "
            "turns at frequency j // 2, and x[j], x[j + d/2] no longer share an angle. In the neox layout they share "
            "frequency j mod d/2: repeat the halves whole, torch.cat([cos, cos], dim=-1) (and sin), or use the d/2 "
            "columns as they are, [x1 * cos - x2 * sin | x2 * cos + x1 * sin]", ROTARY, {"offsets": (0, 0, 0, 0)}),
    Mistake("ch2_rope_ignores_positions", "2.3", {"apply_rotary": apply_rotary_ignoring_positions},
            "apply_rotary takes cache row i for the i-th token of the batch: index the cache with the "
            "tokens' positions (cos_sin[positions]), which restart at each sequence and skip a cached prefix",
            ROTARY, {"offsets": (7, 100, 0, 300)}),
    Mistake("ch2_rope_positions_from_the_first", "2.3", {"apply_rotary": apply_rotary_positions_from_the_first},
            "apply_rotary counts positions from the batch's first token (positions - positions[0]): a token's "
            "position is its place in its own sequence, cached prefix included, which positions already holds; "
            "index the cache with it as it is, cos_sin[positions]", ROTARY, {"offsets": (7, 100, 0, 300)}),
    Mistake("ch2_rope_cos_sin_swapped", "2.3", {"apply_rotary": apply_rotary_cos_sin_swapped},
            "apply_rotary reads the cache row as [sin | cos]: rope_cos_sin stores [cos | sin], so "
            "cos, sin = cos_sin[positions].chunk(2, dim=-1), in that order", ROTARY, {"offsets": (0, 0, 0, 0)}),
    Mistake("ch2_rope_second_half_sign", "2.3", {"apply_rotary": apply_rotary_second_half_sign},
            "the second half of apply_rotary has the wrong sign: it is x2 * cos + x1 * sin (the first half is "
            "x1 * cos - x2 * sin)", ROTARY, {"offsets": (0, 0, 0, 0)}),
    Mistake("ch2_rope_in_the_input_dtype", "2.3", {"apply_rotary": apply_rotary_in_the_input_dtype},
            "apply_rotary computes in x's dtype (bf16): the table and each product are rounded on the way, so "
            "some outputs land a bf16 step off. Compute in fp32 (x.float(), the fp32 table) and round once at the "
            "end with .to(x.dtype)", "test_ch2.py::test_apply_rotary_keeps_dtype"),
    Mistake("ch2_rope_table_in_input_dtype", "2.3", {"apply_rotary": apply_rotary_table_in_input_dtype},
            "apply_rotary rounds the cos/sin table to x's dtype (cos_sin.to(x.dtype): bf16 keeps 8 bits) before the "
            "rotation: the products run in fp32, but on rounded cos and sin, so some outputs land a bf16 step off. "
            "Leave the table in fp32 as rope_cos_sin gives it, rotate x.float(), and round once at the end with "
            ".to(x.dtype)", "test_ch2.py::test_apply_rotary_keeps_dtype"),
    Mistake("ch2_attention_sees_next_key", "2.4", {"causal_attention": attention_sees_next_key},
            "the causal mask is off by one: each query also sees the key after it; query i (at position "
            "Lk - Lq + i) sees keys 0 .. Lk - Lq + i, so tril(diagonal=Lk - Lq)", PREFILL_ATTN,
            {"heads": (4, 4)}),
    Mistake("ch2_attention_mask_not_aligned_to_end", "2.4", {"causal_attention": attention_mask_not_aligned_to_end},
            "the causal mask starts the queries at position 0: with fewer queries than keys (a decode, a "
            "cached prefix) query i sits at position Lk - Lq + i, so tril(diagonal=Lk - Lq), not tril()",
            "test_ch2.py::test_causal_attention_with_fewer_queries_than_keys_matches_sdpa", {"lq": 1}),
    Mistake("ch2_attention_masks_only_a_prefill", "2.4", {"causal_attention": attention_masks_only_a_prefill},
            "the causal mask is applied only when Lq == Lk: with fewer queries than keys (a prompt after a "
            "prefix-cache hit, a chunked prefill) each query then sees the keys after it too. Mask on every call: "
            "query i, at position Lk - Lq + i, sees keys 0 .. Lk - Lq + i, so tril(diagonal=Lk - Lq), which is the "
            "plain tril() when Lq == Lk and hides nothing for a decode (Lq == 1)",
            "test_ch2.py::test_causal_attention_with_fewer_queries_than_keys_matches_sdpa", {"lq": 4}),
    Mistake("ch2_attention_kv_heads_tiled", "2.4", {"causal_attention": attention_kv_heads_tiled},
            "GQA maps query heads to the wrong KV heads (k.repeat tiles them: head h reads KV head h % Hkv): "
            "consecutive query heads share a KV head, h reads KV head h // (H // Hkv), which is what "
            "repeat_interleave(H // Hkv, dim=1) gives", PREFILL_ATTN, {"heads": (4, 2)}),
    Mistake("ch2_attention_kv_head_by_count", "2.4", {"causal_attention": attention_kv_head_by_count},
            "query head h reads KV head h // Hkv: that divides by the number of KV heads, not by the group size. "
            "A group of H // Hkv consecutive query heads shares a KV head, so h reads KV head h // (H // Hkv) "
            "(repeat_interleave(H // Hkv, dim=1) gives it); with H = 4, Hkv = 2 the two agree, which hides it",
            PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_weights_in_input_dtype", "2.4", {"causal_attention": attention_weights_in_input_dtype},
            "the softmax's weights are rounded to q's dtype (bf16) before the product with v: keep them in fp32 "
            "through weights @ v, and cast the result to q.dtype once, at the end",
            "test_ch2.py::test_causal_attention_bf16_keeps_dtype_and_matches"),
    Mistake("ch2_attention_k_tiled_only", "2.4", {"causal_attention": attention_k_tiled_only},
            "the keys' heads are tiled (k.repeat) while the values' are interleaved (repeat_interleave), so query "
            "head h scores one KV head's keys and reads another's values: expand both with repeat_interleave("
            "H // Hkv, dim=1), head h reading KV head h // (H // Hkv)", PREFILL_ATTN, {"heads": (4, 2)}),
    Mistake("ch2_attention_softmax_without_max", "2.4", {"causal_attention": attention_softmax_without_max},
            "the softmax is exp(s) / exp(s).sum() with no max subtracted: an attention score past 88.7 makes fp32's "
            "exp inf, and inf / inf is NaN. Subtract each row's max first (s - s.amax(-1, keepdim=True)), as "
            "torch.softmax and SDPA do, or call torch.softmax",
            "test_ch2.py::test_causal_attention_logits_past_88_in_fp32"),
    Mistake("ch2_attention_reshaped_not_permuted", "2.4", {"causal_attention": attention_reshaped_not_permuted},
            "the output is computed as [H, Lq, D] and reshaped to [Lq, H, D]: reshape keeps the memory order, so "
            "row i then holds pieces of other heads and queries. Permute the axes (.transpose(0, 1), or write the "
            "einsum's output as 'qhd'); reshape only merges or splits neighbouring axes",
            PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_without_scale", "2.4", {"causal_attention": attention_without_scale},
            "the scores are never multiplied by scale: softmax(q . k * scale)", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_scale_from_head_dim", "2.4", {"causal_attention": attention_scale_from_head_dim},
            "the scores are scaled by head_dim ** -0.5 instead of the scale argument: the two agree for Qwen and "
            "Llama, but a model may set its own (Gemma's query_pre_attn_scalar); multiply by `scale` as given",
            "test_ch2.py::test_causal_attention_with_fewer_queries_than_keys_matches_sdpa", {"lq": 4}),
    Mistake("ch2_attention_mask_after_softmax", "2.4", {"causal_attention": attention_mask_after_softmax},
            "the causal mask is applied after the softmax (zeroing the future keys' weights), so each row's "
            "weights no longer sum to 1: mask the scores with -inf BEFORE the softmax, which then shares the "
            "whole weight among the visible keys", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_scales_q_in_place", "2.4", {"causal_attention": attention_scales_q_in_place},
            "causal_attention scales the caller's queries in place: for an fp32 q, q.float() is q itself, so "
            "q.mul_(scale) (or q *= scale) changes the q the caller still holds; multiply the scores by scale, or "
            "make a new tensor, q.float() * scale", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_returns_fp32", "2.4", {"causal_attention": attention_returns_fp32},
            "causal_attention returns its fp32 result: cast the output back to q.dtype (.to(q.dtype)), so a bf16 "
            "model gets bf16 activations; only the math runs in fp32",
            "test_ch2.py::test_causal_attention_bf16_keeps_dtype_and_matches"),
    Mistake("ch2_attention_scale_on_q_and_k", "2.4", {"causal_attention": attention_scale_on_q_and_k},
            "both q and k are multiplied by scale, so the scores are scaled by scale ** 2: scale the product once, "
            "(q . k) * scale (or q * scale alone)", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_softmax_over_heads", "2.4", {"causal_attention": attention_softmax_over_heads},
            "the softmax runs over the heads (dim=0 of the [H, Lq, Lk] scores; a masked key is -inf in every head, "
            "so those weights are NaN): each query's weights over the keys must sum to 1, so softmax(dim=-1)",
            PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_softmax_over_queries", "2.4", {"causal_attention": attention_softmax_over_queries},
            "the softmax runs over the queries (dim=-2 of the [H, Lq, Lk] scores): each query's weights over the "
            "keys must sum to 1, so softmax(dim=-1), along the keys", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_masks_with_zero", "2.4", {"causal_attention": attention_masks_with_zero},
            "the hidden keys' scores are set to 0, not -inf: a score of 0 still gets a weight exp(0 - max) in the "
            "softmax, so every query attends to the future too. masked_fill(~visible, float(\"-inf\")), which the "
            "softmax turns into a weight of exactly 0", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_misses_its_own_key", "2.4", {"causal_attention": attention_misses_its_own_key},
            "the causal mask is off by one: each query misses its own key (and the first query sees no key at all: "
            "a row of -inf, NaN after the softmax); query i, at position Lk - Lq + i, sees keys 0 .. Lk - Lq + i, "
            "itself included, so tril(diagonal=Lk - Lq)", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_mask_inverted", "2.4", {"causal_attention": attention_mask_inverted},
            "the causal mask is inverted: masked_fill(visible, -inf) hides the keys a query may see (and leaves a "
            "query that sees every key with none: NaN); fill where it must NOT see, masked_fill(~visible, -inf)",
            PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_divides_by_scale", "2.4", {"causal_attention": attention_divides_by_scale},
            "the scores are divided by scale: scale is already the factor (head_dim ** -0.5, not sqrt(head_dim)), so "
            "multiply, q . k * scale", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_attention_mask_diagonal_negated", "2.4", {"causal_attention": attention_mask_diagonal_negated},
            "the causal mask's offset has the wrong sign, tril(diagonal=Lq - Lk): with fewer queries than keys, "
            "query i sits at position Lk - Lq + i and sees keys 0 .. Lk - Lq + i, so tril(diagonal=Lk - Lq)",
            "test_ch2.py::test_causal_attention_with_fewer_queries_than_keys_matches_sdpa", {"lq": 1}),
    Mistake("ch2_attention_math_in_input_dtype", "2.4", {"causal_attention": attention_math_in_input_dtype},
            "causal_attention computes in q's dtype: in bf16 the scores, the softmax and the weighted sum each round "
            "to 8 bits. Upcast q, k and v with .float(), and cast the result back to q.dtype once, at the end",
            "test_ch2.py::test_causal_attention_bf16_keeps_dtype_and_matches"),
    Mistake("ch2_attention_scale_in_input_dtype", "2.4", {"causal_attention": attention_scale_in_input_dtype},
            "q is multiplied by scale in q's dtype, before the upcast: in bf16 q * scale rounds to 8 bits (unless "
            "scale is a power of two; a model's head_dim ** -0.5 is not for head_dim 128). Upcast first, then "
            "scale: (q.float() @ k.float()...) * scale",
            "test_ch2.py::test_causal_attention_bf16_keeps_dtype_and_matches"),
    Mistake("ch2_silu_on_up", "2.5", {"silu_and_mul": silu_on_up},
            "SiLU is applied to the wrong half: x is [gate | up], so silu(first half) * second half", MLP,
            {"shape": (18, 64)}),
    Mistake("ch2_silu_interleaved", "2.5", {"silu_and_mul": silu_interleaved},
            "gate and up are taken from even and odd columns: they are the two halves, x.chunk(2, dim=-1)", MLP,
            {"shape": (18, 64)}),
    Mistake("ch2_sigmoid_instead_of_silu", "2.5", {"silu_and_mul": sigmoid_instead_of_silu},
            "sigmoid(gate) * up is missing a factor: silu(gate) = gate * sigmoid(gate) (F.silu)", MLP,
            {"shape": (18, 64)}),
    Mistake("ch2_silu_chunk_along_tokens", "2.5", {"silu_and_mul": silu_chunk_along_tokens},
            "x.chunk(2) splits along dim 0, the tokens (or the batch), giving half as many rows of the full width: "
            "gate and up are the two halves of the last dimension, so split along the last dimension: "
            "x.chunk(2, dim=-1)", MLP, {"shape": (2, 9, 64)}),
    Mistake("ch2_silu_plus_up", "2.5", {"silu_and_mul": silu_plus_up},
            "silu(gate) is added to up: the gated MLP multiplies them, silu(gate) * up", MLP, {"shape": (18, 64)}),
    Mistake("ch2_silu_on_both_halves", "2.5", {"silu_and_mul": silu_on_both_halves},
            "SiLU is applied to both halves: only the gate goes through it, silu(gate) * up", MLP, {"shape": (18, 64)}),
    Mistake("ch2_silu_and_mul_in_fp32", "2.5", {"silu_and_mul": silu_and_mul_in_fp32},
            "silu_and_mul returns fp32 for a bf16 input (it computes in x.float() and never casts back): the result "
            "is in x.dtype, as down_proj's weight is, so end with .to(x.dtype) (or compute in x.dtype, as F.silu "
            "does)", "test_ch2.py::test_silu_and_mul_keeps_a_bf16_models_dtype"),
    Mistake("ch2_gelu_instead_of_silu", "2.5", {"silu_and_mul": gelu_instead_of_silu},
            "the gate goes through GELU: Qwen's (and Llama's) hidden_act is silu, silu(g) = g * sigmoid(g) "
            "(F.silu)", MLP, {"shape": (18, 64)}),
    Mistake("ch2_layer_k_v_swapped", "2.6", {"decoder_layer": layer_k_v_swapped},
            "k and v are swapped in the split: qkv_proj's output is [q | k | v], H * D columns of q, then Hkv * D of "
            "k, then Hkv * D of v, so q, k, v = p.qkv_proj(h).split([H * D, Hkv * D, Hkv * D], dim=-1)", LAYER,
            {"first": True}),
    Mistake("ch2_layer_qk_norm_fixed_eps", "2.6", {"decoder_layer": layer_qk_norm_fixed_eps},
            "the QK-norms use eps = 1e-6 written in, Qwen3's value: they are RMSNorms of the model like the others "
            "(transformers' Qwen3Attention builds q_norm and k_norm with config.rms_norm_eps); pass p.eps",
            "test_ch2.py::test_decoder_layer_qk_norm_uses_the_models_eps"),
    Mistake("ch2_layer_fixed_eps", "2.6", {"decoder_layer": layer_fixed_eps},
            "the norms use eps = 1e-6 written in, Qwen3's value: each model brings its own (Llama 3 and SmolLM2 "
            "1e-5); pass p.eps to every apply_rms_norm",
            "test_ch2.py::test_decoder_layer_without_qk_norm"),
    Mistake("ch2_layer_first_residual_doubled", "2.6", {"decoder_layer": layer_first_residual_doubled},
            "the first layer sets residual = hidden_states and then passes it to apply_rms_norm(hidden_states, ..., "
            "residual), which adds hidden_states again: the stream starts doubled. With residual None, normalize "
            "hidden_states alone (apply_rms_norm without residual) and let residual = hidden_states", LAYER,
            {"first": True}),
    Mistake("ch2_layer_qk_norm_after_rope", "2.6", {"decoder_layer": layer_qk_norm_after_rope},
            "q and k are normalized after RoPE: apply QK-norm per head (q_norm, k_norm) BEFORE rotating them", LAYER,
            {"first": True}),
    Mistake("ch2_layer_without_qk_norm", "2.6", {"decoder_layer": layer_without_qk_norm},
            "q and k are never normalized: Qwen3 applies RMSNorm to each head of q and of k (p.q_norm, p.k_norm, "
            "over head_dim) after the split and before RoPE; skip it only when p.q_norm is None (Llama, Qwen2)",
            LAYER, {"first": True}),
    Mistake("ch2_layer_residual_not_carried", "2.6", {"decoder_layer": layer_residual_not_carried},
            "the incoming residual is dropped: only the first layer (residual=None) starts the stream; later "
            "layers call apply_rms_norm(hidden_states, weight, eps, residual), which adds it", LAYER,
            {"first": False}),
    Mistake("ch2_layer_post_norm_without_residual", "2.6", {"decoder_layer": layer_post_norm_without_residual},
            "the attention output never joins the residual stream: post_attention_layernorm is a fused add + "
            "norm, h, residual = apply_rms_norm(h, p.post_norm, p.eps, residual)", LAYER, {"first": True}),
    Mistake("ch2_layer_first_residual_normed", "2.6", {"decoder_layer": layer_first_residual_normed},
            "the first layer starts the residual stream from the NORMED hidden states: the stream starts from the "
            "embeddings themselves, residual = hidden_states, and only h = input_layernorm(hidden_states) is normed",
            LAYER, {"first": True}),
    Mistake("ch2_layer_qk_norms_swapped", "2.6", {"decoder_layer": layer_qk_norms_swapped},
            "q is normalized with k_norm's weight and k with q_norm's: q_norm goes with q, k_norm with k", LAYER,
            {"first": True}),
    Mistake("ch2_layer_k_with_q_norm", "2.6", {"decoder_layer": layer_k_with_q_norm},
            "k is normalized with q_norm's weight: k has its own, p.k_norm (q_norm for q, k_norm for k)", LAYER,
            {"first": True}),
    Mistake("ch2_layer_rope_on_q_only", "2.6", {"decoder_layer": layer_rope_on_q_only},
            "only q is rotated: RoPE encodes the positions in q . k, so k must be rotated at its own positions too "
            "(and the cache keeps the rotated k)", LAYER, {"first": True}),
    Mistake("ch2_layer_post_norm_is_input_norm", "2.6", {"decoder_layer": layer_post_norm_is_input_norm},
            "the norm before the MLP uses the input norm's weight: it has its own, p.post_norm "
            "(post_attention_layernorm)", LAYER, {"first": True}),
    Mistake("ch2_layer_k_norm_on_v", "2.6", {"decoder_layer": layer_k_norm_on_v},
            "v is normalized with k_norm too: QK-norm normalizes q and k only; v goes into attention as qkv_proj "
            "gives it", LAYER, {"first": True}),
    Mistake("ch2_layer_rope_on_v", "2.6", {"decoder_layer": layer_rope_on_v},
            "v is rotated too: RoPE encodes positions in the q . k products only; rotate q and k, leave v as it is",
            LAYER, {"first": True}),
    Mistake("ch2_layer_post_norm_residual_discarded", "2.6", {"decoder_layer": layer_post_norm_residual_discarded},
            "the residual that post_attention_layernorm returns is dropped (h, _ = apply_rms_norm(h, p.post_norm, "
            "p.eps, residual)): the MLP gets the right input, but the layer returns the stream from before the "
            "attention add. Keep it: h, residual = apply_rms_norm(h, p.post_norm, p.eps, residual)", LAYER,
            {"first": True}),
    Mistake("ch2_layer_attn_out_transposed", "2.6", {"decoder_layer": layer_attn_out_transposed},
            "the attention output is flattened through .transpose(0, 1) before the reshape: attn returns [N, H, D], "
            "already one row per token, so the transpose makes it [H, N, D] and each row of reshape(n, H * D) holds "
            "heads of other tokens. Reshape it as it comes: p.attn(q, k, v).reshape(n, H * D)", LAYER,
            {"first": True}),
    Mistake("ch2_layer_returns_full_output", "2.6", {"decoder_layer": layer_returns_full_output},
            "the layer returns (mlp_out + residual, residual): return mlp_out alone as the first value; the next "
            "layer's input norm adds the residual (the full output is their sum)", LAYER, {"first": True}),
    Mistake("ch2_primer_add_store_unmasked", "2.7",
            {"add_kernel": add_store_unmasked, "vector_add": with_kernel(primer.vector_add, "add_kernel",
                                                                         add_store_unmasked)},
            "the store has no mask: the last program writes all BLOCK lanes, past element n-1 into whatever "
            "lies after the output; pass mask=offsets < n to tl.store as to the loads", ADD_GUARDED),
    Mistake("ch2_primer_add_load_unmasked", "2.7",
            {"add_kernel": add_load_unmasked, "vector_add": with_kernel(primer.vector_add, "add_kernel",
                                                                        add_load_unmasked)},
            "a load has no mask: the last program reads all BLOCK lanes of y, past element n-1 into memory that "
            "is not y's (on a GPU possibly an unmapped page: an illegal memory access); the masked store hides "
            "it in the output. Pass mask=offsets < n to every tl.load as to the store", ADD_READS),
    Mistake("ch2_primer_add_offsets_without_program", "2.7",
            {"add_kernel": add_offsets_without_program,
             "vector_add": with_kernel(primer.vector_add, "add_kernel", add_offsets_without_program)},
            "only the first BLOCK elements are written: every program works on the first block, or every program "
            "after the first stores nothing. Either the offsets do not start at the program's own block (they "
            "must be tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)), or the mask keeps only the first BLOCK "
            "lanes (offsets < BLOCK: compare the offsets with n, mask = offsets < n)", ADD, {"n": 1000}),
    Mistake("ch2_primer_add_offsets_not_scaled", "2.7",
            {"add_kernel": add_offsets_not_scaled,
             "vector_add": with_kernel(primer.vector_add, "add_kernel", add_offsets_not_scaled)},
            "program p starts at element p, so the programs overlap and most of the tensor is never written: "
            "program p owns elements p * BLOCK .. p * BLOCK + BLOCK - 1 (multiply the program id by BLOCK)",
            ADD, {"n": 1000}),
    Mistake("ch2_primer_add_mask_off_by_one", "2.7",
            {"add_kernel": add_mask_off_by_one, "vector_add": with_kernel(primer.vector_add, "add_kernel", add_mask_off_by_one)},
            "the mask is offsets <= n, one lane too many: element n is one past the end (the last is n - 1), so "
            "mask = offsets < n, on the loads and the store", ADD_GUARDED),
    Mistake("ch2_primer_softmax_store_unmasked", "2.8",
            {"softmax_kernel": softmax_store_unmasked,
             "softmax_rows": with_kernel(primer.softmax_rows, "softmax_kernel", softmax_store_unmasked)},
            "the store has no mask: each row writes all BLOCK_N lanes, past its n_cols values into the next row's "
            "place or past the output; pass mask=cols < n_cols to tl.store as to the load", SOFTMAX_GUARDED),
    Mistake("ch2_primer_softmax_pad_as_zero", "2.8",
            {"softmax_kernel": softmax_pad_as_zero,
             "softmax_rows": with_kernel(primer.softmax_rows, "softmax_kernel", softmax_pad_as_zero)},
            "the masked lanes past n_cols are loaded as 0.0, so each adds exp(0 - max) to the denominator: "
            "load them as -inf (other=float(\"-inf\")), which exp turns into 0", SOFTMAX, {"cols": 100}),
    Mistake("ch2_primer_softmax_without_max", "2.8",
            {"softmax_kernel": softmax_without_max,
             "softmax_rows": with_kernel(primer.softmax_rows, "softmax_kernel", softmax_without_max)},
            "exp of the raw scores overflows fp32 past 88 (inf / inf = NaN): subtract the row's maximum first, "
            "x - tl.max(x, axis=0), which leaves the softmax unchanged",
            PRIMER + "test_softmax_rows_of_large_logits"),
    Mistake("ch2_primer_softmax_rows_n_cols_apart", "2.8",
            {"softmax_kernel": softmax_rows_n_cols_apart,
             "softmax_rows": with_kernel(primer.softmax_rows, "softmax_kernel", softmax_rows_n_cols_apart)},
            "row r is read at r * n_cols, as if x were contiguous: rows of a slice are stride_x elements apart, "
            "so the row starts at x_ptr + row * stride_x", SOFTMAX_GUARDED),
    Mistake("ch2_primer_softmax_out_at_x_stride", "2.8",
            {"softmax_kernel": softmax_out_at_x_stride, "softmax_rows": with_kernel(primer.softmax_rows, "softmax_kernel", softmax_out_at_x_stride)},
            "row r is stored at out_ptr + row * stride_x: the output has its own row stride, so store at "
            "out_ptr + row * stride_out", SOFTMAX_GUARDED),
    Mistake("ch2_primer_softmax_out_rows_n_cols_apart", "2.8",
            {"softmax_kernel": softmax_out_rows_n_cols_apart, "softmax_rows": with_kernel(primer.softmax_rows, "softmax_kernel", softmax_out_rows_n_cols_apart)},
            "row r is stored at out_ptr + row * n_cols, as if out were contiguous: out's rows are stride_out "
            "elements apart (out may be a slice of a wider tensor), so store at out_ptr + row * stride_out",
            SOFTMAX_GUARDED),
    Mistake("ch2_primer_gather_table_ignored", "2.9",
            {"gather_pages_kernel": gather_table_ignored,
             "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_table_ignored)},
            "the page table is never read: token t's logical page t // PAGE is not where it lives; its "
            "physical page is tl.load(table_ptr + t // PAGE)", GATHER, {"case": "partial-last-page"}),
    Mistake("ch2_primer_gather_columns_unmasked", "2.9",
            {"gather_pages_kernel": gather_columns_unmasked,
             "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_columns_unmasked)},
            "the columns are not masked: with n_cols below BLOCK_D every row writes BLOCK_D values, spilling "
            "into the next row and past the output; mask the tile on both axes, (tokens < n_tokens)[:, None] & "
            "(cols < n_cols)[None, :]", GATHER_GUARDED),
    Mistake("ch2_primer_gather_ignores_cache_strides", "2.9",
            {"gather_pages_kernel": gather_ignores_cache_strides,
             "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_ignores_cache_strides)},
            "the cache is addressed as if it were contiguous (page * PAGE * n_cols + row * n_cols): use its "
            "strides, page * stride_page + row * stride_row (a cache slice, such as one head's K, has wider rows)",
            GATHER_GUARDED),
    Mistake("ch2_primer_gather_block_t_fixed", "2.9",
            {"gather_pages_kernel": gather_block_t_fixed,
             "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_block_t_fixed)},
            "the kernel tiles the tokens by a number of its own (8, the wrapper's default) instead of its BLOCK_T "
            "argument: the launch makes cdiv(n_tokens, BLOCK_T) programs, so with block_t=16 half the tokens are "
            "never gathered. Use BLOCK_T (on a GPU Triton refuses a plain global inside @triton.jit anyway)",
            GATHER, {"case": "whole-pages"}),
    Mistake("ch2_primer_gather_page_and_row_swapped", "2.9",
            {"gather_pages_kernel": gather_page_and_row_swapped, "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_page_and_row_swapped)},
            "the page and the row inside it are swapped: token t lives in page table[t // PAGE] (the quotient) "
            "at row t % PAGE (the remainder)", GATHER, {"case": "partial-last-page"}),
    Mistake("ch2_primer_gather_out_rows_n_cols_apart", "2.9",
            {"gather_pages_kernel": gather_out_rows_n_cols_apart, "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_out_rows_n_cols_apart)},
            "token t is stored at out_ptr + t * n_cols, as if out were contiguous: out's rows are stride_out "
            "elements apart (out may be a slice of a wider tensor), so store at out_ptr + t * stride_out",
            GATHER_GUARDED),
    Mistake("ch2_primer_matmul_k_tail_unmasked", "2.10",
            {"matmul_kernel": matmul_k_tail_unmasked,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_k_tail_unmasked)},
            "the last K tile reads past K (into the next row of A and past the end of B): mask k < K on both "
            "tiles with other=0.0, so the extra lanes add 0 to the dot", MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_last_tile_dropped", "2.10",
            {"matmul_kernel": matmul_last_tile_dropped,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_last_tile_dropped)},
            "the K loop stops at the last full tile, so the partial tile at the end of K is never added: loop "
            "over range(0, K, BLOCK_K) and mask that last tile", MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_half_accumulator", "2.10",
            {"matmul_kernel": matmul_half_accumulator,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_half_accumulator)},
            "the accumulator is kept in fp16 and rounded after every K tile, so the error grows with K: keep "
            "acc = tl.zeros(..., dtype=tl.float32) and cast to C's dtype once, at the store",
            PRIMER + "test_matmul_fp16_accumulates_in_fp32"),
    Mistake("ch2_primer_matmul_c_assumed_contiguous", "2.10",
            {"matmul_kernel": matmul_c_assumed_contiguous,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_c_assumed_contiguous)},
            "C is stored as if contiguous (row * N + col): C may be a slice of a wider tensor, so store at "
            "offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn", PRIMER + "test_matmul_into_rows_of_a_wider_output"),
    Mistake("ch2_primer_matmul_a_assumed_contiguous", "2.10",
            {"matmul_kernel": matmul_a_assumed_contiguous, "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_a_assumed_contiguous)},
            "A is addressed as if contiguous (row * K + k): A may be a transposed view, so use its strides, "
            "offs_m[:, None] * stride_am + k[None, :] * stride_ak", MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_b_assumed_contiguous", "2.10",
            {"matmul_kernel": matmul_b_assumed_contiguous, "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_b_assumed_contiguous)},
            "B is addressed as if contiguous (k * N + col): B may be a transposed view (a weight stored [N, K] "
            "used as W.t()), so use its strides, k[:, None] * stride_bk + offs_n[None, :] * stride_bn",
            MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_program_ids_swapped", "2.10",
            {"matmul_kernel": matmul_program_ids_swapped, "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_program_ids_swapped)},
            "the program ids are swapped: the grid is (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), so pid_m = "
            "tl.program_id(0) (row tiles) and pid_n = tl.program_id(1) (column tiles)",
            PRIMER + "test_tiled_matmul_matches_torch", {"mkn": (17, 20, 33)}),
    Mistake("ch2_primer_matmul_acc_overwritten", "2.10",
            {"matmul_kernel": matmul_acc_overwritten, "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_acc_overwritten)},
            "acc = tl.dot(a, b) overwrites the sum at every K tile, so only the last tile counts: accumulate, "
            "acc += tl.dot(a, b)", MATMUL_GUARDED),
    Mistake("ch2_primer_online_sum_not_rescaled", "2.11",
            {"online_softmax_kernel": online_sum_not_rescaled,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_sum_not_rescaled)},
            "the running sum l is not rescaled when a tile raises the max: its terms are exp(s - m_old), so "
            "l = l * exp(m_old - m_new) + sum(p), like acc", ONLINE, {"case": "max-grows"}),
    Mistake("ch2_primer_online_max_starts_at_zero", "2.11",
            {"online_softmax_kernel": online_max_starts_at_zero,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_max_starts_at_zero)},
            "the exponent is s - 0: the running max starts at 0.0 (or no max is subtracted at all). When every "
            "score is far below 0 (attention scores can be), exp(s - 0) underflows to 0, l stays 0 and the output "
            "is 0 / 0 = NaN. Start m at -inf and fold in each tile's max, m_new = tl.maximum(m, tl.max(s, axis=0)), "
            "then p = tl.exp(s - m_new)", ONLINE, {"case": "far-below-zero"}),
    Mistake("ch2_primer_online_out_rows_head_dim_apart", "2.11",
            {"online_softmax_kernel": online_out_rows_head_dim_apart,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_out_rows_head_dim_apart)},
            "output row r is stored at out_ptr + r * head_dim, as if the output were contiguous: its rows are "
            "stride_out elements apart (it may be a slice of a wider tensor), so store at out_ptr + row * stride_out",
            PRIMER + "test_softmax_weighted_sum_into_rows_of_a_wider_output"),
    Mistake("ch2_primer_online_nothing_rescaled", "2.11",
            {"online_softmax_kernel": online_nothing_rescaled,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_nothing_rescaled)},
            "neither l nor acc is rescaled when a tile raises the max (alpha is 1: taken after m = m_new, or left "
            "out): take alpha = exp(m_old - m_new) BEFORE updating m, then l = l * alpha + sum(p) and acc = acc * "
            "alpha + sum(p[:, None] * v, axis=0)", ONLINE, {"case": "max-grows"}),
    Mistake("ch2_primer_online_acc_not_rescaled", "2.11",
            {"online_softmax_kernel": online_acc_not_rescaled,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_acc_not_rescaled)},
            "the weighted sum acc is not rescaled when a tile raises the max: acc = acc * exp(m_old - m_new) + "
            "sum(p[:, None] * v, axis=0), with the same factor as l", ONLINE, {"case": "max-grows"}),
    Mistake("ch2_primer_online_pad_as_zero", "2.11",
            {"online_softmax_kernel": online_pad_as_zero,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_pad_as_zero)},
            "the keys past n_keys in the last tile are loaded as score 0.0 and add exp(0 - m) to the running "
            "sum: load them as -inf (other=float(\"-inf\"))", ONLINE, {"case": "max-grows"}),
    Mistake("ch2_primer_online_alpha_inverted", "2.11",
            {"online_softmax_kernel": online_alpha_inverted, "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel", online_alpha_inverted)},
            "the rescale factor is inverted, exp(m_new - m) (inf on the first tile, where m = -inf): the sums so far "
            "hold exp(s - m), so multiplying by alpha = exp(m - m_new) turns them into exp(s - m_new)", ONLINE,
            {"case": "max-grows"}),
    Mistake("ch2_primer_online_max_not_kept", "2.11",
            {"online_softmax_kernel": online_max_not_kept, "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel", online_max_not_kept)},
            "the running max is never updated (m = m_new missing at the end of the tile loop): m stays -inf, "
            "alpha = exp(-inf) = 0 and every tile wipes l and acc, so only the last tile counts", ONLINE,
            {"case": "max-grows"}),
    Mistake("ch2_primer_online_without_final_division", "2.11",
            {"online_softmax_kernel": online_without_final_division, "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel", online_without_final_division)},
            "acc is stored without dividing by l: the softmax's weights are exp(s - m) / l, so store acc / l",
            ONLINE, {"case": "max-grows"}),
    Mistake("ch2_primer_online_scores_rows_n_keys_apart", "2.11",
            {"online_softmax_kernel": online_scores_rows_n_keys_apart, "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel", online_scores_rows_n_keys_apart)},
            "row r of the scores is read at r * n_keys, as if they were contiguous: its rows are stride_s elements "
            "apart (the scores may be a slice), so read at scores_ptr + row * stride_s", ONLINE,
            {"case": "max-grows"}),
    Mistake("ch2_primer_add_mask_of_block", "2.7",
            {"add_kernel": add_mask_of_block,
             "vector_add": with_kernel(primer.vector_add, "add_kernel", add_mask_of_block)},
            "the mask is offsets < BLOCK, not offsets < n: it keeps program 0's lanes whatever n is, so with "
            "n < BLOCK they read and write past the end, and the programs after the first store nothing. "
            "mask = offsets < n, on the loads and the store", ADD, {"n": 1}),
    Mistake("ch2_primer_add_block_fixed", "2.7",
            {"add_kernel": add_block_fixed,
             "vector_add": with_kernel(primer.vector_add, "add_kernel", add_block_fixed)},
            "the kernel tiles by a number of its own (256) instead of its BLOCK argument: the launcher starts "
            "cdiv(n, BLOCK) programs of BLOCK elements, so with a bigger block most elements are never written. "
            "Use BLOCK: offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
            PRIMER + "test_vector_add_uses_the_block_it_is_given"),
    Mistake("ch2_primer_gather_page_stride_from_rows", "2.9",
            {"gather_pages_kernel": gather_page_stride_from_rows,
             "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_page_stride_from_rows)},
            "page p is taken to start at p * PAGE * stride_row, as if the pages lay back to back: a cache can be "
            "a view whose pages are further apart (K and V of a page side by side in one buffer, cache = "
            "buf[:, 0]). Use the page stride: page * stride_page + row * stride_row",
            PRIMER + "test_gather_from_k_and_v_pages_side_by_side"),
    Mistake("ch2_primer_gather_offsets_in_int32", "2.9",
            {"gather_pages_kernel": gather_offsets_in_int32,
             "gather_pages": with_kernel(primer.gather_pages, "gather_pages_kernel", gather_offsets_in_int32)},
            "the page id stays int32, so page * stride_page wraps around past 2**31 - 1 (in a cache of more than "
            "2**31 elements, as a big GPU's can be) and the load reads far before the cache: cast the loaded page "
            "ids to int64 before multiplying, page = tl.load(...).to(tl.int64)",
            PRIMER + "test_gather_from_a_cache_past_2_gib_elements"),
    Mistake("ch2_primer_matmul_tile_rounded", "2.10",
            {"matmul_kernel": matmul_tile_rounded,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_tile_rounded)},
            "each K tile's product is rounded to fp16 before it is added (tl.dot(a, b).to(...) or tl.dot(a, b, "
            "out_dtype=a.dtype)): with positive and negative terms the partial sums cancel, and their rounding "
            "errors are many ulps of the result. Add tl.dot's fp32 result as it is, acc += tl.dot(a, b), into an "
            "fp32 acc, and round once, at the store", PRIMER + "test_matmul_fp16_of_zero_mean_inputs"),
    Mistake("ch2_primer_matmul_acc_in_c_dtype", "2.10",
            {"matmul_kernel": matmul_acc_in_c_dtype,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_acc_in_c_dtype)},
            "acc starts in C's dtype (tl.zeros(..., dtype=c_ptr.dtype.element_ty)) and acc += tl.dot(a, b) makes it "
            "fp32: the interpreter lets the type change (and the result is right here), Triton's GPU compiler "
            "refuses it. Start it as the fp32 accumulator it becomes, acc = tl.zeros([BLOCK_M, BLOCK_N], "
            "dtype=tl.float32), and cast to C's dtype at the store", "test_compiles.py::test_kernel_compiles_for_a_gpu",
            {"kernel": "matmul_kernel"}),
    # fp16 accumulation in the other spellings students write (the two above: C's dtype)
    Mistake("ch2_primer_matmul_acc_zeros_fp16", "2.10",
            {"matmul_kernel": matmul_acc_zeros_fp16,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_acc_zeros_fp16)},
            "acc starts as an fp16 accumulator (acc = tl.zeros(..., dtype=tl.float16)) and acc += tl.dot(a, b) makes "
            "it fp32 (tl.dot returns fp32): the interpreter lets the type change (so the result is right here), "
            "Triton's GPU compiler refuses it, for fp32 and fp16 inputs alike; kept fp16, it would round at every K "
            "tile. Start it as acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), and cast to C's dtype once, at "
            "the store", "test_compiles.py::test_kernel_compiles_for_a_gpu", {"kernel": "matmul_kernel"}),
    Mistake("ch2_primer_matmul_dot_out_fp16", "2.10",
            {"matmul_kernel": matmul_dot_out_fp16,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_dot_out_fp16)},
            "the sum is accumulated in fp16: acc = tl.zeros(..., dtype=tl.float16) with tl.dot(a, b, "
            "out_dtype=tl.float16) (or tl.dot(a, b, acc, out_dtype=tl.float16)) rounds each tile's product and the "
            "running sum to fp16, so the error grows with K (sums near 128 move in steps of 0.125). Keep tl.dot's "
            "default out_dtype (fp32), acc = tl.zeros(..., dtype=tl.float32), and cast to C's dtype once, at the store",
            PRIMER + "test_matmul_fp16_accumulates_in_fp32"),
    Mistake("ch2_primer_matmul_tile_to_fp16", "2.10",
            {"matmul_kernel": matmul_tile_to_fp16,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_tile_to_fp16)},
            "each K tile's product is cast to fp16 before it is added (acc += tl.dot(a, b).to(tl.float16)): every "
            "partial sum keeps 11 bits whatever C's dtype, so even an fp32 matmul is off by 1e-3 and more. Add "
            "tl.dot's fp32 result as it is, acc += tl.dot(a, b), and cast once, at the store, to C's dtype "
            "(c_ptr.dtype.element_ty)",
            MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_acc_to_fp16", "2.10",
            {"matmul_kernel": matmul_acc_to_fp16,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_acc_to_fp16)},
            "the running sum is rounded to fp16 before each K tile is added (acc = acc.to(tl.float16) + tl.dot(a, "
            "b)): an fp16 accumulator in disguise, so even an fp32 matmul keeps 11 bits. Keep acc fp32 through the "
            "loop, acc += tl.dot(a, b), and cast only at the store, to C's dtype (c_ptr.dtype.element_ty)",
            MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_fp16_acc", "2.10",
            {"matmul_kernel": matmul_fp16_acc,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_fp16_acc)},
            "the accumulator is fp16 whatever C's dtype (acc = tl.zeros(..., dtype=tl.float16), or acc.to(tl.float16) "
            "after each K tile): the running sum is rounded to 11 bits at every tile, so even an fp32 matmul is off "
            "by 1e-3 and more. Keep acc = tl.zeros(..., dtype=tl.float32), acc += tl.dot(a, b), and cast to C's dtype "
            "(c_ptr.dtype.element_ty) once, at the store", MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_fp16_acc_fp16_tiles", "2.10",
            {"matmul_kernel": matmul_fp16_acc_fp16_tiles,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_fp16_acc_fp16_tiles)},
            "the accumulator and each K tile's product are fp16 whatever C's dtype (acc = tl.zeros(..., "
            "dtype=tl.float16) with acc += tl.dot(a, b).to(tl.float16)): both are rounded to 11 bits at every tile, "
            "so even an fp32 matmul is off by 1e-3 and more. The compiler wants acc's type to stay the same, so make "
            "it the type tl.dot returns: acc = tl.zeros(..., dtype=tl.float32), acc += tl.dot(a, b), and cast to "
            "C's dtype (c_ptr.dtype.element_ty) once, at the store", MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_dot_acc_out_fp16", "2.10",
            {"matmul_kernel": matmul_dot_acc_out_fp16,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_dot_acc_out_fp16)},
            "the sum is accumulated in fp16 through tl.dot's acc argument (acc = tl.zeros(..., dtype=tl.float16), acc "
            "= tl.dot(a, b, acc, out_dtype=tl.float16)): with fp32 tiles tl.dot returns fp32 whatever out_dtype says, "
            "so from the second K tile on acc is fp32, not the out_dtype it is passed with, and Triton stops at its "
            "check that the two agree (the bare AssertionError); with fp16 tiles it runs and rounds the running sum "
            "to fp16 at every tile. Keep acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32) and tl.dot's default "
            "out_dtype (acc = tl.dot(a, b, acc), or acc += tl.dot(a, b)), and cast to C's dtype once, at the store",
            MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_dot_acc_fp16", "2.10",
            {"matmul_kernel": matmul_dot_acc_fp16,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_dot_acc_fp16)},
            "acc is fp16 (acc = tl.zeros(..., dtype=tl.float16)) and passed to tl.dot(a, b, acc), which accumulates "
            "in its out_dtype, fp32 by default: Triton stops at its check that acc's dtype is that out_dtype (the "
            "bare AssertionError), at the first K tile, whatever the tiles' dtype. Make acc = tl.zeros([BLOCK_M, "
            "BLOCK_N], dtype=tl.float32) (an fp16 acc would round the sum at every tile anyway), and cast to C's "
            "dtype once, at the store", MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_fp16_products", "2.10",
            {"matmul_kernel": matmul_fp16_products,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_fp16_products)},
            "the products are summed in fp16 into an fp16 acc (acc += tl.sum(a.to(tl.float16)[:, :, None] * "
            "b.to(tl.float16)[None, :, :], axis=1)): every product, every tile's sum and the running sum are rounded "
            "to 11 bits. Use acc += tl.dot(a, b) on the tiles as loaded (it multiplies and adds in fp32) into acc = "
            "tl.zeros(..., dtype=tl.float32), and cast to C's dtype once, at the store", MATMUL_GUARDED),
    Mistake("ch2_primer_matmul_fp16_tile_sums", "2.10",
            {"matmul_kernel": matmul_fp16_tile_sums,
             "tiled_matmul": with_kernel(primer.tiled_matmul, "matmul_kernel", matmul_fp16_tile_sums)},
            "each K tile is summed in fp16 before it reaches the fp32 acc (acc += tl.sum(a.to(tl.float16)[:, :, None] "
            "* b.to(tl.float16)[None, :, :], axis=1)): the products and their sum are rounded to 11 bits. Use acc += "
            "tl.dot(a, b) on the tiles as loaded: it multiplies and adds in fp32", MATMUL_GUARDED),
    Mistake("ch2_primer_online_tile_max", "2.11",
            {"online_softmax_kernel": online_tile_max,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_tile_max)},
            "m_new is the tile's own max, not the running max: a tile whose scores are lower than the max so far "
            "lowers m, so alpha = exp(m - m_new) overflows to inf (scores 88 lower) or is NaN (a tile of -inf, "
            "masked, scores). Keep the max over every tile so far: m_new = tl.maximum(m, tl.max(s, axis=0))",
            ONLINE, {"case": "later-tiles-far-lower"}),
    Mistake("ch2_primer_online_without_max", "2.11",
            {"online_softmax_kernel": online_without_max,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_without_max)},
            "no max is subtracted (p = exp(s), or a running max that stays 0): exp of scores above 88 overflows fp32 "
            "to inf, and inf / inf is NaN. Keep the running max m (from -inf), m_new = tl.maximum(m, tl.max(s, "
            "axis=0)), p = tl.exp(s - m_new), and rescale l and acc by alpha = exp(m - m_new)",
            ONLINE, {"case": "far-above-zero"}),
    Mistake("ch2_primer_online_tile_fixed", "2.11",
            {"online_softmax_kernel": online_tile_fixed,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_tile_fixed)},
            "the keys of a tile are n0 + tl.arange(0, 16), a number of its own, while the loop steps by BLOCK_N: "
            "with block_n above 16 the keys between are skipped. Use the tile size the kernel is given, "
            "keys = n0 + tl.arange(0, BLOCK_N)", PRIMER + "test_softmax_weighted_sum_in_tiles_of_32"),
    Mistake("ch2_primer_online_sum_starts_as_int", "2.11",
            {"online_softmax_kernel": online_sum_starts_as_int,
             "softmax_weighted_sum": with_kernel(primer.softmax_weighted_sum, "online_softmax_kernel",
                                                 online_sum_starts_as_int)},
            "l starts as the int 0 and the loop makes it a float: the interpreter lets the type change (and the "
            "result is right here), Triton's GPU compiler refuses it. Start it as a float: l = 0.0 (or tl.full([], "
            "0.0, tl.float32))", "test_compiles.py::test_kernel_compiles_for_a_gpu",
            {"kernel": "online_softmax_kernel"}),
    Mistake("ch2_triton_store_unmasked", "2.12", {"add_rms_norm_kernel": kernel_store_unmasked},
            "a tl.store without mask=cols < n_cols writes all BLOCK_N lanes, past the end of the row (and of "
            "the tensor): pass the mask to every store as to every load",
            "test_ch2.py::test_triton_kernel_reads_strided_rows_and_writes_only_its_rows"),
    Mistake("ch2_triton_mean_over_block", "2.12",
            {"add_rms_norm_kernel": kernel_mean_over_block, "rms_norm_triton": launcher_of(kernel_mean_over_block)},
            "the mean of squares divides by BLOCK_N: the row has n_cols elements (BLOCK_N is the next power of "
            "two), so tl.sum(h * h, axis=0) / n_cols", TRITON_NORM, {"d": 100}),
    Mistake("ch2_triton_input_dtype_math", "2.12",
            {"add_rms_norm_kernel": kernel_input_dtype_math, "rms_norm_triton": launcher_of(kernel_input_dtype_math)},
            "the kernel computes in the inputs' dtype: in fp16 h * h overflows and the sum loses precision; "
            ".to(tl.float32) after every load, and cast to the output dtype only to store",
            "test_ch2.py::test_triton_rms_norm_fp16_large_activations"),
    Mistake("ch2_triton_residual_out_is_x", "2.12",
            {"add_rms_norm_kernel": kernel_residual_out_is_x, "rms_norm_triton": launcher_of(kernel_residual_out_is_x)},
            "residual_out holds x: store the sum h = x + residual there (the new residual stream)", TRITON_NORM,
            {"d": 64}),
    Mistake("ch2_triton_without_eps", "2.12",
            {"add_rms_norm_kernel": kernel_without_eps, "rms_norm_triton": launcher_of(kernel_without_eps)},
            "the kernel never adds eps: rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)",
            "test_ch2.py::test_triton_rms_norm_uses_eps"),
    Mistake("ch2_triton_eps_outside_rsqrt", "2.12",
            {"add_rms_norm_kernel": kernel_eps_outside_rsqrt, "rms_norm_triton": launcher_of(kernel_eps_outside_rsqrt)},
            "eps is added after the rsqrt (rsqrt(mean(h**2)) + eps): it belongs under it, rstd = tl.rsqrt(tl.sum(h * "
            "h, axis=0) / n_cols + eps), where it keeps a row of zeros from dividing by 0",
            "test_ch2.py::test_triton_rms_norm_fp16_large_activations"),
    Mistake("ch2_triton_residual_out_always", "2.12",
            {"add_rms_norm_kernel": kernel_residual_out_always,
             "rms_norm_triton": launcher_of(kernel_residual_out_always)},
            "residual_out is stored even without a residual (HAS_RESIDUAL False): the launcher then passes out itself "
            "as residual_out_ptr, so the store overwrites the normalized row with x. Store residual_out only under "
            "`if HAS_RESIDUAL:`", "test_ch2.py::test_triton_rms_norm_without_residual_per_head"),
    Mistake("ch2_triton_weight_before_round", "2.12",
            {"add_rms_norm_kernel": kernel_weight_before_round,
             "rms_norm_triton": launcher_of(kernel_weight_before_round)},
            "the kernel multiplies by the weight in fp32 and rounds once, at the store: torch (Qwen3RMSNorm) rounds "
            "the normalized row to the output dtype first, then multiplies by the weight; round (h * rstd) with "
            ".to(dtype).to(tl.float32) before * w", "test_ch2.py::test_triton_rms_norm_fp16_large_activations"),
    Mistake("ch2_triton_sum_not_rounded", "2.12",
            {"add_rms_norm_kernel": kernel_sum_not_rounded, "rms_norm_triton": launcher_of(kernel_sum_not_rounded)},
            "the kernel normalizes the fp32 sum x + residual while it stores (and torch normalizes) that sum rounded "
            "to the output dtype: round h = (x + r).to(dtype) first, store it, and compute the statistics on it",
            "test_ch2.py::test_triton_rms_norm_fp16_large_activations"),
    Mistake("ch2_triton_rounds_only_at_the_stores", "2.12",
            {"add_rms_norm_kernel": kernel_rounds_only_at_the_stores,
             "rms_norm_triton": launcher_of(kernel_rounds_only_at_the_stores)},
            "the kernel rounds only at its stores: torch (Qwen3RMSNorm in fp16/bf16) rounds twice on the way. Round "
            "h = (x + r).to(dtype) before the statistics (it is the stored residual), and the normalized row "
            "(h * rstd).to(dtype) before it is multiplied, in fp32, by the weight: .to(dtype).to(tl.float32) at both",
            "test_ch2.py::test_triton_rms_norm_fp16_large_activations"),
    Mistake("ch2_triton_out_at_x_stride", "2.12",
            {"add_rms_norm_kernel": kernel_out_at_x_stride, "rms_norm_triton": launcher_of(kernel_out_at_x_stride)},
            "the outputs are stored at row * stride_x, the input's row stride: out and residual_out are contiguous, "
            "rows n_cols apart, so store at row * n_cols",
            "test_ch2.py::test_triton_kernel_reads_strided_rows_and_writes_only_its_rows"),
    Mistake("ch2_triton_residual_at_x_stride", "2.12",
            {"add_rms_norm_kernel": kernel_residual_at_x_stride,
             "rms_norm_triton": launcher_of(kernel_residual_at_x_stride)},
            "the residual's row r is read at row * stride_x: the residual has its own row stride, "
            "residual_ptr + row * stride_residual",
            "test_ch2.py::test_triton_kernel_reads_strided_rows_and_writes_only_its_rows"),
]
