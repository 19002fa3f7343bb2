"""The emulated hardware on its own: profiles, conflicts, idempotency, faults, determinism."""

import asyncio
import math
from pathlib import Path

import pytest

from fake_devices.hardware import HardwareError, Health, NodeHardware, Share
from fake_devices.profiles import ProfileError
from testbed.drivers import PROFILES, load_profile


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_shipped_profiles_and_their_shapes() -> None:
    assert {"gpu8", "h100x8", "tiny"} <= set(PROFILES.shipped())
    h100 = NodeHardware("n", load_profile("h100x8"))
    kinds = [d.kind for d in h100.devices()]
    assert kinds.count("gpu") == 8 and kinds.count("nic") == 8 and kinds.count("partition") == 8 * 12
    assert {d.attributes["numaNode"] for d in h100.devices() if d.kind == "gpu"} == {0, 1}


def test_profile_errors_name_the_field() -> None:
    bad = (
        "name: x\ngpus: {count: 1, productName: p, architecture: a, driverVersion: 1.0.0, memoryGiB: 8,\n"
        "  multiprocessors: 4, memorySlices: 2, partitions: [{name: 1g.4gb, memorySlices: 1, multiprocessors: 2,\n"
        "  memoryGiB: 4, placements: [0, 2]}]}\n"
    )
    with pytest.raises(ProfileError, match=r"gpus: .*placement 2 needs slices 2\.\.2, but the GPU has 2"):
        PROFILES.parse(bad, "bad.yaml")
    with pytest.raises(ProfileError, match=r"nics\.linkSpeedGbps: Field required"):
        PROFILES.parse("name: x\nnics: {count: 1, model: m}\n", "nic.yaml")
    with pytest.raises(ProfileError, match="shipped profiles: fabric-gpu, fpga4, gpu8, h100x8, shared-nic, tiny"):
        load_profile("h200x9")


def test_partitions_conflict_with_their_gpu_and_each_other_only_when_overlapping() -> None:
    hw = NodeHardware("n", load_profile("tiny"))
    run(hw.prepare("a", ["gpu-0-1g5gb-0"]))
    run(hw.prepare("b", ["gpu-0-1g5gb-1"]))
    with pytest.raises(HardwareError, match="overlaps devices of gpu-0 already in use by claim\\(s\\) a, b"):
        run(hw.prepare("c", ["gpu-0"]))
    with pytest.raises(HardwareError, match="overlaps"):
        run(hw.prepare("c", ["gpu-0-2g10gb-0"]))
    run(hw.prepare("c", ["gpu-0-2g10gb-2"]))  # slices 2-3 are free
    run(hw.prepare("d", ["gpu-1"]))  # another GPU
    run(hw.prepare("e", ["nic-0"]))
    with pytest.raises(HardwareError, match="nic-0 is in use by claim e"):
        run(hw.prepare("f", ["nic-0"]))
    run(hw.prepare("g", ["gpu-1"], admin_access=True))  # admin access may share
    assert set(hw.claims()) == {"a", "b", "c", "d", "e", "g"}


def test_prepare_is_idempotent_and_unprepare_of_unknown_is_fine() -> None:
    hw = NodeHardware("n", load_profile("gpu8"))
    first = run(hw.prepare("a", ["gpu-3"], {"gpu-3": {"MODE": "x"}}))
    assert run(hw.prepare("a", ["gpu-3"], {"gpu-3": {"MODE": "x"}})) == first
    assert first[0].env["MODE"] == "x" and first[0].env["GPU_3_UUID"].startswith("GPU-")
    assert run(hw.unprepare("a")) and not run(hw.unprepare("a")) and not run(hw.unprepare("never"))


def test_a_claim_prepared_in_parts_by_two_drivers_holds_both_until_each_releases_its_own() -> None:
    hw = NodeHardware("n", load_profile("tiny"))
    run(hw.prepare("pair", ["gpu-0"]))  # the GPU driver's part
    run(hw.prepare("pair", ["nic-0"]))  # the NIC driver's part
    assert hw.claims() == {"pair": ["gpu-0", "nic-0"]}
    assert run(hw.prepare("pair", ["gpu-0"]))[0].name == "gpu-0", "idempotent for each part"
    with pytest.raises(HardwareError, match=r"gpu-0 already in use by claim\(s\) pair"):
        run(hw.prepare("other", ["gpu-0"]))
    hw.set_busy("gpu-0", "held by pid 4242")
    assert run(hw.unprepare("pair", kinds=["nic"])), "the NIC's part goes; the busy GPU is not its business"
    assert hw.claims() == {"pair": ["gpu-0"]}
    with pytest.raises(HardwareError, match="gpu-0 is busy"):
        run(hw.unprepare("pair", kinds=["gpu", "partition"]))
    hw.set_busy("gpu-0", None)
    assert run(hw.unprepare("pair", kinds=["gpu", "partition"])) and hw.claims() == {}


def test_a_busy_device_keeps_its_claim_until_freed() -> None:
    hw = NodeHardware("n", load_profile("tiny"))
    run(hw.prepare("a", ["gpu-0"]))
    run(hw.prepare("b", ["gpu-1"]))
    hw.set_busy("gpu-0", "held by pid 4242")
    with pytest.raises(HardwareError, match="gpu-0 is busy: held by pid 4242"):
        run(hw.unprepare("a"))
    assert run(hw.unprepare("b")), "other claims are released"
    with pytest.raises(HardwareError, match="in use by claim"):
        run(hw.prepare("c", ["gpu-0"]))
    hw.set_busy("gpu-0", None)
    assert run(hw.unprepare("a")) and hw.claims() == {}
    with pytest.raises(HardwareError, match="no device"):
        hw.set_busy("gpu-9", "x")


def test_faults() -> None:
    hw = NodeHardware("n", load_profile("tiny"))
    hw.inject(fail_next_prepares=2, message="ECC storm")
    for _ in range(2):
        with pytest.raises(HardwareError, match="ECC storm"):
            run(hw.prepare("a", ["gpu-0"]))
    run(hw.prepare("a", ["gpu-0"]))
    generation = hw.generation
    hw.set_health("gpu-1", Health.UNHEALTHY, "too hot")
    assert hw.generation > generation
    assert {h.device for h in hw.health() if h.health is Health.UNHEALTHY} == {
        "gpu-1",
        *(d.name for d in hw.devices() if d.parent == "gpu-1"),
    }
    with pytest.raises(HardwareError, match="unhealthy: too hot"):
        run(hw.prepare("b", ["gpu-1"]))
    assert not any(h.fatal for h in hw.health())
    hw.set_health("gpu-1", Health.UNHEALTHY, "fell off the bus", fatal=True)
    assert {h.device for h in hw.health() if h.fatal} == {h.device for h in hw.health() if h.health is Health.UNHEALTHY}
    hw.lose_device("gpu-1")
    assert not [d for d in hw.devices() if d.name.startswith("gpu-1")]
    with pytest.raises(HardwareError, match="no device 'gpu-1'"):
        run(hw.prepare("b", ["gpu-1"]))


def test_everything_derives_from_the_seed() -> None:
    def snapshot(seed: int) -> tuple[list[str], list[bool]]:
        hw = NodeHardware("n", load_profile("tiny"), seed=seed)
        hw.inject(failure_rate=0.5)
        outcomes = []
        for i in range(20):
            try:
                run(hw.prepare(f"c{i}", ["nic-0"]))
                run(hw.unprepare(f"c{i}"))
                outcomes.append(True)
            except HardwareError:
                outcomes.append(False)
        ids = [str(d.attributes.get("uuid", d.attributes.get("macAddress"))) for d in hw.devices()]
        return ids, outcomes

    assert snapshot(1) == snapshot(1)
    assert snapshot(1)[0] != snapshot(2)[0] and snapshot(1)[1] != snapshot(2)[1]


def test_the_hardware_dir_shows_devices_health_and_losses_as_files(tmp_path: Path) -> None:
    import json

    from fake_devices import sysfs

    hardware = NodeHardware("n1", load_profile("tiny"), seed=0)
    sysfs.write(hardware, tmp_path)
    inventory = json.loads((tmp_path / "inventory.json").read_text())
    names = {d["name"] for d in inventory["devices"]}
    assert {"gpu-0", "gpu-1", "nic-0"} <= names and any(d["kind"] == "partition" for d in inventory["devices"])
    gpu = next(d for d in inventory["devices"] if d["name"] == "gpu-0")
    address = gpu["attributes"]["pciBusID"]
    assert (tmp_path / "bus/pci/devices" / address / "vendor").read_text() == "0x10de\n"
    nic = next(d for d in inventory["devices"] if d["name"] == "nic-0")
    net = tmp_path / "class/net" / nic["attributes"]["ifName"]
    assert (net / "address").read_text().strip() == nic["attributes"]["macAddress"]
    assert (net / "operstate").read_text() == "up\n"

    hardware.set_health("nic-0", Health.UNHEALTHY, "link flapping")
    hardware.lose_device("gpu-1")
    sysfs.write(hardware, tmp_path)
    again = json.loads((tmp_path / "inventory.json").read_text())
    assert again["generation"] > inventory["generation"]
    assert {d["name"]: (d["health"], d["healthMessage"]) for d in again["devices"]}["nic-0"] == (
        "UNHEALTHY",
        "link flapping",
    )
    assert not any(d["name"].startswith("gpu-1") for d in again["devices"]), "a lost GPU takes its partitions"
    lost = next(d for d in inventory["devices"] if d["name"] == "gpu-1")["attributes"]["pciBusID"]
    assert not (tmp_path / "bus/pci/devices" / lost).exists()
    assert (net / "operstate").read_text() == "down\n"
    assert not list(tmp_path.rglob(".tmp-*")), "every file replaced atomically, no temporaries left"


G = 10**9


def test_a_shared_port_takes_shares_up_to_its_capacity_each_in_a_slot_of_its_own() -> None:
    hw = NodeHardware("n", load_profile("shared-nic"))
    nic = hw.device("nic-0")
    assert nic.shareable and nic.capacity == {"virtualFunctions": 4, "bandwidth": 100 * G}
    assert nic.share_policies["bandwidth"].default == 25 * G  # the link over its virtual functions
    first = run(hw.prepare("a", [], shares=[Share("nic-0", "s1", {"virtualFunctions": 1, "bandwidth": 40 * G})]))
    assert first[0].share_id == "s1"
    assert first[0].env == {"NIC_0_IFNAME": "eth1", "NIC_0_SHARE": "0", "NIC_0_VIRTUAL_FUNCTIONS": "1",
                            "NIC_0_BANDWIDTH": str(40 * G)}  # fmt: skip
    second = run(hw.prepare("b", [], shares=[Share("nic-0", "s2", {"virtualFunctions": 1, "bandwidth": 60 * G})]))
    assert second[0].env["NIC_0_SHARE"] == "1"
    with pytest.raises(HardwareError, match=r"nic-0 has 100000000000 bandwidth; its shares would consume 101000000000"):
        run(hw.prepare("c", [], shares=[Share("nic-0", "s3", {"virtualFunctions": 1, "bandwidth": G})]))
    with pytest.raises(HardwareError, match=r"nic-0 is shared by claim\(s\) a, b"):
        run(hw.prepare("c", ["nic-0"]))  # the whole port
    assert hw.claims() == {"a": ["nic-0"], "b": ["nic-0"]}
    run(hw.unprepare("a"))
    third = run(hw.prepare("c", [], shares=[Share("nic-0", "s3", {"virtualFunctions": 1, "bandwidth": G})]))
    assert third[0].env["NIC_0_SHARE"] == "0"  # the slot a left
    assert run(hw.prepare("c", [], shares=[Share("nic-0", "s3", {"virtualFunctions": 1, "bandwidth": G})])) == third


def test_a_claim_may_hold_two_shares_of_one_port_and_a_whole_port_refuses_shares() -> None:
    hw = NodeHardware("n", load_profile("shared-nic"))
    two = [Share("nic-1", "x", {"bandwidth": 30 * G}), Share("nic-1", "y", {"bandwidth": 30 * G})]
    prepared = run(hw.prepare("a", [], shares=two))
    assert [(p.share_id, p.env["NIC_1_SHARE"]) for p in prepared] == [("x", "0"), ("y", "1")]
    with pytest.raises(HardwareError, match="nic-1 has 100000000000 bandwidth; its shares would consume 110"):
        run(hw.prepare("b", [], shares=[Share("nic-1", "z", {"bandwidth": 50 * G})]))
    plain = NodeHardware("n", load_profile("tiny"))
    with pytest.raises(HardwareError, match="nic-0 cannot be shared: it allows one allocation"):
        run(plain.prepare("a", [], shares=[Share("nic-0", "x", {})]))
    run(plain.prepare("b", ["nic-1"]))
    with pytest.raises(HardwareError, match="nic-1 is in use by claim b"):
        run(plain.prepare("a", [], shares=[Share("nic-1", "x", {})]))


def test_a_claims_shares_go_with_its_driver_part_and_a_busy_share_stays() -> None:
    hw = NodeHardware("n", load_profile("shared-nic"))
    run(hw.prepare("a", ["gpu-0"], shares=[Share("nic-0", "x", {"bandwidth": 25 * G})]))
    hw.set_busy("nic-0", "a process has eth1 open")
    with pytest.raises(HardwareError, match="nic-0 is busy"):
        run(hw.unprepare("a", ["nic"]))
    hw.set_busy("nic-0", None)
    assert run(hw.unprepare("a", ["nic"]))
    assert hw.claims() == {"a": ["gpu-0"]}
    assert not run(hw.unprepare("a", ["nic"]))


def test_a_shared_nic_profile_needs_virtual_functions() -> None:
    with pytest.raises(ProfileError, match="shared: true needs virtualFunctions >= 1"):
        PROFILES.parse("name: x\nnics: {count: 1, model: m, linkSpeedGbps: 10, shared: true}\n", "nic.yaml")


def test_the_faults_in_force_are_said_in_words_and_none_once_undone() -> None:
    hw = NodeHardware("n", load_profile("tiny"))
    assert hw.faults_in_force() == []
    hw.set_health("gpu-0", Health.UNHEALTHY, "XID 79", fatal=True)
    hw.set_health("gpu-1", Health.UNHEALTHY)
    hw.inject(fail_next_prepares=2, latency_s=0.25, message="ECC error")
    hw.set_busy("nic-0", "held by pid 42")
    assert hw.faults_in_force() == [
        "gpu-0 unhealthy (fatal): XID 79",
        "gpu-1 unhealthy",
        "nic-0 busy: held by pid 42",
        "next 2 prepares fail: ECC error",
        "prepares 250 ms slower",
    ]
    hw.lose_device("gpu-1")
    assert "gpu-1 lost" in hw.faults_in_force() and "gpu-1 unhealthy" not in hw.faults_in_force()
    hw.set_health("gpu-0", Health.HEALTHY)
    hw.set_busy("nic-0", None)
    hw.inject(fail_next_prepares=0, latency_s=0)
    assert hw.faults_in_force() == ["gpu-1 lost"], "a partition is not named beside its lost GPU"
    hw.set_health("gpu-0", Health.UNHEALTHY, "XID 79", fatal=True)
    hw.set_busy("nic-0", "held by pid 42")
    hw.inject(fail_next_prepares=2, latency_s=0.25, failure_rate=0.5)
    generation = hw.generation
    hw.clear_faults()
    assert hw.faults_in_force() == ["gpu-1 lost"], "cleared: a lost device is not on the node to mend"
    assert hw.generation > generation, "the drivers publish the change"


def test_a_claim_held_before_a_crash_is_held_again_whatever_faults_are_in_force() -> None:
    """A restarted driver re-asserts its claims: nothing is set up, so a prepare fault does
    not fail it (nor is one used up: the next real prepare still fails) and a sick device
    still holds its work; a lost device cannot, and a device another claim holds is refused."""
    hw = NodeHardware("n", load_profile("tiny"))
    hw.set_health("gpu-0", Health.UNHEALTHY, "too hot")
    hw.inject(fail_next_prepares=1, latency_s=30, failure_rate=1.0, message="ECC storm")
    assert [d.name for d in run(hw.prepare("a", ["gpu-0"], reassert=True))] == ["gpu-0"]
    assert hw.claims() == {"a": ["gpu-0"]} and hw.faults.fail_next_prepares == 1
    with pytest.raises(HardwareError, match="in use by claim"):
        run(hw.prepare("b", ["gpu-0"], reassert=True))
    hw.lose_device("gpu-1")
    with pytest.raises(HardwareError, match="no device 'gpu-1'"):
        run(hw.prepare("c", ["gpu-1"], reassert=True))
    hw.inject(latency_s=0)
    with pytest.raises(HardwareError, match="ECC storm"):
        run(hw.prepare("d", ["nic-0"]))


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"latency_s": math.nan}, "latency_s must be a finite number of seconds, 0 or more, not nan"),
        ({"latency_s": math.inf}, "latency_s must be a finite number of seconds, 0 or more, not inf"),
        ({"latency_s": -1.0}, "latency_s must be a finite"),
        ({"failure_rate": 1.5}, "failure_rate must be from 0 to 1, not 1.5"),
        ({"fail_next_prepares": -2}, "fail_next_prepares must be 0 or more, not -2"),
    ],
)
def test_a_fault_no_hardware_could_have_is_refused_and_changes_nothing(fault: dict[str, float], message: str) -> None:
    """A NaN delay would reach the event loop's timer heap, shared by every node of a host."""
    hw = NodeHardware("n", load_profile("tiny"))
    hw.inject(fail_next_prepares=1, latency_s=0.25, message="ECC error")
    with pytest.raises(ValueError, match=message):
        hw.inject(message="half applied", **fault)
    assert hw.faults_in_force() == ["next 1 prepares fail: ECC error", "prepares 250 ms slower"]


def test_a_kept_fault_record_with_a_delay_no_hardware_has_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kept = tmp_path / "hardware-faults.json"
    kept.write_text('{"prepares": {"latencySeconds": NaN}}')
    assert NodeHardware("n", load_profile("tiny"), kept_in=kept).faults_in_force() == []
    assert "not taken (ValueError('latency_s must be a finite" in caplog.text


def test_the_faults_in_force_outlive_the_process_that_emulates_the_hardware(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With a file to keep them in, hardware built again (a NodeHost restarted after a
    crash) has the faults it had, a countdown where it stood; a record it cannot read
    is said and set aside rather than stopping the node."""
    kept = tmp_path / "node" / "hardware-faults.json"
    hw = NodeHardware("n", load_profile("tiny"), kept_in=kept)
    hw.set_health("gpu-0", Health.UNHEALTHY, "XID 79", fatal=True)
    hw.lose_device("gpu-1")
    hw.set_busy("nic-0", "held by pid 42")
    hw.inject(fail_next_prepares=2, latency_s=0.01, message="ECC error")
    with pytest.raises(HardwareError, match="ECC error"):
        run(hw.prepare("a", ["nic-1"]))
    again = NodeHardware("n", load_profile("tiny"), kept_in=kept)
    assert (
        again.faults_in_force()
        == hw.faults_in_force()
        == [
            "gpu-0 unhealthy (fatal): XID 79",
            "nic-0 busy: held by pid 42",
            "gpu-1 lost",
            "next 1 prepares fail: ECC error",
            "prepares 10 ms slower",
        ]
    )
    assert again.health() == hw.health() and again.devices() == hw.devices()
    hw.set_health("gpu-0", Health.HEALTHY)
    assert "gpu-0" not in NodeHardware("n", load_profile("tiny"), kept_in=kept).fault_record()["unhealthy"]
    assert NodeHardware("other", load_profile("tiny"), kept_in=tmp_path / "none.json").faults_in_force() == []

    kept.write_text('{"unhealthy": {"gpu-7": {"message": "", "fatal": false, "since": 0}}}')
    assert NodeHardware("n", load_profile("tiny"), kept_in=kept).faults_in_force() == []
    assert f"faults kept in {kept} not taken (ValueError(\"no device ['gpu-7'] on this node\"))" in caplog.text
