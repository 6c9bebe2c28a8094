"""serve's --served-model-name with several names, --chat-template and --tokenizer, as vLLM has them: a request
may name any served name, responses carry the first, /v1/models lists each; the template replaces the model's
own for chat requests and /tokenize; --tokenizer takes another folder's tokenizer. The reference rendering is
transformers' apply_chat_template on the same tokenizer folder; the error cases are the CLI's one-line errors."""
from __future__ import annotations

import httpx
import openai
import pytest

from minillm.cli import load_chat_template, main
from serving_helpers import serve_process

pytestmark = pytest.mark.timeout(180)
MODEL = "qwen3-tiny"
# a template unlike Qwen3's own (no <|im_start|>), so the model's own cannot pass for it
TEMPLATE = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[ASSISTANT]{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


def hf_rendering(template: str | None, folder: str | None = None) -> list[int]:
    """transformers' tokenizer on a folder (default qwen3-tiny's): the template (None: the folder's own) rendered
    and tokenized (no special tokens added: the template writes every one it wants)."""
    from transformers import AutoTokenizer

    from minillm.model_zoo import resolve_model
    tok = AutoTokenizer.from_pretrained(folder or resolve_model(MODEL))
    text = tok.apply_chat_template(MESSAGES, chat_template=template, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    return str(path)


def test_two_served_names_and_a_template_file(template_file):
    want_ids = hf_rendering(TEMPLATE)
    with serve_process(MODEL, "--device", "cpu", "--dtype", "float32", "--max-model-len", "128", "--max-num-seqs",
                       "2", "--served-model-name", "alpha", "beta", "--chat-template", template_file) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=60, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["alpha", "beta"]
        for name in ("alpha", "beta"):  # either name is served; the response carries the first, as vLLM's does
            done = client.completions.create(model=name, prompt="Hello", max_tokens=2, temperature=0.0)
            assert done.model == "alpha"
        with pytest.raises(openai.NotFoundError) as err:
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
        assert "'alpha', 'beta'" in str(err.value)
        tokenized = httpx.post(url + "/tokenize", json={"model": "beta", "messages": MESSAGES}, timeout=60).json()
        assert tokenized["tokens"] == want_ids
        chat = client.chat.completions.create(model="beta", messages=MESSAGES, max_tokens=2, temperature=0.0)
        assert chat.usage.prompt_tokens == len(want_ids)  # the chat path renders the same template


def test_another_folders_tokenizer(tmp_path):
    import json
    import shutil

    from minillm.model_zoo import resolve_model
    own = resolve_model(MODEL)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the same vocabulary, another chat template
        shutil.copy(f"{own}/{name}", tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)  # the template is chat_template.jinja's, as transformers 5 writes it
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    want_ids = hf_rendering(None, str(tmp_path))
    assert want_ids != hf_rendering(None)  # the folder's template is not the model's
    with serve_process(MODEL, "--device", "cpu", "--dtype", "float32", "--max-model-len", "128", "--max-num-seqs",
                       "2", "--tokenizer", str(tmp_path)) as url:
        tokenized = httpx.post(url + "/tokenize", json={"messages": MESSAGES}, timeout=60).json()
        assert tokenized["tokens"] == want_ids


def test_a_missing_tokenizer_folder_is_one_line(capsys):
    code, err = run_main(["generate", "Hi", "--model", MODEL, "--device", "cpu", "--tokenizer", "no/such/folder"],
                         capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: tokenizer: unknown model 'no/such/folder'"), err


def chat(url: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json=dict(body, max_tokens=2, temperature=0.0), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_response_role_request_id_headers_and_uvicorns_log_flags():
    """--response-role names a new turn's answer (vLLM's rule: a continued message keeps its own role);
    --enable-request-id-headers puts X-Request-Id on every response, the request's own or a uuid4 hex (vLLM's
    XRequestIdMiddleware), and without it there is none; --uvicorn-log-level and --disable-uvicorn-access-log
    reach uvicorn (its access log is the line per request)."""
    output = []
    with serve_process(MODEL, "--device", "cpu", "--dtype", "float32", "--max-model-len", "128", "--max-num-seqs",
                       "2", "--response-role", "narrator", "--uvicorn-log-level", "info",
                       "--enable-request-id-headers", output=output) as url:
        assert chat(url, {"messages": MESSAGES})["choices"][0]["message"]["role"] == "narrator"
        given = httpx.post(url + "/v1/completions", headers={"X-Request-Id": "gw-7"}, timeout=60,
                           json={"prompt": "Hi", "max_tokens": 2})
        assert given.headers["x-request-id"] == "gw-7" and given.json()["id"] == "cmpl-gw-7"
        fresh = [httpx.get(url + path, timeout=60) for path in ("/health", "/v1/models", "/no/such/path")]
        assert [r.status_code for r in fresh] == [200, 200, 404]
        ids = [r.headers.get("x-request-id", "") for r in fresh]
        assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 3, ids
        with httpx.stream("POST", url + "/v1/completions", headers={"X-Request-Id": "s-1"}, timeout=60,
                          json={"prompt": "Hi", "max_tokens": 2, "stream": True}) as r:
            assert r.headers["x-request-id"] == "s-1" and list(r.iter_lines())
        open_turn = MESSAGES + [{"role": "assistant", "content": "Once upon"}]
        continued = chat(url, {"messages": open_turn, "add_generation_prompt": False, "continue_final_message": True})
        assert continued["choices"][0]["message"]["role"] == "assistant"
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                          json={"messages": MESSAGES, "max_tokens": 2, "stream": True}) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert '"delta": {"role": "narrator", "content": ""}' in first, first
    assert any('"POST /v1/chat/completions HTTP/1.1" 200' in line for line in output), "".join(output)
    quiet = []
    with serve_process(MODEL, "--device", "cpu", "--dtype", "float32", "--max-model-len", "128", "--max-num-seqs",
                       "2", "--disable-uvicorn-access-log", output=quiet) as url:
        assert chat(url, {"messages": MESSAGES})["choices"][0]["message"]["role"] == "assistant"
        r = httpx.post(url + "/v1/completions", headers={"X-Request-Id": "gw-8"}, timeout=60,
                       json={"prompt": "Hi", "max_tokens": 2})
        assert "x-request-id" not in r.headers and r.json()["id"] == "cmpl-gw-8"  # off by default, as in vLLM
    assert not any("POST /v1/chat/completions" in line for line in quiet), "".join(quiet)
    assert any("Uvicorn running" in line or "Application startup complete" in line for line in quiet), "".join(quiet)


def test_an_empty_response_role_is_refused(capsys):
    code, err = run_main(["serve", MODEL, "--port", "0", "--response-role", ""], capsys)
    assert (code, err.strip()) == (2, "error: --response-role is empty; give the role chat answers carry "
                                      "(default assistant)")


def test_an_inline_template_with_escapes_as_vllm_reads_it():
    # typed on a command line, a one-line template spells its newline as backslash-n
    inline = TEMPLATE.replace("\n", "\\n")
    assert "\n" not in inline
    assert load_chat_template(inline) == TEMPLATE


@pytest.mark.parametrize("value, message", [
    ("no/such/template.jinja", "--chat-template 'no/such/template.jinja': no such file, and no Jinja template"),
    ("{% for m in messages %}{{ m }}", "--chat-template: the template given is not a valid Jinja template: line 1"),
    ("{{ x }}\\", "--chat-template: the template given has a broken backslash escape"),
])
def test_a_bad_chat_template_is_one_line_before_anything_loads(capsys, monkeypatch, value, message):
    import minillm.serving.engine_core as engine_core

    def client(*args, **kwargs):
        raise AssertionError("the engine was started before the template was checked")

    monkeypatch.setattr(engine_core, "EngineCoreClient", client)
    code, err = run_main(["serve", MODEL, "--port", "0", "--device", "cpu", "--chat-template", value], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: " + message), err


def test_a_template_file_with_bad_syntax_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jinja"
    path.write_text("{{ messages }}\n{% if %}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"the file '.*bad\.jinja' is not a valid Jinja template: line 2"):
        load_chat_template(str(path))


def test_an_empty_served_name_is_refused(capsys):
    code, err = run_main(["serve", MODEL, "--port", "0", "--served-model-name", "alpha", " "], capsys)
    assert (code, err.strip()) == (2, "error: --served-model-name has an empty name; give the names clients send, "
                                      "or leave it out")
