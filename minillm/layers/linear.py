"""Linear layers that shard over tensor-parallel ranks (Megatron-LM), with weight loaders that cut
each rank's shard out of the full checkpoint tensor.

    ReplicatedLinear            y = x W^T            every rank holds all of W
    ColumnParallelLinear        y_r = x W_r^T        W split on dim 0 (outputs); rank r computes a slice of y
    MergedColumnParallelLinear  [gate | up] packed into one column-parallel matmul
    QKVParallelLinear           [q | k | v] packed; heads split over ranks
    RowParallelLinear           y = sum_r x_r W_r^T  W split on dim 1 (inputs); one all-reduce sums the ranks

A weight W is [out_features, in_features] (nn.Linear's layout). With one rank every class is a plain
nn.Linear, nothing is sharded and no collective runs.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from minillm.distributed import tp_group, tp_rank, tp_size
from minillm.kernels.gemv import gemv


# >>> exercise 4.1 | notebooks/04_tensor_parallel.ipynb | 3. Sharding the checkpoint
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
# <<< exercise 4.1


# >>> exercise 4.2 | notebooks/04_tensor_parallel.ipynb | 4. The MLP: column then row, one all-reduce
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
# <<< exercise 4.2


def linear_gemv_b1(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), a layer's matmul on CUDA: one token (batch-1 decode) through our
    memory-speed GEMV kernel, more through cuBLAS."""
    if x.dim() == 2 and x.shape[0] == 1:
        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def column_major_weights(model: nn.Module) -> None:
    """Store every matrix of a CPU model column-major: the same [out, in] values and shape, with
    strides (1, out), so F.linear's x @ W^T reads W^T contiguous. MKL's matrix-vector product (one
    token's decode) streams that layout faster from memory: on the course's 2-core machine, fp32,
    SmolLM2-135M's 121 matmuls of a token take 25 ms against 30 ms row-major, its LM head alone
    3.8 against 6.7 ms (the bench's batch-1 line shows it in the engine). At 8 to 300 rows a step
    the two layouts timed within run-to-run noise of each other (up to 15% apart either way):
    the layout is for one-token decode, a CPU's usual case (chat, batch 1)."""
    for p in model.parameters():
        if p.dim() == 2:
            p.data = p.data.t().contiguous().t()


def copy_checked(param: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, parameter expects "
                         f"{tuple(param.shape)}; is the checkpoint for this config.json?")
    param.data.copy_(loaded)


def copy_slice(param: torch.Tensor, full: torch.Tensor, full_shape: tuple, cut: Callable[[], torch.Tensor],
                slicer: str, what: str, rank: int, size: int) -> None:
    """Copy rank `rank`'s slice of the checkpoint tensor `full` into param; cut() makes the slice with
    `slicer` (shard_weight or shard_packed: a student's, once swapped in). A wrong full shape is the
    checkpoint's; a right one cut to the wrong shape is the slicer's (exercise 4.1), and the error
    says which, so a student's slicing bug is not read as a bad file."""
    if tuple(full.shape) != tuple(full_shape):
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(full.shape)}, the model expects "
                         f"{tuple(full_shape)} before it is split over {size} ranks; is the checkpoint for "
                         f"this config.json?")
    part = cut()
    if part.shape != param.shape:
        raise ValueError(f"{what}: the checkpoint's {tuple(full.shape)} is right, but {slicer} gave rank {rank} "
                         f"of {size} a slice of shape {tuple(part.shape)} where its parameter holds "
                         f"{tuple(param.shape)}: the slicing is off (exercise 4.1: make grade EX=4.1)")
    param.data.copy_(part)


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None):
        super().__init__()
        # the rank and group this layer belongs to, fixed when it is built (see minillm.distributed)
        self.tp_dim, self.tp_rank, self.tp_size, self.tp_group = tp_dim, tp_rank(), tp_size(), tp_group()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.weight.weight_loader = self.weight_loader
        # the matmul, chosen from the device the layer is built on
        self.linear = linear_gemv_b1 if self.weight.is_cuda else F.linear
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None, name: str = "") -> None:
        if self.tp_dim is None or self.tp_size == 1:
            return copy_checked(param, loaded, name)
        full = list(param.shape)
        full[self.tp_dim] *= self.tp_size
        copy_slice(param, loaded, tuple(full), lambda: shard_weight(loaded, self.tp_dim, self.tp_rank, self.tp_size),
                    "shard_weight", name, self.tp_rank, self.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, output_size, bias, tp_dim=None)


class ColumnParallelLinear(LinearBase):
    """Rank r holds output features [r * out/p, (r+1) * out/p): its y slice needs no communication."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, output_size // tp_size(), bias, tp_dim=0)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stored back to back; each is sharded on its own, so rank r
    holds [part0_r | part1_r | ...]. Checkpoint tensor i (shard_id i) fills part i."""

    shard_ids: dict = {}  # checkpoint shard id -> part index (default: the id is the index)

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param, loaded, shard_id=None, name: str = ""):
        if self.tp_size == 1 and shard_id is None:  # a checkpoint that already stores the packed tensor
            return copy_checked(param, loaded, name)
        if shard_id is None:
            return copy_slice(param, loaded, (sum(self.output_sizes), *param.shape[1:]),
                               lambda: shard_packed(loaded, self.output_sizes, self.tp_rank, self.tp_size),
                               "shard_packed", name, self.tp_rank, self.tp_size)
        i = self.shard_ids.get(shard_id, shard_id)
        size = self.output_sizes[i] // self.tp_size
        part = param.data.narrow(0, sum(self.output_sizes[:i]) // self.tp_size, size)
        if self.tp_size == 1:
            return copy_checked(part, loaded, name)
        copy_slice(part, loaded, (self.output_sizes[i], *param.shape[1:]),
                    lambda: shard_weight(loaded, 0, self.tp_rank, self.tp_size), "shard_weight", name, self.tp_rank,
                    self.tp_size)


class QKVParallelLinear(MergedColumnParallelLinear):
    """[q | k | v] projections in one matmul; rank r holds its num_heads/p query heads and
    num_kv_heads/p key/value heads of each."""

    shard_ids = {"q": 0, "k": 1, "v": 2}

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, num_heads, num_kv_heads
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], bias)


class RowParallelLinear(LinearBase):
    """Rank r holds input features [r * in/p, (r+1) * in/p) and gets the matching slice of x (the
    output of a column-parallel layer); the partial products are summed by one all-reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size // tp_size(), output_size, bias, tp_dim=1)

    def weight_loader(self, param, loaded, shard_id=None, name: str = ""):
        if param.ndim == 1:  # the bias is added once, after the all-reduce: not sharded
            return copy_checked(param, loaded, name)
        super().weight_loader(param, loaded, name=name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.linear(x, self.weight, self.bias)
        return row_parallel_linear(x, self.weight, self.bias, self.tp_group)
