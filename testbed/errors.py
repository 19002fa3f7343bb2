"""The one exception type users see: a message plus what to do about it."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType


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


def interrupt_on_sigterm() -> None:
    """SIGTERM (`timeout`, CI cancelling a job) ends this process as Ctrl-C does: through
    its ``finally`` blocks, so what it started (control plane, Ray) is stopped, not left."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def run_interruptibly(main: Callable[[], int]) -> int:
    """A script's ``main``, ended by Ctrl-C or SIGTERM as a command is: its cleanup run,
    then one line and exit status 130 instead of a traceback."""
    interrupt_on_sigterm()
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
