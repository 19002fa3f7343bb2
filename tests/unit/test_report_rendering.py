"""What a report shows is what was measured: no sample without width, no "n/a" for
something that was measured and did not happen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.report import report
from testbed.report.metrics import Scrape
from testbed.report.report import held_until
from testbed.scenarios import spec
from testbed.scenarios.runner import RunData


def test_the_last_sample_holds_until_the_run_ended() -> None:
    samples = [(0.0, 0, 0.0, 0.0), (1.0, 3, 2.0, 1.0), (2.0, 5, 0.0, 0.0)]
    assert held_until(samples, 2.6) == [*samples, (2.6, 5, 0.0, 0.0)]


def test_a_run_that_ended_at_its_last_sample_and_an_empty_timeline_are_drawn_as_they_are() -> None:
    samples = [(0.0, 0, 0.0, 0.0), (1.0, 3, 2.0, 1.0)]
    assert held_until(samples, 1.0) == samples
    assert held_until([], 5.0) == []


def _gc_pauses(count: float) -> Scrape:
    name = "dra_testbed_gc_pause_seconds_bucket"
    return Scrape(
        {
            name: {
                frozenset({("le", "0.001"), ("generation", "0")}): count,
                frozenset({("le", "+Inf"), ("generation", "0")}): count,
            }
        }
    )


@pytest.mark.parametrize(
    ("before", "after", "shown"),
    [
        (_gc_pauses(3), _gc_pauses(3), "| NodeHost GC pause p99 | no collections |"),
        (None, None, "| NodeHost GC pause p99 | n/a |"),
        (_gc_pauses(3), _gc_pauses(9), "| NodeHost GC pause p99 | 1.0 ms |"),
    ],
    ids=["none-happened", "not-scraped", "measured"],
)
def test_a_histogram_read_with_nothing_in_it_says_so_rather_than_n_a(
    before: Scrape | None, after: Scrape | None, shown: str
) -> None:
    data = RunData(spec.load("smoke"), "ns", 0.0, 0.0, ended=10.0)
    if before is not None and after is not None:
        data.before["fleet"], data.after["fleet"] = before, after
    text = report.markdown(report.build(data, {"checkpoint_entries": 0, "cdi_specs": 0}, {}))
    assert shown in text, [line for line in text.splitlines() if "GC pause" in line]


def test_a_scenario_without_a_description_leaves_no_gap_under_the_title() -> None:
    scenario = spec.Scenario.model_validate({"name": "plain", "phases": [{"name": "p", "jobs": 1}]})
    leaks = {"checkpoint_entries": 0, "cdi_specs": 0}
    text = report.markdown(report.build(RunData(scenario, "ns", 0.0, 0.0, ended=1.0), leaks, {}))
    assert text.startswith("# plain: ") and "\n\n\n" not in text.split("| cluster |")[0], text[:200]


def test_a_report_replaces_only_an_earlier_reports_files(tmp_path: Path) -> None:
    """`--output` into a directory of the user's: never over a report.md of their own."""
    assert report.foreign_files(tmp_path) == []
    (tmp_path / "notes.txt").write_text("not a report's name\n")
    assert report.foreign_files(tmp_path) == []
    (tmp_path / "report.md").write_text("the user's own\n")
    assert report.foreign_files(tmp_path) == ["report.md"]
    leaks = {"checkpoint_entries": 0, "cdi_specs": 0}
    data = RunData(spec.load("smoke"), "ns", 0.0, 0.0, ended=10.0)
    (tmp_path / "report.json").write_text(json.dumps(report.build(data, leaks, {})))
    assert report.foreign_files(tmp_path) == [], "an earlier report's directory"
