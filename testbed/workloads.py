"""Pods, claims and waits for tests of DRA drivers on the testbed (ours and yours).

Manifests are plain dicts for the kubernetes client. Waits are generous (minutes): they
bound a failure, they do not pace a success, and CI machines are busier than a laptop.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from testbed.keys import CONTAINER_ENV_ANNOTATION
from testbed.kubelet.node import SYNTHETIC_TOLERATION
from testbed.testing import wait_for

GPU = "gpu.dra-testbed.io"
PARTITION = "gpu-partition.dra-testbed.io"
NIC = "nic.dra-testbed.io"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def request(name: str, device_class: str, selector: str | None = None, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, **extra}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


def claim_spec(
    *requests: dict[str, Any], constraints: list[Any] | None = None, config: list[Any] | None = None
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"devices": devices}


def create_template(api: k8s.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body: Any = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": spec},
    }
    k8s.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body)


def create_claim(api: k8s.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
    k8s.ResourceV1Api(api).create_namespaced_resource_claim(namespace, body)


def pod(
    name: str,
    claims: dict[str, dict[str, str]],
    containers: dict[str, list[str]] | None = None,
    node: str | None = None,
    command: list[str] | None = None,
    restart_policy: str = "Always",
) -> dict[str, Any]:
    """claims: pod claim name -> {"resourceClaimTemplateName"|"resourceClaimName": ...};
    containers: container name -> pod claim names it uses (default: one container, all)."""
    containers = containers or {"main": list(claims)}
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": n, **source} for n, source in claims.items()],
        "containers": [
            {
                "name": c,
                "image": "registry.invalid/workload:v1",
                "command": command or ["run-forever"],
                "resources": {"claims": [{"name": n} for n in used]},
            }
            for c, used in containers.items()
        ],
        "tolerations": [SYNTHETIC_TOLERATION],
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 1,
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_running(api: k8s.ApiClient, namespace: str, name: str, timeout_s: float = 180) -> Any:
    core = k8s.CoreV1Api(api)

    def running() -> Any:
        found: Any = core.read_namespaced_pod(name, namespace)
        return found.status.phase == "Running" and found

    try:
        return wait_for(
            running,
            timeout_s,
            f"pod {namespace}/{name} to run",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its events: {events(api, namespace, name)}") from None


def container_env(p: Any) -> dict[str, dict[str, str]]:
    env: dict[str, dict[str, str]] = json.loads(p.metadata.annotations[CONTAINER_ENV_ANNOTATION])
    return env


def events(api: k8s.ApiClient, namespace: str, pod_name: str) -> list[tuple[str, str]]:
    items: list[Any] = k8s.CoreV1Api(api).list_namespaced_event(namespace).items
    return [(str(e.reason), str(e.message)) for e in items if e.involved_object.name == pod_name]


def wait_gone(api: k8s.ApiClient, namespace: str, name: str, timeout_s: float = 180) -> None:
    core = k8s.CoreV1Api(api)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_for(gone, timeout_s, f"pod {namespace}/{name} to be removed")


def allocated_devices(api: k8s.ApiClient, namespace: str, claim_name: str) -> list[Any]:
    claim: Any = k8s.ResourceV1Api(api).read_namespaced_resource_claim(claim_name, namespace)
    return list(claim.status.allocation.devices.results)


def pod_claim_name(p: Any, pod_claim: str) -> str:
    return str(next(s.resource_claim_name for s in p.status.resource_claim_statuses if s.name == pod_claim))


def allocated_claim(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    pool: str | None,
    device: str = "gpu-0",
    config: list[Any] | None = None,
) -> str:
    """A claim with an allocation written directly (pool None: left unallocated)."""
    resource = k8s.ResourceV1Api(api)
    body: Any = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}},
    }
    claim: Any = resource.create_namespaced_resource_claim(namespace, body)
    if pool is not None:
        allocation: dict[str, Any] = {
            "devices": {"results": [{"request": "gpu", "driver": GPU, "pool": pool, "device": device}]}
        }
        if config:
            allocation["devices"]["config"] = config
        resource.patch_namespaced_resource_claim_status(name, namespace, {"status": {"allocation": allocation}})
    return str(claim.metadata.uid)
