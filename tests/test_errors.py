"""Bad input raises ValueError with a clear message before any work, and the engine stays usable."""
import os
import shutil

import pytest

from helpers import ref_path, small_engine_args
from minillm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(ref_path("tiny-qwen3"), **small_engine_args(max_model_len=64))


@pytest.mark.parametrize("prompt, match", [
    ("", "empty"),
    ([], "empty"),
    ([1] * 64, "max_model_len"),
    ([1] * 100, "max_model_len"),
    ([1, 2, 10**6], "outside the vocabulary"),
    ([1, -1], "outside the vocabulary"),
])
def test_bad_prompts_raise_and_engine_stays_usable(llm, prompt, match):
    before = llm.generate([1, 2, 3], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match=match):
        llm.generate([[4, 5], prompt], GREEDY, use_tqdm=False)  # the good prompt must not run either
    sched = llm.engine.scheduler
    assert not sched.waiting and not sched.running
    assert llm.generate([1, 2, 3], GREEDY, use_tqdm=False) == before


def test_text_prompt_without_tokenizer(llm):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        llm.generate("hello", GREEDY, use_tqdm=False)


def test_wrong_number_of_params(llm):
    with pytest.raises(ValueError, match="SamplingParams"):
        llm.generate([[1], [2]], [GREEDY] * 3, use_tqdm=False)


def test_unknown_model_lists_embedded_names():
    with pytest.raises(ValueError, match="qwen3-tiny"):
        LLM("no-such-org/no-such-model-xyz", device="cpu")


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_kvcache_blocks=3), "too small for one"),
    (dict(max_model_len=100000), "max_position_embeddings"),
    (dict(max_num_batched_tokens=32, enable_chunked_prefill=False), "max_num_batched_tokens"),
    (dict(kvcache_block_size=24), "power of two"),
    (dict(tensor_parallel_size=3), "does not divide"),
    (dict(attention_backend="nope"), "attention_backend"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(no_such_arg=1), "unknown engine arguments"),
])
def test_bad_engine_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(ref_path("tiny-qwen3"), **small_engine_args(**kwargs))


def _copy_model(tmp_path, name="tiny-qwen3"):
    dst = tmp_path / name
    shutil.copytree(ref_path(name), dst)
    return dst


def test_missing_safetensors(tmp_path):
    d = _copy_model(tmp_path)
    os.remove(d / "model.safetensors")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        LLM(str(d), **small_engine_args())


@pytest.mark.parametrize("corruption", ["truncate", "garbage_header", "empty"])
def test_corrupt_safetensors(tmp_path, corruption):
    d = _copy_model(tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    if corruption == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif corruption == "garbage_header":
        f.write_bytes(data[:8] + b"{not json" + data[17:])
    else:
        f.write_bytes(b"")
    with pytest.raises(ValueError, match="model.safetensors"):
        LLM(str(d), **small_engine_args())


def test_missing_and_misshaped_tensors(tmp_path):
    from safetensors.torch import load_file, save_file
    d = _copy_model(tmp_path)
    tensors = load_file(d / "model.safetensors")
    partial = {k: v for k, v in tensors.items() if "layers.1.mlp.down_proj" not in k}
    save_file(partial, d / "model.safetensors")
    with pytest.raises(ValueError, match="missing"):
        LLM(str(d), **small_engine_args())
    bad = dict(tensors)
    bad["model.layers.0.self_attn.k_proj.weight"] = bad["model.layers.0.self_attn.k_proj.weight"][:-1]
    save_file(bad, d / "model.safetensors")
    with pytest.raises(ValueError, match="k_proj"):
        LLM(str(d), **small_engine_args())
    extra = dict(tensors)
    extra["model.layers.0.surprise.weight"] = tensors["model.norm.weight"].clone()
    save_file(extra, d / "model.safetensors")
    with pytest.raises(ValueError, match="surprise"):
        LLM(str(d), **small_engine_args())


def test_not_a_model_folder(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(tmp_path), **small_engine_args())


def test_vllms_names_of_the_kv_cache_arguments_are_aliases():
    """block_size, num_gpu_blocks_override and kv_cache_memory_bytes (vLLM's CacheConfig) set minillm's
    kvcache_block_size, num_kvcache_blocks and kv_cache_memory."""
    args = small_engine_args()
    del args["kvcache_block_size"]
    llm = LLM(ref_path("tiny-qwen3"), block_size=32, num_gpu_blocks_override=40, **args)
    try:
        assert (llm.config.kvcache_block_size, llm.config.num_kvcache_blocks) == (32, 40)
        assert llm.engine.scheduler.block_manager.block_size == 32
        assert llm.engine.model_runner.num_kvcache_blocks == 40
        assert llm.generate([1, 2, 3], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        budget = 50 * llm.engine.model_runner.kv_bytes_per_block()
    finally:
        llm.shutdown()
    llm = LLM(ref_path("tiny-qwen3"), block_size=32, kv_cache_memory_bytes=budget, **args)
    try:
        assert llm.config.kv_cache_memory == budget and llm.engine.model_runner.num_kvcache_blocks == 50
    finally:
        llm.shutdown()


@pytest.mark.parametrize("alias, name, value", [("block_size", "kvcache_block_size", 16),
                                                ("num_gpu_blocks_override", "num_kvcache_blocks", 40),
                                                ("kv_cache_memory_bytes", "kv_cache_memory", 1 << 20)])
def test_an_engine_argument_in_both_spellings_is_refused(alias, name, value):
    args = dict(small_engine_args(), **{alias: value, name: value})
    with pytest.raises(ValueError, match=f"{alias} .*and {name} are the same engine argument"):
        LLM(ref_path("tiny-qwen3"), **args)
