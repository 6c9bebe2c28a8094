"""Chapter 1 references: tiktoken's encodings on the real Qwen vocabulary, and a .safetensors file
written by the safetensors package (every dtype minillm reads, 0-d and empty shapes).

    ch1/qwen_bpe.json        texts -> tiktoken ids; regex pieces -> tiktoken ids
    ch1/sample.safetensors   seeded tensors written by safetensors.torch.save_file
"""
from __future__ import annotations

import json
import os

import regex
import torch

TEXTS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "I'm sure they'll say it's DON'T and WE'VE, not won't.",
    "  leading spaces\tand\ttabs\n\n\nnewlines   \n  trailing  ",
    "数字 12345 和 emoji 🤖🚀, 日本語のテキスト, 한국어 텍스트",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # comment\n",
    "naïve café — “quotes” and ‘single’ … ellipsis",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning</think>answer<|endoftext|>",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "x = 3.14159e-10; y = 0xDEADBEEF; z = [1,2,3]**2",
    "Ελληνικά, русский текст, עברית, العربية, हिन्दी",
    "!!!???... ---- **** ==== ####",
    "https://example.com/path?query=1&other=two#frag",
    # repeated characters: one pair occurs several times with one rank, and the leftmost merges first
    # (merging the rightmost gives [64, 28458] for "aaaaa", not tiktoken's [28458, 64])
    "aaaaa aaaa aaaaaaa\neeeee\nooooo\nzzzzz\n!!!!!! ??????",
]


def qwen_encoding():
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    from minillm.model_zoo import QWEN_PATTERN, QWEN_SPECIAL, qwen_tiktoken_file
    ranks = load_tiktoken_bpe(qwen_tiktoken_file())
    special = {t: 151643 + i for i, t in enumerate(QWEN_SPECIAL)}
    return tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=special)


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    ints = lambda lo, hi, *shape, dtype: torch.randint(lo, hi, shape, generator=g, dtype=dtype)  # noqa: E731
    return {
        "model.embed_tokens.weight": r(7, 4).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": r(4, 4).half(),
        "model.norm.weight": r(4),
        "scalar_f32": torch.tensor(3.5),
        "scalar_i64": torch.tensor(-7, dtype=torch.int64),
        "empty_bf16": torch.empty(0, 3, dtype=torch.bfloat16),
        "f64_3d": r(2, 3, 2).double(),
        "i32": ints(-2**31, 2**31 - 1, 5, dtype=torch.int32),
        "i16": ints(-2**15, 2**15 - 1, 3, 2, dtype=torch.int16),
        "i8": ints(-128, 127, 9, dtype=torch.int8),
        "u8": ints(0, 255, 1, 1, 5, dtype=torch.uint8),
        "mask": r(2, 5) > 0,
    }


def build(out_dir: str) -> None:
    from safetensors.torch import save_file

    from minillm.model_zoo import QWEN_PATTERN
    enc = qwen_encoding()
    special_re = "(" + "|".join(regex.escape(s) for s in enc.special_tokens_set) + ")"
    pieces: dict[str, list[int]] = {}
    for text in TEXTS:
        for chunk in regex.split(special_re, text):
            if chunk in enc.special_tokens_set:
                continue
            for piece in regex.findall(QWEN_PATTERN, chunk):
                assert regex.findall(QWEN_PATTERN, piece) == [piece]  # so encode_ordinary sees one piece
                pieces[piece] = enc.encode_ordinary(piece)
    out = os.path.join(out_dir, "ch1")
    os.makedirs(out, exist_ok=True)
    rows = lambda xs: ",\n".join("  " + json.dumps(x, ensure_ascii=False) for x in xs)  # noqa: E731
    with open(os.path.join(out, "qwen_bpe.json"), "w") as f:  # one entry per line: readable diffs
        f.write('{"texts": [\n' + rows(TEXTS) + '\n],\n"ids": [\n'
                + rows(enc.encode(t, allowed_special="all") for t in TEXTS) + '\n],\n"pieces": [\n'
                + rows(sorted(pieces.items())) + "\n]}\n")
    # one metadata key: safetensors writes the metadata map in hash order, so two keys could swap
    save_file(sample_tensors(), os.path.join(out, "sample.safetensors"), metadata={"format": "pt"})
