"""Synthetic nodes run under the identities real nodes have, so the Node authorizer,
NodeRestriction and deploy/'s RBAC and own-node admission policy judge them."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client as k8s

from testbed.config import ControlPlaneConfig
from testbed.controlplane import cluster
from testbed.controlplane.binaries import Binaries
from testbed.fleet.fleet import Fleet
from testbed.fleet.identity import (
    DRIVER_NAMESPACE,
    DRIVER_SERVICE_ACCOUNT,
    DriverPod,
    NodeAuthority,
    bind_driver_token,
)
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.realnode.node import recorded_driver_restarts, recorded_processes, unsupported_reason
from testbed.testing import wait_for
from testbed.workloads import GPU, NIC, claim_spec, create_template, events, pod, request, unique, wait_running

pytestmark = pytest.mark.controlplane

SLICES = path_for("resource.k8s.io/v1", "resourceslices")


def _slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"identity-probe-{node}-"},
        "spec": {
            "driver": "gpu.dra-testbed.io",
            "nodeName": node,
            "pool": {"name": f"identity-probe-{node}", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def test_each_fleet_node_has_a_driver_pod_its_kubelet_runs(control_plane: cluster.ClusterState, fleet: Fleet) -> None:
    async def phases() -> dict[str, str]:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        try:
            found = {}
            for node in fleet.host_of:
                pod = await client.get(path_for("v1", "pods", DriverPod(node).name, DRIVER_NAMESPACE))
                found[node] = pod.get("status", {}).get("phase", "")
            return found
        finally:
            await client.close()

    wait_for(lambda: set(asyncio.run(phases()).values()) == {"Running"}, 60, "every driver pod Running")


def test_a_node_may_change_its_own_node_only(control_plane: cluster.ClusterState, fleet: Fleet) -> None:
    authority = NodeAuthority.for_cluster(control_plane.kubeconfig)
    assert authority is not None
    mine, other = sorted(fleet.host_of)[:2]
    label = {"metadata": {"labels": {"dra-testbed.io/identity-probe": "x"}}}

    async def attempt(node: str) -> int:
        kubelet = authority.kubelet_client(mine)
        try:
            await kubelet.patch(path_for("v1", "nodes", node), label)
            return 200
        except ApiError as exc:
            return exc.status
        finally:
            await kubelet.close()

    assert asyncio.run(attempt(other)) == 403  # the Node authorizer / NodeRestriction refuse
    assert asyncio.run(attempt(mine)) == 200


def test_a_nodes_driver_may_write_its_own_nodes_slices_only(control_plane: cluster.ClusterState, fleet: Fleet) -> None:
    authority = NodeAuthority.for_cluster(control_plane.kubeconfig)
    assert authority is not None
    mine, other = sorted(fleet.host_of)[:2]

    async def attempt() -> tuple[int, str, int]:
        admin = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        drivers = authority.driver_client()
        try:
            await bind_driver_token(admin, drivers, mine)
            # A policy just installed takes effect within seconds (the API server loads it
            # in the background): until then a write may pass, and is undone.
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                try:
                    sneaked = await drivers.create(SLICES, _slice(other))
                    refused, message = 200, ""
                except ApiError as exc:
                    refused, message = exc.status, exc.message
                    break
                await admin.delete(path_for("resource.k8s.io/v1", "resourceslices", sneaked["metadata"]["name"]))
                if asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.5)
            created = await drivers.create(SLICES, _slice(mine))
            await drivers.delete(path_for("resource.k8s.io/v1", "resourceslices", created["metadata"]["name"]))
            # Not the driver's business: pods.
            try:
                await drivers.get(path_for("v1", "pods", namespace=DRIVER_NAMESPACE))
                pods = 200
            except ApiError as exc:
                pods = exc.status
            return refused, message, pods
        finally:
            await drivers.close()
            await admin.close()

    refused, message, pods = asyncio.run(attempt())
    assert refused in (403, 422), message
    assert f"a driver on node {mine} may only write its own node's ResourceSlices" in message
    assert pods == 403


def test_a_nodes_drivers_read_claims_under_their_own_identity(
    control_plane: cluster.ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """Without `get resourceclaims` in deploy/'s driver role, a fleet node's driver cannot
    prepare a claim; given it back, the kubelet's retry runs the pod."""
    rbac, core = k8s.RbacAuthorizationV1Api(kube_api), k8s.CoreV1Api(kube_api)
    role: Any = rbac.read_cluster_role(DRIVER_SERVICE_ACCOUNT)
    original = kube_api.sanitize_for_serialization(role)["rules"]
    narrowed = [r for r in original if "resourceclaims" not in (r.get("resources") or [])]
    assert len(narrowed) < len(original)
    namespace = unique("identity")
    body: Any = {"metadata": {"name": namespace}}
    core.create_namespace(body)
    try:
        rbac.patch_cluster_role(DRIVER_SERVICE_ACCOUNT, {"rules": narrowed})
        create_template(kube_api, namespace, "one-gpu", claim_spec(request("gpu", GPU)))
        node = sorted(fleet.host_of)[0]
        worker: Any = pod("worker", {"gpu": {"resourceClaimTemplateName": "one-gpu"}}, node=node)
        core.create_namespaced_pod(namespace, worker)

        def refused() -> str | None:
            for reason, message in events(kube_api, namespace, "worker"):
                if reason == "FailedPrepareDynamicResources" and "forbidden" in message.lower():
                    return message
            return None

        message = wait_for(refused, 60, "the driver's claim read to be refused")
        assert f"system:serviceaccount:{DRIVER_NAMESPACE}:{DRIVER_SERVICE_ACCOUNT}" in message
    finally:
        rbac.patch_cluster_role(DRIVER_SERVICE_ACCOUNT, {"rules": original})
    try:
        # A kubelet tries a failed prepare again at the pod's next sync (60-90 s), or at
        # once when the pod changes beyond its status, as this annotation does.
        core.patch_namespaced_pod("worker", namespace, {"metadata": {"annotations": {"example.com/retry": "now"}}})
        wait_running(kube_api, namespace, "worker", timeout_s=60)
    finally:
        core.delete_namespace(namespace)


def test_pods_with_claims_start_at_the_first_attempt_under_node_identities(
    control_plane: cluster.ClusterState, kube_api: k8s.ApiClient, fleet: Fleet
) -> None:
    """A kubelet reads a bound pod's claims as system:node:<name>, which the node
    authorizer allows once it has linked the pod's claims to the node, which can lag the
    binding when pods come in a burst. The real kubelet mounts the pod's volumes first; a
    kubelet that asked at once and took the refusal for a failure put a
    FailedPrepareDynamicResources warning (and a later retry) on most pods of a burst."""
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("first-try")
    body: Any = {"metadata": {"name": namespace}}
    core.create_namespace(body)
    try:
        create_template(kube_api, namespace, "gpu", claim_spec(request("gpu", GPU)))
        create_template(kube_api, namespace, "nic", claim_spec(request("nic", NIC)))
        names = [f"{kind}-{i}" for kind in ("gpu", "nic") for i in range(4)]  # every GPU and NIC of the fleet

        async def burst() -> None:
            client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
            pods = path_for("v1", "pods", namespace=namespace)
            try:
                await asyncio.gather(
                    *(client.create(pods, pod(n, {"dev": {"resourceClaimTemplateName": n[:3]}})) for n in names)
                )
            finally:
                await client.close()

        asyncio.run(burst())
        for name in names:
            wait_running(kube_api, namespace, name, timeout_s=60)
        # The kubelets' warnings only: the scheduler may still wait for devices that an
        # earlier test's pods release.
        warnings = [
            f"{e.involved_object.name}: {e.reason}: {e.message}"
            for e in core.list_namespaced_event(namespace).items
            if e.type == "Warning" and e.source is not None and e.source.component == "kubelet"
        ]
        assert not warnings, warnings
    finally:
        core.delete_namespace(namespace)


def test_a_real_kubelet_node_runs_its_kubelet_and_driver_under_their_own_identities(
    kube_binaries: Binaries, short_tmp_path: Path, tmp_path: Path
) -> None:
    reason = unsupported_reason()
    if reason:
        pytest.skip(reason)
    # Through the CLI, in processes of its own: this process stays connected to the
    # session fleet's Ray, which an in-process `up` and `down` would take from it.
    config = ControlPlaneConfig(name="realid", state_dir=short_tmp_path / "c")
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        yaml.safe_dump(
            {"nodesPerHost": 2, "pools": [{"name": "ref", "count": 1, "profile": "tiny", "kubelet": "real"}]}
        )
    )
    cli = [sys.executable, "-m", "testbed.cli"]
    where = ["--name", config.name, "--state-dir", str(config.cluster_dir)]
    up = subprocess.run([*cli, "up", *where, "--fleet", str(fleet_file)], capture_output=True, text=True, timeout=600)
    assert up.returncode == 0, up.stderr[-2000:]
    state = cluster.ClusterState.load(config.cluster_dir)
    assert state is not None
    try:
        node_dir = Path(state.fleet.nodes_dir) / "ref-000"
        kubelet = next(p for p in recorded_processes(node_dir.parent)["ref-000"] if p.name == "kubelet")
        command = " ".join(kubelet.command)
        assert f"--kubeconfig={node_dir / 'private' / 'kubelet.kubeconfig'}" in command
        node_user = yaml.safe_load((node_dir / "private" / "kubelet.kubeconfig").read_text())["users"][0]["user"]
        cert = x509.load_pem_x509_certificate(base64.b64decode(node_user["client-certificate-data"]))
        assert cert.subject.rfc4514_string() == "CN=system:node:ref-000,O=system:nodes"
        driver_pod = DriverPod("ref-000").name
        driver_user = yaml.safe_load((node_dir / "private" / f"{driver_pod}.kubeconfig").read_text())["users"][0]
        assert set(driver_user["user"]) == {"token"}

        # Both work under those identities: the driver's slices are there (up waited for
        # them), and the kubelet ran the driver pod and a scenario's pods.
        command = [*cli, "run", "smoke", *where, "--output", str(tmp_path / "report")]
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        # The report carries the real kubelet's own figures, the reference for fake ones.
        report = json.loads((tmp_path / "report" / "report.json").read_text())
        reference = report["metrics"]["kubelet_reference"]
        ran = sum(p["pods_running"] for p in report["phases"])
        assert reference["real_nodes"] == 1 and reference["figures"]["PrepareResources"]["real"]["count"] >= ran
        assert "real kubelet(s) of this run" in (tmp_path / "report" / "report.md").read_text()

        async def read_driver_pod() -> Obj:
            client = KubeClient.from_kubeconfig(state.kubeconfig)
            try:
                return await client.get(path_for("v1", "pods", driver_pod, DRIVER_NAMESPACE))
            finally:
                await client.close()

        def driver_pod_now() -> Obj:
            return asyncio.run(read_driver_pod())

        def driver_container() -> Obj:
            [container] = driver_pod_now()["status"]["containerStatuses"]
            return container

        wait_for(
            lambda: driver_pod_now()["status"].get("phase") == "Running", 60, "the real kubelet to run the driver pod"
        )

        # Its sockets carry its pod's UID, as its DaemonSet's would (for rolling updates).
        uid = driver_pod_now()["metadata"]["uid"]
        sockets = sorted(p.name for p in (node_dir / "kubelet" / "plugins_registry").iterdir())
        assert sockets == sorted(f"{driver}-{uid}-reg.sock" for driver in (GPU, NIC)), sockets

        # The built-in driver, killed, is started again as its DaemonSet's pod would be, and
        # the real kubelet counts it in that pod's status (its runtime was told of the exit).
        def driver_pid() -> int:
            return next(p.pid for p in recorded_processes(node_dir.parent)["ref-000"] if p.name == "driver")

        killed = driver_pid()
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: driver_pid() != killed, 30, "the driver started again")
        assert recorded_driver_restarts(node_dir.parent)["ref-000"] == 1, "`testbed status` counts it"
        wait_for(lambda: driver_container().get("restartCount") == 1, 60, "the real kubelet to count the restart")
        container = driver_container()
        assert container["lastState"]["terminated"]["exitCode"] == 137, container
        wait_for(lambda: "running" in driver_container()["state"], 60, "the driver container running")

        # Its /metrics, as an admin reads it: the kubelet (under its node identity) asks
        # the API server whether the admin's certificate may, and counted the pod starts.
        ask = [*cli, "metrics", "ref-000", *where, "--only", "dra_operations_duration_seconds_count"]
        metrics = subprocess.run(ask, capture_output=True, text=True, timeout=60)
        assert metrics.returncode == 0, metrics.stderr[-2000:]
        starts = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.stdout.splitlines()
            if 'operation_name="PrepareResources"' in line and 'is_error="false"' in line
        ]
        assert starts and starts[0] >= 2, metrics.stdout  # the driver pod and the scenario's
        assert all(line.startswith("dra_operations_duration_seconds_count") for line in metrics.stdout.splitlines())
        missing = subprocess.run([*cli, "metrics", "nosuch", *where], capture_output=True, text=True, timeout=60)
        assert missing.returncode != 0 and "has no node 'nosuch'" in missing.stderr, missing.stderr
    finally:
        subprocess.run([*cli, "down", *where], capture_output=True, timeout=300)
