"""`python -m minillm bench`: its arguments, the like-for-like ratios, its JSON, and the adapters that
run nano-vLLM and HF transformers beside minillm.

The real nano-vLLM (it needs flash-attn) and HF's continuous batching run only on the GPU
(tests/gpu/bench_session.sh); here each is a small stand-in written below, which records how the
adapter drives it and answers the way the real engine does.
"""
import argparse
import json
import os
import sys
import textwrap
import time

import pytest
import torch

from minillm import bench
from minillm.cli import main as cli_main


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_bench_args(p)
    args = p.parse_args(list(argv))
    bench.check_args(args)
    return args


# ---- arguments -------------------------------------------------------------------------------------
def test_the_default_workload_fits_the_device():
    """On a CPU the bench's default is a small model and a handful of short requests (~16 s on two cores),
    not nano-vLLM's GPU workload (256 requests of up to 1,024 tokens: hours there); what the command
    line gives is kept."""
    cpu = parse("--device", "cpu")
    assert (cpu.model, cpu.num_seqs, cpu.max_input_len, cpu.max_output_len, cpu.batch1_tokens) == (
        "smollm2-135m", 8, 64, 64, 32)
    gpu = parse("--device", "cuda")
    assert (gpu.model, gpu.num_seqs, gpu.min_len, gpu.max_input_len, gpu.max_output_len, gpu.batch1_tokens) == (
        "qwen3-0.6b-random", 256, 100, 1024, 1024, 256)
    mine = parse("--device", "cpu", "--num-seqs", "3", "--model", "qwen3-tiny")
    assert (mine.model, mine.num_seqs, mine.max_output_len) == ("qwen3-tiny", 3, 64)


def test_engine_lists_take_spaces_or_commas():
    a = parse("--compare", "hf", "nanovllm", "--attention-backend", "triton,flash_attn")
    b = parse("--compare", "hf,nanovllm", "--attention-backend", "triton", "flash_attn")
    assert a.compare == b.compare == ["hf", "nanovllm"]
    assert a.attention_backend == b.attention_backend == ["triton", "flash_attn"]
    c = parse()
    assert c.compare == [] and c.attention_backend == ["auto"] and c.hf_num_seqs is None
    assert c.tensor_parallel_size == 1
    assert parse("--compare", "hf,hf").compare == ["hf"]


def test_hf_runs_the_full_workload_unless_told():
    gpu = ("--device", "cuda")  # its workload of 256 requests
    assert parse(*gpu, "--compare", "hf").hf_num_seqs is None
    assert parse(*gpu, "--compare", "hf", "--hf-num-seqs", "32").hf_num_seqs == 32
    assert parse(*gpu, "--compare", "hf", "--hf-num-seqs", "256").hf_num_seqs is None  # all of them: no subset


@pytest.mark.parametrize("argv, message", [
    (["--compare", "vllm"], "--compare 'vllm'"),
    (["--attention-backend", "triton,flash"], "unknown attention backend 'flash'"),
    (["--hf-num-seqs", "8"], "add --compare hf"),
    (["--compare", "hf", "--hf-num-seqs", "0"], "between 1 and"),
    (["--device", "cuda", "--compare", "hf", "--hf-num-seqs", "300"], "between 1 and --num-seqs=256"),
    (["--compare", "hf", "--tensor-parallel-size", "2"], "one GPU"),
    (["--batch1-tokens", "-1"], "--batch1-tokens"),
])
def test_bad_arguments_name_the_fix(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(*argv)


def test_cli_reports_a_bad_bench_argument(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "--compare", "vllm"])
    assert e.value.code == 2
    assert "--compare 'vllm'" in capsys.readouterr().err


# ---- like for like ---------------------------------------------------------------------------------
def test_ratios_compare_the_same_requests():
    engines = {
        "minillm-triton": {"throughput": {"256": 24000.0, "32": 15000.0}},
        "minillm-flash_attn": {"skipped": "flash_attn is not installed"},
        "nanovllm": {"throughput": {"256": 12000.0, "32": 10000.0}},
        "hf": {"throughput": {"32": 500.0}},
    }
    r = bench.like_for_like_ratios(engines)
    assert r == {
        "minillm-triton/nanovllm": {"ratio": 2.0, "num_seqs": 256},
        "minillm-triton/hf": {"ratio": 30.0, "num_seqs": 32},  # minillm's own 32-request rate, not its 256
        "nanovllm/hf": {"ratio": 20.0, "num_seqs": 32},
    }
    assert bench.like_for_like_ratios({"a": {"throughput": {"8": 1.0}}, "b": {"throughput": {"4": 1.0}}}) == {}


def test_workload_is_nano_vllms_draw():
    prompts, outs = bench.make_workload(256, 100, 1024, 1024)
    w = bench.Workload(prompts, outs)
    assert (w.num_seqs, w.prompt_tokens, w.output_tokens) == (256, 142827, 133966)  # DESIGN.md's figures
    head = w.first(32)
    assert head.prompts == prompts[:32] and head.output_lens == outs[:32]
    fresh = head.fresh()  # what the other engines run beside HF's subset, after the whole workload
    assert fresh.output_lens == head.output_lens and [len(p) for p in fresh.prompts] == [len(p) for p in head.prompts]
    assert all(f[0] != p[0] and 0 <= f[0] <= 10000 and f[1:] == p[1:] for f, p in zip(fresh.prompts, head.prompts))
    warm = w.warmup()
    assert warm.prompts == [prompts[0][::-1], prompts[1][::-1]] and warm.output_lens == [bench.WARMUP_TOKENS] * 2


# ---- where nano-vLLM came from ---------------------------------------------------------------------
COMMIT = "bb823b3e06983d71485a8e1f23715ebd87d98ef8"


def test_git_commit_from_loose_and_packed_refs_and_gitdir_files(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git" / "refs" / "heads").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert bench.read_git_commit(str(repo)) is None  # a branch with no commit yet
    (repo / ".git" / "packed-refs").write_text(f"# pack-refs with: peeled\n{COMMIT} refs/heads/main\n")
    assert bench.read_git_commit(str(repo)) == COMMIT
    other = "0" * 39 + "1"
    (repo / ".git" / "refs" / "heads" / "main").write_text(other + "\n")  # a loose ref wins over the packed one
    assert bench.read_git_commit(str(repo)) == other
    (repo / ".git" / "HEAD").write_text(COMMIT + "\n")  # detached
    assert bench.read_git_commit(str(repo)) == COMMIT
    linked = tmp_path / "worktree"
    linked.mkdir()
    (linked / ".git").write_text("gitdir: ../repo/.git\n")
    assert bench.read_git_commit(str(linked)) == COMMIT
    copy = tmp_path / "copy"
    copy.mkdir()
    assert bench.read_git_commit(str(copy)) is None and bench.read_commit_file(str(copy)) is None
    (copy / "COMMIT").write_text(f"nano-vllm {COMMIT} (main)\n")
    assert bench.read_commit_file(str(copy)) == COMMIT


# ---- a stand-in nano-vLLM --------------------------------------------------------------------------
STAND_IN = '''
"""A stand-in for nano-vLLM's public API (LLM, SamplingParams), recording how it is driven."""
import atexit
import time
from dataclasses import dataclass

CALLS = []
TOKEN_S = 0.005  # each token takes this long, so batch-1 timing has something to measure


@dataclass
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False

    def __post_init__(self):
        assert self.temperature > 1e-10, "greedy sampling is not permitted"


class LLM:
    def __init__(self, model, **kwargs):
        CALLS.append(("init", model, kwargs))
        self.exited = 0
        atexit.register(self.exit)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        CALLS.append(("generate", prompts, sampling_params, use_tqdm))
        time.sleep(TOKEN_S * max(sp.max_tokens for sp in sampling_params))  # one batch: the longest decides
        return [{"text": "", "token_ids": [7] * sp.max_tokens} for sp in sampling_params]

    def exit(self):
        self.exited += 1
        CALLS.append(("exit",))
'''


@pytest.fixture
def isolated_imports(monkeypatch):
    """Whatever a test imports as `nanovllm` is forgotten afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m == "nanovllm" or m.startswith("nanovllm.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "nanovllm" or m.startswith("nanovllm.")]:
        del sys.modules[name]


def write_stand_in(root, init_source: str = STAND_IN):
    (root / "nanovllm").mkdir(parents=True)
    (root / "nanovllm" / "__init__.py").write_text(textwrap.dedent(init_source))
    (root / "pyproject.toml").write_text('[project]\nname = "nano-vllm"\nversion = "0.2.0"\n')
    (root / "COMMIT").write_text(COMMIT + "\n")
    return str(root)


def test_nanovllm_import_failure_is_one_line(tmp_path, isolated_imports):
    with pytest.raises(bench.NanoVLLMUnavailable, match="holds no nanovllm package"):
        bench.load_nanovllm(str(tmp_path))
    path = write_stand_in(tmp_path / "nv", "raise ImportError(\"No module named 'flash_attn'\")\n")
    with pytest.raises(bench.NanoVLLMUnavailable) as e:
        bench.load_nanovllm(path)
    assert str(e.value) == f"nano-vLLM does not import from {path}: ImportError: No module named 'flash_attn'"


def test_nanovllm_adapter_drives_its_own_engine(tmp_path, isolated_imports, monkeypatch):
    path = write_stand_in(tmp_path / "nano-vllm")
    nano, info = bench.load_nanovllm(path + "/nanovllm")  # the package folder itself works too
    assert info == {"source": path, "version": "0.2.0", "commit": COMMIT,
                    "source_sha256": bench.source_digest(path + "/nanovllm")}
    unregistered = []
    monkeypatch.setattr(bench.atexit, "unregister", lambda f: unregistered.append(f))
    work = bench.Workload([[1, 2, 3], [4, 5], [6]], [5, 3, 4])
    args = parse("--temperature", "0.6", "--batch1-tokens", "4", "--tensor-parallel-size", "1")
    res = bench.run_nanovllm(nano, "/models/q", work, work.first(2).fresh(), args)

    init, warmup, full, subset = nano.CALLS[:4]
    assert init == ("init", "/models/q", {"enforce_eager": False, "tensor_parallel_size": 1, "max_model_len": 4096})
    assert warmup[1] == ["Benchmark: "] and warmup[2][0].max_tokens == 64  # its bench.py's warm-up
    assert full[1] == work.prompts and full[3] is False
    assert [(p.max_tokens, p.temperature, p.ignore_eos) for p in full[2]] == [(5, 0.6, True), (3, 0.6, True),
                                                                            (4, 0.6, True)]
    assert subset[1] == [[2, 2, 3], [5, 5]]  # the first two, each first token changed
    batch1 = nano.CALLS[4:-1]
    assert len(batch1) == 1 + 2 * bench.BATCH1_REPEATS  # warm-up, then the best of 3 at 1 and at 1 + n tokens
    assert all(c[1] == [bench.BATCH1_PROMPT] and c[2][0].temperature == 0.6 for c in batch1)
    assert [c[2][0].max_tokens for c in batch1] == [5] + [1, 5] * bench.BATCH1_REPEATS  # the lengths alternate
    assert nano.CALLS[-1] == ("exit",) and len(unregistered) == 1  # torn down once, not again at exit
    assert res["output_tokens"] == res["expected_output_tokens"] == 12 and res["complete"]
    assert set(res["throughput"]) == {"3", "2"} and res["num_seqs"] == 3
    assert res["batch1_ms_per_token"] > 0  # the stand-in's TOKEN_S per token, plus noise


# ---- a stand-in for HF's continuous batching ---------------------------------------------------------
STAND_IN_TOKEN_S = 0.005  # as the nano-vLLM stand-in: each token takes this long
class StandInOutput:
    def __init__(self, request_id, n):
        self.request_id, self.generated_tokens = request_id, [3] * n

    def is_finished(self):
        return True


class StandInManager:
    """add_request / get_result / is_running, as transformers' ContinuousBatchingManager answers them."""

    def __init__(self, log):
        self.log, self.queue, self.count = log, [], 0

    def add_request(self, input_ids, max_new_tokens, eos_token_id):
        rid = f"req_{self.count}"
        self.count += 1
        self.log.append((len(input_ids), max_new_tokens, eos_token_id))
        self.queue.append(StandInOutput(rid, max_new_tokens))
        return rid

    def get_result(self, timeout=None):
        if not self.queue:
            return None
        out = self.queue.pop()  # out of order, as results come
        time.sleep(STAND_IN_TOKEN_S * len(out.generated_tokens))
        return out

    def is_running(self):
        return True


class StandInHFModel:
    def __init__(self):
        self.requests, self.contexts = [], []

    def continuous_batching_context_manager(self, generation_config=None, block=True, timeout=None,
                                            workload_hints=None):
        import contextlib
        self.contexts.append((generation_config, workload_hints))
        return contextlib.nullcontext(StandInManager(self.requests))


def test_hf_adapter_gives_each_request_its_own_length(monkeypatch):
    model = StandInHFModel()
    monkeypatch.setattr(bench, "_load_hf_model", lambda path, dtype: model)
    work = bench.Workload([[1] * 100, [2] * 70, [3] * 90], [9, 4, 6])
    res = bench.run_hf("/models/q", None, work, parse("--batch1-tokens", "2"))
    (cfg, hints), = model.contexts
    assert cfg.do_sample and cfg.temperature == 0.6 and cfg.max_new_tokens == 9
    assert (hints.max_prompt_length, hints.max_generated_length, hints.num_requests) == (100, 9, 3)
    warm, timed = model.requests[:2], model.requests[2:5]
    assert warm == [(100, bench.WARMUP_TOKENS, -1), (70, bench.WARMUP_TOKENS, -1)]
    assert timed == [(100, 9, -1), (70, 4, -1), (90, 6, -1)]  # EOS off, each request its own length
    assert all(r[0] == len(bench.BATCH1_PROMPT) for r in model.requests[5:])
    assert res["output_tokens"] == 19 and res["complete"] and res["throughput"] == {"3": res["output_tok_s"]}
    assert res["attn_implementation"] == "paged|sdpa"


def test_batch1_timing_alternates_lengths_and_never_reports_a_negative_time():
    """A busy stretch at the start (here: the first three timed runs take a second more) once made
    the 1-token runs, all timed first, slower than the longer ones: a negative ms per token. With the
    lengths alternating, the best run of each length comes from the same quiet stretch; on a machine
    whose noise swamps the tokens there is no figure at all, never a false one."""
    def run_on(busy: set[int], token_s: float):
        calls = []

        def run(k: int) -> float:
            calls.append(k)
            return 0.01 + token_s * k + (1.0 if len(calls) - 1 in busy else 0.0)
        return run, calls

    run, calls = run_on(busy={1, 2, 3}, token_s=0.002)
    assert bench.batch1_ms_per_token(run, 4) == pytest.approx(2.0)  # 2 ms per token, the busy runs ignored
    assert calls == [5] + [1, 5] * bench.BATCH1_REPEATS
    # the 1-token runs keep landing in busy stretches: more rounds, then no figure
    run, calls = run_on(busy=set(range(1, 40, 2)), token_s=0.0)
    assert bench.batch1_ms_per_token(run, 4) is None and len(calls) == 1 + 2 * bench.BATCH1_MAX_REPEATS
    res = {}
    bench._batch1_entry(res, run_on(busy=set(), token_s=0.0)[0], 4)
    assert "batch1_ms_per_token" not in res and "raise --batch1-tokens" in res["batch1_unresolved"]


def test_hf_adapter_raises_when_its_thread_dies(monkeypatch):
    class Dead(StandInManager):
        def get_result(self, timeout=None):
            return None

        def is_running(self):
            return False

    with pytest.raises(RuntimeError, match="2 requests unfinished"):
        bench._hf_generate(Dead([]), [[1], [2]], [3, 3])


# ---- the whole run, on CPU -------------------------------------------------------------------------
def test_bench_run_prints_every_engine_and_like_for_like_json(tmp_path, isolated_imports, monkeypatch, capsys):
    """minillm (qwen3-tiny on CPU) with the two stand-ins, HF on a 2-request subset: every ratio to HF
    is taken on those 2 requests, every other on all 4; the JSON file holds what stdout printed."""
    path = write_stand_in(tmp_path / "nano-vllm")
    model = StandInHFModel()
    monkeypatch.setattr(bench, "_hf_preflight", lambda device: None)
    monkeypatch.setattr(bench, "_load_hf_model", lambda path, dtype: model)
    monkeypatch.setattr(bench, "run_hf_generate", bench.run_hf)  # the CUDA adapter, with the stand-in model
    out_file = tmp_path / "bench.json"
    args = parse("--model", "qwen3-tiny", "--device", "cpu", "--num-seqs", "4", "--min-len", "16",
                 "--max-input-len", "40", "--max-output-len", "24", "--max-model-len", "256",
                 "--max-num-seqs", "8", "--max-num-batched-tokens", "512", "--batch1-tokens", "8",
                 "--compare", "hf,nanovllm", "--hf-num-seqs", "2", "--nanovllm-path", path,
                 "--json", "--json-file", str(out_file))
    result = bench.run_bench(args)
    printed = capsys.readouterr()
    assert json.loads(printed.out) == result
    assert json.loads(out_file.read_text()) == {**result, "complete": True}
    assert "x nanovllm" in printed.err and "nano-vLLM 0.2.0 commit " + COMMIT in printed.err
    # a CPU's matmul rate (~0.2 TFLOP/s) is printed as it was measured, not rounded to 0
    assert 0 < result["matmul_tflops"] < 100
    assert f"{result['matmul_tflops']:.2g} TFLOP/s measured" in printed.err, printed.err
    package = os.path.dirname(os.path.abspath(bench.__file__))  # what ran, whatever .git says
    assert result["minillm_source_sha256"] == bench.source_digest(package)

    engines = result["engines"]
    assert list(engines) == ["minillm-torch", "nanovllm", "hf"]  # 'auto' named after what it picks on CPU
    mini, nano, hf = engines["minillm-torch"], engines["nanovllm"], engines["hf"]
    assert mini["attention_backend"] == "torch" and mini["complete"] and mini["num_seqs"] == 4
    assert set(mini["throughput"]) == set(nano["throughput"]) == {"4", "2"} and set(hf["throughput"]) == {"2"}
    assert nano["commit"] == COMMIT and nano["version"] == "0.2.0"
    assert hf["num_seqs"] == 2 and hf["output_tokens"] == sum(bench.make_workload(4, 16, 40, 24)[1][:2])
    r = result["ratios"]
    assert r["minillm-torch/hf"]["num_seqs"] == r["nanovllm/hf"]["num_seqs"] == 2
    assert r["minillm-torch/nanovllm"]["num_seqs"] == 4
    assert r["minillm-torch/hf"]["ratio"] == round(mini["throughput"]["2"] / hf["output_tok_s"], 2)
    for e in engines.values():  # batch-1 times on a shared CPU are noisy: measured, not judged
        assert e["fraction_of_floor"] > 0 and e["batch1_ms_per_token"] > 0
    # the keys earlier versions printed (notebook 05 reads them), like for like now
    assert result["output_tok_s"] == mini["output_tok_s"] and result["hf_tok_s"] == hf["output_tok_s"]
    assert result["hf_subset"] == "first 2 of 4 requests"
    assert result["minillm_subset_tok_s"] == mini["throughput"]["2"]
    assert result["speedup_vs_hf"] == result["speedup_vs_hf_same_subset"] == r["minillm-torch/hf"]["ratio"]
    assert result["speedup_vs_nanovllm"] == r["minillm-torch/nanovllm"]["ratio"]
    assert result["workload"]["num_seqs"] == 4 and result["hf_num_seqs"] == 2 and "floor_tok_s_subset" in result


def test_cpu_compare_hf_runs_transformers_generate(isolated_imports, capsys):
    """On a CPU, --compare hf runs HF's own generate (static batching) on the same requests: every
    request gets its full length, and batch-1 decode is timed the same way as minillm's."""
    args = parse("--model", "qwen3-tiny", "--device", "cpu", "--num-seqs", "3", "--min-len", "8",
                 "--max-input-len", "16", "--max-output-len", "8", "--max-model-len", "256",
                 "--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--batch1-tokens", "8",
                 "--compare", "hf", "--json")
    result = bench.run_bench(args)
    hf = result["engines"]["hf"]
    assert hf["engine"] == "HF transformers" and "static batching" in hf["settings"]
    assert hf["complete"] and hf["output_tokens"] == sum(bench.make_workload(3, 8, 16, 8)[1])
    assert hf["batch1_ms_per_token"] > 0 and result["ratios"]["minillm-torch/hf"]["num_seqs"] == 3
    assert "x hf" in capsys.readouterr().err


def test_bench_skips_what_cannot_run_and_says_why(tmp_path, isolated_imports, monkeypatch, capsys):
    """A backend that cannot run beside one that can, and no nano-vLLM: both are skipped with their reason."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # flash-attn not installed
    monkeypatch.delenv("NANOVLLM_PATH", raising=False)
    args = parse("--model", "qwen3-tiny", "--device", "cpu", "--num-seqs", "2", "--min-len", "8",
                 "--max-input-len", "16", "--max-output-len", "8", "--max-model-len", "64",
                 "--max-num-seqs", "4", "--max-num-batched-tokens", "128", "--batch1-tokens", "0",
                 "--attention-backend", "torch,flash_attn", "--compare", "nanovllm", "--nanovllm-path",
                 str(tmp_path))
    result = bench.run_bench(args)
    err = capsys.readouterr().err
    engines = result["engines"]
    assert "flash-attn 2 is not installed" in engines["minillm-flash_attn"]["skipped"]
    assert "holds no nanovllm package" in engines["nanovllm"]["skipped"]
    assert "minillm-flash_attn skipped:" in err and "nanovllm skipped:" in err
    assert engines["minillm-torch"]["complete"] and result["ratios"] == {}
    with pytest.raises(ValueError, match="flash-attn 2 is not installed"):  # the only backend asked for
        bench.run_bench(parse("--model", "qwen3-tiny", "--device", "cpu", "--attention-backend", "flash_attn"))


def test_bench_cli_runs_the_triton_backend_in_a_fresh_process(tmp_path):
    """`python -m minillm bench --attention-backend triton` on a CPU, in a process that imported nothing
    before: the bench once imported triton (through its timers) before minillm.kernels had switched
    Triton's interpreter on, and the triton engine then failed in its first reduction."""
    import os
    import subprocess
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "minillm", "bench", "--model", "qwen3-tiny", "--device", "cpu",
                           "--attention-backend", "triton", "--num-seqs", "2", "--min-len", "8",
                           "--max-input-len", "16", "--max-output-len", "8", "--max-model-len", "64",
                           "--batch1-tokens", "0", "--json-file", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    if torch.cuda.is_available():  # the kernels are compiled for the GPU here: refused, saying what to do
        assert done.returncode != 0 and "set TRITON_INTERPRET=1" in done.stderr, done.stderr[-2000:]
        return
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text())["engines"]["minillm-triton"]["complete"]


def test_a_cpu_run_on_a_gpu_machine_is_held_to_the_cpus_ceilings(monkeypatch):
    """`bench --device cpu` where there is a GPU: the floor comes from the CPU's copy and matmul, measured on
    the CPU (it measured the GPU's, and a CPU run then read 0.0% of its floor)."""
    from minillm import timing
    monkeypatch.setattr(timing, "_CEILINGS", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine, as the timers see it
    monkeypatch.setattr(timing, "_events", lambda fn: pytest.fail("timed with CUDA events"))
    ceil = timing.device_ceilings(torch.float32, "cpu")
    assert ceil.device.startswith("cpu (") and 0 < ceil.copy_gbps < 5_000 and 0 < ceil.matmul_tflops < 100
    assert timing.describe_device("cpu").startswith("cpu (")
