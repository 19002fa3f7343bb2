"""The kubelet's device-health rules, as the fake kubelet applies them (kubelet v1.37)."""

from __future__ import annotations

from testbed.kubelet.health import (
    DEFAULT_TIMEOUT_S,
    DeviceHealthStatus,
    DeviceReport,
    HealthCache,
    timeout_from_wire,
    truncate_message,
)
from testbed.kubeletplugin.grpc_services import wire_request_names

H, U, UNKNOWN = DeviceHealthStatus.HEALTHY, DeviceHealthStatus.UNHEALTHY, DeviceHealthStatus.UNKNOWN


def _report(device: str, health: DeviceHealthStatus = H, timeout_s: float = 30.0, message: str = "") -> DeviceReport:
    return DeviceReport("pool", device, health, message, timeout_s)


def test_a_device_never_heard_of_is_unknown() -> None:
    assert HealthCache().get("d", "pool", "gpu-0", 0.0) == (UNKNOWN, "")


def test_a_heartbeat_within_the_timeout_keeps_a_device_healthy_forever() -> None:
    cache = HealthCache()
    assert cache.update("d", [_report("gpu-0")], now=0.0) == [("pool", "gpu-0")]
    for now in range(10, 600, 10):  # the same snapshot every 10 s changes nothing
        assert cache.update("d", [_report("gpu-0")], now=float(now)) == []
        assert cache.get("d", "pool", "gpu-0", now + 9.0)[0] is H


def test_a_device_not_reported_within_its_timeout_turns_unknown() -> None:
    """What happened to every healthy GPU when a driver sent snapshots only on change."""
    cache = HealthCache()
    cache.update("d", [_report("gpu-0", timeout_s=30.0)], now=0.0)
    assert cache.get("d", "pool", "gpu-0", 30.0)[0] is H
    assert cache.get("d", "pool", "gpu-0", 30.5)[0] is UNKNOWN


def test_a_device_left_out_stays_until_its_timeout_then_changes_to_unknown_once() -> None:
    cache = HealthCache()
    cache.update("d", [_report("gpu-0"), _report("gpu-1", U, message="ECC")], now=0.0)
    assert cache.update("d", [_report("gpu-0")], now=10.0) == []
    assert cache.get("d", "pool", "gpu-1", 20.0) == (U, "ECC")
    assert cache.update("d", [_report("gpu-0")], now=31.0) == [("pool", "gpu-1")]
    assert cache.update("d", [_report("gpu-0")], now=62.0) == []
    assert cache.get("d", "pool", "gpu-1", 62.0)[0] is UNKNOWN


def test_changes_of_health_message_or_timeout_are_reported() -> None:
    cache = HealthCache()
    cache.update("d", [_report("gpu-0")], now=0.0)
    assert cache.update("d", [_report("gpu-0", U)], now=1.0) == [("pool", "gpu-0")]
    assert cache.update("d", [_report("gpu-0", U, message="hot")], now=2.0) == [("pool", "gpu-0")]
    assert cache.update("d", [_report("gpu-0", U, 60.0, "hot")], now=3.0) == [("pool", "gpu-0")]


def test_a_stream_that_ends_makes_the_drivers_devices_unknown() -> None:
    cache = HealthCache()
    cache.update("d", [_report("gpu-0")], now=0.0)
    cache.update("other", [_report("nic-0")], now=0.0)
    cache.clear_driver("d")
    assert cache.get("d", "pool", "gpu-0", 1.0)[0] is UNKNOWN
    assert cache.get("other", "pool", "nic-0", 1.0)[0] is H


def test_wire_values_follow_the_kubelet() -> None:
    assert timeout_from_wire(0) == timeout_from_wire(-5) == DEFAULT_TIMEOUT_S
    assert timeout_from_wire(45) == 45.0
    assert truncate_message("x" * 1024) == "x" * 1024
    cut = truncate_message("x" * 2000)
    assert len(cut) == 1024 and cut.endswith("...")


def test_request_names_on_the_wire_are_base_requests() -> None:
    """kubelet v1.37 matches resources.claims[].request exactly against these."""
    assert wire_request_names(["gpu/big"]) == ["gpu"]
    assert wire_request_names(["gpu/big", "gpu/small", "nic"]) == ["gpu", "nic"]
    assert wire_request_names(["gpu"]) == ["gpu"]
