"""Chapter 4's known wrong versions (see mistakes.py): tensor parallelism.

The collective ones (4.2-4.4) are graded in-process on two thread ranks (test_ch4.py), so they run
with real torch.distributed calls, wrong where a student's half-understanding makes them wrong.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from minillm.layers.linear import shard_weight as right_shard_weight
from mistakes import Mistake


# ---- 4.1 sharding the checkpoint ---------------------------------------------------------------------
def shard_weight_always_rows(weight, dim, rank, world_size):
    size = weight.shape[dim]
    if size % world_size:
        raise ValueError(f"cannot split dim {dim} of size {size} into {world_size} equal shards")
    part = size // world_size
    return weight[rank * part:(rank + 1) * part]  # the bug: slices dim 0 whatever `dim` says


def shard_weight_chunks_dim0(weight, dim, rank, world_size):
    size = weight.shape[dim]
    if size % world_size:
        raise ValueError(f"cannot split dim {dim} of size {size} into {world_size} equal shards")
    return weight.chunk(world_size, dim=0)[rank]  # the bug: chunks dim 0 whatever `dim` says


def shard_weight_starts_at_rank(weight, dim, rank, world_size):
    size = weight.shape[dim]
    if size % world_size:
        raise ValueError(f"cannot split dim {dim} of size {size} into {world_size} equal shards")
    part = size // world_size
    return weight.narrow(dim, rank, part)  # the bug: the shard starts at element `rank`, not rank * part


def shard_weight_without_divisibility_check(weight, dim, rank, world_size):
    return weight.chunk(world_size, dim)[rank]  # the bug: uneven chunks (10 over 3: 4, 4, 2), and no error


def shard_packed_as_one_tensor(weight, output_sizes, rank, world_size):
    return right_shard_weight(weight, 0, rank, world_size)  # the bug: the rank-th slice of [q | k | v] itself


def shard_packed_in_equal_parts(weight, output_sizes, rank, world_size):
    # the bug: the packed tensor cut into len(output_sizes) equal parts, though q, k and v differ in size
    return torch.cat([right_shard_weight(part, 0, rank, world_size) for part in weight.chunk(len(output_sizes))])


def shard_packed_on_columns(weight, output_sizes, rank, world_size):
    # the bug: "column-parallel" read as "split the columns", dim 1 (the input features)
    return torch.cat([right_shard_weight(part, 1, rank, world_size) for part in weight.split(output_sizes)])


def shard_packed_without_row_check(weight, output_sizes, rank, world_size):
    # the bug: no check that weight holds sum(output_sizes) rows; torch's split raises a RuntimeError instead
    return torch.cat([right_shard_weight(part, 0, rank, world_size) for part in weight.split(output_sizes)])


# ---- 4.2 the row-parallel linear ---------------------------------------------------------------------
def row_parallel_bias_on_every_rank(x, weight, bias, group):
    y = F.linear(x, weight, bias)  # the bug: every rank adds the bias, so the sum holds it p times
    dist.all_reduce(y, group=group)
    return y


def row_parallel_reduces_a_transposed_view(x, weight, bias, group):
    y = (weight @ x.T).T  # the bug: a transposed view, not contiguous, goes to the all-reduce
    dist.all_reduce(y, group=group)
    return y if bias is None else y + bias


def row_parallel_without_all_reduce(x, weight, bias, group):
    y = F.linear(x, weight)  # the bug: this rank's partial sum is returned as the result
    return y if bias is None else y + bias


def row_parallel_concatenates(x, weight, bias, group):
    y = F.linear(x, weight)
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, y, group=group)  # the bug: partial sums concatenated like column-parallel outputs
    y = torch.cat(parts, dim=-1)
    return y if bias is None else y + bias


def row_parallel_without_group(x, weight, bias, group):
    y = F.linear(x, weight)
    dist.all_reduce(y)  # the bug: no group=, so the sum runs over every rank of the default (WORLD) group
    return y if bias is None else y + bias


def row_parallel_in_fp32(x, weight, bias, group):
    y = F.linear(x.float(), weight.float())  # the bug: summed in fp32 for accuracy, and never cast back
    dist.all_reduce(y, group=group)
    return y if bias is None else y + bias.float()


# ---- 4.3 the vocabulary-parallel embedding -----------------------------------------------------------------
def vocab_embed_without_offset(token_ids, weight_shard, vocab_start, group):
    mask = (token_ids >= vocab_start) & (token_ids < vocab_start + weight_shard.shape[0])
    y = F.embedding(torch.where(mask, token_ids, 0), weight_shard)  # the bug: global ids index the shard
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_without_zeroing(token_ids, weight_shard, vocab_start, group):
    local = (token_ids - vocab_start).clamp(0, weight_shard.shape[0] - 1)
    y = F.embedding(local, weight_shard)  # the bug: ids of other ranks keep a (clamped) row of this shard
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_row_0_not_zeroed(token_ids, weight_shard, vocab_start, group):
    mask = (token_ids >= vocab_start) & (token_ids < vocab_start + weight_shard.shape[0])
    y = F.embedding(torch.where(mask, token_ids - vocab_start, 0), weight_shard)  # the bug: others' ids get row 0
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_without_all_reduce(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = (local >= 0) & (local < weight_shard.shape[0])
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    return y.masked_fill(~mask.unsqueeze(-1), 0)  # the bug: other ranks' rows stay zero here


def vocab_embed_shifts_ids_in_place(token_ids, weight_shard, vocab_start, group):
    token_ids -= vocab_start  # the bug: the caller's ids are shifted (on every rank but the first)
    mask = (token_ids >= 0) & (token_ids < weight_shard.shape[0])
    y = F.embedding(torch.where(mask, token_ids, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_mask_includes_end(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = (local >= 0) & (local <= weight_shard.shape[0])  # the bug: <= lets the next rank's first id in
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_mask_excludes_start(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = (local > 0) & (local < weight_shard.shape[0])  # the bug: > drops the slice's first id, vocab_start
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_without_group(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = (local >= 0) & (local < weight_shard.shape[0])
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y)  # the bug: no group=, so the sum runs over every rank of the default (WORLD) group
    return y


def vocab_embed_zeroed_by_float_mask(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = (local >= 0) & (local < weight_shard.shape[0])
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y * mask.unsqueeze(-1).float()  # the bug: a bfloat16 row times a float32 mask is a float32 row
    dist.all_reduce(y, group=group)
    return y


# ---- 4.4 the parallel LM head ------------------------------------------------------------------------
def lm_head_concatenates_rows(hidden, weight_shard, group):
    logits = F.linear(hidden, weight_shard)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    parts = [torch.empty_like(logits) for _ in range(size)] if rank == 0 else None
    dist.gather(logits, parts, group_dst=0, group=group)
    return torch.cat(parts, dim=0) if rank == 0 else None  # the bug: vocabulary slices stacked as more tokens


def lm_head_without_gather(hidden, weight_shard, group):
    return F.linear(hidden, weight_shard)  # the bug: every rank returns its own vocabulary slice


def lm_head_on_every_rank(hidden, weight_shard, group):
    logits = F.linear(hidden, weight_shard)
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, logits, group=group)  # the bug: every rank gets (and returns) the full logits
    return torch.cat(parts, dim=-1)


def lm_head_all_gather_then_none(hidden, weight_shard, group):
    logits = F.linear(hidden, weight_shard)
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, logits, group=group)  # the bug: every rank receives every slice ...
    return torch.cat(parts, dim=-1) if dist.get_rank(group) == 0 else None  # ... and all but rank 0 drop them


def lm_head_without_group(hidden, weight_shard, group):
    logits = F.linear(hidden, weight_shard)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    parts = [torch.empty_like(logits) for _ in range(size)] if rank == 0 else None
    dist.gather(logits, parts, group_dst=0)  # the bug: no group=, so the gather runs in the default (WORLD) group
    return torch.cat(parts, dim=-1) if rank == 0 else None


MISTAKES: list[Mistake] = [
    # 4.1
    Mistake("ch4_shard_weight_always_rows", "4.1", {"shard_weight": shard_weight_always_rows},
            "shard_weight cut dim 0 whatever `dim` said: row-parallel layers (o_proj, down_proj) split dim 1, "
            "their input features. Cut along `dim`: weight.narrow(dim, rank * part, part)",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_weight_chunks_dim0", "4.1", {"shard_weight": shard_weight_chunks_dim0},
            "shard_weight chunked dim 0 whatever `dim` said (weight.chunk(world_size, dim=0)): row-parallel layers "
            "(o_proj, down_proj) split dim 1, their input features. Chunk along `dim`: "
            "weight.chunk(world_size, dim=dim)[rank], or weight.narrow(dim, rank * part, part)",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_weight_starts_at_rank", "4.1", {"shard_weight": shard_weight_starts_at_rank},
            "rank r's shard starts at element r: the shards are consecutive chunks of part = size // world_size "
            "elements, so rank r's starts at r * part (weight.narrow(dim, rank * part, part))",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_weight_without_divisibility_check", "4.1",
            {"shard_weight": shard_weight_without_divisibility_check},
            "shard_weight raised nothing for a size that world_size does not divide: torch.chunk (or a rounded-up "
            "part) then hands the ranks shards of different sizes (10 rows over 3 ranks: 4, 4, 2), and the layers "
            "built on them no longer line up. Check size % world_size first and raise ValueError naming both",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_packed_as_one_tensor", "4.1", {"shard_packed": shard_packed_as_one_tensor},
            "shard_packed took the rank-th slice of the packed tensor as a whole: with 2 ranks rank 0 then holds "
            "all of q and none of k and v. Split it into its parts first (weight.split(output_sizes)), shard "
            "each part on dim 0, and concatenate the shards",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_packed_in_equal_parts", "4.1", {"shard_packed": shard_packed_in_equal_parts},
            "shard_packed cuts the packed tensor into len(output_sizes) equal parts (chunk): with GQA q has more "
            "rows than k and v, so the parts are [q | k | v] at the sizes output_sizes gives: "
            "weight.split(output_sizes), then each part's rank-th slice",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_packed_on_columns", "4.1", {"shard_packed": shard_packed_on_columns},
            "shard_packed split the parts on dim 1 (the input features): q, k, v, gate and up are column-parallel, "
            "which splits their OUTPUT features, dim 0 of an nn.Linear weight [out, in]",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_packed_without_row_check", "4.1", {"shard_packed": shard_packed_without_row_check},
            "shard_packed does not check that the packed tensor has sum(output_sizes) rows: torch's split then "
            "raises a RuntimeError about split sizes, which names neither the tensor's rows nor the parts. Check "
            "weight.shape[0] == sum(output_sizes) first and raise ValueError naming both",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    # 4.2
    Mistake("ch4_row_parallel_bias_on_every_rank", "4.2", {"row_parallel_linear": row_parallel_bias_on_every_rank},
            "the bias was added on every rank before the all-reduce, so the sum holds it p times: all-reduce the "
            "partial products x @ weight.T first, then add the bias once",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    Mistake("ch4_row_parallel_reduces_a_transposed_view", "4.2",
            {"row_parallel_linear": row_parallel_reduces_a_transposed_view},
            "the all-reduce gets a transposed view ((weight @ x.T).T), which is not contiguous: NCCL, the GPU "
            "backend, refuses it. Compute y = F.linear(x, weight) (x @ weight.T), contiguous as it comes, then "
            "all-reduce it", "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    Mistake("ch4_row_parallel_without_all_reduce", "4.2", {"row_parallel_linear": row_parallel_without_all_reduce},
            "each rank returned its own partial product: with the input features split, x_r @ W_r.T is one term "
            "of the sum over ranks. torch.distributed.all_reduce(y, group=group) sums them (before the bias)",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    Mistake("ch4_row_parallel_concatenates", "4.2", {"row_parallel_linear": row_parallel_concatenates},
            "the ranks' outputs were gathered and concatenated, as column-parallel outputs are: a row-parallel "
            "layer's ranks each hold a partial sum of the SAME [N, out] output, so add them with one all_reduce",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    Mistake("ch4_row_parallel_without_group", "4.2", {"row_parallel_linear": row_parallel_without_group},
            "the all-reduce has no group=, so it sums over every rank of the default (WORLD) group: with more than "
            "one tensor-parallel group (or pipeline stages beside it) it adds other groups' partial sums in. Pass "
            "the group you are given: torch.distributed.all_reduce(y, group=group)",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    Mistake("ch4_row_parallel_in_fp32", "4.2", {"row_parallel_linear": row_parallel_in_fp32},
            "a bfloat16 layer returns float32: the partial products were cast to float32 (for a more accurate sum) "
            "and the result never cast back. The output is in x.dtype, which the next layer and the residual add "
            "expect (and a float32 all-reduce sends twice the bytes): compute in x's dtype, or cast the result back",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    # 4.3
    Mistake("ch4_vocab_embed_without_offset", "4.3", {"vocab_parallel_embed": vocab_embed_without_offset},
            "the shard is indexed with the global token ids: this rank's row of token t is t - vocab_start (rank "
            "1's ids start at V/p, past the end of its shard). Shift the ids by vocab_start before F.embedding",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_without_zeroing", "4.3", {"vocab_parallel_embed": vocab_embed_without_zeroing},
            "the rows of ids this rank does not own were not zeroed before the all-reduce, so every embedding gets "
            "another rank's (clamped) row added: mask the ids outside [vocab_start, vocab_start + V/p) and "
            "zero their rows (masked_fill) before all_reduce",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_row_0_not_zeroed", "4.3", {"vocab_parallel_embed": vocab_embed_row_0_not_zeroed},
            "the ids this rank does not own are sent to row 0 (a safe index) but their rows are not zeroed, so "
            "every such embedding gets this shard's row 0 added in the all-reduce: zero them after the lookup, "
            "y.masked_fill(~mask.unsqueeze(-1), 0), before all_reduce",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_without_all_reduce", "4.3", {"vocab_parallel_embed": vocab_embed_without_all_reduce},
            "no all-reduce: each rank holds only the rows of the ids it owns (zeros for the others). "
            "torch.distributed.all_reduce(y, group=group) sums the ranks, so every row comes from its one owner",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_shifts_ids_in_place", "4.3", {"vocab_parallel_embed": vocab_embed_shifts_ids_in_place},
            "the caller's token ids were shifted in place (token_ids -= vocab_start): on every rank but the first "
            "the caller's tensor now holds other ids, and whatever reads it after the embedding gets them. "
            "Compute local = token_ids - vocab_start, a new tensor",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_mask_includes_end", "4.3", {"vocab_parallel_embed": vocab_embed_mask_includes_end},
            "the mask lets in local == V/p (local <= weight_shard.shape[0]): that id is the first of the next rank's "
            "slice, one row past the end of this shard, and F.embedding raises IndexError on it. This rank owns "
            "0 <= local < weight_shard.shape[0] (a strict < at the end)",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_mask_excludes_start", "4.3", {"vocab_parallel_embed": vocab_embed_mask_excludes_start},
            "the mask drops local == 0 (local > 0): that is the first id of this rank's slice, vocab_start itself, "
            "and no rank then owns it (its row comes out zero). This rank owns 0 <= local < weight_shard.shape[0]",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_without_group", "4.3", {"vocab_parallel_embed": vocab_embed_without_group},
            "the all-reduce has no group=, so it sums over every rank of the default (WORLD) group: with more than "
            "one tensor-parallel group it adds the other groups' embeddings in. Pass the group you are given: "
            "torch.distributed.all_reduce(y, group=group)",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_zeroed_by_float_mask", "4.3", {"vocab_parallel_embed": vocab_embed_zeroed_by_float_mask},
            "the rows of ids this rank does not own were zeroed by multiplying with mask.float(): a bfloat16 row "
            "times a float32 mask is a float32 row, so the embeddings come back in float32 (and the all-reduce sends "
            "twice the bytes). Zero them in the shard's dtype: masked_fill, or a mask cast to weight_shard.dtype",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    # 4.4
    Mistake("ch4_lm_head_concatenates_rows", "4.4", {"parallel_lm_head": lm_head_concatenates_rows},
            "the gathered logits were concatenated on dim 0, stacking each rank's vocabulary slice as more "
            "tokens: rank r's logits are columns r*V/p .. (r+1)*V/p - 1 of the same rows, torch.cat(parts, dim=-1)",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_without_gather", "4.4", {"parallel_lm_head": lm_head_without_gather},
            "every rank returned the logits of its own vocabulary slice only: gather the ranks' slices to rank 0 "
            "(torch.distributed.gather(logits, parts, group_dst=0, group=group)) and concatenate them there",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_on_every_rank", "4.4", {"parallel_lm_head": lm_head_on_every_rank},
            "the full logits were all-gathered to every rank: only rank 0 samples, so gather them to rank 0 "
            "alone (an all-gather sends p times more) and return None on the other ranks",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_all_gather_then_none", "4.4", {"parallel_lm_head": lm_head_all_gather_then_none},
            "the logits are all-gathered, then dropped on every rank but 0: the results are right, but every rank "
            "received all p slices for nothing (p times the traffic of a gather). Gather them to rank 0 alone: "
            "torch.distributed.gather(logits, parts, group_dst=0, group=group), parts on rank 0 only (None on the "
            "others)",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_without_group", "4.4", {"parallel_lm_head": lm_head_without_group},
            "the gather has no group=, so it runs in the default (WORLD) group, where group_dst=0 is rank 0 of the "
            "whole world: with more than one tensor-parallel group, another group's rank 0 is not the destination "
            "there (torch refuses its gather_list) and every rank's slice goes to world rank 0. Pass the group you "
            "are given: torch.distributed.gather(logits, parts, group_dst=0, group=group)",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
]


# ---- more wrong versions (a later audit) ------------------------------------------------------------------
def shard_weight_split_by_size(weight, dim, rank, world_size):
    if weight.shape[dim] % world_size:
        raise ValueError(f"cannot split dim {dim} of size {weight.shape[dim]} into {world_size} equal shards")
    return weight.split(world_size, dim)[rank]  # the bug: split takes a piece SIZE (chunk takes the count)


def shard_weight_asserts(weight, dim, rank, world_size):
    size = weight.shape[dim]
    assert size % world_size == 0, f"cannot split {size} into {world_size}"  # the bug: AssertionError, not ValueError
    part = size // world_size
    return weight.narrow(dim, rank * part, part)


def shard_weight_always_last_dim(weight, dim, rank, world_size):
    size = weight.shape[dim]
    if size % world_size:
        raise ValueError(f"cannot split dim {dim} of size {size} into {world_size} equal shards")
    part = size // world_size
    return weight[..., rank * part:(rank + 1) * part]  # the bug: the last dim whatever `dim` says


def row_parallel_keeps_all_reduce_result(x, weight, bias, group):
    y = F.linear(x, weight)
    y = dist.all_reduce(y, group=group)  # the bug: all_reduce works in place and returns None
    return y if bias is None else y + bias


def vocab_embed_no_upper_bound(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = local >= 0  # the bug: ids past this rank's slice pass too (and index past the shard)
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_start_from_world_rank(token_ids, weight_shard, vocab_start, group):
    vocab_start = dist.get_rank() * weight_shard.shape[0]  # the bug: the argument replaced, from the GLOBAL rank
    local = token_ids - vocab_start
    mask = (local >= 0) & (local < weight_shard.shape[0])
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y


def vocab_embed_keeps_all_reduce_result(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = (local >= 0) & (local < weight_shard.shape[0])
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    return dist.all_reduce(y, group=group)  # the bug: all_reduce works in place and returns None


def _lm_head(hidden, weight_shard, group, *, list_everywhere=False, one_buffer=False, global_dst=False,
             world_rank=False, in_fp32=False, world_size=False):
    """parallel_lm_head with one bug switched on."""
    if in_fp32:  # the bug: logits in float32 for the sampler, never cast back to hidden's dtype
        hidden, weight_shard = hidden.float(), weight_shard.float()
    logits = F.linear(hidden, weight_shard)
    rank = dist.get_rank() if world_rank else dist.get_rank(group)  # (world_rank: the GLOBAL rank)
    size = dist.get_world_size() if world_size else dist.get_world_size(group)  # (world_size: the GLOBAL size)
    if one_buffer:  # the bug: one tensor listed size times
        parts = [torch.empty_like(logits)] * size if rank == 0 else None
    else:  # (list_everywhere: every rank passes a gather_list)
        parts = [torch.empty_like(logits) for _ in range(size)] if rank == 0 or list_everywhere else None
    if global_dst:  # the bug: dst= is a GLOBAL rank
        dist.gather(logits, parts, dst=0, group=group)
    else:
        dist.gather(logits, parts, group_dst=0, group=group)
    return torch.cat(parts, dim=-1) if rank == 0 else None


def lm_head_gather_list_on_every_rank(hidden, weight_shard, group):
    return _lm_head(hidden, weight_shard, group, list_everywhere=True)


def lm_head_one_buffer_listed(hidden, weight_shard, group):
    return _lm_head(hidden, weight_shard, group, one_buffer=True)


def lm_head_global_dst(hidden, weight_shard, group):
    return _lm_head(hidden, weight_shard, group, global_dst=True)


def lm_head_world_rank(hidden, weight_shard, group):
    return _lm_head(hidden, weight_shard, group, world_rank=True)


def lm_head_world_size(hidden, weight_shard, group):
    return _lm_head(hidden, weight_shard, group, world_size=True)


def lm_head_in_fp32(hidden, weight_shard, group):
    return _lm_head(hidden, weight_shard, group, in_fp32=True)


MISTAKES += [
    # 4.1
    Mistake("ch4_shard_weight_split_by_size", "4.1", {"shard_weight": shard_weight_split_by_size},
            "shard_weight cut pieces of world_size elements: Tensor.split(n, dim) takes a piece SIZE, not a count "
            "(torch.chunk takes the count). Rank r's shard is the r-th of world_size equal pieces of "
            "part = size // world_size: weight.narrow(dim, rank * part, part)",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_weight_asserts", "4.1", {"shard_weight": shard_weight_asserts},
            "shard_weight checks divisibility with assert, which raises AssertionError (and vanishes under "
            "python -O): raise ValueError naming the size and world_size when size % world_size != 0",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    Mistake("ch4_shard_weight_always_last_dim", "4.1", {"shard_weight": shard_weight_always_last_dim},
            "shard_weight cut the last dim whatever `dim` said (weight[..., a:b]): column-parallel layers split "
            "dim 0 of an nn.Linear weight [out, in], row-parallel ones dim 1. Cut along `dim`: "
            "weight.narrow(dim, rank * part, part)",
            "test_ch4.py::test_shard_weight_and_packed_match_torch_chunk"),
    # 4.2
    Mistake("ch4_row_parallel_keeps_all_reduce_result", "4.2",
            {"row_parallel_linear": row_parallel_keeps_all_reduce_result},
            "y = dist.all_reduce(y, ...) throws the sum away: torch.distributed.all_reduce sums the tensor IN "
            "PLACE and returns None (a Work handle with async_op=True). Call it on its own line, then use y",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    # 4.3
    Mistake("ch4_vocab_embed_no_upper_bound", "4.3", {"vocab_parallel_embed": vocab_embed_no_upper_bound},
            "ids past the end of this rank's vocabulary slice reach F.embedding, which raises IndexError (on every "
            "rank but the last): the mask needs an upper bound too, mask = (local >= 0) & (local < "
            "weight_shard.shape[0]), and the ids it drops go to a valid row (torch.where(mask, local, 0); a clamp "
            "must stop at weight_shard.shape[0] - 1)",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_start_from_world_rank", "4.3",
            {"vocab_parallel_embed": vocab_embed_start_from_world_rank},
            "vocab_start was recomputed from dist.get_rank(), the GLOBAL rank: in a second tensor-parallel group "
            "(global ranks 2 and 3) that points past the vocabulary, and those ranks embed nothing. Use the "
            "vocab_start you are given (this rank's offset within its own group)",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    Mistake("ch4_vocab_embed_keeps_all_reduce_result", "4.3",
            {"vocab_parallel_embed": vocab_embed_keeps_all_reduce_result},
            "return dist.all_reduce(y, ...) returns None: torch.distributed.all_reduce sums the tensor IN PLACE "
            "and returns None (a Work handle with async_op=True). Call it on its own line, then return y",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    # 4.4
    Mistake("ch4_lm_head_gather_list_on_every_rank", "4.4", {"parallel_lm_head": lm_head_gather_list_on_every_rank},
            "every rank passes a gather_list to torch.distributed.gather: only the destination, rank 0 of the "
            "group, may (it receives the p slices); the other ranks pass None (torch raises ValueError on them)",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_one_buffer_listed", "4.4", {"parallel_lm_head": lm_head_one_buffer_listed},
            "the gather_list is one tensor listed p times ([torch.empty_like(logits)] * p): every rank's slice "
            "lands in the same buffer and the last one wins. Make p distinct tensors: "
            "[torch.empty_like(logits) for _ in range(p)]",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_global_dst", "4.4", {"parallel_lm_head": lm_head_global_dst},
            "gather(..., dst=0, group=group) names GLOBAL rank 0, which is not in every tensor-parallel group "
            "(torch raises ValueError in the others): the destination is rank 0 of the group, group_dst=0",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_world_rank", "4.4", {"parallel_lm_head": lm_head_world_rank},
            "the rank that keeps the logits is found with dist.get_rank(), the GLOBAL rank: in a tensor-parallel "
            "group without global rank 0, its first rank passes no gather_list though it is the destination "
            "(torch raises ValueError). Use this process's rank in the group, dist.get_rank(group)",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_world_size", "4.4", {"parallel_lm_head": lm_head_world_size},
            "the gather_list has dist.get_world_size() tensors, the GLOBAL world's size: in a tensor-parallel group "
            "smaller than the world that is too many (gloo and NCCL refuse it). One tensor per rank of the group: "
            "dist.get_world_size(group)",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
    Mistake("ch4_lm_head_in_fp32", "4.4", {"parallel_lm_head": lm_head_in_fp32},
            "the logits of bfloat16 hidden states come back in float32: computed in float32 (hidden.float(), "
            "weight.float()) and never cast back. parallel_lm_head returns hidden's dtype (the sampler upcasts "
            "what it needs, and a float32 gather sends twice the bytes): compute in it, or cast the result back",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
]


# ---- more wrong versions (what the threaded process group hides or cannot run) -------------------------------
def row_parallel_async_without_wait(x, weight, bias, group):
    y = F.linear(x, weight)
    dist.all_reduce(y, group=group, async_op=True)  # the bug: the handle is dropped, never waited on
    return y if bias is None else y + bias


def row_parallel_reduce(x, weight, bias, group):
    y = F.linear(x, weight)
    dist.reduce(y, group_dst=0, group=group)  # the bug: the sum lands on rank 0 of the group alone
    return y if bias is None else y + bias


def row_parallel_bias_on_world_rank_0(x, weight, bias, group):
    y = F.linear(x, weight, bias if dist.get_rank() == 0 else None)  # the bug: rank 0 of the WORLD, not of the group
    dist.all_reduce(y, group=group)
    return y


def lm_head_logits_on_every_rank(hidden, weight_shard, group):
    logits = F.linear(hidden, weight_shard)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    parts = [torch.empty_like(logits) for _ in range(size)] if rank == 0 else None
    dist.gather(logits, parts, group_dst=0, group=group)
    return torch.cat(parts, dim=-1) if rank == 0 else logits  # the bug: the other ranks return their own slice


def vocab_embed_upper_bound_global(token_ids, weight_shard, vocab_start, group):
    local = token_ids - vocab_start
    mask = (token_ids >= vocab_start) & (token_ids < weight_shard.shape[0])  # the bug: a global id vs the slice's size
    y = F.embedding(torch.where(mask, local, 0), weight_shard)
    y = y.masked_fill(~mask.unsqueeze(-1), 0)
    dist.all_reduce(y, group=group)
    return y


MISTAKES += [
    # 4.2
    Mistake("ch4_row_parallel_async_without_wait", "4.2", {"row_parallel_linear": row_parallel_async_without_wait},
            "all_reduce(..., async_op=True) only starts the sum: it returns a handle at once, and y holds the sum "
            "only after handle.wait(). Without it the result is a race (between processes it is sometimes right, "
            "sometimes this rank's partial product). Call all_reduce without async_op, or call .wait() on what it "
            "returns before using y",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    Mistake("ch4_row_parallel_bias_on_world_rank_0", "4.2", {"row_parallel_linear": row_parallel_bias_on_world_rank_0},
            "the bias is added before the sum on dist.get_rank() == 0, the rank in the WORLD: in a second tensor-"
            "parallel group (global ranks 2 and 3) no rank is 0, and that group never adds its bias. Test the rank "
            "in the group, dist.get_rank(group) == 0, or add the bias after the all-reduce on every rank",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    Mistake("ch4_row_parallel_reduce", "4.2", {"row_parallel_linear": row_parallel_reduce},
            "torch.distributed.reduce sums the partial products on one rank (the destination) alone; the other "
            "ranks keep their own part, but the next layer runs on every rank and needs the whole sum there: "
            "torch.distributed.all_reduce(y, group=group) leaves it on every rank",
            "test_ch4.py::test_row_parallel_linear_on_two_thread_ranks"),
    # 4.3
    Mistake("ch4_vocab_embed_upper_bound_global", "4.3", {"vocab_parallel_embed": vocab_embed_upper_bound_global},
            "the mask's upper bound compares the GLOBAL id with the slice's size (token_ids < weight_shard.shape[0]): "
            "rank r owns ids vocab_start .. vocab_start + V/p - 1, so on every rank but the first no id passes, and "
            "the ids of the later slices come out as rows of zeros. Compare the shifted id, local = token_ids - "
            "vocab_start: mask = (local >= 0) & (local < weight_shard.shape[0])",
            "test_ch4.py::test_vocab_parallel_embed_on_two_thread_ranks"),
    # 4.4
    Mistake("ch4_lm_head_logits_on_every_rank", "4.4", {"parallel_lm_head": lm_head_logits_on_every_rank},
            "rank 0 gathers and returns the full logits, but the other ranks return their own vocabulary slice's "
            "logits: rank 0 alone holds the full logits and samples; every other rank returns None (as vLLM's LM "
            "head does), so nothing can sample from a slice by mistake",
            "test_ch4.py::test_parallel_lm_head_on_two_thread_ranks"),
]
