"""The command line: a usage error points to its own command's help, and serve's vLLM engine flags reach
the engine (no model loads: the engine client is replaced by one that records its arguments)."""
from __future__ import annotations

import pytest

from minillm.cli import main


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    """minillm.cli.main(argv) in this process. -> (exit status, stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv, help_of", [
    (["serve", "qwen3-tiny", "--lora-modules", "x"], "python -m minillm serve --help"),
    (["serve", "qwen3-tiny", "--enable-lora"], "python -m minillm serve --help"),
    (["generate", "hi", "--bogus"], "python -m minillm generate --help"),
    (["chat", "--bogus", "1"], "python -m minillm chat --help"),
    (["bench", "--bogus"], "python -m minillm bench --help"),
    (["bench", "serve", "--base-url", "http://127.0.0.1:1", "--bogus"], "python -m minillm bench serve --help"),
])
def test_an_unknown_argument_points_to_its_commands_help(capsys, argv, help_of):
    code, err = run_main(argv, capsys)
    assert code == 2
    assert err.startswith("error: unrecognized arguments: ") and err.rstrip().endswith(f"(see `{help_of}`)"), err
    assert len(err.splitlines()) == 1


class Recorded(Exception):
    pass


@pytest.mark.parametrize("flags, want", [
    ([], {}),
    (["--seed", "7", "--no-enable-chunked-prefill"], {"seed": 7, "enable_chunked_prefill": False}),
    (["--enable-chunked-prefill"], {"enable_chunked_prefill": True}),
    (["--block-size", "32", "--kv-cache-memory-bytes", "1000000", "--num-gpu-blocks-override", "40"],
     {"block_size": 32, "kv_cache_memory_bytes": 1000000, "num_gpu_blocks_override": 40}),
])
def test_serve_passes_vllms_engine_flags_to_the_engine(capsys, monkeypatch, flags, want):
    import minillm.serving.engine_core as engine_core
    seen = {}

    def client(model, llm_args, **serving_args):
        seen.update(llm_args)
        raise ValueError("recorded")  # the CLI's one-line error, exit 2: nothing loads, nothing serves

    monkeypatch.setattr(engine_core, "EngineCoreClient", client)
    code, err = run_main(["serve", "qwen3-tiny", "--port", "0", "--device", "cpu", *flags], capsys)
    assert (code, err.strip()) == (2, "error: recorded")
    assert {k: seen[k] for k in ("seed", "enable_chunked_prefill", "block_size", "kv_cache_memory_bytes",
                                 "num_gpu_blocks_override") if k in seen} == want
    assert seen["max_num_seqs"] == 256  # the other engine arguments are still there


@pytest.mark.parametrize("flags, error", [
    (["--block-size", "7"], "error: block_size must be a power of two >= 16, got 7"),
    (["--block-size", "16", "--num-gpu-blocks-override", "4", "--max-model-len", "256"],
     "error: the KV cache holds 4 blocks of 16 tokens, too small for one sequence of max_model_len=256 tokens "
     "(16 blocks); give it more memory (num_gpu_blocks_override, kv_cache_memory or gpu_memory_utilization) or "
     "lower max_model_len"),
])
def test_vllms_kv_cache_flags_reach_the_engine_and_its_errors_use_their_names(capsys, flags, error):
    """--block-size and --num-gpu-blocks-override reach the engine (LLM renames vLLM's names to EngineConfig's);
    the engine's checks of them answer in the names given."""
    code, err = run_main(["generate", "Hi", "--model", "qwen3-tiny", "--device", "cpu", *flags], capsys)
    assert (code, err.strip()) == (2, error)


def test_the_engines_own_names_stay_in_its_errors():
    from minillm import LLM
    with pytest.raises(ValueError, match=r"^kvcache_block_size must be a power of two >= 16, got 7$"):
        LLM("qwen3-tiny", device="cpu", kvcache_block_size=7)
