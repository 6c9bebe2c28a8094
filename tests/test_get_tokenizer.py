"""llm.get_tokenizer() as code written for vLLM uses it (there it is a transformers tokenizer): the calls
a vLLM user makes in the first hour give what transformers' AutoTokenizer of the same folder gives."""
from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoTokenizer

from helpers import one_torch_thread, small_engine_args  # noqa: F401 (one_torch_thread: an autouse fixture)
from minillm import LLM
from minillm.model_zoo import resolve_model

TEXTS = ["Hello world, naïve café 🤖", "数字 and <|im_end|> inside", " leading space"]


@pytest.fixture(scope="module")
def llm():
    engine = LLM("qwen3-tiny", **small_engine_args(max_model_len=128))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tok(llm):
    return llm.get_tokenizer()


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(resolve_model("qwen3-tiny"))


def test_calling_the_tokenizer_gives_transformers_input_ids(tok, hf):
    for special in (True, False):
        for text in TEXTS:
            enc, want = tok(text, add_special_tokens=special), hf(text, add_special_tokens=special)
            assert enc["input_ids"] == enc.input_ids == want["input_ids"]
            assert enc["attention_mask"] == want["attention_mask"]
        batch, want = tok(TEXTS), hf(TEXTS)
        assert batch.input_ids == want["input_ids"] and batch.attention_mask == want["attention_mask"]
    pt = tok(TEXTS[0], return_tensors="pt")
    assert torch.equal(pt.input_ids, hf(TEXTS[0], return_tensors="pt")["input_ids"])
    assert pt.input_ids.dtype == torch.long and pt.attention_mask.shape == pt.input_ids.shape


def test_the_vocabulary_calls_equal_transformers(tok, hf):
    ids = hf(TEXTS[1])["input_ids"] + [hf.eos_token_id]
    assert tok.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert tok.convert_ids_to_tokens(ids[0]) == hf.convert_ids_to_tokens(ids[0])
    assert tok.convert_tokens_to_ids(hf.convert_ids_to_tokens(ids)) == ids
    assert tok.convert_tokens_to_ids("<|im_end|>") == hf.convert_tokens_to_ids("<|im_end|>")
    for text in TEXTS:
        assert tok.tokenize(text) == hf.tokenize(text)
    assert tok.get_vocab() == hf.get_vocab() and len(tok) == len(hf)
    assert (tok.eos_token_id, tok.bos_token_id) == (hf.eos_token_id, hf.bos_token_id)
    assert tok.batch_decode([ids, ids[:2]]) == hf.batch_decode([ids, ids[:2]], skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)
    messages = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages, tokenize=True) == list(
        hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def test_what_a_tokenizer_call_cannot_do_is_a_value_error_that_says_what_to_do(tok):
    for kwargs, phrase in ((dict(padding=True), r"not \['padding'\]; for padding or truncation use transformers"),
                           (dict(return_tensors="tf"), "return_tensors must be None"),
                           (dict(return_tensors="pt", text=TEXTS), "needs texts of equal token length")):
        text = kwargs.pop("text", TEXTS[0])
        with pytest.raises(ValueError, match=phrase):
            tok(text, **kwargs)
    for bad in ([1, 2, 3], None, ["a", 3]):
        with pytest.raises(ValueError, match="text must be a string or a list of strings"):
            tok(bad)
    with pytest.raises(ValueError, match="not valid Unicode"):
        tok("\ud800")


def test_a_tokenizer_calls_ids_generate_the_same_as_its_text(llm, tok):
    """vLLM code feeds tokenizer(text).input_ids as a TokensPrompt: the same request as the text."""
    from minillm import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    by_text = llm.generate(TEXTS[0], params, use_tqdm=False)[0]
    by_ids = llm.generate({"prompt_token_ids": tok(TEXTS[0]).input_ids}, params, use_tqdm=False)[0]
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids


def test_decode_takes_what_transformers_decode_takes(tok, hf):
    """One int, a tensor or an array (what a model's output gives), as transformers' decode takes them; the
    special tokens kept with skip_special_tokens=False (transformers' default) and left out with True."""
    ids = hf("Hello <|im_end|> world")["input_ids"]
    for given in (ids, torch.tensor(ids), torch.tensor(ids).numpy()):
        for skip in (False, True):
            assert tok.decode(given, skip_special_tokens=skip) == hf.decode(given, skip_special_tokens=skip)
    assert tok.decode(ids[0]) == hf.decode(ids[0])
    rows = torch.tensor([ids, ids[::-1]])
    assert tok.batch_decode(rows, skip_special_tokens=False) == hf.batch_decode(rows)
    for skip in (False, True):
        assert tok.convert_ids_to_tokens(ids, skip_special_tokens=skip) == hf.convert_ids_to_tokens(
            ids, skip_special_tokens=skip)


def test_apply_chat_template_return_dict_and_the_options_it_refuses(tok, hf):
    messages = [{"role": "user", "content": "Hi"}]
    want = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
    got = tok.apply_chat_template(messages, tokenize=True, return_dict=True)
    assert got["input_ids"] == got.input_ids == want["input_ids"]
    assert got["attention_mask"] == want["attention_mask"]
    for option in (dict(return_tensors="pt"), dict(padding=True), dict(truncation=True, max_length=4)):
        with pytest.raises(ValueError, match="AutoTokenizer"):
            tok.apply_chat_template(messages, tokenize=True, **option)
    with pytest.raises(ValueError, match="return_dict must be True or False"):
        tok.apply_chat_template(messages, return_dict="yes")


def test_logprobs_name_special_tokens_by_their_text(llm, tok):
    """vLLM's decoded_token decodes each id with its special tokens kept: an end-of-turn token reads
    '<|im_end|>', not '' (which would also merge such tokens in the legacy API's top_logprobs dict)."""
    from minillm import SamplingParams
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=3, allowed_token_ids=[im_end], ignore_eos=True)
    out = llm.generate("Hi", params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [im_end]
    assert out.logprobs[0][im_end].decoded_token == "<|im_end|>"


# what code written for vLLM reads off its tokenizer besides encode and decode (transformers' attributes)
SPECIAL_ATTRIBUTES = ["vocab_size", "bos_token", "bos_token_id", "eos_token", "eos_token_id", "unk_token",
                      "unk_token_id", "sep_token", "sep_token_id", "pad_token", "pad_token_id", "cls_token",
                      "cls_token_id", "mask_token", "mask_token_id", "all_special_tokens", "all_special_ids",
                      "special_tokens_map"]
# Qwen3's tokenizer_config.json on the hub (its special-token keys): transformers 4's additional_special_tokens,
# bos and unk null; the embedded qwen3-tiny's config (written by transformers 5) sets only eos and pad
QWEN3_HUB_CONFIG = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
                    "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                                                  "<|object_ref_end|>", "<|box_start|>", "<|box_end|>"]}
# transformers 5's spelling (extra_special_tokens, which wins over additional_special_tokens) and the
# serialized AddedToken form of a token
ADDED = dict(__type="AddedToken", lstrip=False, rstrip=False, normalized=False, single_word=False, special=True)
V5_CONFIG = {"eos_token": dict(ADDED, content="<|im_end|>"), "unk_token": "<|endoftext|>", "bos_token": "<|im_start|>",
             "extra_special_tokens": ["<tool_call>", dict(ADDED, content="</tool_call>")],
             "additional_special_tokens": ["<think>"]}


def assert_special_tokens_equal(tok, hf) -> None:
    for name in SPECIAL_ATTRIBUTES:
        assert getattr(tok, name) == getattr(hf, name), name
    assert len(tok) == len(hf) and tok.max_token_id == max(hf.get_vocab().values())
    tokens = ["<|im_end|>", "not-a-token-here"]  # unknown: unk_token_id (None without an unk token)
    assert tok.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    assert tok.convert_tokens_to_ids(tokens[1]) == hf.convert_tokens_to_ids(tokens[1])


def test_the_sizes_and_special_tokens_equal_transformers(tok, hf):
    """vocab_size is the base vocabulary (Qwen3: 151643, its special tokens left out), len() all of it."""
    assert_special_tokens_equal(tok, hf)
    assert (tok.vocab_size, len(tok), tok.pad_token_id) == (151643, 151669, 151643)


@pytest.mark.parametrize("config", [QWEN3_HUB_CONFIG, V5_CONFIG, "smollm2-135m"], ids=["qwen3-hub", "v5", "smollm2"])
def test_every_folders_special_tokens_equal_transformers(tmp_path, config):
    """Other tokenizer_config.json files: Qwen3's from the hub, transformers 5's extra_special_tokens, SmolLM2's
    (bos, eos, unk and pad all set)."""
    from minillm.tokenizer import Tokenizer
    if isinstance(config, str):
        folder = resolve_model(config)
    else:
        folder = str(tmp_path)
        os.symlink(os.path.join(resolve_model("qwen3-tiny"), "tokenizer.json"), tmp_path / "tokenizer.json")
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict(config, tokenizer_class="TokenizersBackend")))
    assert_special_tokens_equal(Tokenizer(folder), AutoTokenizer.from_pretrained(folder))


def test_setting_a_special_token_moves_its_id_as_in_transformers():
    """transformers code's habit `tok.pad_token = tok.eos_token`: the id and the lists follow the token."""
    from minillm.tokenizer import Tokenizer
    folder = resolve_model("qwen3-tiny")
    tok, hf = Tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    for t in (tok, hf):
        t.pad_token = t.eos_token
        t.unk_token = "<|endoftext|>"
    assert_special_tokens_equal(tok, hf)
    assert tok.pad_token_id == tok.eos_token_id == 151645


def test_added_tokens_past_vocab_size_are_still_prompt_ids_and_logit_bias_keys(llm, tok):
    """vocab_size leaves the added tokens out: the engine's checks go by the model's vocabulary, so the ids
    from vocab_size to len(tok) - 1 (<think>, <|im_end|>, ...) stay good prompt ids and logit_bias keys."""
    from minillm import SamplingParams
    last = len(tok) - 1
    assert last >= tok.vocab_size and tok.decode([last], skip_special_tokens=False) == "</think>"
    params = SamplingParams(temperature=0.0, max_tokens=1, logit_bias={last: 100.0}, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": [tok.vocab_size, last]}, params, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [last]


@pytest.mark.parametrize("config, phrase", [
    ({"pad_token": 5}, "pad_token must be a string"),
    ({"additional_special_tokens": "<think>"}, "additional_special_tokens must be a list of tokens"),
    ({"extra_special_tokens": ["<think>", 7]}, "extra_special_tokens must be a string"),
], ids=["pad-int", "additional-str", "extra-int"])
def test_a_bad_special_token_in_tokenizer_config_is_a_value_error_naming_it(tmp_path, config, phrase):
    from minillm.tokenizer import Tokenizer
    os.symlink(os.path.join(resolve_model("qwen3-tiny"), "tokenizer.json"), tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"tokenizer_config.json: {phrase}"):
        Tokenizer(str(tmp_path))
