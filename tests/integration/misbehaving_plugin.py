"""A DRA plugin with the bugs a driver under development has, one per MODE:

- ``wrong-cdi`` (the default): every prepare answers a CDI device no spec defines;
- ``leave-out``: prepare answers no claim at all;
- ``unknown-claim``: prepare answers a claim it was not asked about, besides the others.

Run as a process: python misbehaving_plugin.py <plugins_registry dir> <plugin dir> <driver> [MODE]
It speaks the real registration and DRA v1 protocol (unprepare always succeeds); it
exists to prove that the fake kubelet refuses such answers as the real one does, and that
`testbed sanity` says what is wrong. With PUBLISH_SLICE=1, NODE_NAME and KUBECONFIG (the
last two as `testbed sanity` gives a driver), it publishes a one-device slice (``d0``) for
that node, as a driver would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import grpc

from testbed.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from testbed.kubeapi import KubeClient, path_for

MODES = ("wrong-cdi", "leave-out", "unknown-claim")


class Plugin:
    def __init__(self, driver: str, endpoint: str, mode: str, pool: str = "x"):
        self.driver = driver
        self.endpoint = endpoint
        self.mode = mode
        self.pool = pool

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=["v1.DRAPlugin"],
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:  # for tests to wait on, as for a driver pod's readiness
            Path(self.endpoint).with_name("registered").touch()
        return pluginregistration_pb2.RegistrationStatusResponse()

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        if self.mode == "leave-out":
            return response
        if self.mode == "unknown-claim":
            response.claims["00000000-0000-0000-0000-00000000000a"].devices.add(
                request_names=["dev"], pool_name="x", device_name="d0"
            )
        for claim in request.claims:
            response.claims[claim.uid].devices.add(
                request_names=["dev"],
                pool_name=self.pool,
                device_name="d0",
                cdi_device_ids=[f"{self.driver}/dev=defined-nowhere"],
            )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response


async def publish_slice(kubeconfig: Path, node: str, driver: str) -> None:
    client = KubeClient.from_kubeconfig(kubeconfig)
    try:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "d0"}],
            },
        }
        await client.create_or_replace(path_for("resource.k8s.io/v1", "resourceslices"), body)
    finally:
        await client.close()


async def main(registry: Path, plugin_dir: Path, driver: str, mode: str) -> None:
    if mode not in MODES:
        raise SystemExit(f"mode {mode!r}: pick one of {', '.join(MODES)}")
    plugin_dir.mkdir(parents=True, exist_ok=True)
    endpoint = plugin_dir / "dra.sock"
    node = os.environ.get("NODE_NAME", "")
    plugin = Plugin(driver, str(endpoint), mode, node or "x")
    if node and os.environ.get("PUBLISH_SLICE") == "1":
        await publish_slice(Path(os.environ["KUBECONFIG"]), node, driver)
    server = grpc.aio.server()
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(plugin, server)
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{endpoint}")
    server.add_insecure_port(f"unix://{registry / f'{driver}-reg.sock'}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)
    (registry / f"{driver}-reg.sock").unlink(missing_ok=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else MODES[0]))
