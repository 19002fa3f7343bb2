"""A NodeHost that dies is restarted by Ray; its nodes come back from their checkpoints,
their hardware with the faults it had."""

from __future__ import annotations

import sys

import pytest
import ray
from kubernetes import client as k8s

from testbed.config import nodes_dir
from testbed.controlplane.cluster import ClusterState
from testbed.controlplane.processes import process_start_ticks
from testbed.fleet.external import recorded_drivers, recorded_restarts
from testbed.fleet.fleet import Fleet
from testbed.fleet.spec import FleetFile, single_pool
from testbed.testing import wait_for
from testbed.workloads import (
    GPU,
    claim_spec,
    create_template,
    pod,
    request,
    unique,
    wait_gone,
    wait_running,
)

pytestmark = pytest.mark.controlplane


def tainted(kube_api: k8s.ApiClient, node: str) -> set[str]:
    """The GPUs whose devices (it, its partitions) the node's slices show tainted."""
    slices = k8s.ResourceV1Api(kube_api).list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return {"-".join(d.name.split("-")[:2]) for s in slices for d in (s.spec.devices or []) if d.taints}


def test_a_killed_nodehost_comes_back_with_no_leaked_or_double_used_device(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    del fleet  # only for its Ray and DeviceClasses
    own = Fleet(
        single_pool(1, "tiny", nodes_per_host=1, prefix="rs"), control_plane.kubeconfig, nodes_dir(control_plane.root)
    )
    own.start()
    node = "rs-000"
    host = own.host(node)
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("restart")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        on_gpu0 = f"device.attributes['{GPU}'].index == 0"
        create_template(kube_api, namespace, "gpu0", claim_spec(request("gpu", GPU, on_gpu0)))
        core.create_namespaced_pod(namespace, pod("before", {"g": {"resourceClaimTemplateName": "gpu0"}}, node=node))
        wait_running(kube_api, namespace, "before")
        # A pod still initializing, with the other GPU: its sandbox outlives the kubelet.
        on_gpu1 = f"device.attributes['{GPU}'].index == 1"
        create_template(kube_api, namespace, "gpu1", claim_spec(request("gpu", GPU, on_gpu1)))
        starting = pod("starting", {"g": {"resourceClaimTemplateName": "gpu1"}}, node=node)
        starting["spec"]["initContainers"] = [{**starting["spec"]["containers"][0], "name": "wait"}]
        starting["spec"]["initContainers"][0]["command"] = ["sleep", "infinity"]
        core.create_namespaced_pod(namespace, starting)
        init_started = wait_for(lambda: _init_started(core, namespace, "starting"), 60, "the init container to run")
        held = ray.get(host.hardware_claims.remote(node))
        assert sorted(held.values()) == [["gpu-0"], ["gpu-1"]]
        # The pod's GPU runs hot and a prepare failure is pending: faults a crash of the
        # emulator must not mend, nor may they keep the claim from being held again.
        ray.get(host.set_health.remote(node, "gpu-0", False, "too hot"))
        ray.get(host.inject.remote(node, fail_next_prepares=1, message="ECC storm"))
        faults = ["gpu-0 unhealthy: too hot", "next 1 prepares fail: ECC storm"]
        assert ray.get(host.describe.remote())["faults"] == {node: faults}
        old_pid = ray.get(host.pid.remote())

        ray.kill(host, no_restart=False)  # the process dies; Ray starts it again

        def new_pid() -> int | None:
            try:
                pid: int = ray.get(host.pid.remote(), timeout=60)
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
                return None  # Ray is still bringing it back
            return pid if pid != old_pid else None  # the kill is asynchronous

        wait_for(new_pid, 120, "Ray to restart the NodeHost in a new process")
        assert ray.get(host.ready.remote(), timeout=120) == [node]
        assert ray.get(host.hardware_claims.remote(node)) == held, "re-asserted from the checkpoint"
        # The restarted kubelet found the initializing pod's sandbox: its init container runs on.
        assert _init_started(core, namespace, "starting") == init_started
        core.delete_namespaced_pod("starting", namespace)
        wait_gone(kube_api, namespace, "starting")
        held = ray.get(host.hardware_claims.remote(node))
        assert ray.get(host.describe.remote())["faults"] == {node: faults}, "kept, none used up by the repair"
        wait_for(lambda: tainted(kube_api, node) == {"gpu-0"}, 30, "the restarted node's slice to taint gpu-0")
        ray.get(host.set_health.remote(node, "gpu-0", True))
        ray.get(host.inject.remote(node, fail_next_prepares=0))
        wait_for(lambda: not tainted(kube_api, node), 30, "gpu-0 back in service")

        # the freed-up device and the held one: a new pod may only get gpu-0 once the first is gone
        core.create_namespaced_pod(namespace, pod("after", {"g": {"resourceClaimTemplateName": "gpu0"}}, node=node))
        core.delete_namespaced_pod("before", namespace)
        wait_gone(kube_api, namespace, "before")
        wait_running(kube_api, namespace, "after", timeout_s=180)
        claims = ray.get(host.hardware_claims.remote(node))
        assert list(claims.values()) == [["gpu-0"]] and set(claims) != set(held), "no double use"
        core.delete_namespaced_pod("after", namespace)
        wait_gone(kube_api, namespace, "after")
        wait_for(lambda: ray.get(host.hardware_claims.remote(node)) == {}, 120, "nothing held at the end")
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)  # or the scheduler may pick its Node for later tests' pods


def _init_started(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
    """When the pod's (first) init container started, if it runs."""
    statuses = core.read_namespaced_pod(name, namespace).status.init_container_statuses or []
    running = statuses[0].state.running if statuses else None
    return None if running is None else str(running.started_at)


def test_a_command_line_driver_restarted_by_a_new_nodehost_shows_as_a_restart_in_its_pod(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """The NodeHost that takes a node over stops the driver its predecessor left running
    and starts it again: the driver's pod says so as a kubelet says a container was
    restarted (restartCount one up, its end as the last state), as `testbed status`
    counts it."""
    del fleet  # only for its Ray and DeviceClasses
    driver = {
        "name": GPU,
        "command": [sys.executable, "-m", "testbed.drivers.main"],
        "env": {"DRIVERS": GPU, "HARDWARE_PROFILE": "tiny", "HEALTH_PORT": "-1", "METRICS_PORT": "-1"},
    }
    spec = FleetFile.model_validate(
        {"nodesPerHost": 1, "pools": [{"name": "tk", "count": 1, "profile": "tiny", "drivers": [driver]}]}
    )
    own = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    core = k8s.CoreV1Api(kube_api)

    def container() -> k8s.V1ContainerStatus:
        [status] = core.read_namespaced_pod(f"{GPU}-tk-000", "dra-testbed").status.container_statuses
        return status

    try:
        own.start()
        [first] = recorded_drivers(own.nodes_dir)["tk-000"]
        wait_for(lambda: container().state.running, 30, "the driver pod to run")
        host = own.host("tk-000")
        old_pid = ray.get(host.pid.remote())
        ray.kill(host, no_restart=False)

        def new_pid() -> int | None:
            try:
                pid: int = ray.get(host.pid.remote(), timeout=60)
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
                return None
            return pid if pid != old_pid else None

        wait_for(new_pid, 120, "Ray to restart the NodeHost in a new process")
        assert ray.get(host.ready.remote(), timeout=120) == ["tk-000"]
        [second] = recorded_drivers(own.nodes_dir)["tk-000"]
        assert second.pid != first.pid and process_start_ticks(first.pid) is None
        status = wait_for(lambda: (c := container()).restart_count == 1 and c.state.running and c, 60, "the restart")
        # SIGTERM from the new host, or SIGKILL from Ray, which kills a dead worker's children
        assert status.last_state.terminated.exit_code in (137, 143)
        assert recorded_restarts(own.nodes_dir)[GPU].restarts == 1
    finally:
        own.stop(remove_nodes=True)
