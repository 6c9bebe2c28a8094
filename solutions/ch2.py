"""Chapter 2 solutions. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand.

Exercise 2.4: causal_attention  (notebooks/02_decoder_layer.ipynb, section '5. Attention: GQA and the causal mask')
"""
from __future__ import annotations

import torch


# ---- Exercise 2.4 (notebooks/02_decoder_layer.ipynb, section '5. Attention: GQA and the causal mask'), from minillm.layers.attention ----
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence of grouped-query attention, causal, queries aligned to the end of the keys.

    q: [Lq, H, D], k/v: [Lk, Hkv, D] with H % Hkv == 0 and Lq <= Lk -> [Lq, H, D] in q.dtype.
    Query i sits at position Lk - Lq + i and sees keys 0 .. Lk - Lq + i. Math in fp32.
    """
    Lq, H, _ = q.shape
    Lk, Hkv, _ = k.shape
    k = k.float().repeat_interleave(H // Hkv, dim=1)  # query head h reads KV head h // (H / Hkv)
    v = v.float().repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    visible = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=Lk - Lq)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).to(q.dtype)
