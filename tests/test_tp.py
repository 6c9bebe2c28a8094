"""Tensor parallelism on CPU (gloo): TP=N greedy tokens equal TP=1, a dead or failing worker makes the
engine raise instead of hanging, and shutdown (explicit, garbage collection, interpreter exit) leaves no
process or process group behind."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch.distributed as dist

from helpers import small_engine_args
from minillm import LLM, SamplingParams
from minillm.distributed import run_on_ranks
from minillm.engine.tp import shard_summary

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = ["Hello", "The capital of France is", "1 2 3 4 5 6 7 8", "def fib(n):\n    return"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tokens(llm, prompts, params=GREEDY):
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


def gone(procs, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(p.exitcode is None for p in procs):
        time.sleep(0.05)
    return all(p.exitcode is not None for p in procs)


# functions the workers run through collective_rpc / run_on_ranks (spawn imports them from here)
def _fail_on_rank_1(runner=None):
    if dist.get_rank() == 1:
        raise ValueError("worker rank 1 refuses")
    if runner is None:  # run_on_ranks: rank 0 waits in a collective that rank 1 never joins
        import torch
        dist.all_reduce(torch.ones(1))
    return dist.get_rank()


def test_qwen3_tiny_tp2_equals_tp1_and_shuts_down_when_collected():
    args = small_engine_args()
    ref = LLM("qwen3-tiny", **args)
    shared = ref.tokenizer.encode("A long shared system prompt that fills more than one block of sixteen tokens. ")
    long_prompts = [shared + ref.tokenizer.encode(q) for q in ("Why?", "How so?", "When, exactly?")]
    want = tokens(ref, PROMPTS), tokens(ref, long_prompts)
    ref.shutdown()

    llm = LLM("qwen3-tiny", tensor_parallel_size=2, **args)
    runner = llm.engine.model_runner
    assert tokens(llm, PROMPTS) == want[0]
    assert tokens(llm, long_prompts) == want[1]  # a second batch: prefix-cache hits, more decode steps
    assert [tokens(llm, [p])[0] for p in PROMPTS[:2]] == want[0][:2]  # one at a time
    ranks = runner.collective_rpc(shard_summary)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["kv_cache"] == ranks[1]["kv_cache"]  # same blocks on every rank ...
    assert ranks[0]["kv_cache"][4] == 1  # ... holding 1 of qwen3-tiny's 2 KV heads

    procs = runner.worker_processes
    del llm, runner
    gc.collect()
    assert gone(procs), "the worker outlived its LLM"
    assert not dist.is_initialized(), "the process group outlived its LLM"


def test_killed_worker_makes_generate_raise():
    llm = LLM("qwen3-tiny", tensor_parallel_size=2, **small_engine_args())
    tokens(llm, PROMPTS[:1])
    (worker,) = llm.engine.model_runner.worker_processes
    os.kill(worker.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker rank 1 .*SIGKILL"):
        tokens(llm, PROMPTS)
    assert time.monotonic() - t0 < 30
    with pytest.raises(RuntimeError, match="has stopped after an error"):
        tokens(llm, PROMPTS)
    assert not dist.is_initialized()
    llm.shutdown()


def test_worker_exception_reaches_the_caller_with_its_type():
    llm = LLM("qwen3-tiny", tensor_parallel_size=2, **small_engine_args())
    runner = llm.engine.model_runner
    with pytest.raises(ValueError, match="worker rank 1 refuses"):
        runner.collective_rpc(_fail_on_rank_1)
    assert gone(runner.worker_processes)
    llm.shutdown()
    # run_on_ranks reports the rank that failed first, not rank 0's broken collective
    with pytest.raises(ValueError, match="worker rank 1 refuses"):
        run_on_ranks(_fail_on_rank_1, 2)


@pytest.mark.slow
def test_smollm2_tp3_equals_tp1_and_tp2_is_refused():
    """SmolLM2-135M: 9 query heads, 3 KV heads, vocabulary 49152, intermediate 1536. TP=2 cannot split
    its heads Megatron-style (a clear ValueError); TP=3 can."""
    args = small_engine_args(max_model_len=128)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 does not divide the model's num_attention_heads=9"):
        LLM("smollm2-135m", tensor_parallel_size=2, **args)
    ref = LLM("smollm2-135m", **args)
    prompts = [ref.tokenizer.encode_chat([{"role": "user", "content": q}])
               for q in ("What is the capital of France?", "Name three colors.")]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = tokens(ref, prompts, params)
    ref.shutdown()
    with LLM("smollm2-135m", tensor_parallel_size=3, **args) as llm:
        assert tokens(llm, prompts, params) == want
    assert not dist.is_initialized()


def test_interpreter_exit_stops_workers():
    """A script that never calls shutdown: its workers must still exit with it (no orphans, no abort)."""
    code = textwrap.dedent("""
        from minillm import LLM, SamplingParams
        llm = LLM("qwen3-tiny", tensor_parallel_size=2, device="cpu", dtype="float32",
                  kvcache_block_size=16, max_model_len=128)
        llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
        print("PIDS", *[p.pid for p in llm.engine.model_runner.worker_processes])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "terminate called" not in out.stderr
    pids = [int(p) for p in out.stdout.split("PIDS", 1)[1].split()]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_torchrun_launch():
    """env:// launch, as torchrun does it (works across nodes): rank 0 generates, rank 1 serves."""
    code = textwrap.dedent("""
        import os
        from minillm import LLM, SamplingParams
        llm = LLM("qwen3-tiny", tensor_parallel_size=2, device="cpu", dtype="float32",
                  kvcache_block_size=16, max_model_len=128)
        assert os.environ["RANK"] == "0"  # ranks > 0 serve inside LLM(...) and exit there
        out = llm.generate(["Hello", "The capital of France is"],
                           SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
        print("TOKENS", [o["token_ids"] for o in out])
        llm.shutdown()
    """)
    script = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"minillm_torchrun_{os.getpid()}.py")
    with open(script, "w") as f:
        f.write(code)
    try:
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node=2", script], capture_output=True, text=True, timeout=180, cwd=REPO)
    finally:
        os.remove(script)
    assert out.returncode == 0, out.stderr[-3000:]
    got = eval(out.stdout.split("TOKENS", 1)[1].strip().splitlines()[0])
    ref = LLM("qwen3-tiny", **small_engine_args(max_model_len=128))
    assert got == tokens(ref, ["Hello", "The capital of France is"],
                         SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))


# ---- NCCL: one GPU per rank (skipped with fewer than two GPUs) -----------------------------------------
def _two_gpus():
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices for NCCL, {torch.cuda.device_count()} visible")


@pytest.mark.gpu
def test_nccl_tp2_equals_tp1_and_a_killed_worker_raises():
    _two_gpus()
    args = dict(device="cuda", dtype="float32", kvcache_block_size=16, max_model_len=256, max_num_seqs=8)
    ref = LLM("qwen3-tiny", **args)
    want = tokens(ref, PROMPTS)
    ref.shutdown()
    llm = LLM("qwen3-tiny", tensor_parallel_size=2, **args)
    assert tokens(llm, PROMPTS) == want
    (worker,) = llm.engine.model_runner.worker_processes
    os.kill(worker.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker rank 1 .*SIGKILL"):
        tokens(llm, PROMPTS)
    assert time.monotonic() - t0 < 30
    llm.shutdown()
    assert not dist.is_initialized()


def _all_reduce_benchmark_with_a_slow_rank(sizes):
    """Rank 1 is slower between all-reduces, so the ranks measure different times; -> (ms, calls)."""
    import torch
    from minillm.distributed import all_reduce_benchmark
    calls, real = [0], dist.all_reduce

    def counted(*a, **k):
        calls[0] += 1
        out = real(*a, **k)
        if dist.get_rank() == 1:  # rank 0 waits for rank 1 in its next call: their timings differ
            time.sleep(0.002)
        return out
    dist.all_reduce = counted
    try:
        return all_reduce_benchmark(sizes, "cpu", torch.float32), calls[0]
    finally:
        dist.all_reduce = real


def test_all_reduce_benchmark_makes_the_same_calls_on_every_rank():
    """An adaptive call count (time_fn on a CUDA machine) differs between ranks and hangs the group;
    the benchmark's count is fixed: both ranks finish, with equal call counts and positive times."""
    (ms0, n0), (ms1, n1) = run_on_ranks(_all_reduce_benchmark_with_a_slow_rank, 2, [4, 4096], timeout_s=60)
    assert n0 == n1 > 0
    assert len(ms0) == len(ms1) == 2 and all(m > 0 for m in ms0 + ms1)


@pytest.mark.gpu
def test_nccl_all_reduce_benchmark_runs():
    _two_gpus()
    import torch
    from minillm.distributed import all_reduce_benchmark
    ms = run_on_ranks(all_reduce_benchmark, 2, [4, 1 << 20], "cuda", torch.bfloat16, device="cuda")
    assert all(0 < m < 1000 for rank in ms for m in rank)
