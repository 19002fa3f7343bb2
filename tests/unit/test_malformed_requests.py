"""A client sending undecodable requests costs the driver one log line per interval, not a traceback each."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import grpc
import pytest

from fake_devices.hardware import NodeHardware
from testbed.drivers import driver_on_node, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.kubeapi import Credentials, KubeClient
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.grpc_services import MalformedRequests
from testbed.kubeletplugin.prepare import DriverPaths

GPU = "gpu.dra-testbed.io"
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"


def test_garbage_requests_log_one_line_and_the_driver_keeps_answering(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> list[grpc.StatusCode]:
        client = KubeClient(Credentials("https://127.0.0.1:9", ssl.create_default_context()))  # never called
        paths = DriverPaths.for_node(short_tmp_path / "kubelet", GPU, short_tmp_path / "cdi")
        hardware = LocalBackend(NodeHardware("n", load_profile("tiny")))
        plugin = driver_on_node(GPU, "n", paths, hardware, client, ClaimReader(client), publish_slices=False)
        await plugin.start()
        codes = []
        try:
            async with grpc.aio.insecure_channel(f"unix://{paths.dra_socket}") as channel:
                garbage = channel.unary_unary(PREPARE, request_serializer=bytes, response_deserializer=bytes)
                for _ in range(50):
                    try:
                        await garbage(b"\xff\xff\xff\x07garbage")
                    except grpc.aio.AioRpcError as exc:
                        codes.append(exc.code())
                empty = await channel.unary_unary(PREPARE, request_serializer=bytes, response_deserializer=bytes)(b"")
                assert empty == b"", "a well-formed (empty) request is still answered"
        finally:
            await plugin.stop(grace_s=0)
            await client.close()
        return codes

    with caplog.at_level(logging.ERROR, logger=MalformedRequests.LOGGER):
        codes = asyncio.run(scenario())
    assert len(codes) == 50 and set(codes) != {grpc.StatusCode.OK}
    lines = [r for r in caplog.records if r.name == MalformedRequests.LOGGER]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].getMessage().startswith(f"malformed request to {PREPARE}")
    assert lines[0].exc_info is None and "Traceback" not in caplog.text
