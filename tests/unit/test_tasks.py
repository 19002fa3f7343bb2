"""Stopping a component's background tasks: they end, and one that had failed does not
stop the others from being stopped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from testbed.tasks import cancel_and_wait


def test_live_tasks_end_and_a_failed_one_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[bool, bool]:
        async def forever() -> None:
            await asyncio.Event().wait()

        async def broken() -> None:
            raise RuntimeError("watch died")

        running = asyncio.create_task(forever(), name="forever")
        failed = asyncio.create_task(broken(), name="broken")
        await asyncio.sleep(0)  # let the broken one fail first
        await cancel_and_wait(running, None, failed)
        return running.cancelled(), failed.done()

    with caplog.at_level(logging.WARNING, logger="testbed.tasks"):
        cancelled, done = asyncio.run(scenario())
    assert cancelled and done
    assert "broken" in caplog.text and "watch died" in caplog.text
