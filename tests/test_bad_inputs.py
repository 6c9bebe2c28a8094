"""The standing battery of bad input (issue 22).

Every case asserts the exception type and a key phrase of its message, then that the engine is
still whole: nothing of the failed call stays queued, and the engine gives the same greedy tokens as
a fresh engine did. Engines are shared across cases (module fixtures); cases that must fail while an
engine is being built check that no model runner was built at all (the check came first).

Sections: prompts and call shapes; SamplingParams; engine arguments; config.json; safetensors;
non-file paths; tokenizer files; chat messages; the request lifecycle (streams, aborts, threads,
tensor parallel); stream vs generate with stop strings (SmolLM2); the command line (subprocesses).
"""
from __future__ import annotations

import gc
import json
import math
import os
import signal
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from helpers import one_torch_thread, ref_path, small_engine_args  # noqa: F401 (one_torch_thread: an autouse fixture)
from minillm import LLM, SamplingParams
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.sequence import PLACEHOLDER_TOKEN
from minillm.model_zoo import resolve_model

TINY = ref_path("tiny-qwen3")  # no tokenizer: token-id prompts
ARGS = small_engine_args(max_model_len=64)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROBE_IDS = [[1, 2, 3], [7, 8, 9, 10, 11]]
PROBE_TEXT = ["Hello", "The capital of France is"]
STREAM_TIMEOUT_S = 120  # a stream that hangs fails the test instead of stalling CI
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
class _Delete:
    def __repr__(self) -> str:  # test ids name it the same in every process (pytest-xdist workers)
        return "DELETE"


DELETE = _Delete()  # a config edit that removes the key


# ---- shared engines and the health check -----------------------------------------------------------


def greedy_tokens(llm, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny():
    """One engine for every token-id case, and what a fresh engine answers to the probe prompts."""
    fresh = LLM(TINY, **ARGS)
    want = greedy_tokens(fresh, PROBE_IDS)
    fresh.shutdown()
    llm = LLM(TINY, **ARGS)
    llm.want = want
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def qwen():
    """qwen3-tiny (real Qwen tokenizer, chat template) for text, chat and stop-string cases."""
    fresh = LLM("qwen3-tiny", **ARGS)
    want = greedy_tokens(fresh, PROBE_TEXT)
    fresh.shutdown()
    llm = LLM("qwen3-tiny", **ARGS)
    llm.want = want
    yield llm
    llm.shutdown()


def assert_whole(llm, probe=PROBE_IDS) -> None:
    """Nothing queued or half done, the default dtype restored, and a fresh engine's greedy tokens."""
    e = llm.engine
    assert not e.requests and not e.scheduler.waiting and not e.scheduler.running
    assert torch.get_default_dtype() == torch.float32
    assert greedy_tokens(llm, probe) == llm.want


@pytest.fixture
def no_runner(monkeypatch):
    """Cases that must fail before any weight or KV-cache memory is taken: building a runner fails the test."""
    def built(*args, **kwargs):
        raise AssertionError("the model runner was built: the bad input was caught too late")
    monkeypatch.setattr(LLMEngine, "_make_runner", built)


def linked_folder(dst, src: str, files: dict | None = None) -> str:
    """A model folder whose files are symbolic links to src's, except `files`: name -> bytes to write
    (or a callable making the entry, or None to leave it out)."""
    files = files or {}
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if not name.startswith(".") and name not in files:
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
    for name, content in files.items():
        path = os.path.join(dst, name)
        if callable(content):
            content(path)
        elif content is not None:
            with open(path, "wb") as f:
                f.write(content)
    return str(dst)


# ---- 1. prompts and the shape of a call ------------------------------------------------------------
BAD_PROMPTS = [
    ([], "empty"),
    ([1] * 64, "max_model_len"),
    ([1] * 1000, "max_model_len"),
    ([1, 2, 10**6], "outside the vocabulary"),
    ([1, -1], "outside the vocabulary"),
    ([1, 2**70], "outside the vocabulary"),
    ([1.0, 2.0], "must hold integers"),
    ([1, 2.5], "position 1 holds 2.5"),
    ([True, 1], "position 0 holds True"),
    ([1, "2"], "must hold integers"),
    ([1, None], "must hold integers"),
    ([[1, 2]], "must hold integers"),
    (np.array([1.0, 2.0]), "must hold integers"),
    (np.array([], dtype=np.int64), "empty"),
    (np.array([1, 10**6]), "outside the vocabulary"),
    (torch.tensor([1.5, 2.0]), "must hold integers"),
    (None, "must be a string or a list of token ids"),
    (5, "must be a string or a list of token ids"),
    (5.5, "must be a string or a list of token ids"),
    ({"a": 1}, "a prompt dict must hold exactly one of"),
    ({"prompt_token_ids": "hello"}, "holds a list of token ids, got 'hello'"),  # vLLM's TokensPrompt
    ({"prompt_token_ids": 5}, "holds a list of token ids, got 5"),
    ({"prompt": [1, 2]}, "holds text, got"),  # vLLM's TextPrompt
    (b"abc", "must be a string or a list of token ids"),
    (bytearray(b"abc"), "must be a string or a list of token ids"),
    ({1, 2}, "must be a string or a list of token ids"),
    ("hello", "no tokenizer.json"),
]


@pytest.mark.parametrize("prompt, phrase", BAD_PROMPTS, ids=[repr(p)[:40] for p, _ in BAD_PROMPTS])
def test_bad_token_prompt_queues_nothing(tiny, prompt, phrase):
    with pytest.raises(ValueError, match="prompt 1: .*" + phrase):
        tiny.generate([[4, 5], prompt], GREEDY, use_tqdm=False)  # the good first prompt must not run either
    assert_whole(tiny)


BAD_TEXT = [
    ("", "the prompt is empty"),
    ("\ud800", "lone surrogate"),
    ("fine until \udcff", "lone surrogate"),
    ("word " * 2000, "max_model_len"),
]


@pytest.mark.parametrize("prompt, phrase", BAD_TEXT, ids=["empty", "surrogate", "surrogate-late", "too-long"])
def test_bad_text_prompt_queues_nothing(qwen, prompt, phrase):
    with pytest.raises(ValueError, match="prompt 1: .*" + phrase):
        qwen.generate(["fine", prompt], GREEDY, use_tqdm=False)
    assert_whole(qwen, PROBE_TEXT)


BAD_CALLS = [
    ([], None, "no prompts given"),
    ({"a": 1}, None, "a prompt dict must hold exactly one of"),
    (None, None, "prompts must be a string, a list of token ids"),
    (7, None, "prompts must be a string, a list of token ids"),
    (b"bytes", None, "prompts must be a string, a list of token ids"),
    ([[1, 2], [3]], [GREEDY, None], "prompt 1: sampling params must be a SamplingParams, got None"),
    ([[1, 2], [3]], [GREEDY, {"temperature": 0}], "prompt 1: sampling params must be a SamplingParams"),
    ([[1, 2], [3]], {"temperature": 0}, "sampling_params must be a SamplingParams, a list of them"),
    ([[1, 2], [3]], "greedy", "sampling_params must be a SamplingParams, a list of them"),
    ([[1, 2], [3]], [GREEDY] * 3, "got 3 SamplingParams for 2 prompts"),
    ([[1, 2], [3]], [GREEDY, SamplingParams(stop=["x"])], "prompt 1: stop strings need a tokenizer"),
]


@pytest.mark.parametrize("prompts, params, phrase", BAD_CALLS, ids=[c[2][:30] for c in BAD_CALLS])
def test_bad_call_shape_queues_nothing(tiny, prompts, params, phrase):
    with pytest.raises(ValueError, match=phrase):
        tiny.generate(prompts, params, use_tqdm=False)
    assert_whole(tiny)


GOOD_PROMPT_FORMS = [(1, 2, 3), np.array([1, 2, 3]), [np.int64(1), np.int32(2), 3], torch.tensor([1, 2, 3]),
                     np.array([[1, 2, 3]])]


@pytest.mark.parametrize("prompt", GOOD_PROMPT_FORMS, ids=["tuple", "ndarray", "numpy-ints", "tensor", "2d-array"])
def test_other_integer_prompt_forms_give_the_list_tokens(tiny, prompt):
    out = tiny.generate(prompt, GREEDY, use_tqdm=False)[0]  # (a 2-D array is a list of prompts)
    assert out.outputs[0].token_ids == greedy_tokens(tiny, [[1, 2, 3]])[0]
    assert_whole(tiny)


# ---- 2. SamplingParams -----------------------------------------------------------------------------
BAD_PARAMS = [
    ("temperature", math.nan), ("temperature", math.inf), ("temperature", -math.inf), ("temperature", -0.1),
    ("temperature", "0.5"), ("temperature", None), ("temperature", True), ("temperature", [1.0]),
    ("temperature", 1j), ("temperature", 2.5),  # vLLM's range: [0, 2]
    ("top_p", 0), ("top_p", -0.5), ("top_p", 1.5), ("top_p", math.nan), ("top_p", math.inf), ("top_p", "1"),
    ("top_p", None), ("top_p", True),
    ("top_k", -2), ("top_k", 10**30), ("top_k", 2**63), ("top_k", 1.5), ("top_k", 5.0),
    ("top_k", "5"), ("top_k", True), ("top_k", None),
    ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", 1.5), ("max_tokens", "10"),  # None: up to max_model_len
    ("max_tokens", True), ("max_tokens", math.inf),
    ("ignore_eos", 1), ("ignore_eos", "yes"), ("ignore_eos", None),
    ("seed", -2**63 - 1), ("seed", 2**64), ("seed", 2**63), ("seed", 1.5), ("seed", "42"), ("seed", True),
    ("seed", math.nan),
    ("stop_token_ids", 5), ("stop_token_ids", "5"), ("stop_token_ids", [-1]), ("stop_token_ids", [1.5]),
    ("stop_token_ids", ["a"]), ("stop_token_ids", [2**64]), ("stop_token_ids", [True]),
    ("stop", 5), ("stop", [""]), ("stop", ""), ("stop", [5]), ("stop", [None]), ("stop", [b"x"]), ("stop", {"a"}),
    ("bad_words", "hello"), ("bad_words", 5), ("bad_words", [""]), ("bad_words", [" \n "]), ("bad_words", [5]),
    ("bad_words", [None]), ("bad_words", [b"x"]), ("bad_words", ["\ud800"]), ("bad_words", {"a"}),
    ("truncate_prompt_tokens", 0), ("truncate_prompt_tokens", -2), ("truncate_prompt_tokens", 1.5),
    ("truncate_prompt_tokens", 5.0), ("truncate_prompt_tokens", "5"), ("truncate_prompt_tokens", True),
    ("truncate_prompt_tokens", 2**63), ("truncate_prompt_tokens", math.inf),
    ("skip_special_tokens", 0), ("skip_special_tokens", "false"), ("skip_special_tokens", None),
    ("detokenize", 1), ("detokenize", "true"), ("detokenize", None),
    ("output_kind", 3), ("output_kind", -1), ("output_kind", "DELTA"), ("output_kind", 1.0), ("output_kind", None),
    ("output_kind", True),
]


@pytest.mark.parametrize("name, value", BAD_PARAMS, ids=[f"{n}={v!r}" for n, v in BAD_PARAMS])
def test_bad_sampling_value_names_the_field(tiny, name, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{name} must be"):
        SamplingParams(**{name: value})
    assert_whole(tiny)


def test_greedy_sampling_takes_one_sample(tiny):
    """vLLM's _verify_greedy_sampling: n greedy samples would all be the same; the message says what to do."""
    with pytest.raises(ValueError, match=r"SamplingParams.n must be 1 when temperature is 0 .*got n=2: set a "
                                         r"temperature above 0 .* or use beam search"):
        SamplingParams(n=2, temperature=0.0)
    assert SamplingParams(n=2, temperature=0.5).n == 2 and SamplingParams(n=1, temperature=0.0).n == 1
    assert_whole(tiny)


CHANGED_AFTER = [("temperature", math.nan), ("seed", 2**64), ("top_k", 10**30), ("max_tokens", 0),
                 ("stop", 5), ("stop_token_ids", 5), ("top_p", 2.0), ("ignore_eos", "no"), ("bad_words", [""]),
                 ("truncate_prompt_tokens", 0), ("detokenize", "no"), ("n", 2)]  # n=2: greedy, as below


@pytest.mark.parametrize("name, value", CHANGED_AFTER, ids=[f"{n}={v!r}" for n, v in CHANGED_AFTER])
def test_a_field_changed_after_construction_is_caught_before_queueing(tiny, name, value):
    bad = SamplingParams(temperature=0.0, max_tokens=4)
    setattr(bad, name, value)  # a dataclass: nothing stops this
    with pytest.raises(ValueError, match=f"prompt 1: SamplingParams.{name} must be"):
        tiny.generate([[1, 2], [3, 4]], [GREEDY, bad], use_tqdm=False)
    assert_whole(tiny)


# values only the engine can refuse: they need its max_model_len (64 here) or its tokenizer
BAD_FOR_THE_ENGINE = [
    ("tiny", [1, 2], dict(truncate_prompt_tokens=64), "truncate_prompt_tokens must be at most max_model_len - "
     r"max_tokens = 64 - 6 = 58 \(-1 keeps that many\), got 64"),
    ("tiny", [1, 2], dict(truncate_prompt_tokens=-1, max_tokens=64), r"= 64 - 64 = 0 .*got -1; lower max_tokens"),
    ("tiny", [1, 2, 10**6], dict(truncate_prompt_tokens=2), "outside the vocabulary"),  # what is kept is checked
    ("tiny", [1, 2], dict(bad_words=["x"]), "bad_words need a tokenizer"),
    ("qwen", "Hi", dict(bad_words=[f"w{i}" for i in range(129)]), "at most 128 token sequences"),
    ("qwen", "Hi", dict(bad_words=["7" * 1100]), "of 1024 tokens in all"),  # (Qwen: a token per digit)
]


@pytest.mark.parametrize("engine, prompt, fields, phrase", BAD_FOR_THE_ENGINE,
                         ids=[f"{e}-{list(f)[0]}-{i}" for i, (e, _, f, _) in enumerate(BAD_FOR_THE_ENGINE)])
def test_sampling_values_the_engine_refuses_queue_nothing(request, engine, prompt, fields, phrase):
    llm = request.getfixturevalue(engine)
    good = [4, 5] if engine == "tiny" else "fine"
    bad = SamplingParams(**{"temperature": 0.0, "max_tokens": 6, **fields})
    with pytest.raises(ValueError, match="prompt 1: .*" + phrase):
        llm.generate([good, prompt], [GREEDY, bad], use_tqdm=False)
    assert_whole(llm, PROBE_IDS if engine == "tiny" else PROBE_TEXT)


def test_bad_words_outside_the_vocabulary_are_refused(tiny):
    """A tokenizer larger than the model's vocabulary (vLLM checks the ids a bad word gives, too)."""
    with LLM(TINY, tokenizer="qwen3-tiny", **ARGS) as llm:
        with pytest.raises(ValueError, match=r"prompt 1: SamplingParams.bad_words tokenize to token ids "
                                             r"\[14990, 23811\] outside the vocabulary \[0, 512\)"):
            llm.generate([[1, 2], [3]], [GREEDY, SamplingParams(bad_words=["hello"])], use_tqdm=False)
        assert not llm.engine.requests and not llm.engine.scheduler.waiting
    assert_whole(tiny)


def test_numpy_numbers_are_accepted_as_python_numbers(tiny):
    sp = SamplingParams(temperature=np.float32(0.0), top_k=np.int64(5), seed=np.int64(3), max_tokens=np.int64(6),
                        ignore_eos=True, stop_token_ids=np.array([7, 8]).tolist(), stop="x")
    assert (type(sp.temperature), type(sp.top_k), type(sp.seed), type(sp.max_tokens)) == (float, int, int, int)
    assert sp.stop == ["x"]
    assert_whole(tiny)


def test_a_request_keeps_its_own_copy_of_the_params(tiny):
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    seq = tiny.engine.add_request([1, 2, 3], sp)
    sp.max_tokens, sp.temperature = 1, math.nan  # too late to change this request
    while not seq.is_finished:
        tiny.engine.step()
    assert tiny.engine.completion(seq).token_ids == tiny.want[0]
    assert_whole(tiny)


# ---- 3. engine arguments ---------------------------------------------------------------------------
BAD_ENGINE_ARGS = [
    (dict(num_kvcache_blocks=3), "too small for one"),
    (dict(num_kvcache_blocks=0), "num_kvcache_blocks must be"),
    (dict(num_kvcache_blocks=1e9), "num_kvcache_blocks must be"),
    (dict(num_kvcache_blocks=2**40), "num_kvcache_blocks must be"),
    (dict(num_kvcache_blocks=2**30), "asks for .* of KV cache"),
    (dict(kv_cache_memory=10**15), "asks for .* of KV cache"),
    (dict(kv_cache_memory=1e15), "kv_cache_memory must be"),
    (dict(kv_cache_memory=0), "kv_cache_memory must be"),
    (dict(kv_cache_memory=-1), "kv_cache_memory must be"),
    (dict(kv_cache_memory=100), "too small for one"),
    (dict(max_model_len=100000), "max_position_embeddings"),
    (dict(max_model_len=1), "max_model_len must be"),
    (dict(max_model_len=1.5), "max_model_len must be"),
    (dict(max_model_len="64"), "max_model_len must be"),
    (dict(max_num_batched_tokens=32, enable_chunked_prefill=False), "max_num_batched_tokens"),
    (dict(max_num_batched_tokens=2**40), "max_num_batched_tokens must be"),
    (dict(kvcache_block_size=24), "power of two"),
    (dict(kvcache_block_size=8), "power of two"),
    (dict(kvcache_block_size=0), "kvcache_block_size must be"),
    (dict(tensor_parallel_size=3), "does not divide"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be"),
    (dict(tensor_parallel_size="2"), "tensor_parallel_size must be"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_seqs=-1), "max_num_seqs"),
    (dict(max_num_seqs=1.5), "max_num_seqs"),
    (dict(max_num_seqs=True), "max_num_seqs"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=math.nan), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization="0.5"), "gpu_memory_utilization"),
    (dict(attention_backend="nope"), "attention_backend"),
    (dict(attention_backend=None), "attention_backend"),
    (dict(attention_backend=["torch"]), "attention_backend"),
    (dict(device="tpu"), "device must be one of"),
    (dict(device=None), "device must be one of"),
    (dict(dtype="float64"), "dtype must be one of"),
    (dict(dtype=["float32"]), "dtype must be one of"),
    (dict(enforce_eager="yes"), "enforce_eager must be True or False"),
    (dict(enable_prefix_caching=1), "enable_prefix_caching must be True or False"),
    (dict(async_scheduling=None), "async_scheduling must be True or False"),
    (dict(trust_remote_code="yes"), "trust_remote_code must be True or False"),
    (dict(seed=-1), "seed must be"),
    (dict(seed=2**64), "seed must be"),
    (dict(seed="0"), "seed must be"),
    (dict(no_such_arg=1), "unknown engine arguments"),
]


@pytest.mark.parametrize("kwargs, phrase", BAD_ENGINE_ARGS, ids=[repr(k)[:40] for k, _ in BAD_ENGINE_ARGS])
def test_bad_engine_argument_fails_before_anything_is_built(tiny, no_runner, kwargs, phrase):
    with pytest.raises(ValueError, match=phrase):
        LLM(TINY, **small_engine_args(**kwargs))
    assert_whole(tiny)


def test_vllm_arguments_minillm_has_nothing_for_are_accepted_at_their_unused_values(tiny):
    """trust_remote_code (minillm runs no checkpoint code) and lora_request=None, which vLLM scripts pass:
    accepted, the same tokens; a LoRA adapter is a ValueError that says how to use one anyway."""
    trusting = LLM(TINY, **ARGS, trust_remote_code=True)
    try:
        assert greedy_tokens(trusting, PROBE_IDS) == tiny.want
        assert [o.outputs[0].token_ids for o in trusting.generate(PROBE_IDS, GREEDY, use_tqdm=False,
                                                                  lora_request=None)] == tiny.want
    finally:
        trusting.shutdown()
    with pytest.raises(ValueError, match="lora_request must be None, got .*merge_and_unload"):
        tiny.generate(PROBE_IDS, GREEDY, use_tqdm=False, lora_request=("adapter", 1, "/path"))
    assert_whole(tiny)


@pytest.mark.parametrize("model", [5, None, ["qwen3-tiny"]], ids=["int", "None", "list"])
def test_model_must_be_a_name_or_a_path(tiny, no_runner, model):
    with pytest.raises(ValueError, match="model must be a name or a folder path"):
        LLM(model, **ARGS)
    assert_whole(tiny)


# ---- 4. config.json --------------------------------------------------------------------------------
with open(os.path.join(TINY, "config.json")) as _f:
    TINY_CONFIG = json.load(_f)

BAD_CONFIGS = [
    ({"vocab_size": DELETE}, "vocab_size must be .* it is missing"),
    ({"hidden_size": DELETE}, "hidden_size must be .* it is missing"),
    ({"intermediate_size": DELETE}, "intermediate_size must be"),
    ({"num_hidden_layers": DELETE}, "num_hidden_layers must be"),
    ({"num_attention_heads": DELETE}, "num_attention_heads must be"),
    ({"vocab_size": 0}, "vocab_size must be"),
    ({"vocab_size": "512"}, "vocab_size must be .* got '512' \\(str\\)"),
    ({"vocab_size": 2**40}, "vocab_size must be"),
    ({"hidden_size": -1}, "hidden_size must be"),
    ({"hidden_size": 0}, "hidden_size must be"),
    ({"hidden_size": 64.0}, "hidden_size must be"),
    ({"hidden_size": True}, "hidden_size must be"),
    ({"hidden_size": [64]}, "hidden_size must be"),
    ({"intermediate_size": 1e12}, "intermediate_size must be"),
    ({"intermediate_size": -128}, "intermediate_size must be"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be"),
    ({"num_hidden_layers": -3}, "num_hidden_layers must be"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers must be"),
    ({"num_attention_heads": 0}, "num_attention_heads must be"),
    ({"num_attention_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"num_key_value_heads": "2"}, "num_key_value_heads must be"),
    ({"head_dim": 0}, "head_dim must be"),
    ({"head_dim": 31}, "head_dim must be even"),
    ({"head_dim": DELETE, "hidden_size": 66}, "hidden_size=66 is not a multiple of num_attention_heads"),
    ({"max_position_embeddings": 1}, "max_position_embeddings must be"),
    ({"max_position_embeddings": "512"}, "max_position_embeddings must be"),
    ({"rms_norm_eps": 0}, "rms_norm_eps must be"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be"),
    ({"rms_norm_eps": math.nan}, "rms_norm_eps must be"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps must be"),
    ({"rope_parameters": {"rope_theta": 0, "rope_type": "default"}}, "rope_theta must be"),
    ({"rope_parameters": {"rope_theta": -1.0}}, "rope_theta must be"),
    ({"rope_parameters": {"rope_theta": math.inf}}, "rope_theta must be"),
    ({"rope_parameters": {"rope_theta": "1e4"}}, "rope_theta must be"),
    ({"rope_parameters": "default"}, "rope_parameters must be an object"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supported"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({"attention_bias": 1}, "attention_bias must be true or false"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"model_type": DELETE}, "model_type '' is not supported"),
    ({"model_type": 5}, "model_type 5 is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"hidden_act": 5}, "hidden_act must be a string"),
    ({"dtype": "int8"}, "dtype must be one of"),
    ({"dtype": 5}, "dtype must be a string"),
    ({"eos_token_id": "x"}, "eos_token_id must be a token id"),
    ({"eos_token_id": [2, "a"]}, "eos_token_id must be a token id"),
    ({"eos_token_id": -1}, "eos_token_id must be a token id"),
    ({"bos_token_id": [1, 2]}, "bos_token_id must be one token id"),
    ({"bos_token_id": 1.5}, "bos_token_id must be a token id"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantized checkpoints"),
    ({"num_hidden_layers": 10**9}, "config.json describes about .* of float32 weights"),
    ({"intermediate_size": 2**31 - 1, "num_hidden_layers": 1000}, "config.json describes about"),
    ({"vocab_size": 2**31 - 1, "hidden_size": 2**20, "head_dim": 64}, "config.json describes about"),
]


def _config_bytes(edit: dict) -> bytes:
    cfg = dict(TINY_CONFIG)
    for key, value in edit.items():
        if value is DELETE:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return json.dumps(cfg).encode()  # json writes NaN and Infinity, and reads them back


@pytest.mark.parametrize("edit, phrase", BAD_CONFIGS, ids=[repr(e)[:50] for e, _ in BAD_CONFIGS])
def test_bad_config_field_names_the_file_and_the_field(tiny, no_runner, tmp_path, edit, phrase):
    folder = linked_folder(tmp_path / "m", TINY, {"config.json": _config_bytes(edit)})
    with pytest.raises(ValueError, match=phrase if phrase.startswith("config.json") else "config.json.*" + phrase):
        LLM(folder, **ARGS)
    assert_whole(tiny)


BAD_JSON_FILES = [
    ("config.json", b"{not json", "config.json is not valid JSON: .* line 1"),
    ("config.json", b"", "config.json is not valid JSON"),
    ("config.json", b"[1, 2]", "config.json must hold a JSON object"),
    ("config.json", b'"qwen3"', "config.json must hold a JSON object"),
    ("config.json", b'{"model_type": "qwen3", \xff}', "config.json is not UTF-8 text"),
    ("config.json", b"[" * 100000 + b"]" * 100000, "config.json is not valid JSON: nested too deeply"),
    ("generation_config.json", b"{oops", "generation_config.json is not valid JSON"),
    ("generation_config.json", b"[]", "generation_config.json must hold a JSON object"),
    ("generation_config.json", b'{"eos_token_id": "x"}', "generation_config.json: eos_token_id must be"),
]


@pytest.mark.parametrize("name, content, phrase", BAD_JSON_FILES, ids=[p[:30] for _, _, p in BAD_JSON_FILES])
def test_a_file_that_is_not_the_json_it_should_be_is_named(tiny, no_runner, tmp_path, name, content, phrase):
    folder = linked_folder(tmp_path / "m", TINY, {name: content})
    with pytest.raises(ValueError, match=phrase):
        LLM(folder, **ARGS)
    assert_whole(tiny)


# ---- 5. safetensors --------------------------------------------------------------------------------
def _read_safetensors(path: str) -> tuple[dict, bytes]:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _safetensors_bytes(header, body: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def _edit_entry(name: str, **changes):
    def edit(header, body):
        header[name] = {**header[name], **changes}
        return _safetensors_bytes(header, body)
    return edit


EMBED, LM_HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
BAD_SAFETENSORS = [
    ("overlap", _edit_entry(EMBED, data_offsets=[0, 131072]), "overlaps the tensor before it"),
    ("inside-another", _edit_entry(NORM, data_offsets=[0, 256]), "invalid offsets"),
    ("gap", _edit_entry(EMBED, data_offsets=[131076, 262148]), "4 bytes before it that no tensor owns"),
    ("relabel-I32", _edit_entry(LM_HEAD, dtype="I32"), "model weights are floating point"),
    ("relabel-I16", _edit_entry(LM_HEAD, dtype="I16"), "has 65536 bytes but its offsets"),
    ("relabel-BF16", _edit_entry(LM_HEAD, dtype="BF16"), "has 65536 bytes but its offsets"),
    ("relabel-BOOL", _edit_entry(LM_HEAD, dtype="BOOL"), "bytes but its offsets"),
    ("unknown-dtype", _edit_entry(LM_HEAD, dtype="F8_E4M3"), "unknown dtype 'F8_E4M3'"),
    ("lowercase-dtype", _edit_entry(LM_HEAD, dtype="f32"), "unknown dtype 'f32'"),
    ("shape-larger", _edit_entry(LM_HEAD, shape=[512, 65]), "bytes but its offsets"),
    ("shape-scalar", _edit_entry(LM_HEAD, shape=[]), "bytes but its offsets"),
    ("negative-shape", _edit_entry(LM_HEAD, shape=[-512, 64]), "is malformed"),
    ("reversed-offsets", _edit_entry(LM_HEAD, data_offsets=[131072, 0]), "is malformed"),
    ("no-dtype", _edit_entry(LM_HEAD, dtype=None), "is malformed"),
    ("trailing-bytes", lambda h, b: _safetensors_bytes(h, b + b"\0" * 16), "bytes that no tensor owns"),
    ("data-truncated", lambda h, b: _safetensors_bytes(h, b[:-4]), "the tensors end at byte"),
    ("header-huge", lambda h, b: struct.pack("<Q", 2**62) + b"{}", "claims more than"),
    ("header-past-end", lambda h, b: struct.pack("<Q", 10**6) + b"{}", "header claims 1000000 bytes"),
    ("header-not-json", lambda h, b: _safetensors_bytes(b"{not json}", b), "not valid JSON"),
    ("header-not-utf8", lambda h, b: _safetensors_bytes(b'{"\xff": 1}', b), "not valid JSON"),
    ("header-a-list", lambda h, b: _safetensors_bytes(b"[1, 2]", b), "not a JSON object"),
    ("empty-file", lambda h, b: b"", "empty file"),
    ("five-bytes", lambda h, b: b"\x01\x02\x03\x04\x05", "too short"),
]


@pytest.mark.parametrize("corrupt, phrase", [c[1:] for c in BAD_SAFETENSORS], ids=[c[0] for c in BAD_SAFETENSORS])
def test_corrupt_safetensors_is_refused_as_the_safetensors_library_does(tiny, tmp_path, corrupt, phrase):
    header, body = _read_safetensors(os.path.join(TINY, "model.safetensors"))
    folder = linked_folder(tmp_path / "m", TINY, {"model.safetensors": corrupt(header, body)})
    with pytest.raises(ValueError, match="model.safetensors: .*" + phrase):
        LLM(folder, **ARGS)
    assert_whole(tiny)


def _tensors_edit(kind: str):
    def write(path):
        from safetensors.torch import load_file, save_file
        tensors = load_file(os.path.join(TINY, "model.safetensors"))
        if kind == "missing":
            tensors = {k: v for k, v in tensors.items() if "layers.1.mlp.down_proj" not in k}
        elif kind == "misshaped":
            tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:-1]
        else:
            tensors["model.layers.0.surprise.weight"] = tensors[NORM].clone()
        save_file(tensors, path)
    return write


@pytest.mark.parametrize("kind, phrase", [("missing", "missing tensors"), ("misshaped", "k_proj.*shape"),
                                          ("extra", "unexpected tensor 'model.layers.0.surprise.weight'")])
def test_checkpoint_that_does_not_match_its_config(tiny, tmp_path, kind, phrase):
    folder = linked_folder(tmp_path / "m", TINY, {"model.safetensors": _tensors_edit(kind)})
    with pytest.raises(ValueError, match=phrase):
        LLM(folder, **ARGS)
    assert_whole(tiny)


# ---- 6. paths that are not files -------------------------------------------------------------------
def _folder(path):
    os.mkdir(path)


def _loop(path):
    os.symlink(path, path)


def _dangling(path):
    os.symlink(path + ".nowhere", path)


def _fifo(path):
    os.mkfifo(path)


NOT_FILES = [
    ("model.safetensors", _folder, "model.safetensors is a folder, not a file"),
    ("model.safetensors", _loop, "model.safetensors is a symbolic link loop"),
    ("model.safetensors", _dangling, "model.safetensors is a symbolic link to .*which does not exist"),
    ("model.safetensors", _fifo, "model.safetensors is not a regular file"),
    ("config.json", _folder, "config.json is a folder"),
    ("config.json", _dangling, "config.json is a symbolic link to"),
    ("config.json", _loop, "config.json is a symbolic link loop"),
    ("generation_config.json", _loop, "generation_config.json is a symbolic link loop"),
    ("generation_config.json", _fifo, "generation_config.json is not a regular file"),
]


@pytest.mark.parametrize("name, make, phrase", NOT_FILES, ids=[f"{n}-{m.__name__[1:]}" for n, m, _ in NOT_FILES])
def test_a_path_that_is_not_a_file_is_refused(tiny, tmp_path, name, make, phrase):
    folder = linked_folder(tmp_path / "m", TINY, {name: make})
    with pytest.raises(ValueError, match=phrase):
        LLM(folder, **ARGS)
    assert_whole(tiny)


def test_a_model_path_that_is_a_file(tiny, tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"not a folder")
    with pytest.raises(ValueError, match="is a file; pass the model folder"):
        LLM(str(path), **ARGS)
    assert_whole(tiny)


# ---- 7. tokenizer files ----------------------------------------------------------------------------
BAD_TOKENIZER_FILES = [
    ("tokenizer.json", b"{not json", "tokenizer.json is not a valid tokenizer.json"),
    ("tokenizer.json", b"{}", "tokenizer.json is not a valid tokenizer.json"),
    ("tokenizer.json", b"", "tokenizer.json is not a valid tokenizer.json"),
    ("tokenizer.json", b'{"model": \xff}', "tokenizer.json is not UTF-8 text"),
    ("tokenizer.json", _folder, "tokenizer.json is a folder"),
    ("tokenizer.json", _dangling, "tokenizer.json is a symbolic link to"),
    ("tokenizer_config.json", b"{oops", "tokenizer_config.json is not valid JSON"),
    ("tokenizer_config.json", b"[]", "tokenizer_config.json must hold a JSON object"),
    ("tokenizer_config.json", b'{"chat_template": 5}', "chat_template must be a string"),
    ("tokenizer_config.json", b'{"eos_token": 5}', "eos_token must be a string"),
    ("tokenizer_config.json", b'{"bos_token": {"content": 1}}', "bos_token must be a string"),
    ("chat_template.jinja", b"{{ \xff }}", "chat_template.jinja is not UTF-8 text"),
]


@pytest.mark.parametrize("name, content, phrase", BAD_TOKENIZER_FILES,
                         ids=[f"{n}-{p[len(n):][:25]}" for n, _, p in BAD_TOKENIZER_FILES])
def test_corrupt_tokenizer_file_is_named(qwen, no_runner, tmp_path, name, content, phrase):
    folder = linked_folder(tmp_path / "m", qwen.model_path, {name: content})
    with pytest.raises(ValueError, match=phrase):
        LLM(folder, **ARGS)
    assert_whole(qwen, PROBE_TEXT)


def test_a_broken_chat_template_fails_at_chat_time_with_a_value_error(qwen, tmp_path):
    folder = linked_folder(tmp_path / "m", qwen.model_path, {"chat_template.jinja": b"{% for m in %}",
                                                            "tokenizer_config.json": b"{}"})
    llm = LLM(folder, **ARGS)
    with pytest.raises(ValueError, match="the chat template of this tokenizer fails: TemplateSyntaxError"):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY)
    llm.want = qwen.want
    assert_whole(llm, PROBE_TEXT)  # the same weights as qwen's engine
    llm.shutdown()


# ---- 8. chat messages ------------------------------------------------------------------------------
USER = {"role": "user", "content": "hi"}
BAD_CHATS = [
    ([{"role": "user", "content": None}], "messages\\[0\\]\\['content'\\] must be a string, got NoneType"),
    ([{"role": "user", "content": 5}], "messages\\[0\\]\\['content'\\] must be a string, got int"),
    ([{"role": "user", "content": ["hi"]}], "messages\\[0\\]\\['content'\\] must be a string or a list of text"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
     "messages\\[0\\]\\['content'\\] must be a string or a list of text parts"),
    ([USER, {"role": 5, "content": "x"}], "messages\\[1\\]\\['role'\\] must be a string"),
    ([{"role": "user"}], "messages\\[0\\] must be a \\{'role'"),
    ([{"role": "user", "content": "\ud800"}], "messages\\[0\\]\\['content'\\] is not valid Unicode"),
    ([], "messages must be a conversation"),
    ("hello", "messages must be a conversation"),
    (None, "messages must be a conversation"),
    ([5], "messages must be a non-empty list"),
    ([[USER], [{"role": "user", "content": None}]], "conversation 1: messages\\[0\\]\\['content'\\]"),
    ([[USER], []], "conversation 1: messages must be a non-empty list"),
]


@pytest.mark.parametrize("messages, phrase", BAD_CHATS, ids=[repr(m)[:40] for m, _ in BAD_CHATS])
def test_bad_chat_messages_queue_nothing(qwen, messages, phrase):
    with pytest.raises(ValueError, match=phrase):
        qwen.chat(messages, GREEDY)
    assert_whole(qwen, PROBE_TEXT)


@pytest.mark.parametrize("prompt, phrase", [([{"role": "user", "content": 5}], "must be a string"),
                                            ("", "the prompt is empty"), ([1, 10**9], "outside the vocabulary")])
def test_bad_stream_input_raises_at_the_call_and_queues_nothing(qwen, prompt, phrase):
    with pytest.raises(ValueError, match=phrase):
        qwen.stream(prompt, GREEDY)  # at the call, not at the first next()
    assert_whole(qwen, PROBE_TEXT)


# ---- 9. the request lifecycle ----------------------------------------------------------------------
LONG = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)


@pytest.mark.timeout(STREAM_TIMEOUT_S)
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_closing_one_stream_leaves_the_other_to_finish(async_scheduling):
    """Issue repro 1: a.close() used to abort every request and leave b spinning at 100% CPU forever."""
    llm = LLM("qwen3-tiny", **small_engine_args(async_scheduling=async_scheduling))
    want = llm.generate("Yo", LONG, use_tqdm=False)[0]
    a, b = llm.stream("Hi", LONG), llm.stream("Yo", LONG)
    next(a)
    first = next(b)
    a.close()
    assert first + "".join(b) == want.outputs[0].text and b.output == want and len(b.output.outputs[0].token_ids) == 50
    assert next(a, None) is None  # a closed stream ends
    e = llm.engine
    assert not e.requests and all(PLACEHOLDER_TOKEN not in s.token_ids for s in (a.seq, b.seq))
    assert a.seq.finish_reason == "abort" and b.seq.finish_reason == "length"
    llm.shutdown()


class _Failure(Exception):
    pass


@pytest.mark.timeout(STREAM_TIMEOUT_S)
@pytest.mark.parametrize("error", [_Failure, KeyboardInterrupt], ids=["error", "interrupt"])
def test_a_suspended_stream_ends_when_a_later_generate_fails_inside_a_step(qwen, monkeypatch, error):
    """Issue repro 1, second half: an error or Ctrl-C inside generate's step aborts every request (the
    step is half done); a stream suspended meanwhile must end, not spin."""
    s = qwen.stream("Hi", LONG)
    first = next(s)
    launch = qwen.engine.model_runner.launch

    def failing(*args, **kwargs):
        monkeypatch.setattr(qwen.engine.model_runner, "launch", launch)
        raise error("inside a step")
    monkeypatch.setattr(qwen.engine.model_runner, "launch", failing)
    with pytest.raises(error):
        qwen.generate(PROBE_TEXT, GREEDY, use_tqdm=False)
    rest = list(s)  # ends
    assert s.output.outputs[0].finish_reason == "abort" and PLACEHOLDER_TOKEN not in s.seq.token_ids
    assert first + "".join(rest) == s.output.outputs[0].text and 0 < len(s.output.outputs[0].token_ids) < 50
    assert_whole(qwen, PROBE_TEXT)


@pytest.mark.timeout(STREAM_TIMEOUT_S)
@pytest.mark.parametrize("started", [True, False], ids=["started", "never-started"])
def test_a_stream_collected_during_generate_aborts_only_itself(qwen, monkeypatch, started):
    """Issue repro 3: the garbage collection of an abandoned stream, run inside another call's step,
    used to abort that call's requests too (finish_reason 'abort', no tokens)."""
    gc.disable()  # the collection must come exactly where the test puts it
    try:
        abandoned = qwen.stream("abandoned", LONG)
        if started:
            next(abandoned)
        seq = abandoned.seq
        abandoned.cycle = abandoned  # only the cyclic collector frees it
        del abandoned
        launch = qwen.engine.model_runner.launch

        def collecting(*args, **kwargs):  # a collection inside this thread's step, the engine's lock held
            monkeypatch.setattr(qwen.engine.model_runner, "launch", launch)
            assert qwen.engine.lock.locked() and not seq.is_finished
            gc.collect()
            return launch(*args, **kwargs)
        monkeypatch.setattr(qwen.engine.model_runner, "launch", collecting)
        out = qwen.generate(PROBE_TEXT, GREEDY, use_tqdm=False)
    finally:
        gc.enable()
    assert [o.outputs[0].token_ids for o in out] == qwen.want and {o.outputs[0].finish_reason for o in out} == {"length"}
    assert seq.finish_reason == "abort" and PLACEHOLDER_TOKEN not in seq.token_ids
    assert_whole(qwen, PROBE_TEXT)


def test_abort_one_request_leaves_the_others(qwen):
    seqs = qwen.engine.add_requests([[1, 2, 3], [4, 5, 6]], [LONG, LONG])
    for _ in range(3):
        qwen.engine.step()
    qwen.engine.abort(seqs[0])
    while not seqs[1].is_finished:
        qwen.engine.step()
    assert seqs[0].finish_reason == "abort" and seqs[1].finish_reason == "length"
    assert PLACEHOLDER_TOKEN not in seqs[0].token_ids and len(seqs[1].completion_token_ids) == 50
    assert_whole(qwen, PROBE_TEXT)


@pytest.mark.timeout(STREAM_TIMEOUT_S)
def test_threads_each_get_exactly_their_own_tokens(qwen):
    """Issue repro 2: generate from several threads gave wrong tokens, 51 tokens for max_tokens=50, or
    Index/Type/OverflowError. Now each call gets exactly its own tokens, and a stream can run beside."""
    prompts = [["Hello", "Once upon a time"], ["1 2 3", "def f(x):"], ["Paris is", "A"], ["Why?", "Yes"]]
    alone = qwen.generate(sum(prompts, []) + ["Streaming along"], LONG, use_tqdm=False)  # one call, one thread
    want, want_stream = [alone[2 * i:2 * i + 2] for i in range(len(prompts))], alone[-1]
    got, errors = {}, []
    start = threading.Barrier(len(prompts) + 1)

    def call(i):
        try:
            start.wait()
            got[i] = qwen.generate(prompts[i], LONG, use_tqdm=False)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    def stream():
        try:
            start.wait()
            s = qwen.stream("Streaming along", LONG)
            got["stream"] = ("".join(s), s.output)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    threads.append(threading.Thread(target=stream))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [got[i] for i in range(len(prompts))] == want
    assert all(len(o.outputs[0].token_ids) == 50 for outs in want for o in outs)
    assert got["stream"] == (want_stream.outputs[0].text, want_stream)
    assert_whole(qwen, PROBE_TEXT)


@pytest.mark.timeout(STREAM_TIMEOUT_S)
def test_a_bad_sampling_value_does_not_stop_a_tensor_parallel_engine():
    """Issue repro 5: seed=2**64 or top_k=10**30 was caught only inside a step, which stopped the TP
    engine for good. Now the call is refused on rank 0 before anything reaches the workers."""
    args = small_engine_args(max_model_len=64)
    ref = LLM("qwen3-tiny", **args)
    want = greedy_tokens(ref, PROBE_TEXT)
    ref.shutdown()
    with LLM("qwen3-tiny", tensor_parallel_size=2, **args) as llm:
        for name, value in (("seed", 2**64), ("top_k", 10**30)):
            bad = SamplingParams(temperature=0.7)
            setattr(bad, name, value)
            with pytest.raises(ValueError, match=f"SamplingParams.{name} must be"):
                llm.generate(PROBE_TEXT, [GREEDY, bad], use_tqdm=False)
            with pytest.raises(ValueError, match=f"SamplingParams.{name} must be"):
                SamplingParams(**{name: value})
        assert llm.engine.model_runner.broken is None
        assert greedy_tokens(llm, PROBE_TEXT) == want


# ---- 10. stream and generate agree, stop strings included (a real model) ----------------------------
# SmolLM2 counts "1. 1\n2. 2\n3. 3\n4" in 16 tokens, five a line: stops in one token and across several,
# the earliest of two, one a prefix of the text seen so far that never completes, and none at all
STOP_PATTERNS = [["3"], ["\n2"], [". 2\n3"], ["4. 4\n", "3"], ["zzz"], ["1. 2"], ["1"], [" "]]


@pytest.mark.timeout(300)
def test_stream_and_generate_give_the_same_text_for_every_stop_pattern():
    """Issue repro 9: the stream used to leak a stop string ('...6. 6\\n7' where generate gave '...6. 6\\n').
    The streams run interleaved, so they share the batch (and one engine run)."""
    llm = LLM("smollm2-135m", **small_engine_args(max_model_len=128))
    conv = [{"role": "user", "content": "Count from 1 to 20"}]
    params = [SamplingParams(temperature=0.0, max_tokens=16, stop=s) for s in STOP_PATTERNS]
    want = llm.chat([conv] * len(params), params)
    streams = [llm.stream(conv, p) for p in params]
    texts = [[] for _ in streams]
    live = set(range(len(streams)))
    while live:
        for i in sorted(live):
            delta = next(streams[i], None)
            if delta is None:
                live.discard(i)
            else:
                assert not any(s in "".join(texts[i]) + delta for s in STOP_PATTERNS[i])
                texts[i].append(delta)
    for i, w in enumerate(want):
        assert "".join(texts[i]) == w.outputs[0].text and streams[i].output == w, STOP_PATTERNS[i]
    assert {w.outputs[0].finish_reason for w in want} == {"stop", "length"}  # both endings are covered
    assert any(w.outputs[0].text == "" for w in want)  # a stop string in the first token
    llm.shutdown()


# ---- 11. the command line --------------------------------------------------------------------------
def _cli_folders(root) -> dict:
    qwen_path = resolve_model("qwen3-tiny")
    config = dict(TINY_CONFIG)
    del config["vocab_size"]
    return {
        "corrupt-tokenizer": linked_folder(root / "tok", qwen_path, {"tokenizer.json": b"{not json"}),
        "no-vocab-size": linked_folder(root / "cfg", qwen_path, {"config.json": json.dumps(config).encode()}),
        "safetensors-folder": linked_folder(root / "dir", qwen_path, {"model.safetensors": _folder}),
    }


# (id, argv, stdin bytes, key phrase of the one error line); {name} is one of _cli_folders' paths
CLI_ERRORS = [
    ("temperature-nan", ["generate", "Hi", "--temperature", "nan"], None, "temperature must be a finite number"),
    ("seed-2**64", ["generate", "Hi", "--seed", str(2**64)], None, "seed must be None or an integer"),
    ("empty-prompt", ["generate", "", "--model", "qwen3-tiny"], None, "the prompt is empty"),
    ("argv-not-utf8", ["generate", b"caf\xe9", "--model", "qwen3-tiny"], None, "not valid Unicode"),
    ("dtype-float64", ["generate", "Hi", "--model", "qwen3-tiny", "--dtype", "float64"], None, "dtype must be one of"),
    ("corrupt-tokenizer", ["generate", "Hi", "--model", "{corrupt-tokenizer}"], None, "not a valid tokenizer.json"),
    ("no-vocab-size", ["generate", "Hi", "--model", "{no-vocab-size}"], None, "vocab_size must be"),
    ("safetensors-folder", ["generate", "Hi", "--model", "{safetensors-folder}"], None, "is a folder, not a file"),
    ("unknown-model", ["generate", "Hi", "--model", "/no/such/folder"], None, "unknown model"),
    ("chat-empty-message", ["chat", "--message", "", "--model", "qwen3-tiny"], None, "--message is empty"),
    ("chat-stdin-not-utf8", ["chat", "--model", "qwen3-tiny"], b"caf\xe9 \xff\n", "not valid"),
    ("bench-min-above-max", ["bench", "--min-len", "2000", "--max-input-len", "1024"], None,
     "--max-input-len=1024 is below --min-len=2000"),
    ("bench-temperature-nan", ["bench", "--temperature", "nan"], None, "--temperature must be a finite number"),
    ("bad-int", ["generate", "Hi", "--max-tokens", "many"], None, "invalid int value"),
]


def _run_cli(argv: list, stdin: bytes | None, timeout_s: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    cmd = [os.fsencode(sys.executable), b"-m", b"minillm", *[a if isinstance(a, bytes) else os.fsencode(a)
                                                               for a in argv]]
    return subprocess.run(cmd, input=stdin if stdin is not None else b"", capture_output=True, env=env,
                          timeout=timeout_s, cwd=REPO)


@pytest.fixture(scope="module", autouse=True)
def cli_results(request, tmp_path_factory):
    """Every CLI_ERRORS case as its own process, started in the background when this module starts, so
    the processes (each imports torch) overlap the in-process cases. -> {case id: Future of its result}."""
    if not any(item.name.startswith("test_cli_error_is_one_line") for item in request.session.items):
        yield {}  # none of those tests runs
        return
    folders = _cli_folders(tmp_path_factory.mktemp("cli"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {cid: pool.submit(_run_cli, [a.format(**folders) if isinstance(a, str) else a for a in argv], stdin)
               for cid, argv, stdin, _ in CLI_ERRORS}


@pytest.mark.parametrize("case, phrase", [(c[0], c[3]) for c in CLI_ERRORS], ids=[c[0] for c in CLI_ERRORS])
def test_cli_error_is_one_line_with_a_nonzero_exit(cli_results, case, phrase):
    r = cli_results[case].result()
    err = r.stderr.decode(errors="replace")
    assert b"Traceback" not in r.stderr and b"Traceback" not in r.stdout, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("minillm chat with", "[minillm]"))]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (r.returncode, err)
    assert phrase in lines[0]


def _start_generating() -> subprocess.Popen:
    """A CLI process that streams a long reply; returns once the first byte of it has arrived."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    # Ctrl-C as in a terminal: SIGINT at its default in the child. A test run started in the background
    # by a non-interactive shell (`make test &`) ignores SIGINT, a child inherits that, and Python then
    # never raises KeyboardInterrupt: the CLI ran all 2000 tokens and exited 0 in one such run.
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "generate", "Once upon a time", "--model", "qwen3-tiny",
                             "--max-tokens", "2000", "--max-model-len", "4096"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.read(1)
    return proc


@pytest.mark.timeout(STREAM_TIMEOUT_S)
def test_cli_broken_pipe_exits_quietly():
    """`python -m minillm generate ... | head -c1`: the reader goes away after one byte."""
    proc = _start_generating()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait() == 141 and b"Traceback" not in err and b"Error" not in err, err.decode(errors="replace")


@pytest.mark.timeout(STREAM_TIMEOUT_S)
def test_cli_ctrl_c_exits_quietly():
    proc = _start_generating()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate()
    assert proc.returncode == 130 and err.strip() == b"", err.decode(errors="replace")


def test_cli_one_chat_turn_works(tmp_path):
    """What holds: a good command still answers (exit 0, no error line)."""
    r = _run_cli(["chat", "--message", "Hi", "--model", "qwen3-tiny", "--max-tokens", "3"], None)
    assert r.returncode == 0 and r.stdout.startswith(b"> Hi\n") and b"error" not in r.stderr, r.stderr
