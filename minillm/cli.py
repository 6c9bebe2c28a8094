"""Command line: python -m minillm generate | chat | bench | serve.

Every error is one line on stderr, "error: ...", with exit status 2 for bad input (arguments, model
files, prompts) and 1 for anything else (MINILLM_DEBUG=1 shows its traceback). A closed pipe
(`... | head -c1`) and Ctrl-C end quietly.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

MODEL_DEFAULT = "smollm2-135m"
EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader went away


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (its default prints the usage first), each pointing to the
    help of the command it is about (`python -m minillm serve --help`)."""

    commands = None  # the top-level parser's subparsers action (add_subparsers)

    def error(self, message: str):
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)

    def add_subparsers(self, **kwargs):
        self.commands = super().add_subparsers(**kwargs)
        return self.commands

    def parse_args(self, args=None, namespace=None):
        # argparse reports a subcommand's unknown arguments from the top-level parser, whose help lists
        # only the commands: let the subcommand's parser report them, with its own help
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self
            while parser.commands is not None:  # down to the innermost command given (`bench serve`)
                inner = parser.commands.choices.get(getattr(parsed, parser.commands.dest, None))
                if inner is None:
                    break
                parser = inner
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=f"embedded name, model folder or hub id (default {MODEL_DEFAULT})")
    p.add_argument("--tokenizer", default=None,
                   help="another folder's (or embedded model's) tokenizer, as vLLM's (default: the model's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton", "flash_attn"])
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs")
    # vLLM's names; left out, the engine's defaults (EngineConfig)
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="CUDA: the share of the GPU's memory the engine may fill, KV cache included (default 0.9)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse the KV blocks of prompts' shared prefixes (default: on)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV-cache block (default 256)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                   help="CUDA: the KV cache's size in bytes, instead of what --gpu-memory-utilization leaves")
    p.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="the number of KV-cache blocks, instead of what the memory allows")
    p.add_argument("--generation-config", choices=["auto", "vllm"], default=None,
                   help="auto (default): sampling defaults from the model's generation_config.json; vllm: ignore it")
    p.add_argument("--trust-remote-code", action="store_true", default=None,
                   help="accepted as vLLM takes it; minillm runs no code from a checkpoint, so it allows nothing")
    p.add_argument("--logprobs-mode", default=None,
                   choices=["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"],
                   help="what logprobs report (vLLM's; generate and chat print them with --logprobs K): "
                        "raw_logprobs (default), the model's own distribution; processed_*: after penalties, "
                        "temperature, min_p, top-k and top-p; *_logits: logits")


def _sampling_args(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=temperature)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    from minillm.sampling_params import MAX_LOGPROBS
    p.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help=f"after the text, a table of each generated token's logprob, its rank and the K most likely "
                        f"tokens' (K in [0, {MAX_LOGPROBS}]; --logprobs-mode picks the values)")


def _llm_args(args, **more) -> dict:
    """The engine arguments of _engine_args, for LLM(args.model, **them); those left out are not passed."""
    given = dict(device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
                 max_model_len=args.max_model_len, tensor_parallel_size=args.tensor_parallel_size,
                 enforce_eager=args.enforce_eager)
    for name in ("tokenizer", "gpu_memory_utilization", "enable_prefix_caching", "block_size", "kv_cache_memory_bytes",
                 "num_gpu_blocks_override", "generation_config", "trust_remote_code", "logprobs_mode"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    return dict(given, **more)


def _make_llm(args):
    from minillm import LLM
    return LLM(args.model, **_llm_args(args, max_num_seqs=16))


def _params(args):
    from minillm import SamplingParams
    if args.logprobs_mode is not None and args.logprobs is None:  # generate and chat print logprobs only then
        raise ValueError(f"--logprobs-mode {args.logprobs_mode} picks what --logprobs K prints; give --logprobs too")
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          max_tokens=args.max_tokens, seed=args.seed, logprobs=args.logprobs)


def _stream(llm, prompt, params) -> str:
    """Print the reply as it is generated, then its token count and speed, then (params.logprobs set) its
    logprobs table. -> the reply text."""
    t0, text = time.perf_counter(), []
    with llm.stream(prompt, params) as stream:
        for delta in stream:
            text.append(delta)
            print(delta, end="", flush=True)
    dt = time.perf_counter() - t0
    completion = stream.output.outputs[0]
    n = len(completion.token_ids)
    print(f"\n[{n} tokens in {dt:.2f} s, {n / dt:.1f} tokens/s]", file=sys.stderr)
    if params.logprobs is not None:
        print("\n" + logprobs_table(completion.logprobs, params.logprobs, llm.config.logprobs_mode), flush=True)
    return "".join(text)


def logprobs_table(logprobs: list[dict], k: int, mode: str) -> str:
    """A completion's logprobs (one {token id: Logprob} per generated token, the chosen token first) as text:
    a header naming `mode` (what the values are: logprobs or logits), then a row per token with its
    position, its text (repr: spaces and newlines show), its value, its rank and the k most likely tokens
    with theirs."""
    rows = []
    for pos, entry in enumerate(logprobs):
        chosen = next(iter(entry.values()))
        top = sorted(entry.values(), key=lambda lp: lp.rank)[:k]
        rows.append((str(pos), repr(chosen.decoded_token), f"{chosen.logprob:.4f}", str(chosen.rank),
                     "  ".join(f"{lp.decoded_token!r} {lp.logprob:.4f}" for lp in top)))
    value = "logit" if mode.endswith("_logits") else "logprob"
    header = ("#", "token", value, "rank", f"top {k}" if k else "")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    lines = [f"{mode} of the {len(rows)} generated tokens:"]
    for row in [header, *rows]:  # numbers right-aligned, text left
        lines.append(f"{row[0]:>{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]:>{widths[3]}}  "
                     f"{row[4]}".rstrip())
    return "\n".join(lines)


def _turns(args):
    """The user's messages: the one --message, or lines read from stdin until an empty line or its end."""
    if args.message is not None:
        print(f"> {args.message}")
        yield args.message
        return
    print(f"minillm chat with {args.model} (empty line or Ctrl-D to quit)", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            return
        except UnicodeDecodeError as e:
            raise ValueError(f"stdin is not valid UTF-8 (byte {e.start} of a line: {e.reason})") from None
        if not line.strip():
            return
        yield line


def cmd_generate(args) -> None:
    params = _params(args)  # bad sampling values fail before the model loads
    with _make_llm(args) as llm:
        _stream(llm, args.prompt, params)


def cmd_chat(args) -> None:
    if args.message is not None and not args.message.strip():
        raise ValueError("--message is empty; give the message text, or leave --message out to chat interactively")
    params = _params(args)
    with _make_llm(args) as llm:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        for user in _turns(args):
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": _stream(llm, messages, params)})


def check_bench_args(args) -> None:
    """The bench arguments minillm.bench.check_args leaves alone: lengths and temperature.
    Raise ValueError naming the argument and the fix."""
    from minillm.bench import fill_workload_defaults
    fill_workload_defaults(args)
    if args.min_len < 1:
        raise ValueError(f"--min-len must be at least 1, got {args.min_len}")
    for name in ("max_input_len", "max_output_len"):
        if getattr(args, name) < args.min_len:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} is below --min-len={args.min_len}; "
                             f"lengths are drawn from [--min-len, --{name.replace('_', '-')}]")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")


def cmd_bench(args) -> None:
    from minillm.bench import run_bench
    check_bench_args(args)
    run_bench(args)


def _listen(host: str, port: int):
    """A socket bound to host:port and listening (before the model loads: a taken port fails at once)."""
    import socket
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {port}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def cmd_serve(args) -> None:
    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be at least 1, got {args.max_waiting}")
    if args.max_num_seqs < 1:
        raise ValueError(f"--max-num-seqs must be at least 1, got {args.max_num_seqs}")
    if args.stream_interval < 1:
        raise ValueError(f"--stream-interval must be at least 1, got {args.stream_interval}")
    if args.max_num_batched_tokens < 1:
        raise ValueError(f"--max-num-batched-tokens must be at least 1, got {args.max_num_batched_tokens}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty; give the key clients must send, or leave --api-key out")
    if not args.response_role.strip():
        raise ValueError("--response-role is empty; give the role chat answers carry (default assistant)")
    if args.served_model_name is not None and not all(n.strip() for n in args.served_model_name):
        raise ValueError("--served-model-name has an empty name; give the names clients send, or leave it out")
    chat_template = None if args.chat_template is None else load_chat_template(args.chat_template)
    sock = _listen(args.host, args.port)
    try:
        from minillm.serving.server import serve
        llm_args = _llm_args(args, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
        llm_args.update({name: getattr(args, name) for name in ("seed", "enable_chunked_prefill")
                         if getattr(args, name) is not None})
        serving_args = dict(max_waiting=args.max_waiting, static_batching=args.batching == "static",
                            stream_interval=args.stream_interval)
        if args.engine_core == "process":
            from minillm.serving.engine_core import EngineCoreClient
            async_llm = EngineCoreClient(args.model, llm_args, **serving_args)
        else:
            from minillm import LLM
            from minillm.serving.async_engine import AsyncLLM
            async_llm = AsyncLLM(LLM(args.model, **llm_args), **serving_args)
        try:
            names = args.served_model_name or [args.model]
            host, port = sock.getsockname()[:2]
            print(f"minillm serves {', '.join(map(repr, names))} at http://{host}:{port}/v1 (OpenAI API; chat page "
                  f"at /, metrics at /metrics; Ctrl-C stops)", file=sys.stderr)
            # while it serves, serve() handles SIGTERM itself; before and after (the model loading), let
            # a SIGTERM be an exit, so the finally below frees the engine (the default would kill the process)
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
            serve(async_llm, names, sock, api_key=args.api_key, model=args.model, allowed_origins=args.allowed_origins,
                  allowed_methods=args.allowed_methods, allowed_headers=args.allowed_headers,
                  allow_credentials=args.allow_credentials, chat_template=chat_template,
                  response_role=args.response_role, enable_request_id_headers=args.enable_request_id_headers,
                  log_level=args.uvicorn_log_level,
                  access_log=not args.disable_uvicorn_access_log)
        finally:
            async_llm.shutdown()
            print("minillm: the server has stopped and the engine is shut down", file=sys.stderr)
    finally:
        sock.close()


def load_chat_template(value: str) -> str:
    """serve's --chat-template, as vLLM reads it: the path of a file holding a Jinja template, or the template
    itself (text with a '{', '}' or newline in it), whose backslash escapes (\\n) are read as Python's. -> the
    template, checked for Jinja syntax, or ValueError."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    if os.path.isfile(value):
        from minillm.config import read_text
        template, where = read_text(value), f"the file {value!r}"
    elif any(c in value for c in "{}\n"):
        where = "the template given"
        try:  # vLLM's codecs.decode(value, "unicode_escape"), with the characters past latin-1 kept as they are
            template = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError as e:
            raise ValueError(f"--chat-template: {where} has a broken backslash escape at character {e.start}: "
                             f"{e.reason}") from None
    else:
        raise ValueError(f"--chat-template {value!r}: no such file, and no Jinja template either (it has no '{{'); "
                         f"give the path of a template file, or the template itself")
    try:
        ImmutableSandboxedEnvironment().parse(template)
    except TemplateSyntaxError as e:
        raise ValueError(f"--chat-template: {where} is not a valid Jinja template: line {e.lineno}: {e.message}") \
            from None
    return template


def _pick_model(args) -> None:
    """args.model: --model, or serve's MODEL (as `vllm serve MODEL` takes it), or the default."""
    tag = getattr(args, "model_tag", None)
    if tag is not None and args.model not in (None, tag):
        raise ValueError(f"two models given: {tag!r} and --model {args.model!r}; give one")
    if args.command in ("generate", "chat", "serve"):  # bench picks its model per device (minillm.bench)
        args.model = tag or args.model or MODEL_DEFAULT


def _check_text_args(args) -> None:
    """Text arguments must be valid UTF-8 (Python hands invalid bytes over as lone surrogates)."""
    from minillm.tokenizer import check_text
    for name in ("prompt", "message", "system"):
        value = getattr(args, name, None)
        if value is not None:
            check_text(value, f"the {name} argument")


def _json_list(text: str) -> list[str]:
    """serve's --allowed-origins/--allowed-methods/--allowed-headers: a JSON list of strings, as vLLM takes them."""
    import json
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, e.g. '[\"http://localhost:3000\"]' "
                                         f"(default '[\"*\"]': any), got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m minillm", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, streaming, /metrics)")
    s.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as `vllm serve MODEL` takes it (or --model)")
    _engine_args(s)
    # vLLM's serve flags for two engine arguments (generate and chat take --seed as a sampling seed)
    s.add_argument("--seed", type=int, default=None,
                   help="the engine's seed: the random stream of requests that give no seed of their own (default 0)")
    s.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="prefill a prompt longer than --max-num-batched-tokens over several steps (default: on)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    s.add_argument("--api-key", default=None, help="clients must send 'Authorization: Bearer KEY'")
    s.add_argument("--max-waiting", type=int, default=256,
                   help="requests that may wait to be scheduled; one more gets 503 + Retry-After")
    s.add_argument("--max-num-seqs", type=int, default=256, help="sequences the engine runs at once")
    s.add_argument("--max-num-batched-tokens", type=int, default=16384,
                   help="tokens one step computes at most; a longer prompt prefills in chunks of this size")
    s.add_argument("--stream-interval", type=int, default=1,
                   help="send a request's tokens once this many have gathered (first and last at once); "
                        "larger: fewer, bigger chunks and less host work per token at high load")
    s.add_argument("--batching", choices=["continuous", "static"], default="continuous",
                   help="static: new requests wait until the whole running batch has finished (to compare)")
    s.add_argument("--engine-core", choices=["process", "thread"], default="process",
                   help="process: the engine steps in a process of its own (the HTTP side never holds up a step); "
                        "thread: in a thread of the server's process (one GIL; runs your chapter-6 code in the "
                        "engine with serving_lab's use_my_code)")
    s.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model name(s) clients may send; responses carry the first (default: --model)")
    s.add_argument("--response-role", default="assistant",
                   help="the role of a chat answer that opens a new turn (default assistant)")
    s.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="the HTTP server's log level")
    s.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="no log line per HTTP request (uvicorn's access log)")
    s.add_argument("--enable-request-id-headers", action="store_true",
                   help="every response carries an X-Request-Id header: the request's own, else a fresh id")
    s.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or the path of a file holding one, used for every chat request "
                        "instead of the model's own")
    # vLLM's CORS flags (Starlette's CORSMiddleware): by default a web page from any origin may call the server
    s.add_argument("--allowed-origins", type=_json_list, default=["*"], help="CORS: origins allowed, a JSON list")
    s.add_argument("--allowed-methods", type=_json_list, default=["*"], help="CORS: methods allowed, a JSON list")
    s.add_argument("--allowed-headers", type=_json_list, default=["*"], help="CORS: headers allowed, a JSON list")
    s.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (cookies, auth)")
    return parser


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> None:
    """Run one command; exit with its status (see the module docstring)."""
    for stream in (sys.stdout, sys.stderr):  # a model's text must never crash the terminal it goes to
        try:
            stream.reconfigure(errors="replace")
        except (AttributeError, ValueError, OSError):  # not a text file of its own (a test's capture)
            pass
    code = 0
    try:
        args = _parser().parse_args(argv)
        _pick_model(args)
        _check_text_args(args)
        {"generate": cmd_generate, "chat": cmd_chat, "bench": cmd_bench, "serve": cmd_serve}[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here at the latest, not at interpreter exit
    except ValueError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the line the interrupt cut; no traceback
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader has gone: point stdout at /dev/null so the exit's own flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 -- the CLI's contract: one line, never a traceback
        if os.environ.get("MINILLM_DEBUG"):
            raise
        print(f"error: {type(e).__name__}: {_one_line(e)} (MINILLM_DEBUG=1 shows the traceback)", file=sys.stderr)
        code = EXIT_FAILURE
    if code:
        sys.exit(code)
