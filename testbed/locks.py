"""Locks between testbed processes on one machine (flock: the kernel drops a lock whose
holder died, so a killed command never leaves one behind)."""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held(path: Path, holder: str = "", waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``path``'s lock for the block, waiting while another process holds it.
    ``holder``: who this is, written into the file for the next one that waits;
    ``waiting`` is told who that is before it waits ("" when it did not say)."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                handle.seek(0)
                waiting(handle.read().strip())
            fcntl.flock(handle, fcntl.LOCK_EX)
        if holder:
            handle.seek(0)
            handle.truncate()
            handle.write(holder)
            handle.flush()
        yield
