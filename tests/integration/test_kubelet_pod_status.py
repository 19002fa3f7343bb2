"""The fake kubelet's pod status writes, as the kubelet makes them: a write meant for one
pod never lands on another of the same name; pod IPs from the Node's pod CIDR."""

from __future__ import annotations

import asyncio
import ipaddress
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

            # The Running status the first pod's worker had in flight when it was replaced.
            with pytest.raises(ApiError) as refused:
                await kubelet.pods._patch_status(first, {"status": first["status"]})
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


def test_pods_get_ips_from_their_nodes_pod_cidr_and_host_network_pods_the_nodes_ip(
    control_plane: ClusterState, short_tmp_path: Path
) -> None:
    """As on kind: the controller-manager gives each Node a pod CIDR, and a pod's IP is its
    own from there (Services and EndpointSlices over the fleet's pods need that); every
    pod had its node's IP."""
    nodes = [f"podnet-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    names = ["a-1", "a-2", "b-1", "a-host"]
    placed = dict(zip(names, [nodes[0], nodes[0], nodes[1], nodes[0]], strict=True))

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        kubelets = [
            FakeKubelet(client, NodeSpec(node), short_tmp_path / node / "kubelet", short_tmp_path / node / "cdi")
            for node in nodes
        ]
        try:
            for kubelet in kubelets:
                await kubelet.start()
            async with asyncio.timeout(30):  # the controller-manager's node IPAM, then the kubelets' watch
                while not all(k.pods.pod_cidr() for k in kubelets):
                    await asyncio.sleep(0.1)
            cidrs = {k.spec.name: ipaddress.ip_network(k.pods.pod_cidr() or "") for k in kubelets}
            assert cidrs[nodes[0]] != cidrs[nodes[1]]
            assert all(c.subnet_of(ipaddress.ip_network("100.64.0.0/10")) for c in cidrs.values()), cidrs
            # A pod that came and went: the node's first address is free again, and the
            # pods below do not have the addresses a kubelet starting afresh would give.
            first = path_for("v1", "pods", "a-0", NAMESPACE)
            await client.create(path_for("v1", "pods", namespace=NAMESPACE), pod("a-0", nodes[0]))
            async with asyncio.timeout(30):
                while (await client.get(first)).get("status", {}).get("phase") != "Running":
                    await asyncio.sleep(0.1)
                while await client.delete_if_exists(first, {"gracePeriodSeconds": 0}):
                    await asyncio.sleep(0.1)
            for name, node in placed.items():
                body = pod(name, node)
                body["spec"]["hostNetwork"] = name.endswith("host")
                await client.create(path_for("v1", "pods", namespace=NAMESPACE), body)
            statuses: dict[str, Obj] = {}
            async with asyncio.timeout(30):
                while len(statuses) < len(placed):
                    for name in placed:
                        status = (await client.get(path_for("v1", "pods", name, NAMESPACE))).get("status", {})
                        if status.get("phase") == "Running":
                            statuses[name] = status
                    await asyncio.sleep(0.1)
            ips = {name: status["podIP"] for name, status in statuses.items()}
            assert all(status["podIPs"] == [{"ip": status["podIP"]}] for status in statuses.values())
            assert len({ips["a-1"], ips["a-2"], ips["b-1"]}) == 3, ips
            for name in ("a-1", "a-2", "b-1"):
                assert ipaddress.ip_address(ips[name]) in cidrs[placed[name]], (name, ips, cidrs)
            assert ips["a-host"] == statuses["a-host"]["hostIP"] == kubelets[0].spec.internal_ip()

            # Restarted, the kubelet finds its pods running: they keep their IPs, and a pod
            # new to the node gets none of theirs (its IPAM starts afresh, but not blank).
            await kubelets[0].stop()
            kubelets[0] = FakeKubelet(
                client, NodeSpec(nodes[0]), short_tmp_path / nodes[0] / "kubelet", short_tmp_path / nodes[0] / "cdi"
            )
            await kubelets[0].start()
            placed["a-3"] = nodes[0]
            await client.create(path_for("v1", "pods", namespace=NAMESPACE), pod("a-3", nodes[0]))
            async with asyncio.timeout(30):
                while (new := await client.get(path_for("v1", "pods", "a-3", NAMESPACE)))["status"].get(
                    "phase"
                ) != "Running":
                    await asyncio.sleep(0.1)
            for name in ("a-1", "a-2"):
                again = await client.get(path_for("v1", "pods", name, NAMESPACE))
                assert again["status"]["podIP"] == ips[name], name
            assert new["status"]["podIP"] not in (ips["a-1"], ips["a-2"])
            assert ipaddress.ip_address(new["status"]["podIP"]) in cidrs[nodes[0]]
        finally:
            for name in placed:
                await client.delete_if_exists(path_for("v1", "pods", name, NAMESPACE), {"gracePeriodSeconds": 0})
            for kubelet in kubelets:
                await kubelet.stop()
                await client.delete_if_exists(path_for("v1", "nodes", kubelet.spec.name))
            await client.close()

    asyncio.run(scenario())
