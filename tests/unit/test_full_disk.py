"""A node's disk fills up: the driver fails the claim it cannot record, holding nothing
for it, and the kubelet fails the pod's start in its own words; neither loses a record,
and both carry on once there is room again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from fake_devices.hardware import NodeHardware
from testbed.drivers import KINDS, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.kubeapi import ClaimRef, Credentials, KubeClient, Obj
from testbed.kubelet.dra import StartFailed
from testbed.kubeletplugin.checkpoint import Checkpoint, ClaimRecord, ClaimState
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.prepare import ClaimPreparer, DriverPaths
from tests.conftest import SmallFilesystem
from tests.unit.test_kubelet_claims import Driver, pod_manager, restart, run

GPU = "gpu.dra-testbed.io"


def _claim(index: int) -> Obj:
    result = {"request": "gpu", "driver": GPU, "pool": "n", "device": f"gpu-{index}"}
    return {
        "metadata": {"namespace": "ns", "name": f"c{index}", "uid": f"uid-{index}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def _ref(index: int) -> ClaimRef:
    return ClaimRef("ns", f"uid-{index}", f"c{index}")


class Claims(ClaimReader):
    async def get(self, namespace: str, name: str) -> Obj:
        return _claim(int(name[1:]))


@contextlib.asynccontextmanager
async def _driver_with_one_claim(
    disk: Path, hardware: NodeHardware
) -> AsyncIterator[tuple[Callable[[], ClaimPreparer], ClaimPreparer]]:
    """Makes driver instances whose kubelet and CDI directories are on ``disk``, one per
    call; and the first of them, with claim 0 prepared."""
    client = KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context()))

    def preparer() -> ClaimPreparer:
        driver = KINDS[GPU].make(LocalBackend(hardware), client)
        return ClaimPreparer(driver, "n", DriverPaths.for_node(disk / "kubelet", GPU, disk / "cdi"), Claims(client))

    try:
        first = preparer()
        await first.repair()
        assert (await first.prepare([_ref(0)]))["uid-0"].error == ""
        yield preparer, first
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("room", "unwritten"),
    [(0, "prepare-intents"), (1, f"{GPU}-uid-1.json"), (2, "checkpoint.json")],
    ids=["no room for its intent", "no room for its CDI spec", "no room for its record"],
)
def test_the_driver_fails_the_claim_it_cannot_record_alone_and_holds_nothing_for_it(
    small_filesystem: SmallFilesystem, room: int, unwritten: str
) -> None:
    disk = small_filesystem.path
    hardware = NodeHardware("n", load_profile("gpu8"))

    async def scenario() -> None:
        async with _driver_with_one_claim(disk, hardware) as (preparer, first):
            small_filesystem.fill(leave_pages=room)
            failed = (await first.prepare([_ref(1)]))["uid-1"]
            assert failed.devices == []
            assert f"claim ns/c1: cannot write {disk}/" in failed.error and "No space left on device" in failed.error
            assert failed.error.split(": ")[2].endswith(f"/{unwritten}"), failed.error
            assert "free space on that file system" in failed.error
            assert hardware.claims() == {"uid-0": ["gpu-0"]}, "what it could not record is released"
            on_disk = Checkpoint(first.paths.checkpoint)
            on_disk.load()
            assert set(on_disk.claims) == set(first.checkpoint.claims) == {"uid-0"}
            assert (await first.prepare([_ref(0)]))["uid-0"].error == "", "a recorded claim still prepares"

            small_filesystem.free()
            assert (await first.prepare([_ref(1)]))["uid-1"].error == "", "asked again once there is room"
            restarted = preparer()
            await restarted.repair()
            assert set(restarted.checkpoint.claims) == {"uid-0", "uid-1"}
            assert sorted(p.name for p in (disk / "cdi").iterdir()) == [f"{GPU}-uid-0.json", f"{GPU}-uid-1.json"]

    asyncio.run(scenario())


def test_a_driver_starting_on_a_full_disk_undoes_a_half_prepared_claim_and_serves(
    small_filesystem: SmallFilesystem,
) -> None:
    """A record of a prepare that began (an older instance's) cannot be removed: the
    claim is undone all the same and the driver starts; the next start forgets it."""
    disk = small_filesystem.path
    hardware = NodeHardware("n", load_profile("gpu8"))

    async def scenario() -> None:
        async with _driver_with_one_claim(disk, hardware) as (preparer, first):
            first.checkpoint.put(ClaimRecord("uid-0", "ns", "c0", ClaimState.PREPARE_STARTED))  # cut short
            (disk / "cdi" / f"{GPU}-uid-0.json").unlink()  # before its spec was written
            small_filesystem.fill()
            restarted = preparer()
            await restarted.repair()
            assert hardware.claims() == {}, "undone"
            assert set(restarted.checkpoint.claims) == {"uid-0"}, "the record it could not remove is kept"
            small_filesystem.free()
            again = preparer()
            await again.repair()
            assert again.checkpoint.claims == {}
            assert (await again.prepare([_ref(0)]))["uid-0"].error == ""

    asyncio.run(scenario())


def test_a_checkpoint_that_cannot_be_written_keeps_what_the_file_says(small_filesystem: SmallFilesystem) -> None:
    """An unprepare whose record could not be removed is asked for again, never taken as done."""
    path = small_filesystem.path / "checkpoint.json"
    checkpoint = Checkpoint(path)
    record = ClaimRecord("uid-0", "ns", "c0", ClaimState.PREPARE_COMPLETED)
    checkpoint.put(record)
    small_filesystem.fill()
    with pytest.raises(OSError, match="No space left on device") as raised:
        checkpoint.remove("uid-0")
    assert raised.value.filename == str(path), "the error names the file"
    assert checkpoint.claims == {"uid-0": record}
    with pytest.raises(OSError):
        checkpoint.put(ClaimRecord("uid-1", "ns", "c1", ClaimState.PREPARE_COMPLETED))
    assert set(checkpoint.claims) == {"uid-0"}
    small_filesystem.free()
    checkpoint.remove("uid-0")
    fresh = Checkpoint(path)
    fresh.load()
    assert fresh.claims == {}


def test_the_kubelet_fails_a_start_it_cannot_checkpoint_in_its_words_and_writes_it_all_later(
    small_filesystem: SmallFilesystem,
) -> None:
    driver = Driver()
    manager = pod_manager(small_filesystem.path, driver)
    checkpoint = manager.dra.checkpoint
    run(manager.dra.prepare_claims("pod-a", [_claim(0)]))
    small_filesystem.fill()
    with pytest.raises(StartFailed) as refused:
        run(manager.dra.prepare_claims("pod-b", [_claim(1)]))
    assert str(refused.value) == (
        "Failed to prepare dynamic resources: prepare dynamic resources: checkpoint ResourceClaim cache: "
        f"write {checkpoint}: no space left on device"
    )
    assert driver.calls == [("prepare", ["c0"])], "nothing is prepared that the checkpoint does not track"
    assert not run(manager.dra.release("pod-a")), "an unprepare not checkpointed is not done"
    assert driver.calls[-1] == ("unprepare", ["c0"])

    small_filesystem.free()
    run(manager.dra.prepare_claims("pod-b", [_claim(1)]))
    assert driver.calls[-1] == ("prepare", ["c1"])
    assert run(manager.dra.release("pod-a")), "the next attempt writes what the failed one could not"
    assert {c.name: c.users for c in restart(manager, driver).dra.claims.values()} == {"c1": {"pod-b"}}


def test_a_run_whose_report_cannot_go_where_asked_keeps_it_in_the_default_place(
    small_filesystem: SmallFilesystem, tmp_path: Path
) -> None:
    """The output directory's disk filled during the run: the figures are not lost."""
    from testbed.report import report
    from testbed.runs import write_report
    from testbed.scenarios import spec
    from testbed.scenarios.runner import RunData

    data = RunData(spec.load("smoke"), "ns", 0.0, 0.0, ended=10.0)
    built = report.build(data, {"checkpoint_entries": 0, "cdi_specs": 0}, {})
    small_filesystem.fill()
    asked, default = small_filesystem.path / "run", tmp_path / "runs" / "p-smoke"
    directory, misplaced = write_report(built, data, asked, default, small_filesystem.path / "junit.xml")
    assert directory == default and (default / "report.json").exists() and (default / "junit.xml").exists()
    assert misplaced[0].startswith(f"the report could not be written to {asked} (")
    assert misplaced[0].endswith(f"it is in {default}")
    assert misplaced[1].endswith(f"it is in {default / 'junit.xml'}"), misplaced


def test_the_drivers_call_log_on_a_full_disk_fails_no_call(small_filesystem: SmallFilesystem) -> None:
    from testbed.kubeletplugin.grpc_services import CallLog

    path = small_filesystem.path / "calls.jsonl"
    calls = CallLog(path, GPU)
    small_filesystem.fill()
    calls.record("/v1.DRAPlugin/NodePrepareResources", [_ref(0)])  # no error: the prepare goes on
    small_filesystem.free()
    calls.record("/v1.DRAPlugin/NodePrepareResources", [_ref(1)])
    assert [json.loads(line)["claims"][0]["name"] for line in path.read_text().splitlines()] == ["c1"]
