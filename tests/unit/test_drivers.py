"""The built-in drivers as the registry assembles them: each kind's profile section,
devices, classes and opaque config; the FPGA kind is the proof that a kind is one folder."""

from __future__ import annotations

import asyncio

import pytest

from fake_devices import sysfs
from fake_devices.hardware import NodeHardware
from fake_devices.profiles import ProfileError
from testbed.drivers import KINDS, PROFILES, class_kinds, device_classes, drivers_for, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.kubeapi import ClaimRef
from testbed.kubeletplugin.driver import AllocatedDevice, ClaimFailed, ClaimToPrepare
from testbed.kubeletplugin.slices import desired_slices

FPGA = "fpga.dra-testbed.io"


def _claim(device: str, parameters: dict[str, object] | None = None) -> ClaimToPrepare:
    configs = [{"opaque": {"driver": FPGA, "parameters": parameters}}] if parameters is not None else []
    return ClaimToPrepare(ClaimRef("ns", "uid-1", "c"), [AllocatedDevice("fpga", "n", device)], configs)


def test_a_node_runs_the_drivers_its_hardware_has_devices_for() -> None:
    assert drivers_for(load_profile("tiny")) == ["gpu.dra-testbed.io", "nic.dra-testbed.io"]
    assert drivers_for(load_profile("fpga4")) == ["nic.dra-testbed.io", FPGA]
    assert drivers_for(load_profile("gpu8")) == ["gpu.dra-testbed.io"]


def test_every_class_selects_devices_its_driver_publishes() -> None:
    for name, (driver, device_kind) in class_kinds().items():
        assert device_kind in KINDS[driver].published, name
    assert {c["metadata"]["name"] for c in device_classes()} == set(class_kinds())


def test_fpga_cards_are_pci_devices_on_their_own_bus_next_to_the_nics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hardware = NodeHardware("n", load_profile("fpga4"))
    fpgas = [d for d in hardware.devices() if d.kind == "fpga"]
    nics = [d for d in hardware.devices() if d.kind == "nic"]
    assert len(fpgas) == 4 and len(nics) == 2
    assert fpgas[0].attributes["pcieRoot"] == nics[0].attributes["pcieRoot"]
    buses = [d.attributes["pciBusID"] for d in fpgas + nics]
    assert len(set(buses)) == len(buses)
    sysfs.write(hardware, tmp_path)
    assert (tmp_path / f"bus/pci/devices/{fpgas[0].attributes['pciBusID']}/class").read_text() == "0x120000\n"
    mine, pools = KINDS[FPGA].select(hardware.devices(), hardware.pools())
    [published] = desired_slices(FPGA, "n", mine, pools, [])
    assert [d["name"] for d in published.devices] == ["fpga-0", "fpga-1", "fpga-2", "fpga-3"]


def test_fpga_config_reaches_the_container_and_a_bad_one_fails_the_claim() -> None:
    driver = KINDS[FPGA].make(LocalBackend(NodeHardware("n", load_profile("fpga4"))))
    [prepared] = asyncio.run(
        driver.prepare(
            _claim(
                "fpga-1",
                {"apiVersion": f"{FPGA}/v1alpha1", "kind": "FpgaConfig", "bitstream": "transcode", "clockMHz": 250},
            )
        )
    )
    assert prepared.env["FPGA_BITSTREAM"] == "transcode" and prepared.env["FPGA_CLOCK_MHZ"] == "250"
    assert prepared.env["FPGA_1_UUID"].startswith("FPGA-")
    bad = {"apiVersion": f"{FPGA}/v1alpha1", "kind": "FpgaConfig", "bitstream": "Bad Name!"}
    with pytest.raises(ClaimFailed, match=r"invalid FpgaConfig .*bitstream") as failed:
        asyncio.run(driver.prepare(_claim("fpga-2", bad)))
    assert failed.value.reason == "InvalidConfig"


def test_a_profile_section_nobody_knows_names_the_sections_that_exist() -> None:
    with pytest.raises(ProfileError, match=r"tpus: not a field of a profile; device sections: gpus, nics, fpgas"):
        PROFILES.parse("name: x\ntpus: {count: 1}\n", "x.yaml")
    with pytest.raises(ProfileError, match=r"fpgas\.logicCells: Field required"):
        PROFILES.parse("name: x\nfpgas: {count: 1, model: m, memoryGiB: 1}\n", "x.yaml")
