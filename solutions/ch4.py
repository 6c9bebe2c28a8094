"""Chapter 4 solutions. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand.

Exercise 4.1: shard_weight, shard_packed  (notebooks/04_tensor_parallel.ipynb, section '3. Sharding the checkpoint')
Exercise 4.2: row_parallel_linear  (notebooks/04_tensor_parallel.ipynb, section '4. The MLP: column then row, one all-reduce')
Exercise 4.3: vocab_parallel_embed  (notebooks/04_tensor_parallel.ipynb, section '5. Vocabulary-parallel embedding')
Exercise 4.4: parallel_lm_head  (notebooks/04_tensor_parallel.ipynb, section '6. The parallel LM head')
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


# ---- Exercise 4.1 (notebooks/04_tensor_parallel.ipynb, section '3. Sharding the checkpoint'), from minillm.layers.linear ----
def shard_weight(weight: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s equal slice of a full checkpoint tensor along `dim`.

    Column-parallel layers (and the vocabulary-parallel embedding and LM head) split dim 0, the
    output features; row-parallel layers split dim 1, the input features.
    weight: any shape, weight.shape[dim] divisible by world_size -> the same shape with
    shape[dim] / world_size: the rank-th of world_size contiguous chunks, in order (a view is fine).
    Raise ValueError (naming the size and world_size) when shape[dim] does not divide.

    Hints: Tensor.narrow(dim, start, length) returns a view without copying.
    """
    size = weight.shape[dim]
    if size % world_size:
        raise ValueError(f"cannot split dim {dim} of size {size} into {world_size} equal shards")
    part = size // world_size
    return weight.narrow(dim, rank * part, part)


def shard_packed(weight: torch.Tensor, output_sizes: list[int], rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s shard of several column-parallel matrices stored back to back on dim 0:
    [q | k | v] of QKVParallelLinear, [gate | up] of MergedColumnParallelLinear.

    weight: [sum(output_sizes), ...] -> [sum(output_sizes) / world_size, ...]: this rank's slice of
    each part, concatenated in the parts' order. (The rank-th slice of the packed tensor would be
    wrong: with world_size 2 it hands rank 0 all of q and no k or v.) Each part must divide by
    world_size (shard_weight's ValueError otherwise), and weight.shape[0] must be sum(output_sizes)
    (ValueError otherwise).

    Hints: Tensor.split(output_sizes), then shard_weight on each part, then torch.cat.
    """
    if weight.shape[0] != sum(output_sizes):
        raise ValueError(f"a packed tensor of {weight.shape[0]} rows cannot hold parts of {output_sizes} rows")
    return torch.cat([shard_weight(part, 0, rank, world_size) for part in weight.split(output_sizes)])


# ---- Exercise 4.2 (notebooks/04_tensor_parallel.ipynb, section '4. The MLP: column then row, one all-reduce'), from minillm.layers.linear ----
def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group) -> torch.Tensor:
    """The row-parallel half of a Megatron block (o_proj, down_proj): this rank's partial product,
    summed over the ranks.

    x: [N, in/p], this rank's slice of the input features: exactly what the column-parallel layer
    before it left on this rank, so nothing had to be communicated to get it.
    weight: [out, in/p], this rank's columns of the full [out, in] weight.
    bias: [out] (the full bias) or None. group: the tensor-parallel process group (p ranks).
    -> [N, out] in x.dtype: x_full @ weight_full.T (+ bias), the same on every rank.
    Exactly one collective, torch.distributed.all_reduce(..., group=group). The bias belongs to the
    sum, not to each rank's part.

    Hints: F.linear(x, w) computes x @ w.T; all_reduce sums a tensor in place across the group.
    """
    y = F.linear(x, weight)
    dist.all_reduce(y, group=group)
    return y if bias is None else y + bias


# ---- Exercise 4.3 (notebooks/04_tensor_parallel.ipynb, section '5. Vocabulary-parallel embedding'), from minillm.layers.embed_head ----
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


# ---- Exercise 4.4 (notebooks/04_tensor_parallel.ipynb, section '6. The parallel LM head'), from minillm.layers.embed_head ----
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
