"""Model config (read from a model folder's config.json) and engine config (validated up front).

Both are plain dataclasses. Every check that can fail on user input lives here, so bad input
raises a ValueError before any weights are read or memory is taken.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelConfig:
    """The shapes and flags of a decoder-only model. One class runs Qwen3, Qwen2 and Llama:
    they differ only in QK-norm (Qwen3), QKV bias (Qwen2), tied embeddings and rope theta."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    torch_dtype: torch.dtype
    eos_token_id: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        model_type = d.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; minillm runs {', '.join(SUPPORTED_MODEL_TYPES)} checkpoints"
            )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported; minillm's MLP is SiLU-and-mul (SwiGLU)")
        # transformers 5 writes rope_parameters={"rope_theta": ..., "rope_type": ...}; 4 writes rope_theta.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ValueError(f"rope_type {rope_type!r} is not supported; minillm implements the default RoPE only")
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        # transformers 5 writes "dtype"; 4 writes "torch_dtype".
        dtype_name = d.get("dtype") or d.get("torch_dtype") or "float32"
        eos = d.get("eos_token_id")
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        heads = d["num_attention_heads"]
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2",  # Qwen2 has q/k/v bias, no o bias
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm=model_type == "qwen3",
            torch_dtype=DTYPES.get(str(dtype_name).replace("torch.", ""), torch.float32),
            eos_token_id=eos,
            bos_token_id=d.get("bos_token_id"),
        )

    @classmethod
    def from_folder(cls, path: str) -> "ModelConfig":
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"{path!r} has no config.json; a model folder needs config.json and *.safetensors")
        with open(cfg_path) as f:
            d = json.load(f)
        gen_path = os.path.join(path, "generation_config.json")
        if os.path.isfile(gen_path):  # chat models often list their end-of-turn token only here
            with open(gen_path) as f:
                gen_eos = json.load(f).get("eos_token_id")
            if gen_eos is not None:
                d["eos_token_id"] = sorted(set(_as_list(d.get("eos_token_id"))) | set(_as_list(gen_eos)))
        return cls.from_dict(d)


def _as_list(x) -> list:
    return [] if x is None else ([x] if isinstance(x, int) else list(x))


@dataclass
class EngineConfig:
    """Engine arguments, vLLM's names. `validate` checks them against the model before any work."""

    model: str = "smollm2-135m"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    max_model_len: int | None = None  # None: min(4096, the model's max_position_embeddings)
    kvcache_block_size: int = 256
    num_kvcache_blocks: int | None = None  # KV-cache budget in blocks ...
    kv_cache_memory: int | None = None  # ... or in bytes; on CUDA default: gpu_memory_utilization
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False  # CUDA: no CUDA graphs
    enable_prefix_caching: bool = True
    async_scheduling: bool = True  # read each step's tokens back one step later (overlaps CPU and GPU)
    attention_backend: str = "auto"  # auto | torch | triton | flash_attn
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    seed: int = 0

    def validate(self, mc: ModelConfig) -> None:
        """Raise ValueError naming the bad argument and the fix; fill in the derived defaults."""
        def need(ok: bool, msg: str):
            if not ok:
                raise ValueError(msg)

        for name in ("max_num_seqs", "max_num_batched_tokens", "kvcache_block_size", "tensor_parallel_size"):
            v = getattr(self, name)
            need(isinstance(v, int) and v >= 1, f"{name} must be a positive integer, got {v!r}")
        bs = self.kvcache_block_size
        need(bs >= 16 and bs & (bs - 1) == 0, f"kvcache_block_size must be a power of two >= 16, got {bs}")
        if self.max_model_len is None:
            self.max_model_len = min(4096, mc.max_position_embeddings)
        need(isinstance(self.max_model_len, int) and self.max_model_len >= 2,
             f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")
        need(self.max_model_len <= mc.max_position_embeddings,
             f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings="
             f"{mc.max_position_embeddings}; lower max_model_len")
        need(self.max_num_batched_tokens >= self.max_model_len,
             f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than max_model_len="
             f"{self.max_model_len}, so a long prompt could never be prefilled; raise max_num_batched_tokens "
             f"or lower max_model_len")
        need(0.0 < self.gpu_memory_utilization <= 1.0,
             f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        need(self.attention_backend in ATTENTION_BACKENDS,
             f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        need(self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        need(self.device != "cuda" or torch.cuda.is_available(),
             "device='cuda' but torch sees no CUDA device; use device='cpu'")
        need(self.dtype == "auto" or self.dtype in DTYPES, f"dtype must be auto or one of {list(DTYPES)}, got {self.dtype!r}")
        if self.dtype == "auto":  # CPU computes in fp32; CUDA in the checkpoint's half type (bf16 for fp32 ones)
            half = {torch.float16: "float16"}.get(mc.torch_dtype, "bfloat16")
            self.dtype = "float32" if self.device == "cpu" else half
        tp = self.tensor_parallel_size
        for what, n in (("num_attention_heads", mc.num_attention_heads), ("num_key_value_heads", mc.num_key_value_heads),
                        ("vocab_size", mc.vocab_size), ("intermediate_size", mc.intermediate_size)):
            need(n % tp == 0, f"tensor_parallel_size={tp} does not divide the model's {what}={n}; "
                              f"pick a size that divides it")
        if self.device == "cuda":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", tp))  # torchrun: the ranks on this node
            need(min(tp, local) <= torch.cuda.device_count(),
                 f"tensor_parallel_size={tp} needs {min(tp, local)} CUDA devices on this node but only "
                 f"{torch.cuda.device_count()} are visible")
        if self.attention_backend == "flash_attn":
            try:
                import flash_attn  # noqa: F401
            except ImportError:
                raise ValueError("attention_backend='flash_attn' but flash_attn is not installed; "
                                 "pip install flash-attn, or use 'triton'/'torch'") from None
            need(self.device == "cuda", "attention_backend='flash_attn' needs device='cuda'")
            need(self.kvcache_block_size % 256 == 0, "flash-attn's paged KV cache needs kvcache_block_size to be a "
                                                     "multiple of 256; use 256 or attention_backend='triton'")
            need(self.dtype in ("auto", "bfloat16", "float16"), "flash-attn computes in bf16/fp16 only; use "
                                                                 "dtype='bfloat16' or attention_backend='triton'")
        if self.num_kvcache_blocks is not None:
            need(isinstance(self.num_kvcache_blocks, int) and self.num_kvcache_blocks >= 1,
                 f"num_kvcache_blocks must be a positive integer, got {self.num_kvcache_blocks!r}")
            self.check_kv_blocks(self.num_kvcache_blocks)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.kvcache_block_size)

    def check_kv_blocks(self, num_blocks: int) -> None:
        need_blocks = self.blocks_per_seq()
        if num_blocks < need_blocks:
            raise ValueError(
                f"the KV cache holds {num_blocks} blocks of {self.kvcache_block_size} tokens, too small for one "
                f"sequence of max_model_len={self.max_model_len} tokens ({need_blocks} blocks); give it more "
                f"memory (num_kvcache_blocks, kv_cache_memory or gpu_memory_utilization) or lower max_model_len"
            )
