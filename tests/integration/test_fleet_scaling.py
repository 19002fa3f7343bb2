"""Scaling a pool down and up while pods run: drained in order, nothing leaked, nodes come back."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
from kubernetes import client as k8s
from ray.util import list_named_actors

from testbed.config import nodes_dir, runtime_root
from testbed.controlplane.cluster import ClusterState
from testbed.controlplane.processes import descendants
from testbed.errors import TestbedError
from testbed.fingerprint import code_version
from testbed.fleet.fleet import Fleet, ScaleInterrupted
from testbed.fleet.membership import Membership, NodeRecipe
from testbed.fleet.raycluster import HEAD_LABEL, ray_temp_dir
from testbed.fleet.spec import FleetFile
from testbed.kubelet.node import SYNTHETIC_TOLERATION
from testbed.testing import wait_for
from testbed.workloads import GPU, claim_spec, create_template, request, unique

pytestmark = pytest.mark.controlplane


def _started_fleet(control_plane: ClusterState, pool: str, count: int, per_host: int) -> tuple[Fleet, str]:
    """A fleet of its own, of one pool of tiny nodes labelled pool=<a label unique to it>."""
    label = unique(pool)
    pools = [{"name": pool, "count": count, "profile": "tiny", "labels": {"pool": label}}]
    spec = FleetFile.model_validate({"nodesPerHost": per_host, "pools": pools})
    own = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    own.start()
    return own, label


def _deployment(name: str, pool_label: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/workload",
                            "command": ["run-forever"],
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "nodeSelector": {"pool": pool_label},
                    "tolerations": [SYNTHETIC_TOLERATION],
                    "terminationGracePeriodSeconds": 1,
                },
            },
        },
    }


POOL = "scaled-while-pods-run-rack-east"
"""Long enough (31 characters) that its nodes' drivers need short names for their sockets."""


def _short_names() -> set[str]:
    """The nodes of POOL whose plugins_registry has a short name under the runtime directory."""
    base = runtime_root() / "a"
    nodes = {p.readlink().parent.parent.name for p in base.glob("*r") if p.is_symlink()} if base.is_dir() else set()
    return {node for node in nodes if node.startswith(POOL)}


def test_a_pool_scales_down_and_up_while_pods_run(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """Its pool's name is long enough that its nodes' drivers bind their sockets through
    the nodes' short names (a node's own directory would overflow them)."""
    del fleet  # only for its Ray and DeviceClasses
    own, label = _started_fleet(control_plane, POOL, 3, per_host=2)
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    namespace = unique("scale")
    core.create_namespace({"metadata": {"name": namespace}})

    def running() -> dict[str, str]:
        pods = core.list_namespaced_pod(namespace).items
        return {p.metadata.uid: p.spec.node_name for p in pods if p.status.phase == "Running"}

    def slices_of(node: str) -> list[Any]:
        return list(resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items)

    try:
        create_template(kube_api, namespace, "one-gpu", claim_spec(request("gpu", GPU)))
        k8s.AppsV1Api(kube_api).create_namespaced_deployment(namespace, _deployment("work", label, 5))
        wait_for(lambda: len(running()) == 5, 180, "5 GPU pods running on 3 nodes of 2 GPUs")
        before = running()

        assert _short_names() == {f"{POOL}-00{i}" for i in range(3)}, "the drivers' sockets' short names"
        own.scale(POOL, 1)

        for gone in (f"{POOL}-001", f"{POOL}-002"):
            assert not core.list_node(field_selector=f"metadata.name={gone}").items, f"{gone} deleted"
            assert not slices_of(gone), f"{gone}'s slices removed"
            assert not (nodes_dir(control_plane.root) / gone).exists()
        assert len(own.hosts) == 1, "the host left with no nodes is gone"
        assert _short_names() == {f"{POOL}-000"}, "the drained nodes' short names removed"
        assert own.spec.pools[0].count == 1
        # The pods on the first node kept running through it; the evicted ones were
        # replaced, and with 2 GPUs left only 2 of 5 can run.
        first = f"{POOL}-000"
        kept = {uid for uid, node in before.items() if node == first}
        wait_for(lambda: len(running()) == 2, 180, "a replacement pod to take the first node's free GPU")
        now = running()
        assert kept <= set(now) and set(now.values()) == {first}
        held = ray.get(own.host(first).hardware_claims.remote(first))
        assert len(held) == 2, "the surviving node holds exactly the devices of its 2 pods"

        own.scale(POOL, 3)

        assert len(own.hosts) == 2
        nodes = core.list_node(label_selector=f"pool={label}").items
        addresses = {n.metadata.name: [a.address for a in n.status.addresses if a.type == "InternalIP"] for n in nodes}
        pool = own.spec.pools[0]
        assert addresses == {f"{POOL}-00{i}": [own.spec.node_address(pool, i)] for i in range(3)}, "the fleet's own"
        wait_for(lambda: len(running()) == 5, 180, "the waiting pods to run on the new nodes")
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)
    assert not core.list_node(label_selector=f"pool={label}").items, "a fleet that leaves takes its Nodes"


def test_a_scale_goes_by_the_nodes_the_hosts_hold_not_the_count_last_recorded(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """`testbed scale` interrupted records the count it was taking the pool to while the
    hosts carry on, so the record and the nodes can part: the next scale must still
    end with exactly the nodes asked for, none twice."""
    del fleet  # only for its Ray and DeviceClasses
    own, label = _started_fleet(control_plane, "drift", 1, per_host=4)
    core = k8s.CoreV1Api(kube_api)

    def nodes() -> set[str]:
        return {n.metadata.name for n in core.list_node(label_selector=f"pool={label}").items}

    try:
        own.scale("drift", 3)
        own.pool("drift").count = 1  # the hosts went on past the record
        own.scale("drift", 2)
        assert nodes() == {"drift-000", "drift-001"}
        assert sorted(own.host_of) == ["drift-000", "drift-001"]

        own.pool("drift").count = 4  # the record ran ahead of the hosts
        own.scale("drift", 3)
        assert nodes() == {"drift-000", "drift-001", "drift-002"}
        assert sorted(ray.get(own.host("drift-000").ready.remote())) == ["drift-000", "drift-001", "drift-002"]
    finally:
        own.stop(remove_nodes=True)


def _placed_and_shared(placed: str, count: int, shared: str) -> FleetFile:
    """Two pools of tiny nodes, 4 a host: ``placed`` on hosts of its own (placed on the
    head the testbed starts, by its label), ``shared`` with one node."""
    on_head = {"strategy": "SPREAD", "labels": {HEAD_LABEL: "true"}}
    pools = [
        {"name": placed, "count": count, "profile": "tiny", "placement": on_head},
        {"name": shared, "count": 1, "profile": "tiny"},
    ]
    return FleetFile.model_validate({"nodesPerHost": 4, "pools": pools})


def _named_hosts(fleet: Fleet) -> set[str]:
    return {name for name in list_named_actors() if name.startswith(f"nodehost-{fleet.id}-")}


def test_an_interrupted_scale_stops_the_hosts_it_had_not_started_and_the_next_one_finishes(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the new hosts come up: they were never told which nodes to start, so
    they go (left, each held a Ray worker and, on the next scale, failed it), the user is
    told how many nodes were given up, and the next scale adds exactly those."""
    del fleet  # only for its Ray and DeviceClasses
    own, label = _started_fleet(control_plane, "cut", 1, per_host=2)
    checked = Fleet._check_code

    def ctrl_c_as_the_new_hosts_answer(self: Fleet, names: list[str]) -> None:
        checked(self, names)
        raise KeyboardInterrupt

    try:
        before = set(own.hosts)
        with monkeypatch.context() as patched:
            patched.setattr(Fleet, "_check_code", ctrl_c_as_the_new_hosts_answer)
            with pytest.raises(ScaleInterrupted) as interrupted:
                own.scale("cut", 5)
        assert (interrupted.value.handed, interrupted.value.given_up) == (0, 4)
        assert set(own.hosts) == before
        wait_for(lambda: _named_hosts(own) == before, 60, "the hosts the scale had not started to go")
        stopped = [f"nodehost-{own.id}-{k}" for k in range(len(before), own._next_host)]
        assert stopped and all(Membership(name).load() is None for name in stopped), "their recorded nodes forgotten"

        own.scale("cut", 5)
        nodes = {n.metadata.name for n in k8s.CoreV1Api(kube_api).list_node(label_selector=f"pool={label}").items}
        assert nodes == {f"cut-{i:03d}" for i in range(5)}
    finally:
        own.stop(remove_nodes=True)


def test_a_host_left_unstarted_by_a_killed_scale_is_retired_by_the_next(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """A scale killed outright (no Ctrl-C to handle) between making a host and telling it
    to start leaves the host holding nothing, and holding a Ray worker. The next scale,
    attaching afresh, retires it and brings its own nodes up."""
    del fleet  # only for its Ray and DeviceClasses
    own, label = _started_fleet(control_plane, "left", 1, per_host=2)
    attached: Fleet | None = None
    try:
        left = own._new_host([NodeRecipe("left-007", "tiny", {"pool": label})], "")  # and then the scale was killed
        attached = Fleet.attach(own.spec, control_plane.kubeconfig, nodes_dir(control_plane.root), own.id)
        attached.scale("left", 4)
        nodes = {n.metadata.name for n in k8s.CoreV1Api(kube_api).list_node(label_selector=f"pool={label}").items}
        assert nodes == {f"left-{i:03d}" for i in range(4)}
        wait_for(lambda: left not in _named_hosts(own), 60, "the host left unstarted to go")
        assert Membership(left).load() is None
        assert len(_named_hosts(own)) == 2
    finally:
        (attached or own).stop(remove_nodes=True)  # the same hosts: the one that knows them all


def test_the_next_scale_waits_for_an_interrupted_drain_and_retires_the_hosts_it_emptied(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """`testbed scale` interrupted while it drains: the hosts drain on. The next scale,
    attached afresh, must wait for them (nodes about to go are not there to keep), and
    must not fill a host they emptied with another pool's nodes: which pool Ray placed
    that host for is no longer known."""
    del fleet  # only for its Ray and DeviceClasses
    placed_pool, shared_pool = unique("pd"), unique("sd")
    spec = _placed_and_shared(placed_pool, 2, shared_pool)
    first = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    latest = first
    core = k8s.CoreV1Api(kube_api)
    placed_nodes = [f"{placed_pool}-000", f"{placed_pool}-001"]

    def attach() -> Fleet:
        return Fleet.attach(spec, control_plane.kubeconfig, nodes_dir(control_plane.root), first.id)

    try:
        first.start()
        emptied, shared_host = first.host_of[placed_nodes[0]], first.host_of[f"{shared_pool}-000"]
        ray.get(first.hosts[emptied].remove_nodes.remote(placed_nodes))  # a shrink to 0, interrupted after this
        latest = attach()
        latest.scale(shared_pool, 3)
        assert {latest.host_of[f"{shared_pool}-{i:03d}"] for i in range(3)} == {shared_host}
        assert emptied not in _named_hosts(first)

        latest.scale(placed_pool, 2)
        draining = latest.hosts[latest.host_of[placed_nodes[0]]]
        removals = [draining.remove_nodes.remote(placed_nodes) for _ in range(2)]  # the second waits for the first

        def begun() -> bool:  # an async actor may run calls out of order
            return (
                ray.get(draining.draining.remote()) == placed_nodes
                or not ray.wait(removals, num_returns=2, timeout=0)[1]
            )

        wait_for(begun, 60, "the drains to begin")
        assert ray.get(draining.settled.remote(), timeout=120) == [], "what a host holds, once its drains are done"
        assert [r["node"] for r in ray.get(removals[1])] == placed_nodes
        ray.get(removals[0])

        latest = attach()
        latest.scale(placed_pool, 2)
        draining_name = latest.host_of[placed_nodes[0]]
        removal = latest.hosts[draining_name].remove_nodes.remote(placed_nodes)
        latest = attach()  # while they drain
        latest.scale(placed_pool, 2)
        ray.get(removal)
        assert {n.metadata.name for n in core.list_node(field_selector=f"metadata.name={placed_nodes[1]}").items}
        assert latest.host_of[placed_nodes[0]] not in {shared_host, draining_name}, "a host of the pool's own, anew"
        wait_for(lambda: draining_name not in _named_hosts(first), 60, "the host the drain emptied to go")
    finally:
        latest.stop(remove_nodes=True)


def test_hosts_running_another_testbed_start_no_nodes(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process pretends to be another checkout: the real hosts report theirs, and the
    fleet refuses before any node exists, naming both."""
    del fleet  # only for its Ray
    monkeypatch.setattr("testbed.fleet.fleet.code_version", lambda: "000000000000 (Python 3.11)")
    label = unique("cv")
    spec = FleetFile.model_validate({"pools": [{"name": label, "count": 1, "profile": "tiny"}]})
    other = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    try:
        with pytest.raises(TestbedError) as refused:
            other.start()
        assert "another dra-testbed than this machine (000000000000" in refused.value.message
        assert code_version() in refused.value.message  # what the host runs
        nodes = k8s.CoreV1Api(kube_api).list_node(field_selector=f"metadata.name={label}-000").items
        assert nodes == []
    finally:
        other.stop()


def test_a_pool_with_a_placement_has_hosts_of_its_own_and_asks_only_for_what_ray_offers(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    del fleet  # only for its Ray
    own, shared = unique("pl"), unique("sh")
    spec = _placed_and_shared(own, 1, shared)
    placed = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    try:
        placed.start()
        assert placed.host_of[f"{own}-000"] != placed.host_of[f"{shared}-000"], "room on the host, but not its pool"
        placed.scale(own, 2)  # grows on its own host, which has room
        assert placed.host_of[f"{own}-001"] == placed.host_of[f"{own}-000"]
    finally:
        placed.stop(remove_nodes=True)

    wanting = FleetFile.model_validate(
        {"pools": [{"name": unique("rs"), "count": 1, "profile": "tiny", "placement": {"resources": {"big-hosts": 1}}}]}
    )
    refused = Fleet(wanting, control_plane.kubeconfig, nodes_dir(control_plane.root))
    with pytest.raises(TestbedError) as error:
        refused.start()
    assert "no Ray node offers big-hosts" in error.value.message
    assert refused.hosts == {}, "refused before any NodeHost was asked for"

    labelled = FleetFile.model_validate(
        {"pools": [{"name": unique("lb"), "count": 1, "profile": "tiny", "placement": {"labels": {"tier": "big"}}}]}
    )
    refused = Fleet(labelled, control_plane.kubeconfig, nodes_dir(control_plane.root))
    with pytest.raises(TestbedError) as error:
        refused.start()
    assert "no Ray node carries the labels tier=big" in error.value.message
    assert refused.hosts == {}, "refused before any NodeHost was asked for"


def test_nodes_under_shared_credentials_run_pods_with_claims(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """identities: shared: the kubelets' requests go over the host's connections and their
    pod watches over connections of their own, all as the fleet's admin."""
    del fleet  # only for its Ray and DeviceClasses
    label = unique("sd")
    spec = FleetFile.model_validate(
        {"identities": "shared", "pools": [{"name": label, "count": 1, "profile": "tiny", "labels": {"pool": label}}]}
    )
    shared = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    assert shared.authority is None
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("shared")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        shared.start()
        create_template(kube_api, namespace, "one-gpu", claim_spec(request("gpu", GPU)))
        k8s.AppsV1Api(kube_api).create_namespaced_deployment(namespace, _deployment("work", label, 1))

        def running() -> list[str]:
            pods = core.list_namespaced_pod(namespace).items
            return [p.spec.node_name for p in pods if p.status.phase == "Running"]

        wait_for(lambda: running() == [f"{label}-000"], 120, "the GPU pod running on the shared-credentials node")
    finally:
        core.delete_namespace(namespace)
        shared.stop(remove_nodes=True)


def test_a_fleet_of_empty_pools_starts_and_scale_fills_it(short_tmp_path: Path) -> None:
    """Start with no nodes (a fleet file whose pools are empty), add them later; `testbed
    status` then lists the faults a node's hardware has, until they are undone; the
    NodeHost's log holds what the fleet's log level asks for."""
    fleet_file = short_tmp_path / "fleet.yaml"
    fleet_file.write_text("logLevel: info\npools: [{name: later, count: 0, profile: tiny}]\n")
    where = ["--name", "emptyfleet", "--state-dir", str(short_tmp_path / "state")]
    base = [sys.executable, "-m", "testbed.cli"]

    def testbed(*args: str) -> str:
        done = subprocess.run([*base, *args, *where], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"testbed {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    try:
        testbed("up", "--fleet", str(fleet_file))
        testbed("scale", "later", "2")
        status = testbed("status")
        assert "2 / 2" in status, status  # the pool's nodes Ready of those asked for
        assert "faults in force" not in status, status
        testbed("fault", "later-*", "unhealthy", "gpu-1", "--message", "XID 79", "--fatal")
        status = testbed("status")
        for node in ("later-000", "later-001"):
            assert f"{node} │ gpu-1 unhealthy (fatal): XID 79" in status, status
        testbed("fault", "later-000", "healthy", "gpu-1")
        testbed("fault", "later-*", "latency", "250")
        status = testbed("status")
        assert "later-000 │ prepares 250 ms slower" in status and "later-001 │ gpu-1 unhealthy" in status, status
        testbed("fault", "later-00[01]", "clear")
        assert "faults in force" not in testbed("status")
        document = json.loads(testbed("status", "--json"))
        assert document["healthy"] and document["fleet_complete"], document
        fleet = document["fleet"]
        assert fleet["pools"] == [{"name": "later", "profile": "tiny", "kubelet": "fake", "ready": 2, "asked": 2}]
        assert sum(h["ready"] for h in fleet["hosts"]) == 2 and fleet["faults"] == {}, fleet
        # A synthetic node's kubelet and drivers log in its NodeHost's log, which `logs` finds.
        told = subprocess.run([*base, "logs", "later-001", *where], capture_output=True, text=True, timeout=120)
        assert told.returncode == 0 and "testbed logs later-001 nodehost" in told.stderr, told.stderr
        told = subprocess.run(
            [*base, "logs", "later-001", "kubelet", *where], capture_output=True, text=True, timeout=120
        )
        assert told.returncode == 1 and "node later-001 has no log 'kubelet'" in told.stderr, told.stderr
        assert "its logs: nodehost (nodehost: its NodeHost's lines about it)" in told.stderr, told.stderr
        told = subprocess.run(
            [*base, "logs", "later-001", "nodehost", "--all-nodes", *where], capture_output=True, text=True, timeout=120
        )
        [host] = [h for h in fleet["hosts"] if h["ready"]]
        assert told.returncode == 0 and f"NodeHost {host['name']} (pid {host['pid']})" in told.stderr, told.stderr
        shown = Path(told.stderr.strip().splitlines()[-1].rsplit(", ", 1)[1])
        assert shown.is_file() and shown.name.endswith(f"-{host['pid']}.err"), shown
        assert told.stdout.strip() and shown.read_text().startswith(told.stdout.strip()), "it prints that log"
        # At the fleet's logLevel (info): the kubelets say which drivers they registered.
        for node in ("later-000", "later-001"):
            assert f"{node}: registered DRA plugin gpu.dra-testbed.io" in told.stdout, told.stdout[-3000:]
        # Without --all-nodes, only the node's own lines and the host's.
        told = subprocess.run(
            [*base, "logs", "later-001", "nodehost", *where], capture_output=True, text=True, timeout=120
        )
        assert "only its lines and the NodeHost's own; --all-nodes adds those of the host's 1 other" in told.stderr
        assert "later-001: registered DRA plugin" in told.stdout and "later-000" not in told.stdout, told.stdout
        # A pod whose claim the driver fails to prepare: the kubelet logs the failed sync.
        testbed("fault", "later-*", "fail-prepare", "1")
        gpu_pod = str(Path(__file__).parents[2] / "examples" / "gpu-pod.yaml")
        applied = subprocess.run([*base, "kubectl", *where, "apply", "-f", gpu_pod], capture_output=True, text=True)
        assert applied.returncode == 0, applied.stderr

        def failed_sync_logged() -> bool:
            host_log = subprocess.run(
                [*base, "logs", "later-000", "nodehost", "--all-nodes", *where],
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            lines = host_log.splitlines()
            added = any(": SyncLoop ADD pod default/gpu-pod (" in n for n in lines)  # as a kubelet at -v=2
            return added and any(
                "error syncing pod default/gpu-pod" in n and "Failed to prepare dynamic resources" in n for n in lines
            )

        wait_for(failed_sync_logged, 60, "the pod and its failed prepare in the NodeHost's log")
    finally:
        subprocess.run([*base, "down", *where], capture_output=True, timeout=300)


def _ray_worker_names(control_plane: ClusterState) -> list[str]:
    """The process titles of the Ray head's workers (``ray::NodeHost``, ``ray::IDLE``...):
    the ``ray::`` processes descended from those that run in its temp dir."""
    ray_dir = str(ray_temp_dir(control_plane.root))
    head: set[int] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if ray_dir in (proc / "cmdline").read_bytes().decode(errors="replace"):
                head |= descendants(int(proc.name))
    titles = []
    for pid in head:
        with contextlib.suppress(OSError):
            titles.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return [title for title in titles if title.startswith("ray::")]


def test_ray_keeps_no_spare_worker_processes(control_plane: ClusterState, fleet: Fleet) -> None:
    """Ray starts a spare worker for the first driver (this process) and keeps one per CPU
    waiting; each costs as much idle CPU as a hundred synthetic nodes' Ray share. The
    testbed's head runs its NodeHosts and agents, and lets a spare go within seconds."""
    del fleet  # for its Ray head, its NodeHosts and this process connected as a driver
    names = wait_for(
        lambda: (names := _ray_worker_names(control_plane)) and "ray::IDLE" not in names and names,
        timeout_s=10,
        what="no idle Ray worker",
    )
    assert "ray::NodeHost" in names, names
