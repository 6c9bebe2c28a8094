"""Chapter 2 graded tests: the decoder layer's pieces against transformers' Qwen3 modules.

References nobody here wrote: transformers.models.qwen3.modeling_qwen3 (Qwen3RMSNorm,
Qwen3RotaryEmbedding + apply_rotary_pos_emb, Qwen3Attention, Qwen3MLP, Qwen3DecoderLayer) built
from a tiny Qwen3Config with seeded weights, and torch's scaled_dot_product_attention. Inputs are
packed variable-length batches (several sequences back to back, as the engine runs them).

    pytest tests/exercises/test_ch2.py --impl=exercises -m ex2_1
"""

import ast
import functools
import inspect
import os
import re
import textwrap

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (Qwen3Attention, Qwen3DecoderLayer, Qwen3MLP, Qwen3RMSNorm,
                                                      Qwen3RotaryEmbedding, apply_rotary_pos_emb)

from helpers import greedy_reference, ref_path, small_engine_args
from minillm import LLM, SamplingParams
from minillm.course.exercises import REPO_DIR, use_impl
from minillm.course.grading import Raised, check_close, check_equal, check_that, check_unmodified, require_written
from minillm.layers.activation import silu_and_mul as silu_and_mul_ref
from minillm.layers.attention import varlen_attention
from minillm.layers.layernorm import rms_norm as rms_norm_ref
from minillm.layers.rotary import apply_rotary as apply_rotary_ref, rope_cos_sin as rope_cos_sin_ref
from minillm.models.qwen3 import DecoderLayerParams
from mistakes import call_pure, on_copies, suspects, then, wrong_versions
from properties import outcome

# named fp32 tolerances (absolute, relative): the same math in another order differs by a few ulps
TOL_NORM = dict(atol=1e-5, rtol=1e-5)  # one reduction over d
TOL_ROPE = dict(atol=1e-5, rtol=1e-5)  # cos/sin of angles up to ~500 rad
TOL_ATTN = dict(atol=2e-5, rtol=1e-4)  # two matmuls and a softmax
TOL_MLP = dict(atol=2e-5, rtol=1e-4)
TOL_LAYER = dict(atol=5e-5, rtol=1e-4)  # a whole layer: seven matmuls, three norms, a softmax
TOL_BF16 = dict(atol=1e-2, rtol=8e-3)  # one bf16 ulp is 2**-8 relative
TOL_FP16 = dict(atol=2e-3, rtol=2e-3)  # one fp16 ulp is 2**-11 relative
# bf16 values that may round the other way when the fp32 statistics sum in another order (another CPU's
# vector width): about 1 in 20,000 elements lies that close to a rounding boundary
BF16_ROUNDING_SLACK = 4
LARGE = 300.0  # activations this large overflow fp16 when squared (fp16 max: 65504)
EXACT = dict(atol=0.0, rtol=0.0)

SEQLENS = [5, 1, 9, 3]  # a packed batch: 4 sequences, 18 tokens, one of length 1
CU = [0, 5, 6, 15, 18]


def tiny_config(**kw) -> Qwen3Config:
    args = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                attention_bias=False, hidden_act="silu")
    args.update(kw)
    cfg = Qwen3Config(**args)
    cfg._attn_implementation = "eager"
    return cfg


def seeded(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere, norms included (their default of ones would hide a missing scale)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim == 1 else p.shape[-1] ** -0.5))
            if p.ndim == 1:
                p.add_(1.0)
    return module.eval()


def randn(*shape, seed=1, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def packed_positions(offsets=(0, 0, 0, 0)) -> torch.Tensor:
    """Each sequence's positions restart at its own start (offset: tokens already in the cache)."""
    return torch.cat([torch.arange(o, o + n) for o, n in zip(offsets, SEQLENS)])


def causal_mask(n: int) -> torch.Tensor:
    """Additive [1, 1, n, n] mask for transformers' eager attention."""
    return torch.full((n, n), float("-inf")).triu(1)[None, None]


def hf_per_sequence(fn, x: torch.Tensor, positions: torch.Tensor, rotary: Qwen3RotaryEmbedding) -> torch.Tensor:
    """Run a transformers module on each sequence of the packed batch alone (batch 1), re-pack."""
    outs = []
    for s, e in zip(CU[:-1], CU[1:]):
        pos = positions[s:e][None]
        out = fn(x[s:e][None], rotary(x, pos), causal_mask(e - s))
        outs.append((out[0] if isinstance(out, tuple) else out)[0])  # some versions return a tuple
    return torch.cat(outs)


# ---- 2.1 RMSNorm ---------------------------------------------------------------------------------
BROADCAST = re.compile(r"RuntimeError: The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def same_broadcast_error(a, b) -> bool:
    """The same error, or torch's broadcast error between the same two sizes in either order (x * r or r * x)."""
    if not (isinstance(a, Raised) and isinstance(b, str)):
        return False
    sizes = [sorted(m.groups()) if (m := BROADCAST.search(t)) else None for t in (a, b)]
    return a == b or (sizes[0] is not None and sizes[0] == sizes[1])


@pytest.mark.ex2_1
@pytest.mark.parametrize("shape", [(18, 64), (18, 4, 16)], ids=["hidden", "per-head"])
def test_rms_norm_matches_qwen3_rmsnorm(impl, shape):
    ref = seeded(Qwen3RMSNorm(shape[-1], eps=1e-6))
    x = randn(*shape) * 3
    with torch.no_grad():
        got = call_pure(lambda *a: outcome(lambda: impl.rms_norm(*a)), "rms_norm", "2.1", x, ref.weight, 1e-6)
        if isinstance(got, Raised):  # (a known bug may raise the same: a mean without keepdim cannot broadcast)
            check_that("", "2.1", f"rms_norm of {list(shape)}", actual=got, same=same_broadcast_error,
                       suspects={hint: (lambda fn=fn: outcome(lambda: on_copies(fn)(x, ref.weight, 1e-6)))
                                 for hint, fn in wrong_versions("rms_norm").items()})
        check_close(got, ref(x), "2.1", f"rms_norm of {list(shape)}", **TOL_NORM,
                    suspects=suspects("rms_norm", x, ref.weight, 1e-6))


@pytest.mark.ex2_1
def test_rms_norm_bf16_keeps_dtype_and_matches(impl):
    """Within TOL_BF16, then bit for bit but for BF16_ROUNDING_SLACK elements: Qwen3RMSNorm rounds the
    normalized x to bf16 BEFORE the weight multiplies it (a bf16 model's norms then round the same way).
    Every fp32 order of the statistics (rsqrt or 1 / sqrt, pow(2) or x * x, mean or sum / d) gives these
    exact bits on the second input here; multiplying by the weight before the cast differs at about 300
    of its 1,152 values, and TOL_BF16 cannot tell (the two differ by one bf16 ulp)."""
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6)).to(torch.bfloat16)
    x = randn(18, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        check_close(call_pure(impl.rms_norm, "rms_norm", "2.1", x, ref.weight, 1e-6), ref(x), "2.1",
                    "rms_norm in bf16", **TOL_BF16,
                    suspects=suspects("rms_norm", x, ref.weight, 1e-6))
        x = randn(18, 64, seed=32, dtype=torch.bfloat16) * 3
        got = call_pure(impl.rms_norm, "rms_norm", "2.1", x, ref.weight, 1e-6)
        if torch.count_nonzero(got != ref(x)) > BF16_ROUNDING_SLACK:
            check_close(got, ref(x), "2.1", "rms_norm in bf16, bit for bit (the normalized x rounded to bf16, "
                        "then times the weight)", **EXACT, suspects=suspects("rms_norm", x, ref.weight, 1e-6))


@pytest.mark.ex2_1
def test_rms_norm_fp16_large_activations(impl):
    """Activations in the hundreds are common in real models: their squares overflow fp16, so the
    statistics must be computed in fp32 (transformers' Qwen3RMSNorm upcasts too)."""
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6)).to(torch.float16)
    x = (randn(18, 64, seed=26) * LARGE).to(torch.float16)
    with torch.no_grad():
        check_close(call_pure(impl.rms_norm, "rms_norm", "2.1", x, ref.weight, 1e-6), ref(x), "2.1",
                    f"rms_norm in fp16 of activations near {LARGE:g}", **TOL_FP16,
                    suspects=suspects("rms_norm", x, ref.weight, 1e-6))


@pytest.mark.ex2_1
def test_rms_norm_uses_eps(impl):
    ref = seeded(Qwen3RMSNorm(64, eps=0.5))
    x = randn(4, 64) * 0.1  # small activations: eps matters
    with torch.no_grad():
        check_close(call_pure(impl.rms_norm, "rms_norm", "2.1", x, ref.weight, 0.5), ref(x), "2.1",
                    "rms_norm with eps=0.5", **TOL_NORM,
                    suspects=suspects("rms_norm", x, ref.weight, 0.5))


@pytest.mark.ex2_1
@pytest.mark.parametrize("dtypes", [("float32", "bfloat16"), ("bfloat16", "float32")], ids=["x-fp32", "x-bf16"])
def test_rms_norm_of_mixed_dtypes_matches_qwen3_rmsnorm(impl, dtypes):
    """x and weight of different dtypes (an fp32 residual stream under a bf16 model's norm, or fp32 weights
    over bf16 activations): Qwen3RMSNorm casts the normalized x back to x's dtype, then multiplies, so
    the result has torch's promotion of the two, and so must yours."""
    x_dtype, w_dtype = (getattr(torch, d) for d in dtypes)
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6)).to(w_dtype)
    x = randn(18, 64, seed=35, dtype=x_dtype) * 3
    with torch.no_grad():
        want = ref(x)
        got = call_pure(impl.rms_norm, "rms_norm", "2.1", x, ref.weight, 1e-6)
        # a known wrong version is named only where its values are yours too, closer than TOL_BF16: a result cast
        # to bf16 at the end, and the mean over d - 1, are each within TOL_BF16 of another known bug
        suspected = then(suspects("rms_norm", x, ref.weight, 1e-6), values_like(got))
        check_equal(str(got.dtype), str(want.dtype), "2.1", f"dtype of rms_norm of {x_dtype} x with {w_dtype} weights",
                    suspects=then(suspected, lambda out: str(out.dtype)))
        check_close(got, want, "2.1", f"rms_norm of {x_dtype} x with {w_dtype} weights", **TOL_BF16,
                    suspects=suspected)


SUSPECT_RTOL = 1e-3  # a known wrong version's values against yours: a bf16 rounding apart (0.4%) is another bug


def values_like(got: torch.Tensor):
    """part() for then(): a known wrong version's output, where it is yours to within SUSPECT_RTOL."""
    def part(out: torch.Tensor) -> torch.Tensor:
        if out.shape != got.shape or not torch.allclose(out.float(), got.float(), rtol=SUSPECT_RTOL, atol=1e-5):
            raise LookupError("this wrong version's values differ from yours")
        return out
    return part


# ---- 2.2 fused add + RMSNorm ---------------------------------------------------------------------
@pytest.mark.ex2_2
@pytest.mark.parametrize("dtypes", [("float32", "bfloat16"), ("bfloat16", "float32")], ids=["x-fp32", "x-bf16"])
def test_add_rms_norm_of_mixed_dtypes_adds_as_torch(impl, dtypes):
    """An fp32 block output on a bf16 stream, or a bf16 one on an fp32 stream: the new residual is x + residual
    as torch adds them (fp32 by its type promotion, whichever of the two is fp32), as transformers' unfused
    `residual + hidden_states` gives it, and the norm is of it."""
    x_dtype, res_dtype = (getattr(torch, d) for d in dtypes)
    what = f"{dtypes[0]} x and a {dtypes[1]} residual"
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6))
    x, res = randn(18, 64, seed=36, dtype=x_dtype) * 0.3, randn(18, 64, seed=37, dtype=res_dtype) * 4
    with torch.no_grad():
        want_res = res + x
        normed, new_res = call_pure(impl.add_rms_norm, "add_rms_norm", "2.2", x, res, ref.weight, 1e-6)
        suspected = suspects("add_rms_norm", x, res, ref.weight, 1e-6)
        check_equal(str(new_res.dtype), str(want_res.dtype), "2.2", f"dtype of the new residual of {what}",
                    suspects=then(suspected, lambda out: str(out[1].dtype)))
        check_close(new_res, want_res, "2.2", f"new residual of {what}", **EXACT,
                    suspects=then(suspected, lambda out: out[1]))
        check_close(normed, ref(want_res), "2.2", f"normed output of {what}", **TOL_NORM,
                    suspects=then(suspected, lambda out: out[0]))


def second_if_first_is(first: torch.Tensor, tol: dict):
    """A known wrong version's second output, named only where its first equals yours too (second look): two
    slips can leave the same second output (outputs swapped, and the normed sum returned twice)."""
    def part(out):
        if out[0].dtype != first.dtype or not torch.allclose(out[0].float(), first.float(), **tol):
            raise LookupError("this wrong version's first output differs from yours")
        return out[1]
    return part


@pytest.mark.ex2_2
def test_add_rms_norm_uses_eps(impl):
    """Llama's and SmolLM2's rms_norm_eps is 1e-5, not Qwen3's 1e-6: a large one here, on small activations."""
    ref = seeded(Qwen3RMSNorm(64, eps=0.5))
    x, res = randn(4, 64, seed=5) * 0.1, randn(4, 64, seed=6) * 0.1
    with torch.no_grad():
        normed, new_res = call_pure(impl.add_rms_norm, "add_rms_norm", "2.2", x, res, ref.weight, 0.5)
        check_close(normed, ref(x + res), "2.2", "normed output of add_rms_norm with eps=0.5", **TOL_NORM,
                    suspects=then(suspects("add_rms_norm", x, res, ref.weight, 0.5), lambda out: out[0]))


@pytest.mark.ex2_2
def test_add_rms_norm_matches_qwen3_rmsnorm_of_the_sum(impl):
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6))
    x, res = randn(18, 64, seed=1), randn(18, 64, seed=2) * 4
    with torch.no_grad():
        want_res = x + res  # before the call: an in-place add is the next test's business
        want = ref(want_res)
        # the wrong versions run on copies, so one that adds in place cannot change what the next one sees
        suspected = {hint: (lambda fn=fn: fn(x.clone(), res.clone(), ref.weight, 1e-6))
                     for hint, fn in wrong_versions("add_rms_norm").items()}
        normed, new_res = impl.add_rms_norm(x, res, ref.weight, 1e-6)
        check_close(new_res, want_res, "2.2", "new residual (x + residual)", **EXACT,
                    suspects=then(suspected, second_if_first_is(normed, TOL_NORM)))
        check_close(normed, want, "2.2", "normed output", **TOL_NORM, suspects=then(suspected, lambda out: out[0]))


@pytest.mark.ex2_2
def test_add_rms_norm_bf16_keeps_the_stream_in_bf16(impl):
    """A bf16 model: the new residual is x + residual in bf16 (the unfused `residual + hidden`), bit for bit."""
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6)).to(torch.bfloat16)
    x, res = randn(18, 64, seed=33, dtype=torch.bfloat16), randn(18, 64, seed=34, dtype=torch.bfloat16) * 4
    with torch.no_grad():
        want_res = x + res
        normed, new_res = call_pure(impl.add_rms_norm, "add_rms_norm", "2.2", x, res, ref.weight, 1e-6)
        suspected = suspects("add_rms_norm", x, res, ref.weight, 1e-6)
        check_close(new_res, want_res, "2.2", "new residual in bf16 (x + residual)", **EXACT,
                    suspects=then(suspected, second_if_first_is(normed, TOL_BF16)))
        check_close(normed, ref(want_res), "2.2", "normed output in bf16", **TOL_BF16,
                    suspects=then(suspected, lambda out: out[0]))
        # then bit for bit but for BF16_ROUNDING_SLACK elements: the norm of the bf16 sum it returns (normalizing
        # the unrounded fp32 sum differs by one bf16 ulp at hundreds of elements, which TOL_BF16 cannot tell)
        if torch.count_nonzero(normed != ref(want_res)) > BF16_ROUNDING_SLACK:
            check_close(normed, ref(want_res), "2.2", "normed output in bf16, bit for bit (the norm of the new "
                        "residual as returned, in bf16)", **EXACT, suspects=then(suspected, lambda out: out[0]))


@pytest.mark.ex2_2
def test_add_rms_norm_leaves_its_inputs_alone(impl):
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6))
    x, res = randn(6, 64, seed=3), randn(6, 64, seed=4)
    x0, res0 = x.clone(), res.clone()
    with torch.no_grad():
        impl.add_rms_norm(x, res, ref.weight, 1e-6)

    def inputs_after(fn):  # what a wrong version leaves in fresh copies of the inputs
        args = (x0.clone(), res0.clone(), ref.weight, 1e-6)
        with torch.no_grad():
            fn(*args)
        return args

    wrong = wrong_versions("add_rms_norm")
    check_close(x, x0, "2.2", "x after the call (must not be modified in place)", **EXACT,
                suspects={hint: (lambda fn=fn: inputs_after(fn)[0]) for hint, fn in wrong.items()})
    check_close(res, res0, "2.2", "residual after the call (must not be modified in place)", **EXACT,
                suspects={hint: (lambda fn=fn: inputs_after(fn)[1]) for hint, fn in wrong.items()})


# ---- 2.3 rotary embedding ------------------------------------------------------------------------
@pytest.mark.ex2_3
@pytest.mark.parametrize("theta", [10000.0, 1000000.0])
def test_rope_cos_sin_matches_qwen3_rotary_embedding(impl, theta):
    cfg = tiny_config(rope_parameters={"rope_type": "default", "rope_theta": theta})
    rot = Qwen3RotaryEmbedding(cfg)
    cache = impl.rope_cos_sin(16, 512, theta)
    cos, sin = rot(torch.zeros(1), torch.arange(512)[None])  # [1, 512, 16] each: halves repeated
    check_close(cache, torch.cat([cos[0, :, :8], sin[0, :, :8]], dim=-1), "2.3", "rope_cos_sin cache", **TOL_ROPE,
                suspects=suspects("rope_cos_sin", 16, 512, theta))


ROPE_SAME_ANGLES = dict(atol=1e-6, rtol=0)  # the same fp32 angles: cos and sin may differ in their last bit between
# one machine's vector path and another's (a tail computed by scalar code), never by 1e-6; another angle by 1e-4


@pytest.mark.ex2_3
def test_rope_cos_sin_has_transformers_angles_at_qwen3s_shape(impl):
    """head_dim 128, theta 1e6, 4,096 positions: transformers' table, its fp32 angles (the docstring's recipe
    gives them; an fp64 table, or inv_freq rounded another way, differs by up to ~3e-4 there, and the model's
    logits then differ from transformers')."""
    d, positions, theta = 128, 4096, 1_000_000.0
    cfg = tiny_config(head_dim=d, max_position_embeddings=positions,
                      rope_parameters={"rope_type": "default", "rope_theta": theta})
    cos, sin = Qwen3RotaryEmbedding(cfg)(torch.zeros(1), torch.arange(positions)[None])
    check_close(impl.rope_cos_sin(d, positions, theta), torch.cat([cos[0, :, :d // 2], sin[0, :, :d // 2]], dim=-1),
                "2.3", f"rope_cos_sin({d}, {positions}, {theta:g}) against transformers' Qwen3RotaryEmbedding (its "
                "fp32 angles: within 1e-6)", **ROPE_SAME_ANGLES, suspects=suspects("rope_cos_sin", d, positions, theta))


@pytest.mark.ex2_3
@pytest.mark.parametrize("offsets", [(0, 0, 0, 0), (7, 100, 0, 300)], ids=["prefill", "cached-prefix"])
def test_apply_rotary_on_a_packed_batch_matches_transformers(impl, offsets):
    cfg = tiny_config()
    rot = Qwen3RotaryEmbedding(cfg)
    positions = packed_positions(offsets)
    q, k = randn(18, 4, 16, seed=5), randn(18, 2, 16, seed=6)
    cache = rope_cos_sin_ref(16, 512, 10000.0)
    cos, sin = rot(q, positions[None])  # [1, N, D]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    check_close(call_pure(impl.apply_rotary, "apply_rotary", "2.3", q, positions, cache), want_q[0].transpose(0, 1),
                "2.3", "rotated q", **TOL_ROPE, suspects=suspects("apply_rotary", q, positions, cache))
    check_close(call_pure(impl.apply_rotary, "apply_rotary", "2.3", k, positions, cache), want_k[0].transpose(0, 1),
                "2.3", "rotated k", **TOL_ROPE, suspects=suspects("apply_rotary", k, positions, cache))


@pytest.mark.ex2_3
def test_apply_rotary_keeps_dtype(impl):
    """bf16 in, bf16 out, the math in fp32 and rounded once: transformers' apply_rotary_pos_emb on the fp32
    values, rounded to bf16, to the bit (the same math in bf16 differs by a bf16 step at ~15% of them)."""
    cache = rope_cos_sin_ref(16, 64, 10000.0)
    q = randn(5, 2, 16, seed=7, dtype=torch.bfloat16)
    out = call_pure(impl.apply_rotary, "apply_rotary", "2.3", q, torch.arange(5), cache)
    check_equal(out.dtype, torch.bfloat16, "2.3", "apply_rotary's output dtype (must be x.dtype)")
    cos, sin = (torch.cat([half, half], dim=-1)[None] for half in cache[:5].chunk(2, dim=-1))  # [1, 5, 16] each
    want = apply_rotary_pos_emb(q.float().transpose(0, 1)[None], q.float().transpose(0, 1)[None], cos, sin)[0]
    check_close(out, want[0].transpose(0, 1).to(torch.bfloat16), "2.3", "rotated bf16 q (the math in fp32, rounded "
                "once to bf16 at the end)", **EXACT, suspects=suspects("apply_rotary", q, torch.arange(5), cache))


# ---- 2.4 causal attention ------------------------------------------------------------------------
def sdpa(q, k, v, scale, mask=None, causal=False):
    """torch's SDPA on [L, H, D] tensors, GQA by enable_gqa."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                         is_causal=causal, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


@pytest.mark.ex2_4
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 1)], ids=["MHA", "GQA", "MQA"])
def test_causal_attention_prefill_matches_sdpa(impl, heads):
    H, Hkv = heads
    q, k, v = randn(9, H, 16, seed=8), randn(9, Hkv, 16, seed=9), randn(9, Hkv, 16, seed=10)
    check_close(call_pure(impl.causal_attention, "causal_attention", "2.4", q, k, v, 0.25),
                sdpa(q, k, v, 0.25, causal=True), "2.4",
                f"attention of 9 queries, {H} query heads, {Hkv} KV heads", **TOL_ATTN,
                suspects=suspects("causal_attention", q, k, v, 0.25))


@pytest.mark.ex2_4
@pytest.mark.parametrize("lq", [1, 4], ids=["decode", "cached-prefix"])
def test_causal_attention_with_fewer_queries_than_keys_matches_sdpa(impl, lq):
    """A known wrong version is named only when it also gives your output with the other number of queries
    (second look): a mask whose offset has the wrong sign and an inverted mask both leave a decode query with
    no key (all NaN), but not 4 queries over 11 keys."""
    lk, scale = 11, 0.3  # not 16 ** -0.5: the scale is an argument (Gemma's is not head_dim ** -0.5)
    q, k, v = randn(lq, 4, 16, seed=11), randn(lk, 2, 16, seed=12), randn(lk, 2, 16, seed=13)
    visible = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)  # query i sits at lk - lq + i
    other = (randn(5 - lq, 4, 16, seed=11), k, v, scale)  # lq 1 <-> 4
    yours = functools.cache(lambda: on_copies(impl.causal_attention)(*other))

    def like_yours_with_other_lq(fn):
        """fn's output here, if fn also gives yours with the other number of queries."""
        theirs, mine = on_copies(fn)(*other), yours()
        if theirs.shape != mine.shape or not torch.allclose(theirs.double(), mine.double(), equal_nan=True,
                                                            **TOL_ATTN):
            raise LookupError("this wrong version differs from yours with the other number of queries")
        return on_copies(fn)(q, k, v, scale)

    check_close(call_pure(impl.causal_attention, "causal_attention", "2.4", q, k, v, scale),
                sdpa(q, k, v, scale, mask=visible), "2.4",
                f"attention of {lq} queries over {lk} keys (scale {scale})", **TOL_ATTN,
                suspects={hint: (lambda fn=fn: like_yours_with_other_lq(fn))
                          for hint, fn in wrong_versions("causal_attention").items()})


ATTN_LOGIT_GAIN = 40  # q scaled up: the case's largest visible attention score goes from ~3 to past 88.7


@pytest.mark.ex2_4
def test_causal_attention_logits_past_88_in_fp32(impl):
    """fp32 with attention scores past 88.7, where fp32's exp overflows to inf: a softmax written as
    exp(s) / exp(s).sum() then gives inf / inf = NaN; subtracting the row's max first (as torch.softmax and
    SDPA do) keeps every exponent <= 0. Against SDPA in float64."""
    q, k, v = randn(9, 4, 16, seed=8) * ATTN_LOGIT_GAIN, randn(9, 2, 16, seed=9), randn(9, 2, 16, seed=10)
    scale = 0.25
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(2, dim=1)) * scale
    largest = float(scores.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf")).max())
    assert largest > 88.8  # the premise: a visible score past exp's fp32 range
    want = sdpa(q.double(), k.double(), v.double(), scale, causal=True).float()
    check_close(call_pure(impl.causal_attention, "causal_attention", "2.4", q, k, v, scale), want, "2.4",
                f"attention in fp32 with scores up to {largest:.1f} (9 queries, 4 query heads, 2 KV heads)",
                **TOL_ATTN, suspects=suspects("causal_attention", q, k, v, scale))


BF16_ATTN_SCALE = 0.3  # not a power of two: q * scale taken in bf16 rounds (0.25 would be exact)


@pytest.mark.ex2_4
def test_causal_attention_bf16_keeps_dtype_and_matches(impl):
    """The engine runs attention in bf16: the result must come back in q.dtype (the math in fp32),
    compared with SDPA on the same bf16 values in fp32, rounded to bf16 once. The scale is not a power of
    two (a model's is head_dim ** -0.5), so q * scale taken in bf16 rounds too."""
    q, k, v = (randn(9, h, 16, seed=s, dtype=torch.bfloat16) for h, s in ((4, 29), (2, 30), (2, 31)))
    scale = BF16_ATTN_SCALE
    want = sdpa(q.float(), k.float(), v.float(), scale, causal=True).to(torch.bfloat16)
    got = call_pure(impl.causal_attention, "causal_attention", "2.4", q, k, v, scale)
    check_close(got, want, "2.4", "attention in bf16 of 9 queries, 4 query heads, 2 KV heads (must be q.dtype)",
                **TOL_BF16, suspects=suspects("causal_attention", q, k, v, scale))
    # then bit for bit but for BF16_ROUNDING_SLACK elements: fp32 math rounded once gives SDPA's bits here; the
    # same math in bf16 (no .float()) rounds at every step and differs at about a third of the 576 values,
    # within TOL_BF16 of them
    if torch.count_nonzero(got != want) > BF16_ROUNDING_SLACK:
        check_close(got, want, "2.4", "attention in bf16, bit for bit (the math in fp32, rounded to bf16 once)",
                    **EXACT, suspects=suspects("causal_attention", q, k, v, scale))


@pytest.mark.ex2_4
def test_attention_block_on_a_packed_batch_matches_qwen3_attention(impl):
    """Your causal_attention, per sequence over cu_seqlens, inside an attention block built from
    minillm's reference pieces (QK-norm, RoPE) equals transformers' Qwen3Attention."""
    cfg = tiny_config()
    attn, rot = seeded(Qwen3Attention(cfg, layer_idx=0)), Qwen3RotaryEmbedding(cfg)
    x, positions = randn(18, 64, seed=14), packed_positions((0, 3, 0, 40))
    cache = rope_cos_sin_ref(16, 512, 10000.0)
    with torch.no_grad():
        want = hf_per_sequence(lambda h, pe, m: attn(h, pe, m)[0], x, positions, rot)
        q = rms_norm_ref(F.linear(x, attn.q_proj.weight).view(18, 4, 16), attn.q_norm.weight, 1e-6)
        k = rms_norm_ref(F.linear(x, attn.k_proj.weight).view(18, 2, 16), attn.k_norm.weight, 1e-6)
        v = F.linear(x, attn.v_proj.weight).view(18, 2, 16)
        q, k = apply_rotary_ref(q, positions, cache), apply_rotary_ref(k, positions, cache)

        def block(attention):
            o = torch.cat([attention(q[s:e], k[s:e], v[s:e], 16 ** -0.5) for s, e in zip(CU[:-1], CU[1:])])
            return F.linear(o.reshape(18, 64), attn.o_proj.weight)

        wrong = wrong_versions("causal_attention")
        got = block(lambda *args: call_pure(impl.causal_attention, "causal_attention", "2.4", *args))
        check_close(got, want, "2.4", "attention block output", **TOL_ATTN,
                    suspects={hint: (lambda fn=fn: block(on_copies(fn))) for hint, fn in wrong.items()})


# ---- 2.5 SiLU-and-mul ----------------------------------------------------------------------------
@pytest.mark.ex2_5
@pytest.mark.parametrize("shape", [(18, 64), (2, 9, 64)], ids=["packed", "batched"])
def test_silu_and_mul_makes_qwen3_mlp(impl, shape):
    mlp = seeded(Qwen3MLP(tiny_config()))
    x = randn(*shape, seed=15)
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])  # packed [gate | up], as the engine loads it
    with torch.no_grad():
        packed = F.linear(x, gate_up)
        gated = call_pure(impl.silu_and_mul, "silu_and_mul", "2.5", packed)
        # first what goes into down_proj, against transformers' own act_fn(gate_proj(x)) * up_proj(x): a result of
        # the wrong shape (the halves taken along another dimension) fails here, named, not inside down_proj
        check_close(gated, mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x), "2.5", "silu_and_mul(gate_up_proj(x))",
                    **TOL_MLP, suspects=suspects("silu_and_mul", packed))
        got = F.linear(gated, mlp.down_proj.weight)
        check_close(got, mlp(x), "2.5", "down_proj(silu_and_mul(gate_up_proj(x)))", **TOL_MLP,
                    suspects=then(suspects("silu_and_mul", packed), lambda out: F.linear(out, mlp.down_proj.weight)))


@pytest.mark.ex2_5
def test_silu_and_mul_keeps_a_bf16_models_dtype(impl):
    """A bf16 model: silu_and_mul's result goes into down_proj's bf16 weight, so it stays in x.dtype."""
    x = randn(18, 2 * 96, seed=19, dtype=torch.bfloat16)
    gate, up = x.chunk(2, dim=-1)
    with torch.no_grad():
        check_close(call_pure(impl.silu_and_mul, "silu_and_mul", "2.5", x), F.silu(gate) * up, "2.5",
                    "silu_and_mul of a bf16 gate_up (vs F.silu(gate) * up in bf16)", **TOL_BF16,
                    suspects=suspects("silu_and_mul", x))


# ---- 2.6 the decoder layer -----------------------------------------------------------------------
def layer_params(layer: Qwen3DecoderLayer, cfg: Qwen3Config, qk_norm: bool = True) -> DecoderLayerParams:
    """transformers' weights as decoder_layer takes them; attention is minillm's reference over CU."""
    a, m = layer.self_attn, layer.mlp
    qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
    gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight])
    return DecoderLayerParams(
        input_norm=layer.input_layernorm.weight, qkv_proj=lambda x: F.linear(x, qkv),
        q_norm=a.q_norm.weight if qk_norm else None, k_norm=a.k_norm.weight if qk_norm else None,
        cos_sin=rope_cos_sin_ref(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_parameters["rope_theta"]),
        attn=lambda q, k, v: varlen_attention(q, k, v, CU, CU, a.scaling),
        o_proj=lambda x: F.linear(x, a.o_proj.weight), post_norm=layer.post_attention_layernorm.weight,
        gate_up_proj=lambda x: F.linear(x, gate_up), down_proj=lambda x: F.linear(x, m.down_proj.weight),
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        eps=cfg.rms_norm_eps)


def layer_helpers_first(impl) -> None:
    """2.6's layer calls your apply_rotary (2.3) and silu_and_mul (2.5): where one of them is wrong, the layer
    cannot come out right, so that exercise is named instead of decoder_layer (one still a stub raises its
    own NotImplementedError from inside the layer)."""
    x, positions = randn(6, 2, 16, seed=41), torch.tensor([0, 1, 2, 0, 5, 9])
    cos_sin = rope_cos_sin_ref(16, 16, 10000.0)
    helpers = [("2.3", "apply_rotary", lambda fn: fn(x.clone(), positions, cos_sin), apply_rotary_ref),
               ("2.5", "silu_and_mul", lambda fn: fn(x.reshape(6, 32).clone()), silu_and_mul_ref)]
    for exercise_id, name, run, ref in helpers:
        try:
            right = torch.allclose(run(getattr(impl, name)), run(ref), **TOL_ROPE)
            why = "gives other values than minillm's on a small case"
        except NotImplementedError:  # its stub: the layer's own call raises that stub's message
            continue
        except Exception as e:  # noqa: BLE001 -- any error of theirs is the reason to name it
            right, why = False, f"raises {type(e).__name__}: {e}"
        check_that(None if right else f"which {why}: the layer cannot match until it is right. Grade it first: "
                   f"make grade EX={exercise_id}", "2.6", f"your decoder_layer calls your {name} (exercise {exercise_id}),")


@pytest.mark.ex2_6
@pytest.mark.parametrize("first", [True, False], ids=["first-layer", "residual-carried"])
def test_decoder_layer_on_a_packed_batch_matches_qwen3_decoder_layer(impl, first):
    layer_helpers_first(impl)
    cfg = tiny_config()
    layer, rot = seeded(Qwen3DecoderLayer(cfg, layer_idx=0)), Qwen3RotaryEmbedding(cfg)
    positions = packed_positions((0, 5, 0, 60))
    hidden, residual = randn(18, 64, seed=16), None if first else randn(18, 64, seed=17) * 2
    stream = hidden if first else hidden + residual  # what transformers' layer takes
    mid = []  # the residual stream between the two blocks, as transformers has it
    hook = layer.post_attention_layernorm.register_forward_pre_hook(lambda mod, args: mid.append(args[0][0]))
    with torch.no_grad():
        want = hf_per_sequence(lambda h, pe, m: layer(h, attention_mask=m, position_embeddings=pe), stream,
                               positions, rot)
        hook.remove()
        params = layer_params(layer, cfg)
        mlp_out, new_residual = call_pure(impl.decoder_layer, "decoder_layer", "2.6", positions, hidden, residual,
                                          params)
        suspected = suspects("decoder_layer", positions, hidden, residual, params)

        def residual_if_same_mlp_out(out):
            """A known wrong version's residual, named only if its mlp_out is yours too (second look): dropping the
            post-attention add and dropping only its returned residual leave the same stale residual."""
            if not torch.allclose(out[0], mlp_out, atol=TOL_LAYER["atol"], rtol=TOL_LAYER["rtol"]):
                raise LookupError("this wrong version's mlp_out differs from yours")
            return out[1]

        check_close(new_residual, torch.cat(mid), "2.6", "returned residual (the stream after attention)",
                    **TOL_LAYER, suspects=then(suspected, residual_if_same_mlp_out))
        check_close(mlp_out + new_residual, want, "2.6", "layer output (mlp_out + residual)", **TOL_LAYER,
                    suspects=then(suspected, lambda out: out[0] + out[1]))


def check_first_layer_output(impl, layer, rot, positions, hidden, params, what: str) -> None:
    """Your decoder_layer as a first layer (no residual yet): mlp_out + residual against transformers' layer."""
    with torch.no_grad():
        want = hf_per_sequence(lambda h, pe, m: layer(h, attention_mask=m, position_embeddings=pe), hidden,
                               positions, rot)
        mlp_out, new_residual = call_pure(impl.decoder_layer, "decoder_layer", "2.6", positions, hidden, None, params)
        check_close(mlp_out + new_residual, want, "2.6", what, **TOL_LAYER,
                    suspects=then(suspects("decoder_layer", positions, hidden, None, params),
                                  lambda out: out[0] + out[1]))


@pytest.mark.ex2_6
def test_decoder_layer_without_qk_norm(impl):
    """Llama and Qwen2 have no QK-norm: q_norm=None must skip it (checked against Qwen3DecoderLayer
    with its QK-norms made the identity). Their rms_norm_eps is not Qwen3's either: a large one here (0.1),
    so a layer that does not use p.eps shows."""
    layer_helpers_first(impl)
    cfg = tiny_config(rms_norm_eps=0.1)
    layer, rot = seeded(Qwen3DecoderLayer(cfg, layer_idx=0)), Qwen3RotaryEmbedding(cfg)
    layer.self_attn.q_norm = layer.self_attn.k_norm = torch.nn.Identity()
    positions, hidden = packed_positions(), randn(18, 64, seed=18)
    params = layer_params(layer, cfg, qk_norm=False)
    check_first_layer_output(impl, layer, rot, positions, hidden, params, "layer output without QK-norm")


@pytest.mark.ex2_6
def test_decoder_layer_qk_norm_uses_the_models_eps(impl):
    """The QK-norms are RMSNorms with the model's rms_norm_eps, as the layer's other norms: a large one
    here (0.1), QK-norm on, so a layer that writes Qwen3's 1e-6 into them shows."""
    layer_helpers_first(impl)
    cfg = tiny_config(rms_norm_eps=0.1)
    layer, rot = seeded(Qwen3DecoderLayer(cfg, layer_idx=0)), Qwen3RotaryEmbedding(cfg)
    positions, hidden = packed_positions(), randn(18, 64, seed=19) * 0.2  # small activations: eps matters
    params = layer_params(layer, cfg)
    check_first_layer_output(impl, layer, rot, positions, hidden, params,
                             "layer output with QK-norm at rms_norm_eps=0.1")


@pytest.mark.ex2_6
def test_your_layer_in_the_engine_gives_the_same_greedy_tokens(impl_name):
    """Integration: the engine with your decoder_layer (exercise 2.6 alone) swapped in (the torch
    path on CPU) generates exactly the tokens of minillm's own, on a stored tiny Qwen3 checkpoint.
    The second run also hits the prefix cache, so the layer sees fewer queries than keys."""
    require_written(impl_name, "2.6")
    prompts = greedy_reference()["prompts"][:4]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    with use_impl(impl_name, exercises={"2.6"}):
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    check_equal(got, want, "2.6", "greedy tokens of the engine running your functions (where your layer passes "
                "its own tests, look at what only a running engine gives it: `positions` as they come, since a "
                "decode step's and a prompt's after a prefix-cache hit do not start at 0, so torch.arange(N) in "
                "their place rotates q and k at the wrong angles)")


@pytest.mark.ex2_12
def test_triton_rms_norm_in_the_engine(impl_name, monkeypatch):
    """Integration: the engine's CUDA layer path (decoder_layer_fused: each add+RMSNorm of a layer through
    2.12's launcher and kernel), taken here on the CPU with the kernels interpreted (the CPU engine runs
    chapter 2's torch layer, where 2.12 has no part), with your 2.12 swapped in: the same greedy tokens
    as minillm's own kernel."""
    require_written(impl_name, "2.12")
    import minillm.engine.model_runner as model_runner
    import minillm.models.qwen3 as qwen3
    monkeypatch.setattr(model_runner, "layer_forward_for", lambda *args: qwen3.decoder_layer_fused)
    prompts = greedy_reference()["prompts"][:2]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(attention_backend="triton"))
    check_equal(llm.engine.model_runner.model.model.layers[0].layer_forward, qwen3.decoder_layer_fused, "2.12",
                "the layer path the engine took (the CUDA one, forced for this test)")
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    with use_impl(impl_name, exercises={"2.12"}):
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    check_equal(got, want, "2.12", "greedy tokens of the engine's fused layer path running your kernel")
    llm.shutdown()


# ---- 2.12 the Triton kernel (interpreter on CPU: fp32 and fp16) ----------------------------------
# the guard test first: a kernel that stores out of bounds is named before the launcher tests run it
@pytest.mark.ex2_12
def test_triton_kernel_reads_strided_rows_and_writes_only_its_rows(impl):
    """Rows of x are 128 elements apart (a slice of a wider tensor); the outputs sit in buffers
    with a guard region after them that the kernel must not touch (the interpreter does not
    catch out-of-bounds stores)."""
    n, d, block = 5, 100, 128
    wide, wide_res = randn(n, 128, seed=22), randn(n, 160, seed=23)
    x, res = wide[:, :d], wide_res[:, :d]
    w = randn(d, seed=24)
    guard = 77.0

    def launch(kernel):
        """Run `kernel` on fresh copies of the inputs, into fresh guarded buffers. -> (out buffer,
        residual_out buffer, guards included; the copies of the wide x and residual after the launch)."""
        x_in, res_in = wide.clone(), wide_res.clone()
        out_buf, res_buf = torch.full((n * d + 256,), guard), torch.full((n * d + 256,), guard)
        out, res_out = out_buf[:n * d].view(n, d), res_buf[:n * d].view(n, d)
        kernel[(n,)](x_in[:, :d], res_in[:, :d], w, out, res_out, d, x_in.stride(0), res_in.stride(0), 1e-6,
                     HAS_RESIDUAL=True, BLOCK_N=block)
        return out_buf, res_buf, x_in, res_in

    out_buf, res_buf, x_after, res_after = launch(impl.add_rms_norm_kernel)
    out, res_out = out_buf[:n * d].view(n, d), res_buf[:n * d].view(n, d)
    wrong = wrong_versions("add_rms_norm_kernel")  # run on failure only, each into its own guarded buffers

    def suspected(part):
        return {hint: (lambda k=k: part(*launch(k))) for hint, k in wrong.items()}

    check_close(out_buf[n * d:], torch.full((256,), guard), "2.12", "guard region after out (masked stores?)",
                **EXACT, suspects=suspected(lambda o, r, *_: o[n * d:]))
    check_close(res_buf[n * d:], torch.full((256,), guard), "2.12", "guard region after residual_out", **EXACT,
                suspects=suspected(lambda o, r, *_: r[n * d:]))
    for name, before, after, k in (("x_ptr", wide, x_after, 2), ("residual_ptr", wide_res, res_after, 3)):
        check_unmodified(before, after, "2.12", "add_rms_norm_kernel", name,
                         suspects=suspected(lambda *launched, k=k: launched[k]),
                         instead="x and residual are read-only: store only into out_ptr and residual_out_ptr")
    ref = Qwen3RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(w)
        check_close(res_out, x + res, "2.12", "residual_out from strided rows", **TOL_NORM,
                    suspects=suspected(lambda o, r, *_: r[:n * d].view(n, d)))
        check_close(out, ref(x + res), "2.12", "out from strided rows", **TOL_NORM,
                    suspects=suspected(lambda o, r, *_: o[:n * d].view(n, d)))


@pytest.mark.ex2_12
@pytest.mark.parametrize("d", [64, 576, 100], ids=["pow2", "smollm2-576", "odd-100"])
def test_triton_add_rms_norm_matches_qwen3_rmsnorm(impl, d):
    ref = seeded(Qwen3RMSNorm(d, eps=1e-6))
    x, res = randn(7, d, seed=19), randn(7, d, seed=20) * 3
    normed, new_res = call_pure(impl.rms_norm_triton, "rms_norm_triton", "2.12", x, ref.weight.detach(), 1e-6, res)
    suspected = suspects("rms_norm_triton", x, ref.weight.detach(), 1e-6, res)
    with torch.no_grad():
        check_close(new_res, x + res, "2.12", f"new residual, d={d}", **TOL_NORM,
                    suspects=then(suspected, lambda out: out[1]))
        check_close(normed, ref(x + res), "2.12", f"normed output, d={d}", **TOL_NORM,
                    suspects=then(suspected, lambda out: out[0]))


@pytest.mark.ex2_12
def test_triton_rms_norm_fp16_large_activations(impl):
    """fp16 rows whose squares overflow fp16: the kernel must compute in fp32 (the interpreter
    runs fp16 faithfully; bf16 it does not)."""
    ref = seeded(Qwen3RMSNorm(64, eps=1e-6)).to(torch.float16)
    x, res = (randn(7, 64, seed=27) * LARGE).to(torch.float16), (randn(7, 64, seed=28) * LARGE).to(torch.float16)
    w = ref.weight.detach()
    normed, new_res = call_pure(impl.rms_norm_triton, "rms_norm_triton", "2.12", x, w, 1e-6, res)
    suspected = suspects("rms_norm_triton", x, w, 1e-6, res)
    with torch.no_grad():
        check_close(new_res, x + res, "2.12", "new residual in fp16", **TOL_FP16,
                    suspects=then(suspected, lambda out: out[1]))
        want = ref(x + res)
        check_close(normed, want, "2.12", f"normed output in fp16 of activations near {LARGE:g}",
                    **TOL_FP16, suspects=then(suspected, lambda out: out[0]))
        # then bit for bit but for BF16_ROUNDING_SLACK elements (fp16 rounds as bf16 does, at other bits): rounding
        # where Qwen3RMSNorm rounds (the sum, then the normalized row before the weight) gives its bits; rounding
        # once at the end, or normalizing the unrounded sum, differs at about a quarter of the 448 values
        if torch.count_nonzero(normed != want) > BF16_ROUNDING_SLACK:
            check_close(normed, want, "2.12", "normed output in fp16, bit for bit (x + residual rounded to fp16, "
                        "the normalized row rounded before the weight)", **EXACT,
                        suspects=then(suspected, lambda out: out[0]))


def pdl_wait_problem(kernel) -> str | None:
    """Where a kernel's gdc_wait() comes too late: a kernel that calls it is launched with programmatic dependent
    launch on a GPU (minillm.kernels.gemv.pdl_args), and may then start while the kernel writing its input still
    runs, so every tl.load must come after the wait. None when it does (or when the kernel never waits: it is
    then launched the ordinary way). A CPU cannot run PDL, so this reads the kernel's code."""
    source, first = inspect.getsourcelines(kernel.fn)
    path = os.path.relpath(inspect.getsourcefile(kernel.fn), REPO_DIR)
    tree = ast.parse(textwrap.dedent("".join(source)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    lines = lambda name: sorted(first - 1 + n.lineno for n in calls if n.func.attr == name)  # noqa: E731
    waits, loads = lines("gdc_wait"), lines("load")
    if waits and loads and loads[0] < waits[0]:
        return (f"(the tl.load at {path}:{loads[0]} comes before gdc_wait() at line {waits[0]}: under PDL it may "
                f"read x before the kernel writing it has finished)")
    return None


@pytest.mark.ex2_12
def test_triton_kernel_reads_nothing_before_its_pdl_wait(impl, impl_name):
    require_written(impl_name, "2.12")  # (a stub's body has no wait to check)
    check_that(pdl_wait_problem(impl.add_rms_norm_kernel), "2.12", "add_rms_norm_kernel must call "
               "tl.extra.cuda.gdc_wait() (under `if USE_PDL:`) before its first tl.load")


@pytest.mark.ex2_12
def test_triton_rms_norm_uses_eps(impl):
    ref = seeded(Qwen3RMSNorm(64, eps=0.5))
    x, res = randn(7, 64, seed=35) * 0.1, randn(7, 64, seed=36) * 0.1  # small activations: eps matters
    w = ref.weight.detach()
    normed, _ = call_pure(impl.rms_norm_triton, "rms_norm_triton", "2.12", x, w, 0.5, res)
    with torch.no_grad():
        check_close(normed, ref(x + res), "2.12", "normed output with eps=0.5", **TOL_NORM,
                    suspects=then(suspects("rms_norm_triton", x, w, 0.5, res), lambda out: out[0]))


@pytest.mark.ex2_12
def test_triton_rms_norm_without_residual_per_head(impl):
    ref = seeded(Qwen3RMSNorm(16, eps=1e-6))
    x = randn(6, 4, 16, seed=21)
    with torch.no_grad():
        check_close(call_pure(impl.rms_norm_triton, "rms_norm_triton", "2.12", x, ref.weight.detach(), 1e-6), ref(x),
                    "2.12",
                    "QK-norm shape [N, heads, head_dim] without residual", **TOL_NORM,
                    suspects=suspects("rms_norm_triton", x, ref.weight.detach(), 1e-6))
