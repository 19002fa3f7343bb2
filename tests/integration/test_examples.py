"""Every manifest in examples/ works as shipped: `kubectl apply -f` with the cluster's own
kubectl, on the synthetic nodes, and its pods run (the Job completes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from testbed.config import nodes_dir
from testbed.controlplane.binaries import Binaries
from testbed.controlplane.cluster import ClusterState
from testbed.fleet.fleet import Fleet
from testbed.fleet.spec import FleetFile
from testbed.keys import CONTAINER_ENV_ANNOTATION
from testbed.testing import wait_for
from testbed.workloads import (
    GPU,
    allocated_devices,
    claim_spec,
    create_claim,
    request,
    unique,
    wait_gone,
    wait_running,
)
from testbed.workloads import pod as pod_manifest

pytestmark = pytest.mark.controlplane
EXAMPLES = Path(__file__).parents[2] / "examples"
PODS = {
    "gpu-pod.yaml": ["gpu-pod"],
    "gpu-partition.yaml": ["partition-pod"],
    "gpu-nic-aligned.yaml": ["aligned-pod"],
    "shared-claim.yaml": ["shared-a", "shared-b"],
}


def _kubectl(binaries: Binaries, control_plane: ClusterState, *args: str) -> str:
    command = [str(binaries.path("kubectl")), f"--kubeconfig={control_plane.kubeconfig}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_example_is_covered() -> None:
    shipped = {p.name for p in EXAMPLES.glob("*.yaml")} - {"fleet.yaml"}
    assert shipped == {*PODS, "gpu-job.yaml", "shared-nic.yaml", "device-maintenance.yaml"}


@pytest.mark.parametrize("example", [*PODS, "gpu-job.yaml"])
def test_the_example_applies_and_runs(
    example: str, kube_binaries: Binaries, control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("example")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        _kubectl(kube_binaries, control_plane, "apply", "-n", namespace, "-f", str(EXAMPLES / example))
        if example == "gpu-job.yaml":
            jobs = k8s.BatchV1Api(kube_api)
            wait_for(
                lambda: (jobs.read_namespaced_job("gpu-job", namespace).status.succeeded or 0) >= 3,
                180,
                "gpu-job to complete 3 pods",
            )
        for pod in PODS.get(example, []):
            wait_for(
                lambda p=pod: core.read_namespaced_pod(p, namespace).status.phase == "Running",
                180,
                f"{example}: pod {pod} to run",
            )
        _kubectl(kube_binaries, control_plane, "delete", "-n", namespace, "-f", str(EXAMPLES / example), "--wait=false")
        for pod in PODS.get(example, []):
            wait_gone(kube_api, namespace, pod)
    finally:
        core.delete_namespace(namespace)


def test_the_device_maintenance_example_evicts_the_pod_on_its_device(
    kube_binaries: Binaries, control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """The admin's way to drain one device (DeviceTaintRule, GA in 1.37), as shipped, its
    pool and device set to where gpu-pod.yaml's GPU landed (as its comment tells the
    reader to do): on a synthetic node as on a real one, the pod is evicted and its claim
    unprepared, the rule's status says so, and once the rule is deleted the device serves
    again."""
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    namespace = unique("example")
    core.create_namespace({"metadata": {"name": namespace}})
    rule = yaml.safe_load((EXAMPLES / "device-maintenance.yaml").read_text())
    try:
        _kubectl(kube_binaries, control_plane, "apply", "-n", namespace, "-f", str(EXAMPLES / "gpu-pod.yaml"))
        wait_for(lambda: core.read_namespaced_pod("gpu-pod", namespace).status.phase == "Running", 180, "gpu-pod")
        [claim] = resource.list_namespaced_resource_claim(namespace).items
        [result] = claim.status.allocation.devices.results
        node = core.read_namespaced_pod("gpu-pod", namespace).spec.node_name
        assert fleet.hardware_claims(node).get(claim.metadata.uid) == [result.device]
        rule["spec"]["deviceSelector"].update(pool=result.pool, device=result.device)
        edited = Path(control_plane.root) / f"{namespace}-rule.yaml"
        edited.write_text(yaml.safe_dump(rule))
        _kubectl(kube_binaries, control_plane, "apply", "-f", str(edited))
        wait_gone(kube_api, namespace, "gpu-pod", timeout_s=60)
        events = [(e.reason, e.message) for e in core.list_namespaced_event(namespace).items]
        assert ("DeviceTaintManagerEviction", "Marking for deletion") in events, events
        wait_for(lambda: claim.metadata.uid not in fleet.hardware_claims(node), 60, "gpu-pod's claim unprepared")

        def completed() -> Any:
            conditions = resource.read_device_taint_rule(rule["metadata"]["name"]).status.conditions or []
            return next((c for c in conditions if c.type == "EvictionInProgress" and c.reason == "Completed"), None)

        done = wait_for(completed, 60, "the rule's status to say the eviction completed")
        assert done.status == "False" and "1 pod evicted" in done.message, done
        _kubectl(kube_binaries, control_plane, "delete", "devicetaintrule", rule["metadata"]["name"])
        # Back in service: a pod whose claim asks for that very device runs.
        index = result.device.split("-")[-1]
        on_it = request("gpu", GPU, f"device.attributes['{GPU}'].index == {index}")
        create_claim(kube_api, namespace, "that-one", claim_spec(on_it))
        core.create_namespaced_pod(
            namespace, pod_manifest("again", {"gpu": {"resourceClaimName": "that-one"}}, node=node)
        )
        wait_running(kube_api, namespace, "again")
        [again] = allocated_devices(kube_api, namespace, "that-one")
        assert (again.pool, again.device) == (result.pool, result.device)
    finally:
        _kubectl(
            kube_binaries, control_plane, "delete", "devicetaintrule", rule["metadata"]["name"], "--ignore-not-found"
        )
        core.delete_namespace(namespace)


def test_the_driver_dev_example_runs_its_driver_and_sanity(control_plane: ClusterState, fleet: Fleet) -> None:
    """examples/driver-dev as a driver developer runs it, on this session's cluster."""
    del fleet  # the example starts a fleet of its own beside this one
    example = Path(__file__).parents[2] / "examples" / "driver-dev"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=example,
        env={**os.environ, "TESTBED_TEST_KUBECONFIG": str(control_plane.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout, proc.stdout[-2000:]  # the real-kubelet node's test too (CI runs as root)


def test_the_shared_nic_example_puts_at_most_two_pods_on_a_port(
    kube_binaries: Binaries, control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """On a node of its own whose profile shares its NIC ports (the session's nodes' ports
    are not shared, so the scheduler cannot put the example's pods there): each pod gets a
    share of 40G, its own slot on the port, and its share is released when it goes."""
    spec = FleetFile.model_validate({"pools": [{"name": unique("sn"), "count": 1, "profile": "shared-nic"}]})
    own = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    own.start()
    [node] = own.host_of
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("example")
    core.create_namespace({"metadata": {"name": namespace}})
    pods = ["nic-share-a", "nic-share-b", "nic-share-c"]
    try:
        _kubectl(kube_binaries, control_plane, "apply", "-n", namespace, "-f", str(EXAMPLES / "shared-nic.yaml"))
        for pod in pods:
            wait_for(lambda p=pod: core.read_namespaced_pod(p, namespace).status.phase == "Running", 180, pod)
        held = own.hardware_claims(node)
        assert len(held) == 3 and sorted(d for devices in held.values() for d in devices) in (
            ["nic-0", "nic-0", "nic-1"],
            ["nic-0", "nic-1", "nic-1"],
        ), held
        slots = set()
        for pod in pods:
            read = core.read_namespaced_pod(pod, namespace)
            assert read.spec.node_name == node
            env = json.loads(read.metadata.annotations[CONTAINER_ENV_ANNOTATION])["main"]
            [share] = [k for k in env if k.endswith("_SHARE")]
            slots.add((share, env[share]))
            assert env[share.replace("_SHARE", "_BANDWIDTH")] == str(40 * 10**9)
        assert len(slots) == 3, f"each pod has a slot of its own on its port: {slots}"
        _kubectl(kube_binaries, control_plane, "delete", "-n", namespace, "-f", str(EXAMPLES / "shared-nic.yaml"))
        for pod in pods:
            wait_gone(kube_api, namespace, pod)
        wait_for(lambda: own.hardware_claims(node) == {}, 60, "the shares released")
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)
