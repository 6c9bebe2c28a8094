"""Command line: python -m minillm generate | chat | bench."""
from __future__ import annotations

import argparse
import sys
import time


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="embedded name, model folder or hub id")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton", "flash_attn"])
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs")


def _sampling_args(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=temperature)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)


def _make_llm(args):
    from minillm import LLM
    return LLM(args.model, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
               max_model_len=args.max_model_len, tensor_parallel_size=args.tensor_parallel_size,
               enforce_eager=args.enforce_eager, max_num_seqs=16)


def _params(args):
    from minillm import SamplingParams
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          max_tokens=args.max_tokens, seed=args.seed)


def _stream(llm, prompt, params) -> str:
    """Print the reply as it is generated, then its token count and speed. -> the reply text."""
    t0, text = time.perf_counter(), []
    for delta in llm.stream(prompt, params):
        text.append(delta)
        print(delta, end="", flush=True)
    dt = time.perf_counter() - t0
    n = len(llm.last_output["token_ids"])
    print(f"\n[{n} tokens in {dt:.2f} s, {n / dt:.1f} tokens/s]", file=sys.stderr)
    return "".join(text)


def cmd_generate(args) -> None:
    llm = _make_llm(args)
    _stream(llm, args.prompt, _params(args))
    llm.shutdown()


def cmd_chat(args) -> None:
    llm = _make_llm(args)
    params = _params(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    turns = [args.message] if args.message else None
    if turns is None:
        print(f"minillm chat with {args.model} (empty line or Ctrl-D to quit)", file=sys.stderr)
    while True:
        if turns is not None:
            if not turns:
                break
            user = turns.pop(0)
            print(f"> {user}")
        else:
            try:
                user = input("> ")
            except EOFError:
                break
            if not user.strip():
                break
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": _stream(llm, messages, params)})
    llm.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete one prompt, streaming the text")
    g.add_argument("prompt")
    _engine_args(g)
    _sampling_args(g, temperature=0.0)
    c = sub.add_parser("chat", help="chat with a model (interactive, or one --message)")
    c.add_argument("--message", default=None, help="answer this one message and exit")
    c.add_argument("--system", default=None, help="system prompt")
    _engine_args(c)
    _sampling_args(c, temperature=0.0)
    b = sub.add_parser("bench", help="throughput benchmark (nano-vLLM's workload)")
    from minillm.bench import add_bench_args
    add_bench_args(b)
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            cmd_generate(args)
        elif args.command == "chat":
            cmd_chat(args)
        else:
            from minillm.bench import run_bench
            run_bench(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
