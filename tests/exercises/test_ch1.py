"""Chapter 1 graded tests: vocabulary, weights, runtime.

References nobody here wrote: tiktoken on the real Qwen vocabulary (stored in references/ch1 and
run live), the safetensors package, the checkpoints transformers wrote (tests/references/tiny-*),
transformers' logits and its `generate` tokens (references/greedy_tokens.json).

    pytest tests/exercises -m ex1_1 --impl=exercises
"""
import copy
import functools
import json
import numbers
import os
import random
import struct
import types

import numpy as np
import pytest
import torch

from helpers import TINY_MODELS, greedy_reference, ref_path
from minillm.config import ModelConfig
from minillm.context import reset_context
from minillm.course.exercises import load_impl, use_impl
from minillm.course.grading import Raised, check_close, check_equal, check_that, require_written
from minillm.course.runtime_v0 import last_logits, one_sequence_runner, prefill_batch
from minillm.engine.model_runner import Batch
from minillm.model_zoo import QWEN_PATTERN, QWEN_SPECIAL, qwen_tiktoken_file
from minillm.models.qwen3 import Qwen3ForCausalLM

from mistakes import call_pure, suspects, suspects_of, then, wrong_versions
from properties import outcome
from mistakes_ch1 import BYTES_NOT_INTS, RANKS_IGNORED

CH1 = ref_path("ch1")


# ---- 1.1 byte-level BPE ------------------------------------------------------------------------
# Loaded once per session by plain functions, not fixtures, so tests/test_diagnosis.py can call the tests.
@functools.cache
def _ranks() -> dict[bytes, int]:
    from tiktoken.load import load_tiktoken_bpe
    return load_tiktoken_bpe(qwen_tiktoken_file())


@functools.cache
def _bpe_ref() -> dict:
    with open(f"{CH1}/qwen_bpe.json") as f:
        return json.load(f)


SPECIAL = {t: 151643 + i for i, t in enumerate(QWEN_SPECIAL)}


def _bpe_encode(impl, data: bytes, ranks: dict[bytes, int]) -> list[int]:
    """impl.bpe_encode(data, ranks); a lookup of an int key is the classic slip, told as such."""
    try:
        return impl.bpe_encode(data, ranks)
    except KeyError as e:
        if not (e.args and isinstance(e.args[0], int)):
            raise
        raise AssertionError(
            f"Exercise 1.1 (bpe_encode): bpe_encode({bytes(data)!r}) looked up ranks[{e.args[0]!r}], an int: "
            f"{BYTES_NOT_INTS}") from e



@pytest.mark.ex1_1
def test_bpe_encode_pieces_match_tiktoken(impl):
    """Every stored piece, against tiktoken. A known wrong version is named only when it gives the
    student's ids on EVERY piece: two bugs can agree on one piece (merging the leftmost pair and
    merging the highest rank both turn " aaaa" into [83465, 64])."""
    ranks = _ranks()
    pieces = [(piece, piece.encode("utf-8"), want) for piece, want in _bpe_ref()["pieces"]]
    got = [_bpe_encode(impl, data, ranks) for _, data, _ in pieces]

    def everywhere_like_yours(fn, data):
        """fn's ids for data, if fn gives your ids on every piece (else it is not your bug)."""
        if [fn(d, ranks) for _, d, _ in pieces] != got:
            raise LookupError("this wrong version differs from yours on another piece")
        return fn(data, ranks)

    for (piece, data, want), ids in zip(pieces, got):
        check_equal(ids, want, "1.1", f"bpe_encode({piece!r})",
                    suspects={hint: (lambda fn=fn, data=data: everywhere_like_yours(fn, data))
                              for hint, fn in wrong_versions("bpe_encode").items()})


@pytest.mark.ex1_1
def test_bpe_tokenize_texts_match_tiktoken(impl):
    ranks = _ranks()
    for text, want in zip(_bpe_ref()["texts"], _bpe_ref()["ids"]):
        check_equal(impl.bpe_tokenize(text, ranks, QWEN_PATTERN, SPECIAL), want, "1.1", f"bpe_tokenize({text!r})")


@pytest.mark.ex1_1
def test_bpe_random_text_matches_live_tiktoken(impl):
    import tiktoken
    ranks = _ranks()
    enc = tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=SPECIAL)
    rng = random.Random(0)
    alphabet = "aaaaeeeiioouu tttnnsrhl  \n\t.,;!?'\"0123456789-_()[]{}éüñß中文字日本語🙂🚀€$"
    for _ in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        check_equal(impl.bpe_tokenize(text, ranks, QWEN_PATTERN, {}), enc.encode_ordinary(text), "1.1",
                    f"token ids of {text!r}")
    try:
        empty = impl.bpe_encode(b"", ranks)
    except KeyError as e:
        raise AssertionError(f"Exercise 1.1 (bpe_encode): bpe_encode(b'') raised KeyError({e.args[0]!r}): an empty "
                             f"piece has no parts, so it must give [] (the docstring's last case)") from e
    check_equal(empty, [], "1.1", "bpe_encode(b'')")


@pytest.mark.ex1_1
def test_bpe_encode_uses_the_ranks_it_is_given(impl):
    """One piece under all of Qwen's ranks (tiktoken's ids), then under its single bytes only (no merge
    exists: one id a byte), then all again, as the notebook's merge replay calls it: the ids depend on
    `ranks` too, so a cache keyed by the piece alone returns the first call's ids to the second."""
    import tiktoken
    ranks = _ranks()
    piece = " tokenization"
    single = {bytes([b]): ranks[bytes([b])] for b in piece.encode("utf-8")}
    enc = tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=SPECIAL)
    runs = [(ranks, "all of Qwen's ranks", enc.encode_ordinary(piece)),
            (single, "its single bytes' ranks only", [single[bytes([b])] for b in piece.encode("utf-8")]),
            (ranks, "all of Qwen's ranks again", enc.encode_ordinary(piece))]
    got = [_bpe_encode(impl, piece.encode("utf-8"), r) for r, _, _ in runs]
    for ids, (_, which, want), before in zip(got, runs, [None, *got]):
        check_that(RANKS_IGNORED if ids != want and ids == before else None, "1.1",
                   f"bpe_encode({piece!r}) under {which}: {ids}, the ids of the call before; want {want}")
        check_equal(ids, want, "1.1", f"bpe_encode({piece!r}) under {which}")



# ---- 1.2 safetensors ---------------------------------------------------------------------------
def _read_all(impl, data: bytes) -> dict:
    header, start = impl.parse_safetensors_header(data)
    buf = bytearray(data)
    return {name: impl.read_tensor(buf, info, start, name) for name, info in header.items()}


def _written_by_safetensors(tmp_path) -> list[bytes]:
    from safetensors.torch import save_file
    stored = open(f"{CH1}/sample.safetensors", "rb").read()
    g = torch.Generator().manual_seed(1)
    live = {"w": torch.randn(33, 17, generator=g).to(torch.bfloat16), "zero_d": torch.tensor(1.0, dtype=torch.float16),
            "empty": torch.empty(4, 0, 2), "flags": torch.rand(3, generator=g) > 0.5,
            "ids": torch.randint(0, 1000, (2, 2, 2), generator=g)}
    save_file(live, tmp_path / "live.safetensors")
    return [stored, (tmp_path / "live.safetensors").read_bytes(), *_all_header_files()]


def _all_header_files() -> list[bytes]:
    """Valid files with no tensor bytes: the header runs to the last byte (N = file size - 8)."""
    from safetensors.torch import save
    return [save({}), save({"empty": torch.empty(4, 0, dtype=torch.float16)})]


def _header_outcome(parse, data: bytes):
    """(tensor names, data_start) that parse gives for data, or 'ValueError' when it refuses the file."""
    def run():
        try:
            header, start = parse(data)
        except ValueError:
            return "ValueError"
        return sorted(header), start
    return outcome(run)


@pytest.mark.ex1_2
def test_header_of_a_file_that_is_all_header(impl):
    """safetensors writes a file whose tensors hold no bytes (or that holds none) as its header alone."""
    from safetensors.torch import load, save
    # a second look before a bug is named: the outcome on a file with tensor bytes too, and an empty tensor among
    # them (a length read big-endian refuses it, as it refuses these, and so does a check that refuses empty
    # tensors; a check that refuses only a header ending the file reads it)
    ordinary = save({"w": torch.arange(6.0).reshape(2, 3), "none": torch.zeros(0)})
    agree = (lambda fn: _header_outcome(fn, ordinary), lambda: _header_outcome(impl.parse_safetensors_header, ordinary))
    for data in _all_header_files():
        (n,) = struct.unpack("<Q", data[:8])
        check_equal(_header_outcome(impl.parse_safetensors_header, data), (sorted(load(data)), len(data)), "1.2",
                    f"(tensor names, data_start) of a {len(data)}-byte file that is all header (N = {n} = its size "
                    f"- 8, as safetensors writes {sorted(load(data)) or 'no tensor'})",
                    suspects=suspects_of("parse_safetensors_header", lambda fn, data=data: _header_outcome(fn, data),
                                         agree=agree))


@pytest.mark.ex1_2
def test_header_matches_safetensors(impl, tmp_path):
    from safetensors import safe_open
    for i, data in enumerate(_written_by_safetensors(tmp_path)):
        (tmp_path / f"f{i}.safetensors").write_bytes(data)
        header, start = impl.parse_safetensors_header(data)
        suspected = suspects("parse_safetensors_header", data)
        with safe_open(tmp_path / f"f{i}.safetensors", "pt") as f:
            check_equal(sorted(header), sorted(f.keys()), "1.2", "tensor names (without __metadata__)",
                        suspects=then(suspected, lambda out: sorted(out[0])))
            for name in f.keys():
                s = f.get_slice(name)
                check_equal((header[name]["dtype"], header[name]["shape"]), (s.get_dtype(), s.get_shape()),
                            "1.2", f"dtype and shape of {name!r}")
        (n,) = struct.unpack("<Q", data[:8])
        check_equal(start, 8 + n, "1.2", "data_start", suspects=then(suspected, lambda out: out[1]))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


@pytest.mark.ex1_2
def test_read_tensor_matches_safetensors(impl, tmp_path):
    from safetensors.torch import load
    for data in _written_by_safetensors(tmp_path):
        want = load(data)
        header, start = impl.parse_safetensors_header(data)
        buf = bytearray(data)
        got = {name: impl.read_tensor(buf, info, start, name) for name, info in header.items()}
        check_equal(sorted(got), sorted(want), "1.2", "tensor names")
        for name, w in want.items():
            g = got[name]
            check_equal((type(g), getattr(g, "dtype", None), tuple(getattr(g, "shape", ()))),
                        (torch.Tensor, w.dtype, tuple(w.shape)), "1.2", f"type, dtype and shape of {name!r}")
            check_equal(_bytes(g), _bytes(w), "1.2", f"bytes of {name!r}",
                        suspects=then(suspects("read_tensor", buf, header[name], start, name), _bytes))


@pytest.mark.ex1_2
def test_read_tensor_is_a_view_not_a_copy(impl):
    from safetensors.torch import load
    name = "model.norm.weight"
    data = open(f"{CH1}/sample.safetensors", "rb").read()
    header, start = impl.parse_safetensors_header(data)
    buf = bytearray(data)
    info = header[name]
    t = impl.read_tensor(buf, info, start, name)
    # suspects read a fresh copy of the file, as it was before the change below
    suspected = suspects("read_tensor", bytearray(data), info, start, name)
    check_equal(t, load(data)[name], "1.2", f"{name} as read (before any change to the buffer)", suspects=suspected)
    buf[start + info["data_offsets"][0]:start + info["data_offsets"][0] + 4] = struct.pack("<f", 42.0)
    check_equal(float(t[0]), 42.0, "1.2", "the tensor after its bytes in the buffer changed (a view "
                                          "of the buffer, as mmap loading needs, not a copy)",
                suspects=then(suspected, lambda out: float(out[0])))


def _good_file() -> bytes:
    from safetensors.torch import save
    return save({"alpha": torch.arange(6, dtype=torch.float32).reshape(2, 3), "beta": torch.ones(4, dtype=torch.int16)})


def _corrupt_cases() -> dict[str, bytes]:
    good = _good_file()
    (n,) = struct.unpack("<Q", good[:8])
    hdr, body = json.loads(good[8:8 + n]), good[8 + n:]
    meta = json.dumps({"__metadata__": {"format": "pt"}}).encode()

    def with_header(change):
        h = copy.deepcopy(hdr)
        change(h)
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + body

    return {
        "empty file": b"",
        "shorter than 8 bytes": good[:5],
        "header length past the end": struct.pack("<Q", 10 ** 6) + good[8:],
        "header not JSON": struct.pack("<Q", 9) + b"{not json" + body,
        "header a JSON array": with_header(lambda h: h.clear()).replace(b"{}", b"[]"),
        "truncated data": good[:-3],
        "offsets do not match the shape": with_header(lambda h: h["alpha"].update(data_offsets=[0, 20])),
        "unknown dtype": with_header(lambda h: h["alpha"].update(dtype="F17")),
        "begin after end": with_header(lambda h: h["alpha"].update(data_offsets=[24, 0])),
        "shape not a list": with_header(lambda h: h["alpha"].update(shape="2x3")),
        "negative dimension": with_header(lambda h: h["alpha"].update(shape=[2, -3])),
        # two negative dimensions: their product is the right element count, so only the shape check catches it
        "two negative dimensions": with_header(lambda h: h["alpha"].update(shape=[-2, -3])),
        "tensor past the end": with_header(lambda h: h["beta"].update(shape=[8], data_offsets=[24, 40])),
        "offsets longer than the shape": with_header(lambda h: h["alpha"].update(data_offsets=[0, 28])),
        "an empty tensor whose offsets hold bytes": with_header(
            lambda h: h.update(gamma={"dtype": "F16", "shape": [4, 0], "data_offsets": [0, 8]})),
        "missing data_offsets": with_header(lambda h: h["alpha"].pop("data_offsets")),
        "entry not an object": with_header(lambda h: h.update(c=5)),
        # the whole header is valid JSON and names no tensor, but N claims 8 bytes more than the file holds:
        # only the length check can tell
        "header length past the end of a file that is all header": struct.pack("<Q", len(meta) + 8) + meta,
    }


def _named_by_read_tensor() -> dict[str, str]:
    """The corrupt cases read_tensor must refuse (the header is well formed), and the tensor its ValueError
    must name: the one whose bytes the file lacks, or whose dtype or offsets are wrong."""
    good = _good_file()
    (n,) = struct.unpack("<Q", good[:8])
    last = max(json.loads(good[8:8 + n]).items(), key=lambda kv: kv[1]["data_offsets"][1] if kv[0] != "__metadata__"
               else -1)[0]
    return {"truncated data": last, "offsets do not match the shape": "alpha", "unknown dtype": "alpha",
            "tensor past the end": "beta", "offsets longer than the shape": "alpha",
            "an empty tensor whose offsets hold bytes": "gamma"}


def _corrupt_outcome(impl, data: bytes, case: str | None = None) -> str:
    """What reading a corrupt file does, in words: a ValueError (one that names the tensor, for the cases
    read_tensor must catch), another exception, or no error."""
    try:
        _read_all(impl, data)
    except NotImplementedError:
        raise
    except ValueError as e:
        name = _named_by_read_tensor().get(case)
        if name is not None and repr(name) not in str(e) and name not in str(e).split():
            return f"a ValueError that does not name the tensor {name!r} ({e})"
        return "ValueError"
    except Exception as e:  # noqa: BLE001 -- the wrong error is the outcome to grade (and its line to show)
        return Raised(e)
    return "read without a ValueError"


@pytest.mark.ex1_2
def test_header_length_is_checked_against_file_size(impl):
    """data may be a view longer than the file (an mmap rounded up to a page): file_size says where the
    file ends, and a header that runs past it is refused even though data holds the bytes."""
    good = _good_file()
    (n,) = struct.unpack("<Q", good[:8])
    try:
        impl.parse_safetensors_header(good, file_size=8 + n - 1)
        got = "no error"
    except ValueError:
        got = "ValueError"
    check_equal(got, "ValueError", "1.2", f"parse_safetensors_header(data of {len(good)} bytes, file_size={8 + n - 1}) "
                f"with a {n}-byte header: the header runs past file_size")


@pytest.mark.ex1_2
@pytest.mark.parametrize("case", list(_corrupt_cases()))
def test_corrupt_file_raises_value_error(impl, case):
    """A known wrong version is named only when it does what yours does with EVERY corrupt file: a missing
    check shows on one case, and several wrong versions read that one file without an error."""
    from safetensors.torch import load
    cases = _corrupt_cases()
    with pytest.raises(Exception):  # the reference agrees the file is corrupt
        load(cases[case])
    got = _corrupt_outcome(impl, cases[case], case)
    if got == "ValueError":
        return
    yours = functools.cache(lambda: {c: _corrupt_outcome(impl, d, c) for c, d in cases.items()})

    def everywhere_like_yours(function, wrong):
        """The wrong version's outcome on this file, if it has yours on every corrupt file, and has it on this
        one beside minillm's own other function too (a bug these files cannot show is not the one here)."""
        alone = types.SimpleNamespace(**{**vars(load_impl("ref")), function: wrong})
        if _corrupt_outcome(alone, cases[case], case) != got:
            raise LookupError("this wrong version does not do this with this file")
        swapped = types.SimpleNamespace(**{**vars(impl), function: wrong})
        outcomes = {c: _corrupt_outcome(swapped, d, c) for c, d in cases.items()}
        if outcomes != yours():
            raise LookupError("this wrong version differs from yours on another corrupt file")
        return outcomes[case]

    named = _named_by_read_tensor().get(case)
    check_equal(got, "ValueError", "1.2", f"what reading a corrupt file ({case}) does (it should raise ValueError "
                                          f"saying what is wrong{f', naming the tensor {named!r}' if named else ''})",
                suspects={hint: (lambda f=f, w=w: everywhere_like_yours(f, w))
                          for f in ("parse_safetensors_header", "read_tensor")
                          for hint, w in wrong_versions(f).items()})


# ---- 1.3 packed parameters ---------------------------------------------------------------------
PACKED = Qwen3ForCausalLM.packed_modules_mapping


@pytest.mark.ex1_3
@pytest.mark.parametrize("ckpt, want", [
    ("model.layers.0.self_attn.q_proj.weight", ("model.layers.0.self_attn.qkv_proj.weight", "q")),
    ("model.layers.11.self_attn.k_proj.weight", ("model.layers.11.self_attn.qkv_proj.weight", "k")),
    ("model.layers.2.self_attn.v_proj.bias", ("model.layers.2.self_attn.qkv_proj.bias", "v")),
    ("model.layers.0.mlp.gate_proj.weight", ("model.layers.0.mlp.gate_up_proj.weight", 0)),
    ("model.layers.27.mlp.up_proj.weight", ("model.layers.27.mlp.gate_up_proj.weight", 1)),
    ("model.layers.0.mlp.down_proj.weight", ("model.layers.0.mlp.down_proj.weight", None)),
    ("model.layers.0.self_attn.o_proj.weight", ("model.layers.0.self_attn.o_proj.weight", None)),
    ("model.layers.0.self_attn.q_norm.weight", ("model.layers.0.self_attn.q_norm.weight", None)),
    ("model.embed_tokens.weight", ("model.embed_tokens.weight", None)),
    ("lm_head.weight", ("lm_head.weight", None)),
    # stored packed already (Phi-3's checkpoints are): "up_proj" inside "gate_up_proj" is not the up_proj fragment
    ("model.layers.0.mlp.gate_up_proj.weight", ("model.layers.0.mlp.gate_up_proj.weight", None)),
])
def test_checkpoint_param_name(impl, ckpt, want):
    check_equal(tuple(impl.checkpoint_param_name(ckpt, PACKED)), want, "1.3", f"route of {ckpt!r}",
                suspects=then(suspects("checkpoint_param_name", ckpt, PACKED), tuple))


def _engine_model(name: str) -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM(ModelConfig.from_folder(ref_path(name))).float()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))  # a parameter the loader forgets stays NaN
    return model


@pytest.mark.ex1_3
@pytest.mark.parametrize("name", TINY_MODELS)
def test_load_model_packs_what_transformers_wrote(impl, name):
    model = _engine_model(name)
    impl.load_model(model, ref_path(name))
    check_packed_as_transformers_loads(model, name)


@pytest.mark.ex1_3
def test_load_model_gives_a_tensor_parallel_rank_its_slices(impl, monkeypatch):
    """Every parameter with a weight_loader loads through it (the docstring's rule): under tensor
    parallelism the loader cuts the rank's slice. Rank 1 of 2, built here without a process group (a
    layer reads its rank once, when it is built), gets the second half of each split tensor of
    transformers' checkpoint: q, k, v, gate, up and the vocabulary rows on dim 0, o_proj and down_proj
    on dim 1; the norms whole. A loader that copies a whole tensor itself fails the shape check."""
    from transformers import AutoModelForCausalLM

    from minillm import distributed

    def rank_1_of_2() -> Qwen3ForCausalLM:
        monkeypatch.setattr(distributed, "_STATE", distributed.TPState(None, 1, 2))
        model = _engine_model("tiny-qwen3")
        monkeypatch.setattr(distributed, "_STATE", distributed.TPState())
        return model

    from safetensors import safe_open
    with safe_open(os.path.join(ref_path("tiny-qwen3"), "model.safetensors"), "pt") as f:
        names = list(f.keys())

    def outcome(load_model, model) -> tuple:
        """("loaded",) or ("ValueError", the checkpoint tensors its message names): compared by that, as two
        loaders word their errors differently."""
        try:
            load_model(model, ref_path("tiny-qwen3"))
        except ValueError as e:
            return "ValueError", sorted(n for n in names if n in str(e)), str(e)
        return ("loaded",)
    model = rank_1_of_2()
    got = outcome(impl.load_model, model)
    check_equal(got[:2], ("loaded",), "1.3", "loading rank 1 of 2's model (its parameters hold half of each split "
                "tensor)" + (f"; your load_model raised: {got[2]}" if len(got) > 2 else ""),
                suspects=suspects_of("load_model", lambda fn: outcome(fn, rank_1_of_2())[:2]))
    sd = AutoModelForCausalLM.from_pretrained(ref_path("tiny-qwen3"), dtype=torch.float32).state_dict()
    second = lambda t, dim: t.chunk(2, dim=dim)[1]  # noqa: E731 -- rank 1's half
    for pname, param in model.named_parameters():
        if ".qkv_proj." in pname:
            want = torch.cat([second(sd[pname.replace("qkv_proj", p)], 0) for p in ("q_proj", "k_proj", "v_proj")])
        elif ".gate_up_proj." in pname:
            want = torch.cat([second(sd[pname.replace("gate_up_proj", p)], 0) for p in ("gate_proj", "up_proj")])
        elif ".o_proj." in pname or ".down_proj." in pname:
            want = second(sd[pname], 1)
        elif "embed_tokens" in pname or "lm_head" in pname:
            want = second(sd[pname], 0)
        else:
            want = sd[pname]
        check_close(param.detach(), want, "1.3", f"rank 1 of 2's parameter {pname} (its weight_loader cuts the slice)",
                    atol=0, rtol=0)


def check_packed_as_transformers_loads(model: Qwen3ForCausalLM, name: str) -> None:
    """Every parameter of `model` (loaded from checkpoint `name`) equals transformers' weights, packed."""
    from transformers import AutoModelForCausalLM
    sd = AutoModelForCausalLM.from_pretrained(ref_path(name), dtype=torch.float32).state_dict()
    got = dict(model.named_parameters())
    for pname, param in got.items():
        if ".qkv_proj." in pname:
            want = torch.cat([sd[pname.replace("qkv_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
        elif ".gate_up_proj." in pname:
            want = torch.cat([sd[pname.replace("gate_up_proj", p)] for p in ("gate_proj", "up_proj")])
        else:
            want = sd[pname]
        check_close(param.detach(), want, "1.3", f"parameter {pname}", atol=0, rtol=0)
    if model.tie_word_embeddings:
        check_equal(model.lm_head.weight is model.model.embed_tokens.weight, True, "1.3",
                    "lm_head shares the embedding when tied (do not load lm_head.weight)")


# (change, what the ValueError must mention: words separated by |, any one of them; a missing parameter is
# told by the word or by its name)
BAD_CHECKPOINTS = [
    ("drop model.layers.1.mlp.up_proj.weight", "missing|gate_up_proj"),
    ("drop model.norm.weight", "missing|model.norm.weight"),
    ("add model.layers.0.surprise.weight", "surprise"),
    ("reshape model.norm.weight", "model.norm.weight"),
    ("reshape model.layers.0.self_attn.k_proj.weight", "k_proj"),
    ("fold model.norm.weight", "model.norm.weight"),  # as many elements in another shape: (64,) as (8, 8)
]


def _bad_checkpoint(tmp_path, change: str) -> str:
    """A copy of tiny-qwen3 in tmp_path after `change` (drop, add, reshape (a row less) or fold (the same elements
    in 8 rows) one tensor) -> its folder."""
    from safetensors.torch import load_file, save_file
    d = tmp_path / ("bad " + change)
    if d.exists():
        return str(d)
    tensors = load_file(ref_path("tiny-qwen3") + "/model.safetensors")
    verb, key = change.split()
    if verb == "drop":
        del tensors[key]
    elif verb == "add":
        tensors[key] = torch.zeros(3)
    elif verb == "fold":
        tensors[key] = tensors[key].reshape(8, -1).clone()
    else:
        tensors[key] = tensors[key][:-1].clone()
    d.mkdir()
    save_file(tensors, d / "model.safetensors")
    (d / "config.json").write_text(open(ref_path("tiny-qwen3") + "/config.json").read())
    return str(d)


@pytest.mark.ex1_3
@pytest.mark.parametrize("change, match", BAD_CHECKPOINTS)
def test_load_model_rejects_bad_checkpoints(impl, tmp_path, change, match):
    """A known wrong version is named only when it does what yours does with EVERY bad checkpoint here: a
    loader that never checks completeness and one that checks it only per parameter both load the checkpoint
    without up_proj, but only one of them loads the one without model.norm.weight."""
    want = _mentioning(match)
    got = _outcome(lambda: impl.load_model(_engine_model("tiny-qwen3"), _bad_checkpoint(tmp_path, change)), match)
    if got != want:  # the wrong versions run only on failure: each loads every bad checkpoint once more
        def outcomes(load_model) -> dict[str, str]:  # compared by kind ("ValueError: <any text>" alike)
            return {c: _outcome(lambda c=c: load_model(_engine_model("tiny-qwen3"), _bad_checkpoint(tmp_path, c)),
                                m).split(":")[0] for c, m in BAD_CHECKPOINTS}
        yours = functools.cache(lambda: outcomes(impl.load_model))

        def everywhere_like_yours(wrong) -> str:
            if outcomes(wrong) != yours():
                raise LookupError("this wrong version differs from yours on another bad checkpoint")
            return _outcome(lambda: wrong(_engine_model("tiny-qwen3"), _bad_checkpoint(tmp_path, change)), match)

        check_equal(got, want, "1.3", f"what load_model does with a checkpoint after '{change}'",
                    suspects={hint: (lambda w=w: everywhere_like_yours(w))
                              for hint, w in wrong_versions("load_model").items()})


@pytest.mark.ex1_3
@pytest.mark.parametrize("name, extra", [
    ("tiny-llama", "rotary_emb.inv_freq"),  # older Llama checkpoints store RoPE's inverse frequencies per layer
    ("tiny-qwen3-tied", "lm_head.weight"),  # a tied checkpoint that stores the head anyway, a copy of the embedding
])
def test_load_model_skips_what_the_model_does_not_store(impl, tmp_path, name, extra):
    """Real checkpoints hold tensors that are no parameter of the model: they load, skipped, and every
    parameter still equals transformers' (loading the checkpoint without them)."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(ref_path(name) + "/model.safetensors")
    with open(ref_path(name) + "/config.json") as f:
        config = json.load(f)
    assert not any(k.endswith(extra) for k in tensors)  # the premise: the tiny checkpoint lacks them
    if extra == "lm_head.weight":
        tensors[extra] = tensors["model.embed_tokens.weight"].clone()
    else:
        d = config["head_dim"]
        inv_freq = 1.0 / config["rope_parameters"]["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        for i in range(config["num_hidden_layers"]):
            tensors[f"model.layers.{i}.self_attn.{extra}"] = inv_freq.clone()
    folder = tmp_path / name
    folder.mkdir()
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    model = _engine_model(name)
    got, want = _load_outcome(lambda: impl.load_model(model, str(folder)), extra), "loaded without an error"
    if got != want:  # the wrong versions run only on failure: each loads the checkpoint once more
        suspected = suspects("load_model", _engine_model(name), str(folder))
        check_equal(got, want, "1.3", f"what load_model does with a checkpoint of {name} that holds {extra!r}",
                    suspects={hint: (lambda run=run: _load_outcome(run, extra)) for hint, run in suspected.items()})
    check_packed_as_transformers_loads(model, name)


def _load_outcome(load, extra: str) -> str:
    """What a load did, in words: loaded, an error naming the tensor `extra` (any exception type: a
    ValueError from the name check, a KeyError from the lookup, ...), or another error."""
    try:
        load()
    except NotImplementedError:
        raise
    except Exception as e:
        return f"raised an error naming {extra!r}" if extra in str(e) else f"{type(e).__name__}: {e}"
    return "loaded without an error"


def _mentioning(match: str) -> str:
    return "ValueError mentioning " + " or ".join(repr(word) for word in match.split("|"))


def _outcome(load, match: str) -> str:
    """What a load did, in words: loaded, a ValueError mentioning one of the |-separated words of `match`,
    or another error."""
    try:
        load()
    except NotImplementedError:
        raise
    except ValueError as e:
        return _mentioning(match) if any(word in str(e) for word in match.split("|")) else f"ValueError: {e}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "loaded without an error"


@pytest.mark.parametrize("exercise_id", [pytest.param("1.2", marks=pytest.mark.ex1_2),
                                         pytest.param("1.3", marks=pytest.mark.ex1_3)])
def test_your_loader_runs_the_engine(impl_name, exercise_id):
    """Exercise 1.2 (reading safetensors) or 1.3 (routing and loading), alone inside the engine:
    LLM() loads the checkpoint through your functions and generates transformers' tokens."""
    from helpers import small_engine_args
    from minillm import LLM, SamplingParams
    require_written(impl_name, exercise_id)
    ref = greedy_reference()
    params = SamplingParams(temperature=0.0, max_tokens=ref["max_new_tokens"], ignore_eos=True)
    with use_impl(impl_name, exercises={exercise_id}):
        llm = LLM(ref_path("tiny-qwen2"), **small_engine_args())
        out = llm.generate(ref["prompts"][:3], params, use_tqdm=False)
    check_equal([o.outputs[0].token_ids for o in out], ref["tokens"]["tiny-qwen2"][:3], exercise_id,
                "greedy tokens of the engine loaded by your functions")


# ---- 1.4 .. 1.6 the runtime --------------------------------------------------------------------
@functools.cache
def _runner(name: str):
    """One runner per tiny model for the whole session (plain function: see _ranks)."""
    return one_sequence_runner(ref_path(name), device="cpu", dtype="float32", max_model_len=128)


@pytest.mark.ex1_4
@pytest.mark.parametrize("name", TINY_MODELS)
def test_forward_pipeline_matches_transformers_logits(impl, name):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(ref_path(name), dtype=torch.float32).eval()
    runner, greedy = _runner(name), greedy_reference()
    for prompt, tokens in list(zip(greedy["prompts"], greedy["tokens"][name]))[1:4]:
        with torch.inference_mode():
            want = hf(torch.tensor([prompt])).logits[0]
            input_ids, positions = runner.load_batch(prefill_batch(prompt))
            try:  # checked while the attention context is set: the wrong versions run on failure
                got = call_pure(impl.forward_pipeline, "forward_pipeline", "1.4", runner.model, input_ids, positions)
                check_close(got, want, "1.4", f"logits of {name} for a {len(prompt)}-token prompt", atol=1e-4,
                            rtol=1e-4, suspects=suspects("forward_pipeline", runner.model, input_ids, positions))
            finally:
                reset_context()
        check_equal(int(got[-1].argmax()), tokens[0], "1.4", "greedy next token (transformers' generate)")
    # a decode step after the prompt's prefill (by minillm) into the cache: its query sits at position L, and
    # RoPE rotates it against keys cached at 0..L-1 (in one prefill from 0, positions and arange agree)
    prompt, tokens = greedy["prompts"][1], greedy["tokens"][name][1]
    with torch.inference_mode():
        want = hf(torch.tensor([[*prompt, tokens[0]]])).logits[0, -1:]
        last_logits(runner, prefill_batch(prompt, slot_mapping=np.arange(len(prompt), dtype=np.int64)))
        pos = np.array([len(prompt)], dtype=np.int64)
        step = Batch(is_prefill=False, input_ids=np.array(tokens[:1], dtype=np.int64), positions=pos, slot_mapping=pos,
                     context_lens=np.array([len(prompt) + 1], dtype=np.int32),
                     block_tables=np.arange(runner.num_kvcache_blocks, dtype=np.int32)[None, :])
        input_ids, positions = runner.load_batch(step)
        try:
            got = call_pure(impl.forward_pipeline, "forward_pipeline", "1.4", runner.model, input_ids, positions)
            check_close(got, want, "1.4", f"logits of {name} for a decode step at position {len(prompt)}, after the "
                        f"prompt's {len(prompt)} keys were cached", atol=1e-4, rtol=1e-4,
                        suspects=suspects("forward_pipeline", runner.model, input_ids, positions))
        finally:
            reset_context()


@functools.cache
def _bf16_runner(name: str):
    """The same runner in bf16, as the engine runs a model on a GPU (plain function: see _ranks)."""
    return one_sequence_runner(ref_path(name), device="cpu", dtype="bfloat16", max_model_len=128)


BF16_LOGITS_ATOL = 0.1  # bf16 keeps 8 bits: logits near 3 lie ~0.016 apart, and two bf16 forwards (minillm's and
# transformers', whose ops round in another order) differ by up to ~0.06 after a model's layers


@pytest.mark.ex1_4
def test_forward_pipeline_of_a_bf16_model_returns_bf16_logits(impl):
    """A bf16 model (the engine's dtype on a GPU) gives bf16 logits, as transformers' forward and minillm's
    compute_logits do: the sampler upcasts what it needs, and an fp32 copy of [N, vocab] logits is twice the
    memory. Values against transformers' forward of the same checkpoint in bf16."""
    from transformers import AutoModelForCausalLM
    name = "tiny-qwen3-tied"
    hf = AutoModelForCausalLM.from_pretrained(ref_path(name), dtype=torch.bfloat16).eval()
    runner, prompt = _bf16_runner(name), greedy_reference()["prompts"][2]
    with torch.inference_mode():
        want = hf(torch.tensor([prompt])).logits[0]
        input_ids, positions = runner.load_batch(prefill_batch(prompt))
        try:
            got = call_pure(impl.forward_pipeline, "forward_pipeline", "1.4", runner.model, input_ids, positions)
            check_close(got, want, "1.4", f"logits of {name} in bf16 for a {len(prompt)}-token prompt",
                        atol=BF16_LOGITS_ATOL, rtol=0,
                        suspects=suspects("forward_pipeline", runner.model, input_ids, positions))
        finally:
            reset_context()


class _TokensPerCall:
    """Records how many tokens each forward of the model gets (a hook on the embedding)."""

    def __init__(self, model):
        self.sizes = []
        self.handle = model.model.embed_tokens.register_forward_hook(
            lambda mod, args, out: self.sizes.append(int(args[0].numel())))

    def __enter__(self):
        return self.sizes

    def __exit__(self, *exc):
        self.handle.remove()


def _on_a_clean_cache(runner, generate):
    """generate(runner, ...), run after zeroing the runner's KV cache (the session shares one runner per
    model): a loop that reads slots it never wrote then reads zeros every time, not what the run before
    left there, so its tokens are the same on every run (and a known wrong version's are comparable)."""
    def run(*args):
        runner.kv_cache.zero_()
        return generate(*args)
    return run


def _check_generate(impl, function: str, name, exercise_id, per_call):
    """Transformers' greedy tokens after prompts of 1, 5, 17 and 64 tokens (within and across blocks of 16; after
    the 5-token one tiny-qwen3-tied's continuation holds its EOS, which is not special here), then
    max_new_tokens 1 and 0 after the first prompt (plain Python: no tokens at all), each as a list of ints. Each
    call gets a copy of the prompt list, which must come back unchanged. A known wrong version is named only
    when it gives your tokens on every one of these runs: two bugs can agree on one (stopping at len(ids) ==
    max_new_tokens and running one step too few both give 23 tokens after a 1-token prompt; skipping the
    max_new_tokens=0 check and one decode step too many both give one token for 0)."""
    runner, greedy = _runner(name), greedy_reference()
    n = greedy["max_new_tokens"]
    cases = list(zip(greedy["prompts"], greedy["tokens"][name]))
    runs = [(cases[i][0], n, cases[i][1]) for i in (0, 1, 2, 4)]
    runs += [(cases[0][0], 1, cases[0][1][:1]), (cases[0][0], 0, [])]
    yours = functools.cache(lambda: [list(_on_a_clean_cache(runner, getattr(impl, function))(runner, list(p), k))
                                     for p, k, _ in runs])

    def everywhere_like_yours(fn, i: int, part=lambda ids: ids):
        """part(fn's ids on run i), if fn gives your ids on every run (else it is not your bug)."""
        theirs = [list(_on_a_clean_cache(runner, fn)(runner, list(p), k)) for p, k, _ in runs]
        if any(len(a) != len(b) or a != b for a, b in zip(theirs, yours())):
            raise LookupError("this wrong version differs from yours on another prompt")
        return part(theirs[i])

    def not_ints(ids) -> list[str]:
        return sorted({type(t).__name__ for t in ids if not isinstance(t, numbers.Integral)})

    for i, (prompt, k, want) in enumerate(runs):
        given = list(prompt)
        with _TokensPerCall(runner.model) as sizes:
            got = list(_on_a_clean_cache(runner, getattr(impl, function))(runner, given, k))
        check_that(None if given == prompt else f"(it was {_short_ids(prompt)}, it is now {_short_ids(given)})",
                   exercise_id, f"{function} changed the prompt_ids list it was given (a {len(prompt)}-token prompt, "
                   f"max_new_tokens={k}): it is the caller's list; build your own, ids = list(prompt_ids), and "
                   f"append to that")
        check_equal(got, want, exercise_id, f"greedy tokens of {name} after a {len(prompt)}-token prompt, "
                                            f"max_new_tokens={k} (transformers' generate)",
                    suspects={hint: (lambda fn=fn, i=i: everywhere_like_yours(fn, i))
                              for hint, fn in wrong_versions(function).items()})
        check_equal(not_ints(got), [], exercise_id, "types of the generated ids that are not Python ints",
                    suspects={hint: (lambda fn=fn, i=i: everywhere_like_yours(fn, i, not_ints))
                              for hint, fn in wrong_versions(function).items()})
        check_equal(sizes, per_call(len(prompt), k) if k else [], exercise_id,
                    f"tokens fed to the model at each step (max_new_tokens={k})")


def _short_ids(ids: list[int]) -> str:
    count = f"{len(ids)} id{'' if len(ids) == 1 else 's'}"
    return f"{count} {ids}" if len(ids) <= 8 else f"{count} {ids[:4]} ... {ids[-2:]}"


@pytest.mark.ex1_5
@pytest.mark.parametrize("name", TINY_MODELS)
def test_naive_generate_equals_transformers(impl, name):
    _check_generate(impl, "greedy_generate_naive", name, "1.5",
                    lambda L, n: [L + i for i in range(n)])  # the whole sequence, every step


@pytest.mark.parametrize("exercise_id, function", [
    pytest.param("1.5", "greedy_generate_naive", marks=pytest.mark.ex1_5),
    pytest.param("1.6", "greedy_generate_cached", marks=pytest.mark.ex1_6)])
def test_generate_takes_the_lowest_id_of_equal_best_logits(impl, monkeypatch, exercise_id, function):
    """Equal best logits (exact ties are common in bf16) go to the lowest token id, as torch.argmax and so
    transformers' greedy generate pick them: here every step's best logit is copied to the vocabulary's
    last id, so the tokens stay transformers' own and a loop that keeps the last of equal maxima picks
    that id instead."""
    name = "tiny-qwen3-tied"
    runner, greedy = _runner(name), greedy_reference()
    last_id = runner.model_config.vocab_size - 1
    untied = runner.model.compute_logits

    def tied(hidden: torch.Tensor) -> torch.Tensor:
        logits = untied(hidden)
        best = logits.gather(-1, logits.argmax(-1, keepdim=True))
        return logits.scatter(-1, torch.full_like(best, last_id, dtype=torch.int64), best)

    monkeypatch.setattr(runner.model, "compute_logits", tied)
    prompt, want = greedy["prompts"][1], greedy["tokens"][name][1][:TIE_STEPS]
    assert last_id not in want  # else that step's tie would not show
    got = list(_on_a_clean_cache(runner, getattr(impl, function))(runner, list(prompt), TIE_STEPS))
    check_equal(got, want, exercise_id, f"greedy tokens when each step's best logit is tied with token {last_id}'s "
                "(torch.argmax and transformers' generate take the lowest id)",
                suspects={hint: (lambda fn=fn: list(_on_a_clean_cache(runner, fn)(runner, list(prompt), TIE_STEPS)))
                          for hint, fn in wrong_versions(function).items()})


TIE_STEPS = 6  # greedy steps in the tie test: the first already shows the bug


@pytest.mark.ex1_6
@pytest.mark.parametrize("name", TINY_MODELS)
def test_cached_generate_equals_transformers(impl, name):
    _check_generate(impl, "greedy_generate_cached", name, "1.6",
                    lambda L, n: [L] + [1] * (n - 1))  # the prompt once, then one token per step
