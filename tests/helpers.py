"""Shared test helpers: the stored reference folder and small engine factories."""
from __future__ import annotations

import json
import os

import pytest

REFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "references")
TINY_MODELS = ("tiny-qwen3", "tiny-qwen3-tied", "tiny-llama", "tiny-qwen2")


def ref_path(name: str) -> str:
    return os.path.join(REFS, name)


def greedy_reference() -> dict:
    with open(ref_path("greedy_tokens.json")) as f:
        return json.load(f)


def small_engine_args(**overrides) -> dict:
    """CPU engine settings small enough that paging, prefix caching and preemption all happen."""
    args = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
                max_num_batched_tokens=512, max_num_seqs=8)
    args.update(overrides)
    return args


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models run faster on one intra-op thread, and on a busy 2-core machine far faster (a tiny
    matmul split across OpenMP threads waits for whichever thread lacks a core). A module takes it
    with `from helpers import one_torch_thread` (an autouse fixture: importing it is using it)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
