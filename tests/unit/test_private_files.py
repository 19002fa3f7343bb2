"""Directories and secrets only this user can reach."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from testbed import files
from testbed.errors import TestbedError
from testbed.files import private_dir, write_atomically, write_secret


def test_a_new_private_dir_is_0700(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_a_dir_others_can_write_is_refused_with_the_fix(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(TestbedError) as info:
        private_dir(shared)
    assert "writable by others (mode 777)" in str(info.value) and "chmod 700" in str(info.value)


def test_a_dir_someone_else_made_first_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, 4242, 4242)
    with pytest.raises(TestbedError) as info:
        private_dir(planted)
    assert "belongs to uid 4242" in str(info.value)


def test_a_symlink_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(TestbedError) as info:
        private_dir(tmp_path / "link")
    assert "is not a directory" in str(info.value)


def test_a_secret_is_0600_from_its_first_byte(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    path.write_text("old, world-readable")
    path.chmod(0o644)
    write_secret(path, b"secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"secret"
    assert [p.name for p in tmp_path.iterdir()] == ["key.pem"], "no temporary file left behind"


def test_an_atomic_write_makes_its_directory_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "file.json"
    write_atomically(path, b"x" * 300_000, mode=0o640)
    assert path.read_bytes() == b"x" * 300_000
    assert stat.S_IMODE(path.stat().st_mode) == 0o640, "the mode asked for, whatever the umask"
    write_atomically(path, b"second")
    assert path.read_bytes() == b"second"
    assert [p.name for p in path.parent.iterdir()] == ["file.json"]


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "file"
    write_atomically(path, b"old")
    (tmp_path / "file-is-now-a-dir").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomically(tmp_path / "file-is-now-a-dir", b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "file-is-now-a-dir"]


@pytest.mark.parametrize("swap", [True, False], ids=["swapped-in", "renamed-over"])
def test_a_reader_of_the_old_file_reads_it_whole_while_it_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: bool
) -> None:
    if not swap:  # a system without renameat2's swap
        monkeypatch.setattr(files, "_renameat2", None)
    path = tmp_path / "checkpoint.json"
    write_atomically(path, b"old " * 10_000, mode=0o600, durable=False)
    with path.open("rb") as reader:
        write_atomically(path, b"new", mode=0o600, durable=False)
        assert reader.read() == b"old " * 10_000
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"], "the old file is gone"
