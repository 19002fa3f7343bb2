"""What test_fleet_across_two_hosts asserts on, printed as JSON. It runs inside the first
host's network namespace, where alone the API server and the Ray head can be reached.

    fleet_probe.py STATE_DIR NAME state [NAMESPACE]     hosts, leases, claims, held devices
    fleet_probe.py STATE_DIR NAME workload NAMESPACE NODE...   a pod with a GPU claim per node
    fleet_probe.py STATE_DIR NAME delete NAMESPACE      delete those pods, wait for their claims
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from testbed import config as cfg
from testbed import environment
from testbed.controlplane.cluster import ClusterState
from testbed.fleet.fencing import Server, parse_time
from testbed.keys import SERVED_BY_ANNOTATION
from testbed.kube import api_client
from testbed.workloads import GPU, claim_spec, create_template, pod, request, wait_gone, wait_running


def state(cluster: ClusterState, api: k8s.ApiClient, namespace: str | None) -> dict[str, Any]:
    import ray

    fleet = environment.attach_fleet(cluster)
    hosts = fleet.describe(timeout_s=60)
    ray_nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
    leases = {}
    now = time.time()
    for lease in k8s.CoordinationV1Api(api).list_namespaced_lease("kube-node-lease").items:
        stamp = Server.read((lease.metadata.annotations or {}).get(SERVED_BY_ANNOTATION))
        renewed = lease.spec.renew_time
        leases[lease.metadata.name] = {
            "host": stamp.host if stamp else None,
            "incarnation": stamp.incarnation if stamp else None,
            "ray_node": stamp.machine if stamp else None,
            "renewed_s_ago": now - parse_time(renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")) if renewed else None,
        }
    ready = [
        n.metadata.name
        for n in k8s.CoreV1Api(api).list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    ]
    result: dict[str, Any] = {
        "hosts": hosts,
        "ray_nodes": ray_nodes,
        "leases": leases,
        "ready": sorted(ready),
        "held": {node: fleet.hardware_claims(node) for node in sorted(fleet.host_of)},
    }
    if namespace:
        pods = k8s.CoreV1Api(api).list_namespaced_pod(namespace).items
        result["pods"] = {p.metadata.name: {"node": p.spec.node_name, "phase": p.status.phase} for p in pods}
        claims = k8s.ResourceV1Api(api).list_namespaced_resource_claim(namespace).items
        results = {c.metadata.uid: c.status.allocation.devices.results if c.status.allocation else [] for c in claims}
        result["claims"] = {uid: [[r.driver, r.pool, r.device] for r in found] for uid, found in results.items()}
        result["leaks"] = fleet.leaks(namespace)
    return result


def workload(api: k8s.ApiClient, namespace: str, nodes: list[str]) -> dict[str, Any]:
    core = k8s.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    create_template(api, namespace, "gpu", claim_spec(request("gpu", GPU)))
    for node in nodes:
        core.create_namespaced_pod(namespace, pod(f"on-{node}", {"g": {"resourceClaimTemplateName": "gpu"}}, node=node))
    for node in nodes:
        wait_running(api, namespace, f"on-{node}")
    return {"running": len(nodes)}


def delete(api: k8s.ApiClient, namespace: str) -> dict[str, Any]:
    core = k8s.CoreV1Api(api)
    names = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    for name in names:
        core.delete_namespaced_pod(name, namespace)
    for name in names:
        wait_gone(api, namespace, name)
    resource = k8s.ResourceV1Api(api)
    deadline = time.monotonic() + 120
    while resource.list_namespaced_resource_claim(namespace).items:
        if time.monotonic() > deadline:
            raise SystemExit("the pods' claims were not deleted within 120 s")
        time.sleep(0.5)
    return {"deleted": len(names)}


def main() -> None:
    state_dir, name, verb, *rest = sys.argv[1:]
    cluster = ClusterState.load(cfg.ControlPlaneConfig(name=name, state_dir=Path(state_dir)).cluster_dir)
    api = api_client(cluster.kubeconfig)
    if verb == "state":
        out = state(cluster, api, rest[0] if rest else None)
    elif verb == "workload":
        out = workload(api, rest[0], rest[1:])
    elif verb == "delete":
        out = delete(api, rest[0])
    else:
        raise SystemExit(f"unknown verb {verb!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
