"""Every Ray host must run the fleet's testbed: the digest tells two checkouts apart."""

from __future__ import annotations

from pathlib import Path

from testbed.fingerprint import code_version, digest, strangers


def _package(root: Path, body: str) -> Path:
    package = root / "testbed"
    (package / "driver").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "driver" / "prepare.py").write_text(body)
    (package / "driver" / "__pycache__").mkdir()
    (package / "driver" / "__pycache__" / "prepare.cpython-311.pyc").write_bytes(b"compiled")
    return package


def test_one_changed_source_file_changes_the_digest_and_compiled_files_do_not(tmp_path: Path) -> None:
    first = _package(tmp_path / "a", "def prepare(): return 1\n")
    same = _package(tmp_path / "b", "def prepare(): return 1\n")
    changed = _package(tmp_path / "c", "def prepare(): return 2\n")
    assert digest([first]) == digest([same])
    assert digest([first]) != digest([changed])
    (same / "driver" / "__pycache__" / "prepare.cpython-311.pyc").write_bytes(b"recompiled")
    assert digest([first]) == digest([same])


def test_hosts_with_other_code_are_named_with_theirs() -> None:
    mine = code_version()
    assert mine == code_version()  # one answer per process
    reports = {"host-b (pid 7)": "0123456789ab (Python 3.12)", "host-a (pid 5)": mine}
    assert strangers(mine, reports) == ["host-b (pid 7): 0123456789ab (Python 3.12)"]
    assert strangers(mine, {"host-a (pid 5)": mine}) == []
