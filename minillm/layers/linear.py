"""Linear layers that shard over tensor-parallel ranks (Megatron-LM), with weight loaders that cut
each rank's shard out of the full checkpoint tensor.

    ReplicatedLinear          y = x W^T            every rank holds all of W
    ColumnParallelLinear      y_r = x W_r^T        W split on the output dim; rank r computes a slice of y
    MergedColumnParallelLinear  [gate | up] packed into one column-parallel matmul
    QKVParallelLinear         [q | k | v] packed; heads split over ranks
    RowParallelLinear         y = sum_r x_r W_r^T  W split on the input dim; one all-reduce sums the ranks

With one rank every class is a plain nn.Linear and every all-reduce a no-op.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minillm.distributed import all_reduce, tp_rank, tp_size


def _copy_checked(param: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"{what}: checkpoint shard has shape {tuple(loaded.shape)}, parameter expects "
                         f"{tuple(param.shape)}; is the checkpoint for this config.json?")
    param.data.copy_(loaded)


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None):
        super().__init__()
        self.tp_dim, self.tp_rank, self.tp_size = tp_dim, tp_rank(), tp_size()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None, name: str = "") -> None:
        if self.tp_dim is not None and self.tp_size > 1:
            shard = param.shape[self.tp_dim]
            loaded = loaded.narrow(self.tp_dim, self.tp_rank * shard, shard)
        _copy_checked(param, loaded, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, output_size, bias, tp_dim=None)


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, output_size // tp_size(), bias, tp_dim=0)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stored back to back; checkpoint shard i fills part i."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param, loaded, shard_id=None, name: str = ""):
        if shard_id is None:  # a checkpoint that already stores the packed tensor
            return super().weight_loader(param, loaded, name=name)
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        loaded = loaded.narrow(0, self.tp_rank * size, size) if self.tp_size > 1 else loaded
        _copy_checked(param.data.narrow(0, offset, size), loaded, name)


class QKVParallelLinear(ColumnParallelLinear):
    """[q | k | v] projections in one matmul; each rank holds its heads of each."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, num_heads, num_kv_heads
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias)

    def weight_loader(self, param, loaded, shard_id=None, name: str = ""):
        if shard_id is None:
            return super().weight_loader(param, loaded, name=name)
        q = self.num_heads * self.head_dim // self.tp_size
        kv = self.num_kv_heads * self.head_dim // self.tp_size
        size, offset = {"q": (q, 0), "k": (kv, q), "v": (kv, q + kv)}[shard_id]
        loaded = loaded.narrow(0, self.tp_rank * size, size) if self.tp_size > 1 else loaded
        _copy_checked(param.data.narrow(0, offset, size), loaded, name)


class RowParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size // tp_size(), output_size, bias, tp_dim=1)

    def weight_loader(self, param, loaded, shard_id=None, name: str = ""):
        if param.ndim == 1:  # the bias is added once, after the all-reduce: not sharded
            return _copy_checked(param, loaded, name)
        super().weight_loader(param, loaded, name=name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        y = all_reduce(y)
        return y if self.bias is None else y + self.bias
