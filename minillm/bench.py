"""`python -m minillm bench`: nano-vLLM's throughput workload.

256 requests (seed 0), prompt and output lengths uniform in [100, 1024], random token ids in
[0, 10000], EOS ignored, temperature 0.6. Throughput = output tokens / wall time.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time


def make_workload(num_seqs: int, min_len: int, max_input_len: int, max_output_len: int, seed: int = 0):
    """-> (prompt token-id lists, output lengths), exactly as nano-vLLM's bench.py draws them."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(min_len, max_input_len))] for _ in range(num_seqs)]
    outputs = [rng.randint(min_len, max_output_len) for _ in range(num_seqs)]
    return prompts, outputs


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
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def run_bench(args) -> dict:
    from minillm import LLM, SamplingParams

    prompts, out_lens = make_workload(args.num_seqs, args.min_len, args.max_input_len, args.max_output_len)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=max(args.max_model_len, args.max_input_len + args.max_output_len),
              enforce_eager=args.enforce_eager)
    params = [SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=n) for n in out_lens]
    llm.generate(["Benchmark warm-up"], SamplingParams(max_tokens=4), use_tqdm=False)
    engine = llm.engine
    p0, d0 = engine.num_prefill_tokens, engine.num_decode_tokens
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.json)
    wall = time.perf_counter() - t0
    n_out = sum(len(o["token_ids"]) for o in outputs)
    result = {
        "model": args.model, "device": llm.config.device, "num_seqs": args.num_seqs,
        "prompt_tokens": sum(map(len, prompts)), "output_tokens": n_out, "wall_s": round(wall, 3),
        "output_tok_s": round(n_out / wall, 1),
        "prefill_tokens_computed": engine.num_prefill_tokens - p0,
        "decode_steps_tokens": engine.num_decode_tokens - d0,
    }
    llm.shutdown()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>24}: {v}", file=sys.stdout)
    return result
