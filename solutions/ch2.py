"""Chapter 2 solutions. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand.

Exercise 2.1: rms_norm  (notebooks/02_decoder_layer.ipynb, section '2. RMSNorm')
Exercise 2.2: add_rms_norm  (notebooks/02_decoder_layer.ipynb, section '3. The residual stream and fused add+RMSNorm')
Exercise 2.3: rope_cos_sin, apply_rotary  (notebooks/02_decoder_layer.ipynb, section '4. Rotary position embedding')
Exercise 2.4: causal_attention  (notebooks/02_decoder_layer.ipynb, section '5. Attention: GQA and the causal mask')
Exercise 2.5: silu_and_mul  (notebooks/02_decoder_layer.ipynb, section '6. The MLP: SwiGLU')
Exercise 2.6: decoder_layer  (notebooks/02_decoder_layer.ipynb, section '7. The whole decoder layer')
Exercise 2.7: add_kernel  (notebooks/02a_triton_primer.ipynb, section '1. Programs, offsets and masks: a vector add')
Exercise 2.8: softmax_kernel  (notebooks/02a_triton_primer.ipynb, section '2. One program per row: softmax')
Exercise 2.9: gather_pages_kernel  (notebooks/02a_triton_primer.ipynb, section '3. A gather through an index table: pages')
Exercise 2.10: matmul_kernel  (notebooks/02a_triton_primer.ipynb, section '4. Tiles and tl.dot: a matmul')
Exercise 2.11: online_softmax_kernel  (notebooks/02a_triton_primer.ipynb, section '5. Online softmax over tiles')
Exercise 2.12: add_rms_norm_kernel  (notebooks/02_decoder_layer.ipynb, section '8. A Triton kernel for add+RMSNorm')
"""
from __future__ import annotations

import minillm.kernels  # noqa: F401,I001  (sets TRITON_INTERPRET=1 without CUDA)
import math
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from minillm.course.triton_primer import ADD_BLOCK
from minillm.course.triton_primer import GATHER_BLOCK_T
from minillm.course.triton_primer import MATMUL_TILES_CPU
from minillm.course.triton_primer import MATMUL_TILES_CUDA
from minillm.course.triton_primer import MIN_DOT_DIM
from minillm.course.triton_primer import ONLINE_BLOCK_N
from minillm.course.triton_primer import _output
from minillm.course.triton_primer import _warps_for
from minillm.kernels.gemv import pdl_args
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
    orig_dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * x.to(orig_dtype)


# ---- Exercise 2.2 (notebooks/02_decoder_layer.ipynb, section '3. The residual stream and fused add+RMSNorm'), from minillm.layers.layernorm ----
def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add a block's output to the residual stream, then normalize the sum: the engine's
    `input_layernorm(hidden_states, residual)`.

    x: [N, d] (the previous block's output), residual: [N, d] (the stream so far), weight: [d]
    -> (normed, new_residual), both [N, d]:
        new_residual = x + residual          (as torch adds them, like the unfused `residual + hidden`:
                                              bf16 + bf16 stays bf16; fp32 with bf16 gives fp32)
        normed       = rms_norm(new_residual, weight, eps)

    Hints: two lines; reuse rms_norm. Return the new residual too: the next block adds to it.
    """
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


# ---- Exercise 2.3 (notebooks/02_decoder_layer.ipynb, section '4. Rotary position embedding'), from minillm.layers.rotary ----
def rope_cos_sin(head_dim: int, max_position: int, base: float) -> torch.Tensor:
    """The cos/sin cache, computed once per model: row p holds position p's rotation.

    head_dim: d (even), max_position: P, base: rope theta (10,000 for Llama, 1,000,000 for Qwen3)
    -> [P, d] fp32: [cos(p * theta_j) for j < d/2 | sin(p * theta_j) for j < d/2] in row p,
    with theta_j = 1 / base ** (2j / d).

    Hints: compute inv_freq exactly as transformers does, in fp32, so the angles agree to the last bit
    (written as base ** (-2j / d), or in fp64, they differ by up to 3e-4 at 4,096 positions):
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).float() / d)); an outer product of the fp32
    positions and inv_freq gives the [P, d/2] angles; torch.cat the cos and sin halves.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


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
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)  # [N, 1, d/2] each
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


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
    mask from torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=Lk - Lq) (on q's
    device: the engine calls this with GPU tensors); masked_fill with -inf before the softmax.
    """
    Lq, H, _ = q.shape
    Lk, Hkv, _ = k.shape
    k = k.float().repeat_interleave(H // Hkv, dim=1)  # query head h reads KV head h // (H / Hkv)
    v = v.float().repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    visible = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=Lk - Lq)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).to(q.dtype)


# ---- Exercise 2.5 (notebooks/02_decoder_layer.ipynb, section '6. The MLP: SwiGLU'), from minillm.layers.activation ----
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The SwiGLU gate on the packed output of the gate_up projection.

    x: [..., 2*I] = [gate | up] (the first half is gate_proj's output, the second up_proj's)
    -> [..., I] in x.dtype: silu(gate) * up, where silu(g) = g * sigmoid(g).

    Hints: chunk(2, dim=-1); torch.nn.functional.silu.
    """
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


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
    (minillm.layers.layernorm: rms_norm of 2.1, or add_rms_norm of 2.2 when there is a residual);
    apply_rotary and silu_and_mul are exercises 2.3 and 2.5. QK-norm comes before RoPE.
    """
    if residual is None:
        h, residual = apply_rms_norm(hidden_states, p.input_norm, p.eps), hidden_states
    else:
        h, residual = apply_rms_norm(hidden_states, p.input_norm, p.eps, residual)
    n, H, Hkv, D = h.shape[0], p.num_heads, p.num_kv_heads, p.head_dim
    q, k, v = p.qkv_proj(h).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.reshape(n, H, D), k.reshape(n, Hkv, D), v.reshape(n, Hkv, D)
    if p.q_norm is not None:  # Qwen3: normalize each head's q and k, so attention logits stay tame
        q, k = apply_rms_norm(q, p.q_norm, p.eps), apply_rms_norm(k, p.k_norm, p.eps)
    q, k = apply_rotary(q, positions, p.cos_sin), apply_rotary(k, positions, p.cos_sin)
    h = p.o_proj(p.attn(q, k, v).reshape(n, H * D))
    h, residual = apply_rms_norm(h, p.post_norm, p.eps, residual)
    return p.down_proj(silu_and_mul(p.gate_up_proj(h))), residual


# ---- Exercise 2.7 (notebooks/02a_triton_primer.ipynb, section '1. Programs, offsets and masks: a vector add'), from minillm.course.triton_primer ----
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for i < n. Program p (p = tl.program_id(0)) owns elements
    p*BLOCK .. p*BLOCK + BLOCK - 1; the launcher starts cdiv(n, BLOCK) programs, so the last one
    may run past n. x_ptr, y_ptr, out_ptr: contiguous [n], one dtype.

    Hints: offsets = p * BLOCK + tl.arange(0, BLOCK); mask = offsets < n on the loads and on the
    store (lanes past n must read nothing and write nothing: another tensor may live there).
    """
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


# exercise: given
def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = ADD_BLOCK, out: torch.Tensor | None = None):
    """x, y: [n] contiguous, same dtype -> x + y [n] (written into `out` if given), by add_kernel
    with cdiv(n, block) programs of `block` elements (block: a power of two)."""
    if x.shape != y.shape or x.dim() != 1 or x.dtype != y.dtype or not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError(f"vector_add needs two contiguous 1-D tensors of one shape and dtype, got "
                         f"{tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype}")
    n = x.numel()
    out = _output(out, (n,), x)
    if n:
        add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out


# ---- Exercise 2.8 (notebooks/02a_triton_primer.ipynb, section '2. One program per row: softmax'), from minillm.course.triton_primer ----
@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """Softmax of one row per program (row = tl.program_id(0)), the whole row held in registers:
        out[row, :] = exp(x[row, :] - max) / sum(exp(x[row, :] - max))
    x_ptr: [n_rows, n_cols], rows `stride_x` elements apart (columns contiguous); out_ptr: rows
    `stride_out` apart. BLOCK_N: a power of two >= n_cols. Compute in fp32; store in out's dtype.

    Hints: cols = tl.arange(0, BLOCK_N), mask = cols < n_cols. The lanes past n_cols must not
    count: load them as -inf (other=float("-inf")), so exp gives 0 there. Subtract the row's max
    (tl.max(x, axis=0)) before tl.exp: exp(89) already overflows fp32. tl.sum(e, axis=0).
    Row offsets come from the strides, not from n_cols (a row may be a slice of a wider tensor).
    """
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride overflows int32 past 2 GiB
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    out = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


# exercise: given
def softmax_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [R, C] (columns contiguous) -> softmax over each row [R, C] in x.dtype (into `out` if
    given), by softmax_kernel with one program per row."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"softmax_rows needs a 2-D tensor with contiguous rows, got {tuple(x.shape)} "
                         f"with strides {x.stride()}")
    rows, cols = x.shape
    out = _output(out, (rows, cols), x)
    if rows and cols:
        block = triton.next_power_of_2(cols)
        softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK_N=block,
                                num_warps=_warps_for(block, x.element_size()))
    return out


# ---- Exercise 2.9 (notebooks/02a_triton_primer.ipynb, section '3. A gather through an index table: pages'), from minillm.course.triton_primer ----
@triton.jit
def gather_pages_kernel(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                        PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Copy tokens BLOCK_T at a time (program p owns tokens p*BLOCK_T .. p*BLOCK_T + BLOCK_T - 1)
    from a paged cache into a contiguous output, through the page table:
        out[t, :] = cache[table[t // PAGE], t % PAGE, :]          for t < n_tokens
    cache_ptr: [num_pages, PAGE, n_cols], element (page, row, c) at page*stride_page + row*stride_row + c;
    table_ptr: int32 page ids (entries past the last page in use are -1: never follow them);
    out_ptr: [n_tokens, n_cols], rows stride_out apart. BLOCK_D: a power of two >= n_cols.

    Hints: tokens = p * BLOCK_T + tl.arange(0, BLOCK_T) and cols = tl.arange(0, BLOCK_D) make a 2-D
    tile with tokens[:, None] and cols[None, :]. Load the page ids with tl.load(table_ptr + tokens // PAGE,
    mask=tokens < n_tokens) and cast them to int64 before multiplying by stride_page (a big cache
    overflows int32). Mask the tile on both axes, loads and store alike.
    """
    pid = tl.program_id(0)
    tokens = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_D)
    mask_t = tokens < n_tokens
    mask = mask_t[:, None] & (cols < n_cols)[None, :]
    page = tl.load(table_ptr + tokens // PAGE, mask=mask_t, other=0).to(tl.int64)
    src = page[:, None] * stride_page + (tokens % PAGE)[:, None] * stride_row + cols[None, :]
    rows = tl.load(cache_ptr + src, mask=mask)
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * stride_out + cols[None, :], rows, mask=mask)


# exercise: given
def gather_pages(cache: torch.Tensor, page_table: torch.Tensor, n_tokens: int, block_t: int = GATHER_BLOCK_T,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """cache: [num_pages, PAGE, d] (last dim contiguous); page_table: [max_pages] int32 (-1 past the
    last page in use); n_tokens <= max_pages * PAGE -> the sequence's tokens [n_tokens, d] in
    order (into `out` if given), by gather_pages_kernel with cdiv(n_tokens, block_t) programs."""
    num_pages, page, d = cache.shape
    if cache.stride(2) != 1 or page_table.dim() != 1 or page_table.dtype != torch.int32:
        raise ValueError("gather_pages needs a cache with a contiguous last dimension and a 1-D int32 page table")
    if n_tokens > page_table.numel() * page:
        raise ValueError(f"{n_tokens} tokens need {math.ceil(n_tokens / page)} pages; the table holds "
                         f"{page_table.numel()}")
    out = _output(out, (n_tokens, d), cache)
    if n_tokens:
        gather_pages_kernel[(triton.cdiv(n_tokens, block_t),)](
            cache, page_table, out, n_tokens, d, cache.stride(0), cache.stride(1), out.stride(0),
            PAGE=page, BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(d))
    return out


# ---- Exercise 2.10 (notebooks/02a_triton_primer.ipynb, section '4. Tiles and tl.dot: a matmul'), from minillm.course.triton_primer ----
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A @ B, one [BLOCK_M, BLOCK_N] tile of C per program: (pid_m, pid_n) = (tl.program_id(0),
    tl.program_id(1)) owns rows pid_m*BLOCK_M .. +BLOCK_M and columns pid_n*BLOCK_N .. +BLOCK_N.
    a_ptr: [M, K], b_ptr: [K, N], c_ptr: [M, N], each element (i, j) at i*stride_0 + j*stride_1.
    Walk K in steps of BLOCK_K: load an A tile [BLOCK_M, BLOCK_K] and a B tile [BLOCK_K, BLOCK_N],
    acc += tl.dot(a, b). Store acc in C's dtype. Every BLOCK_* is a power of two >= 16.

    Hints: keep acc in fp32 (acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)): a half-precision
    accumulator rounds at every step. The loop covers all of K, the last partial tile too
    (range(0, K, BLOCK_K)), and masks it: k = k0 + tl.arange(0, BLOCK_K), mask k < K on both tiles with
    other=0.0 (zeros add nothing to the dot). Mask rows >= M, columns >= N on the loads and the store.
    """
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


# exercise: given
def tiled_matmul(a: torch.Tensor, b: torch.Tensor, tiles: dict | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """a: [M, K] @ b: [K, N] (same dtype, any strides) -> [M, N] in a.dtype (into `out` if given),
    by matmul_kernel with one program per output tile. tiles: BLOCK_M/N/K (and num_warps,
    num_stages) overriding the device's defaults (MATMUL_TILES_CUDA or MATMUL_TILES_CPU)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"tiled_matmul needs [M, K] and [K, N] of one dtype, got {tuple(a.shape)} {a.dtype} "
                         f"and {tuple(b.shape)} {b.dtype}")
    cfg = {**(MATMUL_TILES_CUDA if a.is_cuda else MATMUL_TILES_CPU), **(tiles or {})}
    if min(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) < MIN_DOT_DIM:
        raise ValueError(f"tl.dot needs tiles of at least {MIN_DOT_DIM} on every side, got {cfg}")
    (M, K), N = a.shape, b.shape[1]
    out = _output(out, (M, N), a)
    if M and N:
        grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
        matmul_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            out.stride(0), out.stride(1), **cfg)
    return out


# ---- Exercise 2.11 (notebooks/02a_triton_primer.ipynb, section '5. Online softmax over tiles'), from minillm.course.triton_primer ----
@triton.jit
def online_softmax_kernel(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One row (query) per program, row = tl.program_id(0), in ONE pass over its keys, BLOCK_N at a time:
        out[row, :] = sum_j softmax(scores[row, :])[j] * values[j, :]
    scores_ptr: [R, n_keys], rows stride_s apart; values_ptr: [n_keys, head_dim], rows stride_v apart;
    out_ptr: [R, head_dim], rows stride_out apart, in its own dtype. BLOCK_D: a power of two >= head_dim.
    Keep three running quantities in fp32 over the tiles seen so far: m (the max score), l (the
    sum of exp(score - m)) and acc[head_dim] (the sum of exp(score - m) * value). When a tile raises
    the max from m to m_new, everything summed so far was scaled by exp(-m): rescale l and acc by
    alpha = exp(m - m_new) before adding the tile's terms. At the end, out = acc / l.

    Hints: m = -inf (a scalar: tl.full([], float("-inf"), tl.float32) or float("-inf")), l = 0.0,
    acc = tl.zeros([BLOCK_D], dtype=tl.float32). Per tile: keys = n0 + tl.arange(0, BLOCK_N); load the
    scores with other=float("-inf") past n_keys (exp gives 0 there) and the values tile
    [BLOCK_N, BLOCK_D] with other=0.0; p = tl.exp(s - m_new); l = l * alpha + tl.sum(p, axis=0);
    acc = acc * alpha + tl.sum(p[:, None] * v, axis=0).
    """
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)  # noqa: E741  (m, l, acc: the names of the FlashAttention paper)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n_keys, BLOCK_N):
        keys = n0 + offs_n
        mask_n = keys < n_keys
        s = tl.load(scores_ptr + row * stride_s + keys, mask=mask_n, other=float("-inf")).to(tl.float32)
        v = tl.load(values_ptr + keys.to(tl.int64)[:, None] * stride_v + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)  # exp(-inf) = 0 on the first tile: nothing to rescale yet
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)  # noqa: E741
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + row * stride_out + offs_d, (acc / l).to(out_ptr.dtype.element_ty), mask=mask_d)


# exercise: given
def softmax_weighted_sum(scores: torch.Tensor, values: torch.Tensor, block_n: int = ONLINE_BLOCK_N,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """scores: [R, L], values: [L, D] (last dims contiguous, L >= 1) -> softmax(scores, -1) @ values,
    [R, D] in values.dtype (into `out` if given), by online_softmax_kernel: one program per row,
    `block_n` keys per tile."""
    if scores.dim() != 2 or values.dim() != 2 or scores.shape[1] != values.shape[0] or scores.shape[1] == 0:
        raise ValueError(f"softmax_weighted_sum needs scores [R, L] and values [L, D] with L >= 1, got "
                         f"{tuple(scores.shape)} and {tuple(values.shape)}")
    if scores.stride(1) != 1 or values.stride(1) != 1:
        raise ValueError("softmax_weighted_sum needs contiguous last dimensions")
    (rows, n_keys), d = scores.shape, values.shape[1]
    out = _output(out, (rows, d), values)
    if rows and d:
        online_softmax_kernel[(rows,)](scores, values, out, n_keys, d, scores.stride(0), values.stride(0),
                                       out.stride(0), BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(d))
    return out


# ---- Exercise 2.12 (notebooks/02_decoder_layer.ipynb, section '8. A Triton kernel for add+RMSNorm'), from minillm.kernels.rmsnorm ----
@triton.jit
def add_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    n_cols, stride_x, stride_residual, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    """One program normalizes one row (program id = row index), in a single pass over memory.

    x_ptr, residual_ptr: [n_rows, n_cols] inputs, rows `stride_x` / `stride_residual` elements apart
    (columns contiguous); weight_ptr: [n_cols] (x's dtype); out_ptr, residual_out_ptr: [n_rows, n_cols]
    contiguous outputs (row stride n_cols). BLOCK_N: a power of two >= n_cols.
        h = x + residual                      (only when HAS_RESIDUAL; else h = x)
        residual_out = h                      (only when HAS_RESIDUAL: without a residual the launcher
                                               passes out itself as residual_out_ptr)
        out = (h * rsqrt(mean(h**2) + eps)) * weight
    Store outputs in the output tensors' dtype (residual_out_ptr.dtype.element_ty).
    USE_PDL (chapter 5's programmatic dependent launch; always False on a CPU): the launcher may start
    this kernel before the one writing x has finished. Begin with `if USE_PDL:` then
    `tl.extra.cuda.gdc_launch_dependents()` and `tl.extra.cuda.gdc_wait()`, which blocks until x is
    written (a kernel without the wait is launched the ordinary way).

    Hints: cols = tl.arange(0, BLOCK_N) and a mask cols < n_cols on every load and store (rows of
    576 columns leave 448 lanes of a 1024 block idle; the interpreter reads junk there silently).
    Load with other=0.0 so masked lanes add nothing to the sum. Compute in fp32 (.to(tl.float32)
    after each load). To match torch in bf16, round twice, each time to the output dtype and back
    (.to(dtype).to(tl.float32)): h, before storing it and before the statistics; and the normalized
    row h * rstd, before multiplying it (in fp32) by the weight.
    tl.sum(v, axis=0), tl.rsqrt. Divide by n_cols, not BLOCK_N.
    """
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride overflows int32 past 2 GiB
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype)  # the new residual, rounded as torch's `x + residual` is
        tl.store(residual_out_ptr + row * n_cols + cols, h, mask=mask)
        h = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (h * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * n_cols + cols, out.to(dtype), mask=mask)


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
        **pdl_args(x.device, add_rms_norm_kernel),
    )
    return out if residual is None else (out, r_out)
