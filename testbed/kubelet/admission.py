"""Whether a kubelet takes a pod bound to its node: the checks kubelet v1.37 makes once,
when it first sees a pod, before anything of the pod starts (its predicate admit handler,
``pkg/kubelet/lifecycle/predicate.go``, and the scheduler's admission check it calls).

The scheduler keeps the pods it places within these bounds, so they matter for pods bound
by ``spec.nodeName`` (a load test's shortcut, a DaemonSet of old, a user's manifest), or
when a node's labels or taints change after a pod was placed. A refused pod never starts:
no claim of it is prepared, and it ends Failed with the refusal's reason.

Checked, in the kubelet's order, the first failure named: the ``kubernetes.io/os`` label
and ``spec.os``; a Strict supplementalGroupsPolicy on a node that cannot honour it; then
room for one more pod and for the pod's requests (CPU, memory, ephemeral storage, and
each extended resource or huge page size the node has), the node selector and required
node affinity, host ports, and NoExecute taints. Requests add up as the scheduler adds
them: sidecars with the containers, each init container over the sidecars before it,
pod-level requests for CPU and memory, and the pod's overhead. Extended resources the
node does not list, or that a DRA claim backs, are not counted.

Not modelled: the eviction manager's refusals under node pressure (a synthetic node is
never under pressure), sysctls, AppArmor, topology and the declared-features check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from testbed import quantity
from testbed.kubeapi import Obj

NODE_OS = "linux"
OS_LABEL = "kubernetes.io/os"
NODE_AFFINITY = "NodeAffinity"
NODE_PORTS = "NodePorts"
TAINT_TOLERATION = "TaintToleration"
OUT_OF = "OutOf"
DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
"""The extended resource every DeviceClass stands for, for pods a DRA claim serves."""
REJECTED = "Pod was rejected: "
"""The kubelet's prefix to the pod's status message (the Event's message goes without)."""
COUNTED_REASONS = frozenset(
    {
        "PodOSSelectorNodeLabelDoesNotMatch",
        "PodOSNotSupported",
        "SupplementalGroupsPolicyNotSupported",
        "OutOfcpu",
        "OutOfmemory",
        "OutOfephemeral-storage",
        "OutOfpods",
        "node(s) had taints that the pod didn't tolerate",
    }
)
"""Reasons ``kubelet_admission_rejections_total`` names as they are (of those checked
here); another OutOf... counts as OutOfExtendedResources, any other as Other. The taint
entry is the kubelet's: its list holds the scheduler's description, not the reason."""

_CPU, _MEMORY, _STORAGE, _PODS = "cpu", "memory", "ephemeral-storage", "pods"
_POD_LEVEL = (_CPU, _MEMORY)
_ALL_ADDRESSES = "0.0.0.0"


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str
    """The Event's message; the pod's status message is ``REJECTED + message``."""
    only_affinity: bool = False
    """The only failure is the node's labels: the kubelet reads the Node again and checks
    once more before it refuses (its cached Node may not have a new label yet)."""


def metric_reason(reason: str) -> str:
    """The ``reason`` label the kubelet counts a refusal under."""
    if reason in COUNTED_REASONS:
        return reason
    return "OutOfExtendedResources" if reason.startswith(OUT_OF) else "Other"


def refusal(pod: Obj, node: Obj, others: Iterable[Obj]) -> Refusal | None:
    """Why the kubelet of ``node`` refuses ``pod`` (None: it takes it), given the pods it
    already took and still runs (its active pods)."""
    spec = pod.get("spec", {})
    if pod.get("metadata", {}).get("labels", {}).get(OS_LABEL, NODE_OS) != NODE_OS:
        message = f"Failed to admit pod as the `{OS_LABEL}` label doesn't match node label"
        return Refusal("PodOSSelectorNodeLabelDoesNotMatch", message)
    if spec.get("os", {}).get("name", NODE_OS) != NODE_OS:
        return Refusal("PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
    strict = spec.get("securityContext", {}).get("supplementalGroupsPolicy") == "Strict"
    if strict and not node.get("status", {}).get("features", {}).get("supplementalGroupsPolicy"):
        message = "SupplementalGroupsPolicy=Strict is not supported in this node"
        return Refusal("SupplementalGroupsPolicyNotSupported", message)
    failures = _general_failures(pod, node, list(others))
    if not failures:
        return None
    first = failures[0]
    return Refusal(first.reason, first.message, only_affinity=all(f.reason == NODE_AFFINITY for f in failures))


def _general_failures(pod: Obj, node: Obj, others: list[Obj]) -> list[Refusal]:
    failures = _insufficient(pod, node, others)
    if not matches_required_affinity(pod, node):
        failures.append(_predicate(NODE_AFFINITY, "node(s) didn't match Pod's node affinity/selector"))
    wanted = host_ports(pod)
    if wanted and _port_conflict(wanted, [p for other in others for p in host_ports(other)]):
        failures.append(_predicate(NODE_PORTS, "node(s) didn't have free ports for the requested pod ports"))
    is_mirror = "kubernetes.io/config.mirror" in pod.get("metadata", {}).get("annotations", {})
    if not is_mirror and _untolerated_no_execute(node, pod):
        failures.append(_predicate(TAINT_TOLERATION, "node(s) had taints that the pod didn't tolerate"))
    return failures


def _predicate(name: str, description: str) -> Refusal:
    return Refusal(name, f"Predicate {name} failed: {description}")


# --- resources --------------------------------------------------------------------


def _amount(name: str, text: object) -> int:
    return quantity.parse_milli(str(text)) if name == _CPU else quantity.parse(str(text))


def _is_extended(name: str) -> bool:
    """Not a native resource (no domain, or the kubernetes.io one), nor a quota one."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _counted(name: str) -> bool:
    return name in (_CPU, _MEMORY, _STORAGE) or name.startswith("hugepages-") or "/" in name


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, 0) + amount


def _raise_to(total: dict[str, int], other: Mapping[str, int]) -> None:
    for name, amount in other.items():
        total[name] = max(total.get(name, 0), amount)


def pod_requests(pod: Obj, allocatable: Mapping[str, object] | None = None) -> dict[str, int]:
    """What the pod asks of its node, CPU in millicores, the rest in units; the sums the
    scheduler makes (resource helpers' PodRequests). With ``allocatable``, extended
    resources the node does not list, or that the pod's DRA claim backs, are left out, as
    the kubelet leaves them out before it checks."""
    spec = pod.get("spec", {})
    backed = {
        (m.get("containerName"), m.get("resourceName"))
        for m in (pod.get("status", {}).get("extendedResourceClaimStatus") or {}).get("requestMappings", [])
    }

    def requests(container: Obj) -> dict[str, int]:
        asked: dict[str, int] = {}
        for name, text in (container.get("resources", {}).get("requests") or {}).items():
            if not _counted(name):
                continue
            if (container.get("name"), name) in backed and (_is_extended(name) or name.startswith(DEVICE_CLASS_PREFIX)):
                continue
            if _is_extended(name) and allocatable is not None and name not in allocatable:
                continue
            asked[name] = _amount(name, text)
        return asked

    total: dict[str, int] = {}
    for container in spec.get("containers", []):
        _add(total, requests(container))
    sidecars: dict[str, int] = {}
    initializing: dict[str, int] = {}
    for container in spec.get("initContainers", []):
        asked = requests(container)
        if container.get("restartPolicy") == "Always":
            _add(total, asked)
            _add(sidecars, asked)
            _raise_to(initializing, sidecars)
        else:
            _add(asked, sidecars)
            _raise_to(initializing, asked)
    _raise_to(total, initializing)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name, text in pod_level.items():
        if name in _POD_LEVEL or name.startswith("hugepages-"):
            total[name] = _amount(name, text)
    for name, text in (spec.get("overhead") or {}).items():
        if _counted(name):
            _add(total, {name: _amount(name, text)})
    return total


def _insufficient(pod: Obj, node: Obj, others: list[Obj]) -> list[Refusal]:
    allocatable = node.get("status", {}).get("allocatable", {})
    failures: list[Refusal] = []
    allowed_pods = quantity.parse(str(allocatable.get(_PODS, "0")))
    if len(others) + 1 > allowed_pods:
        failures.append(_out_of(_PODS, 1, len(others), allowed_pods))
    asked = {name: amount for name, amount in pod_requests(pod, allocatable).items() if amount > 0}
    if not asked:
        return failures
    used: dict[str, int] = {}
    for other in others:
        _add(used, pod_requests(other, allocatable))
    first = (_CPU, _MEMORY, _STORAGE)  # the kubelet's order; then the others
    for name in sorted(asked, key=lambda n: (first.index(n) if n in first else len(first), n)):
        capacity = _amount(name, allocatable[name]) if name in allocatable else 0
        if asked[name] > capacity - used.get(name, 0):
            failures.append(_out_of(name, asked[name], used.get(name, 0), capacity))
    return failures


def _out_of(name: str, requested: int, used: int, capacity: int) -> Refusal:
    message = f"Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
    return Refusal(OUT_OF + name, message)


# --- node affinity ----------------------------------------------------------------


def matches_required_affinity(pod: Obj, node: Obj) -> bool:
    """The pod's nodeSelector and its required node affinity, against the node's labels
    (and, for matchFields, its name)."""
    spec = pod.get("spec", {})
    labels: Mapping[str, str] = node.get("metadata", {}).get("labels", {})
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    fields = {"metadata.name": node.get("metadata", {}).get("name", "")}
    return any(_term_matches(term, labels, fields) for term in required.get("nodeSelectorTerms", []))


def _term_matches(term: Obj, labels: Mapping[str, str], fields: Mapping[str, str]) -> bool:
    expressions, field_expressions = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not field_expressions:
        return False  # an empty term matches no node
    return all(_requirement_holds(r, labels) for r in expressions) and all(
        _requirement_holds(r, fields) for r in field_expressions
    )


def _requirement_holds(requirement: Obj, values: Mapping[str, str]) -> bool:
    key, operator, wanted = requirement.get("key", ""), requirement.get("operator"), requirement.get("values") or []
    present, value = key in values, values.get(key)
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(str(value)), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


# --- host ports and taints --------------------------------------------------------


def host_ports(pod: Obj) -> list[tuple[str, str, int]]:
    """(host IP, protocol, host port) the pod binds on its node: its containers' and its
    sidecars' (other init containers end before the pod runs)."""
    spec = pod.get("spec", {})
    long_lived = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    return [
        (p.get("hostIP") or _ALL_ADDRESSES, p.get("protocol") or "TCP", int(p["hostPort"]))
        for container in long_lived + spec.get("containers", [])
        for p in container.get("ports") or []
        if int(p.get("hostPort") or 0) > 0
    ]


def _port_conflict(wanted: list[tuple[str, str, int]], in_use: list[tuple[str, str, int]]) -> bool:
    for ip, protocol, port in wanted:
        for used_ip, used_protocol, used_port in in_use:
            if (protocol, port) != (used_protocol, used_port):
                continue
            if _ALL_ADDRESSES in (ip, used_ip) or ip == used_ip:
                return True
    return False


def _untolerated_no_execute(node: Obj, pod: Obj) -> bool:
    tolerations = pod.get("spec", {}).get("tolerations") or []
    return any(
        not any(_tolerates(t, taint) for t in tolerations)
        for taint in node.get("spec", {}).get("taints") or []
        if taint.get("effect") == "NoExecute"
    )


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")
