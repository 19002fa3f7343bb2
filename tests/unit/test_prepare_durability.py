"""What a durable prepare puts on disk before it answers, and what repair cleans up or
writes again after a machine went down between a claim's CDI spec and its record reaching
the disk, or a reboot emptied the CDI directory."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import ssl
import uuid
from pathlib import Path

import pytest

from fake_devices.hardware import NodeHardware, PreparedDevice
from testbed.drivers import KINDS, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.kubeapi import ClaimRef, Credentials, KubeClient, Obj
from testbed.kubeletplugin import cdi
from testbed.kubeletplugin.checkpoint import ClaimRecord, ClaimState
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.driver import AllocatedDevice, ClaimToPrepare
from testbed.kubeletplugin.prepare import ClaimPreparer, DriverPaths

GPU = "gpu.dra-testbed.io"
SHARED = {
    "opaque": {
        "driver": GPU,
        "parameters": {
            "apiVersion": "gpu.dra-testbed.io/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
        },
    }
}
"""A claim config whose settings reach the container only through the claim's CDI spec."""


class Claims(ClaimReader):
    """Claims allocated on node ``n``, one GPU each, as the API server would answer."""

    def __init__(self, devices: dict[str, str], configs: dict[str, list[Obj]] | None = None):
        super().__init__(KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context())))
        self.devices = devices  # claim UID -> device
        self.configs = configs or {}  # claim UID -> the allocation's config entries

    async def get(self, namespace: str, name: str) -> Obj:
        uid = name.removeprefix("claim-")
        result = {"request": "gpu", "driver": GPU, "pool": "n", "device": self.devices[uid]}
        devices = {"results": [result], "config": self.configs.get(uid, [])}
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": devices}},
        }


def _preparer(
    root: Path,
    devices: dict[str, str],
    durable: bool = True,
    configs: dict[str, list[Obj]] | None = None,
    hardware: NodeHardware | None = None,
) -> ClaimPreparer:
    """``hardware``: devices that outlive the driver, as a Ray actor's do."""
    paths = DriverPaths.for_node(root / "kubelet", GPU, root / "cdi")
    claims = Claims(devices, configs)
    hardware = hardware or NodeHardware("n", load_profile("tiny"))
    driver = KINDS[GPU].make(LocalBackend(hardware), claims.client)
    return ClaimPreparer(driver, "n", paths, claims, durable)


def _ref(uid: str) -> ClaimRef:
    return ClaimRef("ns", uid, f"claim-{uid}")


def test_a_durable_prepare_syncs_once_the_completed_record_which_holds_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uid = str(uuid.uuid4())
    preparer = _preparer(tmp_path, {uid: "gpu-0"}, configs={uid: [SHARED]})
    synced: list[tuple[str, dict[str, object]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        content = Path(path).read_bytes()
        synced.append((path, json.loads(content) if content else {}))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    results = asyncio.run(preparer.prepare([_ref(uid)]))
    assert results[uid].error == ""
    assert len(synced) == 1, synced
    path, content = synced[0]
    assert ".checkpoint.json." in path
    # The record synced before the answer is the completed one, with all the spec says:
    # the answer outlives a power cut even if the spec does not.
    record = content["claims"][uid]  # type: ignore[index]
    assert record["state"] == "PrepareCompleted"
    spec = json.loads(cdi.spec_path(tmp_path / "cdi", GPU, uid).read_bytes())
    assert cdi.ClaimSpec.from_json(record["cdi_spec"]) == cdi.ClaimSpec(
        {"DRA_TESTBED_CLAIM": f"ns/claim-{uid}"},
        [cdi.CdiDevice(d["name"], dict(e.split("=", 1) for e in d["containerEdits"]["env"])) for d in spec["devices"]],
    )
    assert "GPU_TIMESLICE_INTERVAL=Long" in spec["devices"][0]["containerEdits"]["env"]


def test_a_restart_writes_again_the_specs_a_reboot_or_a_power_cut_lost(tmp_path: Path) -> None:
    """/var/run/cdi is tmpfs: a reboot empties it while the checkpoint on disk says the
    claims are prepared, and the kubelet, restarted, prepares them again. A power cut can
    leave a spec that never reached the disk empty."""
    emptied, truncated = str(uuid.uuid4()), str(uuid.uuid4())
    devices = {emptied: "gpu-0", truncated: "gpu-1"}
    configs = {emptied: [SHARED]}
    preparer = _preparer(tmp_path, devices, configs=configs)
    asyncio.run(preparer.prepare([_ref(emptied), _ref(truncated)]))
    cdi_dir = tmp_path / "cdi"
    written = {uid: cdi.spec_path(cdi_dir, GPU, uid).read_bytes() for uid in devices}
    cdi.spec_path(cdi_dir, GPU, emptied).unlink()
    cdi.spec_path(cdi_dir, GPU, truncated).write_bytes(b"")

    restarted = _preparer(tmp_path, devices, configs=configs)  # new hardware: devices reset
    asserted: list[ClaimToPrepare] = []
    real_prepare = restarted.driver.prepare

    async def prepare(claim: ClaimToPrepare) -> object:
        asserted.append(claim)
        return await real_prepare(claim)

    restarted.driver.prepare = prepare  # type: ignore[method-assign]
    asyncio.run(restarted.repair())
    assert {uid: cdi.spec_path(cdi_dir, GPU, uid).read_bytes() for uid in devices} == written
    # The hardware is held again with the settings the claim was prepared with.
    again = {c.ref.uid: c for c in asserted}
    assert again[emptied].repair and list(again[emptied].configs) == [SHARED]
    assert cdi.resolve(cdi_dir, [cdi.device_id(GPU, f"{emptied}-gpu-0")])["GPU_TIMESLICE_INTERVAL"] == "Long"


def test_a_kubelets_prepare_again_brings_back_a_spec_lost_while_the_driver_ran(tmp_path: Path) -> None:
    uid = str(uuid.uuid4())
    preparer = _preparer(tmp_path, {uid: "gpu-0"}, configs={uid: [SHARED]})
    first = asyncio.run(preparer.prepare([_ref(uid)]))
    spec = cdi.spec_path(tmp_path / "cdi", GPU, uid)
    written = spec.read_bytes()
    spec.unlink()
    again = asyncio.run(preparer.prepare([_ref(uid)]))
    assert again == first
    assert spec.read_bytes() == written


def test_a_record_of_an_older_driver_without_a_spec_copy_is_kept_as_it_is(tmp_path: Path) -> None:
    """A rolling update from a driver that kept no copy of the spec: its claims still
    prepare from the record, and repair leaves their specs alone."""
    uid = str(uuid.uuid4())
    preparer = _preparer(tmp_path, {uid: "gpu-0"})
    asyncio.run(preparer.prepare([_ref(uid)]))
    document = json.loads(preparer.paths.checkpoint.read_text())
    del document["claims"][uid]["cdi_spec"]
    claims = document["claims"]
    document["checksum"] = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).hexdigest()
    preparer.paths.checkpoint.write_text(json.dumps(document))
    spec = cdi.spec_path(tmp_path / "cdi", GPU, uid)
    spec.write_text("{}")  # not what this driver would write, but not its to judge

    restarted = _preparer(tmp_path, {uid: "gpu-0"})
    asyncio.run(restarted.repair())
    assert not restarted.corruptions
    assert asyncio.run(restarted.prepare([_ref(uid)]))[uid].error == ""
    assert spec.read_text() == "{}"


def test_repair_removes_this_drivers_specs_of_claims_it_holds_no_record_of(tmp_path: Path) -> None:
    kept, orphan = str(uuid.uuid4()), str(uuid.uuid4())
    preparer = _preparer(tmp_path, {kept: "gpu-0", orphan: "gpu-1"})
    asyncio.run(preparer.prepare([_ref(kept)]))
    cdi_dir = tmp_path / "cdi"
    # As a machine crash can leave it: the spec reached the disk, its record did not.
    cdi.write_claim_spec(cdi_dir, GPU, orphan, cdi.ClaimSpec({}, [cdi.CdiDevice(f"{orphan}-gpu-1", {"X": "1"})]))
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


class Crash(BaseException):
    """The driver process dies here."""


def _crash_after_the_hardware(preparer: ClaimPreparer, monkeypatch: pytest.MonkeyPatch) -> None:
    real = preparer.driver.prepare

    async def prepare_then_die(claim: ClaimToPrepare) -> list[PreparedDevice]:
        await real(claim)
        raise Crash

    monkeypatch.setattr(preparer.driver, "prepare", prepare_then_die)


def test_a_prepare_a_crash_cut_short_is_undone_by_the_restarted_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done, cut = str(uuid.uuid4()), str(uuid.uuid4())
    devices = {done: "gpu-0", cut: "gpu-1"}
    hardware = NodeHardware("n", load_profile("tiny"))
    preparer = _preparer(tmp_path, devices, hardware=hardware)
    assert asyncio.run(preparer.prepare([_ref(done)]))[done].error == ""
    assert preparer.intents.uids() == [], "a prepare that ended leaves no intent"
    _crash_after_the_hardware(preparer, monkeypatch)
    with pytest.raises(Crash):
        asyncio.run(preparer.prepare([_ref(cut)]))
    assert hardware.claims() == {done: ["gpu-0"], cut: ["gpu-1"]}

    restarted = _preparer(tmp_path, devices, hardware=hardware)
    asyncio.run(restarted.repair())
    assert hardware.claims() == {done: ["gpu-0"]}, "the half-prepared device is free again"
    assert set(json.loads(restarted.paths.checkpoint.read_text())["claims"]) == {done}
    assert restarted.intents.uids() == []
    assert asyncio.run(restarted.prepare([_ref(cut)]))[cut].error == ""


def test_an_intent_left_by_an_error_outlives_the_next_prepare_until_one_settles_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver goes on after an unexpected error; the device it may hold stays named
    for a repair until a prepare of that claim completes."""
    cut, other = str(uuid.uuid4()), str(uuid.uuid4())
    preparer = _preparer(tmp_path, {cut: "gpu-0", other: "gpu-1"})
    real = preparer.driver.prepare
    _crash_after_the_hardware(preparer, monkeypatch)
    with pytest.raises(Crash):
        asyncio.run(preparer.prepare([_ref(cut)]))
    monkeypatch.setattr(preparer.driver, "prepare", real)
    assert asyncio.run(preparer.prepare([_ref(other)]))[other].error == ""
    assert preparer.intents.uids() == [cut]
    assert asyncio.run(preparer.prepare([_ref(cut)]))[cut].error == ""
    assert preparer.intents.uids() == []


def test_repair_undoes_a_prepare_started_record_an_older_driver_left(tmp_path: Path) -> None:
    """Drivers before the intents recorded a started prepare in the checkpoint; one of
    them may share the node during a rolling update, or have crashed before an upgrade."""
    started, done = str(uuid.uuid4()), str(uuid.uuid4())
    devices = {started: "gpu-0", done: "gpu-1"}
    hardware = NodeHardware("n", load_profile("tiny"))
    preparer = _preparer(tmp_path, devices, hardware=hardware)
    assert asyncio.run(preparer.prepare([_ref(done)]))[done].error == ""
    asyncio.run(preparer.driver.prepare(ClaimToPrepare(_ref(started), [AllocatedDevice("gpu", "n", "gpu-0")])))
    preparer.checkpoint.put(ClaimRecord(started, "ns", f"claim-{started}", ClaimState.PREPARE_STARTED))

    restarted = _preparer(tmp_path, devices, hardware=hardware)
    asyncio.run(restarted.repair())
    assert hardware.claims() == {done: ["gpu-1"]}
    assert set(json.loads(restarted.paths.checkpoint.read_text())["claims"]) == {done}


def test_two_instances_of_a_rolling_update_follow_each_others_checkpoint(tmp_path: Path) -> None:
    """Old and new instance share the node's checkpoint, each emulating the devices on its
    own: a claim the old one unprepared after the new one started must free its GPU in the
    new one too (it refused the next claim on that GPU as still in use, found by a
    `testbed rollout` under load), and a claim the old one prepared is held by the new one."""
    first, second, third = (str(uuid.uuid4()) for _ in range(3))
    devices = {first: "gpu-0", second: "gpu-0", third: "gpu-1"}
    old = _preparer(tmp_path, devices)
    assert asyncio.run(old.prepare([_ref(first)]))[first].error == ""
    new = _preparer(tmp_path, devices)  # started beside it: repair holds gpu-0 for the first claim
    asyncio.run(new.repair())
    asyncio.run(old.unprepare([_ref(first)]))  # a call that still reached the old instance
    asyncio.run(old.prepare([_ref(third)]))
    result = asyncio.run(new.prepare([_ref(second)]))[second]
    assert result.error == "", result.error
    held = new.driver.backend.hardware.claims()  # type: ignore[attr-defined]
    assert set(held) == {second, third}, "the old instance's claim on gpu-1 is held here too"
