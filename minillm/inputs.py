"""vLLM's prompt dicts (vllm.inputs), which LLM.generate, stream and beam_search take beside text and
token ids: TextPrompt(prompt="...") and TokensPrompt(prompt_token_ids=[...]) are plain dicts."""
from __future__ import annotations

from typing import TypedDict


class TextPrompt(TypedDict):
    prompt: str


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]


PROMPT_KEYS = ("prompt", "prompt_token_ids")  # a prompt dict holds exactly one: a TextPrompt or a TokensPrompt
