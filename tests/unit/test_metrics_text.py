"""The report's reader of Prometheus text reads what Prometheus's own parser reads."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from testbed.report.metrics import MalformedMetrics, Narrowed, Scrape, parse_sample


def _reference(text: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    found: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def _exposition() -> str:
    registry = CollectorRegistry()
    requests = Histogram("request_duration_seconds", "d", ["verb", "resource"], registry=registry)
    requests.labels("GET", "pods").observe(0.02)
    requests.labels("LIST", 'odd "quoted", {braced} \\ and\nnewline').observe(3.0)
    Gauge("queue_depth", "d", ["name"], registry=registry).labels("resource_claim").set(math.inf)
    Counter("prepares", "d", ["result"], registry=registry).labels("ok").inc(3)
    text = generate_latest(registry).decode()
    # As the Kubernetes components write them: a counter without _total, an untyped
    # sample, a timestamp, blank lines, spaces after commas.
    return text + (
        "# HELP authenticated_user_requests Counter\n"
        "# TYPE authenticated_user_requests counter\n"
        'authenticated_user_requests{username="other"} 738\n'
        "\n"
        'untyped_thing{a="1", b="2",} 5 1700000000000\n'
        "process_cpu_seconds_total 12.5\n"
        "scheduler_pending_pods NaN\n"
    )


def test_it_reads_what_prometheus_reads_escapes_and_counters_named_as_prometheus_names_them() -> None:
    text = _exposition()
    mine, theirs = Scrape.parse(text).samples, _reference(text)
    assert mine.keys() == theirs.keys()
    for name, series in mine.items():
        assert series.keys() == theirs[name].keys(), name
        for labels, value in series.items():
            assert value == theirs[name][labels] or (math.isnan(value) and math.isnan(theirs[name][labels]))
    assert mine["authenticated_user_requests_total"] == {frozenset({("username", "other")}): 738.0}
    assert mine["prepares_total"] == {frozenset({("result", "ok")}): 3.0}
    odd = frozenset({("verb", "LIST"), ("resource", 'odd "quoted", {braced} \\ and\nnewline')})
    assert mine["request_duration_seconds_count"][odd] == 1.0


def test_a_filter_keeps_only_the_named_samples_and_names_them_the_same() -> None:
    text = _exposition()
    kept = Scrape.parse(text, ("authenticated_user_requests", "queue_")).samples
    assert set(kept) == {"authenticated_user_requests_total", "queue_depth"}
    assert kept["queue_depth"] == {frozenset({("name", "resource_claim")}): math.inf}


def test_a_narrowed_filter_keeps_a_family_only_for_the_labels_named_and_the_rest_as_before() -> None:
    text = _exposition()
    wanted = Narrowed("request_duration_seconds", ('resource="pods"',))
    kept = Scrape.parse(text, (wanted, "queue_")).samples
    everything = Scrape.parse(text).samples
    assert set(kept) == {
        "request_duration_seconds_bucket",
        "request_duration_seconds_count",
        "request_duration_seconds_sum",
        "request_duration_seconds_created",
        "queue_depth",
    }
    for name, series in kept.items():
        assert series == {
            labels: value
            for labels, value in everything[name].items()
            if name == "queue_depth" or ("resource", "pods") in labels
        }, name
    assert kept["request_duration_seconds_count"] == {frozenset({("verb", "GET"), ("resource", "pods")}): 1.0}


@pytest.mark.parametrize(
    "line",
    ['requests{verb="GET" 5', "requests{verb=GET} 5", "requests", 'requests{verb="GET"}', "requests{} five", " 5"],
)
def test_a_line_that_is_not_the_text_format_is_refused_naming_it(line: str) -> None:
    with pytest.raises(MalformedMetrics) as refused:
        parse_sample(line)
    assert repr(line) in str(refused.value)
