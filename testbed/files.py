"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
from pathlib import Path

from testbed.errors import TestbedError

_temporaries = itertools.count()
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def write_atomically(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write to a temporary file and rename it over ``path``. ``durable`` adds an fsync,
    which only matters if the machine (not the process) goes down. The temporary's name
    is unique to this process and call (a driver writes its checkpoint on every prepare:
    tempfile's random names and a mkdir each time were a tenth of its CPU)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{next(_temporaries)}")
    try:
        fd = os.open(temporary, _CREATE, 0o600)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temporary, _CREATE, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_secret(path: Path, data: bytes) -> None:
    """A key or token: never readable by anyone else, not even for a moment (the
    temporary file is created 0600 and renamed into place)."""
    write_atomically(path, data, mode=0o600, durable=False)


def private_dir(path: Path) -> Path:
    """A directory only this user can enter, created 0700 if missing. One that exists
    must be ours and writable by no one else: under /tmp, another user could have made
    it first, to read our sockets or swap files under us."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise TestbedError(f"{path} is not a directory", hint="remove it, or point the testbed elsewhere")
    if info.st_uid != os.getuid():
        raise TestbedError(
            f"{path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}): someone else made it first",
            hint="remove it if it is stale, or set TESTBED_RUNTIME_DIR to a directory of your own",
        )
    if info.st_mode & 0o022:
        raise TestbedError(
            f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})",
            hint=f"chmod 700 {path}, or remove it",
        )
    return path
