"""The kubelet's node status sync, decided without I/O (testbed/kubelet/nodestatus.py)."""

from __future__ import annotations

import copy

from testbed.kubeapi import Obj
from testbed.kubelet import nodestatus
from testbed.kubelet.node import NodeSpec, node_status

CREATED = "2026-11-24T10:00:00Z"
NOW = "2026-11-24T10:05:00Z"


def as_the_api_has_it() -> Obj:
    """A Node's status as the API server answers after the kubelet's create: what it
    sent, plus what the server defaults."""
    status = copy.deepcopy(node_status(NodeSpec("node-0"))["status"])
    for condition in status["conditions"]:
        condition["lastHeartbeatTime"] = condition["lastTransitionTime"] = CREATED
    status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": 0}}
    return status


def own() -> Obj:
    return node_status(NodeSpec("node-0"))["status"]


def marked_unknown(status: Obj) -> Obj:
    """What the node lifecycle controller writes when the kubelet stopped posting."""
    marked = copy.deepcopy(status)
    for condition in marked["conditions"]:
        condition.update(
            status="Unknown",
            reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status.",
            lastTransitionTime="2026-11-24T10:03:00Z",
        )
    return marked


def test_an_unchanged_node_needs_only_heartbeats_and_they_are_all_the_patch_holds() -> None:
    observed = as_the_api_has_it()
    desired = nodestatus.refreshed(observed, own(), NOW)
    assert not nodestatus.changed(observed, desired), "the server's own defaults must not read as a change"
    assert desired["daemonEndpoints"] == observed["daemonEndpoints"]
    for condition in desired["conditions"]:
        assert condition["lastHeartbeatTime"] == NOW
        assert condition["lastTransitionTime"] == CREATED
    patch = nodestatus.status_patch(observed, desired)["status"]
    order = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    assert patch == {
        "$setElementOrder/conditions": [{"type": kind} for kind in order],
        "conditions": [{"type": kind, "lastHeartbeatTime": NOW} for kind in order],
    }


def test_a_node_marked_unknown_is_a_change_that_sets_each_condition_back_with_a_new_transition() -> None:
    observed = marked_unknown(as_the_api_has_it())
    desired = nodestatus.refreshed(observed, own(), NOW)
    assert nodestatus.changed(observed, desired)
    ready = next(c for c in desired["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "KubeletReady"
    assert ready["lastTransitionTime"] == NOW
    patch = nodestatus.status_patch(observed, desired)["status"]
    memory = next(c for c in patch["conditions"] if c["type"] == "MemoryPressure")
    assert memory == {
        "type": "MemoryPressure",
        "status": "False",
        "reason": "KubeletHasSufficientMemory",
        "message": "kubelet has sufficient memory available",
        "lastHeartbeatTime": NOW,
        "lastTransitionTime": NOW,
    }
    assert set(patch) == {"$setElementOrder/conditions", "conditions"}
    assert nodestatus.transition_events(observed, desired) == [
        "NodeHasSufficientMemory",
        "NodeHasNoDiskPressure",
        "NodeHasSufficientPID",
        "NodeReady",
    ]
    assert nodestatus.transition_events(desired, nodestatus.refreshed(desired, own(), NOW)) == []


def test_others_conditions_stay_and_the_kubelets_own_fields_are_put_back() -> None:
    observed = as_the_api_has_it()
    observed["conditions"].insert(0, {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"})
    observed["capacity"] = {**observed["capacity"], "pods": "10", "example.com/foo": "1"}
    observed["addresses"] = [{"type": "InternalIP", "address": "192.0.2.1"}]
    desired = nodestatus.refreshed(observed, own(), NOW)
    assert nodestatus.changed(observed, desired)
    assert desired["conditions"][0]["type"] == "NetworkUnavailable"
    assert desired["capacity"]["pods"] == "250"
    assert desired["capacity"]["example.com/foo"] == "1", "a kubelet keeps extended resources others added"
    patch = nodestatus.status_patch(observed, desired)["status"]
    assert patch["capacity"] == {"pods": "250"}
    assert patch["addresses"][-1] == {"$patch": "replace"}
    assert patch["addresses"][:-1] == own()["addresses"]
    assert patch["$setElementOrder/conditions"][0] == {"type": "NetworkUnavailable"}
    assert "NetworkUnavailable" not in {c["type"] for c in patch["conditions"]}


def test_a_pressure_condition_someone_removed_comes_back_with_its_event_ready_without() -> None:
    observed = as_the_api_has_it()
    observed["conditions"] = [c for c in observed["conditions"] if c["type"] not in ("DiskPressure", "Ready")]
    desired = nodestatus.refreshed(observed, own(), NOW)
    assert [c["type"] for c in desired["conditions"]] == ["MemoryPressure", "PIDPressure", "DiskPressure", "Ready"]
    assert nodestatus.transition_events(observed, desired) == ["NodeHasNoDiskPressure"]


def test_reports_come_every_5_minutes_the_first_and_those_after_a_change_spread_by_half() -> None:
    draws = iter([0.0, 1.0])
    clock = nodestatus.ReportClock(rand=lambda: next(draws))
    assert clock.due(0.0), "a kubelet that never reported reports at its first sync"
    clock.reported(0.0, changed=False)  # the first: spread, here by -50%
    assert not clock.due(149.0) and clock.due(150.0)
    clock.reported(150.0, changed=False)  # a periodic one: exactly 5 minutes on
    assert not clock.due(449.0) and clock.due(450.0)
    clock.reported(450.0, changed=True)  # after a change: spread again, here by +50%
    assert not clock.due(899.0) and clock.due(900.0)


def test_a_node_names_its_machine_as_a_real_kubelet_does_the_same_at_every_start() -> None:
    import re
    import uuid

    info = own()["nodeInfo"]
    assert info["kernelVersion"], "kubectl get nodes -o wide shows <unknown> for an empty one"
    assert re.fullmatch(r"[0-9a-f]{32}", info["machineID"]), info["machineID"]
    for key in ("systemUUID", "bootID"):
        uuid.UUID(info[key])
    assert node_status(NodeSpec("node-0"))["status"]["nodeInfo"] == info, "a changed bootID reads as a reboot"
    other = node_status(NodeSpec("node-1"))["status"]["nodeInfo"]
    assert all(other[key] != info[key] for key in ("machineID", "systemUUID", "bootID"))
