"""Server-sent events (the WHATWG HTML standard's text/event-stream), both ways.

The server streams each chunk of a completion as one event (`sse_event`), as OpenAI's API does:

    data: {"id": "cmpl-...", "choices": [{"text": " Paris", ...}]}
    <blank line>
    data: [DONE]
    <blank line>

and the load generator (minillm.bench_serve) reads the stream back line by line (`sse_data`). A
line is a field (`name: value`) or a comment (`: ...`); a blank line ends the event. Only `data`
matters here: an event's data is its data lines joined with newlines, which is how a payload with
a newline in it travels.
"""
from __future__ import annotations


# >>> exercise 6.1 | notebooks/06_serving.ipynb | 1. A request's life: server-sent events
def sse_event(data: str) -> str:
    r"""One server-sent event carrying `data`, as the text to write to the stream.

    Every line of `data` (split on "\n") becomes its own `data: ` line, then a blank line ends the
    event:  sse_event('{"a": 1}') == 'data: {"a": 1}\n\n';  sse_event("a\nb") == "data: a\ndata: b\n\n".
    A reader joins the data lines of one event with "\n", so it gets `data` back exactly when `data`
    holds no carriage return: in an event stream "\r" ends a line too ("\r\n" is one line end), so the
    text after a "\r" starts a line of its own, read as a field of its own: sse_event("a\rb") reads
    back as "a" (the line "b" is a field named "b", ignored). The server's JSON payloads never hold
    one (JSON writes a carriage return escaped, as a backslash and an "r").

    Hints: a line ends with "\n"; an event ends with an empty line, so the event ends in "\n\n".
    """
    # a newline inside one data line would end that line early: the rest would read as a field of its own
    return "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def sse_data(line: str, lines: list[str]) -> str | None:
    r"""Read one line of an event stream (its terminator, "\n", "\r\n" or "\r", already removed).

    lines: the data lines of the event being read so far (the caller keeps it between calls,
    starting from []). A `data` field appends its value to `lines`; a blank line ends the event:
    return its data (the lines joined with "\n") and clear `lines`, or None if the event had no
    data line. Comments (lines starting with ':') and other fields (event, id, retry, unknown
    names) are ignored. A field is `name:value`; after the colon one space, if present, is
    dropped (only one: the rest of the value is kept as it is); a line with no colon is a field
    name with an empty value. Names are case-sensitive and taken as written: only exactly `data`
    is a data field ("Data", " data" and "data " are other fields). Otherwise return None.

        lines = []
        sse_data("data: hello", lines) -> None      (lines == ["hello"])
        sse_data("data:  two", lines)  -> None      (lines == ["hello", " two"])
        sse_data("", lines)            -> "hello\n two"   (lines == [])

    Hints: str.partition(":"); a blank line after an event with no data dispatches nothing.
    """
    if not line:
        if not lines:  # a blank line after comments or other fields only: no event
            return None
        data = "\n".join(lines)
        lines.clear()
        return data
    if line.startswith(":"):  # a comment (servers send ": ping" to keep a connection open)
        return None
    name, _, value = line.partition(":")
    if value.startswith(" "):  # exactly one: the spaces after it belong to the value
        value = value[1:]
    if name == "data":
        lines.append(value)
    return None
# <<< exercise 6.1
