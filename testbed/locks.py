"""Locks between testbed processes on one machine (flock: the kernel drops a lock whose
holder died, so a killed command never leaves one behind)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held(path: Path, holder: str = "", waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``path``'s lock for the block, waiting while another process holds it.
    ``holder``: what this process is doing, written into the file with its pid for the
    next one that waits; ``waiting`` is told who that is ("... (pid N)") before it waits."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                handle.seek(0)
                pid, _, doing = handle.read().partition("\n")
                waiting(f"{doing.strip() or 'another process'} (pid {pid.strip() or 'unknown'})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n{holder}")
        handle.flush()
        yield


def holder(path: Path) -> int | None:
    """The pid of the process holding ``path``'s lock now; None when nobody does."""
    try:
        handle = path.open("r")
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = handle.readline().strip()
            return int(pid) if pid.isdigit() else None
        return None  # free (and let go again as the file closes)


def wait_free(path: Path, timeout_s: float) -> bool:
    """Whether ``path``'s lock was let go within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while holder(path) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
