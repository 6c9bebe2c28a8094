"""The chat page (minillm/serving/static/index.html) in a real browser: `python -m minillm serve` with
qwen3-tiny serves it at "/", and headless Chromium (driven by Playwright, found as the JupyterLab test
finds it: tests/jupyter_browser.py) opens it, shows the served model's name, streams an answer (the
reply's text is updated chunk by chunk, counted with a MutationObserver), sends the whole conversation
with the next turn, shows an error's own message, and stops a long answer mid-way (the Stop button
staying where it is and the newest text in view while the answer grows); the server's
/metrics then show nothing running and every KV-cache block free again. Against a server started with
an API key, the page works once the key is typed.

Without a Chromium the test fails and says how to get one (`make test` installs Debian's package).
Every wait is on a condition, with a bounded timeout; nothing sleeps to synchronize.
"""
from __future__ import annotations

import time

import httpx
import pytest

from jupyter_browser import chromium_page
from serving_helpers import running_server

TEST_TIMEOUT_S = 300        # pytest-timeout: the whole test, whatever hangs
UI_TIMEOUT_MS = 30_000      # page load, a click, an element's state
ANSWER_TIMEOUT_MS = 90_000  # one short answer, start to finish, on a busy 2-core CPU
METRICS_TIMEOUT_S = 30      # from Stop to the server showing the request gone and its blocks free
SHORT_ANSWER_TOKENS = 24    # enough chunks to see the text grow
LONG_ANSWER_TOKENS = 3000   # still running when Stop is pressed (the test stops it after 3 updates)
MIN_UPDATES = 3             # DOM updates of a reply while it streams
FOLLOW_SLACK_PX = 8         # the page's own: the conversation counts as scrolled to its end within this
MAX_MODEL_LEN = 4096        # the long answer plus the chat template's tokens fit

# Records every DOM update of an answer's text: window.replyUpdates[i] lists, for the i-th answer, the
# answer's state (data-state) and text length at each update, in order.
OBSERVE_REPLIES_JS = """() => {
  window.replyUpdates = [];
  const observer = new MutationObserver((records) => {
    for (const record of records) {
      const el = record.target.nodeType === Node.TEXT_NODE ? record.target.parentElement : record.target;
      const content = el && el.closest('.message.assistant .content');
      if (!content) continue;
      const li = content.parentElement;
      const i = [...document.querySelectorAll('.message.assistant')].indexOf(li);
      (window.replyUpdates[i] ||= []).push({state: li.dataset.state, length: content.textContent.length});
    }
  });
  observer.observe(document.getElementById('conversation'), {subtree: true, childList: true, characterData: true});
}"""


def metrics(base: str) -> dict[str, float]:
    """The server's /metrics as {name: value} (Prometheus text; a name with labels sums its series)."""
    r = httpx.get(f"{base}/metrics", timeout=10)
    r.raise_for_status()
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def wait_for_idle(base: str, total_blocks: float) -> dict[str, float]:
    """Poll /metrics until nothing runs or waits and every KV block is free; fail after METRICS_TIMEOUT_S."""
    deadline = time.monotonic() + METRICS_TIMEOUT_S
    while True:
        m = metrics(base)
        if (m["minillm_num_requests_running"], m["minillm_num_requests_waiting"],
                m["minillm_kv_cache_free_blocks"]) == (0, 0, total_blocks):
            return m
        if time.monotonic() > deadline:
            pytest.fail(f"{METRICS_TIMEOUT_S} s after Stop the server still holds the request: running "
                        f"{m['minillm_num_requests_running']}, waiting {m['minillm_num_requests_waiting']}, "
                        f"free blocks {m['minillm_kv_cache_free_blocks']} of {total_blocks}")
        time.sleep(0.1)  # a poll interval, not a synchronization: the condition above decides


def ask(page, text: str, max_tokens: int, temperature: float = 0.0) -> None:
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", str(temperature))
    page.fill("#message", text)
    page.click("#send")


# the conversation box's [overflow, distance from the view's bottom to its end], in CSS pixels
CONVERSATION_SCROLL_JS = """() => {
  const c = document.getElementById('conversation');
  return [c.scrollHeight - c.clientHeight, c.scrollHeight - c.scrollTop - c.clientHeight];
}"""
ANSWER_HEIGHT_JS = "document.querySelectorAll('.message.assistant')[{i}].getBoundingClientRect().height"


def answer_height(page, i: int) -> float:
    """Answer i's height on the page, in CSS pixels."""
    return page.evaluate(f"() => {ANSWER_HEIGHT_JS.format(i=i)}")


def streamed_updates(page, i: int) -> list[dict]:
    """The DOM updates of answer i made while it was still streaming."""
    return [u for u in page.evaluate(f"() => window.replyUpdates[{i}] || []") if u["state"] == "streaming"]


def _drive(page, base: str, total_blocks: float) -> None:
    from playwright.sync_api import expect

    chat_bodies = []  # the JSON the page POSTs to /v1/chat/completions, in order
    page.on("request", lambda r: chat_bodies.append(r.post_data_json)
            if r.url.endswith("/v1/chat/completions") else None)
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(f"{base}/")
    model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    expect(page.locator("#model")).to_have_text(f"Model: {model}")
    page.evaluate(OBSERVE_REPLIES_JS)
    answers = page.locator(".message.assistant")

    # 1. a short answer streams in: its text grows over several DOM updates before it is done
    ask(page, "Hello! Who are you?", SHORT_ANSWER_TOKENS)
    expect(answers.nth(0)).to_have_attribute("data-state", "done", timeout=ANSWER_TIMEOUT_MS)
    updates = streamed_updates(page, 0)
    lengths = [u["length"] for u in updates]
    assert len(updates) >= MIN_UPDATES, (
        f"the answer's text changed only {len(updates)} time(s) while streaming (lengths {lengths}): "
        f"the page should show each chunk as it arrives")
    assert lengths == sorted(set(lengths)), f"the answer's text did not only grow: lengths {lengths}"
    first_answer = answers.nth(0).locator(".content").inner_text()
    assert first_answer and chat_bodies[0]["stream"] is True
    assert chat_bodies[0]["max_tokens"] == SHORT_ANSWER_TOKENS and chat_bodies[0]["model"] == model

    # 2. the next turn sends the whole conversation
    ask(page, "Tell me more.", SHORT_ANSWER_TOKENS)
    expect(answers.nth(1)).to_have_attribute("data-state", "done", timeout=ANSWER_TIMEOUT_MS)
    sent = [(m["role"], m["content"]) for m in chat_bodies[1]["messages"]]
    assert sent == [("user", "Hello! Who are you?"), ("assistant", first_answer), ("user", "Tell me more.")], sent

    # 3. an error shows the server's own message, and the failed turn is not kept
    ask(page, "This one fails.", SHORT_ANSWER_TOKENS, temperature=-1)
    expect(answers.nth(2)).to_have_attribute("data-state", "error")
    expected = httpx.post(f"{base}/v1/chat/completions", json={**chat_bodies[2], "stream": False},
                          timeout=30).json()["error"]["message"]
    expect(page.locator("#error")).to_be_visible()
    expect(page.locator("#error")).to_have_text(expected)
    expect(page.locator("#message")).to_have_value("This one fails.")  # given back to retry

    # 4. Stop mid-way through a long answer: the page stops, the server frees the request's blocks
    before = metrics(base)
    ask(page, "Count to three thousand.", LONG_ANSWER_TOKENS)
    assert [m["content"] for m in chat_bodies[3]["messages"]][-2:] == [
        answers.nth(1).locator(".content").inner_text(), "Count to three thousand."]  # the failed turn is gone
    page.wait_for_function(f"() => (window.replyUpdates[3] || []).length >= {MIN_UPDATES}",
                           timeout=ANSWER_TIMEOUT_MS)
    stop = page.locator("#stop")
    expect(stop).to_be_enabled()
    # Stop stays put while the answer grows: a click aimed at a button that moves lands on whatever took
    # its place (this test's Stop was once missed so, one run in many)
    box, height = stop.bounding_box(), answer_height(page, 3)
    page.wait_for_function(f"() => {ANSWER_HEIGHT_JS.format(i=3)} > {height}", timeout=ANSWER_TIMEOUT_MS)
    assert stop.bounding_box() == box, (
        f"the Stop button moved from {box} to {stop.bounding_box()} while the answer grew from {height} px: "
        f"the composer should stay where it is while the conversation scrolls")
    overflow, below = page.evaluate(CONVERSATION_SCROLL_JS)
    assert overflow > 0 and below <= FOLLOW_SLACK_PX, (
        f"the conversation overflows its box by {overflow} px and its end is {below} px below the view: "
        f"the newest text should stay in view while it streams")
    page.click("#stop")
    expect(answers.nth(3)).to_have_attribute("data-state", "stopped")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    after = wait_for_idle(base, total_blocks)
    generated = after["minillm_generation_tokens_total"] - before["minillm_generation_tokens_total"]
    assert generated < LONG_ANSWER_TOKENS, (
        f"the server generated {generated:.0f} tokens for the stopped answer: Stop did not abort it")


def _drive_with_key(page, base: str, key: str) -> None:
    """A server started with --api-key: the page says it cannot list the models until the key is
    typed, then shows the model and chats with the key."""
    from playwright.sync_api import expect

    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(f"{base}/")
    expect(page.locator("#error")).to_contain_text("missing or wrong API key")
    expect(page.locator("#model")).to_have_text("Model: unknown")
    page.fill("#api-key", key)
    page.press("#api-key", "Tab")  # the field's change event: the page asks for the model again
    expect(page.locator("#model")).to_have_text("Model: qwen3-tiny")
    expect(page.locator("#error")).to_be_hidden()
    ask(page, "Hello?", 4)
    expect(page.locator(".message.assistant").nth(0)).to_have_attribute("data-state", "done",
                                                                         timeout=ANSWER_TIMEOUT_MS)




@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_chat_page_streams_keeps_the_conversation_and_stops(tmp_path):
    with running_server(model="qwen3-tiny", max_model_len=MAX_MODEL_LEN) as base:
        m = metrics(base)
        assert m["minillm_num_requests_running"] == 0, m
        total_blocks = m["minillm_kv_cache_total_blocks"]
        assert total_blocks > 0 and m["minillm_kv_cache_free_blocks"] == total_blocks, m  # nothing has run
        with chromium_page(tmp_path) as page:
            _drive(page, base, total_blocks)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_chat_page_with_an_api_key(tmp_path):
    with running_server(model="qwen3-tiny", api_key="sesame") as base, chromium_page(tmp_path) as page:
        _drive_with_key(page, base, "sesame")
