"""Chapter 1 exercises: YOUR file. Fill in the bodies below, then grade one exercise with
    make grade EX=1.1            (or: pytest tests/exercises -m ex1_1)
(Generated from minillm/ by `make exercises`, which refuses to overwrite a file holding your code.)

Exercise 1.1: bpe_encode  (notebooks/01_vocab_weights_runtime.ipynb, section '3. Byte-level BPE, step by step')
Exercise 1.2: parse_safetensors_header, read_tensor  (notebooks/01_vocab_weights_runtime.ipynb, section '5. The weights: a safetensors file')
Exercise 1.3: checkpoint_param_name, load_model  (notebooks/01_vocab_weights_runtime.ipynb, section '7. Packed parameters')
Exercise 1.4: forward_pipeline  (notebooks/01_vocab_weights_runtime.ipynb, section '8. The runtime: the forward pipeline')
Exercise 1.5: greedy_generate_naive  (notebooks/01_vocab_weights_runtime.ipynb, section '9. A generate loop without a cache')
Exercise 1.6: greedy_generate_cached  (notebooks/01_vocab_weights_runtime.ipynb, section '10. A KV cache')
"""
from __future__ import annotations

import json
import numpy as np
import regex
import struct
import torch
from minillm.course.runtime_v0 import last_logits
from minillm.course.runtime_v0 import prefill_batch
from minillm.engine.model_runner import Batch
from minillm.engine.model_runner import ModelRunner
from minillm.loader import IGNORED_SUFFIXES
from minillm.loader import SAFETENSORS_DTYPES
from minillm.loader import expected_shards
from minillm.loader import iterate_safetensors
from torch import nn


# ---- Exercise 1.1 (notebooks/01_vocab_weights_runtime.ipynb, section '3. Byte-level BPE, step by step'), from minillm.tokenizer ----
def bpe_encode(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Byte-level BPE of one pre-tokenized piece, exactly as tiktoken does it.

    piece: the UTF-8 bytes of one regex piece (e.g. b" world"); ranks: token bytes -> token id,
    where a lower id means the merge was learned earlier (tiktoken's "mergeable ranks"; every
    single byte is a token). -> the token ids of the final parts, in order ([] for b"").
    The ids depend on both arguments: the notebook replays a piece with a few merges, then all.
    Start from single bytes; repeatedly find the adjacent pair whose concatenation has the lowest
    rank and merge it into one part; stop when no adjacent pair is in `ranks`.
    Hints: piece[i:i + 1] is a bytes object of length 1 (piece[i] is an int); when the same pair
    occurs twice, merge the leftmost first.
    """
    raise NotImplementedError("Exercise 1.1: implement bpe_encode in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '3. Byte-level BPE, step by step')")


# exercise: given
def bpe_tokenize(text: str, ranks: dict[bytes, int], pattern: str, special: dict[str, int]) -> list[int]:
    """text -> token ids: split out special tokens, pre-tokenize each stretch with the regex
    `pattern`, BPE each piece (special: token text -> id, e.g. {"<|im_end|>": 151645})."""
    ids: list[int] = []
    splitter = "(" + "|".join(regex.escape(s) for s in sorted(special, key=len, reverse=True)) + ")" if special else None
    chunks = regex.split(splitter, text) if splitter else [text]
    for chunk in chunks:
        if chunk in special:
            ids.append(special[chunk])
            continue
        for piece in regex.findall(pattern, chunk):
            ids.extend(bpe_encode(piece.encode("utf-8"), ranks))
    return ids


# ---- Exercise 1.2 (notebooks/01_vocab_weights_runtime.ipynb, section '5. The weights: a safetensors file'), from minillm.loader ----
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
    raise NotImplementedError("Exercise 1.2: implement parse_safetensors_header in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '5. The weights: a safetensors file')")


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
    raise NotImplementedError("Exercise 1.2: implement read_tensor in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '5. The weights: a safetensors file')")


# ---- Exercise 1.3 (notebooks/01_vocab_weights_runtime.ipynb, section '7. Packed parameters'), from minillm.loader ----
def checkpoint_param_name(ckpt_name: str, packed_modules_mapping: dict) -> tuple[str, str | int | None]:
    """Where one checkpoint tensor goes in the engine's model: (parameter name, shard id).

    packed_modules_mapping: {checkpoint fragment: (packed fragment, shard id)}, e.g.
    {"q_proj": ("qkv_proj", "q"), ..., "up_proj": ("gate_up_proj", 1)} (Qwen3ForCausalLM's).
    A name holding one of the fragments as a whole dotted component is renamed to the packed
    parameter and returns its shard id; any other name is unchanged with shard id None.
    e.g. "model.layers.3.mlp.up_proj.weight" -> ("model.layers.3.mlp.gate_up_proj.weight", 1).
    Hints: match ".up_proj." with the dots, so "up_proj" never matches inside another word.
    """
    raise NotImplementedError("Exercise 1.3: implement checkpoint_param_name in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '7. Packed parameters')")


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
    raise NotImplementedError("Exercise 1.3: implement load_model in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '7. Packed parameters')")


# ---- Exercise 1.4 (notebooks/01_vocab_weights_runtime.ipynb, section '8. The runtime: the forward pipeline'), from minillm.course.runtime_v0 ----
def forward_pipeline(model, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The whole forward of a decoder-only model, written out.

    model: the engine's Qwen3ForCausalLM (model.model.embed_tokens, model.model.layers,
    model.model.norm, model.lm_head); input_ids, positions: [N] int64 on the model's device.
    -> logits [N, vocab] in the model's dtype.
    Each decoder layer is called as layer(positions, hidden, residual) -> (hidden, residual); the
    first layer gets residual=None. The final norm is called as norm(hidden, residual) and returns
    (normed, residual): it adds the last layer's output to the residual stream before normalizing.
    The caller has set the attention context (runner.load_batch) the layers read.
    Hints: four steps, one loop; compare with Qwen3Model.forward and compute_logits.
    """
    raise NotImplementedError("Exercise 1.4: implement forward_pipeline in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '8. The runtime: the forward pipeline')")


# ---- Exercise 1.5 (notebooks/01_vocab_weights_runtime.ipynb, section '9. A generate loop without a cache'), from minillm.course.runtime_v0 ----
def greedy_generate_naive(runner: ModelRunner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding that recomputes everything: each step runs the model over the WHOLE sequence so
    far (prompt + tokens generated until now) and appends the argmax of the last position's logits.

    runner: from one_sequence_runner; prompt_ids: the prompt's token ids.
    -> the max_new_tokens generated ids (EOS is not special here).
    Hints: prefill_batch(ids) builds one step with no cache (slot_mapping None);
    last_logits(runner, batch) runs it; int(logits.argmax()).
    """
    raise NotImplementedError("Exercise 1.5: implement greedy_generate_naive in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '9. A generate loop without a cache')")


# ---- Exercise 1.6 (notebooks/01_vocab_weights_runtime.ipynb, section '10. A KV cache'), from minillm.course.runtime_v0 ----
def greedy_generate_cached(runner: ModelRunner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding with a contiguous KV cache: the same computation as greedy_generate_naive (in
    fp32, the same tokens), but each token's keys and values are computed once. In bf16 on a GPU the
    two loops run different kernels, which round differently, so a near-tie between the two best
    candidates can go either way and the texts part there (notebook 01, section 11 shows where).

    Prefill: run the L prompt tokens once, storing their K/V in cache slots 0..L-1; its last logits
    give the first new token. Decode: run ONLY the newest token, at position n - 1 (n = tokens so
    far), storing its K/V in slot n - 1, attending to all n cached keys; repeat until
    max_new_tokens tokens exist. The cache is the runner's paged cache used contiguously: the
    identity block table [0, 1, ..., runner.num_kvcache_blocks - 1], so slot = position.
    runner: from one_sequence_runner (prompt + new tokens must fit in its max_model_len).
    -> the max_new_tokens generated ids ([] for max_new_tokens 0, without running the model).
    Hints: prefill_batch(ids, slot_mapping=...); a decode step is a Batch(is_prefill=False, ...)
    with input_ids, positions, slot_mapping of length 1, context_lens [n] (int32) and
    block_tables [1, num_blocks] (int32); see Batch in minillm/engine/model_runner.py.
    """
    raise NotImplementedError("Exercise 1.6: implement greedy_generate_cached in exercises/ch1.py (see notebooks/01_vocab_weights_runtime.ipynb, section '10. A KV cache')")
