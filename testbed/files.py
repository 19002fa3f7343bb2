"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from testbed.errors import TestbedError


def write_atomically(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write to a temporary file and rename it over ``path``. ``durable`` adds an fsync,
    which only matters if the machine (not the process) goes down."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
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
