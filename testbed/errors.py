"""The one exception type users see: a message plus what to do about it."""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import errno
import os
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


@dataclass
class _LostInterrupt:
    """A KeyboardInterrupt Python dropped, to be raised again (see
    ``_raise_lost_interrupts_again``)."""

    pending: bool = False
    in_hook: bool = False


_lost = _LostInterrupt()


def interrupt_on_sigterm() -> None:
    """SIGTERM (`timeout`, CI cancelling a job) and SIGHUP (its terminal closed) end this
    process as Ctrl-C does: through its ``finally`` blocks, so what it started (control
    plane, Ray) is stopped, not left, and a run writes its report.

    Inside ``run_coroutine`` it cancels the coroutine, as asyncio does for Ctrl-C: the
    cancellation arrives at the next ``await``. A KeyboardInterrupt raised wherever the
    signal lands could land in a destructor (a gRPC channel's, say), where Python prints
    it and goes on as if nothing had happened. Outside a coroutine (a fleet waiting on
    Ray) the interrupt is raised at once, and one that lands in a destructor all the
    same, from either signal, is raised again (see ``_raise_lost_interrupts_again``)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            _leave_the_terminal()
        if _lost.pending:
            if _lost.in_hook:  # raised here, it would be dropped again
                _raise_again_soon()
                return
            _lost.pending = False
            raise KeyboardInterrupt
        if _main and not _main[-1].cancelled and not _main[-1].task.done():
            running = _main[-1]
            running.cancelled = True
            running.task.cancel()
            running.loop.call_soon_threadsafe(lambda: None)  # wake a loop asleep in select()
            return
        raise KeyboardInterrupt  # outside a coroutine, or a second signal: at once

    signal.signal(signal.SIGTERM, handler)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # under nohup it stays ignored
        signal.signal(signal.SIGHUP, handler)
        sys.stdout, sys.stderr = _HangUpProof.around(sys.stdout), _HangUpProof.around(sys.stderr)
    _raise_lost_interrupts_again()


class _HangUpProof:
    """A terminal's stream whose writes, once the terminal is gone (EIO, before or after
    the SIGHUP arrives), go nowhere instead of failing whatever was printing."""

    def __init__(self, stream: Any):
        self._stream = stream

    @classmethod
    def around(cls, stream: Any) -> Any:
        if stream is None or isinstance(stream, cls):
            return stream
        try:
            terminal = stream.isatty()
        except (AttributeError, ValueError, OSError):
            return stream
        return cls(stream) if terminal else stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            _leave_the_terminal()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            _leave_the_terminal()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _leave_the_terminal() -> None:
    """The terminal closed (SIGHUP): what is still written to it would fail (EIO) and cut
    the cleanup short, so it goes nowhere from now on; the report and logs are files."""
    with contextlib.suppress(OSError):
        nowhere = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                if os.isatty(fd):
                    os.dup2(nowhere, fd)
        os.close(nowhere)


def _raise_lost_interrupts_again() -> None:
    """Python cannot raise an exception out of a destructor (a Ray object reference's, a
    gRPC channel's): it prints "Exception ignored in ..." and goes on, and a Ctrl-C or
    SIGTERM that landed there is lost. Its KeyboardInterrupt comes here instead, and is
    raised again in the main thread a moment later, out of the destructor."""
    previous = sys.unraisablehook
    if getattr(previous, "raises_interrupts_again", False):
        return

    def hook(unraisable: Any) -> None:
        lost = unraisable.exc_value
        if isinstance(lost, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            _lost.in_hook = True
            try:
                _lost.pending = True
                _raise_again_soon()
            finally:
                _lost.in_hook = False
            return
        previous(unraisable)

    hook.raises_interrupts_again = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _raise_again_soon() -> None:
    """The SIGTERM handler raises the lost interrupt, run a moment later: run at once, it
    would run inside the hook (Python looks for signals after every call)."""
    timer = threading.Timer(0.001, _thread.interrupt_main, args=(signal.SIGTERM,))
    timer.daemon = True
    timer.start()


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
