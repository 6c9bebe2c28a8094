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


def check_exercise_boxes_and_switch(nb, chapter: int, exercise_ids: list[str], slide_types) -> None:
    """A chapter notebook's shape: every cell has a slide type, each exercise its box and `make grade`
    line, and the USE_MY_CODE switch calls use_my_code; committed outputs come from the reference
    code, so the switch, if it ran, said so."""
    assert all(c.metadata.get("slideshow", {}).get("slide_type") in slide_types for c in nb.cells)
    text = "\n".join(c.source for c in nb.cells)
    for ex in exercise_ids:
        assert f"**Exercise {ex}**" in text and f"make grade EX={ex}" in text, ex
    switch = next(c for c in nb.cells if c.cell_type == "code" and "USE_MY_CODE = False" in c.source)
    assert f"use_my_code(chapter={chapter}, enabled=USE_MY_CODE)" in switch.source
    said = "".join(o.get("text", "") for o in switch.get("outputs", []))
    assert not said or f"USE_MY_CODE = False: chapter {chapter} runs minillm's reference code" in said, said
