"""A run reads the NodeHosts' metrics through their actors: a host that did not answer is
a failed scrape the report names, never a host that counted nothing."""

from __future__ import annotations

import asyncio

from testbed.report.metrics import fleet_increase
from testbed.scenarios import runner, spec
from testbed.scenarios.runner import Endpoints

PREPARES = "dra_testbed_prepared_claims_total"


def _runner(answers: list[list[tuple[str, str]]]) -> runner.Runner:
    """A runner whose fleet answers with each list in turn."""
    pending = list(answers)

    async def texts() -> list[tuple[str, str]]:
        return pending.pop(0)

    endpoints = Endpoints(kcm="", scheduler="", nodehosts=texts)
    return runner.Runner(None, spec.load("smoke"), endpoints)  # type: ignore[arg-type]  # no API call is made


def test_a_host_that_did_not_answer_makes_the_fleet_figures_partial_and_says_why() -> None:
    work = _runner(
        [
            [(f"{PREPARES} 3\n", ""), (f"{PREPARES} 5\n", "")],
            [(f"{PREPARES} 7\n", ""), ("", "NodeHost nodehost-1: GetTimeoutError")],
        ]
    )
    before = asyncio.run(work._nodehost_scrapes())
    after = asyncio.run(work._nodehost_scrapes())
    assert after[1].failed == "NodeHost nodehost-1: GetTimeoutError"
    total, partial = fleet_increase(before, after)
    assert "NodeHost 1 not scraped (NodeHost nodehost-1: GetTimeoutError)" in partial
    assert total.samples[PREPARES] == {frozenset(): 4.0}  # what the host that answered counted


def test_without_a_fleet_there_is_nothing_to_scrape() -> None:
    work = runner.Runner(None, spec.load("smoke"), Endpoints(kcm="", scheduler=""))  # type: ignore[arg-type]
    assert asyncio.run(work._nodehost_scrapes()) == []
