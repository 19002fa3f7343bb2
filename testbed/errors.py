"""The one exception type users see: a message plus what to do about it."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


class TestbedError(Exception):
    """An error whose text names the problem and, in ``hint``, the way out."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, message: str, hint: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.detail = detail

    def __str__(self) -> str:
        parts = [self.message]
        if self.detail:
            parts.append(self.detail.rstrip())
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


@dataclass
class _MainCoroutine:
    """What ``run_coroutine`` runs on the main thread (where signals arrive), if anything."""

    loop: asyncio.AbstractEventLoop
    task: asyncio.Task[Any]
    cancelled: bool = False


_main: list[_MainCoroutine] = []


def interrupt_on_sigterm() -> None:
    """SIGTERM (`timeout`, CI cancelling a job) ends this process as Ctrl-C does: through
    its ``finally`` blocks, so what it started (control plane, Ray) is stopped, not left.

    Inside ``run_coroutine`` it cancels the coroutine, as asyncio does for Ctrl-C: the
    cancellation arrives at the next ``await``. A KeyboardInterrupt raised wherever the
    signal lands could land in a destructor (a gRPC channel's, say), where Python prints
    it and goes on as if nothing had happened."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if _main and not _main[-1].cancelled and not _main[-1].task.done():
            running = _main[-1]
            running.cancelled = True
            running.task.cancel()
            running.loop.call_soon_threadsafe(lambda: None)  # wake a loop asleep in select()
            return
        raise KeyboardInterrupt  # outside a coroutine, or a second signal: at once

    signal.signal(signal.SIGTERM, handler)


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, ended by SIGTERM (see ``interrupt_on_sigterm``) with KeyboardInterrupt
    once the coroutine has unwound, even when it swallowed the cancellation. On another
    thread (which signals never reach) it is ``asyncio.run``."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coroutine)
    running: list[_MainCoroutine] = []

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        running.append(_MainCoroutine(asyncio.get_running_loop(), task))
        _main.append(running[0])
        try:
            return await coroutine
        finally:
            _main.remove(running[0])

    try:
        result = asyncio.run(main())
    except asyncio.CancelledError:
        if running and running[0].cancelled:
            raise KeyboardInterrupt from None
        raise
    if running and running[0].cancelled:
        raise KeyboardInterrupt
    return result


def run_interruptibly(main: Callable[[], int]) -> int:
    """A script's ``main``, ended by Ctrl-C or SIGTERM as a command is: its cleanup run,
    then one line and exit status 130 instead of a traceback."""
    interrupt_on_sigterm()
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
