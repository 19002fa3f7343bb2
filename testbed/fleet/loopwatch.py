"""How late a NodeHost's event loop runs, and how long Python's collector stops it.

All the synthetic nodes of a host share one event loop, so any stall there is latency
in every node's NodePrepareResources at once. These two histograms let a report tell
"the control plane was slow" from "the testbed was".
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from prometheus_client import Histogram

from testbed.tasks import cancel_and_wait, watch_lateness

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)
PROBE_INTERVAL_S = 0.1

LOOP_LAG = Histogram(
    "dra_testbed_event_loop_lag_seconds",
    "How much later than asked a NodeHost's event loop woke a sleeping task",
    buckets=LAG_BUCKETS,
)
GC_PAUSE = Histogram(
    "dra_testbed_gc_pause_seconds",
    "How long one run of Python's garbage collector stopped a NodeHost",
    ["generation"],
    buckets=LAG_BUCKETS,
)


class LoopWatch:
    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._gc_started = 0.0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                watch_lateness(PROBE_INTERVAL_S, lambda _, late: LOOP_LAG.observe(late)), name="loop-watch"
            )
            gc.callbacks.append(self._on_gc)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            GC_PAUSE.labels(str(info.get("generation", ""))).observe(time.perf_counter() - self._gc_started)
