"""Vocabulary-parallel embedding and LM head: rank r holds rows [r * V/p, (r+1) * V/p) of the
vocabulary (the two may share one tensor: tied embeddings).

    embedding   token ids [N] -> [N, hidden]   each rank looks up the ids it owns; an all-reduce fills the rest
    LM head     hidden [B, hidden] -> logits [B, V] on rank 0   each rank scores its slice; rank 0 gathers
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from minillm.distributed import tp_group, tp_rank, tp_size
from minillm.layers.linear import copy_checked, copy_slice, shard_weight


# >>> exercise 4.3 | notebooks/04_tensor_parallel.ipynb | 5. Vocabulary-parallel embedding
def vocab_parallel_embed(token_ids: torch.Tensor, weight_shard: torch.Tensor, vocab_start: int, group) -> torch.Tensor:
    """Embedding lookup when each rank holds a contiguous slice of the vocabulary.

    token_ids: [N] int64, ids anywhere in the full vocabulary [0, V).
    weight_shard: [V/p, hidden], the embedding rows of ids vocab_start .. vocab_start + V/p - 1.
    group: the tensor-parallel process group.
    -> [N, hidden] in weight_shard.dtype: the full embeddings, the same on every rank.
    Each rank fills the rows of the ids it owns and zeros for the others; one
    torch.distributed.all_reduce(..., group=group) sums them, so every row comes from its one owner.

    Hints: a boolean mask of the owned ids; shift ids by vocab_start and send the others to a valid
    row (e.g. 0) before F.embedding, so nothing indexes out of range; then zero the masked rows.
    """
    local = token_ids - vocab_start
    mask = (local >= 0) & (local < weight_shard.shape[0])
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y
# <<< exercise 4.3


# >>> exercise 4.4 | notebooks/04_tensor_parallel.ipynb | 6. The parallel LM head
def parallel_lm_head(hidden: torch.Tensor, weight_shard: torch.Tensor, group) -> torch.Tensor | None:
    """Logits over the full vocabulary when each rank holds a slice of the LM head.

    hidden: [B, hidden], the same on every rank; weight_shard: [V/p, hidden], the head's rows of
    this rank's vocabulary slice (rank r owns ids r*V/p .. (r+1)*V/p - 1); group: the tensor-parallel group.
    -> on the group's rank 0: logits [B, V] (column j scores token j) in hidden's dtype, which the
    sampler reads; on every other rank: None.
    Rank 0 alone samples, so a gather to it is enough (an all-gather would send p times more).

    Hints: torch.distributed.gather(tensor, gather_list, group_dst=0, group=group); only the
    destination passes a gather_list (p tensors shaped like the local logits), the others None;
    dist.get_rank(group) is this process's rank in the group; torch.cat on the last dim.
    """
    logits = F.linear(hidden, weight_shard)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    parts = [torch.empty_like(logits) for _ in range(size)] if rank == 0 else None
    dist.gather(logits, parts, group_dst=0, group=group)
    return torch.cat(parts, dim=-1) if rank == 0 else None
# <<< exercise 4.4


class VocabParallelEmbedding(nn.Module):
    """token ids [N] -> [N, hidden]; rank r holds the rows of ids [start, start + V/p)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size, self.tp_group = tp_rank(), tp_size(), tp_group()
        if num_embeddings % self.tp_size:
            raise ValueError(f"tensor_parallel_size={self.tp_size} does not divide the vocabulary size "
                             f"{num_embeddings}; pick a size that divides it")
        self.num_embeddings = num_embeddings
        self.part = num_embeddings // self.tp_size
        self.start = self.part * self.tp_rank
        self.weight = nn.Parameter(torch.empty(self.part, embedding_dim))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None, name: str = "") -> None:
        if self.tp_size == 1:
            return copy_checked(param, loaded, name)
        copy_slice(param, loaded, (self.num_embeddings, *param.shape[1:]),
                    lambda: shard_weight(loaded, 0, self.tp_rank, self.tp_size), "shard_weight", name, self.tp_rank,
                    self.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        return vocab_parallel_embed(x, self.weight, self.start, self.tp_group)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [B, hidden] -> logits [B, vocab] on rank 0, None on the other ranks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.tp_size == 1:
            return F.linear(x, self.weight)
        return parallel_lm_head(x, self.weight, self.tp_group)
