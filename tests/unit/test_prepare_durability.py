"""What a durable prepare puts on disk before it answers, and what repair cleans up after
a machine went down between a claim's CDI spec and its record reaching the disk."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import uuid
from pathlib import Path

import pytest

from fake_devices.hardware import NodeHardware
from testbed.drivers import KINDS, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.kubeapi import ClaimRef, Credentials, KubeClient, Obj
from testbed.kubeletplugin import cdi
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.prepare import ClaimPreparer, DriverPaths

GPU = "gpu.dra-testbed.io"


class Claims(ClaimReader):
    """Claims allocated on node ``n``, one GPU each, as the API server would answer."""

    def __init__(self, devices: dict[str, str]):
        super().__init__(KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context())))
        self.devices = devices  # claim UID -> device

    async def get(self, namespace: str, name: str) -> Obj:
        uid = name.removeprefix("claim-")
        result = {"request": "gpu", "driver": GPU, "pool": "n", "device": self.devices[uid]}
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }


def _preparer(root: Path, devices: dict[str, str], durable: bool = True) -> ClaimPreparer:
    paths = DriverPaths.for_node(root / "kubelet", GPU, root / "cdi")
    claims = Claims(devices)
    driver = KINDS[GPU].make(LocalBackend(NodeHardware("n", load_profile("tiny"))), claims.client)
    return ClaimPreparer(driver, "n", paths, claims, durable)


def _ref(uid: str) -> ClaimRef:
    return ClaimRef("ns", uid, f"claim-{uid}")


def test_a_durable_prepare_syncs_the_spec_and_the_completed_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uid = str(uuid.uuid4())
    preparer = _preparer(tmp_path, {uid: "gpu-0"})
    synced: list[tuple[str, dict[str, object]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        content = os.pread(fd, 1 << 20, 0)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), json.loads(content) if content else {}))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    results = asyncio.run(preparer.prepare([_ref(uid)]))
    assert results[uid].error == ""
    checkpoints = [content for path, content in synced if ".checkpoint.json." in path]
    specs = [path for path, _ in synced if f".{GPU}-{uid}.json." in path]
    assert len(specs) == 1, synced
    # The last record synced before the answer is the completed one: the answer outlives a power cut.
    assert checkpoints and checkpoints[-1]["claims"][uid]["state"] == "PrepareCompleted"  # type: ignore[index]
    assert len(synced) == 2, "one fsync for the spec, one for the completed record"


def test_repair_removes_this_drivers_specs_of_claims_it_holds_no_record_of(tmp_path: Path) -> None:
    kept, orphan = str(uuid.uuid4()), str(uuid.uuid4())
    preparer = _preparer(tmp_path, {kept: "gpu-0", orphan: "gpu-1"})
    asyncio.run(preparer.prepare([_ref(kept)]))
    cdi_dir = tmp_path / "cdi"
    # As a machine crash can leave it: the spec reached the disk, its record did not.
    cdi.write_claim_spec(cdi_dir, GPU, orphan, [cdi.CdiDevice(f"{orphan}-gpu-1", {"X": "1"})], {})
    others = [
        cdi_dir / f"{GPU}-extra-{uuid.uuid4()}.json",  # a driver whose name extends this one's
        cdi_dir / f"nic.dra-testbed.io-{uuid.uuid4()}.json",
        cdi_dir / f"{GPU}-not-a-uid.json",
    ]
    for path in others:
        path.write_text("{}")

    restarted = _preparer(tmp_path, {kept: "gpu-0", orphan: "gpu-1"})
    asyncio.run(restarted.repair())
    assert set(cdi.claim_specs(cdi_dir, GPU)) == {kept}
    assert all(path.exists() for path in others)
    assert set(json.loads(restarted.paths.checkpoint.read_text())["claims"]) == {kept}


def test_repair_keeps_every_spec_when_the_checkpoint_was_damaged(tmp_path: Path) -> None:
    """The claims of a checkpoint set aside may still be in use: their specs stay."""
    uid = str(uuid.uuid4())
    preparer = _preparer(tmp_path, {uid: "gpu-0"})
    asyncio.run(preparer.prepare([_ref(uid)]))
    preparer.paths.checkpoint.write_text("{not json")

    restarted = _preparer(tmp_path, {uid: "gpu-0"})
    asyncio.run(restarted.repair())
    assert restarted.corruptions, "the damage was noticed"
    assert set(cdi.claim_specs(tmp_path / "cdi", GPU)) == {uid}
