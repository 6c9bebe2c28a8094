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


# ---- a tool-calling conversation (vLLM's chat message fields) ------------------------------------------
TOOL_TURNS = [  # an agent's conversation as the openai client sends it: arguments a JSON string
    {"role": "system", "content": "You call tools."},
    {"role": "user", "name": "ana", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning": "I should call get_weather.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]


# a tool-calling template in the shape of Qwen3's (qwen3-tiny's own ChatML template reads role and content only)
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}"
    "{% for call in m.tool_calls or [] %}<tool_call>{{ {'name': call.function.name, "
    "'arguments': call.function.arguments} | tojson }}</tool_call>{% endfor %}"
    "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def hf_tool_rendering(model: str = "qwen3-tiny") -> str:
    """transformers' apply_chat_template(TOOL_TURNS, TOOL_TEMPLATE) over `model`'s tokenizer folder, the turns
    as vLLM hands them to the template: the tool call's arguments an object, the reasoning as
    reasoning_content, the null content "" (the reference for the server's chat_messages and LLM.chat)."""
    import json

    from transformers import AutoTokenizer

    from minillm.model_zoo import resolve_model
    turns = json.loads(json.dumps(TOOL_TURNS))
    turns[2]["tool_calls"][0]["function"]["arguments"] = json.loads(turns[2]["tool_calls"][0]["function"]["arguments"])
    turns[2]["reasoning_content"] = turns[2].pop("reasoning")
    turns[2]["content"] = ""
    text = AutoTokenizer.from_pretrained(resolve_model(model)).apply_chat_template(
        turns, chat_template=TOOL_TEMPLATE, tokenize=False, add_generation_prompt=True)
    for needle in ("user (ana)", "<think>I should call", '"city": "Paris"', "[call_1]"):  # every field rendered
        assert needle in text, needle
    return text
