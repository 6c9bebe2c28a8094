"""`python -m minillm generate | chat --logprobs K`: after the text, a table of each generated token's logprob,
its rank and the K most likely tokens', the values those of LLM.generate with SamplingParams(logprobs=K) on
the same engine arguments; --logprobs-mode picks them (and alone, printing nothing, is refused)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import one_torch_thread  # noqa: F401 (an autouse fixture)
from minillm import LLM, SamplingParams
from minillm.cli import _llm_args, _parser, main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "The capital of France is"
ENGINE = ["--model", "qwen3-tiny", "--device", "cpu", "--dtype", "float32", "--max-model-len", "128"]


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """minillm.cli.main(argv) in this process. -> (exit status, stdout, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def api_logprobs(argv: list[str], params: SamplingParams, prompt) -> tuple[str, list[dict]]:
    """What LLM.generate (or chat, for a conversation) gives on the engine the command line makes of argv."""
    args = _parser().parse_args(argv)
    args.model = "qwen3-tiny"
    with LLM(args.model, **_llm_args(args, max_num_seqs=16)) as llm:
        run = llm.chat if isinstance(prompt, list) else llm.generate
        out = run(prompt, params, use_tqdm=False)[0].outputs[0]
    return out.text, out.logprobs


def expected_rows(logprobs: list[dict], k: int) -> list[str]:
    """Each table row's words, as a regex: position, repr of the token, its value, its rank, the top k."""
    rows = []
    for pos, entry in enumerate(logprobs):
        chosen = next(iter(entry.values()))
        top = sorted(entry.values(), key=lambda lp: lp.rank)[:k]
        words = [str(pos), repr(chosen.decoded_token), f"{chosen.logprob:.4f}", str(chosen.rank)]
        words += [f"{lp.decoded_token!r} {lp.logprob:.4f}" for lp in top]
        rows.append(r"\s*" + r"\s+".join(re.escape(w) for w in words))
    return rows


def check_table(table: list[str], logprobs: list[dict], k: int, mode: str) -> None:
    value = "logit" if mode.endswith("_logits") else "logprob"
    assert table[0] == f"{mode} of the {len(logprobs)} generated tokens:"
    assert table[1].split() == ["#", "token", value, "rank"] + (["top", str(k)] if k else [])
    assert len(table) == 2 + len(logprobs)
    for line, row in zip(table[2:], expected_rows(logprobs, k)):
        assert re.fullmatch(row, line), (line, row)


@pytest.mark.parametrize("mode, k, sampling", [
    (None, 2, []),  # the engine's default, raw_logprobs
    ("processed_logprobs", 3, ["--temperature", "0.7", "--top-k", "2", "--seed", "1"]),  # -inf past the top 2
    ("raw_logits", 0, []),  # the chosen token's value only
], ids=["raw_logprobs", "processed_logprobs", "raw_logits"])
def test_generate_prints_each_tokens_logprobs_after_the_text(capsys, mode, k, sampling):
    argv = ["generate", PROMPT, *ENGINE, "--max-tokens", "4", "--logprobs", str(k), *sampling]
    argv += ["--logprobs-mode", mode] if mode else []
    code, out, err = run_main(argv, capsys)
    assert code == 0 and "error" not in err, err
    args = _parser().parse_args(argv)
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, seed=args.seed, max_tokens=4, logprobs=k)
    text, logprobs = api_logprobs(argv, params, PROMPT)
    assert out.startswith(text + "\n")  # the text as it streamed, its line ended, then the table
    check_table(out[len(text) + 1:].rstrip("\n").split("\n"), logprobs, k, mode or "raw_logprobs")
    if mode == "processed_logprobs":
        assert "-inf" in out  # the token top-k dropped, as the API reports it


def test_chat_prints_a_table_after_the_reply(capsys):
    argv = ["chat", "--message", "Hi", *ENGINE, "--max-tokens", "3", "--logprobs", "1"]
    code, out, err = run_main(argv, capsys)
    assert code == 0 and "error" not in err, err
    text, logprobs = api_logprobs(argv, SamplingParams(temperature=0.0, max_tokens=3, logprobs=1),
                                  [{"role": "user", "content": "Hi"}])
    assert out.startswith(f"> Hi\n{text}\n")
    check_table(out[len(f"> Hi\n{text}\n"):].rstrip("\n").split("\n"), logprobs, 1, "raw_logprobs")


@pytest.mark.parametrize("argv, phrase", [
    (["generate", "Hi", "--logprobs-mode", "raw_logits"], "--logprobs-mode raw_logits picks what --logprobs K "
                                                          "prints; give --logprobs too"),
    (["chat", "--message", "Hi", "--logprobs-mode", "processed_logprobs"], "give --logprobs too"),
    (["generate", "Hi", "--logprobs", "21"], "SamplingParams.logprobs must be None or an integer in [0, 20]"),
    (["chat", "--message", "Hi", "--logprobs", "-1"], "SamplingParams.logprobs must be None or an integer in [0, 20]"),
    (["generate", "Hi", "--logprobs", "two"], "argument --logprobs: invalid int value: 'two'"),
], ids=["mode-without-logprobs", "chat-mode-without-logprobs", "logprobs-21", "chat-logprobs-negative", "not-an-int"])
def test_bad_logprobs_arguments_are_one_line_and_exit_2_before_the_model_loads(capsys, monkeypatch, argv, phrase):
    monkeypatch.setattr("minillm.LLM", None)  # the model must not load: the arguments fail first
    code, out, err = run_main([*argv, "--model", "qwen3-tiny"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and phrase in lines[0], err
    assert out == ""


def test_the_command_prints_the_table_and_exits_0():
    """The same through `python -m minillm`, as a user runs it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "minillm", "generate", PROMPT, *ENGINE, "--max-tokens", "3",
                        "--logprobs", "2", "--logprobs-mode", "processed_logprobs"],
                       capture_output=True, env=env, cwd=REPO, timeout=240)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0 and "error" not in err and "Traceback" not in err, err
    table = out[out.index("processed_logprobs of the 3 generated tokens:"):].rstrip("\n").split("\n")
    assert table[1].split() == ["#", "token", "logprob", "rank", "top", "2"] and len(table) == 5
    assert [line.split()[0] for line in table[2:]] == ["0", "1", "2"]
