from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_plugins = ["testbed.testing"]


@dataclass
class SmallFilesystem:
    """A tmpfs a test can fill up, as a node's disk fills."""

    path: Path

    @property
    def _filler(self) -> Path:
        return self.path / "filler"

    def fill(self, leave_pages: int = 0) -> None:
        """Until not one more byte fits, then free ``leave_pages`` of 4 KiB (a file's
        first byte takes one)."""
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (b"\0" * 4096, b"\0"):  # whole pages, then the last one's tail
                try:
                    while os.write(fd, chunk):
                        pass
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave_pages * 4096))
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[SmallFilesystem]:
    """A 256 KiB tmpfs mounted in a mount namespace of this test's own (the machine's
    mounts are left alone), reached through its holder process's /proc/PID/root."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    script = 'mount -t tmpfs -o size=256k,mode=0700 tmpfs "$1" && echo mounted && exec sleep infinity'
    try:
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(mountpoint)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except FileNotFoundError:
        pytest.skip("needs unshare(1) (util-linux)")
    assert holder.stdout is not None and holder.stderr is not None
    if holder.stdout.readline().strip() != "mounted":
        holder.kill()
        why = holder.stderr.read().strip()
        holder.wait()
        pytest.skip(f"cannot mount a tmpfs in a mount namespace of its own (root needed): {why}")
    try:
        yield SmallFilesystem(Path(f"/proc/{holder.pid}/root") / mountpoint.relative_to("/"))
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        holder.stderr.close()
        assert not os.path.ismount(mountpoint), "mounted in its own namespace only"
