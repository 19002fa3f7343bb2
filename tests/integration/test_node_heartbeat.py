"""A synthetic node's heartbeat: its Lease, written as a kubelet writes it.

The node lifecycle controller marks a node NotReady when its Lease stops moving, so a
renewal that silently fails, or a Lease lost and never recreated, would take a whole
fleet out of scheduling.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from testbed.controlplane.cluster import ClusterState
from testbed.fleet.fencing import NodeFence, Server
from testbed.fleet.fleet import Fleet
from testbed.keys import SERVED_BY_ANNOTATION
from testbed.kubeapi import ApiError, KubeClient, Obj, now_rfc3339, path_for
from testbed.kubelet import lease as lease_module
from testbed.kubelet import node as node_module
from testbed.kubelet import nodestatus
from testbed.kubelet.node import NodeAgent, NodeSpec, NodeWatcher

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

            # Someone deletes the Lease: the next renewal makes it again, owned by the Node.
            await client.delete(f"{LEASES}/{name}")
            await agent.renew_lease()
            recreated = await _lease(client, name)
            assert recreated is not None, "a deleted Lease was not recreated"
            assert recreated["metadata"]["uid"] != first["metadata"]["uid"]
            assert recreated["metadata"]["ownerReferences"][0]["uid"] == agent.uid

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


def test_a_lease_written_by_another_is_renewed_in_the_same_sync(kubeconfig_path: Path) -> None:
    """A conflict makes the kubelet read its Lease again and renew at once, not 10 s later:
    a Lease written by someone else (an operator, a controller adding a label) must not
    cost the node a heartbeat."""
    name = f"cfl-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        agent = NodeAgent(client, NodeSpec(name))
        try:
            await agent.register()
            theirs = await client.patch(f"{LEASES}/{name}", {"metadata": {"labels": {"team": "x"}}}, "merge")
            await agent.renew_lease()
            renewed = await _lease(client, name)
            assert renewed is not None
            assert renewed["metadata"]["resourceVersion"] != theirs["metadata"]["resourceVersion"], "not renewed"
            assert renewed["spec"]["renewTime"] > theirs["spec"]["renewTime"]
            assert renewed["metadata"]["labels"] == {"team": "x"}, "the other writer's change was lost"
        finally:
            await agent.delete()
            await client.close()

    asyncio.run(scenario())


def test_a_deleted_nodes_lease_is_not_made_again(kubeconfig_path: Path) -> None:
    """With its Node deleted, a kubelet makes no Lease: a Lease needs the Node as owner,
    and the kubelet reads the Node for it. One made with the old Node's uid would be
    deleted by the garbage collector and made again at every sync."""
    name = f"gone-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        agent = NodeAgent(client, NodeSpec(name))
        try:
            await agent.register()
            await agent.delete()
            await client.delete_if_exists(f"{LEASES}/{name}")  # as the garbage collector would
            for _ in range(2):
                await agent.renew_lease()
            assert await _lease(client, name) is None, "a Lease was made for a deleted Node"
        finally:
            await agent.delete()
            await client.close()

    asyncio.run(scenario())


def test_a_node_is_served_by_one_server_at_a_time(kubeconfig_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two NodeHosts after a lost Ray host: the new one waits while the old one still
    renews the node's Lease, takes the node once the Lease lapses, and the old one, when
    it renews again, lets the node go without writing."""
    monkeypatch.setattr(lease_module, "DURATION_S", 3)  # lapse in seconds, not 40
    name = f"fence-{uuid.uuid4().hex[:6]}"
    lost: list[tuple[str, Server | None]] = []
    old_server = Server("nodehost-x-0", "old", "ray-node-1", os.getpid())
    new_server = Server("nodehost-x-0", "new", "ray-node-2", os.getpid())

    def stamp(lease: Obj | None) -> Server | None:
        assert lease is not None
        return Server.read(lease["metadata"].get("annotations", {}).get(SERVED_BY_ANNOTATION))

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        old = NodeAgent(client, NodeSpec(name), NodeFence(name, old_server, lambda n, by: lost.append((n, by))))
        new = NodeAgent(client, NodeSpec(name), NodeFence(name, new_server, lambda n, by: lost.append((n, by))))
        try:
            await old.register()
            assert stamp(await _lease(client, name)) == old_server
            taking = asyncio.create_task(new.register())
            for _ in range(12):  # 6 s of renewals, past the Lease's duration and the skew allowed
                await old.renew_lease()
                await asyncio.sleep(0.5)
                assert not taking.done(), "the new server took a node whose server still renews it"
            assert stamp(await _lease(client, name)) == old_server

            await asyncio.wait_for(taking, 20)  # the old server stopped renewing: the Lease lapses
            taken = await _lease(client, name)
            assert stamp(taken) == new_server and not lost

            await old.renew_lease()  # back from a freeze or a partition
            assert old.lost and lost == [(name, new_server)]
            after = await _lease(client, name)
            assert after is not None and taken is not None
            assert after["metadata"]["resourceVersion"] == taken["metadata"]["resourceVersion"], "the old server wrote"
            await old.renew_lease()
            await new.renew_lease()
            renewed = await _lease(client, name)
            assert stamp(renewed) == new_server
        finally:
            await new.delete()
            await client.close()

    asyncio.run(scenario())


def test_a_node_registers_ready_in_one_write_as_a_kubelet_does(kubeconfig_path: Path) -> None:
    """The kubelet creates its Node with the status filled in (initialNode), so the first
    version anyone sees is Ready, and the node lifecycle controller has nothing to add but
    taking off the not-ready taint the API server's admission puts on every new Node. A
    Node created bare and then made Ready costs a status write and a taint flap per node."""
    name = f"reg-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        agent = NodeAgent(client, NodeSpec(name))
        try:
            await agent.register()
            node = await client.get(path_for("v1", "nodes", name))
            ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            assert ready and ready[0]["status"] == "True"
            assert node["status"]["capacity"]["pods"] == "250"
            labels = node["metadata"]["labels"]
            assert labels["beta.kubernetes.io/os"] == labels["kubernetes.io/os"] == "linux"
            assert node["metadata"]["annotations"][node_module.CONTROLLER_MANAGED_ATTACH] == "true"
            writers = {(m["manager"], m.get("subresource", "")) for m in node["metadata"]["managedFields"]}
            assert ("dra-testbed", "status") not in writers, f"a second write set the status: {writers}"

            deadline = asyncio.get_running_loop().time() + 30
            while any(t["key"] == "node.kubernetes.io/not-ready" for t in node["spec"].get("taints", [])):
                assert asyncio.get_running_loop().time() < deadline, "the not-ready taint stayed on a Ready node"
                await asyncio.sleep(0.2)
                node = await client.get(path_for("v1", "nodes", name))
            controller = [m for m in node["metadata"]["managedFields"] if m["manager"] == "kube-controller-manager"]
            for entry in controller:  # it had no labels to add: the kubelet's are all there
                assert "f:labels" not in entry["fieldsV1"].get("f:metadata", {}), entry
        finally:
            await agent.delete()
            await client.close()

    asyncio.run(scenario())


def test_a_node_marked_unknown_is_ready_again_at_the_next_status_sync(
    kubeconfig_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a kubelet falls silent past the grace period (a stalled host, a control-plane
    outage), the node lifecycle controller marks its Node's conditions Unknown and taints
    it. Only the kubelet sets them back: it watches its Node, and its next status sync
    (every 10 s) finds them differ. A fake kubelet that did not would leave the node
    NotReady for good while its Lease renews."""
    monkeypatch.setattr(lease_module, "RENEW_S", 0.5)  # its sync every half second, not 10
    name = f"unk-{uuid.uuid4().hex[:6]}"
    path = path_for("v1", "nodes", name)

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        watcher = NodeWatcher.for_node(client, name)
        agent = NodeAgent(client, NodeSpec(name))
        watcher.add(name, agent)
        watcher.start()
        try:
            await agent.register()
            agent.start(first_delay_s=0.5)
            node = await client.get(path)
            before = {c["type"]: c for c in node["status"]["conditions"]}
            marked = [
                dict(
                    c,
                    status="Unknown",
                    reason="NodeStatusUnknown",
                    message="Kubelet stopped posting node status.",
                    lastTransitionTime=now_rfc3339(),
                )
                for c in node["status"]["conditions"]
            ]
            await client.patch(f"{path}/status", {"status": {"conditions": marked}}, "strategic")
            async with asyncio.timeout(15):
                while True:
                    node = await client.get(path)
                    now = {c["type"]: c for c in node["status"]["conditions"]}
                    if all(c["status"] != "Unknown" for c in now.values()):
                        break
                    await asyncio.sleep(0.2)
            assert now["Ready"]["status"] == "True" and now["Ready"]["reason"] == "KubeletReady"
            assert now["MemoryPressure"]["status"] == "False"
            assert now["Ready"]["lastTransitionTime"] >= before["Ready"]["lastTransitionTime"]
            assert now["Ready"]["lastTransitionTime"] >= marked[-1]["lastTransitionTime"], "no new transition"
        finally:
            await agent.stop()
            await watcher.stop()
            await agent.delete()
            await client.close()

    asyncio.run(scenario())


def test_an_idle_node_reports_its_status_every_period_and_not_at_every_sync(
    kubeconfig_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet writes an unchanged status only every nodeStatusReportFrequency (5 min),
    its conditions' heartbeats moving, never at each 10 s sync: at 5,000 nodes that is 17
    writes a second, not 500."""
    monkeypatch.setattr(lease_module, "RENEW_S", 0.2)
    monkeypatch.setattr(nodestatus, "STATUS_REPORT_S", 3.0)
    name = f"rep-{uuid.uuid4().hex[:6]}"
    path = path_for("v1", "nodes", name)

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        agent = NodeAgent(client, NodeSpec(name))
        try:
            await agent.register()
            first = await client.get(path)
            transitions = {c["lastTransitionTime"] for c in first["status"]["conditions"]}
            heartbeats = {first["status"]["conditions"][-1]["lastHeartbeatTime"]}
            agent.start(first_delay_s=0.2)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 8  # 40 syncs; reports 1.5-4.5 s in, then every 3 s
            while loop.time() < deadline:
                node = await client.get(path)
                heartbeats.add(node["status"]["conditions"][-1]["lastHeartbeatTime"])
                await asyncio.sleep(0.1)
            assert len(heartbeats) > 1, "an idle node never reported its status"
            # Heartbeats are stamped to the second: a write at each sync would show 8-9.
            assert len(heartbeats) <= 4, f"{len(heartbeats)} heartbeats in 8 s, reports due every 3 s"
            assert {c["lastTransitionTime"] for c in node["status"]["conditions"]} == transitions
        finally:
            await agent.stop()
            await agent.delete()
            await client.close()

    asyncio.run(scenario())


def test_a_fleet_node_marked_unknown_is_ready_again_through_its_hosts_watch(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    """In a fleet the NodeHost watches its nodes' Nodes with one watch and routes each
    change to its node's kubelet, which writes the status back under its own identity
    (NodeRestriction lets a kubelet change its own Node's status) and records the Event."""
    node_name = sorted(fleet.host_of)[0]
    path = path_for("v1", "nodes", node_name)

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        try:
            node = await client.get(path)
            marked_at = now_rfc3339()
            marked = [
                dict(c, status="Unknown", reason="NodeStatusUnknown", lastTransitionTime=marked_at)
                for c in node["status"]["conditions"]
            ]
            await client.patch(f"{path}/status", {"status": {"conditions": marked}}, "strategic")
            async with asyncio.timeout(25):  # the kubelet's status sync is every 10 s
                while True:
                    conditions = (await client.get(path))["status"]["conditions"]
                    if all(c["status"] != "Unknown" for c in conditions):
                        break
                    await asyncio.sleep(0.25)
            assert {c["type"]: c["status"] for c in conditions}["Ready"] == "True"
            async with asyncio.timeout(10):  # the Event is written after the status
                while True:
                    events = (await client.get(path_for("v1", "events", namespace="default")))["items"]
                    ready = [
                        e for e in events if e["involvedObject"]["name"] == node_name and e["reason"] == "NodeReady"
                    ]
                    if ready:
                        break
                    await asyncio.sleep(0.25)
            assert ready[0]["source"] == {"component": "kubelet", "host": node_name}
        finally:
            await client.close()

    asyncio.run(scenario())
