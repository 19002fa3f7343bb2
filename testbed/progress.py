"""Progress for long work: a live line on a terminal, throttled plain lines elsewhere (CI)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console


def counted(count: int, noun: str) -> str:
    """``1 node``, ``2 nodes``: for the messages that count things (nouns ending in s or
    y are not among them)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class Progress(Protocol):
    def step(self, message: str) -> None:
        """A milestone, always shown."""

    def update(self, message: str) -> None:
        """A transient status; may be dropped or throttled."""

    @contextmanager
    def task(self, message: str) -> Iterator[None]:
        """Frame a long task so updates can be drawn as a live status."""
        yield


class ConsoleProgress:
    """Writes to stderr so stdout stays machine-readable (the kubeconfig path)."""

    def __init__(self, console: Console | None = None, plain_interval_s: float = 15.0):
        from rich.console import Console  # only where progress is shown: not in NodeHosts

        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.plain_interval_s = plain_interval_s
        self._status: object | None = None
        self._last_plain = 0.0
        self._task_started = time.monotonic()

    def step(self, message: str) -> None:
        self.console.print(message)

    def update(self, message: str) -> None:
        status = self._status
        if status is not None:
            status.update(message)  # type: ignore[attr-defined]
            return
        now = time.monotonic()
        if now - self._last_plain >= self.plain_interval_s:
            self._last_plain = now
            self.console.print(f"  ... {message} ({now - self._task_started:.0f} s)")

    @contextmanager
    def task(self, message: str) -> Iterator[None]:
        """Framed by its start and, once it succeeds, how long it took."""
        self._task_started = started = time.monotonic()
        if not self.console.is_terminal:
            self.console.print(message)
            self._last_plain = started
            yield
        else:
            with self.console.status(message) as status:
                self._status = status
                try:
                    yield
                finally:
                    self._status = None
        self.console.print(f"{message}: done in {time.monotonic() - started:.1f} s")


class SilentProgress:
    def step(self, message: str) -> None:
        pass

    def update(self, message: str) -> None:
        pass

    @contextmanager
    def task(self, message: str) -> Iterator[None]:
        yield


class PrintProgress(SilentProgress):
    """Plain milestones on stderr; for tests and scripts."""

    def step(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)
