"""The checkpoint file two driver instances share during a rolling update."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.kubeletplugin.checkpoint import Checkpoint, CheckpointCorrupt, ClaimRecord, ClaimState, PrepareIntents


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


def test_prepare_intents_name_only_whole_lines(tmp_path: Path) -> None:
    """A crash can cut the last append short: that line names no claim."""
    intents = PrepareIntents(tmp_path / "prepare-intents")
    assert intents.uids() == []
    intents.add("a")
    intents.add("b")
    intents.add("a")
    with intents.path.open("ab") as f:
        f.write(b"c-cut-sh")
    assert intents.uids() == ["a", "b"]
    intents.reset(keep={"b"})
    assert intents.uids() == ["b"]
    intents.reset()
    assert intents.uids() == ["b"], "an instance that added nothing since leaves the file alone"
    intents.reset(force=True)
    assert intents.uids() == []
