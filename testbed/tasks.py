"""Stopping background tasks, waiting for the first of several things, and watching how
long the event loop is held: one way for every component."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel these tasks and return once they have all ended. A task that had already
    failed is logged, not raised: a stop must go on to stop the rest."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    results = await asyncio.gather(*live, return_exceptions=True)
    for task, result in zip(live, results, strict=True):
        if isinstance(result, Exception):  # a cancellation is a BaseException, not this
            log.warning("background task %s had failed: %r", task.get_name(), result)


async def first_of(*waits: Coroutine[Any, Any, Any]) -> None:
    """Until the first of these finishes; the others are cancelled (also when the caller is).
    One that failed is logged, as `cancel_and_wait` does."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(*tasks)


async def watch_lateness(every_s: float, late: Callable[[float, float], None]) -> None:
    """Sleep ``every_s`` again and again and tell ``late(asked, by)`` how much later than
    asked (``time.monotonic()``) each sleep woke: how long other work held the event loop,
    which every task on it waited out. Until cancelled."""
    while True:
        asked = time.monotonic() + every_s
        await asyncio.sleep(every_s)
        late(asked, max(0.0, time.monotonic() - asked))
