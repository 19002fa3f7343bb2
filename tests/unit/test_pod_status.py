"""A pod's status as the kubelet writes it (testbed/kubelet/podstatus.py), without I/O."""

from __future__ import annotations

from testbed.kubeapi import Obj
from testbed.kubelet import podstatus

STARTED, NOW, LATER = "2026-11-27T10:00:00Z", "2026-11-27T10:00:05Z", "2026-11-27T10:01:00Z"
IDS = {"main": "dra-testbed://u-main"}


def pod(generation: int = 1, gates: tuple[str, ...] = (), conditions: list[Obj] | None = None, **container: Obj) -> Obj:
    main = {"name": "main", "image": "registry.invalid/work", **container}
    spec: Obj = {"containers": [main]}
    if gates:
        spec["readinessGates"] = [{"conditionType": g} for g in gates]
    return {
        "metadata": {"uid": "u", "generation": generation},
        "spec": spec,
        "status": {"conditions": conditions or [{"type": "PodScheduled", "status": "True"}]},
    }


def by_type(status: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_running_pod_has_the_kubelets_five_conditions_in_its_order_each_at_the_pods_generation() -> None:
    status = podstatus.running_status(pod(generation=3), STARTED, IDS, NOW)
    assert [c["type"] for c in status["conditions"]] == list(podstatus.KUBELET_CONDITIONS)
    assert status["$setElementOrder/conditions"] == [{"type": t} for t in podstatus.KUBELET_CONDITIONS]
    assert all(c["status"] == "True" and c["observedGeneration"] == 3 for c in status["conditions"])
    assert status["observedGeneration"] == 3 and status["phase"] == "Running" and status["startTime"] == STARTED
    [container] = status["containerStatuses"]
    assert container["state"] == {"running": {"startedAt": STARTED}} and container["ready"] and container["started"]


def test_others_conditions_stay_first_and_a_condition_keeps_its_transition_while_its_status_stays() -> None:
    earlier = [
        {"type": "example.com/ready", "status": "True"},
        {"type": "Ready", "status": "True", "lastTransitionTime": STARTED},
    ]
    status = podstatus.running_status(pod(conditions=earlier), STARTED, IDS, NOW)
    order = [e["type"] for e in status["$setElementOrder/conditions"]]
    assert order == ["example.com/ready", *podstatus.KUBELET_CONDITIONS]
    assert "example.com/ready" not in by_type(status), "another's condition is not the kubelet's to write"
    assert by_type(status)["Ready"]["lastTransitionTime"] == STARTED
    assert by_type(status)["Initialized"]["lastTransitionTime"] == NOW


def test_ready_waits_for_the_readiness_gates_in_the_kubelets_words() -> None:
    warm = [{"type": "example.com/warm", "status": "False"}]
    gated = pod(gates=("example.com/lb", "example.com/warm"), conditions=warm)
    ready = by_type(podstatus.running_status(gated, STARTED, IDS, NOW))["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ReadinessGatesNotReady")
    assert ready["message"] == (
        'corresponding condition of pod readiness gate "example.com/lb" does not exist., '
        'the status of pod readiness gate "example.com/warm" is not "True", but False'
    )
    assert by_type(podstatus.running_status(gated, STARTED, IDS, NOW))["ContainersReady"]["status"] == "True"
    # Written as such: nothing more to write until a gate changes.
    gated["status"]["conditions"].append(ready)
    assert podstatus.readiness_update(gated, LATER) is None
    for condition in gated["status"]["conditions"]:
        if condition["type"] == "example.com/warm":
            condition["status"] = "True"
    gated["status"]["conditions"].append({"type": "example.com/lb", "status": "True"})
    update = podstatus.readiness_update(gated, LATER)
    assert update is not None and by_type(update)["Ready"]["status"] == "True"
    assert by_type(update)["Ready"]["reason"] is None and by_type(update)["Ready"]["message"] is None, "cleared"
    assert by_type(update)["Ready"]["lastTransitionTime"] == LATER


def test_a_completed_pods_sandbox_is_gone_and_its_containers_terminated_since_they_started() -> None:
    status = podstatus.ended_status(pod(), STARTED, IDS, podstatus.Ended.completed(LATER))
    conditions = by_type(status)
    assert status["phase"] == "Succeeded"
    assert (conditions["PodReadyToStartContainers"]["status"], conditions["PodReadyToStartContainers"]["reason"]) == (
        "False",
        "PodSandboxNotReady",
    )
    assert conditions["Initialized"]["reason"] == "PodCompleted" and conditions["Initialized"]["status"] == "True"
    assert conditions["Ready"]["reason"] == conditions["ContainersReady"]["reason"] == "PodCompleted"
    [container] = status["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert terminated == {
        "containerID": IDS["main"],
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": STARTED,
        "finishedAt": LATER,
    }
    assert not container["ready"] and not container["started"]


def test_a_pod_stopped_for_its_deletion_failed_as_a_container_ending_on_sigterm() -> None:
    status = podstatus.ended_status(pod(generation=2), STARTED, IDS, podstatus.Ended.stopped(LATER))
    conditions = by_type(status)
    assert status["phase"] == "Failed" and status["observedGeneration"] == 2
    assert conditions["Ready"]["reason"] == conditions["ContainersReady"]["reason"] == "PodFailed"
    assert "reason" not in conditions["Initialized"]
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


def test_a_container_status_names_its_image_as_a_runtime_does_its_mounts_and_its_resources() -> None:
    resources = {"requests": {"cpu": "100m"}, "limits": {"memory": "128Mi"}, "claims": [{"name": "gpu"}]}
    mounts = [{"name": "data", "mountPath": "/data", "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}]
    [status] = podstatus.running_status(pod(resources=resources, volumeMounts=mounts), STARTED, IDS, NOW)[
        "containerStatuses"
    ]
    assert status["image"] == "registry.invalid/work:latest"
    assert status["imageID"].startswith("registry.invalid/work@sha256:")
    assert status["resources"] == resources and status["allocatedResources"] == {"cpu": "100m"}
    assert status["volumeMounts"] == [
        {"name": "data", "mountPath": "/data", "readOnly": True, "recursiveReadOnly": "Disabled"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    [bare] = podstatus.running_status(pod(), STARTED, IDS, NOW)["containerStatuses"]
    assert bare["resources"] == {} and "allocatedResources" not in bare and "volumeMounts" not in bare
    assert podstatus.image_reference("localhost:5000/work") == "localhost:5000/work:latest", "a port is no tag"
    assert podstatus.image_reference("work:v1") == "work:v1"
    digested = "registry.invalid/work@sha256:" + "a" * 64
    assert podstatus.image_reference(digested) == podstatus.image_id(digested) == digested


def test_a_pod_whose_sandbox_could_not_be_made_waits_in_container_creating_and_fails_if_deleted() -> None:
    waiting = podstatus.waiting_status(pod(), "10.100.0.2", NOW)
    conditions = by_type(waiting)
    assert waiting["phase"] == "Pending" and waiting["hostIP"] == "10.100.0.2" and waiting["startTime"] == NOW
    assert (conditions["PodReadyToStartContainers"]["status"], conditions["PodReadyToStartContainers"]["message"]) == (
        "False",
        "no pod sandbox exists",
    )
    assert conditions["Ready"]["message"] == "containers with unready status: [main]"
    [container] = waiting["containerStatuses"]
    assert container["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert container["image"] == "registry.invalid/work" and container["imageID"] == ""
    assert "containerID" not in container, "the runtime never made it"
    gone = podstatus.never_ran_status(pod(generation=2), LATER)
    assert gone["phase"] == "Failed" and gone["observedGeneration"] == 2
    assert by_type(gone)["Ready"]["reason"] == "ContainersNotReady"
    terminated = gone["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "ContainerStatusUnknown")


def test_a_container_the_runtime_refused_waits_in_create_container_error_in_a_sandbox_that_exists() -> None:
    refused = podstatus.CreateFailed("100.64.0.9", "main", "failed to inject CDI devices: unresolvable")
    status = podstatus.waiting_status(pod(), "10.100.0.2", NOW, refused)
    assert status["podIP"] == "100.64.0.9" and status["phase"] == "Pending"
    assert by_type(status)["PodReadyToStartContainers"]["status"] == "True"
    assert by_type(status)["ContainersReady"]["reason"] == "ContainersNotReady"
    waiting = status["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "CreateContainerError", "message": refused.message}
