"""The driver's container command, run as a process with the DaemonSet's environment,
registered by the fake kubelet over the node's real sockets."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from testbed.controlplane.cluster import ClusterState
from testbed.controlplane.processes import free_port
from testbed.kubeapi import KubeClient, path_for
from testbed.kubelet import plugins as kubelet_plugins
from testbed.kubelet.kubelet import FakeKubelet
from testbed.kubelet.node import NodeSpec

pytestmark = pytest.mark.controlplane
DRIVERS = ("gpu.dra-testbed.io", "nic.dra-testbed.io")


def test_driver_process_registers_serves_and_stops_cleanly(
    control_plane: ClusterState, short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubelet_plugins, "WIPE_SLICES_AFTER_S", 1.0)
    node = "standalone-node"
    kubelet_dir, cdi_dir = short_tmp_path / "kubelet", short_tmp_path / "cdi"
    health_port = free_port()
    env = dict(
        os.environ,
        NODE_NAME=node,
        POD_UID="0d3c1a9e-pod",
        KUBELET_DIR=str(kubelet_dir),
        CDI_DIR=str(cdi_dir),
        HARDWARE_PROFILE="tiny",
        HEALTH_PORT=str(health_port),
        KUBECONFIG=str(control_plane.kubeconfig),
        LOG_LEVEL="WARNING",
    )

    async def slices(client: KubeClient) -> set[str]:
        listing = await client.get(
            path_for("resource.k8s.io/v1", "resourceslices"),
            {"fieldSelector": f"spec.nodeName={node}"},
        )
        return {s["spec"]["driver"] for s in listing["items"]}

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        kubelet = FakeKubelet(client, NodeSpec(node), kubelet_dir, cdi_dir, watch_pods=False)
        await kubelet.start()
        driver = await asyncio.create_subprocess_exec(sys.executable, "-m", "testbed.driver.main", env=env)
        try:
            for name in DRIVERS:
                plugin = await kubelet.plugins.wait_for_driver(name, 30)
                assert plugin.service == "v1.DRAPlugin"
                assert plugin.health_service == "v1.DRAResourceHealth"
                assert plugin.registration_socket.name == f"{name}-0d3c1a9e-pod-reg.sock"
            async with asyncio.timeout(30):
                while await slices(client) != set(DRIVERS):
                    await asyncio.sleep(0.1)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as channel:
                check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert check.status == health_pb2.HealthCheckResponse.SERVING
            driver.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(driver.wait(), 15) == 0
            assert not list((kubelet_dir / "plugins_registry").glob("*.sock")), "its sockets are gone"
            async with asyncio.timeout(30):  # the kubelet wipes a vanished driver's slices
                while await slices(client):
                    await asyncio.sleep(0.1)
        finally:
            if driver.returncode is None:
                driver.kill()
                await driver.wait()
            await kubelet.stop()
            await kubelet.node.delete()
            await client.close()

    asyncio.run(scenario())
