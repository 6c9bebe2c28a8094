"""Model config (read from a model folder's config.json) and engine config (validated up front).

Both are plain dataclasses. Every check that can fail on user input lives here, so bad input
raises a ValueError before any weights are read or memory is taken.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
from dataclasses import dataclass, field

import torch

from minillm.sampling_params import INT64_MAX, LOGPROBS_MODES, describe, is_integer, is_real

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Sizes, counts and ids of a config: the kernels index with int32, and block tables are int32.
MAX_CONFIG_INT = 2**31 - 1
_REQUIRED = object()


# ---- files ----------------------------------------------------------------------------------------
def check_regular_file(path: str) -> None:
    """Raise ValueError unless `path` is a regular file (or a symbolic link to one): never a folder,
    a dangling link, a link loop, a FIFO (opening one would block) or a device."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symbolic link loop, not a file") from None
        if os.path.islink(path):
            raise ValueError(f"{path} is a symbolic link to {os.readlink(path)!r}, which does not exist") from None
        raise ValueError(f"{path} cannot be read: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is not a regular file (a FIFO, socket or device?)")


def read_text(path: str) -> str:
    """The UTF-8 text of a regular file; every failure is a ValueError naming the file."""
    check_regular_file(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason})") from None


def read_json_object(path: str) -> dict:
    """A JSON file holding one object -> that dict; every failure is a ValueError naming the file."""
    try:
        d = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise ValueError(f"{path} is not valid JSON: nested too deeply") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} must hold a JSON object {{...}}, not {type(d).__name__}")
    return d


class _Fields:
    """Typed, bounded reads of a config dict; an error names the file and the field."""

    def __init__(self, d: dict, source: str):
        self.d, self.source = d, source

    def error(self, key: str, accepts: str, value=_REQUIRED) -> ValueError:
        got = "it is missing" if value is _REQUIRED else f"got {describe(value)}"
        return ValueError(f"{self.source}: {key} must be {accepts}; {got}")

    def get(self, key: str, default, accepts: str):
        v = self.d.get(key)
        if v is None:
            if default is _REQUIRED:
                raise self.error(key, accepts)
            return default
        return v

    def int(self, key: str, default=_REQUIRED, lo: int = 1, hi: int = MAX_CONFIG_INT) -> int:
        accepts = f"an integer in [{lo}, {hi}]"
        v = self.get(key, default, accepts)
        if not is_integer(v) or not lo <= v <= hi:
            raise self.error(key, accepts, v)
        return int(v)

    def positive(self, key: str, default=_REQUIRED, below: float = math.inf) -> float:
        accepts = "a finite number > 0" + (f" and < {below}" if below < math.inf else "")
        v = self.get(key, default, accepts)
        if not is_real(v) or not 0 < v < below or not math.isfinite(v):
            raise self.error(key, accepts, v)
        return float(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.get(key, default, "true or false")
        if not isinstance(v, bool):
            raise self.error(key, "true or false", v)
        return v

    def str(self, key: str, default=_REQUIRED) -> str:
        v = self.get(key, default, "a string")
        if not isinstance(v, str):
            raise self.error(key, "a string", v)
        return v

    def ids(self, key: str) -> list[int]:
        """A token id, a list of them, or nothing -> a list."""
        v = self.d.get(key)
        ids = [] if v is None else [v] if not isinstance(v, list) else v
        if not all(is_integer(i) and 0 <= i <= MAX_CONFIG_INT for i in ids):
            raise self.error(key, f"a token id or a list of token ids (integers in [0, {MAX_CONFIG_INT}])", v)
        return [int(i) for i in ids]


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
    def from_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        """A config.json's dict -> ModelConfig. Every field is type- and range-checked: a bad one raises
        ValueError naming `source` (the file) and the field."""
        if not isinstance(d, dict):
            raise ValueError(f"{source} must hold a JSON object {{...}}, not {type(d).__name__}")
        f = _Fields(d, source)
        model_type = d.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"{source}: model_type {model_type!r} is not supported; minillm runs "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints")
        if d.get("quantization_config") is not None:
            raise ValueError(f"{source}: quantized checkpoints (quantization_config) are not supported; "
                             f"minillm loads float32, bfloat16 and float16 weights")
        act = f.str("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{source}: hidden_act {act!r} is not supported; minillm's MLP is SiLU-and-mul (SwiGLU)")
        # transformers 5 writes rope_parameters={"rope_theta": ..., "rope_type": ...}; 4 writes rope_theta.
        rope_key = "rope_parameters" if d.get("rope_parameters") is not None else "rope_scaling"
        rope = d.get(rope_key) or {}
        if not isinstance(rope, dict):
            raise f.error(rope_key, "an object {\"rope_type\": ..., ...} or null", rope)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ValueError(f"{source}: rope_type {rope_type!r} is not supported; minillm implements the default "
                             f"RoPE only")
        rope_theta = d["rope_theta"] if d.get("rope_theta") is not None else rope.get("rope_theta", 10000.0)
        rope_theta = _Fields({"rope_theta": rope_theta}, source).positive("rope_theta")
        # transformers 5 writes "dtype"; 4 writes "torch_dtype".
        dtype_key = "dtype" if d.get("dtype") is not None else "torch_dtype"
        dtype_name = f.str(dtype_key, "float32").replace("torch.", "")
        if dtype_name not in DTYPES:
            raise f.error(dtype_key, f"one of {list(DTYPES)}", d.get(dtype_key))
        vocab, hidden = f.int("vocab_size"), f.int("hidden_size")
        heads = f.int("num_attention_heads")
        kv_heads = f.int("num_key_value_heads", heads)
        if heads % kv_heads:
            raise ValueError(f"{source}: num_attention_heads={heads} is not a multiple of num_key_value_heads="
                             f"{kv_heads} (each KV head serves a whole group of query heads)")
        if d.get("head_dim") is None and hidden % heads:
            raise ValueError(f"{source}: hidden_size={hidden} is not a multiple of num_attention_heads={heads}; "
                             f"give head_dim")
        head_dim = f.int("head_dim", hidden // heads)
        if head_dim % 2:
            raise f.error("head_dim", "even (RoPE rotates pairs of dimensions)", head_dim)
        attention_bias = f.bool("attention_bias", False)
        bos = f.ids("bos_token_id")
        if len(bos) > 1:
            raise f.error("bos_token_id", "one token id or null", d.get("bos_token_id"))
        return cls(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=f.int("intermediate_size"),
            num_hidden_layers=f.int("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=f.positive("rms_norm_eps", 1e-6, below=1.0),
            rope_theta=rope_theta,
            max_position_embeddings=f.int("max_position_embeddings", 4096, lo=2),
            tie_word_embeddings=f.bool("tie_word_embeddings", False),
            qkv_bias=attention_bias or model_type == "qwen2",  # Qwen2 has q/k/v bias, no o bias
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm=model_type == "qwen3",
            torch_dtype=DTYPES[dtype_name],
            eos_token_id=f.ids("eos_token_id"),
            bos_token_id=bos[0] if bos else None,
        )

    @classmethod
    def from_folder(cls, path: str) -> "ModelConfig":
        cfg_path = os.path.join(path, "config.json")
        if not os.path.lexists(cfg_path):
            raise ValueError(f"{path!r} has no config.json; a model folder needs config.json and *.safetensors")
        d = read_json_object(cfg_path)
        gen_path = os.path.join(path, "generation_config.json")
        if os.path.lexists(gen_path):  # chat models often list their end-of-turn token only here
            gen_eos = _Fields(read_json_object(gen_path), gen_path).ids("eos_token_id")
            if gen_eos:
                d["eos_token_id"] = sorted(set(_Fields(d, cfg_path).ids("eos_token_id")) | set(gen_eos))
        return cls.from_dict(d, cfg_path)

    def num_parameters(self, tp: int = 1) -> int:
        """Parameters one of `tp` tensor-parallel ranks holds (norms, which every rank holds whole, included)."""
        h, i, d, L = self.hidden_size, self.intermediate_size, self.head_dim, self.num_hidden_layers
        H, Hkv = self.num_attention_heads, self.num_key_value_heads
        sharded = h * (H + 2 * Hkv) * d + H * d * h + 3 * h * i  # q, k, v, o; gate, up, down
        whole = 2 * h + (2 * d if self.qk_norm else 0)
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return L * (sharded // tp + whole) + embeddings // tp + h

    def kv_bytes_per_token(self, tp: int, dtype: torch.dtype) -> int:
        """K and V of one token, all layers, on one of `tp` ranks."""
        return 2 * self.num_hidden_layers * (self.num_key_value_heads // tp) * self.head_dim * dtype.itemsize


# generation_config.json key -> the SamplingParams field it sets by default (vLLM's generation_config="auto")
GENERATION_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                       "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def generation_defaults(path: str) -> dict:
    """The sampling defaults a model folder's generation_config.json gives: {SamplingParams field:
    value} for the keys of GENERATION_DEFAULTS it sets (none without the file)."""
    gen_path = os.path.join(path, "generation_config.json")
    if not os.path.lexists(gen_path):
        return {}
    d = read_json_object(gen_path)
    out = {field: d[key] for key, field in GENERATION_DEFAULTS.items() if d.get(key) is not None}
    if out.get("top_k") == 0:  # transformers' "no top-k"
        out["top_k"] = -1
    return out


# the notebook re-run case: `llm = LLM(...)` run twice builds the new engine while the old one still holds memory
_OTHER_ENGINE_HINT = " (if another LLM in this process still holds the GPU's memory, call its shutdown() first)"


def available_memory(device: str) -> int | None:
    """Bytes free for a new engine: the CUDA device's free memory, or on CPU the kernel's MemAvailable
    (lowered to a cgroup's limit when it has one). None when unknown."""
    if device == "cuda":  # under torchrun this rank's GPU (not selected yet), else the current one
        local = os.environ.get("LOCAL_RANK")
        return torch.cuda.mem_get_info(int(local) if local is not None else torch.cuda.current_device())[0]
    free = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            limit = fh.read().strip()
        with open("/sys/fs/cgroup/memory.current") as fh:
            used = int(fh.read())
        if limit != "max":
            free = min(free if free is not None else math.inf, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


def readable_bytes(n: float) -> str:
    """Bytes, readable: "3.2 GB", "640 KB"."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:.0f} B"


# vLLM's names (its CacheConfig) for the three KV-cache engine arguments that minillm names as nano-vLLM does:
# LLM(...) takes either spelling; the fields keep nano-vLLM's, which the course's chapters and exercises use
VLLM_ALIASES = {"block_size": "kvcache_block_size", "kv_cache_memory_bytes": "kv_cache_memory",
                "num_gpu_blocks_override": "num_kvcache_blocks"}


def engine_args_from_vllm(engine_args: dict) -> dict:
    """engine_args with vLLM's spellings (VLLM_ALIASES) renamed to EngineConfig's fields. Raises
    ValueError for an argument given in both spellings."""
    out = dict(engine_args)
    for alias, name in VLLM_ALIASES.items():
        if alias in out:
            if name in out:
                raise ValueError(f"{alias} (vLLM's name) and {name} are the same engine argument; give one")
            out[name] = out.pop(alias)
    return out


@dataclass
class EngineConfig:
    """Engine arguments, vLLM's names (and nano-vLLM's for the KV cache: VLLM_ALIASES). `validate` checks
    them against the model before any work."""

    model: str = "smollm2-135m"
    tokenizer: str | None = None  # a folder with tokenizer.json (or a model name); None: the model's own
    generation_config: str = "auto"  # auto: sampling defaults from generation_config.json; vllm: SamplingParams()
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384  # tokens one step computes at most (a longer prompt: in chunks)
    max_model_len: int | None = None  # None: min(4096, the model's max_position_embeddings)
    kvcache_block_size: int = 256
    num_kvcache_blocks: int | None = None  # KV-cache budget in blocks ...
    kv_cache_memory: int | None = None  # ... or in bytes; on CUDA default: gpu_memory_utilization
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False  # CUDA: no CUDA graphs
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True  # prefill a prompt longer than max_num_batched_tokens over several steps
    async_scheduling: bool = True  # read each step's tokens back one step later (overlaps CPU and GPU)
    attention_backend: str = "auto"  # auto | torch | triton | flash_attn
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    seed: int = 0
    # vLLM's switch for a checkpoint's own Python code; minillm runs none (it builds Qwen3, Llama and Qwen2 from
    # config.json), so True allows nothing more: accepted, checked, and without effect
    trust_remote_code: bool = False
    # what SamplingParams.logprobs / prompt_logprobs report (vLLM's engine argument and default): raw_logprobs,
    # processed_logprobs, raw_logits or processed_logits (minillm.sampling_params.LOGPROBS_MODES)
    logprobs_mode: str = "raw_logprobs"

    def validate(self, mc: ModelConfig) -> None:
        """Raise ValueError naming the bad argument and the fix; fill in the derived defaults."""
        def need(ok: bool, msg: str):
            if not ok:
                raise ValueError(msg)

        for name in ("max_num_seqs", "max_num_batched_tokens", "kvcache_block_size", "tensor_parallel_size"):
            v = getattr(self, name)
            need(is_integer(v) and 1 <= v <= MAX_CONFIG_INT,
                 f"{name} must be a positive integer (at most 2**31 - 1), got {describe(v)}")
        need(self.tokenizer is None or isinstance(self.tokenizer, str),
             f"tokenizer must be None (the model's own) or a folder path or model name, got {describe(self.tokenizer)}")
        for name in ("enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling",
                     "trust_remote_code"):
            v = getattr(self, name)
            need(isinstance(v, bool), f"{name} must be True or False, got {describe(v)}")
        for name, choices in (("attention_backend", ATTENTION_BACKENDS), ("device", ("auto", "cpu", "cuda")),
                              ("generation_config", ("auto", "vllm")), ("logprobs_mode", LOGPROBS_MODES),
                              ("dtype", ("auto", *DTYPES))):
            v = getattr(self, name)
            need(isinstance(v, str) and v in choices, f"{name} must be one of {list(choices)}, got {describe(v)}")
        need(is_integer(self.seed) and 0 <= self.seed <= INT64_MAX,
             f"seed must be an integer in [0, 2**63 - 1], got {describe(self.seed)}")
        bs = self.kvcache_block_size
        need(bs >= 16 and bs & (bs - 1) == 0, f"kvcache_block_size must be a power of two >= 16, got {bs}")
        if self.max_model_len is None:
            self.max_model_len = min(4096, mc.max_position_embeddings)
        need(is_integer(self.max_model_len) and self.max_model_len >= 2,
             f"max_model_len must be an integer >= 2, got {describe(self.max_model_len)}")
        need(self.max_model_len <= mc.max_position_embeddings,
             f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings="
             f"{mc.max_position_embeddings}; lower max_model_len")
        need(self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
             f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than max_model_len="
             f"{self.max_model_len}, so without chunked prefill a long prompt could never be prefilled; raise "
             f"max_num_batched_tokens, lower max_model_len, or set enable_chunked_prefill=True")
        u = self.gpu_memory_utilization
        need(is_real(u) and 0.0 < u <= 1.0, f"gpu_memory_utilization must be a number in (0, 1], got {describe(u)}")
        n, m = self.num_kvcache_blocks, self.kv_cache_memory
        need(n is None or (is_integer(n) and 1 <= n <= MAX_CONFIG_INT),
             f"num_kvcache_blocks must be None or an integer in [1, 2**31 - 1], got {describe(n)}")
        need(m is None or (is_integer(m) and m >= 1),
             f"kv_cache_memory must be None or a positive integer (bytes), got {describe(m)}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        need(self.device != "cuda" or torch.cuda.is_available(),
             "device='cuda' but torch sees no CUDA device; use device='cpu'")
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
        if self.num_kvcache_blocks is not None:
            self.check_kv_blocks(self.num_kvcache_blocks)
        elif self.kv_cache_memory is not None:
            self.check_kv_blocks(self.kv_cache_memory // (mc.kv_bytes_per_token(tp, self.torch_dtype) * bs))
        self.check_memory(mc)

    def check_memory(self, mc: ModelConfig) -> None:
        """Raise ValueError when the weights (estimated from config.json) and an explicit KV-cache size
        cannot fit in the memory available now: before anything is allocated, not after."""
        free = available_memory(self.device)
        if free is None:
            return
        tp = self.tensor_parallel_size
        ranks_here = tp if self.device == "cpu" else 1  # CPU ranks share this machine's memory
        weights = mc.num_parameters(tp) * self.torch_dtype.itemsize * ranks_here
        if weights > free:
            raise ValueError(
                f"config.json describes about {readable_bytes(weights)} of {self.dtype} weights (num_hidden_layers="
                f"{mc.num_hidden_layers}, hidden_size={mc.hidden_size}, intermediate_size={mc.intermediate_size}, "
                f"vocab_size={mc.vocab_size}) but only {readable_bytes(free)} of memory is available on "
                f"{self.device}; check config.json, or use a smaller dtype or more tensor-parallel GPUs"
                f"{_OTHER_ENGINE_HINT if self.device == 'cuda' else ''}")
        block_bytes = mc.kv_bytes_per_token(tp, self.torch_dtype) * self.kvcache_block_size
        if self.num_kvcache_blocks is not None:
            kv, what = self.num_kvcache_blocks * block_bytes, f"num_kvcache_blocks={self.num_kvcache_blocks}"
        elif self.kv_cache_memory is not None:
            kv, what = self.kv_cache_memory, f"kv_cache_memory={self.kv_cache_memory}"
        else:
            return  # sized by the runner from what is left
        if weights + kv * ranks_here > free:
            raise ValueError(f"{what} asks for {readable_bytes(kv * ranks_here)} of KV cache on top of "
                             f"{readable_bytes(weights)} of weights, but only {readable_bytes(free)} of memory is "
                             f"available on {self.device}; lower it"
                             f"{_OTHER_ENGINE_HINT if self.device == 'cuda' else ''}")

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
