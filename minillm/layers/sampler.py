"""Sampler: logits -> next token ids, per-row temperature / top-k / top-p / seed, on the logits' device.

Sampling uses the Gumbel-max trick: with U_i ~ Uniform(0, 1) independent, G_i = -log(-log U_i)
is Gumbel noise and argmax_i (logits_i / T + G_i) is distributed as softmax(logits / T). No
softmax, no cumulative sum, no host sync: the whole step stays on the GPU.
"""
from __future__ import annotations

import torch
from torch import nn

from minillm.kernels.sampling import sample_triton


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """logits: [B, V] fp32; top_k: [B] int (V for off) or None; top_p: [B] float (1.0 for off) or None.
    -> logits with every token outside each row's top-k / nucleus set to -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        drop |= ranks[None, :] >= top_k[:, None]
    if top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly better tokens
        drop |= mass_before >= top_p[:, None]  # keeps the smallest prefix whose mass reaches top_p
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor | None = None,
                top_p: torch.Tensor | None = None, generators: list | None = None,
                all_greedy: bool | None = None, any_greedy: bool | None = None,
                seeds: torch.Tensor | None = None) -> torch.Tensor:
        """logits: [B, V]; temperatures: [B] (0 = greedy); generators: per row a torch.Generator or None;
        all_greedy / any_greedy: pass them when known on the host (saves device syncs and work);
        seeds: [B] per-row Philox keys -> the fused Triton sampler (CUDA, no top-k/top-p).
        -> [B] int64 token ids."""
        if seeds is not None and top_k is None and top_p is None:
            return sample_triton(logits, temperatures, seeds)
        logits = logits.float()
        if all_greedy is None:
            all_greedy = not bool((temperatures > 0).any())
        if all_greedy:
            return logits.argmax(dim=-1)
        greedy = logits.argmax(dim=-1) if any_greedy is not False else None
        logits = logits / temperatures.clamp_min(1e-6)[:, None]
        if top_k is not None or top_p is not None:
            logits = apply_top_k_top_p(logits, top_k, top_p)
        uniform = torch.rand_like(logits)
        if generators:
            for row, gen in enumerate(generators):
                if gen is not None:  # a seeded request draws from its own stream
                    uniform[row] = torch.rand(logits.shape[1], generator=gen, device=logits.device)
        sampled = (logits - uniform.log_().neg_().log_()).argmax(dim=-1)  # + Gumbel noise
        return sampled if greedy is None else torch.where(temperatures > 0, sampled, greedy)
