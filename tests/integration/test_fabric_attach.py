"""Devices behind a fabric: the real scheduler waits for the fleet's fabric manager to
attach each allocated device before it binds the pod, and allocates again when an attach
fails (binding conditions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from testbed.config import nodes_dir
from testbed.controlplane.binaries import Binaries
from testbed.controlplane.cluster import ClusterState
from testbed.errors import run_coroutine
from testbed.fleet.fleet import Fleet
from testbed.fleet.spec import FleetFile
from testbed.keys import FABRIC_ATTACH_FAILED, FABRIC_ATTACHED
from testbed.testing import wait_for
from testbed.workloads import claim_spec, create_template, events, pod, request, unique, wait_running

pytestmark = pytest.mark.controlplane

GPU = "gpu.dra-testbed.io"


@pytest.fixture
def fabric_node(control_plane: ClusterState, fleet: Fleet) -> Iterator[tuple[Fleet, str]]:
    """A node of its own with fabric-gpu hardware (the session fleet's nodes have none)."""
    del fleet  # for its DeviceClasses and access policy
    spec = FleetFile.model_validate(
        {"fabric": {"attachSeconds": 0.5}, "pools": [{"name": unique("fg"), "count": 1, "profile": "fabric-gpu"}]}
    )
    own = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    own.start()
    try:
        [node] = own.host_of
        yield own, node
    finally:
        own.stop(remove_nodes=True)


def _claim(api: k8s.ApiClient, namespace: str, pod_name: str) -> dict[str, Any]:
    found: Any = k8s.CoreV1Api(api).read_namespaced_pod(pod_name, namespace)
    [status] = found.status.resource_claim_statuses
    claim: dict[str, Any] = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaims", status.resource_claim_name
    )
    return claim


def _conditions(claim: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        c["type"]: (c["status"], c.get("message", ""))
        for entry in claim["status"].get("devices") or []
        for c in entry.get("conditions") or []
    }


def test_a_pod_is_bound_once_its_gpu_is_attached_and_an_attach_that_fails_is_allocated_again(
    fabric_node: tuple[Fleet, str], kube_api: k8s.ApiClient
) -> None:
    own, node = fabric_node
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("fabric")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        create_template(kube_api, namespace, "gpu", claim_spec(request("gpu", GPU)))
        core.create_namespaced_pod(namespace, pod("first", {"gpu": {"resourceClaimTemplateName": "gpu"}}, node=node))
        running = wait_running(kube_api, namespace, "first", 120)
        assert running.spec.node_name == node
        claim = _claim(kube_api, namespace, "first")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["bindingConditions"] == [FABRIC_ATTACHED], "the scheduler copies them into the allocation"
        status, message = _conditions(claim)[FABRIC_ATTACHED]
        assert status == "True" and f"attached to node {node}" in message
        reasons = [reason for reason, _ in events(kube_api, namespace, "first")]
        assert "BindingConditionsPending" in reasons, "the scheduler waited for the attach before binding"
        assert own.fabric_state() == ({"attached": 1, "failed": 0, "hung": 0, "under way": 0}, {})

        run_coroutine(own.apply_fault(node, "fail-attach", "1"))
        _, faults = _fabric(own)
        assert faults == {node: ["next 1 attaches fail"]}, "what `testbed status` lists"
        core.create_namespaced_pod(namespace, pod("second", {"gpu": {"resourceClaimTemplateName": "gpu"}}, node=node))
        wait_running(kube_api, namespace, "second", 180)
        # The failed attach was written, the scheduler gave that allocation up (clearing the
        # claim's status), allocated again, and the next attach succeeded.
        wait_for(lambda: _fabric(own)[0] == {"attached": 2, "failed": 1, "hung": 0, "under way": 0}, 30, "the figures")
        conditions = _conditions(_claim(kube_api, namespace, "second"))
        assert FABRIC_ATTACH_FAILED not in conditions and conditions[FABRIC_ATTACHED][0] == "True", conditions
        said = " ".join(message for _, message in events(kube_api, namespace, "second"))
        assert "binding" in said.lower(), said

        run_coroutine(own.apply_fault(node, "hang-attach", "2"))
        run_coroutine(own.apply_fault(node, "fail-attach", "1"))
        run_coroutine(own.apply_fault(node, "clear", ""))
        assert _fabric(own)[1] == {}, "`testbed fault NODE clear` takes the attach faults off too"
    finally:
        core.delete_namespace(namespace)


def _fabric(fleet: Fleet) -> tuple[dict[str, Any], dict[str, list[str]]]:
    state = fleet.fabric_state()
    assert state is not None, "a fleet with fabric-attached nodes runs a fabric manager"
    return state


def _cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "testbed.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_the_fabric_scenario_recovers_from_a_hung_and_a_failed_attach_and_reports_the_wait(
    kube_binaries: Binaries, tmp_path: Path
) -> None:
    """`testbed run fabric --up`: a cluster with a 15 s binding timeout, an attach that
    hangs and one that fails; every pod runs, and the report counts the scheduler's waits."""
    env = dict(os.environ, TESTBED_STATE_DIR=str(tmp_path / "state"), TESTBED_KUBE_BIN_DIR=str(kube_binaries.directory))
    run = _cli("run", "fabric", "--up", "--name", "fab", "--output", str(tmp_path / "out"), env=env, timeout=420)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "PASS", report.get("error")
    assert [(f["action"], f["nodes"], f["error"]) for f in report["faults"]] == [
        ("hang-attach", ["node-000"], ""),
        ("fail-attach", ["node-001"], ""),
    ]
    [phase] = report["phases"]
    assert phase["pods_succeeded"] == 4
    outcomes = phase["breakdown"]["scheduler"]["binding_conditions"]["outcomes"]
    assert outcomes.get("timeout") == 1 and outcomes.get("failure") == 1 and outcomes.get("success", 0) >= 4, outcomes
    assert "the scheduler waited in PreBind" in (tmp_path / "out" / "report.md").read_text()
    assert not (tmp_path / "state" / "clusters" / "fab").exists(), "--up took its cluster down"
