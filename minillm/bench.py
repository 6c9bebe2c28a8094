"""`python -m minillm bench`: nano-vLLM's throughput workload, its bandwidth floor, and other engines beside it.

Workload: 256 requests (seed 0), prompt and output lengths uniform in [100, 1024], random token ids
in [0, 10000], EOS ignored, temperature 0.6. Throughput = output tokens / wall time.

The floor is the time the device needs at its measured ceilings (copy bandwidth, matmul rate),
assuming every request runs from the start: each decode step reads all weights once plus the K/V
of every running request; prefill does 2 * params * prompt tokens (+ attention) FLOPs.

One run can time several engines on the same requests, one after the other in this process:
minillm with one or more attention backends (`--attention-backend triton flash_attn`), nano-vLLM's
own engine (`--compare nanovllm`, imported from NANOVLLM_PATH or an installed package) and HF
transformers' continuous batching (`--compare hf`). Each engine gives the GPU back (its objects
dropped, the allocator's cache emptied) before the next starts, and the memory still allocated
afterwards is reported. A ratio between two engines is only ever taken on the same requests:
with `--hf-num-seqs N` HF runs the first N requests only, and every other engine runs those N too.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import hashlib
import importlib
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import numpy as np

COMPARE_ENGINES = ("hf", "nanovllm")
HF_ATTENTION = "paged|sdpa"  # HF's continuous-batching attention (CUDA graphs captured at warm-up)
NANOVLLM_MAX_MODEL_LEN = 4096  # nano-vLLM's bench.py: LLM(path, enforce_eager=False, max_model_len=4096)
BATCH1_PROMPT = list(range(1000, 1128))  # the batch-1 test's 128-token prompt
BATCH1_REPEATS = 3  # the best of three runs of each length
BATCH1_MAX_REPEATS = 9  # rounds at most, while the longer runs are not yet measurably the slower
WARMUP_TOKENS = 8  # new tokens of each warm-up request
MAX_TOKEN_ID = 10000  # prompts are random token ids in [0, 10000] (nano-vLLM's bench.py)
LEAK_WARN_GIB = 1.0  # memory an engine may leave allocated before the next one's KV cache visibly shrinks
COMMIT_FILES = ("COMMIT", "REVISION")  # where a copy without .git may record its commit
GIB = 2 ** 30


def make_workload(num_seqs: int, min_len: int, max_input_len: int, max_output_len: int, seed: int = 0):
    """-> (prompt token-id lists, output lengths), drawn the way nano-vLLM's bench.py draws them."""
    import random
    rng = random.Random(seed)
    prompts = [[rng.randint(0, MAX_TOKEN_ID) for _ in range(rng.randint(min_len, max_input_len))]
               for _ in range(num_seqs)]
    outputs = [rng.randint(min_len, max_output_len) for _ in range(num_seqs)]
    return prompts, outputs


@dataclass
class Workload:
    """Requests as every engine gets them: prompt token ids and each request's exact output length."""

    prompts: list[list[int]]
    output_lens: list[int]

    def first(self, n: int) -> "Workload":
        return Workload(self.prompts[:n], self.output_lens[:n])

    def fresh(self) -> "Workload":
        """The same requests with each prompt's first token changed: the same lengths and cost, but no
        prefix an engine cached while running the originals is reused (a prefix cache hashes whole blocks
        from the first token on)."""
        return Workload([[(p[0] + 1) % (MAX_TOKEN_ID + 1)] + p[1:] for p in self.prompts], list(self.output_lens))

    def warmup(self) -> "Workload":
        """Two short requests that share no prefix with the workload's (their prompts reversed)."""
        return Workload([p[::-1] for p in self.prompts[:2]], [WARMUP_TOKENS] * min(2, self.num_seqs))

    @property
    def num_seqs(self) -> int:
        return len(self.prompts)

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


# >>> exercise 5.4 | notebooks/05_engine_performance.ipynb | 1. The floor: what "fast" can mean
def model_bytes(mc, dtype_bytes: int) -> tuple[float, float, float]:
    """What one decode step must read, for a model config (minillm.config.ModelConfig).

    mc: hidden_size h, intermediate_size i, num_hidden_layers L, num_attention_heads H,
    num_key_value_heads Hkv, head_dim d, vocab_size, and the flags qk_norm (Qwen3: an RMSNorm
    weight of d on q and one on k, per layer), qkv_bias (a bias on q, k and v), o_bias (a bias on
    o_proj); dtype_bytes: bytes per weight and per cached K/V element (2 for bf16).
    -> (weight bytes read per decode step, K/V bytes per token, non-embedding parameters).
    Non-embedding parameters: every weight of the L decoder layers (q, k, v, o projections; the
    MLP's gate, up and down; the two RMSNorms; QK-norms and biases when the flags say so) and the
    final norm, i.e. everything but the embedding table and the LM head.
    A decode step reads every non-embedding weight and the whole LM head (vocab_size x h: it
    scores the entire vocabulary), but only B rows of the embedding table: count those as nothing.
    With tied embeddings the LM head IS the embedding table; it is read once, as the LM head.
    K/V bytes per token: the key and the value of every KV head of every layer.
    Returns floats or ints (they are compared as numbers).
    """
    h, i, L, d = mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers, mc.head_dim
    H, Hkv = mc.num_attention_heads, mc.num_key_value_heads
    per_layer = h * (H + 2 * Hkv) * d + H * d * h + 2 * h * i + i * h + 2 * h
    per_layer += 2 * d * mc.qk_norm + (H + 2 * Hkv) * d * mc.qkv_bias + h * mc.o_bias
    non_embedding = L * per_layer + h
    weights = (non_embedding + mc.vocab_size * h) * dtype_bytes  # + the LM head, read whole every step
    kv_per_token = 2 * L * Hkv * d * dtype_bytes
    return weights, kv_per_token, non_embedding


def workload_floor(mc, dtype_bytes: int, prompt_lens, output_lens, copy_gbps: float, matmul_tflops: float) -> dict:
    """Seconds the device needs for a workload at its ceilings: the bench's floor.

    prompt_lens, output_lens: iterables of ints, one per request (request r prefills p_r tokens and
    outputs o_r >= 1 tokens); copy_gbps: bytes/s / 1e9 the device moves; matmul_tflops: FLOP/s / 1e12.
    Assume every request starts at once. The first token of each request comes from its prefill;
    decode step t = 1, 2, ..., max(o) - 1 then makes one token for every request with o_r > t,
    reading all weights once (model_bytes) plus the K/V of the p_r + t tokens each of them holds.
    Prefill costs FLOPs only: 2 x non-embedding parameters per prompt token, plus attention,
    2 x p_r^2 x H x d per layer for request r (QK^T and PV over the causal half).
    -> {"floor_decode_s": decode bytes / copy rate, "floor_prefill_s": prefill FLOPs / matmul rate,
        "floor_s": their sum, "floor_tok_s": total output tokens / floor_s}, floats.

    Hints: the sums have closed forms per request; numpy float64 keeps 256 requests exact enough.
    """
    weights, kv_tok, params = model_bytes(mc, dtype_bytes)
    p, o = np.asarray(list(prompt_lens), dtype=np.float64), np.asarray(list(output_lens))
    decode_bytes = 0.0
    for t in range(1, int(o.max())):  # the first token of each request comes from its prefill
        active = o > t
        decode_bytes += weights + ((p[active] + t) * kv_tok).sum()
    H, d, L = mc.num_attention_heads, mc.head_dim, mc.num_hidden_layers
    prefill_flops = 2 * params * p.sum() + (2 * p ** 2 * H * d * L).sum()  # QK^T and PV, causal half
    decode_s = decode_bytes / (copy_gbps * 1e9)
    prefill_s = prefill_flops / (matmul_tflops * 1e12)
    return {"floor_s": decode_s + prefill_s, "floor_decode_s": decode_s, "floor_prefill_s": prefill_s,
            "floor_tok_s": float(o.sum()) / (decode_s + prefill_s)}
# <<< exercise 5.4


# ---- arguments -------------------------------------------------------------------------------------
def split_names(values) -> list[str]:
    """['hf,nanovllm', 'triton'] -> ['hf', 'nanovllm', 'triton']: space- or comma-separated, in order, once each."""
    names: list[str] = []
    for v in values or []:
        for name in str(v).split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


# The workload when the command line gives none: nano-vLLM's on a GPU; on a CPU a small model and a
# handful of short requests (256 requests of up to 1,024 tokens would run for hours on two cores).
DEFAULT_WORKLOADS = {
    "cuda": dict(model="qwen3-0.6b-random", num_seqs=256, min_len=100, max_input_len=1024, max_output_len=1024,
                 batch1_tokens=256),
    "cpu": dict(model="smollm2-135m", num_seqs=8, min_len=16, max_input_len=64, max_output_len=64, batch1_tokens=32),
}


def fill_workload_defaults(args) -> None:
    """Give every workload argument left unset (None) its default for the device the run uses."""
    import torch
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    for name, value in DEFAULT_WORKLOADS[device].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def add_bench_args(p: argparse.ArgumentParser) -> None:
    gpu, cpu = DEFAULT_WORKLOADS["cuda"], DEFAULT_WORKLOADS["cpu"]
    per_device = lambda name: f"default {gpu[name]} on CUDA, {cpu[name]} on a CPU"  # noqa: E731
    p.add_argument("--model", default=None, help=per_device("model"))
    p.add_argument("--num-seqs", type=int, default=None, help=per_device("num_seqs"))
    p.add_argument("--min-len", type=int, default=None, help=per_device("min_len"))
    p.add_argument("--max-input-len", type=int, default=None, help=per_device("max_input_len"))
    p.add_argument("--max-output-len", type=int, default=None, help=per_device("max_output_len"))
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend", nargs="+", default=["auto"], metavar="BACKEND",
                   help="minillm's attention backend; several (space or comma separated, e.g. 'triton flash_attn') "
                        "each run minillm once in this run")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="minillm's (and nano-vLLM's) TP size")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--no-async", action="store_true", help="read each step's tokens back before the next")
    p.add_argument("--batch1-tokens", type=int, default=None,
                   help=f"batch-1 decode test length (0: skip; {per_device('batch1_tokens')})")
    p.add_argument("--compare", nargs="+", default=[], metavar="ENGINE",
                   help="also run these engines on the same requests: hf, nanovllm (space or comma separated)")
    p.add_argument("--hf-num-seqs", type=int, default=None,
                   help="HF runs only the first N requests (a quick look; default: all); every ratio to HF "
                        "then compares the other engines on the same N")
    p.add_argument("--nanovllm-path", default=os.environ.get("NANOVLLM_PATH"),
                   help="a nano-vLLM checkout (the folder holding the nanovllm package); default: $NANOVLLM_PATH, "
                        "else an installed nano-vllm")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (the table goes to stderr)")
    p.add_argument("--json-file", default=None, help="also write the JSON there, rewritten after each engine")
    # `bench serve --base-url URL ...`: load a running server instead (minillm/bench_serve.py)
    from minillm.bench_serve import add_serve_args
    modes = p.add_subparsers(dest="bench_mode", metavar="serve")
    add_serve_args(modes.add_parser("serve", help="load a running `python -m minillm serve`: TTFT, TPOT, ITL "
                                                  "and throughput at each request rate (see minillm/bench_serve.py)"))


def check_args(args) -> None:
    """Fill in the device's default workload, normalize the list arguments in place; raise ValueError
    naming a bad one and the fix."""
    fill_workload_defaults(args)
    args.attention_backend = split_names(args.attention_backend) or ["auto"]
    args.compare = split_names(args.compare)
    from minillm.config import ATTENTION_BACKENDS
    bad = [b for b in args.attention_backend if b not in ATTENTION_BACKENDS]
    if bad:
        raise ValueError(f"unknown attention backend {bad[0]!r}; use one or more of {', '.join(ATTENTION_BACKENDS)}")
    bad = [c for c in args.compare if c not in COMPARE_ENGINES]
    if bad:
        raise ValueError(f"--compare {bad[0]!r}: the engines bench can run beside minillm are "
                         f"{', '.join(COMPARE_ENGINES)}")
    if args.num_seqs < 1:
        raise ValueError(f"--num-seqs must be at least 1, got {args.num_seqs}")
    if args.hf_num_seqs is not None:
        if "hf" not in args.compare:
            raise ValueError("--hf-num-seqs sizes the HF comparison; add --compare hf")
        if not 1 <= args.hf_num_seqs <= args.num_seqs:
            raise ValueError(f"--hf-num-seqs must be between 1 and --num-seqs={args.num_seqs}, got {args.hf_num_seqs}")
        if args.hf_num_seqs == args.num_seqs:
            args.hf_num_seqs = None  # the whole workload: no subset
    if "hf" in args.compare and args.tensor_parallel_size > 1:
        raise ValueError("--compare hf runs HF on one GPU; compare with HF at --tensor-parallel-size 1")
    if args.batch1_tokens < 0:
        raise ValueError(f"--batch1-tokens must be >= 0, got {args.batch1_tokens}")


# ---- like for like ---------------------------------------------------------------------------------
def like_for_like_ratios(engines: dict[str, dict]) -> dict[str, dict]:
    """Throughput ratio of every pair of engines (earlier over later), each on the largest set of
    requests both ran. An engine's "throughput" maps a request count (the first N of the workload,
    as a string) to its output tok/s there. -> {"a/b": {"ratio": x, "num_seqs": n}}."""
    ran = [name for name, e in engines.items() if e.get("throughput")]
    ratios = {}
    for i, a in enumerate(ran):
        for b in ran[i + 1:]:
            ta, tb = engines[a]["throughput"], engines[b]["throughput"]
            common = set(ta) & set(tb)
            if common:
                n = max(common, key=int)
                ratios[f"{a}/{b}"] = {"ratio": round(ta[n] / tb[n], 2), "num_seqs": int(n)}
    return ratios


def _legacy_keys(result: dict) -> dict:
    """The flat keys earlier versions printed (notebook 05 reads them): the first minillm engine's
    figures, and HF's / nano-vLLM's beside them, every ratio like for like."""
    engines, ratios = result["engines"], result["ratios"]
    first = next((n for n, e in engines.items() if e.get("engine") == "minillm" and "output_tok_s" in e), None)
    out = {}
    if first is None:
        return out
    m = engines[first]
    for k in ("attention_backend", "cuda_graphs", "async_scheduling", "num_seqs", "prompt_tokens", "output_tokens",
              "wall_s", "output_tok_s", "prefill_tokens", "decode_tokens", "prefill_s", "decode_s", "prefill_tok_s",
              "decode_tok_s", "fraction_of_floor", "batch1_ms_per_token", "batch1_fraction_of_floor"):
        if k in m:
            out[k] = m[k]
    hf = engines.get("hf", {})
    if "output_tok_s" in hf:
        out.update(hf_output_tokens=hf["output_tokens"], hf_wall_s=hf["wall_s"], hf_tok_s=hf["output_tok_s"])
        r = ratios.get(f"{first}/hf")
        if r:
            out["speedup_vs_hf"] = r["ratio"]
            if r["num_seqs"] < result["workload"]["num_seqs"]:
                out["hf_subset"] = f"first {r['num_seqs']} of {result['workload']['num_seqs']} requests"
                out["minillm_subset_tok_s"] = m["throughput"][str(r["num_seqs"])]
                out["speedup_vs_hf_same_subset"] = r["ratio"]
    nano = engines.get("nanovllm", {})
    if "output_tok_s" in nano:
        out["nanovllm_tok_s"] = nano["output_tok_s"]
        r = ratios.get(f"{first}/nanovllm")
        if r:
            out["speedup_vs_nanovllm"] = r["ratio"]
    return out


# ---- shared timing helpers -------------------------------------------------------------------------
def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def release_gpu() -> float | None:
    """Collect garbage and hand the allocator's cached blocks back. -> GiB still allocated (None on CPU)."""
    import torch
    gc.collect()
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return round(torch.cuda.memory_allocated() / GIB, 3)


def timed(run: Callable[[], int]) -> tuple[int, float]:
    """-> (what run returned: output tokens, wall seconds between two device syncs)."""
    _sync()
    t0 = time.perf_counter()
    n = run()
    _sync()
    return n, time.perf_counter() - t0


def batch1_ms_per_token(run: Callable[[int], float], n_tokens: int, repeats: int = BATCH1_REPEATS) -> float | None:
    """Decode time per token at batch 1: (t(1 + n tokens) - t(1 token)) / n, the best of `repeats` each.
    run(k) generates k tokens for one request and returns its wall seconds. The two lengths alternate,
    so a stretch of a busy machine slows both alike (timed one length after the other, a loaded CPU
    once made the three 1-token runs slower than the 3-token ones: a negative time per token), and
    while the longer runs are not yet the slower, more rounds follow (up to BATCH1_MAX_REPEATS).
    -> None when even then they are not: n tokens are lost in the machine's noise."""
    run(n_tokens + 1)  # warm-up
    t_first = t_all = float("inf")
    rounds = 0
    while rounds < repeats or (t_all <= t_first and rounds < BATCH1_MAX_REPEATS):
        t_first = min(t_first, run(1))
        t_all = min(t_all, run(n_tokens + 1))
        rounds += 1
    return 1e3 * (t_all - t_first) / n_tokens if t_all > t_first else None


def _batch1_entry(res: dict, run: Callable[[int], float], n_tokens: int) -> None:
    """An engine's batch-1 figure (batch1_ms_per_token), or why there is none (batch1_unresolved)."""
    ms = batch1_ms_per_token(run, n_tokens)
    if ms is None:
        res["batch1_unresolved"] = (f"{n_tokens} decode tokens took no measurable time over one on this busy "
                                    f"machine: raise --batch1-tokens")
    else:
        res["batch1_ms_per_token"] = round(ms, 4)


def _throughput_entry(res: dict, work: Workload, n_out: int, wall: float) -> None:
    """Fill an engine's headline figures from one timed run over `work`."""
    res.update(num_seqs=work.num_seqs, prompt_tokens=work.prompt_tokens, output_tokens=n_out,
               expected_output_tokens=work.output_tokens, complete=n_out == work.output_tokens,
               wall_s=round(wall, 3), output_tok_s=round(n_out / wall, 1))
    res.setdefault("throughput", {})[str(work.num_seqs)] = res["output_tok_s"]


# ---- minillm ---------------------------------------------------------------------------------------
def run_minillm(args, backend: str, work: Workload, subset: Workload | None) -> dict:
    """minillm on the workload (and on `subset`, the requests HF runs when it runs only some)."""
    from minillm import LLM, SamplingParams
    llm = LLM(args.model, device=args.device, dtype=args.dtype, attention_backend=backend,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=max(args.max_model_len, args.max_input_len + args.max_output_len),
              tensor_parallel_size=args.tensor_parallel_size, enforce_eager=args.enforce_eager,
              async_scheduling=not args.no_async)
    try:
        engine = llm.engine
        res = {"engine": "minillm", "attention_backend": engine.model_runner.backend.name,
               "cuda_graphs": engine.model_runner.graphs is not None,
               "async_scheduling": engine.async_scheduling, "tensor_parallel_size": args.tensor_parallel_size}
        if res["attention_backend"] == "flash_attn":
            import flash_attn
            res["flash_attn_version"] = flash_attn.__version__

        def generate(w: Workload, use_tqdm: bool = False) -> int:
            params = [SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=n)
                      for n in w.output_lens]
            return sum(len(o.outputs[0].token_ids) for o in llm.generate(w.prompts, params, use_tqdm=use_tqdm))

        # warm-up, twice: the second run hits the prefix cache, so the paged prefill kernel compiles now too
        # (Triton compiles each kernel variant on first use; a compile inside the timed run costs ~1 s)
        warm = work.warmup()
        for _ in range(2):
            llm.generate(warm.prompts, SamplingParams(max_tokens=WARMUP_TOKENS, ignore_eos=True), use_tqdm=False)
        p0, d0 = engine.num_prefill_tokens, engine.num_decode_tokens
        ps0, ds0 = engine.phase_seconds["prefill"], engine.phase_seconds["decode"]
        n_out, wall = timed(lambda: generate(work, use_tqdm=not args.json))
        _throughput_entry(res, work, n_out, wall)
        # per phase: tokens over the wall time of the steps that read back batches of that phase
        res.update(prefill_tokens=engine.num_prefill_tokens - p0, decode_tokens=engine.num_decode_tokens - d0,
                   prefill_s=round(engine.phase_seconds["prefill"] - ps0, 3),
                   decode_s=round(engine.phase_seconds["decode"] - ds0, 3))
        res["prefill_tok_s"] = round(res["prefill_tokens"] / max(res["prefill_s"], 1e-9), 1)
        res["decode_tok_s"] = round(res["decode_tokens"] / max(res["decode_s"], 1e-9), 1)
        if subset:
            n, wall = timed(lambda: generate(subset))
            res["throughput"][str(subset.num_seqs)] = round(n / wall, 1)
        if args.batch1_tokens:
            def one(k: int) -> float:
                params = SamplingParams(temperature=args.temperature, max_tokens=k, ignore_eos=True)
                return timed(lambda: len(llm.generate(BATCH1_PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids))[1]
            _batch1_entry(res, one, args.batch1_tokens)
        return res
    finally:
        llm.shutdown()


# ---- nano-vLLM ---------------------------------------------------------------------------------------
class NanoVLLMUnavailable(Exception):
    """nano-vLLM cannot be imported here; the message is the one-line reason."""


def read_git_commit(root: str) -> str | None:
    """The commit a checkout's .git says HEAD is at (a .git folder or a 'gitdir:' file), or None."""
    git = os.path.join(root, ".git")
    if os.path.isfile(git):
        with open(git) as f:
            line = f.read().strip()
        if not line.startswith("gitdir:"):
            return None
        git = os.path.normpath(os.path.join(root, line[len("gitdir:"):].strip()))
    head_file = os.path.join(git, "HEAD")
    if not os.path.isfile(head_file):
        return None
    with open(head_file) as f:
        head = f.read().strip()
    if re.fullmatch(r"[0-9a-f]{40}", head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head[len("ref:"):].strip()
    loose = os.path.join(git, ref)
    if os.path.isfile(loose):
        with open(loose) as f:
            return f.read().strip() or None
    packed = os.path.join(git, "packed-refs")
    if os.path.isfile(packed):
        with open(packed) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    return None


def read_commit_file(root: str) -> str | None:
    """A commit recorded in a file of the checkout (a copy made without .git): COMMIT or REVISION."""
    for name in COMMIT_FILES:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path) as f:
                m = re.search(r"\b[0-9a-f]{7,40}\b", f.read())
            if m:
                return m.group(0)
    return None


def source_digest(package_dir: str) -> str:
    """sha256 (first 16 hex digits) over a package's .py files, names and contents: what ran, always knowable."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, package_dir).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:16]


def load_nanovllm(path: str | None):
    """Import nano-vLLM from a checkout folder (the one holding the nanovllm package) or, without a
    path, from an installed package. -> (module, info: source, version, commit, source_sha256).
    Raises NanoVLLMUnavailable with a one-line reason (nano-vLLM imports flash-attn at import time)."""
    if path:
        path = os.path.abspath(os.path.expanduser(path))
        if os.path.basename(path) == "nanovllm" and os.path.isfile(os.path.join(path, "__init__.py")):
            path = os.path.dirname(path)  # pointed at the package itself
        if not os.path.isfile(os.path.join(path, "nanovllm", "__init__.py")):
            raise NanoVLLMUnavailable(f"{path} holds no nanovllm package (NANOVLLM_PATH / --nanovllm-path must be "
                                      f"a nano-vLLM checkout)")
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        module = importlib.import_module("nanovllm")
    except Exception as e:  # ImportError (no flash_attn, no nanovllm) or anything its import raises
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        where = f" from {path}" if path else " (no NANOVLLM_PATH set and no installed nano-vllm)"
        raise NanoVLLMUnavailable(f"nano-vLLM does not import{where}: {type(e).__name__}: {msg}") from None
    package_dir = os.path.dirname(os.path.abspath(module.__file__))
    root = os.path.dirname(package_dir)
    info = {"source": root, "version": None, "commit": read_git_commit(root) or read_commit_file(root),
            "source_sha256": source_digest(package_dir)}
    pyproject = os.path.join(root, "pyproject.toml")
    if os.path.isfile(pyproject):
        with open(pyproject) as f:
            m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.MULTILINE)
        info["version"] = m.group(1) if m else None
    if info["version"] is None:
        from importlib.metadata import PackageNotFoundError, version
        try:
            info["version"] = version("nano-vllm")
        except PackageNotFoundError:
            pass
    return module, info


def _close_nanovllm(nano, llm) -> None:
    """nano-vLLM's own teardown (its LLM.exit: the model runner's exit, which destroys its process
    group, then the runner and its worker processes), unhooked from atexit so it does not run twice."""
    atexit.unregister(llm.exit)
    llm.exit()
    # get_rope is an lru_cache that keeps its last rotary module (and its CUDA buffer) alive
    rope = sys.modules.get(f"{nano.__name__}.layers.rotary_embedding")
    clear = getattr(getattr(rope, "get_rope", None), "cache_clear", None)
    if clear:
        clear()


def run_nanovllm(nano, path: str, work: Workload, subset: Workload | None, args) -> dict:
    """nano-vLLM's engine with its own bench settings (LLM(path, enforce_eager=False, max_model_len=4096),
    a one-request warm-up) on the same requests; its other settings are its defaults."""
    import torch
    res = {"engine": "nano-vLLM", "settings": f"LLM(model, enforce_eager=False, max_model_len="
           f"{max(NANOVLLM_MAX_MODEL_LEN, args.max_input_len + args.max_output_len)}, "
           f"tensor_parallel_size={args.tensor_parallel_size})"}
    default_dtype = torch.get_default_dtype()
    default_device = torch.get_default_device() if hasattr(torch, "get_default_device") else None
    llm = nano.LLM(path, enforce_eager=False, tensor_parallel_size=args.tensor_parallel_size,
                   max_model_len=max(NANOVLLM_MAX_MODEL_LEN, args.max_input_len + args.max_output_len))
    try:
        def generate(w: Workload) -> int:
            params = [nano.SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=n)
                      for n in w.output_lens]
            return sum(len(o["token_ids"]) for o in llm.generate(w.prompts, params, use_tqdm=False))

        llm.generate(["Benchmark: "], nano.SamplingParams(), use_tqdm=False)  # its bench.py's warm-up
        n_out, wall = timed(lambda: generate(work))
        _throughput_entry(res, work, n_out, wall)
        if subset:
            n, wall = timed(lambda: generate(subset))
            res["throughput"][str(subset.num_seqs)] = round(n / wall, 1)
        if args.batch1_tokens:
            # nano-vLLM refuses temperature 0 (greedy); every engine's batch-1 test samples at --temperature
            def one(k: int) -> float:
                params = [nano.SamplingParams(temperature=args.temperature, max_tokens=k, ignore_eos=True)]
                return timed(lambda: len(llm.generate([BATCH1_PROMPT], params, use_tqdm=False)[0]["token_ids"]))[1]
            _batch1_entry(res, one, args.batch1_tokens)
        return res
    finally:
        _close_nanovllm(nano, llm)
        del llm
        torch.set_default_dtype(default_dtype)  # nano-vLLM sets both while it builds; a failed build leaves them
        if default_device is not None:
            torch.set_default_device(default_device)


# ---- HF transformers -------------------------------------------------------------------------------
def _hf_preflight(device: str) -> None:
    """Raise ValueError where HF cannot be compared here (on a CPU it runs generate, run_hf_generate)."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"--compare hf runs on CUDA or a CPU, not on {device!r}")


def _load_hf_model(path: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=HF_ATTENTION)
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def _hf_generate(manager, prompts: list[list[int]], output_lens: list[int]) -> list[int]:
    """Submit requests to a started continuous-batching manager, each with its own output length,
    and wait for all of them. -> tokens generated per request, in order."""
    ids = [manager.add_request(input_ids=p, max_new_tokens=n, eos_token_id=-1) for p, n in zip(prompts, output_lens)]
    done: dict[str, int] = {}
    while len(done) < len(ids):
        out = manager.get_result(timeout=1)
        if out is not None and out.is_finished():
            done[out.request_id] = len(out.generated_tokens)
        elif out is None and not manager.is_running():
            raise RuntimeError(f"HF's generation thread stopped with {len(ids) - len(done)} requests unfinished")
    return [done[i] for i in ids]


def run_hf(path: str, dtype, work: Workload, args) -> dict:
    """HF transformers' continuous batching (attention 'paged|sdpa') on the same requests, each with
    its own output length: generate_batch's loop (one manager, warmed up, CUDA graphs captured)
    with per-request max_new_tokens, timed from the first request submitted to the last finished."""
    import inspect

    import torch
    import transformers
    from transformers import GenerationConfig
    model = _load_hf_model(path, dtype)
    res = {"engine": "HF transformers", "version": transformers.__version__, "attn_implementation": HF_ATTENTION}
    cfg = GenerationConfig(max_new_tokens=max(work.output_lens), do_sample=True, temperature=args.temperature,
                           eos_token_id=None, pad_token_id=0)
    kwargs = dict(generation_config=cfg, block=True, timeout=30)
    if "workload_hints" in inspect.signature(model.continuous_batching_context_manager).parameters:
        from transformers.generation.continuous_batching.utils import WorkloadHints
        kwargs["workload_hints"] = WorkloadHints(max_prompt_length=max(map(len, work.prompts)),
                                                 max_generated_length=max(work.output_lens),
                                                 num_requests=work.num_seqs)
    with torch.no_grad(), model.continuous_batching_context_manager(**kwargs) as manager:
        warm = work.warmup()
        _hf_generate(manager, warm.prompts, warm.output_lens)
        n_out, wall = timed(lambda: sum(_hf_generate(manager, work.prompts, work.output_lens)))
        _throughput_entry(res, work, n_out, wall)
        if args.batch1_tokens:
            def one(k: int) -> float:
                return timed(lambda: _hf_generate(manager, [BATCH1_PROMPT], [k])[0])[1]
            _batch1_entry(res, one, args.batch1_tokens)
    return res


def run_hf_generate(path: str, dtype, work: Workload, args) -> dict:
    """HF transformers on a CPU, where its continuous batching does not run: `generate` with every
    request in one left-padded batch (static batching), sampled until the longest output length and
    each request credited with its own length, timed end to end; batch-1 decode as on CUDA."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    res = {"engine": "HF transformers", "version": transformers.__version__,
           "settings": "generate, one left-padded batch of every request (static batching), SDPA attention"}
    width, longest = max(map(len, work.prompts)), max(work.output_lens)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in work.prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in work.prompts])

    def generate(input_ids, attention_mask, k: int):
        return model.generate(input_ids, attention_mask=attention_mask, do_sample=True, temperature=args.temperature,
                              top_k=0, top_p=1.0, max_new_tokens=k, min_new_tokens=k, eos_token_id=None,
                              pad_token_id=0)
    with torch.no_grad():
        generate(ids[:1, -8:], mask[:1, -8:], 4)  # warm-up
        out, wall = timed(lambda: generate(ids, mask, longest))
        generated = out.shape[1] - width  # (every row runs to the longest: EOS is off)
        _throughput_entry(res, work, sum(min(n, generated) for n in work.output_lens), wall)
        if args.batch1_tokens:
            one_ids = torch.tensor([BATCH1_PROMPT])

            def one(k: int) -> float:
                return timed(lambda: generate(one_ids, torch.ones_like(one_ids), k))[1]
            _batch1_entry(res, one, args.batch1_tokens)
    return res


# ---- the run -----------------------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _prepare(args) -> dict:
    """Resolve the model and the run's device and dtype; check every requested engine before any runs.
    -> plan: path, model config, device, dtype, runnable backends, every engine's name in the order they
    run ("order"; skipped ones in their place), the skipped ones and why, nano-vLLM."""
    from minillm.config import EngineConfig, ModelConfig
    from minillm.layers.attention import backend_for, get_backend
    from minillm.model_zoo import resolve_model
    path = resolve_model(args.model)
    mc = ModelConfig.from_folder(path)
    plan = {"path": path, "model_config": mc, "backends": [], "order": [], "skipped": {}, "nano": None}
    for backend in args.attention_backend:
        cfg = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, attention_backend=backend,
                           tensor_parallel_size=args.tensor_parallel_size,
                           max_model_len=max(args.max_model_len, args.max_input_len + args.max_output_len),
                           max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
        try:
            cfg.validate(mc)
            backend_for(cfg)  # the backend's own rules (flash-attn: installed, CUDA, dtype, block size)
        except ValueError as e:
            if len(args.attention_backend) == 1:
                raise
            plan["skipped"][f"minillm-{backend}"] = str(e)
            plan["order"].append(f"minillm-{backend}")
            continue
        if backend == "auto":  # name the run after what 'auto' picks here
            backend = get_backend("auto", cfg.device).name
        if backend in plan["backends"]:
            continue
        plan["backends"].append(backend)
        plan["order"].append(f"minillm-{backend}")
        plan["device"], plan["dtype"] = cfg.device, cfg.torch_dtype
    if not plan["backends"]:
        raise ValueError("no requested attention backend can run here: "
                         + "; ".join(f"{k}: {v}" for k, v in plan["skipped"].items()))
    if "hf" in args.compare:
        _hf_preflight(plan["device"])
    if "nanovllm" in args.compare:
        plan["order"].append("nanovllm")
        try:
            plan["nano"] = load_nanovllm(args.nanovllm_path)
        except NanoVLLMUnavailable as e:
            plan["skipped"]["nanovllm"] = str(e)
    if "hf" in args.compare:
        plan["order"].append("hf")
    return plan


def run_bench(args) -> dict:
    """Run the benchmark the arguments describe (add_bench_args); print and return its result."""
    if getattr(args, "bench_mode", None) == "serve":
        from minillm.bench_serve import run_bench_serve
        return run_bench_serve(args)
    import torch

    from minillm.timing import describe_device, device_ceilings
    check_args(args)
    plan = _prepare(args)
    for name, why in plan["skipped"].items():
        _log(f"{name} skipped: {why}")
    mc, dtype = plan["model_config"], plan["dtype"]
    work = Workload(*make_workload(args.num_seqs, args.min_len, args.max_input_len, args.max_output_len))
    n_sub = args.hf_num_seqs
    # the requests HF runs when it runs only some, fresh: the other engines run them after the whole
    # workload, whose cached prefixes they must not reuse
    subset = work.first(n_sub).fresh() if n_sub else None
    device = "cpu" if args.device == "cpu" else None  # a CPU run on a GPU machine: the CPU's ceilings
    ceil = device_ceilings(dtype, device)  # measured before any engine holds memory
    floors = {n: workload_floor(mc, dtype.itemsize, map(len, work.prompts[:n]), work.output_lens[:n],
                                ceil.copy_gbps, ceil.matmul_tflops) for n in {work.num_seqs, n_sub or work.num_seqs}}
    weights, _, _ = model_bytes(mc, dtype.itemsize)
    batch1_floor_ms = weights / (ceil.copy_gbps * 1e9) * 1e3
    full = floors[work.num_seqs]
    result = {
        "device": describe_device(device), "model": args.model, "dtype": str(dtype).removeprefix("torch."),
        "tensor_parallel_size": args.tensor_parallel_size,
        "workload": {"num_seqs": work.num_seqs, "seed": 0, "prompt_tokens": work.prompt_tokens,
                     "output_tokens": work.output_tokens, "min_len": args.min_len,
                     "max_input_len": args.max_input_len, "max_output_len": args.max_output_len,
                     "temperature": args.temperature, "ignore_eos": True},
        "hf_num_seqs": n_sub,
        "copy_gbps": round(ceil.copy_gbps, 1), "matmul_tflops": _round_rate(ceil.matmul_tflops),
        "floor_s": round(full["floor_s"], 3), "floor_tok_s": round(full["floor_tok_s"], 1),
        "floor_prefill_s": round(full["floor_prefill_s"], 3), "floor_decode_s": round(full["floor_decode_s"], 3),
        "batch1_floor_ms_per_token": round(batch1_floor_ms, 4),
        "engines": {name: {"skipped": plan["skipped"][name]} if name in plan["skipped"] else {"pending": True}
                    for name in plan["order"]},
        "ratios": {},
    }
    if n_sub:
        result["floor_tok_s_subset"] = round(floors[n_sub]["floor_tok_s"], 1)
    minillm_commit = read_git_commit(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if minillm_commit:
        result["minillm_commit"] = minillm_commit  # what .git's HEAD says: the tree may differ (uncommitted work)
    # what ran, always: a copy of a working tree can carry a stale .git, and a checkout can be dirty
    result["minillm_source_sha256"] = source_digest(os.path.dirname(os.path.abspath(__file__)))

    runs: list[tuple[str, Callable[[], dict]]] = [
        (f"minillm-{b}", lambda b=b: run_minillm(args, b, work, subset)) for b in plan["backends"]]
    if plan["nano"] is not None:
        nano, info = plan["nano"]
        runs.append(("nanovllm", lambda: {**info, **run_nanovllm(nano, plan["path"], work, subset, args)}))
    if "hf" in args.compare:
        hf = run_hf if plan["device"] == "cuda" else run_hf_generate
        runs.append(("hf", lambda: hf(plan["path"], dtype, subset or work, args)))

    baseline = release_gpu()
    for name, run in runs:
        _log(f"{name}: running")
        if name == "nanovllm" and torch.distributed.is_available() and torch.distributed.is_initialized():
            res = {"error": "a torch.distributed process group is still alive; nano-vLLM creates its own"}
        else:
            try:
                res = run()
            except Exception as e:  # one engine failing must not lose the others' figures
                if os.environ.get("MINILLM_DEBUG"):  # the CLI's switch for tracebacks
                    traceback.print_exc(file=sys.stderr)
                res = {"error": _one_line(e)}
        try:
            left = release_gpu()
        except Exception as e:  # a sticky CUDA error (e.g. an illegal address): no engine can run after it
            res["error"] = f"{res.get('error', 'ran')}; the device is unusable after it: {_one_line(e)}"
            result["engines"][name] = res
            _log(f"{name} failed: {res['error']}")
            break
        if left is not None:
            res["gpu_gib_left_after_release"] = left
            if left - (baseline or 0.0) > LEAK_WARN_GIB:
                _log(f"{name} left {left:.1f} GiB allocated after its release: the next engine's KV cache is smaller")
        for n, tok_s in res.get("throughput", {}).items():
            res.setdefault("fraction_of_floor_by_num_seqs", {})[n] = round(tok_s / floors[int(n)]["floor_tok_s"], 3)
        if "output_tok_s" in res:
            res["fraction_of_floor"] = res["fraction_of_floor_by_num_seqs"][str(res["num_seqs"])]
            _log(f"{name}: {res['output_tok_s']:,.1f} tok/s over {res['num_seqs']} requests "
                 f"({res['fraction_of_floor']:.1%} of the floor)")
        if res.get("batch1_ms_per_token", 0) > 0:  # a stand-in that takes no time measures ~0
            res["batch1_fraction_of_floor"] = round(batch1_floor_ms / res["batch1_ms_per_token"], 3)
        if "error" in res:
            _log(f"{name} failed: {res['error']}")
        result["engines"][name] = res
        result["ratios"] = like_for_like_ratios(result["engines"])
        _write_json(args.json_file, result, complete=False)

    result.update(_legacy_keys(result))
    _write_json(args.json_file, result, complete=True)
    table = format_table(result)
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps(result))
    else:
        print(table)
    failed = [n for n, e in result["engines"].items() if "error" in e]
    if failed:
        raise RuntimeError(f"bench: {', '.join(failed)} failed (see the errors above and in the JSON)")
    return result


def _write_json(path: str | None, result: dict, complete: bool) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({**result, "complete": complete}, f, indent=1)


def _round_rate(x: float) -> float:
    """A measured rate for the JSON: one decimal, or three significant digits below 1 (a CPU's ~0.2 TFLOP/s)."""
    return round(x, 1) if x >= 1 else float(f"{x:.3g}")


def _rate_text(x: float) -> str:
    """A measured rate for the table: whole numbers from 10 up, two significant digits below (0.2, not 0)."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def format_table(result: dict) -> str:
    """The run as a table: each engine's throughput and batch-1 time as fractions of the floor, and
    its ratio to every later engine on the requests both ran (the count in brackets)."""
    w = result["workload"]
    lines = [f"{result['model']} ({result['dtype']}) on {result['device']}",
             f"workload: {w['num_seqs']} requests, {w['prompt_tokens']:,} prompt + {w['output_tokens']:,} output "
             f"tokens; floor {result['floor_s']:.2f} s = {result['floor_tok_s']:,.0f} tok/s "
             f"({result['copy_gbps']:,.0f} GB/s, {_rate_text(result['matmul_tflops'])} TFLOP/s measured); "
             f"batch-1 floor {result['batch1_floor_ms_per_token']:.3f} ms/token"]
    names = list(result["engines"])
    ran = [n for n in names if "output_tok_s" in result["engines"][n]]
    head = f"{'engine':<20}{'requests':>9}{'tok/s':>11}{'of floor':>10}{'b1 ms/tok':>11}{'of floor':>10}"
    lines.append(head + "".join(f"{'x ' + n:>24}" for n in ran[1:]))
    for name in names:
        e = result["engines"][name]
        if "output_tok_s" not in e:
            state = "failed" if "error" in e else "skipped" if "skipped" in e else "not run"
            lines.append(f"{name:<20}  {state}: {e.get('error') or e.get('skipped') or 'no result'}")
            continue
        b1 = e.get("batch1_ms_per_token") if "batch1_fraction_of_floor" in e else None
        row = (f"{name:<20}{e['num_seqs']:>9}{e['output_tok_s']:>11,.0f}{e['fraction_of_floor']:>10.1%}"
               + (f"{b1:>11.3f}{e['batch1_fraction_of_floor']:>10.1%}" if b1 else f"{'-':>11}{'-':>10}"))
        for other in ran[1:]:
            r = result["ratios"].get(f"{name}/{other}") if ran.index(other) > ran.index(name) else None
            cell = f"{r['ratio']:.2f} ({r['num_seqs']})" if r else ""
            row += f"{cell:>24}"
        lines.append(row)
    for name, e in result["engines"].items():
        if e.get("engine") == "nano-vLLM":
            lines.append(f"nano-vLLM {e.get('version')} commit {e.get('commit') or 'unknown'} "
                         f"(source sha256 {e.get('source_sha256')}) from {e.get('source')}")
    return "\n".join(lines)
