"""Chunked prefill: a prompt longer than max_num_batched_tokens is prefilled over several steps.

Greedy tokens must not depend on the chunking (several budgets, async scheduling on and off, prefix
caching, preemption, the triton backend under the interpreter); running requests decode between two
chunks of a long prompt; a block enters the prefix cache only once its K/V is computed.
Engine-level API throughout (LLMEngine.add_requests / step, Sequence.completion_token_ids).
"""
import random
from collections import deque

import pytest
import torch

from helpers import ref_path, small_engine_args
from minillm import SamplingParams
from minillm.config import EngineConfig
from minillm.engine.block_manager import BlockManager
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.scheduler import schedule_step
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.kernels.prefill_attention import prefill_attention
from test_kernels import SENTINEL, TOL, _packed, sdpa_reference

MODEL = ref_path("tiny-qwen3")  # vocabulary of 512
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def make_engine(**overrides) -> LLMEngine:
    args = small_engine_args(max_model_len=512)
    args.update(overrides)
    return LLMEngine(MODEL, EngineConfig(model=MODEL, **args))


def prompts_of(lengths, seed=0, prefix=()):
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(1, 500) for _ in range(n)] for n in lengths]


def generate(engine: LLMEngine, prompts, params=GREEDY) -> list[list[int]]:
    """Run the prompts to the end; every block comes back. -> each request's completion token ids."""
    seqs = engine.add_requests(prompts, [params] * len(prompts) if isinstance(params, SamplingParams) else params)
    while not engine.is_finished():
        engine.step()
    assert engine.scheduler.block_manager.num_free_blocks == engine.model_runner.num_kvcache_blocks
    return [s.completion_token_ids for s in seqs]


LONG_AND_SHORT = [100, 300, 7, 250, 12, 180]


@pytest.fixture(scope="module")
def unchunked():
    """Greedy tokens of LONG_AND_SHORT with a budget that fits every prompt (no chunk)."""
    return generate(make_engine(), prompts_of(LONG_AND_SHORT))


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("budget", [16, 33, 64])
def test_greedy_tokens_do_not_depend_on_chunking(unchunked, budget, async_scheduling):
    engine = make_engine(max_num_batched_tokens=budget, async_scheduling=async_scheduling)
    assert generate(engine, prompts_of(LONG_AND_SHORT)) == unchunked
    assert engine.num_prefill_tokens == sum(LONG_AND_SHORT)  # each chunk counted once, nothing twice
    assert engine.phase_seconds["prefill"] > 0 and engine.phase_seconds["decode"] > 0


def test_requests_arriving_while_a_prompt_is_chunked(unchunked):
    """Short requests added between the steps of a long prompt's chunks: the same tokens."""
    engine = make_engine(max_num_batched_tokens=33)
    prompts = prompts_of(LONG_AND_SHORT)
    first = engine.add_requests(prompts[:2], [GREEDY] * 2)
    for _ in range(4):
        engine.step()
    rest = engine.add_requests(prompts[2:], [GREEDY] * 4)
    while not engine.is_finished():
        engine.step()
    assert [s.completion_token_ids for s in first + rest] == unchunked


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_chunking_with_preemption(async_scheduling):
    """A KV cache of 34 blocks of 16 (max_model_len 512 needs 32): chunked prompts, decodes and
    preemptions (of running sequences and of a prompt half prefilled) give the roomy engine's tokens."""
    prompts = prompts_of([300, 120, 90, 200, 40])
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = generate(make_engine(), prompts, params)
    tight = make_engine(max_num_batched_tokens=48, num_kvcache_blocks=34, async_scheduling=async_scheduling)
    assert generate(tight, prompts, params) == want
    assert tight.scheduler.num_preemptions > 0


def test_chunking_with_prefix_caching():
    """Prompts sharing a 150-token prefix (9 full blocks), the first chunked: the later ones reuse the
    blocks its chunks computed, and the tokens equal an engine without chunks or prefix cache."""
    prompts = prompts_of([40, 60, 20, 90], seed=1, prefix=prompts_of([150], seed=2)[0])
    want = generate(make_engine(enable_prefix_caching=False), prompts)
    engine = make_engine(max_num_batched_tokens=32)
    seqs = engine.add_requests(prompts[:1], [GREEDY])
    for _ in range(3):  # two chunks of the first prompt computed, a third launched
        engine.step()
    seqs += engine.add_requests(prompts[1:], [GREEDY] * 3)
    while not engine.is_finished():
        engine.step()
    assert [s.completion_token_ids for s in seqs] == want
    assert engine.scheduler.block_manager.num_cached_tokens_total >= 3 * 144


def test_prefix_cache_holds_only_computed_blocks():
    """A chunked prompt's blocks past its chunk are not in the prefix cache; preempted (or aborted)
    half way, it leaves only the blocks it computed there, and a new request hits only those."""
    bm = BlockManager(num_blocks=16, block_size=4)
    (a,) = [Sequence(list(range(100, 130)), SamplingParams(), 4)]  # 30 tokens: 7 full blocks
    waiting, running = deque([a]), deque()
    out = schedule_step(waiting, running, bm, 8, 10)
    assert out == ([a], True, []) and (a.num_computed_tokens, a.num_new_tokens) == (10, 10)
    bm.cache_computed_blocks(a, a.num_computed_tokens)  # what Scheduler.schedule does
    assert sorted(bm.hash_to_block_id.values()) == a.block_table[:2]  # blocks 0-1 (tokens 0-7) only
    schedule_step(waiting, running, bm, 8, 10)  # the next chunk (nothing runs: no decode first)
    bm.cache_computed_blocks(a, a.num_computed_tokens)
    assert a.num_computed_tokens == 20 and sorted(bm.hash_to_block_id.values()) == a.block_table[:5]
    bm.deallocate(a)  # preempted or aborted here
    b = Sequence(list(range(100, 130)), SamplingParams(), 4)
    bm.allocate(b)
    assert b.num_cached_tokens == 20 == b.num_computed_tokens  # not 28: blocks 5 and 6 were never computed


def test_a_prompt_aborted_half_prefilled_leaves_only_computed_blocks_cached():
    """In the engine: a 200-token prompt aborted after two chunks of 32 leaves 4 full blocks of 16 in
    the prefix cache, not the 12 that allocate hashed; the same prompt again gets the right tokens."""
    prompt = prompts_of([200], seed=4)[0]
    want = generate(make_engine(enable_prefix_caching=False), [prompt])
    engine = make_engine(max_num_batched_tokens=32)
    (first,) = engine.add_requests([prompt], [GREEDY])
    engine.step()
    engine.step()  # two chunks launched: 64 tokens computed
    assert first.num_computed_tokens == 64 and not first.completion_token_ids
    engine.abort(first)
    (again,) = engine.add_requests([prompt], [GREEDY])
    engine.step()
    assert again.num_cached_tokens == 64  # (deallocate resets it when the request ends)
    while not engine.is_finished():
        engine.step()
    assert [again.completion_token_ids] == want


def test_decodes_run_between_the_chunks_of_a_long_prompt():
    """While a long prompt is prefilled in chunks, the running sequences decode after each chunk."""
    bm = BlockManager(num_blocks=64, block_size=4, enable_prefix_caching=False)
    a = Sequence(list(range(5)), SamplingParams(), 4)
    b = Sequence(list(range(1000, 1050)), SamplingParams(), 4)
    waiting, running = deque([a]), deque()
    assert schedule_step(waiting, running, bm, 8, 16) == ([a], True, [])
    a.append_token(1)
    waiting.append(b)
    kinds = []
    for _ in range(9):
        scheduled, is_prefill, preempted = schedule_step(waiting, running, bm, 8, 16)
        assert not preempted
        if is_prefill:
            assert scheduled == [b]
            kinds.append(f"chunk {b.num_new_tokens}")
            if b.num_computed_tokens == len(b):
                b.append_token(1)
        else:
            kinds.append("decode " + "".join("ab"[s is b] for s in scheduled))
            for s in scheduled:
                s.append_token(1)
    assert kinds == ["chunk 16", "decode a", "chunk 16", "decode a", "chunk 16", "decode a", "chunk 2",
                     "decode ab", "decode ab"]
    assert b.status == SequenceStatus.RUNNING and list(running) == [a, b]


def test_a_prompt_half_prefilled_is_preempted_first():
    """When a decode needs a block and none is free, the prompt being chunked (admitted last) is
    preempted before any running sequence; it restarts from scratch."""
    bm = BlockManager(num_blocks=5, block_size=4, enable_prefix_caching=False)
    a = Sequence(list(range(8)), SamplingParams(), 4)
    b = Sequence(list(range(100, 112)), SamplingParams(), 4)
    waiting, running = deque([a, b]), deque()
    assert schedule_step(waiting, running, bm, 8, 8) == ([a], True, [])  # a whole (2 blocks); b would make 20
    a.append_token(1)  # a's 9th token will need a third block
    assert schedule_step(waiting, running, bm, 8, 8) == ([b], True, [])  # b's first chunk: its 3 blocks, 0 free
    assert (b.num_computed_tokens, bm.num_free_blocks) == (8, 0)
    assert schedule_step(waiting, running, bm, 8, 8) == ([a], False, [b])  # decode first: a needs a block
    assert (list(waiting), list(running)) == ([b], [a])
    assert (b.block_table, b.num_computed_tokens, b.num_new_tokens, b.status) == ([], 0, 0, SequenceStatus.WAITING)
    a.append_token(1)
    assert schedule_step(waiting, running, bm, 8, 8) == ([a], False, [])  # b needs 3 blocks again; 2 are free


def test_seeded_sampling_does_not_depend_on_chunking():
    prompts = prompts_of([150, 20])
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=11)
    assert generate(make_engine(max_num_batched_tokens=40), prompts, params) == generate(make_engine(), prompts, params)


def test_triton_backend_with_chunks():
    """The triton prefill kernel (interpreter on CPU) reads the chunks of earlier steps from the cache."""
    prompts = prompts_of([90, 5, 60])
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    want = generate(make_engine(attention_backend="torch", max_model_len=128), prompts, params)
    got = generate(make_engine(attention_backend="triton", max_model_len=128, max_num_batched_tokens=40), prompts, params)
    assert got == want


@pytest.mark.gpu
def test_gpu_chunks_with_graphs_and_async_scheduling(unchunked):
    """On CUDA (fp32, triton backend, decode graphs, async scheduling): the same greedy tokens with
    chunks of 33 as the CPU engine without chunks."""
    engine = make_engine(device="cuda", attention_backend="triton", max_num_batched_tokens=33)
    assert engine.model_runner.graphs is not None
    assert generate(engine, prompts_of(LONG_AND_SHORT)) == unchunked
    engine.shutdown()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_kernel_chunk_after_unaligned_computed_keys(dtype):
    """Chunks start anywhere in a block (a budget of 33 tokens): queries after 33, 71 and 1 keys."""
    lengths_k, computed = [70, 100, 18], [33, 71, 1]
    lengths_q = [k - c for k, c in zip(lengths_k, computed)]
    H, hkv, d = 4, 2, 24
    qs, ks, vs, k_cache, v_cache, tables, cu_q, cu_k = _packed(lengths_q, lengths_k, H, hkv, d, 16, dtype)
    q = torch.cat(qs)
    out_buf = torch.full((q.shape[0] + 2, H, d), SENTINEL, dtype=dtype)
    got = prefill_attention(q, k_cache, v_cache, cu_q, cu_k, max(lengths_q), d ** -0.5, block_tables=tables,
                            out=out_buf[1:-1])
    assert (out_buf[0] == SENTINEL).all() and (out_buf[-1] == SENTINEL).all()
    want = torch.cat([sdpa_reference(qq, kk, vv) for qq, kk, vv in zip(qs, ks, vs)])
    torch.testing.assert_close(got.float(), want, **TOL[dtype])


def test_config_allows_a_budget_below_max_model_len_only_with_chunking():
    make_engine(max_num_batched_tokens=16)  # legal: chunked prefill is on by default
    with pytest.raises(ValueError, match="enable_chunked_prefill=True"):
        make_engine(max_num_batched_tokens=16, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="enable_chunked_prefill must be True or False"):
        make_engine(enable_chunked_prefill="yes")
    with pytest.raises(ValueError, match="max_num_batched_tokens must be a positive integer"):
        make_engine(max_num_batched_tokens=0)
