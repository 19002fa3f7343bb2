"""Taking a synthetic node out of the fleet in the order the DRA good practices ask for.

cordon -> evict its pods -> the kubelet unprepares their claims -> stop the drivers ->
remove their ResourceSlices -> stop the kubelet -> delete the Node. A driver that went
away while pods still used its devices could never unprepare them; the node is only
deleted once nothing on it is prepared any more.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from testbed.errors import TestbedError
from testbed.fleet.external import ExternalDriver
from testbed.fleet.identity import DRIVER_NAMESPACE, driver_pods_selector, is_driver_pod
from testbed.fleet.synthetic_node import SyntheticNode
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.realnode.node import ProcessNode

log = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass
class DrainResult:
    node: str
    pods_evicted: int
    claims_unprepared: int


async def _pods_on(client: KubeClient, node: str) -> list[Obj]:
    """The node's workload pods. Not its driver pod: as `kubectl drain` leaves DaemonSet
    pods, the driver stays until the workloads' claims are unprepared."""
    listing = await client.get(path_for("v1", "pods"), {"fieldSelector": f"spec.nodeName={node}"})
    items: list[Obj] = listing.get("items", [])
    return [pod for pod in items if not is_driver_pod(pod)]


async def _evict(client: KubeClient, pod: Obj, deadline: float) -> None:
    """The Eviction API, as `kubectl drain` uses it: a PodDisruptionBudget may say "not yet"."""
    meta = pod["metadata"]
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
    }
    path = path_for("v1", "pods", meta["name"], meta["namespace"], "eviction")
    while True:
        try:
            await client.create(path, body)
            return
        except ApiError as exc:
            if exc.not_found:
                return  # already gone
            if exc.status == 403 and "being terminated" in exc.message:
                # No eviction in a namespace being deleted, and no budget left to honour.
                await client.delete_if_exists(path_for("v1", "pods", meta["name"], meta["namespace"]))
                return
            where = f"pod {meta['namespace']}/{meta['name']} from {pod['spec'].get('nodeName')}"
            if exc.status != 429:
                raise TestbedError(f"cannot evict {where}", detail=exc.message) from None
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"cannot evict {where}",
                    hint="a PodDisruptionBudget forbids it; scale the workload or relax the budget, then retry",
                    detail=exc.message,
                ) from None
        await asyncio.sleep(POLL_S)


async def _empty(client: KubeClient, name: str, timeout_s: float, prepared: Callable[[], int]) -> int:
    """Cordon, evict, and wait until no pod is left and nothing is prepared (the kubelet
    unprepares as pods go). Returns how many pods were evicted."""
    deadline = time.monotonic() + timeout_s
    await client.patch(path_for("v1", "nodes", name), {"spec": {"unschedulable": True}})
    pods = await _pods_on(client, name)
    await asyncio.gather(*(_evict(client, pod, deadline) for pod in pods))
    while (left := await _pods_on(client, name)) or prepared():
        if time.monotonic() > deadline:
            still = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in left) or "none"
            raise TestbedError(
                f"node {name} did not drain within {timeout_s:.0f}s",
                detail=f"pods left: {still}; claims still prepared: {prepared()}",
                hint="the node is cordoned and stays in the cluster; its kubelet log says why",
            )
        await asyncio.sleep(POLL_S)
    return len(pods)


async def _delete_node(client: KubeClient, name: str) -> None:
    await client.delete_if_exists(path_for("v1", "nodes", name))
    await client.delete_if_exists(path_for("coordination.k8s.io/v1", "leases", name, "kube-node-lease"))


async def _delete_driver_pods(client: KubeClient, node: str) -> None:
    """Its driver pods, of every generation a rollout left (the DaemonSet's pods go last)."""
    await client.request(
        "DELETE",
        path_for("v1", "pods", namespace=DRIVER_NAMESPACE),
        params={"labelSelector": driver_pods_selector(node)},
    )


async def drain(client: KubeClient, node: SyntheticNode, timeout_s: float = 300.0) -> DrainResult:
    """Empty the node and remove it from the cluster; raise if a claim stays prepared."""
    prepared_before = len(node.kubelet.pods.dra.claims)
    evicted = await _empty(client, node.name, timeout_s, lambda: len(node.kubelet.pods.dra.claims))
    for driver in node.drivers:
        await driver.stop()
        await node.kubelet.wipe_slices(driver.name)
    await node.stop_external()
    for external in node.external:
        await node.kubelet.wipe_slices(external.spec.name)
    await _delete_driver_pods(client, node.name)
    await node.kubelet.stop()
    await _delete_node(client, node.name)
    await asyncio.to_thread(shutil.rmtree, node.root, True)  # its checkpoints are empty and its CDI specs gone
    return DrainResult(node.name, evicted, prepared_before)


async def drain_process_node(
    client: KubeClient, node: ProcessNode, timeout_s: float = 300.0, external: Sequence[ExternalDriver] = ()
) -> DrainResult:
    """The same order for a real-kubelet node: its kubelet's checkpoint tells what is still
    prepared. ``external``: its command-line drivers, stopped with its built-in one."""

    def prepared() -> int:
        return len(node.prepared_claims())

    prepared_before = prepared()
    evicted = await _empty(client, node.name, timeout_s, prepared)
    left = sorted(p.name for p in node.cdi_dir.glob("*.json")) if node.cdi_dir.exists() else []
    if left:  # every claim unprepared, as far as the kubelet knows: the driver's to explain
        log.warning(
            "node %s: its drivers left %d CDI specs behind after every claim was unprepared: %s",
            node.name,
            len(left),
            ", ".join(left),
        )
    await node.stop_process("driver")
    for driver in external:
        await driver.stop()
    await _delete_driver_pods(client, node.name)
    await client.request(
        "DELETE",
        path_for("resource.k8s.io/v1", "resourceslices"),
        params={"fieldSelector": f"spec.nodeName={node.name}"},
    )
    await node.stop()
    await _delete_node(client, node.name)
    shutil.rmtree(node.root, ignore_errors=True)
    return DrainResult(node.name, evicted, prepared_before)
