"""Chapter 2 exercise stubs. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand; students: fill in the bodies here, then grade one exercise with
    pytest tests/exercises --impl=exercises -m ex2_4

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
    raise NotImplementedError("Exercise 2.4: implement causal_attention (see notebooks/02_decoder_layer.ipynb, section '5. Attention: GQA and the causal mask')")
