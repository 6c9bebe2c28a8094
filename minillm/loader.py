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
import mmap
import os
import struct

import torch
from torch import nn

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def parse_safetensors_header(data: bytes | memoryview, file_size: int | None = None) -> tuple[dict, int]:
    """-> ({name: {"dtype", "shape", "data_offsets"}}, data_start). Raises ValueError on a corrupt header."""
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
    return header, 8 + n


def read_tensor(buf, info: dict, data_start: int, name: str = "") -> torch.Tensor:
    """A tensor viewing `buf` (a writable buffer, e.g. a copy-on-write mmap) as the header entry describes."""
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


def safetensors_files(path: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors files in {path!r}; minillm loads safetensors checkpoints only "
                         f"(convert .bin/.pth with transformers' save_pretrained)")
    return files


def iterate_safetensors(path: str):
    """Yield (name, tensor) over every *.safetensors file of a model folder, memory-mapped."""
    for file in safetensors_files(path):
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ValueError(f"{file}: empty file")
            # ACCESS_COPY: private copy-on-write pages, so torch gets a writable buffer without copying
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        try:
            header, start = parse_safetensors_header(memoryview(mm), size)
            for name, info in header.items():
                yield name, read_tensor(mm, info, start, name)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None


# Tensors a checkpoint may carry that the engine does not need.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(model: nn.Module, path: str) -> None:
    """Copy every checkpoint tensor into `model` through its parameter's weight_loader.

    Checkpoint names are transformers' (q_proj, k_proj, v_proj, gate_proj, up_proj, ...); the
    model's `packed_modules_mapping` routes them into packed parameters (qkv_proj, gate_up_proj)
    with a shard id. A missing, unexpected or mis-shaped tensor raises ValueError naming it.
    """
    packed = getattr(model, "packed_modules_mapping", {})
    params = dict(model.named_parameters())  # tied weights appear once, under their first name
    expected = {name: set([None]) for name in params}
    for name, param in params.items():
        for frag, (packed_frag, shard) in packed.items():
            if f".{packed_frag}." in name:
                expected[name] = {s for f, (p, s) in packed.items() if p == packed_frag}
    loaded: dict[str, set] = {name: set() for name in params}
    tied = getattr(model, "tie_word_embeddings", False)
    for ckpt_name, tensor in iterate_safetensors(path):
        if ckpt_name.endswith(IGNORED_SUFFIXES) or (tied and ckpt_name == "lm_head.weight"):
            continue
        name, shard = ckpt_name, None
        for frag, (packed_frag, shard_id) in packed.items():
            if f".{frag}." in ckpt_name:
                name, shard = ckpt_name.replace(f".{frag}.", f".{packed_frag}."), shard_id
                break
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
    missing = [n for n in params if not expected[n] <= loaded[n]]
    if missing:
        raise ValueError(f"the checkpoint at {path!r} is missing tensors for {len(missing)} parameters, "
                         f"e.g. {missing[:3]}; is it complete and made for this config.json?")
