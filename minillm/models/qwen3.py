"""Qwen3 (and, by config flags, Qwen2 and Llama): the whole forward, top to bottom.

    token_ids -> embed_tokens -> [DecoderLayer x N] -> norm -> lm_head -> logits

A decoder layer is two residual blocks. The residual stream is carried *beside* the hidden
states: each norm adds the previous block's output to the residual and normalizes the sum in one
fused step, `input_layernorm(hidden, residual) -> (normed, new_residual)`.

The layer's math is one pure function, `decoder_layer`, that takes its weights as arguments; the
nn.Modules below only hold the parameters (named as in the checkpoint, sharded over
tensor-parallel ranks by the parallel linear layers) and call it.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import torch
from torch import nn

from minillm.config import ModelConfig
from minillm.context import get_context
from minillm.distributed import tp_size
from minillm.kernels.decode_b1 import decode_attention_b1
from minillm.kernels.gemv import MAX_ROW, gemv, gemv_rms_norm, gemv_silu_mul
from minillm.kernels.qk_norm_rope import qk_norm_rope
from minillm.kernels.rmsnorm import rms_norm_triton
from minillm.kernels.silu_mul import silu_and_mul_triton
from minillm.layers.activation import silu_and_mul
from minillm.layers.attention import Attention, AttentionBackend, TorchBackend
from minillm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minillm.layers.layernorm import RMSNorm, apply_rms_norm
from minillm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minillm.layers.rotary import RotaryEmbedding, apply_rotary

Linear = Callable[[torch.Tensor], torch.Tensor]


class DecoderLayerParams(NamedTuple):
    """What one decoder layer computes with. Norm weights and the RoPE cache are tensors; the
    projections are linear layers (callables: in the engine each is a tensor-parallel layer that
    holds this rank's shard and does its all-reduce, chapter 4); `attn` hides the paged KV cache
    (chapter 3). Head counts are this rank's."""

    input_norm: torch.Tensor  # [hidden]
    qkv_proj: Linear  # [N, hidden] -> [N, (num_heads + 2 * num_kv_heads) * head_dim] = [q | k | v]
    q_norm: torch.Tensor | None  # [head_dim] QK-norm weights (Qwen3); None: no QK-norm (Llama, Qwen2)
    k_norm: torch.Tensor | None  # [head_dim]
    cos_sin: torch.Tensor  # [max_position, head_dim] from rope_cos_sin
    attn: Callable  # (q [N, H, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, H, D], causal within each sequence
    o_proj: Linear  # [N, num_heads * head_dim] -> [N, hidden]
    post_norm: torch.Tensor  # [hidden]
    gate_up_proj: Linear  # [N, hidden] -> [N, 2 * intermediate] = [gate | up]
    down_proj: Linear  # [N, intermediate] -> [N, hidden]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float  # of every RMSNorm in the layer


# >>> exercise 2.6 | notebooks/02_decoder_layer.ipynb | 7. The whole decoder layer
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
# <<< exercise 2.6


LayerForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, DecoderLayerParams],
                        tuple[torch.Tensor, torch.Tensor]]


def eager_decoder_layer(positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                        p: DecoderLayerParams) -> tuple[torch.Tensor, torch.Tensor]:
    """decoder_layer, looked up when called: an exercise 2.6 swapped into this module (notebook
    switch, grader) runs in an engine that was built before the swap."""
    return decoder_layer(positions, hidden_states, residual, p)


def decoder_layer_fused(positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                        p: DecoderLayerParams) -> tuple[torch.Tensor, torch.Tensor]:
    """decoder_layer's math with fewer, fused kernels (chapter 5), the engine's path on CUDA: the
    add+RMSNorm kernel of 2.12, QK-norm + RoPE + the KV-cache store in one kernel that reads q, k and
    v straight out of the qkv projection, and SiLU-and-mul in one pass. At decode sizes each small op
    is launch-bound, so this removes ~20 kernels per layer; the arithmetic and its rounding points are
    the same. p.attn must be minillm's Attention module (the kernel writes into its cache)."""
    n, H, D = hidden_states.shape[0], p.num_heads, p.head_dim
    if residual is None:
        h, residual = rms_norm_triton(hidden_states, p.input_norm, p.eps), hidden_states
    else:
        h, residual = rms_norm_triton(hidden_states, p.input_norm, p.eps, residual)
    q, k, v = _qk_norm_rope_store(p.qkv_proj(h), positions, p)
    h = p.o_proj(p.attn(q, k, v, kv_stored=True).reshape(n, H * D))
    h, residual = rms_norm_triton(h, p.post_norm, p.eps, residual)
    return p.down_proj(silu_and_mul_triton(p.gate_up_proj(h))), residual


def _qk_norm_rope_store(qkv: torch.Tensor, positions: torch.Tensor, p: DecoderLayerParams):
    """QK-norm + RoPE, and k, v written to their cache slots when there is a cache and a slot mapping:
    the attention module's own store (which needs both too) is then skipped with kv_stored=True."""
    slots = get_context().slot_mapping
    cache = (p.attn.k_cache, p.attn.v_cache, slots) if slots is not None and p.attn.k_cache.numel() else ()
    return qk_norm_rope(qkv, positions, p.cos_sin, p.num_heads, p.num_kv_heads, p.head_dim, p.q_norm, p.k_norm,
                        p.eps, *cache)


def decoder_layer_fused_b1(positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                           p: DecoderLayerParams, attention_b1: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """decoder_layer_fused, except for one token (batch-1 decode): each RMSNorm runs inside the GEMV
    after it, SiLU-and-mul inside down_proj's; with attention_b1, QK-norm, RoPE, the KV store and
    attention are one kernel (minillm.kernels.decode_b1, written for the triton backend's cache);
    with PDL each kernel loads what it can while the one before it finishes. Six kernels per layer
    instead of ten (minillm.kernels.gemv). Needs whole projections (no all-reduce) with rows of at
    most MAX_ROW: layer_forward_for checks that once."""
    if hidden_states.shape[0] != 1:
        return decoder_layer_fused(positions, hidden_states, residual, p)
    lin = lambda m: (m.weight, m.bias)  # noqa: E731
    qkv, residual = gemv_rms_norm(hidden_states, p.input_norm, p.eps, *lin(p.qkv_proj), residual)
    ctx, a = get_context(), p.attn
    if attention_b1 and not ctx.is_prefill and ctx.block_tables is not None and a.k_cache.numel():
        o = decode_attention_b1(qkv, positions, p.cos_sin, p.q_norm, p.k_norm, p.eps, a.k_cache, a.v_cache,
                                ctx.slot_mapping, ctx.block_tables, ctx.context_lens, a.scale, p.num_heads,
                                p.num_kv_heads, p.head_dim)
    else:  # a one-token prefill, or the warm-up before the cache exists
        o = a(*_qk_norm_rope_store(qkv, positions, p), kv_stored=True)
    h = gemv(o.reshape(1, p.num_heads * p.head_dim), *lin(p.o_proj))
    gate_up, residual = gemv_rms_norm(h, p.post_norm, p.eps, *lin(p.gate_up_proj), residual)
    return gemv_silu_mul(gate_up, *lin(p.down_proj)), residual


def layer_forward_for(device: str, backend: AttentionBackend, tp: int, cfg: ModelConfig) -> LayerForward:
    """The decoder-layer implementation an engine runs, chosen once, when its model is built: on CPU
    chapter 2's decoder_layer (torch ops); on CUDA decoder_layer_fused, with the batch-1 GEMV path
    when the projections are whole on this rank (TP=1) and their rows fit one GEMV load."""
    if device != "cuda":
        return eager_decoder_layer
    if tp > 1 or max(cfg.hidden_size, cfg.intermediate_size) > MAX_ROW:
        return decoder_layer_fused
    return partial(decoder_layer_fused_b1, attention_b1=backend.name == "triton")


class Qwen3Attention(nn.Module):
    """The attention block's parameters (this rank's heads) and its slice of the KV cache."""

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend):
        super().__init__()
        tp = tp_size()
        self.num_heads = cfg.num_attention_heads // tp
        self.num_kv_heads = cfg.num_key_value_heads // tp
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=cfg.qkv_bias)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.attn = Attention(self.num_heads, self.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5, backend)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's q and k, before RoPE
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm


class Qwen3MLP(nn.Module):
    """The SwiGLU MLP's parameters: [gate | up] packed in one column-parallel matmul, then down."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, layer_forward: LayerForward):
        super().__init__()
        self.layer_forward = layer_forward  # the implementation, chosen at build time (layer_forward_for)
        self.self_attn = Qwen3Attention(cfg, backend)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def params(self) -> DecoderLayerParams:
        a = self.self_attn
        return DecoderLayerParams(
            input_norm=self.input_layernorm.weight, qkv_proj=a.qkv_proj,
            q_norm=a.q_norm.weight if a.qk_norm else None, k_norm=a.k_norm.weight if a.qk_norm else None,
            cos_sin=a.rotary_emb.cos_sin_cache, attn=a.attn, o_proj=a.o_proj,
            post_norm=self.post_attention_layernorm.weight, gate_up_proj=self.mlp.gate_up_proj,
            down_proj=self.mlp.down_proj, num_heads=a.num_heads, num_kv_heads=a.num_kv_heads,
            head_dim=a.head_dim, eps=self.input_layernorm.eps)

    def forward(self, positions, hidden_states, residual):
        """hidden_states: [N, hidden] (the previous block's output), residual: [N, hidden] or None
        for the first layer -> (this layer's MLP output, the residual stream before it)."""
        return self.layer_forward(positions, hidden_states, residual, self.params())


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, layer_forward: LayerForward):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Qwen3DecoderLayer(cfg, backend, layer_forward)
                                     for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class Qwen3ForCausalLM(nn.Module):
    # checkpoint name fragment -> (packed parameter fragment, shard id): the loader's map
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend = TorchBackend,
                 layer_forward: LayerForward = eager_decoder_layer):
        """backend: every layer's attention backend; layer_forward: the decoder-layer implementation
        (the engine passes layer_forward_for's choice; the defaults are chapter 2's torch path)."""
        super().__init__()
        self.model = Qwen3Model(cfg, backend, layer_forward)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.tie_word_embeddings = cfg.tie_word_embeddings

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [N] -> hidden states [N, hidden] (logits come from compute_logits)."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)
