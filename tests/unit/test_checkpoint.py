"""The checkpoint file two driver instances share during a rolling update."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.kubeletplugin.checkpoint import Checkpoint, CheckpointCorrupt, ClaimRecord, ClaimState


def _record(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimRecord:
    return ClaimRecord(uid, "ns", f"claim-{uid}", state)


def test_each_instance_sees_the_other_ones_writes(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    old, new = Checkpoint(path, durable=False), Checkpoint(path, durable=False)
    old.load()
    old.put(_record("a"))
    new.load()
    assert set(new.claims) == {"a"}
    new.put(_record("b"))
    new.remove("a")
    old.load()
    assert set(old.claims) == {"b"}, "an instance kept its own stale copy"
    old.load()  # unchanged file: still the same answer
    assert set(old.claims) == {"b"}


def test_damage_in_place_is_noticed_by_an_instance_that_wrote_the_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path, durable=False)
    checkpoint.put(_record("a", ClaimState.PREPARE_STARTED))
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(CheckpointCorrupt):
        checkpoint.load()
    assert checkpoint.claims == {}
    assert not path.exists(), "the damaged file was not set aside"


def test_a_deleted_file_means_no_claims(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path, durable=False)
    checkpoint.put(_record("a"))
    path.unlink()
    checkpoint.load()
    assert checkpoint.claims == {}
