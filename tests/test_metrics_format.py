"""/metrics text is well-formed Prometheus text: every family's samples sit under its own # TYPE line.

Two checks of Metrics.render, no server needed: the text format's rule, read off prometheus_client's
parser (text_fd_to_metric_families: under `# TYPE x counter` or `gauge` only samples named x belong to
x; under `histogram` x_bucket, x_sum and x_count; any other sample starts a metric of unknown type), and
that parser itself (a dependency of jupyter_server, as tests/test_serving.py already uses it).
"""
from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from minillm.serving.metrics import Metrics

SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
COUNTERS = ("minillm_prompt_tokens", "minillm_generation_tokens", "minillm_request_success",
            "minillm_request_failure")


def rendered() -> str:
    """The text of a Metrics that has counted tokens, one failure and two finished requests."""
    m = Metrics(num_blocks=8)
    m.set_free_blocks(6)
    m.count_prompt_tokens(17)
    m.count_generation_tokens(20)
    m.count_failed()
    timing = SimpleNamespace(arrival_time=0.0, first_token_time=0.05, finished_time=0.25)
    for reason in ("stop", "length"):
        m.observe_finished(SimpleNamespace(metrics=timing,
                                           outputs=[SimpleNamespace(finish_reason=reason, token_ids=[1, 2, 3])]))
    return m.render(running=1, waiting=2)


def families(text: str) -> dict[str, tuple[str, list[str]]]:
    """The text format's rule, checked line by line: {# TYPE name: (kind, sample names)}. Fails on a
    # HELP not followed by the # TYPE of the same name, a repeated family, or a sample that does not
    belong to the family above it."""
    out: dict[str, tuple[str, list[str]]] = {}
    lines = text.splitlines()
    current = None
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert lines[i + 1].startswith(f"# TYPE {name} "), f"# HELP {name} is not followed by its # TYPE"
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in out, f"{name} has two # TYPE lines"
            current = name
            out[name] = (kind, [])
        elif line:
            sample = line.split("{")[0].split(" ")[0]
            assert current is not None, f"{sample} comes before any # TYPE line"
            kind, samples = out[current]
            assert sample in [current + s for s in SUFFIXES[kind]], \
                f"{sample} does not belong to `# TYPE {current} {kind}`: a parser reads it as another metric"
            samples.append(sample)
    return out


def test_every_sample_belongs_to_the_family_of_the_type_line_above_it():
    found = families(rendered())
    for name in COUNTERS:
        kind, samples = found[name + "_total"]  # prometheus_client's spelling: # TYPE x_total counter
        assert kind == "counter" and samples and set(samples) == {name + "_total"}
    assert all(samples for _, samples in found.values()), "a family without samples"


def test_prometheus_client_reads_each_counter_as_a_counter_with_its_values():
    parsed = {f.name: f for f in text_string_to_metric_families(rendered())}
    unknown = sorted(name for name, f in parsed.items() if f.type == "unknown")
    assert not unknown, f"read as metrics of unknown type: {unknown}"
    values = {name: {tuple(sorted(s.labels.items())): s.value for s in parsed[name].samples} for name in COUNTERS}
    assert all(parsed[name].type == "counter" for name in COUNTERS)
    assert values["minillm_prompt_tokens"] == {(): 17.0}
    assert values["minillm_generation_tokens"] == {(): 20.0}
    assert values["minillm_request_failure"] == {(): 1.0}
    assert values["minillm_request_success"] == {(("finished_reason", "stop"),): 1.0,
                                                 (("finished_reason", "length"),): 1.0,
                                                 (("finished_reason", "abort"),): 0.0}
    # the sample names readers use (notebook 06, serving_lab.read_metrics, the tests) are unchanged
    assert [s.name for s in parsed["minillm_prompt_tokens"].samples] == ["minillm_prompt_tokens_total"]
    assert parsed["minillm_num_requests_running"].type == "gauge"
    assert parsed["minillm_time_to_first_token_seconds"].type == "histogram"
