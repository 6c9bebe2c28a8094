"""`python -m minillm bench`: nano-vLLM's throughput workload, its bandwidth floor, and HF beside it.

Workload: 256 requests (seed 0), prompt and output lengths uniform in [100, 1024], random token ids
in [0, 10000], EOS ignored, temperature 0.6. Throughput = output tokens / wall time.

The floor is the time the device needs at its measured ceilings (copy bandwidth, matmul rate),
assuming every request runs from the start: each decode step reads all weights once plus the K/V
of every running request; prefill does 2 * params * prompt tokens (+ attention) FLOPs.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time

import numpy as np


def make_workload(num_seqs: int, min_len: int, max_input_len: int, max_output_len: int, seed: int = 0):
    """-> (prompt token-id lists, output lengths), drawn the way nano-vLLM's bench.py draws them."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(min_len, max_input_len))] for _ in range(num_seqs)]
    outputs = [rng.randint(min_len, max_output_len) for _ in range(num_seqs)]
    return prompts, outputs


def model_bytes(mc, dtype_bytes: int) -> tuple[float, float, float]:
    """-> (bytes of weights read per decode step, K/V bytes per token, non-embedding parameters)."""
    h, i, L, d = mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers, mc.head_dim
    H, Hkv = mc.num_attention_heads, mc.num_key_value_heads
    per_layer = h * (H + 2 * Hkv) * d + H * d * h + 2 * h * i + i * h + 2 * h
    non_embedding = L * per_layer + h
    weights = (non_embedding + mc.vocab_size * h) * dtype_bytes  # + the LM head, read whole every step
    kv_per_token = 2 * L * Hkv * d * dtype_bytes
    return weights, kv_per_token, non_embedding


def workload_floor(mc, dtype_bytes: int, prompt_lens, output_lens, copy_gbps: float, matmul_tflops: float) -> dict:
    """Seconds the device needs at its ceilings for this workload (see the module docstring)."""
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


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="qwen3-0.6b-random")
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--max-output-len", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--no-async", action="store_true", help="read each step's tokens back before the next")
    p.add_argument("--batch1-tokens", type=int, default=256, help="batch-1 decode test length (0: skip)")
    p.add_argument("--compare", choices=["hf"], default=None, help="also run HF transformers in this run")
    p.add_argument("--hf-num-seqs", type=int, default=32, help="requests of the HF comparison subset")
    p.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")


def _batch1(llm, n_tokens: int) -> dict:
    """Decode time per token at batch 1: (t(1 + n tokens) - t(1 token)) / n, prompt of 128 tokens."""
    from minillm import SamplingParams
    prompt = list(range(1000, 1128))

    def run(n):
        t0 = time.perf_counter()
        llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t0
    run(n_tokens + 1)  # warm-up
    t_first = min(run(1) for _ in range(3))
    t_all = min(run(n_tokens + 1) for _ in range(3))
    return {"batch1_ms_per_token": round(1e3 * (t_all - t_first) / n_tokens, 4)}


def _run_hf(path: str, prompts, max_new_tokens: int, temperature: float) -> dict:
    """HF transformers continuous batching (generate_batch, attention 'paged|sdpa') on the same requests."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="paged|sdpa")
    model = model.to("cuda").eval()
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                           eos_token_id=None, pad_token_id=0)
    model.generate_batch(inputs=[p[:64] for p in prompts[:4]], generation_config=GenerationConfig(
        max_new_tokens=8, do_sample=True, temperature=temperature, eos_token_id=None, pad_token_id=0))  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=prompts, generation_config=cfg)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    n = sum(len(o.generated_tokens) for o in out.values())
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"hf_output_tokens": n, "hf_wall_s": round(wall, 3), "hf_tok_s": round(n / wall, 1)}


def run_bench(args) -> dict:
    import torch

    from minillm import LLM, SamplingParams
    from minillm.course.timing import describe_device, device_ceilings

    prompts, out_lens = make_workload(args.num_seqs, args.min_len, args.max_input_len, args.max_output_len)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=max(args.max_model_len, args.max_input_len + args.max_output_len),
              enforce_eager=args.enforce_eager, async_scheduling=not args.no_async)
    engine, cfg = llm.engine, llm.config
    ceil = device_ceilings(cfg.torch_dtype)
    result = {"device": describe_device(), "model": args.model, "dtype": cfg.dtype,
              "attention_backend": engine.model_runner.backend.name,
              "cuda_graphs": getattr(engine.model_runner, "graphs", None) is not None,
              "async_scheduling": engine.async_scheduling,
              "copy_gbps": round(ceil.copy_gbps, 1), "matmul_tflops": round(ceil.matmul_tflops, 1)}
    params = [SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=n) for n in out_lens]
    # warm-up, twice: the second run hits the prefix cache, so the paged prefill kernel compiles now too
    # (Triton compiles each kernel variant on first use; a compile inside the timed run costs ~1 s)
    for _ in range(2):
        llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    p0, d0 = engine.num_prefill_tokens, engine.num_decode_tokens
    ps0, ds0 = engine.phase_seconds["prefill"], engine.phase_seconds["decode"]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.json)
    sync()
    wall = time.perf_counter() - t0
    n_out = sum(len(o["token_ids"]) for o in outputs)
    floor = workload_floor(engine.model_config, cfg.torch_dtype.itemsize, map(len, prompts), out_lens,
                           ceil.copy_gbps, ceil.matmul_tflops)
    result.update({
        "num_seqs": args.num_seqs, "prompt_tokens": sum(map(len, prompts)), "output_tokens": n_out,
        "wall_s": round(wall, 3), "output_tok_s": round(n_out / wall, 1),
        "prefill_tokens": engine.num_prefill_tokens - p0, "decode_tokens": engine.num_decode_tokens - d0,
        "prefill_s": round(engine.phase_seconds["prefill"] - ps0, 3), "decode_s": round(engine.phase_seconds["decode"] - ds0, 3),
        "floor_s": round(floor["floor_s"], 3), "floor_tok_s": round(floor["floor_tok_s"], 1),
        "fraction_of_floor": round(floor["floor_s"] / wall, 3),
    })
    # per phase: tokens over the wall time of the steps that read back batches of that phase
    result["prefill_tok_s"] = round(result["prefill_tokens"] / max(result["prefill_s"], 1e-9), 1)
    result["decode_tok_s"] = round(result["decode_tokens"] / max(result["decode_s"], 1e-9), 1)
    result["floor_prefill_s"], result["floor_decode_s"] = round(floor["floor_prefill_s"], 3), round(floor["floor_decode_s"], 3)
    weights, _, _ = model_bytes(engine.model_config, cfg.torch_dtype.itemsize)
    if args.batch1_tokens:
        result.update(_batch1(llm, args.batch1_tokens))
        floor_ms = weights / (ceil.copy_gbps * 1e9) * 1e3
        result["batch1_floor_ms_per_token"] = round(floor_ms, 4)
        result["batch1_fraction_of_floor"] = round(floor_ms / result["batch1_ms_per_token"], 3)
    if args.compare == "hf":
        if not torch.cuda.is_available():
            raise ValueError("--compare hf runs HF's continuous batching on CUDA; no CUDA device here")
        sub = prompts[:args.hf_num_seqs]
        new = int(round(float(np.mean(out_lens[:args.hf_num_seqs]))))
        sub_params = SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=new)
        t0 = time.perf_counter()
        sub_out = llm.generate(sub, sub_params, use_tqdm=False)
        sub_wall = time.perf_counter() - t0
        result["hf_subset"] = f"first {len(sub)} requests, {new} new tokens each"
        result["minillm_subset_tok_s"] = round(sum(len(o["token_ids"]) for o in sub_out) / sub_wall, 1)
        path = llm.model_path
        llm.shutdown()
        del llm, engine
        gc.collect()
        torch.cuda.empty_cache()
        result.update(_run_hf(path, sub, new, args.temperature))
        result["speedup_vs_hf"] = round(result["output_tok_s"] / result["hf_tok_s"], 2)
        result["speedup_vs_hf_same_subset"] = round(result["minillm_subset_tok_s"] / result["hf_tok_s"], 2)
    else:
        llm.shutdown()
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:>{width}}: {v}", file=sys.stdout)
    return result
