"""Chapter 2's known wrong versions (see mistakes.py).

Each function below is an exercise written the way students get it wrong; its docstring says the
one thing that differs from the right version. The hints are what the grader prints.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

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


def rms_norm_sum_not_mean(x, weight, eps):
    """Divides by the root of the SUM of squares (the L2 norm), not of their mean."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


# ---- 2.2 fused add + RMSNorm ---------------------------------------------------------------------
def add_rms_norm_returns_old_residual(x, residual, weight, eps):
    """Normalizes the sum but returns the residual it was given, not the sum."""
    return rms_norm(x + residual, weight, eps), residual


def add_rms_norm_of_x_only(x, residual, weight, eps):
    """Returns the right new residual but normalizes x alone, not x + residual."""
    return rms_norm(x, weight, eps), x + residual


def add_rms_norm_in_place(x, residual, weight, eps):
    """Adds into the caller's residual tensor in place (residual += x)."""
    residual += x
    return rms_norm(residual, weight, eps), residual


# ---- 2.3 rotary embedding ------------------------------------------------------------------------
def rope_cos_sin_exponent_halved(head_dim, max_position, base):
    """theta_j = base ** (-j / d) for j < d/2: the exponent lacks its factor 2."""
    inv_freq = 1.0 / (base ** (torch.arange(head_dim // 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


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


def apply_rotary_ignoring_positions(x, positions, cos_sin):
    """Takes row i of the cache for the i-th token of the packed batch, not the token's position."""
    cos, sin = cos_sin[:x.shape[0]].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# ---- 2.4 causal attention ------------------------------------------------------------------------
def _attention(q, k, v, scale, diagonal_shift=0, align_to_end=True, tile_kv_heads=False):
    """The right causal_attention, with one of its details changed."""
    Lq, H, _ = q.shape
    Lk, Hkv, _ = k.shape
    if tile_kv_heads:  # query head h reads KV head h % Hkv
        k, v = k.float().repeat(1, H // Hkv, 1), v.float().repeat(1, H // Hkv, 1)
    else:
        k, v = k.float().repeat_interleave(H // Hkv, dim=1), v.float().repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    diagonal = (Lk - Lq if align_to_end else 0) + diagonal_shift
    visible = torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=diagonal)
    scores = scores.masked_fill(~visible, float("-inf"))
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


def attention_without_scale(q, k, v, scale):
    """Never multiplies the scores by scale."""
    return _attention(q, k, v, 1.0)


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


# ---- 2.6 the decoder layer -----------------------------------------------------------------------
def _layer(positions, hidden_states, residual, p, qk_norm_after_rope=False, restart_residual=False,
           post_norm_without_residual=False):
    """The right decoder_layer, with one of its steps changed."""
    if residual is None or restart_residual:
        h, residual = apply_rms_norm(hidden_states, p.input_norm, p.eps), hidden_states
    else:
        h, residual = apply_rms_norm(hidden_states, p.input_norm, p.eps, residual)
    n, H, Hkv, D = h.shape[0], p.num_heads, p.num_kv_heads, p.head_dim
    q, k, v = p.qkv_proj(h).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.reshape(n, H, D), k.reshape(n, Hkv, D), v.reshape(n, Hkv, D)
    if p.q_norm is not None and not qk_norm_after_rope:
        q, k = apply_rms_norm(q, p.q_norm, p.eps), apply_rms_norm(k, p.k_norm, p.eps)
    q, k = apply_rotary(q, positions, p.cos_sin), apply_rotary(k, positions, p.cos_sin)
    if p.q_norm is not None and qk_norm_after_rope:
        q, k = apply_rms_norm(q, p.q_norm, p.eps), apply_rms_norm(k, p.k_norm, p.eps)
    h = p.o_proj(p.attn(q, k, v).reshape(n, H * D))
    if post_norm_without_residual:
        h = apply_rms_norm(h, p.post_norm, p.eps)
    else:
        h, residual = apply_rms_norm(h, p.post_norm, p.eps, residual)
    return p.down_proj(silu_and_mul(p.gate_up_proj(h))), residual


def layer_qk_norm_after_rope(positions, hidden_states, residual, p):
    """Applies QK-norm to the rotated q and k."""
    return _layer(positions, hidden_states, residual, p, qk_norm_after_rope=True)


def layer_residual_not_carried(positions, hidden_states, residual, p):
    """Ignores the incoming residual: every layer starts the stream anew from its hidden_states."""
    return _layer(positions, hidden_states, residual, p, restart_residual=True)


def layer_post_norm_without_residual(positions, hidden_states, residual, p):
    """Normalizes the attention output alone before the MLP and never adds it to the residual."""
    return _layer(positions, hidden_states, residual, p, post_norm_without_residual=True)


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


def launcher_of(kernel):
    """The given launcher rms_norm_triton, running `kernel` in place of add_rms_norm_kernel (what a
    student's exercises/ch2.py does: its copy of the launcher calls the student's kernel)."""
    given = rmsnorm_kernels.rms_norm_triton
    return types.FunctionType(given.__code__, {**given.__globals__, "add_rms_norm_kernel": kernel},
                              given.__name__, given.__defaults__)


NORM = "test_ch2.py::test_rms_norm_matches_qwen3_rmsnorm"
ADD_NORM = "test_ch2.py::test_add_rms_norm_matches_qwen3_rmsnorm_of_the_sum"
ROTARY = "test_ch2.py::test_apply_rotary_on_a_packed_batch_matches_transformers"
PREFILL_ATTN = "test_ch2.py::test_causal_attention_prefill_matches_sdpa"
MLP = "test_ch2.py::test_silu_and_mul_makes_qwen3_mlp"
LAYER = "test_ch2.py::test_decoder_layer_on_a_packed_batch_matches_qwen3_decoder_layer"
TRITON_NORM = "test_ch2.py::test_triton_add_rms_norm_matches_qwen3_rmsnorm"

MISTAKES: list[Mistake] = [
    Mistake("ch2_rms_norm_no_fp32_upcast", "2.1", {"rms_norm": rms_norm_in_input_dtype},
            "rms_norm computes the statistics in the input's dtype: in fp16, x**2 overflows once |x| > 256 (and "
            "bf16 loses precision); compute on x.float() and cast the normalized x back to x.dtype "
            "before multiplying by weight", "test_ch2.py::test_rms_norm_fp16_large_activations"),
    Mistake("ch2_rms_norm_eps_outside_sqrt", "2.1", {"rms_norm": rms_norm_eps_outside_sqrt},
            "eps is added outside the square root: divide by sqrt(mean(x**2) + eps), i.e. multiply by "
            "torch.rsqrt(mean + eps)", "test_ch2.py::test_rms_norm_uses_eps"),
    Mistake("ch2_rms_norm_sum_not_mean", "2.1", {"rms_norm": rms_norm_sum_not_mean},
            "rms_norm divides by the root of the SUM of squares (the L2 norm): RMS is the root of their MEAN, "
            "x.pow(2).mean(dim=-1, keepdim=True)", NORM, {"shape": (18, 64)}),
    Mistake("ch2_add_rms_norm_returns_old_residual", "2.2", {"add_rms_norm": add_rms_norm_returns_old_residual},
            "add_rms_norm returns the residual it was given: return the new residual x + residual, the "
            "stream the next block adds to", ADD_NORM),
    Mistake("ch2_add_rms_norm_of_x_only", "2.2", {"add_rms_norm": add_rms_norm_of_x_only},
            "add_rms_norm normalizes x alone: normalize the sum x + residual (normed = rms_norm(new_residual, "
            "...))", ADD_NORM),
    Mistake("ch2_add_rms_norm_in_place", "2.2", {"add_rms_norm": add_rms_norm_in_place},
            "add_rms_norm adds into the caller's residual tensor in place (residual += x or add_): write "
            "residual = x + residual, a new tensor, so the caller's inputs stay as they were",
            "test_ch2.py::test_add_rms_norm_leaves_its_inputs_alone"),
    Mistake("ch2_rope_exponent_halved", "2.3", {"rope_cos_sin": rope_cos_sin_exponent_halved},
            "rope_cos_sin's frequencies use base ** (-j / d): the exponent is -2j / d for j < d/2, i.e. "
            "torch.arange(0, d, 2) / d", "test_ch2.py::test_rope_cos_sin_matches_qwen3_rotary_embedding",
            {"theta": 10000.0}),
    Mistake("ch2_rope_sign_flipped", "2.3", {"apply_rotary": apply_rotary_sign_flipped},
            "apply_rotary rotates by -angle: the first half is x1 * cos - x2 * sin and the second half "
            "x2 * cos + x1 * sin (check which term carries the minus sign)", ROTARY, {"offsets": (0, 0, 0, 0)}),
    Mistake("ch2_rope_interleaved_pairs", "2.3", {"apply_rotary": apply_rotary_interleaved},
            "apply_rotary rotates interleaved pairs (x[0], x[1]), (x[2], x[3]), ... (the GPT-J layout): Qwen "
            "and Llama pair dimension j with j + d/2, so split x into its two halves with x.chunk(2, dim=-1)",
            ROTARY, {"offsets": (0, 0, 0, 0)}),
    Mistake("ch2_rope_ignores_positions", "2.3", {"apply_rotary": apply_rotary_ignoring_positions},
            "apply_rotary takes cache row i for the i-th token of the batch: index the cache with the "
            "tokens' positions (cos_sin[positions]), which restart at each sequence and skip a cached prefix",
            ROTARY, {"offsets": (7, 100, 0, 300)}),
    Mistake("ch2_attention_sees_next_key", "2.4", {"causal_attention": attention_sees_next_key},
            "the causal mask is off by one: each query also sees the key after it; query i (at position "
            "Lk - Lq + i) sees keys 0 .. Lk - Lq + i, so tril(diagonal=Lk - Lq)", PREFILL_ATTN,
            {"heads": (4, 4)}),
    Mistake("ch2_attention_mask_not_aligned_to_end", "2.4", {"causal_attention": attention_mask_not_aligned_to_end},
            "the causal mask starts the queries at position 0: with fewer queries than keys (a decode, a "
            "cached prefix) query i sits at position Lk - Lq + i, so tril(diagonal=Lk - Lq), not tril()",
            "test_ch2.py::test_causal_attention_with_fewer_queries_than_keys_matches_sdpa", {"lq": 1}),
    Mistake("ch2_attention_kv_heads_tiled", "2.4", {"causal_attention": attention_kv_heads_tiled},
            "GQA maps query heads to the wrong KV heads (k.repeat tiles them: head h reads KV head h % Hkv): "
            "consecutive query heads share a KV head, h reads KV head h // (H // Hkv), which is what "
            "repeat_interleave(H // Hkv, dim=1) gives", PREFILL_ATTN, {"heads": (4, 2)}),
    Mistake("ch2_attention_without_scale", "2.4", {"causal_attention": attention_without_scale},
            "the scores are never multiplied by scale: softmax(q . k * scale)", PREFILL_ATTN, {"heads": (4, 4)}),
    Mistake("ch2_silu_on_up", "2.5", {"silu_and_mul": silu_on_up},
            "SiLU is applied to the wrong half: x is [gate | up], so silu(first half) * second half", MLP,
            {"shape": (18, 64)}),
    Mistake("ch2_silu_interleaved", "2.5", {"silu_and_mul": silu_interleaved},
            "gate and up are taken from even and odd columns: they are the two halves, x.chunk(2, dim=-1)", MLP,
            {"shape": (18, 64)}),
    Mistake("ch2_sigmoid_instead_of_silu", "2.5", {"silu_and_mul": sigmoid_instead_of_silu},
            "sigmoid(gate) * up is missing a factor: silu(gate) = gate * sigmoid(gate) (F.silu)", MLP,
            {"shape": (18, 64)}),
    Mistake("ch2_layer_qk_norm_after_rope", "2.6", {"decoder_layer": layer_qk_norm_after_rope},
            "q and k are normalized after RoPE: apply QK-norm per head (q_norm, k_norm) BEFORE rotating them", LAYER,
            {"first": True}),
    Mistake("ch2_layer_residual_not_carried", "2.6", {"decoder_layer": layer_residual_not_carried},
            "the incoming residual is dropped: only the first layer (residual=None) starts the stream; later "
            "layers call apply_rms_norm(hidden_states, weight, eps, residual), which adds it", LAYER,
            {"first": False}),
    Mistake("ch2_layer_post_norm_without_residual", "2.6", {"decoder_layer": layer_post_norm_without_residual},
            "the attention output never joins the residual stream: post_attention_layernorm is a fused add + "
            "norm, h, residual = apply_rms_norm(h, p.post_norm, p.eps, residual)", LAYER, {"first": True}),
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
]
