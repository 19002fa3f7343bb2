"""DRAOptionalNodeOperations (alpha in 1.37) on a fake-kubelet node and on a real one,
in a cluster started with ``--alpha``: the kubelet declares the feature in its Node's
status (the scheduler allocates a device of a ResourceSlice with ``skipNodeOperations``
only on such a node), and a claim whose devices skip every node call runs its pod
without the driver being on the node at all. Until the fake kubelet declared its
features, no such device could be allocated to a synthetic node; until the reference
node's kubelet was started with the cluster's gates, it declared none of the alpha ones.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as kube_config

from testbed import workloads
from testbed.config import ControlPlaneConfig
from testbed.realnode.node import unsupported_reason

pytestmark = pytest.mark.controlplane

DRIVER = "virtual.example.com"
"""A driver that runs nowhere: its devices need no node calls."""
NODE, REAL_NODE = "node-000", "real-000"
REAL_NODES = not unsupported_reason()


def _testbed(verb: str, config: ControlPlaneConfig, *args: str) -> None:
    command = [sys.executable, "-m", "testbed.cli", verb, "--name", config.name, "--state-dir", str(config.cluster_dir)]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def alpha_cluster() -> Iterator[k8s.ApiClient]:
    config = ControlPlaneConfig(name="alpha", state_dir=Path(tempfile.mkdtemp(prefix="tba-")) / "c")
    real = ["--real-nodes", "1"] if REAL_NODES else []
    _testbed("up", config, "--alpha", "--nodes", "1", *real, "--profile", "tiny")
    try:
        api = kube_config.new_client_from_config(str(config.cluster_dir / "kubeconfig"))
        yield api
        api.close()
    finally:
        _testbed("down", config)
        shutil.rmtree(config.state_dir.parent, ignore_errors=True)


def _declared(api: k8s.ApiClient, node: str) -> list[str]:
    read = json.loads(k8s.CoreV1Api(api).read_node(node, _preload_content=False).data)
    return list(read["status"].get("declaredFeatures", []))


@pytest.mark.parametrize(
    "node",
    [NODE, pytest.param(REAL_NODE, marks=pytest.mark.skipif(not REAL_NODES, reason=unsupported_reason() or ""))],
)
def test_a_claim_whose_devices_skip_every_node_call_runs_without_its_driver(
    alpha_cluster: k8s.ApiClient, node: str
) -> None:
    api = alpha_cluster
    declared = _declared(api, node)
    assert "DRAOptionalNodeOperations" in declared and declared == sorted(declared), declared
    if node == REAL_NODE:
        assert declared == _declared(api, NODE), "both kinds of kubelet run with the cluster's gates"

    custom = k8s.CustomObjectsApi(api)
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    device_class = {"metadata": {"name": DRIVER}, "spec": {"selectors": [selector]}}
    with contextlib.suppress(k8s.ApiException):  # made by the other node's case
        custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", device_class)
    custom.create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        {
            "metadata": {"name": f"{node}-virtual"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "skipNodeOperations": ["*"],
                "devices": [{"name": "v0"}],
            },
        },
    )
    claim = workloads.unique("virt")
    workloads.create_claim(api, "default", claim, workloads.claim_spec(workloads.request("v", DRIVER)))
    name = workloads.unique("virt")
    pod = workloads.pod(name, claims={"v": {"resourceClaimName": claim}}, node=node)
    k8s.CoreV1Api(api).create_namespaced_pod("default", pod)
    workloads.wait_running(api, "default", name, timeout_s=60)
    allocated = custom.get_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", claim)
    (device,) = allocated["status"]["allocation"]["devices"]["results"]
    assert (device["driver"], device["skipNodeOperations"]) == (DRIVER, ["*"])

    k8s.CoreV1Api(api).delete_namespaced_pod(name, "default")
    workloads.wait_gone(api, "default", name, timeout_s=60)
