"""Being told of changes in directories, as a kubelet's plugin watcher is (inotify).

One inotify instance serves every kubelet of a process: a NodeHost runs hundreds of
them, and the kernel allows a user 128 instances by default (fs.inotify.max_user_instances)
but 8,192 to about a million watches (fs.inotify.max_user_watches, by memory), one per
directory watched. Where inotify cannot be had (another OS, no instance left),
``watcher()`` answers None; where a watch cannot be added (ENOSPC: the watches are used
up), ``watch`` raises. Either way the callers poll instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
CHANGES = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
"""Entries made, removed or moved in or out, and the directory itself going away: what
fsnotify reports to the kubelet as Create, Remove and Rename. Not writes or attributes."""

_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_READ_SIZE = 64 * 1024

Wake = Callable[[], None]


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    for name, argtypes in (
        ("inotify_init1", [ctypes.c_int]),
        ("inotify_add_watch", [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]),
        ("inotify_rm_watch", [ctypes.c_int, ctypes.c_int]),
    ):
        function = getattr(libc, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    return libc


@dataclass(frozen=True)
class Watch:
    """One caller's interest in one directory; give it back to ``unwatch``."""

    descriptor: int
    wake: Wake


class DirectoryWatcher:
    """An inotify instance read on the event loop that made it. Each watched directory
    wakes its callers (each once per batch of events, with no argument): they look for
    themselves what changed, as the kubelet's plugin watcher stats what it is told of."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int):
        self._loop = loop
        self._fd = fd
        self._wakes: dict[int, list[Wake]] = {}
        self.exhausted = False
        """A watch was refused for want of watches (ENOSPC): its callers poll."""
        loop.add_reader(fd, self._read)

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop) -> DirectoryWatcher:
        """Raises OSError where inotify is not to be had."""
        libc = _libc()
        if libc is None:
            raise OSError(errno.ENOSYS, "inotify is Linux's")
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise _error("inotify_init1")
        return cls(loop, fd)

    def watch(self, directory: Path, wake: Wake) -> Watch:
        """Call ``wake`` after entries of ``directory`` are made, removed or moved, or
        it goes. Raises OSError (e.g. ENOSPC: fs.inotify.max_user_watches reached)."""
        descriptor = _libc().inotify_add_watch(self._fd, os.fsencode(directory), CHANGES | IN_ONLYDIR)
        if descriptor < 0:
            error = _error(f"inotify_add_watch {directory}")
            self.exhausted |= error.errno == errno.ENOSPC
            raise error
        self._wakes.setdefault(descriptor, []).append(wake)  # a directory watched twice: one descriptor
        return Watch(descriptor, wake)

    def unwatch(self, watch: Watch) -> None:
        wakes = self._wakes.get(watch.descriptor)
        if wakes is None:
            return  # the directory went, and its watch with it
        wakes.remove(watch.wake)
        if not wakes:
            del self._wakes[watch.descriptor]
            _libc().inotify_rm_watch(self._fd, watch.descriptor)  # EINVAL if already gone: nothing to do

    def live(self, watch: Watch) -> bool:
        """False once its directory went (removed or moved away): a directory made again
        at the same path must be watched anew."""
        return watch.wake in self._wakes.get(watch.descriptor, ())

    @property
    def watched(self) -> int:
        return len(self._wakes)

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._wakes.clear()

    def _read(self) -> None:
        woken: dict[Wake, None] = {}  # each caller once (a bound method per directory is equal to the others)
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                descriptor, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:  # events were lost: everyone looks again
                    targets = [w for wakes in self._wakes.values() for w in wakes]
                else:
                    targets = list(self._wakes.get(descriptor, ()))
                if mask & IN_IGNORED:  # the watch is gone (its directory removed)
                    self._wakes.pop(descriptor, None)
                woken.update(dict.fromkeys(targets))
        for wake in woken:
            try:
                wake()
            except Exception:
                log.exception("a directory watcher's callback failed")


def _error(what: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{what}: {os.strerror(number)}")


_per_loop: dict[asyncio.AbstractEventLoop, DirectoryWatcher | None] = {}


def watcher() -> DirectoryWatcher | None:
    """The running loop's watcher, opened on first use; None (logged once per loop) where
    inotify is not to be had."""
    loop = asyncio.get_running_loop()
    if loop not in _per_loop:
        for stale in [other for other in _per_loop if other.is_closed()]:
            if (finished := _per_loop.pop(stale)) is not None:  # a finished asyncio.run()'s
                finished.close()
        try:
            _per_loop[loop] = DirectoryWatcher.open(loop)
        except OSError as exc:
            log.warning("no inotify (%s): plugin registration directories are polled instead", exc)
            _per_loop[loop] = None
    return _per_loop[loop]
