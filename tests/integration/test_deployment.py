"""The kind/real-cluster deployment (deploy/), checked against the real API server.

Docker does not run here, so what a kind cluster would check is checked this way:
server-side dry-run of every manifest, RBAC by impersonation, and the admission policy
with a real pod-bound service-account token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes import client as k8s

from testbed.controlplane.binaries import Binaries
from testbed.controlplane.cluster import ClusterState
from testbed.controlplane.processes import free_port
from testbed.kubeapi import KubeClient, path_for
from testbed.kubelet import plugins as kubelet_plugins
from testbed.kubelet.kubelet import FakeKubelet
from testbed.kubelet.node import NodeSpec
from testbed.testing import wait_for

pytestmark = pytest.mark.controlplane

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "dra-testbed"
DRIVER_SA = f"system:serviceaccount:{NAMESPACE}:dra-testbed-driver"


class Kubectl:
    def __init__(self, executable: Path, kubeconfig: Path):
        self.executable = executable
        self.command = [str(executable), f"--kubeconfig={kubeconfig}"]

    def as_user(self, kubeconfig: Path) -> Kubectl:
        return Kubectl(self.executable, kubeconfig)

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.command, *args], input=stdin, capture_output=True, text=True, timeout=120)

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self(*args, stdin=stdin)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def can_i(self, who: str, verb: str, resource: str, namespace: str | None = None, *extra: str) -> bool:
        args = ["auth", "can-i", verb, resource, f"--as={who}", *extra]
        args += [f"--namespace={namespace}"] if namespace else []
        answer = self(*args).stdout.strip()
        assert answer in ("yes", "no"), answer
        return answer == "yes"


@pytest.fixture(scope="module")
def kubectl(kube_binaries: Binaries, control_plane: ClusterState) -> Kubectl:
    assert kube_binaries.has("kubectl"), f"no kubectl in {kube_binaries.directory}"
    return Kubectl(kube_binaries.path("kubectl"), control_plane.kubeconfig)


@pytest.fixture(scope="module")
def deployed(kubectl: Kubectl) -> Iterator[None]:
    kubectl.ok("apply", "-k", str(DEPLOY))
    yield
    # The namespace, RBAC, policy and DeviceClasses stay: the session's fleet runs under
    # them (its nodes' drivers are that ServiceAccount, in pods of that namespace).
    kubectl("delete", "daemonset", "dra-testbed-driver", "-n", NAMESPACE, "--ignore-not-found")


def test_every_manifest_passes_server_side_dry_run(kubectl: Kubectl) -> None:
    kubectl.ok("apply", "-f", str(DEPLOY / "namespace.yaml"))  # namespaced objects need it to exist
    out = kubectl.ok("apply", "--dry-run=server", "-k", str(DEPLOY))
    for expected in (
        "daemonset.apps/dra-testbed-driver",
        "validatingadmissionpolicy.admissionregistration.k8s.io/dra-testbed-driver-own-node-slices",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/dra-testbed-driver-own-node-slices",
        "clusterrole.rbac.authorization.k8s.io/dra-user",
        "clusterrole.rbac.authorization.k8s.io/dra-admin",
        "deviceclass.resource.k8s.io/gpu-partition.dra-testbed.io",
    ):
        assert f"{expected} " in out and "(server dry run)" in out, out


def test_the_dry_run_really_checks_the_cel(kubectl: Kubectl) -> None:
    """Broken CEL in the policy or a class is refused, so the passing dry-run means something."""
    docs = list(yaml.safe_load_all((DEPLOY / "admission-policy.yaml").read_text()))
    docs[0]["spec"]["validations"][1]["expression"] = "variables.callerNode == "
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(docs[0]))
    assert result.returncode != 0 and "compil" in result.stderr.lower(), result.stderr

    [gpu, *_] = yaml.safe_load_all((DEPLOY / "deviceclasses.yaml").read_text())
    gpu["spec"]["selectors"][0]["cel"]["expression"] = "device.driver ==== 'x'"
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(gpu))
    assert result.returncode != 0 and "compil" in result.stderr.lower(), result.stderr


def test_rbac_separates_driver_user_and_admin(kubectl: Kubectl, deployed: None) -> None:
    driver = DRIVER_SA
    assert kubectl.can_i(driver, "create", "resourceslices.resource.k8s.io")
    assert kubectl.can_i(driver, "delete", "resourceslices.resource.k8s.io")
    assert kubectl.can_i(driver, "patch", "resourceclaims.resource.k8s.io", "default", "--subresource=status")
    assert kubectl.can_i(driver, "get", "resourceclaims.resource.k8s.io", "default")
    assert not kubectl.can_i(driver, "watch", "resourceclaims.resource.k8s.io", "default")
    assert not kubectl.can_i(driver, "create", "resourceclaims.resource.k8s.io", "default")
    assert not kubectl.can_i(driver, "update", "resourceclaims.resource.k8s.io", "default")
    assert not kubectl.can_i(driver, "create", "pods", "default")
    assert not kubectl.can_i(driver, "list", "pods", "default")
    assert not kubectl.can_i(driver, "create", "deviceclasses.resource.k8s.io")

    # the fleet's fabric manager: every claim's status, for the GPU driver, on any node
    fabric = "dra-testbed:fabric-manager"
    assert kubectl.can_i(fabric, "watch", "resourceclaims.resource.k8s.io", "default")
    assert kubectl.can_i(fabric, "patch", "resourceclaims.resource.k8s.io", "default", "--subresource=status")
    assert kubectl.can_i(
        fabric,
        "arbitrary-node:patch",
        "resourceclaims.resource.k8s.io/gpu.dra-testbed.io",
        "default",
        "--subresource=driver",
    )
    assert not kubectl.can_i(
        fabric,
        "arbitrary-node:patch",
        "resourceclaims.resource.k8s.io/nic.dra-testbed.io",
        "default",
        "--subresource=driver",
    )
    assert not kubectl.can_i(fabric, "update", "resourceclaims.resource.k8s.io", "default")
    assert not kubectl.can_i(fabric, "create", "resourceslices.resource.k8s.io")
    assert not kubectl.can_i(fabric, "list", "pods", "default")

    # dra-user, bound in one namespace, as a team would get it
    kubectl("create", "namespace", "team-a")
    kubectl("create", "rolebinding", "alice-dra", "--clusterrole=dra-user", "--user=alice", "-n", "team-a")
    assert kubectl.can_i("alice", "create", "resourceclaims.resource.k8s.io", "team-a")
    assert kubectl.can_i("alice", "create", "resourceclaimtemplates.resource.k8s.io", "team-a")
    assert kubectl.can_i("alice", "list", "deviceclasses.resource.k8s.io", "team-a")
    assert not kubectl.can_i("alice", "create", "resourceclaims.resource.k8s.io", "default")
    assert not kubectl.can_i("alice", "create", "resourceslices.resource.k8s.io")
    assert not kubectl.can_i("alice", "create", "deviceclasses.resource.k8s.io")

    kubectl("create", "clusterrolebinding", "bob-dra-admin", "--clusterrole=dra-admin", "--user=bob")
    try:
        assert kubectl.can_i("bob", "create", "deviceclasses.resource.k8s.io")
        assert kubectl.can_i("bob", "delete", "resourceslices.resource.k8s.io")
        assert kubectl.can_i("bob", "create", "devicetaintrules.resource.k8s.io")
        assert not kubectl.can_i("bob", "create", "resourceclaims.resource.k8s.io", "team-a")
        assert not kubectl.can_i("bob", "create", "pods", "team-a")
    finally:
        kubectl("delete", "clusterrolebinding", "bob-dra-admin")
        kubectl("delete", "namespace", "team-a", "--wait=false")


def _slice(name: str, node: str | None) -> dict[str, Any]:
    where: dict[str, Any] = {"nodeName": node} if node else {"allNodes": True}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "policy-check.dra-testbed.io",  # not a driver the fleet runs: no interference
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
            **where,
        },
    }


def driver_kubeconfig(control_plane: ClusterState, token: str, path: Path) -> Path:
    """A kubeconfig that authenticates with ``token`` only (no client certificate)."""
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    if "certificate-authority" in cluster:
        ca = Path(cluster["certificate-authority"])
        if not ca.is_absolute():
            ca = control_plane.kubeconfig.parent / ca
        ca_data = base64.b64encode(ca.read_bytes()).decode()
    else:
        ca_data = cluster["certificate-authority-data"]
    cluster = {"server": cluster["server"], "certificate-authority-data": ca_data}
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "driver", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "driver"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


def pod_bound_token(kube_api: k8s.ApiClient, node: str, name: str) -> str:
    """What the kubelet gives the driver pod: a token bound to a pod on ``node``."""
    core = k8s.CoreV1Api(kube_api)
    pod = core.create_namespaced_pod(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": "dra-testbed-driver",
                "nodeName": node,
                "containers": [{"name": "driver", "image": "dra-testbed-driver:dev"}],
            },
        },
    )
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.metadata.uid},
        },
    }
    answer = core.create_namespaced_service_account_token("dra-testbed-driver", NAMESPACE, request)
    return str(answer.status.token)


def test_a_driver_pod_may_write_only_its_own_nodes_slices(
    kubectl: Kubectl, deployed: None, control_plane: ClusterState, kube_api: k8s.ApiClient, fleet: object
) -> None:
    del fleet  # for its nodes tb-000 and tb-001
    token = pod_bound_token(kube_api, "tb-000", "policy-check")
    with tempfile.TemporaryDirectory() as scratch:
        as_driver = kubectl.as_user(driver_kubeconfig(control_plane, token, Path(scratch) / "k"))

        def create(doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
            return as_driver("create", "-f", "-", stdin=json.dumps(doc))

        # the VAP takes effect a moment after it is created: poll until it denies
        wait_for(
            lambda: (r := create(_slice("vap-other", "tb-001"))).returncode != 0 and "tb-001" in r.stderr,
            60,
            "the policy to deny a slice of another node",
        )
        denied = create(_slice("vap-other-2", "tb-001"))
        assert denied.returncode != 0
        assert "may only write its own node's ResourceSlices, not those of node tb-001" in denied.stderr
        cluster_wide = create(_slice("vap-all", None))
        assert cluster_wide.returncode != 0 and "slices without a node" in cluster_wide.stderr

        own = create(_slice("vap-own", "tb-000"))
        assert own.returncode == 0, own.stderr
        assert as_driver("delete", "resourceslice", "vap-own").returncode == 0

        unbound = kubectl.ok("create", "token", "dra-testbed-driver", "-n", NAMESPACE).strip()
        as_driver = kubectl.as_user(driver_kubeconfig(control_plane, unbound, Path(scratch) / "u"))
        nowhere = create(_slice("vap-unbound", "tb-000"))
        assert nowhere.returncode != 0 and "name no node" in nowhere.stderr
    kubectl("delete", "pod", "policy-check", "-n", NAMESPACE, "--grace-period=0", "--force")


def daemonset_container() -> dict[str, Any]:
    docs = yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text())
    [daemonset] = [d for d in docs if d and d["kind"] == "DaemonSet"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return dict(container)


def daemonset_env(node: str, pod_uid: str, pod_ip: str) -> dict[str, str]:
    """The container's environment as the kubelet would fill it in."""
    fields = {"spec.nodeName": node, "metadata.uid": pod_uid, "status.podIP": pod_ip}
    env = {}
    for entry in daemonset_container()["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def test_the_container_command_with_the_daemonsets_env_and_account_serves_a_node(
    kubectl: Kubectl,
    deployed: None,
    control_plane: ClusterState,
    kube_api: k8s.ApiClient,
    short_tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a kind node runs, run here as a process: the DaemonSet's command and env, the
    driver service account's pod-bound token (so RBAC and the admission policy apply),
    host paths mapped to a node directory, registered by the fake kubelet."""
    monkeypatch.setattr(kubelet_plugins, "WIPE_SLICES_AFTER_S", 1.0)
    node, drivers = "standalone-node", {"gpu.dra-testbed.io", "nic.dra-testbed.io"}
    # "k" for /var/lib/kubelet: a real pod UID makes socket names long (gRPC allows 105 bytes)
    kubelet_dir, cdi_dir = short_tmp_path / "k", short_tmp_path / "cdi"
    container = daemonset_container()
    [command] = container["command"]
    executable = Path(sys.executable).parent / command  # the console script the image puts on PATH
    assert executable.exists(), f"{command} is not installed next to {sys.executable}"
    probe_port = container["livenessProbe"]["grpc"]["port"]

    async def slices(client: KubeClient) -> set[str]:
        listing = await client.get(
            path_for("resource.k8s.io/v1", "resourceslices"), {"fieldSelector": f"spec.nodeName={node}"}
        )
        return {s["spec"]["driver"] for s in listing["items"]}

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        kubelet = FakeKubelet(client, NodeSpec(node), kubelet_dir, cdi_dir, watch_pods=False)
        await kubelet.start()
        token = pod_bound_token(kube_api, node, "standalone-driver")
        pod_uid = k8s.CoreV1Api(kube_api).read_namespaced_pod("standalone-driver", NAMESPACE).metadata.uid
        env = daemonset_env(node, pod_uid, "127.0.0.1")
        assert env["KUBELET_DIR"] == "/var/lib/kubelet" and env["CDI_DIR"] == "/var/run/cdi"
        health_port = free_port()
        env.update(  # the host paths the DaemonSet mounts, and ports free on this machine
            KUBELET_DIR=str(kubelet_dir),
            CDI_DIR=str(cdi_dir),
            HEALTH_PORT=str(health_port),
            METRICS_PORT=str(free_port()),
            KUBECONFIG=str(driver_kubeconfig(control_plane, token, short_tmp_path / "driver.kubeconfig")),
            LOG_LEVEL="WARNING",
            PATH=os.environ["PATH"],
        )
        assert env["HEALTH_PORT"] != str(probe_port) or probe_port == health_port
        driver = await asyncio.create_subprocess_exec(str(executable), env=env)
        try:
            for name in drivers:
                plugin = await kubelet.plugins.wait_for_driver(name, 60)
                assert plugin.service == "v1.DRAPlugin"
                assert plugin.health_service == "v1.DRAResourceHealth"
                assert plugin.registration_socket.name == f"{name}-{pod_uid}-reg.sock", "rolling-update naming"
            async with asyncio.timeout(60):  # published under the driver's own account
                while await slices(client) != drivers:
                    await asyncio.sleep(0.2)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as channel:
                check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert check.status == health_pb2.HealthCheckResponse.SERVING
            driver.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(driver.wait(), 30) == 0
            assert not list((kubelet_dir / "plugins_registry").glob("*.sock")), "its sockets are gone"
            async with asyncio.timeout(60):  # the kubelet wipes a vanished driver's slices
                while await slices(client):
                    await asyncio.sleep(0.2)
        finally:
            if driver.returncode is None:
                driver.kill()
                await driver.wait()
            await kubelet.stop()
            await kubelet.node.delete()
            await client.close()

    asyncio.run(scenario())
    kubectl("delete", "pod", "standalone-driver", "-n", NAMESPACE, "--grace-period=0", "--force")
