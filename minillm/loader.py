"""Checkpoint loading: safetensors files, memory-mapped, read with no library.

A .safetensors file is
    8 bytes      little-endian u64 N: the header's length
    N bytes      JSON {name: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
    the rest     raw tensor bytes; offsets count from the end of the header
Mapping the file gives tensors that are views of the page cache: nothing is read until it is
touched, and nothing is ever unpickled.
"""
from __future__ import annotations

import glob
import json
import math
import mmap
import os
import struct

import torch
from torch import nn

from minillm.config import check_regular_file, read_json_object

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


# >>> exercise 1.2 | notebooks/01_vocab_weights_runtime.ipynb | 5. The weights: a safetensors file
def parse_safetensors_header(data: bytes | memoryview, file_size: int | None = None) -> tuple[dict, int]:
    """Read the header of a .safetensors file held in `data` (bytes, a memoryview of an mmap, ...).

    Layout: 8 bytes little-endian unsigned N, then N bytes of UTF-8 JSON
    {name: {"dtype": "BF16", "shape": [2, 3], "data_offsets": [begin, end]}, "__metadata__": {...}},
    then the tensor bytes; data_offsets count from the first byte after the header.
    file_size: the file's length when `data` is a view that may be longer (default len(data)).
    -> ({name: entry} without "__metadata__", data_start = 8 + N).
    Raises ValueError (saying what is wrong) when the file is shorter than 8 bytes, N runs past the
    end of the file, the JSON is invalid or not an object, or an entry is not a dict with a string
    dtype, a shape of ints >= 0 and data_offsets [begin, end] with 0 <= begin <= end.
    Hints: struct.unpack("<Q", ...); json.loads accepts bytes (and the trailing spaces that pad the
    header to a multiple of 8).
    """
    file_size = len(data) if file_size is None else file_size
    if file_size < 8:
        raise ValueError(f"file is {file_size} bytes: too short for a safetensors header")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > file_size - 8:
        raise ValueError(f"header claims {n} bytes but the file has only {file_size - 8} after the length")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    for name, info in header.items():
        ok = isinstance(info, dict) and isinstance(info.get("dtype"), str)
        shape, offsets = (info.get("shape"), info.get("data_offsets")) if ok else (None, None)
        ok = ok and isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)
        ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
        if not ok or not 0 <= offsets[0] <= offsets[1]:
            raise ValueError(f"header entry {name!r} is malformed: {info!r}")
    return header, 8 + n


def read_tensor(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """The tensor a header entry describes, as a view of `buf` (no copy).

    buf: the whole file as a writable buffer (a copy-on-write mmap, a bytearray); info: one header
    entry {"dtype", "shape", "data_offsets"}; data_start: from parse_safetensors_header.
    -> a tensor of SAFETENSORS_DTYPES[dtype] and the entry's shape (a 0-d tensor for shape []),
    sharing memory with buf (an empty tensor when it has no elements).
    Raises ValueError (naming the tensor) for an unknown dtype, or offsets whose length is not
    numel * itemsize or that run past the end of buf.
    Hints: torch.frombuffer(buf, dtype=..., count=..., offset=...) then .view(shape); frombuffer
    refuses count=0.
    """
    if info.get("dtype") not in SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {name!r}: unsupported dtype {info.get('dtype')!r}")
    dtype = SAFETENSORS_DTYPES[info["dtype"]]
    shape, (begin, end) = info["shape"], info["data_offsets"]
    numel = 1
    for s in shape:
        numel *= s
    if end - begin != numel * dtype.itemsize or begin < 0 or data_start + end > len(buf):
        raise ValueError(f"tensor {name!r}: offsets {begin}..{end} do not fit its shape {shape} {info['dtype']} "
                         f"inside the file (truncated or corrupt?)")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=numel, offset=data_start + begin).view(shape)
# <<< exercise 1.2


# The safetensors library refuses headers larger than this (a guard against absurd allocations).
MAX_HEADER_BYTES = 100_000_000
# Model weights are floating point: an integer dtype is a relabelled (corrupt) tensor.
WEIGHT_DTYPES = ("F64", "F32", "F16", "BF16")


def check_safetensors_header(header: dict, data_start: int, file_size: int) -> None:
    """The checks the safetensors library makes beyond parse_safetensors_header's, so a corrupt file
    is refused as it would be there: every dtype is known; each tensor's byte length is its dtype's
    size times its element count; and the tensors tile the data section exactly: in offset order each
    begins where the one before ends (no overlap, no gap), the first at 0, the last at the file's end.
    header, data_start: from parse_safetensors_header. Raises ValueError naming the tensor."""
    end_so_far = 0
    for name, info in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r} (minillm reads "
                             f"{', '.join(SAFETENSORS_DTYPES)})")
        if begin != end_so_far:
            where = ("overlaps the tensor before it" if begin < end_so_far
                     else f"leaves {begin - end_so_far} bytes before it that no tensor owns")
            raise ValueError(f"tensor {name!r}: invalid offsets {begin}..{end}: it {where}")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype].itemsize
        if end - begin != nbytes:
            raise ValueError(f"tensor {name!r}: a {dtype} tensor of shape {shape} has {nbytes} bytes but its "
                             f"offsets {begin}..{end} hold {end - begin}")
        end_so_far = end
    if data_start + end_so_far != file_size:
        raise ValueError(f"the tensors end at byte {data_start + end_so_far} but the file has {file_size} bytes "
                         f"(truncated, or bytes that no tensor owns)")


INDEX_FILE = "model.safetensors.index.json"  # a sharded checkpoint's map: tensor name -> file


def indexed_files(path: str) -> list[str] | None:
    """The files model.safetensors.index.json names (its weight_map's values), or None without an index:
    with one, only those are read, as transformers does (a stray consolidated.safetensors beside the
    shards is not part of the checkpoint)."""
    index = os.path.join(path, INDEX_FILE)
    if not os.path.lexists(index):
        return None
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(f, str) and f.endswith(".safetensors") and os.path.basename(f) == f
            for f in weight_map.values()):
        raise ValueError(f"{index}: weight_map must map tensor names to *.safetensors file names in this folder")
    files = [os.path.join(path, f) for f in sorted(set(weight_map.values()))]
    missing = [os.path.basename(f) for f in files if not os.path.lexists(f)]
    if missing:
        raise ValueError(f"{index} names {missing[:3]}, which this folder lacks: copy every shard of the checkpoint")
    return files


def safetensors_files(path: str) -> list[str]:
    """The *.safetensors files of a model folder (those its index names, when it has one), each
    checked to be a regular file."""
    files = indexed_files(path)
    if files is None:
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors files in {path!r}; minillm loads safetensors checkpoints only "
                         f"(convert .bin/.pth with transformers' save_pretrained)")
    for file in files:
        check_regular_file(file)  # a folder, a dangling link or a FIFO named *.safetensors
    return files


def iterate_safetensors(path: str):
    """Yield (name, tensor) over every *.safetensors file of a model folder, memory-mapped, after checking
    each file's header as the safetensors library does (check_safetensors_header)."""
    for file in safetensors_files(path):
        try:
            with open(file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise ValueError("empty file")
                if size >= 8 and struct.unpack("<Q", f.read(8))[0] > MAX_HEADER_BYTES:
                    raise ValueError(f"the header claims more than {MAX_HEADER_BYTES} bytes (corrupt?)")
                # ACCESS_COPY: private copy-on-write pages, so torch gets a writable buffer without copying
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            header, start = parse_safetensors_header(memoryview(mm), size)
            check_safetensors_header(header, start, size)
            for name, info in header.items():
                if info["dtype"] not in WEIGHT_DTYPES:
                    raise ValueError(f"tensor {name!r} has dtype {info['dtype']}; model weights are floating "
                                     f"point ({', '.join(WEIGHT_DTYPES)})")
                yield name, read_tensor(mm, info, start, name)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None
        except OSError as e:
            raise ValueError(f"{file} cannot be read: {e.strerror or e}") from None


# Tensors a checkpoint may carry that the engine does not need.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expected_shards(param_name: str, packed_modules_mapping: dict) -> set:
    """The shard ids that must all arrive for one parameter: {"q", "k", "v"} for a qkv_proj,
    {0, 1} for a gate_up_proj, {None} (one whole tensor) for any other."""
    for packed_frag, _ in packed_modules_mapping.values():
        if f".{packed_frag}." in param_name:
            return {s for p, s in packed_modules_mapping.values() if p == packed_frag}
    return {None}


# >>> exercise 1.3 | notebooks/01_vocab_weights_runtime.ipynb | 7. Packed parameters
def checkpoint_param_name(ckpt_name: str, packed_modules_mapping: dict) -> tuple[str, str | int | None]:
    """Where one checkpoint tensor goes in the engine's model: (parameter name, shard id).

    packed_modules_mapping: {checkpoint fragment: (packed fragment, shard id)}, e.g.
    {"q_proj": ("qkv_proj", "q"), ..., "up_proj": ("gate_up_proj", 1)} (Qwen3ForCausalLM's).
    A name holding one of the fragments as a whole dotted component is renamed to the packed
    parameter and returns its shard id; any other name is unchanged with shard id None.
    e.g. "model.layers.3.mlp.up_proj.weight" -> ("model.layers.3.mlp.gate_up_proj.weight", 1).
    Hints: match ".up_proj." with the dots, so "up_proj" never matches inside another word.
    """
    for frag, (packed_frag, shard_id) in packed_modules_mapping.items():
        if f".{frag}." in ckpt_name:
            return ckpt_name.replace(f".{frag}.", f".{packed_frag}."), shard_id
    return ckpt_name, None


def load_model(model: nn.Module, path: str) -> None:
    """Copy every tensor of the checkpoint folder `path` into `model`'s parameters.

    Names are transformers' (q_proj, k_proj, v_proj, gate_proj, up_proj, ...); the model packs some
    of them (model.packed_modules_mapping) and each packed parameter has a `weight_loader(param,
    tensor, shard_id, name=...)` that copies one shard into its rows (and cuts this rank's slice
    under tensor parallelism). For each (name, tensor) of iterate_safetensors(path):
      - skip names ending in IGNORED_SUFFIXES, and "lm_head.weight" when model.tie_word_embeddings
        (the head then shares the embedding, which named_parameters() lists once);
      - route it with checkpoint_param_name; a name the model lacks -> ValueError naming it;
      - call the parameter's weight_loader, or, when it has none, copy after checking the shape
        (a mismatch -> ValueError naming the checkpoint tensor); do it under torch.no_grad().
    At the end every parameter must have received all its expected_shards(...) (or one whole
    tensor, shard None); otherwise -> ValueError saying which are missing.
    Hints: dict(model.named_parameters()); remember the shard ids each parameter received in a set.
    """
    packed = getattr(model, "packed_modules_mapping", {})
    params = dict(model.named_parameters())  # tied weights appear once, under their first name
    tied = getattr(model, "tie_word_embeddings", False)
    loaded: dict[str, set] = {name: set() for name in params}
    for ckpt_name, tensor in iterate_safetensors(path):
        if ckpt_name.endswith(IGNORED_SUFFIXES) or (tied and ckpt_name == "lm_head.weight"):
            continue
        name, shard = checkpoint_param_name(ckpt_name, packed)
        if name not in params:
            raise ValueError(f"unexpected tensor {ckpt_name!r} in the checkpoint at {path!r}: the model built "
                             f"from its config.json has no such parameter")
        param = params[name]
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            if loader is None:
                if tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(f"{ckpt_name}: checkpoint has shape {tuple(tensor.shape)}, parameter "
                                     f"expects {tuple(param.shape)}")
                param.data.copy_(tensor)
            else:
                loader(param, tensor, shard, name=ckpt_name)
        loaded[name].add(shard)
    missing = [n for n in params if None not in loaded[n] and not expected_shards(n, packed) <= loaded[n]]
    if missing:
        raise ValueError(f"the checkpoint at {path!r} is missing tensors for {len(missing)} "
                         f"parameter{'s' if len(missing) != 1 else ''}, "
                         f"e.g. {missing[:3]}; is it complete and made for this config.json?")
# <<< exercise 1.3
