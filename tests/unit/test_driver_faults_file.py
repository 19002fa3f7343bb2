"""The standalone driver's faults file (FAULTS_FILE): what a developer writes there reaches
the emulated hardware while the driver runs, and a bad file changes nothing."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fake_devices.hardware import HardwareError, Health, NodeHardware
from testbed.drivers import load_profile
from testbed.drivers.main import follow_faults


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


def _write(path: Path, document: object) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document))
    temporary.replace(path)


def test_a_latency_reaches_the_hardware_while_the_driver_runs_and_a_bad_one_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hardware = NodeHardware("n", load_profile("tiny"))
    faults = tmp_path / "faults.json"

    async def scenario() -> None:
        following = asyncio.create_task(follow_faults(faults, hardware))
        try:
            _write(faults, {"busy": {"gpu-0": "held by pid 4242"}, "latencyMs": 250})
            await _until(lambda: hardware.faults.latency_s == 0.25, "the latency applied")
            _write(faults, {"latencyMs": -1})
            await _until(lambda: "latencyMs must be a number" in caplog.text, "the bad file named")
            assert hardware.faults.latency_s == 0.25, "a bad file changes nothing"
            _write(faults, {"latencyMs": math.inf})  # JSON as Python writes it: Infinity
            await _until(lambda: "latencyMs must be a number >= 0, not inf" in caplog.text, "an endless delay named")
            assert hardware.faults.latency_s == 0.25
            _write(faults, {})
            await _until(lambda: hardware.faults.latency_s == 0, "the latency taken off")
        finally:
            following.cancel()

    asyncio.run(scenario())


def test_lost_devices_and_failing_prepares_follow_the_file_and_a_bad_one_applies_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hardware = NodeHardware("n", load_profile("tiny"))
    faults = tmp_path / "faults.json"

    async def scenario() -> None:
        following = asyncio.create_task(follow_faults(faults, hardware))
        try:
            _write(faults, {"lost": ["gpu-1"], "failNextPrepares": 2, "failMessage": "ECC error"})
            await _until(lambda: hardware.faults.fail_next_prepares == 2, "the prepares to fail counted")
            assert "gpu-1" not in {d.name for d in hardware.devices()}, "the lost device left the inventory"
            assert hardware.faults.fail_message == "ECC error"
            with pytest.raises(HardwareError, match="ECC error"):
                await hardware.prepare("claim-a", ["gpu-0"])
            _write(faults, {"lost": ["gpu-1"], "unhealthy": {"gpu-0": "XID 79", "gpu-7": "?"}})
            await _until(lambda: "no device ['gpu-7']" in caplog.text, "the unknown device named")
            assert all(h.health is Health.HEALTHY for h in hardware.health()), "a bad file applies nothing"
            assert hardware.faults.fail_next_prepares == 1, "a file without the count leaves it be"
            _write(faults, {"unhealthy": {"gpu-0": "XID 79"}, "failureRate": 1})
            await _until(lambda: hardware.faults.failure_rate == 1, "the failure rate applied")
            assert {h.device for h in hardware.health() if h.health is Health.UNHEALTHY} >= {"gpu-0"}
            assert "stay lost until the driver restarts" in caplog.text
            assert "gpu-1" not in {d.name for d in hardware.devices()}
        finally:
            following.cancel()

    asyncio.run(scenario())


def test_a_device_listed_fatal_turns_fatally_sick_and_back_and_fatal_names_only_unhealthy_devices(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hardware = NodeHardware("n", load_profile("tiny"))
    faults = tmp_path / "faults.json"

    def fatal() -> set[str]:
        return {h.device for h in hardware.health() if h.fatal and h.device == "gpu-0"}

    async def scenario() -> None:
        following = asyncio.create_task(follow_faults(faults, hardware))
        try:
            _write(faults, {"unhealthy": {"gpu-0": "XID 79"}})
            await _until(lambda: any(h.health is Health.UNHEALTHY for h in hardware.health()), "gpu-0 unhealthy")
            assert not fatal()
            _write(faults, {"unhealthy": {"gpu-0": "XID 79"}, "fatal": ["gpu-0"]})
            await _until(lambda: fatal() == {"gpu-0"}, "the same fault made fatal")
            _write(faults, {"unhealthy": {}, "fatal": ["gpu-0"]})
            await _until(lambda: "fatal names ['gpu-0'], which unhealthy does not" in caplog.text, "the error named")
            assert fatal() == {"gpu-0"}, "a bad file changes nothing"
            _write(faults, {"unhealthy": {"gpu-0": "XID 79"}})
            await _until(lambda: not fatal(), "no longer fatal")
            assert any(h.health is Health.UNHEALTHY and h.device == "gpu-0" for h in hardware.health())
        finally:
            following.cancel()

    asyncio.run(scenario())
