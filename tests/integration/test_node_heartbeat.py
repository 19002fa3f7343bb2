"""A synthetic node's heartbeat: its Lease, written as a kubelet writes it.

The node lifecycle controller marks a node NotReady when its Lease stops moving, so a
renewal that silently fails, or a Lease lost and never recreated, would take a whole
fleet out of scheduling.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.kubelet.node import NodeAgent, NodeSpec

pytestmark = pytest.mark.controlplane

LEASES = path_for("coordination.k8s.io/v1", "leases", namespace="kube-node-lease")


async def _lease(client: KubeClient, name: str) -> Obj | None:
    try:
        return await client.get(f"{LEASES}/{name}")
    except ApiError as exc:
        if exc.not_found:
            return None
        raise


def test_lease_is_created_renewed_recreated_and_adopted(kubeconfig_path: Path) -> None:
    name = f"hb-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        agent = NodeAgent(client, NodeSpec(name))
        try:
            await agent.register()
            assert agent.created
            first = await _lease(client, name)
            assert first is not None, "a registered node has no Lease"
            assert first["spec"]["holderIdentity"] == name
            assert first["metadata"]["ownerReferences"][0]["uid"] == agent.uid

            await agent.renew_lease()
            renewed = await _lease(client, name)
            assert renewed is not None
            assert renewed["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
            assert renewed["spec"]["renewTime"] > first["spec"]["renewTime"]

            # Someone deletes the Lease: the next renewal notices, the one after recreates it.
            await client.delete(f"{LEASES}/{name}")
            for _ in range(2):
                await agent.renew_lease()
            recreated = await _lease(client, name)
            assert recreated is not None, "a deleted Lease was not recreated"
            assert recreated["metadata"]["uid"] != first["metadata"]["uid"]

            # A restarted kubelet adopts the Node and its Lease rather than failing.
            again = NodeAgent(client, NodeSpec(name))
            await again.register()
            assert not again.created
            assert again.uid == agent.uid
            adopted = await _lease(client, name)
            assert adopted is not None
            assert adopted["metadata"]["uid"] == recreated["metadata"]["uid"]
            assert adopted["spec"]["renewTime"] > recreated["spec"]["renewTime"]
        finally:
            await agent.delete()
            await client.close()

    asyncio.run(scenario())
