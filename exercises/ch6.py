"""Chapter 6 exercise stubs. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand; students: fill in the bodies here, then grade one exercise with
    make grade EX=6.1            (or: pytest tests/exercises -m ex6_1)

Exercise 6.1: sse_event, sse_data  (notebooks/06_serving.ipynb, section '1. A request's life: server-sent events')
"""
from __future__ import annotations



# ---- Exercise 6.1 (notebooks/06_serving.ipynb, section '1. A request's life: server-sent events'), from minillm.serving.sse ----
def sse_event(data: str) -> str:
    r"""One server-sent event carrying `data`, as the text to write to the stream.

    Every line of `data` (split on "\n") becomes its own `data: ` line, then a blank line ends the
    event:  sse_event('{"a": 1}') == 'data: {"a": 1}\n\n';  sse_event("a\nb") == "data: a\ndata: b\n\n".
    A reader joins the data lines of one event with "\n", so it gets `data` back exactly.

    Hints: a line ends with "\n"; an event ends with an empty line, so the event ends in "\n\n".
    """
    raise NotImplementedError("Exercise 6.1: implement sse_event in exercises/ch6.py (see notebooks/06_serving.ipynb, section '1. A request's life: server-sent events')")


def sse_data(line: str, lines: list[str]) -> str | None:
    r"""Read one line of an event stream (its terminator, "\n", "\r\n" or "\r", already removed).

    lines: the data lines of the event being read so far (the caller keeps it between calls,
    starting from []). A `data` field appends its value to `lines`; a blank line ends the event:
    return its data (the lines joined with "\n") and clear `lines`, or None if the event had no
    data line. Comments (lines starting with ':') and other fields (event, id, retry, unknown
    names) are ignored. A field is `name:value`; after the colon one space, if present, is
    dropped (only one: the rest of the value is kept as it is); a line with no colon is a field
    name with an empty value. Otherwise return None.

        lines = []
        sse_data("data: hello", lines) -> None      (lines == ["hello"])
        sse_data("data:  two", lines)  -> None      (lines == ["hello", " two"])
        sse_data("", lines)            -> "hello\n two"   (lines == [])

    Hints: str.partition(":"); a blank line after an event with no data dispatches nothing.
    """
    raise NotImplementedError("Exercise 6.1: implement sse_data in exercises/ch6.py (see notebooks/06_serving.ipynb, section '1. A request's life: server-sent events')")
