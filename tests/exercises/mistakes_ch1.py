"""Chapter 1's known wrong versions (see mistakes.py).

Each function below is an exercise written the way students get it wrong; its docstring says the
one thing that differs from the right version. The hints are what the grader prints.
"""
from __future__ import annotations

import json
import struct

import numpy as np
import torch

from minillm.course.runtime_v0 import last_logits, prefill_batch
from minillm.engine.model_runner import Batch
from minillm.loader import (IGNORED_SUFFIXES, SAFETENSORS_DTYPES, checkpoint_param_name, expected_shards,
                            iterate_safetensors)
from minillm.loader import parse_safetensors_header as right_parse_header
from mistakes import Mistake

NO_LENGTH_CHECK = 1 << 62  # a file_size no header length N can exceed
# 1.1's slip that raises instead of answering (test_ch1's _bpe_encode tells it with this hint)
BYTES_NOT_INTS = ("indexing or iterating bytes gives ints (b'ab'[0] == 97, list(b'ab') == [97, 98]), and ranks' keys "
                  "are bytes: start from one-byte bytes objects, parts = [piece[i:i + 1] for i in range(len(piece))]")


# ---- 1.1 byte-level BPE --------------------------------------------------------------------------
def bpe_first_pair(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Merges the leftmost adjacent pair that is a token, instead of the pair of lowest rank."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while True:
        mergeable = [i for i in range(len(parts) - 1) if parts[i] + parts[i + 1] in ranks]
        if not mergeable:
            return [ranks[p] for p in parts]
        i = mergeable[0]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def bpe_highest_rank(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Merges the pair of HIGHEST rank first (max instead of min)."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while True:
        candidates = [(ranks[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1)
                      if parts[i] + parts[i + 1] in ranks]
        if not candidates:
            return [ranks[p] for p in parts]
        _, i = max(candidates, key=lambda c: (c[0], -c[1]))
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def _bpe_scan(piece: bytes, ranks: dict[bytes, int], *, ties_right: bool = False, pairs_missed: int = 0,
              first_pair: int = 0, parts_left: int = 1, int_parts: bool = False) -> list[int]:
    """The right scan for the lowest-ranked pair, with one detail changed."""
    parts = list(piece) if int_parts else [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > parts_left:
        best, best_rank = -1, None
        for i in range(first_pair, len(parts) - 1 - pairs_missed):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank or (ties_right and rank == best_rank)):
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return [ranks[p] for p in parts]


def bpe_parts_are_ints(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Starts from list(piece): ints, not one-byte bytes, so no pair is found and the lookup fails."""
    return _bpe_scan(piece, ranks, int_parts=True)


def bpe_rightmost_tie(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Picks the lowest rank with <=, so of two equal pairs (one rank) the RIGHTMOST merges first."""
    return _bpe_scan(piece, ranks, ties_right=True)


def bpe_skips_the_last_pair(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Scans range(len(parts) - 2): the last two parts are never merged with each other."""
    return _bpe_scan(piece, ranks, pairs_missed=1)


def bpe_skips_the_first_pair(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Scans range(1, len(parts) - 1): the first two parts are never merged with each other."""
    return _bpe_scan(piece, ranks, first_pair=1)


def bpe_stops_at_two_parts(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Loops while len(parts) > 2: the last merge, of the final two parts into one token, never happens."""
    return _bpe_scan(piece, ranks, parts_left=2)


_PIECE_CACHE: dict[bytes, list[int]] = {}


def bpe_cached_by_piece(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """The right BPE, memoized on the piece alone: a later call with other ranks gets the first call's ids."""
    if piece not in _PIECE_CACHE:
        _PIECE_CACHE[piece] = _bpe_scan(piece, ranks)
    return list(_PIECE_CACHE[piece])


RANKS_IGNORED = ("your bpe_encode gave this piece the ids of the call before, made with other ranks: the ids depend "
                 "on `ranks` as well as on the piece, so a cache must be keyed by both (or drop the cache)")


def bpe_returns_bytes(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Merges correctly but returns the merged byte strings, not their token ids."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while True:
        candidates = [(ranks[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1)
                      if parts[i] + parts[i + 1] in ranks]
        if not candidates:
            return parts
        _, i = min(candidates)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def bpe_longest_prefix(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Cuts off the longest prefix that is a token, again and again (greedy longest match), instead of merging
    adjacent pairs in rank order."""
    ids, start = [], 0
    while start < len(piece):
        end = next(j for j in range(len(piece), start, -1) if piece[start:j] in ranks)
        ids.append(ranks[piece[start:end]])
        start = end
    return ids


# ---- 1.2 safetensors -----------------------------------------------------------------------------
def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def header_keeps_metadata(data, file_size=None) -> tuple[dict, int]:
    """Returns the JSON header as it is, "__metadata__" entry included."""
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    return json.loads(bytes(data[8:8 + n])), 8 + n


def header_start_without_length(data, file_size=None) -> tuple[dict, int]:
    """data_start = N: forgets the 8 bytes of the length field before the header."""
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8:8 + n]))
    header.pop("__metadata__", None)
    return header, n


def read_tensor_without_data_start(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """Reads at data_offsets[0] from the start of the FILE: forgets to add data_start (8 + N)."""
    dtype = SAFETENSORS_DTYPES[info["dtype"]]
    shape, (begin, _) = info["shape"], info["data_offsets"]
    if _numel(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=_numel(shape), offset=begin).view(shape)


def read_tensor_copies(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """Slices the buffer first (buf[a:b] copies a bytearray or an mmap), then wraps the copy."""
    dtype = SAFETENSORS_DTYPES[info["dtype"]]
    shape, (begin, end) = info["shape"], info["data_offsets"]
    if _numel(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf[data_start + begin:data_start + end], dtype=dtype).view(shape)


def header_without_length_check(data, file_size=None) -> tuple[dict, int]:
    """Validates the JSON and every entry but never checks that N fits in the file: data[8:8 + N] quietly
    stops at the end of the file, so a header that claims more bytes than the file holds still parses."""
    if len(data) < 8:
        raise ValueError("too short for a safetensors header")
    # the reference, told the file is longer than any N: its every other check, without that one
    return right_parse_header(data, file_size=NO_LENGTH_CHECK)


def header_rejects_a_header_ending_the_file(data, file_size=None) -> tuple[dict, int]:
    """Checks N >= file_size - 8 where the rule is N > file_size - 8: a header that runs to the file's
    last byte is refused, and safetensors writes every file whose tensors hold no bytes that way."""
    size = len(data) if file_size is None else file_size
    if size < 8:
        raise ValueError("too short for a safetensors header")
    return right_parse_header(data, file_size=size - 1)  # the reference, told the file is one byte shorter


def header_refuses_empty_tensors(data, file_size=None) -> tuple[dict, int]:
    """Checks 0 <= begin < end where the rule is begin <= end: a tensor with no elements is refused."""
    header, start = right_parse_header(data, file_size=file_size)
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if begin == end:  # the bug: an empty tensor's byte range is empty, and valid
            raise ValueError(f"tensor {name!r}: data_offsets [{begin}, {end}] hold no bytes")
    return header, start


def header_big_endian(data, file_size=None) -> tuple[dict, int]:
    """Reads N big-endian (struct.unpack(">Q", ...), int.from_bytes(..., "big")): safetensors writes it
    little-endian, so N comes out about 2**56 times too large and every file is refused as too short."""
    swapped = bytes(data[:8])[::-1] + bytes(data[8:])  # the reference reading the reversed bytes reads N big-endian
    return right_parse_header(swapped, file_size=file_size)


def _read_tensor(buf, info: dict, data_start: int, name: str = "", *, size_check: str = "==",
                 empty_first: bool = False, end_from_data_start: bool = True) -> torch.Tensor:
    """read_tensor with one check changed: the byte range's size compared with ">=" (a longer one passes)
    or not at all ("none"), an empty tensor returned before any check (empty_first), or the end offset
    compared with len(buf) as if it counted from the buffer's start (end_from_data_start False)."""
    if info.get("dtype") not in SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {name!r}: unsupported dtype {info.get('dtype')!r}")
    dtype = SAFETENSORS_DTYPES[info["dtype"]]
    shape, (begin, end) = info["shape"], info["data_offsets"]
    if empty_first and _numel(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    size, want = end - begin, _numel(shape) * dtype.itemsize
    wrong_size = {"==": size != want, ">=": size < want, "none": False}[size_check]
    if wrong_size or begin < 0 or (data_start if end_from_data_start else 0) + end > len(buf):
        raise ValueError(f"tensor {name!r}: offsets {begin}..{end} do not fit its shape")
    if _numel(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=_numel(shape), offset=data_start + begin).view(shape)


def read_tensor_size_at_least(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """Refuses a byte range shorter than the shape but accepts a longer one."""
    return _read_tensor(buf, info, data_start, name, size_check=">=")


def read_tensor_empty_before_checks(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """Returns an empty tensor before checking its entry's offsets."""
    return _read_tensor(buf, info, data_start, name, empty_first=True)


def read_tensor_end_without_data_start(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """Compares the entry's end offset, which counts from data_start, with len(buf) itself: a tensor past
    the end of the file passes the check, and torch.frombuffer refuses it with its own ValueError."""
    return _read_tensor(buf, info, data_start, name, end_from_data_start=False)


def read_tensor_without_size_check(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """Checks the dtype and the end of the buffer but not that end - begin is numel * itemsize: offsets
    that do not fit the shape are read as if they did."""
    return _read_tensor(buf, info, data_start, name, size_check="none")


# ---- 1.3 packed parameters -----------------------------------------------------------------------
def param_name_without_shard(ckpt_name: str, packed_modules_mapping: dict) -> tuple[str, None]:
    """Renames to the packed parameter but returns shard id None."""
    for frag, (packed_frag, _) in packed_modules_mapping.items():
        if f".{frag}." in ckpt_name:
            return ckpt_name.replace(f".{frag}.", f".{packed_frag}."), None
    return ckpt_name, None


def param_name_not_renamed(ckpt_name: str, packed_modules_mapping: dict) -> tuple[str, str | int | None]:
    """Finds the shard id but keeps the checkpoint's name (q_proj instead of qkv_proj)."""
    for frag, (_, shard_id) in packed_modules_mapping.items():
        if f".{frag}." in ckpt_name:
            return ckpt_name, shard_id
    return ckpt_name, None


def param_name_matches_inside_a_word(ckpt_name: str, packed_modules_mapping: dict) -> tuple[str, str | int | None]:
    """Looks for the fragment without its dots: "up_proj" also matches inside "gate_up_proj"."""
    for frag, (packed_frag, shard_id) in packed_modules_mapping.items():
        if frag in ckpt_name:
            return ckpt_name.replace(frag, packed_frag), shard_id
    return ckpt_name, None


def _load(model, path: str, check_names: bool = True, check_shapes: bool = True, check_complete: bool = True,
          skip_ignored: bool = True, skip_tied_head: bool = True, any_shard_completes: bool = False,
          loader_for_packed_only: bool = False, numel_only: bool = False):
    """The right load_model with one of its checks switched off."""
    packed = getattr(model, "packed_modules_mapping", {})
    params = dict(model.named_parameters())
    tied = getattr(model, "tie_word_embeddings", False)
    loaded: dict[str, set] = {name: set() for name in params}
    for ckpt_name, tensor in iterate_safetensors(path):
        if (skip_ignored and ckpt_name.endswith(IGNORED_SUFFIXES)) or (
                skip_tied_head and tied and ckpt_name == "lm_head.weight"):
            continue
        name, shard = checkpoint_param_name(ckpt_name, packed)
        if name not in params:
            if check_names:
                raise ValueError(f"unexpected tensor {ckpt_name!r}")
            continue
        param = params[name]
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            if loader is None or (loader_for_packed_only and shard is None):  # (the bug: a whole tensor copied)
                if numel_only:  # (the bug: the element counts compared, and the tensor reshaped to fit)
                    if param.numel() != tensor.numel():
                        raise ValueError(f"{ckpt_name}: {tensor.numel()} elements, expected {param.numel()}")
                    tensor = tensor.reshape(param.shape)
                elif check_shapes and tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(f"{ckpt_name}: shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
                param.data.copy_(tensor)
            else:
                loader(param, tensor, shard, name=ckpt_name)
        loaded[name].add(shard)
    missing = [n for n in params if None not in loaded[n] and not expected_shards(n, packed) <= loaded[n]]
    if any_shard_completes:
        missing = [n for n in params if not loaded[n]]
    if missing and check_complete:
        raise ValueError(f"missing tensors for {missing[:3]}")


def load_skipping_unknown_names(model, path: str) -> None:
    """Skips a checkpoint tensor the model has no parameter for, instead of raising."""
    _load(model, path, check_names=False)


def load_with_loaders_for_packed_only(model, path: str) -> None:
    """Calls weight_loader only for a packed shard (shard id not None) and copies every whole tensor itself."""
    _load(model, path, loader_for_packed_only=True)


def load_without_shape_check(model, path: str) -> None:
    """Copies a tensor without a weight_loader without comparing the shapes first."""
    _load(model, path, check_shapes=False)


def load_checking_numel_not_shape(model, path: str) -> None:
    """Compares element counts where the rule is the shape, and reshapes the tensor to the parameter's."""
    _load(model, path, numel_only=True)


def load_without_completeness_check(model, path: str) -> None:
    """Never checks at the end that every parameter received all its tensors."""
    _load(model, path, check_complete=False)


def load_completeness_any_shard(model, path: str) -> None:
    """Checks at the end only that every parameter received SOMETHING: a packed parameter that got one of its
    shards (gate_proj without up_proj) counts as loaded."""
    _load(model, path, any_shard_completes=True)


def load_keeping_rotary_inv_freq(model, path: str) -> None:
    """Routes a checkpoint's rotary_emb.inv_freq buffers like weights (IGNORED_SUFFIXES not skipped)."""
    _load(model, path, skip_ignored=False)


def load_keeping_tied_lm_head(model, path: str) -> None:
    """Routes lm_head.weight of a tied model like any weight (the model lists the shared tensor once, as the
    embedding)."""
    _load(model, path, skip_tied_head=False)


# ---- 1.4 the forward pipeline --------------------------------------------------------------------
def forward_without_final_norm(model, input_ids, positions):
    """Goes straight from the last layer to the LM head: no final norm (and so no last residual add)."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, residual)
    return model.lm_head(hidden)


def forward_final_norm_without_residual(model, input_ids, positions):
    """Calls the final norm on the last layer's output alone, dropping the residual stream."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, residual)
    return model.lm_head(model.model.norm(hidden))


def forward_residual_restarted(model, input_ids, positions):
    """Passes residual=None to every layer, so each layer restarts the residual stream."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, None)
    hidden, _ = model.model.norm(hidden, residual)
    return model.lm_head(hidden)


def forward_residual_starts_as_embeddings(model, input_ids, positions):
    """Gives the first layer residual = the embeddings instead of None, so it adds them to themselves."""
    hidden = model.model.embed_tokens(input_ids)
    residual = hidden
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, residual)
    hidden, _ = model.model.norm(hidden, residual)
    return model.lm_head(hidden)


def forward_positions_from_arange(model, input_ids, positions):
    """Numbers the tokens 0..N-1 itself instead of using `positions` (what one prefill from 0 shows)."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(torch.arange(len(input_ids), device=input_ids.device), hidden, residual)
    hidden, _ = model.model.norm(hidden, residual)
    return model.lm_head(hidden)


def forward_head_on_unnormed_residual(model, input_ids, positions):
    """Takes the wrong output of the final norm: hidden, residual = norm(hidden, residual), then
    lm_head(residual), the un-normalized stream."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, residual)
    _, residual = model.model.norm(hidden, residual)
    return model.lm_head(residual)


def forward_logits_in_fp32(model, input_ids, positions):
    """The right forward, its logits upcast to fp32 (.float()) whatever the model's dtype."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, residual)
    hidden, _ = model.model.norm(hidden, residual)
    return model.lm_head(hidden).float()


def forward_skips_the_last_layer(model, input_ids, positions):
    """Loops over model.model.layers[:-1]: the last decoder layer never runs."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers[:-1]:
        hidden, residual = layer(positions, hidden, residual)
    hidden, _ = model.model.norm(hidden, residual)
    return model.lm_head(hidden)


def forward_logits_of_the_last_position(model, input_ids, positions):
    """Gives the LM head the last position alone (hidden[-1:], as last_logits does): logits [1, vocab], not
    [N, vocab]."""
    hidden, residual = model.model.embed_tokens(input_ids), None
    for layer in model.model.layers:
        hidden, residual = layer(positions, hidden, residual)
    hidden, _ = model.model.norm(hidden, residual)
    return model.lm_head(hidden[-1:])


# ---- 1.5 generate without a cache ----------------------------------------------------------------
def naive_never_appends(runner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Runs the prompt every step but never appends the new token to the sequence it feeds."""
    ids, new = list(prompt_ids), []
    for _ in range(max_new_tokens):
        new.append(int(last_logits(runner, prefill_batch(ids)).argmax()))
    return new


def naive_returns_prompt_too(runner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Returns the whole sequence (prompt + new tokens) instead of the new tokens only."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(last_logits(runner, prefill_batch(ids)).argmax()))
    return ids


def naive_counts_the_prompt(runner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Loops while len(ids) < max_new_tokens: the sequence's length includes the prompt."""
    ids = list(prompt_ids)
    while len(ids) < max_new_tokens:
        ids.append(int(last_logits(runner, prefill_batch(ids)).argmax()))
    return ids[len(prompt_ids):]


def naive_one_step_short(runner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Runs range(max_new_tokens - 1) steps: one token too few."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens - 1):
        ids.append(int(last_logits(runner, prefill_batch(ids)).argmax()))
    return ids[len(prompt_ids):]


def _last_of_equal_maxima(logits: torch.Tensor) -> int:
    """The argmax a stable argsort gives: of equal best logits, the HIGHEST token id."""
    return int(np.argsort(logits.numpy(), kind="stable")[-1])


def naive_ties_to_highest_id(runner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Takes argsort()[-1] for the argmax: of equal best logits, the highest id."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(_last_of_equal_maxima(last_logits(runner, prefill_batch(ids))))
    return ids[len(prompt_ids):]


def naive_ids_as_tensors(runner, prompt_ids: list[int], max_new_tokens: int) -> list:
    """Appends logits.argmax() itself, a 0-d tensor, not int(...)."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(last_logits(runner, prefill_batch(ids)).argmax())
    return ids[len(prompt_ids):]


# ---- 1.6 generate with a KV cache ----------------------------------------------------------------
def _cached(runner, prompt_ids: list[int], max_new_tokens: int, position_shift: int = 0,
            context_shift: int = 0, decode_steps_shift: int = 0, prefill_stores: bool = True, slot_shift: int = 0,
            zero_guard: bool = True, as_tensors: bool = False, ties_to_highest: bool = False) -> list:
    """The right greedy_generate_cached, its decode step's position, slot, context length or step count
    shifted by one (or its prefill run without a slot mapping, no early return for max_new_tokens 0, the
    ids kept as 0-d tensors)."""
    ids = list(prompt_ids)
    if zero_guard and max_new_tokens < 1:
        return []
    block_table = np.arange(runner.num_kvcache_blocks, dtype=np.int32)[None, :]
    slots = np.arange(len(ids), dtype=np.int64) if prefill_stores else None
    token = (lambda logits: logits.argmax()) if as_tensors else (lambda logits: int(logits.argmax()))
    token = _last_of_equal_maxima if ties_to_highest else token
    ids.append(token(last_logits(runner, prefill_batch(ids, slot_mapping=slots))))
    for _ in range(max_new_tokens - 1 + decode_steps_shift):
        slot = np.array([len(ids) - 1], dtype=np.int64)
        step = Batch(is_prefill=False, input_ids=np.array([int(ids[-1])], dtype=np.int64),
                     positions=slot + position_shift, slot_mapping=slot + slot_shift,
                     context_lens=np.array([len(ids) + context_shift], dtype=np.int32), block_tables=block_table)
        ids.append(token(last_logits(runner, step)))
    return ids[len(prompt_ids):]


def cached_position_one_past(runner, prompt_ids, max_new_tokens):
    """Decodes the newest token at position len(ids) instead of len(ids) - 1 (its RoPE angle is off by one)."""
    return _cached(runner, prompt_ids, max_new_tokens, position_shift=1)


def cached_context_without_newest(runner, prompt_ids, max_new_tokens):
    """context_lens = len(ids) - 1: the newest token does not attend to its own key."""
    return _cached(runner, prompt_ids, max_new_tokens, context_shift=-1)


def cached_one_step_too_many(runner, prompt_ids, max_new_tokens):
    """Runs max_new_tokens decode steps after the prefill, which already produced the first token."""
    return _cached(runner, prompt_ids, max_new_tokens, decode_steps_shift=1)


def cached_prefill_not_stored(runner, prompt_ids, max_new_tokens):
    """Runs the prefill without a slot mapping (as the naive loop does): the prompt's K/V never reach the cache."""
    return _cached(runner, prompt_ids, max_new_tokens, prefill_stores=False)


def cached_all_one_past(runner, prompt_ids, max_new_tokens):
    """Decodes the newest token at position AND slot len(ids) (context_lens len(ids) + 1), as if it were not
    in ids yet: slot len(ids) - 1 is never written and each step attends to it."""
    return _cached(runner, prompt_ids, max_new_tokens, position_shift=1, slot_shift=1, context_shift=1)


def cached_slot_one_past(runner, prompt_ids, max_new_tokens):
    """Stores the newest token's K/V in slot len(ids) (the next free one) while it sits at position len(ids) - 1."""
    return _cached(runner, prompt_ids, max_new_tokens, slot_shift=1)


def cached_without_zero_guard(runner, prompt_ids, max_new_tokens):
    """Always runs the prefill and keeps its token: max_new_tokens=0 returns one token."""
    return _cached(runner, prompt_ids, max_new_tokens, zero_guard=False)


def cached_ties_to_highest_id(runner, prompt_ids, max_new_tokens):
    """Takes argsort()[-1] for the argmax: of equal best logits, the highest id."""
    return _cached(runner, prompt_ids, max_new_tokens, ties_to_highest=True)


def cached_ids_as_tensors(runner, prompt_ids, max_new_tokens):
    """Appends logits.argmax() itself, a 0-d tensor, not int(...)."""
    return _cached(runner, prompt_ids, max_new_tokens, as_tensors=True)


def _through_first_eos(runner, new_ids: list[int]) -> list[int]:
    eos = runner.model_config.eos_token_id
    return next((new_ids[:i + 1] for i, t in enumerate(new_ids) if t in eos), new_ids)


def naive_stops_at_eos(runner, prompt_ids, max_new_tokens):
    """Stops after the first EOS it generates (here EOS is not special: exactly max_new_tokens tokens)."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(last_logits(runner, prefill_batch(ids)).argmax()))
        if ids[-1] in runner.model_config.eos_token_id:
            break
    return ids[len(prompt_ids):]


def cached_stops_at_eos(runner, prompt_ids, max_new_tokens):
    """The right cached loop, stopped after the first EOS it generates."""
    return _through_first_eos(runner, _cached(runner, prompt_ids, max_new_tokens))


BPE = "test_ch1.py::test_bpe_encode_pieces_match_tiktoken"
REJECTS = "test_ch1.py::test_load_model_rejects_bad_checkpoints"
CORRUPT = "test_ch1.py::test_corrupt_file_raises_value_error"
SKIPS = "test_ch1.py::test_load_model_skips_what_the_model_does_not_store"
FORWARD = "test_ch1.py::test_forward_pipeline_matches_transformers_logits"
FORWARD_BF16 = "test_ch1.py::test_forward_pipeline_of_a_bf16_model_returns_bf16_logits"
NAIVE = "test_ch1.py::test_naive_generate_equals_transformers"
CACHED = "test_ch1.py::test_cached_generate_equals_transformers"
FAST_MODEL = {"name": "tiny-qwen3-tied"}  # the quickest of the tiny checkpoints to run
TIES = "test_ch1.py::test_generate_takes_the_lowest_id_of_equal_best_logits"
TIES_HINT = ("of equal best logits your loop takes the HIGHEST token id (argsort()[-1], or a scan that keeps the last "
             "maximum): torch.argmax, and so transformers' greedy generate, takes the FIRST, the lowest id. Exact "
             "ties are common in bf16; use int(logits.argmax())")

MISTAKES: list[Mistake] = [
    Mistake("ch1_bpe_first_pair", "1.1", {"bpe_encode": bpe_first_pair},
            "merges the leftmost mergeable pair instead of the pair of LOWEST rank: at every step scan all "
            "adjacent pairs, keep the one whose concatenation has the smallest id in ranks (ties: the "
            "leftmost), merge it, and rescan", BPE),
    Mistake("ch1_bpe_parts_are_ints", "1.1", {"bpe_encode": bpe_parts_are_ints}, BYTES_NOT_INTS, BPE),
    Mistake("ch1_bpe_cached_by_piece", "1.1", {"bpe_encode": bpe_cached_by_piece}, RANKS_IGNORED,
            "test_ch1.py::test_bpe_encode_uses_the_ranks_it_is_given"),
    Mistake("ch1_bpe_highest_rank", "1.1", {"bpe_encode": bpe_highest_rank},
            "merges the pair of HIGHEST rank first: a lower rank means the merge was learned earlier and must "
            "happen first, so pick the minimum rank, not the maximum", BPE),
    Mistake("ch1_bpe_rightmost_tie", "1.1", {"bpe_encode": bpe_rightmost_tie},
            "when the same pair occurs twice (b\"aaaaa\": four pairs b\"aa\", one rank), the rightmost is merged "
            "first: a comparison rank <= best_rank lets each later equal pair replace the one found before. Keep the "
            "leftmost (rank < best_rank), as tiktoken does: b\"aaaaa\" is [b\"aaaa\", b\"a\"], not "
            "[b\"a\", b\"aaaa\"]", BPE),
    Mistake("ch1_bpe_skips_the_last_pair", "1.1", {"bpe_encode": bpe_skips_the_last_pair},
            "the scan stops one pair short (range(len(parts) - 2)): the last two parts are never merged with each "
            "other, so a piece whose last merge joins its end stays split. A piece of n parts has n - 1 adjacent "
            "pairs, i = 0 .. len(parts) - 2: range(len(parts) - 1)", BPE),
    Mistake("ch1_bpe_skips_the_first_pair", "1.1", {"bpe_encode": bpe_skips_the_first_pair},
            "the scan starts at the second pair (range(1, len(parts) - 1)): the first two parts are never merged "
            "with each other, so a piece whose merges start at its beginning stays split. Scan every adjacent "
            "pair, i = 0 .. len(parts) - 2: range(len(parts) - 1)", BPE),
    Mistake("ch1_bpe_stops_at_two_parts", "1.1", {"bpe_encode": bpe_stops_at_two_parts},
            "the loop stops when two parts are left (while len(parts) > 2): the last merge, of those two into one "
            "token, never happens. Merge while more than one part is left and some pair has a rank", BPE),
    Mistake("ch1_bpe_returns_bytes", "1.1", {"bpe_encode": bpe_returns_bytes},
            "returns the merged byte strings instead of token ids: finish with [ranks[part] for part in parts]",
            BPE),
    Mistake("ch1_bpe_longest_prefix", "1.1", {"bpe_encode": bpe_longest_prefix},
            "cuts off the longest prefix that is in ranks, again and again (greedy longest match): BPE is not a "
            "dictionary lookup, the longest token at a position is often not what the merges build (b'\\ttabs' is "
            "[b'\\tt', b'abs'], not [b'\\ttab', b's']). Start from single bytes and repeatedly merge the adjacent "
            "pair of LOWEST rank (the merge learned first), until no adjacent pair is in ranks", BPE),
    Mistake("ch1_header_keeps_metadata", "1.2", {"parse_safetensors_header": header_keeps_metadata},
            "the header still holds the '__metadata__' entry, which is not a tensor: header.pop('__metadata__', "
            "None) before returning", "test_ch1.py::test_header_matches_safetensors"),
    Mistake("ch1_header_start_without_length", "1.2", {"parse_safetensors_header": header_start_without_length},
            "data_start is N, the header's length alone: the data begins after the 8-byte length field AND the "
            "N header bytes, so return 8 + N", "test_ch1.py::test_header_matches_safetensors"),
    Mistake("ch1_read_tensor_without_data_start", "1.2", {"read_tensor": read_tensor_without_data_start},
            "read_tensor reads at data_offsets[0] from the start of the file: data_offsets count from the end "
            "of the header, so the byte offset is data_start + begin (data_start = 8 + N)",
            "test_ch1.py::test_read_tensor_matches_safetensors"),
    Mistake("ch1_read_tensor_copies", "1.2", {"read_tensor": read_tensor_copies},
            "read_tensor returns a copy: slicing buf (buf[a:b]) copies the bytes; give the whole buffer to "
            "torch.frombuffer with offset=data_start + begin and count=numel, so the tensor is a view of buf",
            "test_ch1.py::test_read_tensor_is_a_view_not_a_copy"),
    Mistake("ch1_header_without_length_check", "1.2", {"parse_safetensors_header": header_without_length_check},
            "parse_safetensors_header never checks that the N header bytes fit in the file: data[8:8 + N] stops "
            "quietly at the end, so a truncated file whose header claims more bytes than there are still parses. "
            "Raise ValueError when N > file_size - 8 (file_size defaults to len(data))", CORRUPT,
            {"case": "header length past the end of a file that is all header"}),
    Mistake("ch1_header_rejects_a_header_ending_the_file", "1.2",
            {"parse_safetensors_header": header_rejects_a_header_ending_the_file},
            "the length check refuses N == file_size - 8 (>= where the rule is >): a header may run to the file's "
            "last byte, and safetensors writes every file whose tensors hold no bytes (or that holds none) that "
            "way. Raise only when N > file_size - 8",
            "test_ch1.py::test_header_of_a_file_that_is_all_header"),
    Mistake("ch1_header_refuses_empty_tensors", "1.2", {"parse_safetensors_header": header_refuses_empty_tensors},
            "the offsets check refuses begin == end (0 <= begin < end where the rule is 0 <= begin <= end): a tensor "
            "with no elements (a shape with a 0 in it) holds no bytes, so its data_offsets are [x, x], and "
            "safetensors writes such tensors. Refuse only begin > end (or begin < 0)",
            "test_ch1.py::test_header_of_a_file_that_is_all_header"),
    Mistake("ch1_header_big_endian", "1.2", {"parse_safetensors_header": header_big_endian},
            "the header's length N is read big-endian (struct.unpack('>Q', ...), or int.from_bytes(..., 'big')): "
            "safetensors writes it little-endian, so N comes out about 2**56 times too large and every file is "
            "refused as shorter than its header. Read it with struct.unpack('<Q', data[:8])",
            "test_ch1.py::test_header_of_a_file_that_is_all_header"),
    Mistake("ch1_read_tensor_size_at_least", "1.2", {"read_tensor": read_tensor_size_at_least},
            "read_tensor refuses a byte range shorter than the shape needs but accepts a longer one (<, not !=): "
            "offsets that span more bytes than numel * itemsize describe another tensor than the header says. "
            "Raise unless end - begin == numel * dtype.itemsize",
            CORRUPT, {"case": "offsets longer than the shape"}),
    Mistake("ch1_read_tensor_empty_before_checks", "1.2", {"read_tensor": read_tensor_empty_before_checks},
            "read_tensor returns an empty tensor before checking its entry: an entry of no elements whose offsets "
            "span bytes is corrupt too. Check the offsets first (end - begin == 0 for it), then return "
            "torch.empty(shape)",
            CORRUPT, {"case": "an empty tensor whose offsets hold bytes"}),
    Mistake("ch1_read_tensor_end_without_data_start", "1.2", {"read_tensor": read_tensor_end_without_data_start},
            "read_tensor's bound check compares the entry's end offset with len(buf), but offsets count from "
            "data_start: a tensor past the end of the file passes it, and only torch.frombuffer's own error (which "
            "names no tensor) stops the read. Check data_start + end > len(buf), and name the tensor in the error",
            CORRUPT, {"case": "tensor past the end"}),
    Mistake("ch1_read_tensor_without_size_check", "1.2", {"read_tensor": read_tensor_without_size_check},
            "read_tensor does not check that the entry's byte range fits its shape: raise ValueError (naming the "
            "tensor) when end - begin != numel * dtype.itemsize, or a corrupt header reads another tensor's bytes",
            CORRUPT, {"case": "offsets do not match the shape"}),
    Mistake("ch1_param_name_without_shard", "1.3", {"checkpoint_param_name": param_name_without_shard},
            "checkpoint_param_name renames to the packed parameter but returns shard id None: return the "
            "mapping's shard id ('q'/'k'/'v', 0/1), which tells the weight_loader which rows to fill",
            "test_ch1.py::test_checkpoint_param_name",
            {"ckpt": "model.layers.0.self_attn.q_proj.weight",
             "want": ("model.layers.0.self_attn.qkv_proj.weight", "q")}),
    Mistake("ch1_param_name_not_renamed", "1.3", {"checkpoint_param_name": param_name_not_renamed},
            "checkpoint_param_name keeps the checkpoint's name: the model only has the packed parameters, so "
            "replace the fragment by the mapping's packed one ('.q_proj.' -> '.qkv_proj.', '.up_proj.' -> "
            "'.gate_up_proj.')",
            "test_ch1.py::test_checkpoint_param_name",
            {"ckpt": "model.layers.27.mlp.up_proj.weight", "want": ("model.layers.27.mlp.gate_up_proj.weight", 1)}),
    Mistake("ch1_param_name_matches_inside_a_word", "1.3", {"checkpoint_param_name": param_name_matches_inside_a_word},
            "checkpoint_param_name matches a fragment inside another word: 'up_proj' is found in 'gate_up_proj' "
            "(a checkpoint stored already packed, as Phi-3's is) and renames it again. A fragment counts only as a "
            "whole dotted component: look for and replace f'.{fragment}.', dots included",
            "test_ch1.py::test_checkpoint_param_name",
            {"ckpt": "model.layers.0.mlp.gate_up_proj.weight",
             "want": ("model.layers.0.mlp.gate_up_proj.weight", None)}),
    Mistake("ch1_load_skips_unknown_names", "1.3", {"load_model": load_skipping_unknown_names},
            "load_model skips a checkpoint tensor the model has no parameter for: raise ValueError naming it "
            "(a wrong checkpoint or config must not load half silently)",
            REJECTS, {"change": "add model.layers.0.surprise.weight", "match": "surprise"}),
    Mistake("ch1_load_loaders_for_packed_only", "1.3", {"load_model": load_with_loaders_for_packed_only},
            "load_model calls a parameter's weight_loader only for packed shards and copies whole tensors itself: "
            "every parameter that has a weight_loader must load through it, since under tensor parallelism it cuts "
            "this rank's slice (o_proj's columns, the vocabulary's rows); copy only where there is none",
            "test_ch1.py::test_load_model_gives_a_tensor_parallel_rank_its_slices"),
    Mistake("ch1_load_without_shape_check", "1.3", {"load_model": load_without_shape_check},
            "load_model copies a tensor without a weight_loader before comparing shapes: check "
            "param.shape == tensor.shape first and raise ValueError naming the checkpoint tensor",
            REJECTS, {"change": "reshape model.norm.weight", "match": "model.norm.weight"}),
    Mistake("ch1_load_checks_numel_not_shape", "1.3", {"load_model": load_checking_numel_not_shape},
            "load_model compares element counts where the rule is the shape (param.numel() == tensor.numel(), then "
            "a reshape): a (64,) norm stored as (8, 8) loads, though that checkpoint is not this model's. Compare "
            "tuple(param.shape) == tuple(tensor.shape) and raise ValueError naming the checkpoint tensor",
            REJECTS, {"change": "fold model.norm.weight", "match": "model.norm.weight"}),
    Mistake("ch1_load_without_completeness_check", "1.3", {"load_model": load_without_completeness_check},
            "load_model never checks that every parameter was filled: remember the shard ids each parameter "
            "received and, at the end, raise ValueError for any that lacks one of expected_shards(...)",
            REJECTS, {"change": "drop model.layers.1.mlp.up_proj.weight", "match": "missing|gate_up_proj"}),
    Mistake("ch1_load_completeness_any_shard", "1.3", {"load_model": load_completeness_any_shard},
            "load_model counts a packed parameter as filled once ANY of its tensors arrived: gate_up_proj with "
            "gate_proj but no up_proj passes. Remember the shard ids each parameter received and require all of "
            "expected_shards(name, packed_modules_mapping) (or one whole tensor, shard None)",
            REJECTS, {"change": "drop model.layers.1.mlp.up_proj.weight", "match": "missing|gate_up_proj"}),
    Mistake("ch1_load_keeps_rotary_inv_freq", "1.3", {"load_model": load_keeping_rotary_inv_freq},
            "load_model does not skip the 'rotary_emb.inv_freq' tensors that older checkpoints (Llama's) store for "
            "each layer: RoPE's inverse frequencies are computed from config.json, the model has no parameter for "
            "them. Skip every name that ends in one of IGNORED_SUFFIXES before routing it",
            SKIPS, {"name": "tiny-llama", "extra": "rotary_emb.inv_freq"}),
    Mistake("ch1_load_keeps_tied_lm_head", "1.3", {"load_model": load_keeping_tied_lm_head},
            "load_model does not skip 'lm_head.weight' when model.tie_word_embeddings: the head shares the "
            "embedding's tensor, which named_parameters() lists once, as 'model.embed_tokens.weight', so there is "
            "no 'lm_head.weight' to fill (a tied checkpoint may still store a copy of it). Skip that name when "
            "the model ties its embeddings",
            SKIPS, {"name": "tiny-qwen3-tied", "extra": "lm_head.weight"}),
    Mistake("ch1_forward_without_final_norm", "1.4", {"forward_pipeline": forward_without_final_norm},
            "the LM head gets the last layer's output directly: first hidden, _ = model.model.norm(hidden, "
            "residual) (the final norm adds the last residual, then normalizes)", FORWARD, FAST_MODEL),
    Mistake("ch1_forward_norm_without_residual", "1.4", {"forward_pipeline": forward_final_norm_without_residual},
            "the final norm gets the last layer's output without the residual stream: call "
            "model.model.norm(hidden, residual), which adds them before normalizing", FORWARD, FAST_MODEL),
    Mistake("ch1_forward_residual_restarted", "1.4", {"forward_pipeline": forward_residual_restarted},
            "every layer is called with residual=None, which restarts the residual stream: only the first "
            "layer gets None; pass each layer the residual the previous one returned", FORWARD, FAST_MODEL),
    Mistake("ch1_forward_residual_starts_as_embeddings", "1.4",
            {"forward_pipeline": forward_residual_starts_as_embeddings},
            "the first layer gets residual = the embeddings instead of None, so its input norm adds the embeddings "
            "to themselves and the residual stream starts doubled: give the first layer residual=None (it then "
            "starts the stream from hidden), and each later layer the residual the one before returned",
            FORWARD, FAST_MODEL),
    Mistake("ch1_forward_head_on_unnormed_residual", "1.4", {"forward_pipeline": forward_head_on_unnormed_residual},
            "the LM head gets the residual stream, not the normalized hidden states: the final norm returns "
            "(normed, residual), so hidden, _ = model.model.norm(hidden, residual), then model.lm_head(hidden)",
            FORWARD, FAST_MODEL),
    Mistake("ch1_forward_positions_from_arange", "1.4", {"forward_pipeline": forward_positions_from_arange},
            "the layers get torch.arange(N), not `positions`: in one prefill from position 0 the two agree, but a "
            "decode step's one token sits at position L (a later chunk of a prompt at its offset), and RoPE then "
            "rotates its query as if it were the first token while the cached keys sit at 0..L-1. Pass the "
            "`positions` you are given to every layer",
            FORWARD, FAST_MODEL),
    Mistake("ch1_forward_logits_in_fp32", "1.4", {"forward_pipeline": forward_logits_in_fp32},
            "the logits come back in fp32 (a .float() or .to(torch.float32) after the LM head) for a bf16 model: "
            "return model.lm_head(hidden) as it is, in the model's dtype, as compute_logits does; the sampler "
            "upcasts what it needs, and an fp32 copy of [N, vocab] logits (151,936 columns for Qwen3) is twice "
            "the memory", FORWARD_BF16),
    Mistake("ch1_forward_skips_the_last_layer", "1.4", {"forward_pipeline": forward_skips_the_last_layer},
            "the last decoder layer never runs (a loop over model.model.layers[:-1], or range(len(layers) - 1)): "
            "the LM head then scores hidden states one layer short. Run every layer of model.model.layers (the "
            "final norm is not among them, it is model.model.norm), then the final norm", FORWARD, FAST_MODEL),
    Mistake("ch1_forward_logits_of_the_last_position", "1.4",
            {"forward_pipeline": forward_logits_of_the_last_position},
            "returns the logits of the last position only (model.lm_head(hidden[-1:])): forward_pipeline gives "
            "logits for all N positions, [N, vocab], as transformers' forward does; picking the row to sample from "
            "is the caller's job (last_logits takes hidden[-1:] itself). Return model.lm_head(hidden)",
            FORWARD, FAST_MODEL),
    Mistake("ch1_naive_stops_at_eos", "1.5", {"greedy_generate_naive": naive_stops_at_eos},
            "the loop stops at EOS: here EOS is not special (the docstring: 'EOS is not special here'), and "
            "transformers' reference generated exactly max_new_tokens tokens past it. Leave stopping at EOS to the "
            "engine's scheduler; run all max_new_tokens steps", NAIVE, FAST_MODEL),
    Mistake("ch1_naive_never_appends", "1.5", {"greedy_generate_naive": naive_never_appends},
            "the sequence never grows: append each new token to the ids you feed the model, so the next step "
            "sees it", NAIVE, FAST_MODEL),
    Mistake("ch1_naive_returns_prompt_too", "1.5", {"greedy_generate_naive": naive_returns_prompt_too},
            "returns the prompt with the new tokens: return only the max_new_tokens generated ids "
            "(ids[len(prompt_ids):])", NAIVE, FAST_MODEL),
    Mistake("ch1_naive_counts_the_prompt", "1.5", {"greedy_generate_naive": naive_counts_the_prompt},
            "the loop stops when the whole sequence (prompt included) reaches max_new_tokens: generate exactly "
            "max_new_tokens NEW tokens, for _ in range(max_new_tokens) (or while len(ids) - len(prompt_ids) < "
            "max_new_tokens)", NAIVE, FAST_MODEL),
    Mistake("ch1_naive_one_step_short", "1.5", {"greedy_generate_naive": naive_one_step_short},
            "one token too few: every step of the naive loop, the first included, produces one new token, so run "
            "max_new_tokens steps, range(max_new_tokens)", NAIVE, FAST_MODEL),
    Mistake("ch1_naive_ties_to_highest_id", "1.5", {"greedy_generate_naive": naive_ties_to_highest_id}, TIES_HINT,
            TIES, {"exercise_id": "1.5", "function": "greedy_generate_naive"}),
    Mistake("ch1_naive_ids_as_tensors", "1.5", {"greedy_generate_naive": naive_ids_as_tensors},
            "the generated ids are 0-d tensors (logits.argmax()), not Python ints: append int(logits.argmax()), "
            "so the caller gets token ids it can decode, compare and serialize", NAIVE, FAST_MODEL),
    Mistake("ch1_cached_position_one_past", "1.6", {"greedy_generate_cached": cached_position_one_past},
            "the decode step's position is one too far: positions count from 0, so the newest token ids[-1] "
            "sits at position len(ids) - 1 (the same number as its cache slot)", CACHED, FAST_MODEL),
    Mistake("ch1_cached_context_without_newest", "1.6", {"greedy_generate_cached": cached_context_without_newest},
            "context_lens leaves out the newest token: it attends to every cached key INCLUDING its own, just "
            "stored, so context_lens = [len(ids)]", CACHED, FAST_MODEL),
    Mistake("ch1_cached_prefill_not_stored", "1.6", {"greedy_generate_cached": cached_prefill_not_stored},
            "the prefill runs without a slot mapping, so the prompt's keys and values never reach the cache: the "
            "first token comes out right, then every decode step attends to empty slots. Give the prefill "
            "prefill_batch(ids, slot_mapping=...) with slot = position for its L tokens", CACHED, FAST_MODEL),
    Mistake("ch1_cached_one_step_too_many", "1.6", {"greedy_generate_cached": cached_one_step_too_many},
            "one token too many: the prefill already produced the first new token, so run max_new_tokens - 1 "
            "decode steps", CACHED, FAST_MODEL),
    Mistake("ch1_cached_all_one_past", "1.6", {"greedy_generate_cached": cached_all_one_past},
            "the decode step puts the newest token at position and slot len(ids), as if it were not in ids yet: "
            "it is ids[-1], at position len(ids) - 1, its K/V go to slot len(ids) - 1 and context_lens is "
            "[len(ids)]; one past leaves slot len(ids) - 1 unwritten and every step attends to it", CACHED,
            FAST_MODEL),
    Mistake("ch1_cached_slot_one_past", "1.6", {"greedy_generate_cached": cached_slot_one_past},
            "the decode step stores the newest token's K/V one slot too far (len(ids), 'the next free slot'): "
            "ids[-1] is already in ids, at position len(ids) - 1, and with the identity block table its slot is "
            "its position, so slot_mapping = [len(ids) - 1]", CACHED, FAST_MODEL),
    Mistake("ch1_cached_without_zero_guard", "1.6", {"greedy_generate_cached": cached_without_zero_guard},
            "max_new_tokens=0 returns one token: the prefill produces the first new token, so when "
            "max_new_tokens < 1 return [] before running it", CACHED, FAST_MODEL),
    Mistake("ch1_cached_ties_to_highest_id", "1.6", {"greedy_generate_cached": cached_ties_to_highest_id}, TIES_HINT,
            TIES, {"exercise_id": "1.6", "function": "greedy_generate_cached"}),
    Mistake("ch1_cached_ids_as_tensors", "1.6", {"greedy_generate_cached": cached_ids_as_tensors},
            "the generated ids are 0-d tensors (logits.argmax()), not Python ints: append int(logits.argmax()), "
            "so the caller gets token ids it can decode, compare and serialize", CACHED, FAST_MODEL),
    Mistake("ch1_cached_stops_at_eos", "1.6", {"greedy_generate_cached": cached_stops_at_eos},
            "the loop stops at EOS: here EOS is not special (as in greedy_generate_naive), and transformers' "
            "reference generated exactly max_new_tokens tokens past it. Leave stopping at EOS to the engine's "
            "scheduler; run all max_new_tokens steps", CACHED, FAST_MODEL),
]
