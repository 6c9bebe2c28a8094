"""An engine lets go of its device: shutdown() (or the garbage collector, or leaving a `with` block)
frees the weights, the KV cache and the CUDA graphs, and a second LLM in the same process (a notebook
cell re-run: the old engine is still alive while the new one is built) works, or says what to do.

On CPU the tests follow the engine's tensors with weak references; on CUDA (`gpu`) they watch the
device's free memory."""
import gc
import sys
import warnings
import weakref
from types import SimpleNamespace

import pytest
import torch

from helpers import small_engine_args
from minillm import LLM, SamplingParams
from minillm.engine import model_runner
from minillm.engine.model_runner import FREE_MEMORY_RESERVE, GIB, ModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(autouse=True, scope="module")
def only_this_modules_engines():
    """The engine registry sees only the engines this module creates: other test modules keep theirs
    alive on purpose (cached runners, module fixtures), and the counts below must not depend on the
    order pytest runs the files in."""
    saved = model_runner._LIVE_RUNNERS
    model_runner._LIVE_RUNNERS = weakref.WeakSet()
    yield
    model_runner._LIVE_RUNNERS = saved


def engine_tensors(llm) -> list[weakref.ref]:
    """Weak references to every tensor the engine holds: weights, buffers, the KV cache."""
    runner = llm.engine.model_runner
    tensors = list(runner.model.parameters()) + list(runner.model.buffers()) + [runner.kv_cache]
    return [weakref.ref(t) for t in tensors]


def alive(refs) -> int:
    return sum(r() is not None for r in refs)


def test_shutdown_frees_the_engine_while_the_llm_object_lives():
    llm = LLM("qwen3-tiny", **small_engine_args())
    llm.generate("Hello", GREEDY, use_tqdm=False)
    refs = engine_tensors(llm)
    assert alive(refs) == len(refs) > 10
    gc.disable()  # reference counting alone must free them: no cycle may hold a tensor
    try:
        llm.shutdown()
        assert alive(refs) == 0, f"{alive(refs)} of {len(refs)} engine tensors outlived shutdown()"
    finally:
        gc.enable()
    llm.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate("Hello", GREEDY, use_tqdm=False)


def test_dropping_the_llm_frees_the_engine_without_the_cycle_collector():
    llm = LLM("qwen3-tiny", **small_engine_args())
    llm.generate("Hello", GREEDY, use_tqdm=False)
    refs = engine_tensors(llm) + [weakref.ref(llm.engine.model_runner), weakref.ref(llm.engine)]
    gc.disable()
    try:
        del llm
        assert alive(refs) == 0, f"{alive(refs)} engine objects outlived the LLM (a reference cycle?)"
    finally:
        gc.enable()


def test_context_manager_shuts_down():
    with LLM("qwen3-tiny", **small_engine_args()) as llm:
        assert llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        refs = engine_tensors(llm)
    assert alive(refs) == 0
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate("Hello", GREEDY, use_tqdm=False)


def test_notebook_rerun_of_llm_cell():
    """`llm = LLM(...)` run twice: the first engine is alive while the second is built, then freed."""
    args = small_engine_args()
    llm = LLM("qwen3-tiny", **args)
    want = llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    first = engine_tensors(llm)
    llm = LLM("qwen3-tiny", **args)  # the re-run
    assert alive(first) == 0, "the first engine outlived its last reference"
    assert llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
    llm.shutdown()


def test_notebook_rerun_of_tensor_parallel_llm_cell_says_what_to_do():
    """Two tensor-parallel engines cannot share this process's process group: the second one says
    how to free the first, and works once it is shut down."""
    args = small_engine_args()
    llm = LLM("qwen3-tiny", tensor_parallel_size=2, **args)
    want = llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(RuntimeError, match=r"llm\.shutdown\(\)"):
        LLM("qwen3-tiny", tensor_parallel_size=2, **args)
    assert llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want  # the first is unharmed
    llm.shutdown()
    llm = LLM("qwen3-tiny", tensor_parallel_size=2, **args)
    assert llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
    llm.shutdown()


# ---- the KV-cache budget on CUDA, its arithmetic checked on any machine -----------------------------
class _Budget:
    """Just what ModelRunner.cuda_budget_bytes reads, on a device whose memory the test sets."""

    def __init__(self, utilization: float, weight_bytes: int, peak: int, max_model_len: int = 4096):
        self.config = SimpleNamespace(gpu_memory_utilization=utilization, max_model_len=max_model_len,
                                      blocks_per_seq=lambda: -(-max_model_len // 256))
        self.device, self.weight_bytes, self._peak = torch.device("cpu"), weight_bytes, peak

    def profile_peak_memory(self):
        return self._peak

    def kv_bytes_per_block(self):
        return 256 * 100_000  # ~100 kB of K/V per token


@pytest.fixture
def device_memory(monkeypatch):
    """Set what torch.cuda.mem_get_info reports: device_memory(free, total)."""
    def set_memory(free, total):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    return set_memory


def test_kv_budget_is_this_engines_share_when_the_device_is_free(device_memory):
    device_memory(free=138 * GIB, total=140 * GIB)  # only the CUDA context and our weights in use
    b = _Budget(0.9, weight_bytes=2 * GIB, peak=3 * GIB)
    assert ModelRunner.cuda_budget_bytes(b) == int(0.9 * 140 * GIB) - 2 * GIB - 3 * GIB


def test_kv_budget_shrinks_to_the_free_memory_beside_another_engine(device_memory):
    """The re-run case: another engine in this process holds most of the device."""
    other = LLM("qwen3-tiny", **small_engine_args())  # a live engine on the test's (CPU) device
    device_memory(free=12 * GIB, total=140 * GIB)
    b = _Budget(0.9, weight_bytes=2 * GIB, peak=3 * GIB)
    with pytest.warns(UserWarning, match=r"1 other minillm engine\(s\) in this process .*llm\.shutdown\(\)"):
        assert ModelRunner.cuda_budget_bytes(b) == 12 * GIB - 3 * GIB - FREE_MEMORY_RESERVE
    device_memory(free=4 * GIB, total=140 * GIB)  # not even one sequence fits: say what to do
    with pytest.raises(ValueError, match=r"one sequence of max_model_len=4096.*1 other minillm engine.*llm\.shutdown\(\)"):
        ModelRunner.cuda_budget_bytes(b)
    other.shutdown()  # a shut-down engine holds nothing: no longer named
    with pytest.raises(ValueError, match="other processes use the rest"):
        ModelRunner.cuda_budget_bytes(b)


def test_no_live_runner_is_left_behind():
    gc.collect()
    assert not [r for r in model_runner._LIVE_RUNNERS if r.memory.model is not None], \
        "an engine of an earlier test of this module still holds its memory"


# ---- CUDA: free memory comes back ------------------------------------------------------------------
def _free_gib(device: int = 0) -> float:
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0] / GIB


GPU_ARGS = dict(device="cuda", max_model_len=2048, max_num_seqs=32)


@pytest.mark.gpu
def test_three_engines_in_one_process_give_their_memory_back():
    torch.cuda.init()
    start = _free_gib()
    for i in range(3):
        llm = LLM("qwen3-0.6b-random", **GPU_ARGS)
        assert llm.engine.model_runner.graphs is not None, "CUDA graphs should be on"
        assert len(llm.generate(["Hello", "The capital of France is"], GREEDY, use_tqdm=False)) == 2
        used = start - _free_gib()
        llm.shutdown()
        now = _free_gib()
        print(f"engine {i}: held {used:.1f} GiB; free after shutdown {now:.2f} GiB (start {start:.2f})",
              file=sys.stderr)
        assert used > 10, f"engine {i} held only {used:.1f} GiB: did it size its KV cache from the device?"
        assert now > start - 1.0, f"after engine {i}'s shutdown {start - now:.2f} GiB are still held"
    del llm


@pytest.mark.gpu
def test_notebook_rerun_on_cuda_builds_beside_the_old_engine_then_frees_it():
    start = _free_gib()
    llm = LLM("qwen3-0.6b-random", **GPU_ARGS)
    want = llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = LLM("qwen3-0.6b-random", **GPU_ARGS)  # the re-run: the first engine is alive while this one builds
    print("warnings:", [str(w.message)[:200] for w in caught], file=sys.stderr)
    assert any("other minillm engine" in str(w.message) for w in caught), "the smaller KV cache went unexplained"
    assert llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
    llm.shutdown()
    assert _free_gib() > start - 1.0, "the first engine's memory was not given back when it was replaced"

    # when the old engine leaves room for the weights but not for their activations and one sequence's
    # KV cache, the error says what to do (a KV cache that leaves ~5 GiB free; the weights take ~2)
    hog = LLM("qwen3-0.6b-random", kv_cache_memory=int((_free_gib() - 5) * GIB), **GPU_ARGS)
    with pytest.raises(ValueError, match=r"other minillm engine.*llm\.shutdown\(\)"):
        LLM("qwen3-0.6b-random", **GPU_ARGS)
    hog.shutdown()
    assert _free_gib() > start - 1.0
