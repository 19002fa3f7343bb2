"""A driver the testbed did not write, run from a command on synthetic nodes.

`testbed-driver` stands in for a foreign driver: to the fleet it is just a command. It
gets what a DaemonSet pod gets (its node, its pod's UID, the kubelet's directories, a
token bound to the node's driver pod), serves pods through the fake kubelet, is
restarted when killed, and is stopped when its node is drained.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from testbed import environment
from testbed.config import nodes_dir
from testbed.controlplane.binaries import ensure_bench_binaries
from testbed.controlplane.cluster import ClusterState
from testbed.controlplane.processes import process_start_ticks
from testbed.errors import TestbedError
from testbed.fleet.external import recorded_drivers
from testbed.fleet.fleet import Fleet
from testbed.fleet.spec import FleetFile
from testbed.keys import DRIVER_POD_LABEL
from testbed.kubeapi import ApiError, KubeClient, path_for
from testbed.kubelet.kubelet import CHECKPOINT_FILE as FAKE_KUBELET_CHECKPOINT
from testbed.realnode.node import KUBELET_CHECKPOINT, kubelet_checkpoint_claims, unsupported_reason
from testbed.report import report as reporting
from testbed.scenarios import runner, spec
from testbed.testing import wait_for
from testbed.workloads import (
    GPU,
    NIC,
    claim_spec,
    container_env,
    create_template,
    pod,
    request,
    unique,
    wait_gone,
    wait_running,
)
from tests.integration.upstream_drivers import TEST_DRIVER, e2e_driver_command

pytestmark = pytest.mark.controlplane

STAND_IN: dict[str, Any] = {
    "name": GPU,
    "command": [sys.executable, "-m", "testbed.drivers.main"],
    "env": {"DRIVERS": GPU, "HARDWARE_PROFILE": "tiny", "HEALTH_PORT": "-1", "METRICS_PORT": "-1"},
}


def _one_node_fleet(control_plane: ClusterState, pool: str, driver: dict[str, Any]) -> tuple[Fleet, Path]:
    """A started fleet of one tiny node, ``<pool>-000``, running ``driver`` beside the NIC's."""
    spec = FleetFile.model_validate(
        {"nodesPerHost": 1, "pools": [{"name": pool, "count": 1, "profile": "tiny", "drivers": ["nic", driver]}]}
    )
    where = nodes_dir(control_plane.root)
    own = Fleet(spec, control_plane.kubeconfig, where)
    own.start()
    return own, where


def _namespace(kube_api: k8s.ApiClient, prefix: str) -> tuple[k8s.CoreV1Api, str]:
    core = k8s.CoreV1Api(kube_api)
    namespace = unique(prefix)
    core.create_namespace({"metadata": {"name": namespace}})
    return core, namespace


def _environment_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/environ").read_text().split("\0")
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _driver_container(core: k8s.CoreV1Api, node: str, driver: str = GPU) -> list[k8s.V1ContainerStatus]:
    """Of the command-line driver's own pod on ``node`` (its DaemonSet's)."""
    return list(core.read_namespaced_pod(f"{driver}-{node}", "dra-testbed").status.container_statuses)


def _registrations(call_log: Path) -> int:
    """How often the kubelet told the driver it was registered, from its call log."""
    if not call_log.exists():
        return 0
    calls = [json.loads(line) for line in call_log.read_text().splitlines() if line]
    return sum(1 for c in calls if c["method"].endswith("NotifyRegistrationStatus") and c.get("registered"))


def test_a_driver_that_cannot_run_fails_the_start_in_its_nodes_words(control_plane: ClusterState, fleet: Fleet) -> None:
    """What the NodeHost said, not the actor's traceback Ray wraps it in (`up` refuses a
    command missing here up front; a fleet over several machines learns it here)."""
    del fleet  # only for its Ray and DeviceClasses
    spec = FleetFile.model_validate(
        {"pools": [{"name": "nodrv", "count": 1, "profile": "tiny", "drivers": [{**STAND_IN, "command": ["/no/drv"]}]}]}
    )
    own = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    try:
        with pytest.raises(TestbedError) as failed:
            own.start()
        said = failed.value
        assert said.message == (
            f"a NodeHost failed to start its nodes: node nodrv-000: cannot run driver {GPU}'s command '/no/drv': "
            "No such file or directory"
        )
        assert said.hint == "give the path of an executable (and its arguments)" and "Traceback" not in str(said)
    finally:
        own.stop(remove_nodes=True)


def test_an_external_driver_serves_its_node_and_is_restarted_and_drained(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient, tmp_path: Path
) -> None:
    del fleet  # only for its Ray and DeviceClasses
    call_log = tmp_path / "calls.jsonl"
    driver = {**STAND_IN, "env": {**STAND_IN["env"], "CALL_LOG": str(call_log)}, "terminationGracePeriodSeconds": 12}
    own, where = _one_node_fleet(control_plane, "ext", driver)
    core, namespace = _namespace(kube_api, "ext")
    try:
        [record] = recorded_drivers(where)["ext-000"]
        assert record.alive() and record.name == GPU
        assert record.grace_s == 12, "`testbed down` gives a driver left running its own grace period"
        environment = _environment_of(record.pid)
        driver_pod = core.read_namespaced_pod(f"{GPU}-ext-000", "dra-testbed")
        assert environment["NODE_NAME"] == "ext-000" and environment["POD_UID"] == driver_pod.metadata.uid
        assert environment["POD_NAME"] == driver_pod.metadata.name and driver_pod.spec.node_name == "ext-000"
        built_in = core.read_namespaced_pod("dra-testbed-driver-ext-000", "dra-testbed")
        assert built_in.metadata.uid != driver_pod.metadata.uid, "its own pod, not the built-in NIC driver's"
        assert "token" in Path(environment["KUBECONFIG"]).read_text(), "a token bound to its own driver pod"
        assert len(environment["KUBELET_REGISTRAR_DIRECTORY_PATH"]) + 64 < 105, "room for <driver>-<uid>-reg.sock"
        # The emulated hardware, as files it could read, follows the faults a user injects.
        hardware = Path(environment["HARDWARE_DIR"])
        inventory = json.loads((hardware / "inventory.json").read_text())
        assert {"gpu-0", "nic-0"} <= {d["name"] for d in inventory["devices"]}
        own.set_health("ext-000", "gpu-1", healthy=False, message="XID 79")
        health = {d["name"]: d["health"] for d in json.loads((hardware / "inventory.json").read_text())["devices"]}
        assert health["gpu-1"] == "UNHEALTHY" and health["gpu-0"] == "HEALTHY"
        own.set_health("ext-000", "gpu-1", healthy=True)
        slices = k8s.ResourceV1Api(kube_api).list_resource_slice(field_selector="spec.nodeName=ext-000").items
        assert {s.spec.driver for s in slices} == {GPU, "nic.dra-testbed.io"}

        create_template(kube_api, namespace, "gpu", claim_spec(request("gpu", GPU)))
        claims = {"gpu": {"resourceClaimTemplateName": "gpu"}}
        core.create_namespaced_pod(namespace, pod("first", claims, node="ext-000"))
        wait_running(kube_api, namespace, "first")

        os.kill(record.pid, signal.SIGKILL)
        [again] = wait_for(
            lambda: (r := recorded_drivers(where)["ext-000"]) and r[0].pid != record.pid and r[0].alive() and r,
            60,
            "the NodeHost to start the killed driver again",
        )
        # Registered again first: a pod that came before would be tried again only at its
        # next sync, a minute later, as a real kubelet does.
        wait_for(lambda: _registrations(call_log) >= 2, 60, "the restarted driver to be registered")
        core.create_namespaced_pod(namespace, pod("second", claims, node="ext-000"))
        wait_running(kube_api, namespace, "second")
        # Its pod shows what a kubelet shows of a container killed and started again.
        [status] = wait_for(
            lambda: (c := _driver_container(core, "ext-000")) and c[0].restart_count == 1 and c[0].state.running and c,
            30,
            "the driver pod to show the restart",
        )
        assert (status.last_state.terminated.exit_code, status.last_state.terminated.reason) == (137, "Error")
        # Killed again at once, it is back only after the kubelet's back-off (10 s), which
        # the pod tells of as a kubelet does: the real kubelet's timing, not the NodeHost's.
        killed, killed_pid = time.monotonic(), again.pid
        os.kill(killed_pid, signal.SIGKILL)
        [again] = wait_for(
            lambda: (r := recorded_drivers(where)["ext-000"]) and r[0].pid != killed_pid and r[0].alive() and r,
            60,
            "the driver back after its back-off",
        )
        assert time.monotonic() - killed >= 9, "started again within the kubelet's 10 s back-off"
        events = core.list_namespaced_event("dra-testbed").items
        reasons = [e.reason for e in events if e.involved_object.name == f"{GPU}-ext-000"]
        assert "BackOff" in reasons, reasons
        log = Path(again.log).read_text()
        assert log.count("starting:") == 3 and "serving gpu.dra-testbed.io" in log
        core.delete_namespaced_pod("first", namespace)
        core.delete_namespaced_pod("second", namespace)
        wait_for(lambda: not core.list_namespaced_pod(namespace).items, 120, "the pods to be gone")
        checkpoint = json.loads(
            next(where.glob("ext-000/kubelet/plugins/gpu.dra-testbed.io/checkpoint.json")).read_text()
        )
        assert checkpoint["claims"] == {}, "the external driver unprepared both claims"
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)
    assert process_start_ticks(again.pid) is None, "draining the node stopped its driver"
    assert "ext-000" not in recorded_drivers(where)


def test_a_driver_whose_socket_broke_is_restarted_by_its_liveness_probe(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient, tmp_path: Path
) -> None:
    """The good practice's liveness probe at work on a fleet: the driver's gRPC health
    endpoint, on a port of this node's own, stops answering SERVING once its DRA socket is
    gone; the kubelet's probe fails twice, kills it (Events on the driver pod say so) and
    starts it again, and the node serves claims once more."""
    del fleet  # only for its Ray and DeviceClasses
    driver = {
        **STAND_IN,
        "env": {**STAND_IN["env"], "HEALTH_PORT": "$(LIVENESS_PORT)", "CALL_LOG": str(tmp_path / "calls.jsonl")},
        # A start slower than the delay would fail probes too, as on a real node.
        "livenessProbe": {"grpc": {}, "initialDelaySeconds": 5, "periodSeconds": 1, "failureThreshold": 2},
    }
    own, where = _one_node_fleet(control_plane, "live", driver)
    core, namespace = _namespace(kube_api, "live")
    try:
        [record] = recorded_drivers(where)["live-000"]
        environment = _environment_of(record.pid)
        assert environment["HEALTH_PORT"] == environment["LIVENESS_PORT"] != "51515"
        [container] = core.read_namespaced_pod(f"{GPU}-live-000", "dra-testbed").spec.containers
        probe = container.liveness_probe  # what `kubectl describe` shows is what the kubelet probes
        assert probe.grpc.port == int(environment["LIVENESS_PORT"]) and probe.failure_threshold == 2
        [dra_socket] = where.glob("live-000/kubelet/plugins/gpu.dra-testbed.io/dra-*.sock")
        dra_socket.rename(dra_socket.with_name("broken-aside"))
        [again] = wait_for(
            lambda: (r := recorded_drivers(where)["live-000"]) and r[0].pid != record.pid and r[0].alive() and r,
            60,
            "the liveness probe to have the driver killed and started again",
        )
        assert process_start_ticks(record.pid) is None

        def told(reason: str) -> list[k8s.CoreV1Event]:
            selector = f"involvedObject.name={GPU}-live-000,reason={reason}"
            return list(core.list_namespaced_event("dra-testbed", field_selector=selector).items)

        [killing] = wait_for(lambda: told("Killing"), 30, "the Killing Event on the driver pod")
        assert killing.message == "Container driver failed liveness probe, will be restarted"
        assert killing.involved_object.field_path == "spec.containers{driver}"
        [unhealthy] = [e for e in told("Unhealthy") if "NOT_SERVING" in e.message]
        assert unhealthy.type == "Warning" and unhealthy.count == 2
        assert unhealthy.message.startswith("Liveness probe failed: 127.0.0.1:")

        # The new instance made its socket anew, registered, and serves a claim.
        wait_for(lambda: _registrations(tmp_path / "calls.jsonl") >= 2, 60, "the restarted driver to be registered")
        create_template(kube_api, namespace, "gpu", claim_spec(request("gpu", GPU)))
        core.create_namespaced_pod(
            namespace, pod("after", {"gpu": {"resourceClaimTemplateName": "gpu"}}, node="live-000")
        )
        wait_running(kube_api, namespace, "after")
        assert again.alive(), "not killed again: its probe passes"
        [status] = _driver_container(core, "live-000")
        assert status.restart_count == 1 and status.last_state.terminated is not None and status.ready
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)


def test_a_driver_rolled_out_with_surge_is_never_away_and_without_it_is(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """The good practice's seamless upgrade, as a DaemonSet's rolling update does it: with
    maxSurge the new instance (a driver pod of its own, its sockets named after it)
    registers beside the old one before that stops, so the kubelet always has one to
    call; with maxUnavailable it has none for a while. Either way the newest instance
    unprepares what an older one prepared; the replaced instance's pod goes, the built-in
    drivers' pod stays."""
    del fleet  # only for its Ray and DeviceClasses
    own, where = _one_node_fleet(control_plane, "roll", STAND_IN)
    core, namespace = _namespace(kube_api, "roll")
    try:
        [first] = recorded_drivers(where)["roll-000"]
        create_template(kube_api, namespace, "gpu", claim_spec(request("gpu", GPU)))
        core.create_namespaced_pod(
            namespace, pod("before", {"gpu": {"resourceClaimTemplateName": "gpu"}}, node="roll-000")
        )
        wait_running(kube_api, namespace, "before")

        newer = [sys.executable, "-X", "utf8", "-m", "testbed.drivers.main"]
        [surged] = own.rollout(GPU, newer)
        assert (surged["node"], surged["generation"], surged["unavailable_s"]) == ("roll-000", 1, 0.0)
        [second] = recorded_drivers(where)["roll-000"]
        assert second.pid != first.pid and second.command == newer and process_start_ticks(first.pid) is None
        assert own.spec.pools[0].external_drivers[0].command == newer
        own.scale("roll", 2)  # a node added later runs the new version, of its generation
        [added] = recorded_drivers(where)["roll-001"]
        assert added.command == newer
        assert {
            p.metadata.name for p in core.list_namespaced_pod("dra-testbed").items if "roll-001" in p.metadata.name
        } == {
            "dra-testbed-driver-roll-001",
            f"{GPU}-roll-001-1",
        }
        own.scale("roll", 1)

        [stopped_first] = own.rollout(GPU, max_surge=0, max_unavailable=1)
        assert stopped_first["generation"] == 2 and stopped_first["unavailable_s"] > 0
        pods = {p.metadata.name for p in core.list_namespaced_pod("dra-testbed").items if "roll-000" in p.metadata.name}
        # generations 0 and 1 deleted; the built-in NIC driver's pod is another one
        assert pods == {"dra-testbed-driver-roll-000", f"{GPU}-roll-000-2"}

        # A new version that never comes up stops the rollout; with surge the old one serves on.
        [serving] = recorded_drivers(where)["roll-000"]
        with pytest.raises(TestbedError, match=r"rollout of gpu\.dra-testbed\.io stopped after 0 of 1 nodes"):
            own.rollout(GPU, [sys.executable, "-c", "raise SystemExit(3)"])
        assert [r.pid for r in recorded_drivers(where)["roll-000"]] == [serving.pid] and serving.alive()
        assert {  # the surge pod that never got ready is gone, as a DaemonSet's would be
            p.metadata.name for p in core.list_namespaced_pod("dra-testbed").items if "roll-000" in p.metadata.name
        } == pods

        core.delete_namespaced_pod("before", namespace)
        wait_for(lambda: not core.list_namespaced_pod(namespace).items, 60, "the pod to be gone")
        checkpoint = where / "roll-000/kubelet/plugins/gpu.dra-testbed.io/checkpoint.json"
        assert json.loads(checkpoint.read_text())["claims"] == {}, "the newest instance unprepared the claim"
        core.create_namespaced_pod(
            namespace, pod("after", {"gpu": {"resourceClaimTemplateName": "gpu"}}, node="roll-000")
        )
        wait_running(kube_api, namespace, "after")
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)
    assert not any("roll-000" in p.metadata.name for p in core.list_namespaced_pod("dra-testbed").items)


def test_a_nodes_command_line_drivers_each_run_in_a_pod_of_their_own(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """As two DaemonSets would run them: a node's GPU and NIC command-line drivers are two
    pods (two UIDs, two tokens). Rolling one out replaces its pod alone; a surge of the
    other that fails deletes its new pod and leaves everything else as it was."""
    del fleet  # only for its Ray and DeviceClasses
    nic = {**STAND_IN, "name": NIC, "env": {**STAND_IN["env"], "DRIVERS": NIC}}
    spec = FleetFile.model_validate(
        {"nodesPerHost": 1, "pools": [{"name": "pair", "count": 1, "profile": "tiny", "drivers": [STAND_IN, nic]}]}
    )
    where = nodes_dir(control_plane.root)
    own = Fleet(spec, control_plane.kubeconfig, where)
    core = k8s.CoreV1Api(kube_api)

    def driver_pods() -> dict[str, str]:
        items = core.list_namespaced_pod("dra-testbed", label_selector=f"{DRIVER_POD_LABEL}=pair-000").items
        return {p.metadata.name: p.metadata.uid for p in items if not p.metadata.deletion_timestamp}

    def pod_uids() -> dict[str, str]:
        return {r.name: _environment_of(r.pid)["POD_UID"] for r in recorded_drivers(where)["pair-000"]}

    try:
        own.start()
        first = driver_pods()
        assert set(first) == {f"{GPU}-pair-000", f"{NIC}-pair-000"}
        assert pod_uids() == {GPU: first[f"{GPU}-pair-000"], NIC: first[f"{NIC}-pair-000"]}
        [rolled] = own.rollout(NIC)
        assert rolled["generation"] == 1
        wait_for(lambda: len(driver_pods()) == 2, 30, "the old NIC pod gone")
        after = driver_pods()
        assert set(after) == {f"{GPU}-pair-000", f"{NIC}-pair-000-1"} and pod_uids()[NIC] == after[f"{NIC}-pair-000-1"]
        with pytest.raises(TestbedError, match=r"rollout of gpu\.dra-testbed\.io stopped after 0 of 1 nodes"):
            own.rollout(GPU, [sys.executable, "-c", "raise SystemExit(3)"])
        assert wait_for(lambda: driver_pods() == after or None, 30, "the failed surge's pod gone")
        assert pod_uids() == {GPU: after[f"{GPU}-pair-000"], NIC: after[f"{NIC}-pair-000-1"]}
    finally:
        own.stop(remove_nodes=True)


HELPER = "gpu.helper.dra-testbed.io"


def _helper_node(control_plane: ClusterState, kube_api: k8s.ApiClient, prefix: str, kubelet: str) -> tuple[Fleet, str]:
    """A fleet (not started) of one tiny node whose only driver is one on the upstream
    kubeletplugin helper, under its own name and DeviceClass (deleted by the caller). It
    writes its CDI specs as drivers on the CDI library do: YAML, and a common device
    every claim names (HELPER_NODE_NAME)."""
    helper = str(ensure_bench_binaries().path("testbed-helperdriver"))
    driver = {"name": HELPER, "command": [helper, "--driver", HELPER, "--gpus", "2", "--cdi-library"]}
    pool = unique(prefix)
    spec = FleetFile.model_validate(
        {
            "nodesPerHost": 1,
            "pools": [{"name": pool, "count": 1, "profile": "tiny", "kubelet": kubelet, "drivers": [driver]}],
        }
    )
    every_device: Any = {"cel": {"expression": f'device.driver == "{HELPER}"'}}
    k8s.ResourceV1Api(kube_api).create_device_class(
        {"metadata": {"name": HELPER}, "spec": {"selectors": [every_device]}}
    )
    return Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root)), f"{pool}-000"


def test_a_driver_on_the_upstream_kubeletplugin_helper_serves_a_synthetic_node(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """The fake kubelet with a driver it did not grow up with: k8s.io/dynamic-resource-
    allocation's helper registers it (sockets named after its pod's UID), publishes its
    GPUs through the upstream ResourceSlice controller, and reads each claim itself. A
    pod using one runs with the device's environment, and going, has its claim
    unprepared (the driver's CDI spec gone)."""
    del fleet  # only for its Ray
    own, node = _helper_node(control_plane, kube_api, "hp", "fake")
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    namespace = unique("hp")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        own.start()
        slices = wait_for(  # published once registered: the node's start waits for the registration
            lambda: resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items, 30, "its slices"
        )
        assert [len(s.spec.devices) for s in slices] == [2] and slices[0].spec.driver == HELPER
        sockets = [p.name for p in (own.nodes_dir / node / "kubelet" / "plugins_registry").iterdir()]
        driver_pod = core.read_namespaced_pod(f"{HELPER}-{node}", "dra-testbed")
        assert sockets == [f"{HELPER}-{driver_pod.metadata.uid}-reg.sock"], "the helper's rolling-update name"

        create_template(kube_api, namespace, "gpu", claim_spec(request("gpu", HELPER)))
        core.create_namespaced_pod(namespace, pod("app", {"gpu": {"resourceClaimTemplateName": "gpu"}}, node=node))
        running = wait_running(kube_api, namespace, "app")
        environment = container_env(running)["main"]
        assert [v for k, v in environment.items() if k.startswith("GPU_DEVICE_")] in (["gpu-0"], ["gpu-1"]), environment
        assert environment["HELPER_NODE_NAME"] == node, "the common device of its YAML spec"
        specs = own.nodes_dir / node / "cdi"
        claim_specs = [p for p in specs.glob(f"{HELPER}-*.yaml") if p.name != f"{HELPER}-common.yaml"]
        assert len(claim_specs) == 1
        core.delete_namespaced_pod("app", namespace)
        wait_gone(kube_api, namespace, "app")
        assert not claim_specs[0].exists(), "unprepared before the pod was let go"
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)
        resource.delete_device_class(HELPER)


@pytest.mark.skipif(bool(unsupported_reason()), reason=unsupported_reason() or "")
def test_a_driver_on_the_upstream_helper_serves_a_real_kubelet_node_too(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """The reference for a developer's driver: the REAL kubelet v1.37 registers it (its
    sockets named after its own pod's UID, which fit the kubelet's /var/lib/kubelet as
    on a real node), runs its pod, and prepares a pod's claim through it. Rolled out
    with surge, the new instance (a pod of its own) unprepares that claim, and a surge
    that never registers leaves it serving; the node's drain stops it."""
    del fleet  # only for its Ray
    own, node = _helper_node(control_plane, kube_api, "rh", "real")
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    namespace = unique("rh")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        own.start()  # waits for the real kubelet to have connected to the driver
        [record] = recorded_drivers(own.nodes_dir)[node]
        driver_pod = core.read_namespaced_pod(f"{HELPER}-{node}", "dra-testbed")
        assert _environment_of(record.pid)["POD_UID"] == driver_pod.metadata.uid
        sockets = [p.name for p in (own.nodes_dir / node / "kubelet" / "plugins_registry").iterdir()]
        assert sockets == [f"{HELPER}-{driver_pod.metadata.uid}-reg.sock"]
        wait_for(
            lambda: core.read_namespaced_pod(driver_pod.metadata.name, "dra-testbed").status.phase == "Running",
            60,
            "the real kubelet to run the driver's pod",
        )
        others = [p.metadata.name for p in core.list_namespaced_pod("dra-testbed").items]
        assert f"dra-testbed-driver-{node}" not in others, "no built-in drivers: no pod for them"

        create_template(kube_api, namespace, "gpu", claim_spec(request("gpu", HELPER)))
        core.create_namespaced_pod(namespace, pod("app", {"gpu": {"resourceClaimTemplateName": "gpu"}}, node=node))
        running = wait_running(kube_api, namespace, "app")
        lines = (own.nodes_dir / node / "containers.jsonl").read_text().splitlines()
        given = [json.loads(line) for line in lines]
        [main] = [r for r in given if r["podUID"] == running.metadata.uid and r["container"] == "main"]
        devices = [v for k, v in main["env"].items() if k.startswith("GPU_DEVICE_")]
        assert devices in (["gpu-0"], ["gpu-1"]), main  # the CDI edits the helper wrote, applied by the runtime
        assert main["env"]["HELPER_NODE_NAME"] == node, "the common device of its YAML spec"

        # Killed, it is started again when the real kubelet starts its pod's container again,
        # which it counts in the pod's status: at once the first time, after its back-off
        # (10 s) the second.
        def restarts() -> int:
            return int(_driver_container(core, node, HELPER)[0].restart_count)

        away = []
        for count in (1, 2):
            killed = time.monotonic()
            os.kill(record.pid, signal.SIGKILL)
            old = record.pid
            wait_for(lambda: recorded_drivers(own.nodes_dir)[node][0].pid != old, 60, "the driver back")  # noqa: B023
            away.append(time.monotonic() - killed)
            [record] = recorded_drivers(own.nodes_dir)[node]
            wait_for(lambda: restarts() == count, 60, "the real kubelet to count the driver's restart")  # noqa: B023
            [container] = _driver_container(core, node, HELPER)
            assert container.last_state.terminated.exit_code == 137, container
        assert away[0] < 5 and away[1] >= 8, f"away {away} s: at once, then after the kubelet's 10 s back-off"

        [rolled] = own.rollout(HELPER)
        assert (rolled["node"], rolled["generation"], rolled["unavailable_s"]) == (node, 1, 0.0)
        [second] = recorded_drivers(own.nodes_dir)[node]
        assert second.pid != record.pid and process_start_ticks(record.pid) is None
        ours = {p.metadata.name for p in core.list_namespaced_pod("dra-testbed").items if node in p.metadata.name}
        assert ours == {f"{HELPER}-{node}-1"}, "the old instance's pod deleted"
        core.delete_namespaced_pod("app", namespace)
        specs = own.nodes_dir / node / "cdi"
        wait_for(lambda: not list(specs.glob(f"{HELPER}-*.json")), 60, "the new instance to unprepare the claim")
        with pytest.raises(TestbedError, match=rf"rollout of {re.escape(HELPER)} stopped after 0 of 1 nodes"):
            own.rollout(HELPER, [sys.executable, "-c", "raise SystemExit(3)"])
        assert [r.pid for r in recorded_drivers(own.nodes_dir)[node]] == [second.pid], "the old one serves on"
        record = second
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)
        resource.delete_device_class(HELPER)
    assert process_start_ticks(record.pid) is None, "stopped with its node"


def test_a_scenario_rolls_a_driver_out_while_its_pods_come_and_go(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """The seamless-upgrade practice as a scenario: a `rollout` fault rolls the driver out
    (maxSurge 1) on both nodes while Jobs using its devices start and end; every pod runs,
    the SLO holds, and the report says what the rollout did. The driver is one on the
    upstream kubeletplugin helper, under a name of its own, so only these nodes serve
    the phase."""
    del fleet  # only for its Ray
    name = "gpu.rollout.dra-testbed.io"
    helper = str(ensure_bench_binaries().path("testbed-helperdriver"))
    driver = {"name": name, "command": [helper, "--driver", name, "--gpus", "2"]}
    pool = unique("sr")
    fleet_spec = FleetFile.model_validate(
        {"nodesPerHost": 2, "pools": [{"name": pool, "count": 2, "profile": "tiny", "drivers": [driver]}]}
    )
    own = Fleet(fleet_spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    resource = k8s.ResourceV1Api(kube_api)
    every_device: Any = {"cel": {"expression": f'device.driver == "{name}"'}}
    resource.create_device_class({"metadata": {"name": name}, "spec": {"selectors": [every_device]}})
    scenario = spec.Scenario.model_validate(
        {
            "name": "rolling",
            "phases": [
                {
                    "name": "jobs",
                    "jobs": 12,
                    "qps": 2,
                    "runSeconds": 1,
                    "wait": "complete",
                    "requests": [{"name": "gpu", "deviceClass": name}],
                }
            ],
            "faults": [{"atSeconds": 2, "action": "rollout", "driver": name}],
        }
    )

    async def run() -> runner.RunData:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        endpoints = runner.Endpoints.local(control_plane.ports, own.metrics_texts)
        try:
            return await runner.Runner(client, scenario, endpoints, injector=environment.fault_injector(own)).run()
        finally:
            await client.close()

    try:
        own.start()
        report = reporting.build(asyncio.run(run()), {"checkpoint_entries": 0, "cdi_specs": 0}, {})
        [rollout] = report["faults"]
        assert rollout["error"] == "" and rollout["nodes"] == [f"{pool}-000", f"{pool}-001"]
        assert rollout["outcome"].startswith(f"{name} rolled out on 2 nodes (driver pod generation 1)")
        assert "without an instance to call: p50 0.00 s, max 0.00 s" in rollout["outcome"]
        [phase] = report["phases"]
        assert (phase["pods_succeeded"], phase["pods_failed"], phase["slo_met"]) == (12, 0, True)
        assert {r.command[0] for records in recorded_drivers(own.nodes_dir).values() for r in records} == {helper}
        assert f"| rollout {name} | {pool}-000, {pool}-001 | {name} rolled out" in reporting.markdown(report)
    finally:
        own.stop(remove_nodes=True)
        resource.delete_device_class(name)


RESOURCE_V1_TEMPLATES = ("resource.k8s.io/v1", "resourceclaimtemplates")


def as_admin(kubeconfig: Path, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """With the testbed's own client, whose JSON is compact: a claim's opaque parameters
    sent with spaces (as the Python kubernetes client sends them) make v1.37 refuse every
    later status write from a JSON client (kubeapi.status_refusal_cause)."""

    async def call() -> dict[str, Any]:
        client = KubeClient.from_kubeconfig(kubeconfig)
        try:
            return await client.request(method, path, body)
        finally:
            await client.close()

    return asyncio.run(call())


def write_device_status(nodes_dir: Path, node: str, claim: Any) -> dict[str, Any]:
    """As the test driver on ``node`` (its pod's token): the claim's device status."""
    [result] = claim.status.allocation.devices.results
    entry = {"driver": result.driver, "pool": result.pool, "device": result.device}
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "Up",
        "message": "",
        "lastTransitionTime": "2026-11-29T00:00:00Z",
    }
    path = path_for("resource.k8s.io/v1", "resourceclaims", claim.metadata.name, claim.metadata.namespace, "status")

    async def write() -> dict[str, Any]:
        driver = KubeClient.from_kubeconfig(nodes_dir / node / "private" / f"{TEST_DRIVER}-{node}.kubeconfig")
        try:
            return await driver.patch(path, {"status": {"devices": [{**entry, "conditions": [condition]}]}})
        finally:
            await driver.close()

    return asyncio.run(write())


def claim_of(kube_api: k8s.ApiClient, namespace: str, pod_name: str) -> Any:
    """The claim generated for a pod's only resource claim."""
    status = k8s.CoreV1Api(kube_api).read_namespaced_pod(pod_name, namespace).status.resource_claim_statuses[0]
    return k8s.ResourceV1Api(kube_api).read_namespaced_resource_claim(status.resource_claim_name, namespace)


@pytest.mark.skipif(bool(unsupported_reason()), reason=unsupported_reason() or "")
def test_the_kubernetes_projects_own_test_driver_serves_real_and_fake_kubelet_nodes_alike(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """A driver written elsewhere, unmodified (k8s.io/kubernetes/test/e2e/dra/test-driver),
    on a fake-kubelet node and a real-kubelet one: it starts (given its plugin directory,
    as its DaemonSet's mount gives it), publishes, and a pod's claim, with its opaque
    config, reaches the container's environment alike on both, unprepared when the pod
    goes. Its socket names carry no pod UID, so a surge rollout cannot work: the old
    instance, stopping, removes the new one's sockets. The rollout says so and how to get
    out, where it used to report success over nodes whose kubelets had no driver left."""
    del fleet  # only for its Ray
    driver = {"name": TEST_DRIVER, "command": e2e_driver_command()}
    fake, real = unique("tf"), unique("tr")
    spec = FleetFile.model_validate(
        {
            "nodesPerHost": 2,
            "pools": [
                {"name": pool, "count": 1, "profile": "tiny", "kubelet": kubelet, "drivers": [driver]}
                for pool, kubelet in ((fake, "fake"), (real, "real"))
            ],
        }
    )
    every_device: Any = {"cel": {"expression": f'device.driver == "{TEST_DRIVER}"'}}
    resource = k8s.ResourceV1Api(kube_api)
    resource.create_device_class({"metadata": {"name": TEST_DRIVER}, "spec": {"selectors": [every_device]}})
    own = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    core, namespace = _namespace(kube_api, "td")
    nodes = {"fake": f"{fake}-000", "real": f"{real}-000"}
    try:
        own.start()
        for node in nodes.values():  # published once registered: the node's start waits for the registration
            [published] = wait_for(
                lambda: resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items,  # noqa: B023
                30,
                f"{node}'s slices",
            )
            assert [d.name for d in published.spec.devices] == [f"device-{i:02d}" for i in range(4)]
        config = [{"opaque": {"driver": TEST_DRIVER, "parameters": {"a": "b"}}}]
        template = {
            "metadata": {"name": "dev"},
            "spec": {"spec": claim_spec(request("dev", TEST_DRIVER), config=config)},
        }
        as_admin(control_plane.kubeconfig, "POST", path_for(*RESOURCE_V1_TEMPLATES, namespace=namespace), template)

        def run_pods(name: str) -> dict[str, dict[str, str]]:
            """Each node's pod ``name`` running, and what its container was given."""
            given = {}
            for kind, node in nodes.items():
                claims = {"dev": {"resourceClaimTemplateName": "dev"}}
                core.create_namespaced_pod(namespace, pod(f"{name}-{kind}", claims, node=node))
                running = wait_running(kube_api, namespace, f"{name}-{kind}")
                if kind == "fake":
                    given[kind] = container_env(running)["main"]
                else:
                    lines = (own.nodes_dir / node / "containers.jsonl").read_text().splitlines()
                    records = [json.loads(line) for line in lines]
                    [main] = [r for r in records if r["podUID"] == running.metadata.uid and r["container"] == "main"]
                    given[kind] = main["env"]
            return given

        for kind, env in run_pods("app").items():
            ours = {k: v for k, v in env.items() if k.startswith(("user_", "claim_"))}
            assert ours.pop("user_a") == "b", (kind, env)  # the claim's opaque config, through the CDI spec
            [(key, value)] = ours.items()
            assert key.endswith("_dev") and value == "true", (kind, env)
        # As its own chart would let it, the driver may write the device status of the
        # claims allocated on its node (status.devices: a NIC's address, say), under its
        # own name only: deploy/'s role names the built-in drivers alone.
        own_claim, other_claim = (claim_of(kube_api, namespace, f"app-{kind}") for kind in ("fake", "real"))
        written = write_device_status(own.nodes_dir, nodes["fake"], own_claim)
        assert written["status"]["devices"][0]["conditions"][0]["reason"] == "Up"
        with pytest.raises(ApiError, match="cannot arbitrary-node:patch"):  # another node's claim
            write_device_status(own.nodes_dir, nodes["fake"], other_claim)

        with pytest.raises(TestbedError, match="removed the sockets the new one had made at the same paths") as caught:
            own.rollout(TEST_DRIVER)
        assert "--max-unavailable 1" in (caught.value.hint or "")
        rolled = own.rollout(TEST_DRIVER, max_surge=0, max_unavailable=2)
        assert sorted(r["node"] for r in rolled) == sorted(nodes.values())
        for kind in nodes:
            core.delete_namespaced_pod(f"app-{kind}", namespace)
        checkpoints = {
            "fake": own.nodes_dir / nodes["fake"] / "kubelet" / FAKE_KUBELET_CHECKPOINT,
            "real": own.nodes_dir / nodes["real"] / "kubelet" / KUBELET_CHECKPOINT,
        }
        wait_for(  # both kubelets unprepared the claims through the new instances
            lambda: (
                not json.loads(checkpoints["fake"].read_text()) and not kubelet_checkpoint_claims(checkpoints["real"])
            ),
            60,
            "the kubelets to unprepare the pods' claims",
        )
        # The test driver keeps what it prepared in memory: the new instance, asked to
        # unprepare a claim it never saw, has nothing to do, and the first one's CDI specs
        # stay. Alike on both nodes; the drain below waits for the kubelet, not for them.
        for node in nodes.values():
            assert len(list((own.nodes_dir / node / "cdi").glob(f"{TEST_DRIVER}-*.json"))) == 1
        assert set(run_pods("again")) == {"fake", "real"}, "served by the instances rolled out without surge"
    finally:
        core.delete_namespace(namespace)
        own.stop(remove_nodes=True)
        resource.delete_device_class(TEST_DRIVER)
