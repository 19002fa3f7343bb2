"""The timeline plot draws sampled counts as steps that reach the run's end."""

from __future__ import annotations

from testbed.report.report import held_until


def test_the_last_sample_holds_until_the_run_ended() -> None:
    samples = [(0.0, 0, 0.0, 0.0), (1.0, 3, 2.0, 1.0), (2.0, 5, 0.0, 0.0)]
    assert held_until(samples, 2.6) == [*samples, (2.6, 5, 0.0, 0.0)]


def test_a_run_that_ended_at_its_last_sample_and_an_empty_timeline_are_drawn_as_they_are() -> None:
    samples = [(0.0, 0, 0.0, 0.0), (1.0, 3, 2.0, 1.0)]
    assert held_until(samples, 1.0) == samples
    assert held_until([], 5.0) == []
