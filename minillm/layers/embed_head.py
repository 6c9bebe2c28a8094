"""Vocabulary-parallel embedding and LM head: each rank holds vocab_size / tp rows."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minillm.distributed import all_reduce, tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    """token ids [N] -> [N, hidden]. Rank r looks up the ids in its vocabulary slice, zeros the
    others, and an all-reduce assembles the full rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.num_embeddings = num_embeddings
        self.part = num_embeddings // self.tp_size
        self.start = self.part * self.tp_rank
        self.weight = nn.Parameter(torch.empty(self.part, embedding_dim))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None, name: str = "") -> None:
        if loaded.shape[0] != self.num_embeddings or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(f"{name}: checkpoint has shape {tuple(loaded.shape)}, expected "
                             f"({self.num_embeddings}, {param.shape[1]})")
        param.data.copy_(loaded.narrow(0, self.start, self.part))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        mask = (x >= self.start) & (x < self.start + self.part)
        y = F.embedding((x - self.start) * mask, self.weight) * mask.unsqueeze(-1)
        return all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [B, hidden] -> logits [B, vocab] on rank 0 (None elsewhere): each rank computes its
    vocabulary slice and rank 0 gathers them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        logits = F.linear(x, self.weight)
        if self.tp_size == 1:
            return logits
        import torch.distributed as dist
        parts = [torch.empty_like(logits) for _ in range(self.tp_size)] if self.tp_rank == 0 else None
        dist.gather(logits, parts, dst=0)
        return torch.cat(parts, dim=-1) if self.tp_rank == 0 else None
