"""Stopping background tasks, and waiting for the first of several things: one way for
every component."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
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
