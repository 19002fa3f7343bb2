"""The fake kubelet's pod status writes, as the kubelet makes them: a write meant for one
pod never lands on another of the same name."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from testbed.controlplane.cluster import ClusterState
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.kubelet.kubelet import FakeKubelet
from testbed.kubelet.node import NodeSpec

pytestmark = pytest.mark.controlplane

NAMESPACE = "default"


def pod(name: str, node: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "app", "image": "registry.invalid/app"}],
        },
    }


def test_a_status_write_for_a_replaced_pod_never_lands_on_its_namesake(
    control_plane: ClusterState, short_tmp_path: Path
) -> None:
    """A StatefulSet's next pod has the name of the one before it. A status write the old
    pod's worker still had in flight must be refused, not make the new pod Running."""
    node, name = f"namesake-{uuid.uuid4().hex[:6]}", f"web-{uuid.uuid4().hex[:6]}"
    path = path_for("v1", "pods", name, NAMESPACE)

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        kubelet = FakeKubelet(client, NodeSpec(node), short_tmp_path / "kubelet", short_tmp_path / "cdi")
        await kubelet.start()
        try:
            await client.create(path_for("v1", "pods", namespace=NAMESPACE), pod(name, node))
            async with asyncio.timeout(30):
                while (first := await client.get(path)).get("status", {}).get("phase") != "Running":
                    await asyncio.sleep(0.1)
            await client.delete(path, {"gracePeriodSeconds": 0})
            async with asyncio.timeout(30):
                while await client.delete_if_exists(path, {"gracePeriodSeconds": 0}):
                    await asyncio.sleep(0.1)
            # The namesake is bound to a node no kubelet serves: nothing else writes its status.
            second = await client.create(path_for("v1", "pods", namespace=NAMESPACE), pod(name, f"{node}-next"))

            # What the first pod's worker had in flight when the pod was replaced.
            with pytest.raises(ApiError) as refused:
                await kubelet.pods._set_running(first, {})
            assert refused.value.not_found, f"to the old pod's worker, its pod is gone: {refused.value}"

            now = await client.get(path)
            assert now["metadata"]["uid"] == second["metadata"]["uid"]
            assert now["status"].get("phase") == "Pending", "the old pod's status landed on the new one"
        finally:
            await client.delete_if_exists(path, {"gracePeriodSeconds": 0})
            await kubelet.stop()
            await client.delete_if_exists(path_for("v1", "nodes", node))
            await client.close()

    asyncio.run(scenario())
