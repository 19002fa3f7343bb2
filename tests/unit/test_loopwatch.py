"""A NodeHost's own stalls must show in its metrics, or a report blames the control plane."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import REGISTRY

from testbed.fleet.loopwatch import LoopWatch


def _lag_count(le: str | None = None) -> float:
    if le is None:
        return REGISTRY.get_sample_value("dra_testbed_event_loop_lag_seconds_count") or 0.0
    return REGISTRY.get_sample_value("dra_testbed_event_loop_lag_seconds_bucket", {"le": le}) or 0.0


def _gc_runs() -> float:
    return sum(
        REGISTRY.get_sample_value("dra_testbed_gc_pause_seconds_count", {"generation": g}) or 0.0
        for g in ("0", "1", "2")
    )


def test_a_blocked_loop_is_measured_as_lag() -> None:
    async def scenario() -> tuple[float, float]:
        watch = LoopWatch()
        total_before = _lag_count()
        quick_before = _lag_count("0.03")
        watch.start()
        await asyncio.sleep(0)  # let the probe begin its first wait
        time.sleep(0.25)  # a callback that hogs the loop, as a slow one would
        deadline = time.monotonic() + 5
        while _lag_count() == total_before and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await watch.stop()
        total = _lag_count() - total_before
        quick = _lag_count("0.03") - quick_before
        return total, quick

    total, quick = asyncio.run(scenario())
    assert total >= 1
    assert quick < total, "a 250 ms stall was recorded as under 30 ms"


def test_collector_runs_are_timed_only_while_watching() -> None:
    async def scenario() -> tuple[float, float]:
        watch = LoopWatch()
        before = _gc_runs()
        watch.start()
        gc.collect()
        during = _gc_runs() - before
        await watch.stop()
        gc.collect()
        after = _gc_runs() - before
        return during, after

    during, after = asyncio.run(scenario())
    assert during >= 1
    assert after == during
