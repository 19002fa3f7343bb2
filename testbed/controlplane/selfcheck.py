"""`testbed check`: prove a cluster can allocate DRA devices, with no driver at all.

It registers a Node, hand-writes a ResourceSlice for it, and runs a Pod whose claim
comes from a ResourceClaimTemplate; the controller-manager must create the claim and
the scheduler must allocate, reserve and bind. Everything it creates is removed again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from testbed.errors import TestbedError
from testbed.keys import CONTAINER_ENV_ANNOTATION, SYNTHETIC
from testbed.kube import build, present

API_VERSION = "resource.k8s.io/v1"
DRA_RESOURCES = (
    "deviceclasses",
    "resourceclaims",
    "resourceclaimtemplates",
    "resourceslices",
    "devicetaintrules",
)


@dataclass(frozen=True)
class AllocationCheck:
    version: str
    node: str
    pod_uid: str
    bound_node: str
    claim: str
    driver: str
    pool: str
    device: str
    reserved_for: list[str]
    seconds: float


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def ready_node(core: k8s.CoreV1Api, name: str) -> None:
    """A Node as a kubelet registers it: Ready, with pod capacity."""
    labels = {"kubernetes.io/hostname": name}
    core.create_node(
        build(
            k8s.V1Node,
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}},
        )
    )
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "registered by testbed check",
                    }
                ],
            }
        },
    )


def _slice(node: str, driver: str, devices: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver.split('.')[0]}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"dev-{i}", "attributes": {"index": {"int": i}}} for i in range(devices)],
        },
    }


def _pod(template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "user"},
        "spec": {
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/none",
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
            # No kubelet renews this node's lease; tolerate the taints that follow.
            "tolerations": [{"operator": "Exists"}],
        },
    }


def _claim_template(name: str, device_class_name: str) -> dict[str, Any]:
    request = {"name": "dev", "exactly": {"deviceClassName": device_class_name}}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _wait_scheduled(core: k8s.CoreV1Api, namespace: str, name: str, timeout_s: float) -> k8s.V1Pod:
    deadline = time.monotonic() + timeout_s
    while True:
        pod = core.read_namespaced_pod(name, namespace)
        if present(pod.spec, "pod.spec").node_name:
            return pod
        if time.monotonic() > deadline:
            raise TestbedError(
                f"pod {namespace}/{name} was not scheduled within {timeout_s:.0f}s",
                detail=_pod_events(core, namespace),
                hint="see the kube-scheduler and kube-controller-manager logs",
            )
        time.sleep(0.1)


def served_dra_resources(api: k8s.ApiClient) -> set[str]:
    return {r.name for r in k8s.ResourceV1Api(api).get_api_resources().resources}


def run_allocation_check(api: k8s.ApiClient, timeout_s: float = 60.0) -> AllocationCheck:
    core, resource = k8s.CoreV1Api(api), k8s.ResourceV1Api(api)
    version = k8s.VersionApi(api).get_code().git_version
    missing = set(DRA_RESOURCES) - served_dra_resources(api)
    if missing:
        raise TestbedError(
            f"{API_VERSION} does not serve {', '.join(sorted(missing))}",
            hint="the API server needs Kubernetes >= 1.34 with DRA enabled",
        )
    suffix = uuid.uuid4().hex[:6]
    node, driver, namespace = f"check-{suffix}", f"check-{suffix}.dra-testbed.io", f"check-{suffix}"
    started = time.monotonic()
    try:
        ready_node(core, node)
        core.create_namespace(build(k8s.V1Namespace, {"metadata": {"name": namespace}}))
        resource.create_resource_slice(build(k8s.V1ResourceSlice, _slice(node, driver, devices=2)))
        resource.create_device_class(build(k8s.V1DeviceClass, device_class(driver, f"device.driver == '{driver}'")))
        resource.create_namespaced_resource_claim_template(
            namespace, build(k8s.V1ResourceClaimTemplate, _claim_template("one-device", driver))
        )
        core.create_namespaced_pod(namespace, build(k8s.V1Pod, _pod("one-device")))
        pod = _wait_scheduled(core, namespace, "user", timeout_s)
        elapsed = time.monotonic() - started
        pod_status = present(pod.status, "pod.status")
        claim_statuses = present(pod_status.resource_claim_statuses, "pod resourceClaimStatuses")
        claim_name = present(claim_statuses[0].resource_claim_name, "generated claim name")
        claim = resource.read_namespaced_resource_claim(claim_name, namespace)
        claim_status = present(claim.status, "claim.status")
        allocation = present(claim_status.allocation, "claim.status.allocation")
        results = present(present(allocation.devices, "allocation.devices").results, "results")
        return AllocationCheck(
            version=version,
            node=node,
            pod_uid=present(present(pod.metadata, "pod.metadata").uid, "pod uid"),
            bound_node=present(present(pod.spec, "pod.spec").node_name, "pod.spec.nodeName"),
            claim=claim_name,
            driver=results[0].driver,
            pool=results[0].pool,
            device=results[0].device,
            reserved_for=[r.uid for r in claim_status.reserved_for or []],
            seconds=elapsed,
        )
    finally:
        _cleanup(core, resource, namespace, node, driver)


def _pod_events(core: k8s.CoreV1Api, namespace: str) -> str:
    events = core.list_namespaced_event(namespace).items
    return "\n".join(f"{e.reason}: {e.message}" for e in events) or "(no events)"


def _cleanup(core: k8s.CoreV1Api, resource: k8s.ResourceV1Api, namespace: str, node: str, driver: str) -> None:
    deletions: tuple[Callable[[], object], ...] = (
        # At once: no kubelet runs on the check's node to confirm the pod stopped, so it
        # (and its namespace, and its claim's allocation) would wait a minute for the
        # pod garbage collector to find it orphaned.
        lambda: core.delete_namespaced_pod("user", namespace, grace_period_seconds=0),
        lambda: core.delete_namespace(namespace),
        lambda: resource.delete_device_class(driver),
        lambda: resource.delete_collection_resource_slice(field_selector=f"spec.driver={driver}"),
        lambda: core.delete_node(node),
    )
    for delete in deletions:
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                raise


@dataclass(frozen=True)
class PodCheck:
    node: str
    device: str
    env: dict[str, str]
    seconds_to_running: float
    seconds_to_removed: float
    health: dict[str, str]
    """allocatedResourcesStatus as the kubelet reported it: resource ID -> health."""


def ready_synthetic_nodes(api: k8s.ApiClient) -> list[str]:
    """Names of the synthetic nodes (either kubelet) that are Ready."""
    nodes = k8s.CoreV1Api(api).list_node(label_selector=f"{SYNTHETIC}=true", _request_timeout=10).items
    return [
        present(n.metadata, "node.metadata").name or ""
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions if n.status else None) or [])
    ]


def synthetic_nodes(api: k8s.ApiClient) -> list[str]:
    nodes = k8s.CoreV1Api(api).list_node(label_selector=f"{SYNTHETIC}=true").items
    return [present(n.metadata, "node.metadata").name or "" for n in nodes]


HEALTH_WAIT_S = 15.0


def _device_health(pod: k8s.V1Pod) -> dict[str, str]:
    statuses = present(pod.status, "pod.status").container_statuses or []
    return {
        str(resource.resource_id): str(resource.health)
        for status in statuses
        for entry in status.allocated_resources_status or []
        for resource in entry.resources or []
    }


def run_dra_pod_check(api: k8s.ApiClient, timeout_s: float = 60.0, node: str | None = None) -> PodCheck:
    """A pod with a GPU claim on a synthetic node (``node``, or any): scheduled, prepared
    by the driver, Running with its CDI environment (fake kubelet) and its device health
    in the pod status (either kubelet); then deleted, unprepared and removed."""
    core, resource = k8s.CoreV1Api(api), k8s.ResourceV1Api(api)
    namespace = f"check-{uuid.uuid4().hex[:6]}"
    core.create_namespace(build(k8s.V1Namespace, {"metadata": {"name": namespace}}))
    try:
        resource.create_namespaced_resource_claim_template(
            namespace,
            build(k8s.V1ResourceClaimTemplate, _claim_template("gpu", "gpu.dra-testbed.io")),
        )
        manifest = _pod("gpu")
        manifest["spec"]["tolerations"] = [{"key": SYNTHETIC, "operator": "Exists"}]
        if node:
            manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        started = time.monotonic()
        core.create_namespaced_pod(namespace, build(k8s.V1Pod, manifest))
        deadline = started + timeout_s
        while (pod := core.read_namespaced_pod("user", namespace)).status.phase != "Running":  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"pod {namespace}/user did not run within {timeout_s:.0f}s",
                    detail=_pod_events(core, namespace),
                    hint="see `testbed status` and the NodeHost logs under the cluster's ray/ dir",
                )
            time.sleep(0.05)
        running = time.monotonic() - started
        health_deadline = time.monotonic() + HEALTH_WAIT_S  # the first health report may lag
        while not (health := _device_health(pod)) and time.monotonic() < health_deadline:
            time.sleep(0.2)
            pod = core.read_namespaced_pod("user", namespace)
        annotations = present(pod.metadata, "pod.metadata").annotations or {}
        env = json.loads(annotations.get(CONTAINER_ENV_ANNOTATION, "{}")).get("c", {})
        statuses = present(present(pod.status, "pod.status").resource_claim_statuses, "claim statuses")
        claim = resource.read_namespaced_resource_claim(
            present(statuses[0].resource_claim_name, "claim name"), namespace
        )
        results = present(
            present(present(claim.status, "claim.status").allocation, "allocation").devices,
            "devices",
        )
        device = present(results.results, "results")[0].device
        started = time.monotonic()
        core.delete_namespaced_pod("user", namespace)
        while True:
            try:
                core.read_namespaced_pod("user", namespace)
            except ApiException as exc:
                if exc.status == 404:
                    break
                raise
            if time.monotonic() > started + timeout_s:
                raise TestbedError(f"pod {namespace}/user was not removed within {timeout_s:.0f}s")
            time.sleep(0.05)
        ran_on = present(pod.spec, "pod.spec").node_name or ""
        return PodCheck(ran_on, device, env, running, time.monotonic() - started, health)
    finally:
        core.delete_namespace(namespace)
