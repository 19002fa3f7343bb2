"""ResourceSlice content from the inventory, within the API's limits."""

from fake_devices.hardware import DeviceHealth, Health, build_inventory
from testbed.drivers import KINDS, load_profile
from testbed.keys import FABRIC_ATTACH_FAILED, FABRIC_ATTACHED, UNHEALTHY_TAINT_KEY
from testbed.kubeletplugin.slices import desired_slices

GPU, NIC = "gpu.dra-testbed.io", "nic.dra-testbed.io"


def _slices(profile: str, driver: str, health: list[DeviceHealth] | None = None):  # type: ignore[no-untyped-def]
    devices, pools = KINDS[driver].select(*build_inventory(load_profile(profile), "n1", seed=0))
    return desired_slices(driver, "n1", devices, pools, health or [])


def test_partitionable_gpus_split_counters_and_devices_within_limits() -> None:
    specs = _slices("h100x8", GPU)
    counters = [s for s in specs if s.shared_counters]
    device_slices = [s for s in specs if s.devices]
    assert len(counters) == 1 and len(counters[0].shared_counters) == 8  # one set per GPU, max 8
    assert all(not s.devices for s in counters), "shared counters live in a slice of their own"
    assert all(len(s.devices) <= 64 for s in device_slices)  # 64 when consumesCounters is used
    names = [d["name"] for s in device_slices for d in s.devices]
    assert len(names) == len(set(names)) == 8 * (1 + 7 + 3 + 2)  # whole GPU + its placements
    assert all(len(n) <= 32 for n in names)
    for device in (d for s in device_slices for d in s.devices):
        assert len(device["attributes"]) + len(device["capacity"]) <= 32
        assert len(device["consumesCounters"]) <= 2
        for attr in device["attributes"].values():
            assert len(str(attr.get("string", ""))) <= 64


def test_standard_pcie_attributes_pair_gpu_and_nic() -> None:
    gpu = {d["name"]: d for s in _slices("h100x8", GPU) for d in s.devices}
    nic = {d["name"]: d for s in _slices("h100x8", NIC) for d in s.devices}
    root = "resource.kubernetes.io/pcieRoot"
    assert gpu["gpu-3"]["attributes"][root] == nic["nic-3"]["attributes"][root]
    assert gpu["gpu-3"]["attributes"][root] != nic["nic-4"]["attributes"][root]
    assert gpu["gpu-3"]["attributes"]["resource.kubernetes.io/pciBusID"]["string"].startswith("0000:")
    assert gpu["gpu-0"]["attributes"]["driverVersion"] == {"version": "550.54.15"}


def test_plain_gpus_fit_one_slice_and_a_driver_sees_only_its_devices() -> None:
    [spec] = _slices("gpu8", GPU)
    assert len(spec.devices) == 8 and not spec.shared_counters
    assert all("consumesCounters" not in d for d in spec.devices)
    [nics] = _slices("gpu8", NIC)
    assert nics.devices == ()  # an empty pool is still published


def test_an_unhealthy_device_carries_a_noschedule_taint_and_a_fatally_sick_one_noexecute() -> None:
    sick = [
        DeviceHealth("gpu-2", Health.UNHEALTHY, "ECC errors", 0),
        DeviceHealth("gpu-3", Health.UNHEALTHY, "", 0, True),
    ]
    devices = {d["name"]: d for s in _slices("gpu8", GPU, sick) for d in s.devices}
    assert devices["gpu-2"]["taints"] == [{"key": UNHEALTHY_TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    assert devices["gpu-3"]["taints"] == [{"key": UNHEALTHY_TAINT_KEY, "value": "true", "effect": "NoExecute"}]
    assert "taints" not in devices["gpu-1"]


def test_devices_per_slice_spreads_the_same_devices_over_more_slices() -> None:
    devices, pools = KINDS[GPU].select(*build_inventory(load_profile("h100x8"), "n1", seed=0))
    default = desired_slices(GPU, "n1", devices, pools, [])
    small = desired_slices(GPU, "n1", devices, pools, [], devices_per_slice=10)
    names = sorted(d["name"] for s in default for d in s.devices)
    assert sorted(d["name"] for s in small for d in s.devices) == names, "the same devices, only laid out anew"
    assert all(len(s.devices) <= 10 for s in small)
    assert len([s for s in small if s.devices]) == -(-len(names) // 10)
    assert len({s.name for s in small}) == len(small)
    # Above the API's limit the limit wins: 64 for devices that consume counters.
    assert all(len(s.devices) <= 64 for s in desired_slices(GPU, "n1", devices, pools, [], devices_per_slice=128))


def test_the_standalone_driver_takes_its_slice_size_from_the_environment() -> None:
    import pytest

    from testbed.drivers.main import Settings
    from testbed.errors import TestbedError

    assert Settings.from_env({"NODE_NAME": "n1"}).devices_per_slice is None
    assert Settings.from_env({"NODE_NAME": "n1", "DEVICES_PER_SLICE": "16"}).devices_per_slice == 16
    with pytest.raises(TestbedError, match="DEVICES_PER_SLICE=500 is out of range"):
        Settings.from_env({"NODE_NAME": "n1", "DEVICES_PER_SLICE": "500"})


def test_a_shared_port_is_published_for_several_allocations_with_how_a_share_consumes_it() -> None:
    [spec] = _slices("shared-nic", NIC)
    nic = {d["name"]: d for d in spec.devices}["nic-1"]
    assert nic["allowMultipleAllocations"] is True
    assert nic["capacity"] == {
        "virtualFunctions": {"value": "4", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}}},
        "bandwidth": {
            "value": "100G",  # the API server's canonical form, so a read-back compares equal
            "requestPolicy": {"default": "25G", "validRange": {"min": "1G", "step": "1G"}},
        },
    }
    [plain] = _slices("tiny", NIC)
    assert all("allowMultipleAllocations" not in d for d in plain.devices)
    assert plain.devices[0]["capacity"] == {"virtualFunctions": {"value": "4"}}


def test_gpus_behind_a_fabric_carry_the_conditions_the_scheduler_waits_for() -> None:
    [spec] = _slices("fabric-gpu", GPU)
    assert [d["name"] for d in spec.devices] == ["gpu-0", "gpu-1"]
    for device in spec.devices:
        assert device["bindingConditions"] == [FABRIC_ATTACHED]
        assert device["bindingFailureConditions"] == [FABRIC_ATTACH_FAILED]
    assert all("bindingConditions" not in d for s in _slices("tiny", GPU) for d in s.devices)
