"""What a synthetic node's kubelet logs: its drivers' calls at debug, as kubelet v1.37
logs them at -v=4 (the claims asked, the answer, how long it took), each line naming its
node, so one NodeHost's log serves a user debugging one node of hundreds; and nothing
per call at the fleet's default level."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from testbed.config import log_to_stderr
from testbed.fleet import spec
from testbed.grpcapi import dra_v1_pb2, dra_v1_pb2_grpc
from testbed.kubeapi import ClaimRef
from testbed.kubelet.plugins import PluginCallError, PluginManager
from testbed.kubeletplugin.grpc_services import RegistrationService, add_registration_service

DRIVER = "gpu.example.com"
CLAIMS = [ClaimRef("team", "uid-a", "train-gpu"), ClaimRef("team", "uid-b", "train-nic")]


class Devices(dra_v1_pb2_grpc.DRAPluginServicer):
    """Prepares each claim as one device; unprepares with an error for the first."""

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        answer = dra_v1_pb2.NodePrepareResourcesResponse()
        for number, claim in enumerate(request.claims):
            device = dra_v1_pb2.Device(
                request_names=["gpu"],
                pool_name="node-7",
                device_name=f"gpu-{number}",
                cdi_device_ids=[f"{DRIVER}/gpu=gpu-{number}"],
            )
            answer.claims[claim.uid].devices.append(device)
        return answer

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        answer = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for number, claim in enumerate(request.claims):
            answer.claims[claim.uid].error = "device busy" if number == 0 else ""
        return answer


async def _calls(short_tmp_path: Path) -> None:
    registry, endpoint = short_tmp_path / "plugins_registry", short_tmp_path / "dra.sock"
    registry.mkdir()
    server = grpc.aio.server()
    add_registration_service(server, RegistrationService(DRIVER, str(endpoint)))
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(Devices(), server)
    server.add_insecure_port(f"unix://{registry / 'driver.sock'}")
    server.add_insecure_port(f"unix://{endpoint}")
    await server.start()
    manager = PluginManager(registry, watch_health=False, node="node-7")
    manager.start()
    try:
        await manager.wait_for_driver(DRIVER, 10.0)
        prepared = await manager.prepare(DRIVER, CLAIMS)
        assert [d.device for d in prepared["uid-b"]] == ["gpu-1"]
        with pytest.raises(PluginCallError, match="device busy"):
            await manager.unprepare(DRIVER, CLAIMS)
    finally:
        await manager.stop()
        await server.stop(None)


@pytest.fixture
def kubelet_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.WARNING)
    yield caplog


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "testbed.kubelet.plugins"]


def test_at_debug_each_driver_call_is_logged_with_its_node_claims_and_answer(
    short_tmp_path: Path, kubelet_log: pytest.LogCaptureFixture
) -> None:
    kubelet_log.set_level(logging.DEBUG, logger="testbed.kubelet.plugins")
    asyncio.run(_calls(short_tmp_path))
    lines = _lines(kubelet_log)
    asked = f"of {DRIVER} at {short_tmp_path / 'dra.sock'} for team/train-gpu (uid-a), team/train-nic (uid-b)"
    assert f"node-7: calling NodePrepareResources {asked}" in lines, lines
    [prepared] = [line for line in lines if line.startswith("node-7: NodePrepareResources of")]
    assert prepared.endswith(
        f"team/train-gpu: node-7/gpu-0 ['{DRIVER}/gpu=gpu-0']; team/train-nic: node-7/gpu-1 ['{DRIVER}/gpu=gpu-1']"
    ), prepared
    assert " answered in " in prepared and " ms: " in prepared, prepared
    assert f"node-7: calling NodeUnprepareResources {asked}" in lines, lines
    [unprepared] = [line for line in lines if line.startswith("node-7: NodeUnprepareResources of")]
    assert unprepared.endswith("team/train-gpu: error 'device busy'; team/train-nic: done"), unprepared
    assert any(line.startswith(f"node-7: registered DRA plugin {DRIVER}") for line in lines), lines


def test_at_the_fleets_default_level_a_call_logs_nothing(
    short_tmp_path: Path, kubelet_log: pytest.LogCaptureFixture
) -> None:
    asyncio.run(_calls(short_tmp_path))
    assert _lines(kubelet_log) == []


def test_a_nodehosts_log_level_raises_the_testbeds_loggers_and_leaves_the_libraries_quiet() -> None:
    ours, theirs = logging.getLogger("testbed"), logging.getLogger("grpc")
    before = ours.level, theirs.level
    try:
        log_to_stderr("debug")
        assert logging.getLogger("testbed.kubelet.plugins").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("grpc._cython").isEnabledFor(logging.INFO)
        log_to_stderr("warning")
        assert not logging.getLogger("testbed.kubelet.plugins").isEnabledFor(logging.INFO)
    finally:
        ours.setLevel(before[0])
        theirs.setLevel(before[1])


def test_a_fleet_files_log_level_is_one_of_four() -> None:
    assert spec.parse("logLevel: debug\npools: [{name: a, count: 1}]", "f.yaml").log_level == "debug"
    assert spec.parse("pools: [{name: a, count: 1}]", "f.yaml").log_level == "warning"
    with pytest.raises(spec.FleetFileError, match=r"logLevel: Input should be 'debug', 'info', 'warning' or 'error'"):
        spec.parse("logLevel: verbose\npools: [{name: a, count: 1}]", "f.yaml")
