"""The kubelet's admission of a pod bound to its node: what it counts, in what order it
checks, and the words it refuses in (kubelet v1.37's predicate admit handler)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.kubeapi import Obj
from testbed.kubelet import admission


def node(allocatable: dict[str, str] | None = None, labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    return {
        "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", **(labels or {})}},
        "spec": spec,
        "status": {"allocatable": allocatable or {"cpu": "4", "memory": "8Gi", "pods": "3"}},
    }


def pod(*containers: Obj, init: list[Obj] | None = None, **spec: Any) -> Obj:
    body: Obj = {"metadata": {"name": "p"}, "spec": {"containers": list(containers) or [box()], **spec}}
    if init:
        body["spec"]["initContainers"] = init
    return body


def box(name: str = "main", ports: list[Obj] | None = None, restart: str | None = None, **requests: str) -> Obj:
    container: Obj = {"name": name, "resources": {"requests": requests}}
    if ports:
        container["ports"] = ports
    if restart:
        container["restartPolicy"] = restart
    return container


def test_a_pod_that_fits_beside_the_others_is_taken() -> None:
    others = [pod(box(cpu="1", memory="2Gi")), pod(box(cpu="1500m"))]
    assert admission.refusal(pod(box(cpu="1500m", memory="6Gi")), node(), others) is None


def test_a_pod_past_the_cpu_left_is_refused_in_the_kubelets_words() -> None:
    others = [pod(box(cpu="1", memory="2Gi")), pod(box(cpu="1500m"))]
    refused = admission.refusal(pod(box(cpu="1600m", memory="7Gi")), node(), others)
    assert refused == admission.Refusal(
        "OutOfcpu", "Node didn't have enough resource: cpu, requested: 1600, used: 2500, capacity: 4000"
    )
    assert admission.metric_reason(refused.reason) == "OutOfcpu"


def test_one_pod_more_than_the_node_holds_is_refused_first_whatever_else_fails() -> None:
    others = [pod(), pod(), pod()]
    refused = admission.refusal(pod(box(cpu="100")), node(), others)
    assert refused is not None
    assert (refused.reason, refused.message) == (
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3",
    )


def test_requests_add_up_as_the_scheduler_adds_them() -> None:
    """Sidecars run beside the containers; an init container runs over the sidecars
    started before it; pod-level requests replace the containers' CPU and memory; the
    overhead comes on top."""
    sidecar = box("proxy", restart="Always", cpu="500m", memory="1Gi")
    setup = box("setup", cpu="2", memory="512Mi")
    late_sidecar = box("late", restart="Always", cpu="100m")
    body = pod(box(cpu="1", memory="1Gi"), init=[sidecar, setup, late_sidecar], overhead={"cpu": "50m"})
    assert admission.pod_requests(body) == {"cpu": 2550, "memory": 2 * 2**30}
    body["spec"]["resources"] = {"requests": {"cpu": "3"}}
    assert admission.pod_requests(body) == {"cpu": 3050, "memory": 2 * 2**30}


def test_extended_resources_count_only_where_the_node_lists_them_and_no_dra_claim_backs_them() -> None:
    gpus = node({"cpu": "4", "memory": "8Gi", "pods": "10", "example.com/gpu": "2"})
    wants = pod(box(**{"example.com/gpu": "3", "example.com/fpga": "1"}))
    refused = admission.refusal(wants, gpus, [])
    assert refused is not None and refused.reason == "OutOfexample.com/gpu"
    assert admission.metric_reason(refused.reason) == "OutOfExtendedResources"
    wants["status"] = {
        "extendedResourceClaimStatus": {
            "resourceClaimName": "p-extended-resources-x",
            "requestMappings": [{"containerName": "main", "resourceName": "example.com/gpu", "requestName": "r0"}],
        }
    }
    assert admission.refusal(wants, gpus, []) is None


def test_a_device_class_resource_counts_unless_the_scheduler_mapped_it_to_a_claim() -> None:
    """``deviceclass.resource.kubernetes.io/<class>`` is a native name, which no node
    lists: only its DRA mapping keeps the pod in."""
    name = "deviceclass.resource.kubernetes.io/gpu.example.com"
    wants = pod(box(**{name: "1"}))
    refused = admission.refusal(wants, node(), [])
    assert refused is not None and refused.reason == f"OutOf{name}"
    mapping = {"containerName": "main", "resourceName": name, "requestName": "container-0-request-0"}
    wants["status"] = {"extendedResourceClaimStatus": {"resourceClaimName": "c", "requestMappings": [mapping]}}
    assert admission.refusal(wants, node(), []) is None


def test_a_node_selector_the_labels_miss_is_refused_after_a_fresh_look_at_the_node() -> None:
    refused = admission.refusal(pod(nodeSelector={"pool": "a"}), node(), [])
    assert refused == admission.Refusal(
        "NodeAffinity",
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
        only_affinity=True,
    )
    assert admission.refusal(pod(nodeSelector={"pool": "a"}), node(labels={"pool": "a"}), []) is None
    both = admission.refusal(pod(box(cpu="9"), nodeSelector={"pool": "a"}), node(), [])
    assert both is not None and both.reason == "OutOfcpu" and not both.only_affinity


def _required(*terms: Obj) -> Obj:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, False),
        ({"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["7"]}]}, True),
        ({"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["8"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}, False),
        ({}, False),
    ],
)
def test_required_node_affinity_reads_each_operator_as_the_scheduler_does(term: Obj, matches: bool) -> None:
    labelled = node(labels={"zone": "a", "gpus": "8"})
    assert admission.matches_required_affinity(pod(affinity=_required(term)), labelled) is matches
    either = _required({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}, term)
    assert admission.matches_required_affinity(pod(affinity=either), labelled) is matches


@pytest.mark.parametrize(
    ("wanted", "taken", "conflict"),
    [
        ({"hostPort": 80}, {"hostPort": 80}, True),
        ({"hostPort": 80, "hostIP": "10.0.0.1"}, {"hostPort": 80}, True),
        ({"hostPort": 80, "hostIP": "10.0.0.1"}, {"hostPort": 80, "hostIP": "10.0.0.2"}, False),
        ({"hostPort": 53, "protocol": "UDP"}, {"hostPort": 53}, False),
        ({"hostPort": 81}, {"hostPort": 80}, False),
    ],
)
def test_a_host_port_taken_on_the_node_refuses_the_pod(wanted: Obj, taken: Obj, conflict: bool) -> None:
    holder = pod(box(ports=[{"containerPort": 1, **taken}]))
    refused = admission.refusal(pod(box(ports=[{"containerPort": 1, **wanted}])), node(), [holder])
    assert (refused is not None and refused.reason == "NodePorts") is conflict


def test_a_sidecars_host_port_is_held_and_a_plain_init_containers_is_not() -> None:
    port = [{"containerPort": 1, "hostPort": 80}]
    wants = pod(box(ports=port))
    assert admission.refusal(wants, node(), [pod(init=[box("s", ports=port, restart="Always")])]) is not None
    assert admission.refusal(wants, node(), [pod(init=[box("i", ports=port)])]) is None


def test_only_an_untolerated_no_execute_taint_refuses_a_pod() -> None:
    tainted = node(taints=[{"key": "maintenance", "value": "yes", "effect": "NoExecute"}])
    refused = admission.refusal(pod(), tainted, [])
    assert refused is not None
    assert (refused.reason, refused.message) == (
        "TaintToleration",
        "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate",
    )
    assert admission.metric_reason(refused.reason) == "Other"
    assert admission.refusal(pod(), node(taints=[{"key": "k", "effect": "NoSchedule"}]), []) is None
    for toleration in (
        {"key": "maintenance", "operator": "Equal", "value": "yes", "effect": "NoExecute"},
        {"key": "maintenance", "operator": "Exists"},
        {"operator": "Exists"},
    ):
        assert admission.refusal(pod(tolerations=[toleration]), tainted, []) is None, toleration
    wrong_value = {"key": "maintenance", "operator": "Equal", "value": "no"}
    assert admission.refusal(pod(tolerations=[wrong_value]), tainted, []) is not None


def test_a_pod_for_another_os_is_refused_before_anything_is_counted() -> None:
    labelled = pod(box(cpu="100"))
    labelled["metadata"]["labels"] = {"kubernetes.io/os": "windows"}
    refused = admission.refusal(labelled, node(), [])
    assert refused is not None and refused.reason == "PodOSSelectorNodeLabelDoesNotMatch"
    refused = admission.refusal(pod(box(cpu="100"), os={"name": "windows"}), node(), [])
    assert refused == admission.Refusal(
        "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS"
    )
