"""What a driver developer checks first: pods get the driver's devices on synthetic
nodes, and the driver passes `testbed sanity`."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DRIVER_COMMAND, DRIVER_ENV, DRIVER_NAME
from kubernetes import client as k8s

from testbed import sanity
from testbed.fleet.fleet import Fleet
from testbed.workloads import (
    claim_spec,
    container_env,
    create_template,
    pod,
    request,
    unique,
    wait_gone,
    wait_running,
)


def test_a_pod_gets_a_device_of_my_driver(fleet: Fleet, kube_api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("mine")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        create_template(kube_api, namespace, "one", claim_spec(request("dev", "gpu.dra-testbed.io")))
        mine = sorted(fleet.host_of)[0]  # one of this fleet's nodes (the cluster may have others)
        core.create_namespaced_pod(namespace, pod("user", {"dev": {"resourceClaimTemplateName": "one"}}, node=mine))
        running = wait_running(kube_api, namespace, "user")
        assert running.spec.node_name == mine
        assert container_env(running)["main"], "the container got the device's CDI environment"
    finally:
        core.delete_namespace(namespace)


def test_the_real_kubelet_runs_a_pod_with_my_drivers_device_too(fleet: Fleet, kube_api: k8s.ApiClient) -> None:
    """The reference: the upstream kubelet v1.37 registers your driver and prepares the
    claim through it, where the fake kubelet's tests could share your assumptions."""
    real = [node for node in sorted(fleet.host_of) if node.startswith("real-")]
    if not real:
        pytest.skip("no real-kubelet node: it needs root (see conftest.py)")
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("ref")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        create_template(kube_api, namespace, "one", claim_spec(request("dev", "gpu.dra-testbed.io")))
        core.create_namespaced_pod(namespace, pod("user", {"dev": {"resourceClaimTemplateName": "one"}}, node=real[0]))
        assert wait_running(kube_api, namespace, "user").spec.node_name == real[0]
        core.delete_namespaced_pod("user", namespace)
        wait_gone(kube_api, namespace, "user")
    finally:
        core.delete_namespace(namespace)


def test_my_driver_passes_sanity(kubeconfig_path: Path, fleet: Fleet) -> None:
    del fleet  # for the DeviceClasses and the access policy the suite's node uses
    results, name = sanity.run(kubeconfig_path, DRIVER_COMMAND, DRIVER_ENV, DRIVER_NAME)
    assert name == DRIVER_NAME
    failed = [(r.name, r.detail) for r in results if r.status is sanity.Status.FAIL]
    assert not failed, failed


def test_my_driver_rolls_out_with_no_gap_while_a_pod_runs(fleet: Fleet, kube_api: k8s.ApiClient) -> None:
    """The seamless upgrade: each node's new instance registers beside the old one
    (maxSurge 1), so kubelets always have one to call. Your driver must name its sockets
    after POD_UID and let two instances share its checkpoint (sanity checks both)."""
    core = k8s.CoreV1Api(kube_api)
    namespace = unique("roll")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        create_template(kube_api, namespace, "one", claim_spec(request("dev", "gpu.dra-testbed.io")))
        claims = {"dev": {"resourceClaimTemplateName": "one"}}
        mine = sorted(fleet.host_of)[0]
        core.create_namespaced_pod(namespace, pod("before", claims, node=mine))
        wait_running(kube_api, namespace, "before")

        rolled = fleet.rollout(DRIVER_NAME)  # command=[...] rolls a new version out
        assert all(r["unavailable_s"] == 0 for r in rolled), rolled

        core.delete_namespaced_pod("before", namespace)
        wait_gone(kube_api, namespace, "before")  # its claim unprepared by the new instance
        core.create_namespaced_pod(namespace, pod("after", claims, node=mine))
        wait_running(kube_api, namespace, "after")
    finally:
        core.delete_namespace(namespace)
