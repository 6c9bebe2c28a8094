"""Chapter 2 exercise stubs. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand; students: fill in the bodies here, then grade one exercise with
    make grade EX=2.1            (or: pytest tests/exercises -m ex2_1)

Exercise 2.1: rms_norm  (notebooks/02_decoder_layer.ipynb, section '2. RMSNorm')
Exercise 2.2: add_rms_norm  (notebooks/02_decoder_layer.ipynb, section '3. The residual stream and fused add+RMSNorm')
Exercise 2.3: rope_cos_sin, apply_rotary  (notebooks/02_decoder_layer.ipynb, section '4. Rotary position embedding')
Exercise 2.4: causal_attention  (notebooks/02_decoder_layer.ipynb, section '5. Attention: GQA and the causal mask')
Exercise 2.5: silu_and_mul  (notebooks/02_decoder_layer.ipynb, section '6. The MLP: SwiGLU')
Exercise 2.6: decoder_layer  (notebooks/02_decoder_layer.ipynb, section '7. The whole decoder layer')
Exercise 2.12: add_rms_norm_kernel  (notebooks/02_decoder_layer.ipynb, section '8. A Triton kernel for add+RMSNorm')
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from minillm.layers.layernorm import apply_rms_norm
from minillm.models.qwen3 import DecoderLayerParams


# ---- Exercise 2.1 (notebooks/02_decoder_layer.ipynb, section '2. RMSNorm'), from minillm.layers.layernorm ----
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square normalization over the last dimension, then a learned per-channel scale.

    x: [..., d] (any dtype), weight: [d], eps: float -> [..., d]:
        weight * (x / sqrt(mean(x**2 over the last dim) + eps))
    The statistics are computed in fp32 whatever x's dtype; the normalized x is cast back to
    x.dtype *before* the multiplication by weight, as transformers' Qwen3RMSNorm does (so bf16
    results round the same way). The result's dtype is then that of weight * x.

    Hints: x.float(), pow(2).mean(dim=-1, keepdim=True), torch.rsqrt. No centering (no mean
    subtraction) and no bias: that is the difference from LayerNorm.
    """
    raise NotImplementedError("Exercise 2.1: implement rms_norm in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '2. RMSNorm')")


# ---- Exercise 2.2 (notebooks/02_decoder_layer.ipynb, section '3. The residual stream and fused add+RMSNorm'), from minillm.layers.layernorm ----
def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add a block's output to the residual stream, then normalize the sum: the engine's
    `input_layernorm(hidden_states, residual)`.

    x: [N, d] (the previous block's output), residual: [N, d] (the stream so far), weight: [d]
    -> (normed, new_residual), both [N, d]:
        new_residual = x + residual          (in x.dtype, like the unfused `residual + hidden`)
        normed       = rms_norm(new_residual, weight, eps)

    Hints: two lines; reuse rms_norm. Return the new residual too: the next block adds to it.
    """
    raise NotImplementedError("Exercise 2.2: implement add_rms_norm in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '3. The residual stream and fused add+RMSNorm')")


# ---- Exercise 2.3 (notebooks/02_decoder_layer.ipynb, section '4. Rotary position embedding'), from minillm.layers.rotary ----
def rope_cos_sin(head_dim: int, max_position: int, base: float) -> torch.Tensor:
    """The cos/sin cache, computed once per model: row p holds position p's rotation.

    head_dim: d (even), max_position: P, base: rope theta (10,000 for Llama, 1,000,000 for Qwen3)
    -> [P, d] fp32: [cos(p * theta_j) for j < d/2 | sin(p * theta_j) for j < d/2] in row p,
    with theta_j = base ** (-2j / d).

    Hints: inv_freq from torch.arange(0, d, 2) (compute the exponent in fp32 as transformers does,
    so the angles agree to the last bit); an outer product of positions and inv_freq gives the
    [P, d/2] angles; torch.cat the cos and sin halves.
    """
    raise NotImplementedError("Exercise 2.3: implement rope_cos_sin in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '4. Rotary position embedding')")


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate every head of every token by its own position (neox layout: halves, not pairs).

    x: [N, heads, d] queries or keys of a packed batch (several sequences back to back),
    positions: [N] int, each token's position in its own sequence (they restart at each sequence
    start, and start past the cached prefix in a decode or prefix-cached step),
    cos_sin: [P, d] from rope_cos_sin -> [N, heads, d] in x.dtype, math in fp32:
        x1, x2 = the first and second halves of x's last dim
        out = [x1 * cos - x2 * sin | x2 * cos + x1 * sin]   with cos, sin taken at each token's position

    Hints: index the cache with positions (cos_sin[positions]: [N, d]), then unsqueeze a heads axis
    so one row broadcasts over all heads; chunk(2, dim=-1) splits halves.
    """
    raise NotImplementedError("Exercise 2.3: implement apply_rotary in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '4. Rotary position embedding')")


# ---- Exercise 2.4 (notebooks/02_decoder_layer.ipynb, section '5. Attention: GQA and the causal mask'), from minillm.layers.attention ----
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence of grouped-query attention, causal, queries aligned to the end of the keys.

    q: [Lq, H, D], k/v: [Lk, Hkv, D] with H % Hkv == 0 and Lq <= Lk, scale: usually D ** -0.5
    -> [Lq, H, D] in q.dtype, math in fp32:
        out[i, h] = softmax_j(q[i, h] . k[j, g] * scale) @ v[:, g]    with g = h // (H // Hkv)
    Query i sits at position Lk - Lq + i (the keys before the queries are a cached prefix) and sees
    keys 0 .. Lk - Lq + i; later keys are masked out. Lq == Lk is a plain prefill, Lq == 1 a decode.

    Hints: repeat_interleave the KV heads H // Hkv times along the head axis (query heads
    g*(H/Hkv) .. (g+1)*(H/Hkv)-1 share KV head g); torch.einsum for the two products; a boolean
    mask from torch.ones(Lq, Lk).tril(diagonal=Lk - Lq); masked_fill with -inf before the softmax.
    """
    raise NotImplementedError("Exercise 2.4: implement causal_attention in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '5. Attention: GQA and the causal mask')")


# ---- Exercise 2.5 (notebooks/02_decoder_layer.ipynb, section '6. The MLP: SwiGLU'), from minillm.layers.activation ----
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The SwiGLU gate on the packed output of the gate_up projection.

    x: [..., 2*I] = [gate | up] (the first half is gate_proj's output, the second up_proj's)
    -> [..., I] in x.dtype: silu(gate) * up, where silu(g) = g * sigmoid(g).

    Hints: chunk(2, dim=-1); torch.nn.functional.silu.
    """
    raise NotImplementedError("Exercise 2.5: implement silu_and_mul in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '6. The MLP: SwiGLU')")


# ---- Exercise 2.6 (notebooks/02_decoder_layer.ipynb, section '7. The whole decoder layer'), from minillm.models.qwen3 ----
def decoder_layer(positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                  p: DecoderLayerParams) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer on a packed batch, the residual stream carried beside the hidden states.

    positions: [N] int, hidden_states: [N, hidden] (the previous layer's MLP output, or the
    embeddings for the first layer), residual: [N, hidden] (the stream so far) or None for the
    first layer, p: DecoderLayerParams -> (mlp_out [N, hidden], residual [N, hidden]); the layer's
    full output, what transformers' Qwen3DecoderLayer returns, is their sum. With H, Hkv, D =
    p.num_heads, p.num_kv_heads, p.head_dim:

        h, residual = input_layernorm(hidden_states, residual)       (first layer: residual = hidden_states)
        q, k, v = split qkv_proj(h) into H*D | Hkv*D | Hkv*D, viewed as [N, H, D], [N, Hkv, D], [N, Hkv, D]
        q, k = q_norm(q), k_norm(k) per head over D                   (only when p.q_norm is not None)
        q, k = RoPE(q), RoPE(k) at `positions`
        h = o_proj(attn(q, k, v) flattened to [N, H*D])
        h, residual = post_attention_layernorm(h, residual)
        return down_proj(silu_and_mul(gate_up_proj(h))), residual

    Hints: every norm goes through apply_rms_norm(x, weight, eps, residual=None)
    (minillm.layers.layernorm: the torch functions of 2.1/2.2 on CPU, the Triton kernel of 2.12 on
    CUDA); apply_rotary and silu_and_mul are exercises 2.3 and 2.5. QK-norm comes before RoPE.
    """
    raise NotImplementedError("Exercise 2.6: implement decoder_layer in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '7. The whole decoder layer')")


# ---- Exercise 2.12 (notebooks/02_decoder_layer.ipynb, section '8. A Triton kernel for add+RMSNorm'), from minillm.kernels.rmsnorm ----
@triton.jit
def add_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    n_cols, stride_x, stride_residual, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program normalizes one row (program id = row index), in a single pass over memory.

    x_ptr, residual_ptr: [n_rows, n_cols] inputs, rows `stride_x` / `stride_residual` elements apart
    (columns contiguous); weight_ptr: [n_cols]; out_ptr, residual_out_ptr: [n_rows, n_cols]
    contiguous outputs (row stride n_cols). BLOCK_N: a power of two >= n_cols.
        h = x + residual                      (only when HAS_RESIDUAL; else h = x)
        residual_out = h                      (only when HAS_RESIDUAL)
        out = (h * rsqrt(mean(h**2) + eps)) * weight
    Store outputs in the output tensors' dtype (residual_out_ptr.dtype.element_ty).

    Hints: cols = tl.arange(0, BLOCK_N) and a mask cols < n_cols on every load and store (rows of
    576 columns leave 448 lanes of a 1024 block idle; the interpreter reads junk there silently).
    Load with other=0.0 so masked lanes add nothing to the sum. Compute in fp32 (.to(tl.float32)
    after each load). To match torch in bf16, round h to the output dtype before storing it and
    before the statistics, and round the normalized row before multiplying by the weight.
    tl.sum(v, axis=0), tl.rsqrt. Divide by n_cols, not BLOCK_N.
    """
    raise NotImplementedError("Exercise 2.12: implement add_rms_norm_kernel in exercises/ch2.py (see notebooks/02_decoder_layer.ipynb, section '8. A Triton kernel for add+RMSNorm')")


# exercise: given
def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                    num_warps: int | None = None):
    """Launch add_rms_norm_kernel, one program per row. x: [..., d] -> normed [..., d] in x.dtype;
    with residual [..., d] -> (normed, x + residual). num_warps: None picks 16 bytes per thread."""
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected ({d},) to match x's last dimension")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)}; expected x's shape {tuple(x.shape)}")
    x2 = x.reshape(-1, d)  # a view when it can be (rows may be strided), else a copy
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    r2 = x2 if residual is None else residual.reshape(-1, d)
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    r_out = out if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n_rows = x2.shape[0]
    if n_rows == 0:
        return out if residual is None else (out, r_out)
    block = triton.next_power_of_2(d)
    if num_warps is None:  # a 16-byte vector per thread per load: bf16 x 1024 -> 4 warps
        num_warps = min(max(block * x.element_size() // (16 * 32), 1), 16)
    add_rms_norm_kernel[(n_rows,)](
        x2, r2, weight, out, r_out, d, x2.stride(0), r2.stride(0), eps,
        HAS_RESIDUAL=residual is not None, BLOCK_N=block, num_warps=num_warps,
    )
    return out if residual is None else (out, r_out)
