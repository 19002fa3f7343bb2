"""Publishing against the real API server: idempotent, generation bumps, stale slices go."""

from __future__ import annotations

import asyncio

import pytest

from fake_devices.hardware import Health, NodeHardware
from fake_devices.profiles import load_profile
from testbed.controlplane.cluster import ClusterState
from testbed.driver.slices import SlicePublisher, desired_slices
from testbed.kubeapi import KubeClient

pytestmark = pytest.mark.controlplane
GPU = "gpu.dra-testbed.io"


def test_publication_is_idempotent_bumps_generation_and_removes_stale_slices(
    control_plane: ClusterState,
) -> None:
    node = "publish-node"
    hardware = NodeHardware(node, load_profile("h100x8"))

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        publisher = SlicePublisher(client, GPU, node)

        def specs():  # type: ignore[no-untyped-def]
            return desired_slices(GPU, node, hardware.devices(), hardware.pools(), hardware.health())

        try:
            assert await publisher.publish(specs())
            first = await publisher.existing()
            assert len(first) == 3  # counters + two device slices of <= 64
            assert {s["spec"]["pool"]["generation"] for s in first} == {1}
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in first} == {3}
            writes = publisher.writes
            assert not await publisher.publish(specs()), "unchanged content is not rewritten"
            assert publisher.writes == writes

            hardware.set_health("gpu-1", Health.UNHEALTHY, "overheating")
            assert await publisher.publish(specs())
            tainted = {
                d["name"] for s in await publisher.existing() for d in s["spec"].get("devices", []) if d.get("taints")
            }
            assert "gpu-1" in tainted and "gpu-1-3g40gb-4" in tainted
            assert not await publisher.publish(specs()), "the API's timeAdded on taints is not a change"

            for gpu in range(1, 8):  # seven GPUs fall off the bus
                hardware.lose_device(f"gpu-{gpu}")
            assert await publisher.publish(specs())
            last = await publisher.existing()
            assert len(last) == 2, "the emptied device slice is deleted"
            assert {s["spec"]["pool"]["generation"] for s in last} == {3}
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in last} == {2}
            assert len([d for s in last for d in s["spec"].get("devices", [])]) == 13
        finally:
            await publisher.remove_all()
            await client.close()

    asyncio.run(scenario())
