"""A pod's status as the kubelet writes it (testbed/kubelet/podstatus.py), without I/O."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from testbed.kubeapi import KubeClient, Obj, rfc3339
from testbed.kubelet import backoff, podstatus
from testbed.kubelet.backoff import back_off_syncs, go_duration, restart_delay
from testbed.kubelet.node import NodeSpec
from testbed.kubelet.plugins import PluginManager
from testbed.kubelet.pods import PodManager
from testbed.kubelet.probes import probe_plan
from testbed.tasks import cancel_and_wait

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
    gated["status"]["containerStatuses"] = podstatus.running_status(gated, STARTED, IDS, NOW)["containerStatuses"]
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
    assert conditions["Initialized"].get("reason") is None  # null in the patch: none is kept
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


def test_a_pod_whose_container_exits_non_zero_fails_each_container_showing_its_own_status() -> None:
    spec = pod()
    spec["spec"]["containers"].append({"name": "helper", "image": "registry.invalid/work"})
    ids = {**IDS, "helper": "dra-testbed://u-helper"}
    status = podstatus.ended_status(spec, STARTED, ids, podstatus.Ended.exited({"main": 3, "helper": 0}, LATER))
    assert status["phase"] == "Failed"
    assert by_type(status)["Ready"]["reason"] == by_type(status)["ContainersReady"]["reason"] == "PodFailed"
    ended = {c["name"]: c["state"]["terminated"] for c in status["containerStatuses"]}
    assert (ended["main"]["exitCode"], ended["main"]["reason"]) == (3, "Error")
    assert (ended["helper"]["exitCode"], ended["helper"]["reason"]) == (0, "Completed")
    all_done = podstatus.ended_status(spec, STARTED, ids, podstatus.Ended.exited({"main": 0, "helper": 0}, LATER))
    assert all_done["phase"] == "Succeeded"


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
    why = "failed to inject CDI devices: unresolvable"
    refused = podstatus.CreateFailed("100.64.0.9", {"main": ("CreateContainerError", why)})
    status = podstatus.waiting_status(pod(), "10.100.0.2", NOW, refused)
    assert status["podIP"] == "100.64.0.9" and status["phase"] == "Pending"
    assert by_type(status)["PodReadyToStartContainers"]["status"] == "True"
    assert by_type(status)["ContainersReady"]["reason"] == "ContainersNotReady"
    waiting = status["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "CreateContainerError", "message": why}
    # Deleted so: its sandbox, made, is now gone (not "no pod sandbox exists").
    gone = podstatus.never_ran_status(pod(), LATER, sandbox_made=True)
    assert by_type(gone)["PodReadyToStartContainers"]["message"] == "pod sandbox is not ready"


ON_42 = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]


def test_a_pod_that_may_restart_in_place_shows_all_containers_restarting_false_until_a_rule_fires() -> None:
    spec = pod(restartPolicy="Never", restartPolicyRules=ON_42)
    status = podstatus.running_status(spec, STARTED, IDS, NOW)
    assert [e["type"] for e in status["$setElementOrder/conditions"]][-1] == "AllContainersRestarting"
    restarting = by_type(status)["AllContainersRestarting"]
    assert restarting["status"] == "False" and "observedGeneration" not in restarting, "the kubelet gives it none"
    exited = podstatus.terminated_state(IDS["main"], STARTED, podstatus.Ended.exit_status(42, NOW))
    fired = {"main": podstatus.Restarted(0, IDS["main"], exited, {})}
    restarting = by_type(podstatus.running_status(spec, STARTED, IDS, NOW, restarted=fired))["AllContainersRestarting"]
    assert (restarting["status"], restarting["reason"]) == ("True", "RestartAllContainersStarted")
    exited_3 = podstatus.terminated_state(IDS["main"], STARTED, podstatus.Ended.exit_status(3, NOW))
    other_exit = {"main": podstatus.Restarted(0, IDS["main"], exited_3, {})}
    assert (
        by_type(podstatus.running_status(spec, STARTED, IDS, NOW, restarted=other_exit))["AllContainersRestarting"][
            "status"
        ]
        == "False"
    )
    ended = podstatus.ended_status(spec, STARTED, IDS, podstatus.Ended.stopped(LATER))
    assert by_type(ended)["AllContainersRestarting"]["reason"] == "PodFailed"
    assert "AllContainersRestarting" not in by_type(podstatus.running_status(pod(), STARTED, IDS, NOW))


def test_restarted_in_place_every_container_waits_counted_once_more_the_one_before_ended_so() -> None:
    spec = with_inits(CHECK, PROXY, containers=("main", "agent"))
    spec["spec"]["containers"][0].update(restartPolicy="Never", restartPolicyRules=ON_42)
    spec["status"]["conditions"].append({"type": "Initialized", "status": "True"})
    inits = podstatus.InitRun().then(STARTED, STARTED).then(STARTED)
    exited = podstatus.terminated_state(ALL_IDS["main"], STARTED, podstatus.Ended.exit_status(42, NOW))
    fired = {"main": podstatus.Restarted(0, ALL_IDS["main"], exited, {})}
    before = podstatus.running_status(spec, STARTED, ALL_IDS, NOW, inits, fired)
    status = podstatus.restarting_status(spec, before, LATER)
    statuses = {s["name"]: s for s in [*status["initContainerStatuses"], *status["containerStatuses"]]}
    removed = {"reason": "RestartingAllContainers", "message": podstatus.RESTARTING_ALL_MESSAGE}
    for name in ("check", "proxy", "main", "agent"):
        assert statuses[name]["state"] == {"waiting": removed}, name
        assert statuses[name]["lastState"] == {"terminated": {"exitCode": 137, **removed}}, name
        assert statuses[name]["restartCount"] == 1, name
    assert statuses["main"]["containerID"] == ALL_IDS["main"] and statuses["check"]["ready"], "ended: as it was shown"
    assert "containerID" not in statuses["agent"] and statuses["agent"]["imageID"] == "", "it ran: known by its spec"
    assert status["phase"] == "Running"
    conditions = by_type(status)
    assert conditions["Initialized"]["status"] == "True", "once initialized, it stays so"
    assert conditions["AllContainersRestarting"]["status"] == "False"
    assert conditions["AllContainersRestarting"]["reason"] is None, "null in the patch: the True one's words go"

    # The init containers run again, each as a container of its own; the pod's own wait.
    carried = {"check": podstatus.Restarted(1, "dra-testbed://u-check-1", {}, statuses["check"]["lastState"])}
    again = podstatus.InitRun(carried=carried).then(LATER)
    mains = {n: podstatus.Restarted.shown(status, n) for n in ("main", "agent")}
    running = podstatus.initializing_status(spec, STARTED, ALL_IDS, again, ADDRESSES, LATER, restarted=mains)
    check = running["initContainerStatuses"][0]
    assert check["state"] == {"running": {"startedAt": LATER}} and check["restartCount"] == 1
    assert check["containerID"] == "dra-testbed://u-check-1" and check["lastState"] == statuses["check"]["lastState"]
    waiting = {s["name"]: s for s in running["containerStatuses"]}
    assert waiting["main"]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert (waiting["main"]["restartCount"], waiting["main"]["lastState"]) == (1, statuses["main"]["lastState"])
    assert running["phase"] == "Pending" and by_type(running)["Initialized"]["status"] == "True"


def test_restarted_in_place_by_an_init_container_the_pod_waits_pending_its_own_never_started() -> None:
    spec = with_inits(CHECK, {**CHECK, "name": "quick", "restartPolicy": "Never", "restartPolicyRules": ON_42})
    exited = podstatus.terminated_state(ALL_IDS["quick"], NOW, podstatus.Ended.exit_status(42, NOW))
    inits = podstatus.InitRun().then(STARTED, STARTED).then(NOW).failed(podstatus.Restarted(0, "", exited, {}))
    before = podstatus.initializing_status(spec, STARTED, ALL_IDS, inits, ADDRESSES, NOW)
    assert by_type(before)["AllContainersRestarting"]["status"] == "True"
    status = podstatus.restarting_status(spec, before, LATER)
    assert [s["restartCount"] for s in status["initContainerStatuses"]] == [1, 1]
    [main] = status["containerStatuses"]
    assert main["state"] == {"waiting": {"reason": "PodInitializing"}} and main["restartCount"] == 0
    assert status["phase"] == "Pending" and by_type(status)["Initialized"]["status"] == "False"


def test_a_spec_change_is_observed_on_the_status_and_the_kubelets_own_conditions_only() -> None:
    running = podstatus.running_status(pod(), STARTED, IDS, NOW)
    changed = pod(generation=3, conditions=[{"type": "example.com/ready", "status": "True"}, *running["conditions"]])
    update = podstatus.generation_update(changed)
    assert update["observedGeneration"] == 3
    assert update["conditions"] == [{"type": t, "observedGeneration": 3} for t in podstatus.KUBELET_CONDITIONS]


def test_an_ephemeral_container_is_listed_never_ready_and_without_a_started_flag() -> None:
    debugger = {"name": "debugger", "image": "registry.invalid/debug"}
    status = podstatus.ephemeral_status(debugger, "dra-testbed://u-debugger", {"running": {"startedAt": NOW}})
    assert "started" not in status and status["ready"] is False and status["resources"] == {}
    assert status["image"] == "registry.invalid/debug:latest" and status["imageID"]


def with_inits(*inits: Obj, containers: tuple[str, ...] = ("main",)) -> Obj:
    spec = pod()
    spec["spec"]["initContainers"] = list(inits)
    spec["spec"]["containers"] = [{"name": n, "image": "registry.invalid/work"} for n in containers]
    return spec


CHECK = {"name": "check", "image": "registry.invalid/check"}
PROXY = {"name": "proxy", "image": "registry.invalid/proxy", "restartPolicy": "Always"}
ALL_IDS = {n: f"dra-testbed://u-{n}" for n in ("check", "quick", "proxy", "main", "agent")}
ADDRESSES = {"podIP": "100.64.0.9"}


def test_a_container_whose_image_was_not_pulled_waits_for_that_reason_init_or_not() -> None:
    spec = with_inits(CHECK, {**CHECK, "name": "quick"}, containers=("main", "agent"))
    pulled_not = ("ErrImagePull", "pull QPS exceeded")
    done = podstatus.InitRun().then(NOW).ended(NOW)
    held = podstatus.initializing_status(spec, STARTED, ALL_IDS, done, ADDRESSES, LATER, waits={"quick": pulled_not})
    states = [c["state"] for c in held["initContainerStatuses"]]
    assert "terminated" in states[0] and states[1] == {
        "waiting": {"reason": "ErrImagePull", "message": "pull QPS exceeded"}
    }
    assert by_type(held)["Initialized"]["status"] == "False" and held["phase"] == "Pending"
    both = podstatus.InitRun().then(NOW).ended(NOW).then(NOW).ended(NOW)
    mains = podstatus.initializing_status(spec, STARTED, ALL_IDS, both, ADDRESSES, LATER, waits={"agent": pulled_not})
    assert by_type(mains)["Initialized"]["status"] == "True" and mains["phase"] == "Pending"
    agent, main = mains["containerStatuses"]
    assert (
        agent["state"]["waiting"]["reason"] == "ErrImagePull"
        and main["state"]["waiting"]["reason"] == "PodInitializing"
    )
    waiting = podstatus.waiting_status(
        pod(), "10.100.0.2", NOW, podstatus.CreateFailed("100.64.0.9", {"main": pulled_not})
    )
    assert waiting["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"


def test_containers_started_while_another_waits_for_its_image_run_and_are_stopped_with_the_pod() -> None:
    """The kubelet starts the containers whose image it has: they run (ready, unless a
    probe holds them back) while the pod stays Pending for the one that waits; deleted
    then, those that ran end stopped and the one that never ran ContainerStatusUnknown."""
    spec = pod()
    spec["spec"]["containers"] = [
        {"name": n, "image": f"registry.invalid/{n}", **probes}
        for n, probes in [
            ("main", {}),
            ("agent", {}),
            ("probed", {"readinessProbe": {"exec": {"command": ["true"]}}}),
            ("done", {}),
        ]
    ]
    ids = {n: f"dra-testbed://u-{n}" for n in ("main", "agent", "probed", "done")}
    running = {"running": {"startedAt": STARTED}}
    ended = podstatus.terminated_state(ids["done"], STARTED, podstatus.Ended.completed(STARTED))
    early = {n: podstatus.Restarted(0, ids[n], running, {}) for n in ("main", "probed")}
    early["done"] = podstatus.Restarted(0, ids["done"], ended, {})
    failed = podstatus.CreateFailed("100.64.0.9", {"agent": ("ErrImagePull", "pull QPS exceeded")})
    status = podstatus.waiting_status(spec, "10.100.0.2", NOW, failed, early, {"probed": "unready"})
    shown = {c["name"]: (next(iter(c["state"])), c["ready"], c["started"]) for c in status["containerStatuses"]}
    assert shown == {
        "agent": ("waiting", False, False),
        "done": ("terminated", False, False),
        "main": ("running", True, True),
        "probed": ("running", False, True),
    }
    assert [c["name"] for c in status["containerStatuses"]] == ["agent", "done", "main", "probed"]
    assert status["containerStatuses"][2]["containerID"] == ids["main"] and status["phase"] == "Pending"
    conditions = by_type(status)
    assert conditions["Initialized"]["status"] == "True"
    assert conditions["Ready"]["message"] == "containers with unready status: [agent probed done]"

    gone = podstatus.never_ran_status(spec, LATER, sandbox_made=True, started_early=early)
    states = {c["name"]: c["state"]["terminated"] for c in gone["containerStatuses"]}
    assert states["agent"]["reason"] == "ContainerStatusUnknown" and states["done"]["reason"] == "Completed"
    assert (states["main"]["exitCode"], states["main"]["startedAt"], states["main"]["finishedAt"]) == (
        podstatus.STOPPED_EXIT_CODE,
        STARTED,
        LATER,
    )
    assert gone["phase"] == "Failed" and not any(c["ready"] for c in gone["containerStatuses"])


def test_while_an_init_container_runs_the_pod_is_pending_and_its_containers_wait_listed_by_name() -> None:
    spec = with_inits(CHECK, {**CHECK, "name": "quick"}, containers=("main", "agent"))
    status = podstatus.initializing_status(spec, STARTED, ALL_IDS, podstatus.InitRun().then(NOW), ADDRESSES, NOW)
    conditions = by_type(status)
    assert status["phase"] == "Pending" and status["podIP"] == "100.64.0.9"
    assert conditions["PodReadyToStartContainers"]["status"] == "True"
    assert (conditions["Initialized"]["status"], conditions["Initialized"]["message"]) == (
        "False",
        "containers with incomplete status: [check quick]",
    )
    assert conditions["Ready"]["message"] == "containers with unready status: [main agent]", "in the spec's order"
    assert [c["name"] for c in status["containerStatuses"]] == ["agent", "main"], "sorted by name, as the kubelet"
    assert all(c["state"] == {"waiting": {"reason": "PodInitializing"}} for c in status["containerStatuses"])
    running, waiting = status["initContainerStatuses"]
    assert running["state"] == {"running": {"startedAt": NOW}} and running["started"] and not running["ready"]
    assert waiting["state"] == {"waiting": {"reason": "PodInitializing"}} and "containerID" not in waiting


def test_a_restarted_kubelet_reads_how_far_the_init_containers_got_up_to_the_one_running() -> None:
    """A sidecar running does not stop the reading, the regular init container running
    does (it is the last that ran); nothing after it counts."""
    spec = with_inits(PROXY, CHECK, {**CHECK, "name": "quick"})
    run = podstatus.InitRun().then(STARTED).then(STARTED, NOW).then(NOW)  # quick runs now
    status = podstatus.initializing_status(spec, STARTED, ALL_IDS, run, ADDRESSES, NOW)
    assert podstatus.InitRun.so_far({**spec, "status": status}) == run
    assert podstatus.InitRun.from_status({**spec, "status": status}) is None, "not all of them ran"
    running = podstatus.InitRun().then(STARTED).then(STARTED)  # check runs: quick never started
    status = podstatus.initializing_status(spec, STARTED, ALL_IDS, running, ADDRESSES, NOW)
    assert podstatus.InitRun.so_far({**spec, "status": status}) == running
    assert podstatus.InitRun.so_far(spec) == podstatus.InitRun(), "no status: nothing ran"


def test_init_containers_done_show_completed_and_a_sidecar_runs_beside_the_pods_containers() -> None:
    spec = with_inits(CHECK, PROXY)
    run = podstatus.InitRun().then(STARTED).ended(NOW).then(NOW)
    status = podstatus.running_status(spec, NOW, ALL_IDS, NOW, run)
    assert all(c["status"] == "True" for c in status["conditions"])
    check, proxy = status["initContainerStatuses"]
    assert check["state"]["terminated"]["reason"] == "Completed" and check["ready"] and not check["started"]
    assert proxy["state"] == {"running": {"startedAt": NOW}} and proxy["ready"] and proxy["started"]
    assert podstatus.InitRun.from_status({**spec, "status": status}) == run, "a restarted kubelet reads it back"
    assert podstatus.InitRun.from_status(spec) is None
    # Not yet ready: the sidecar is listed first.
    waiting = podstatus.waiting_status(spec, "10.100.0.2", NOW)
    assert by_type(waiting)["ContainersReady"]["message"] == "containers with unready status: [proxy main]"
    # The pod's containers complete: the sidecar is stopped, the pod Succeeded all the same.
    done = podstatus.ended_status(spec, NOW, ALL_IDS, podstatus.Ended.completed(LATER), run)
    assert done["phase"] == "Succeeded" and by_type(done)["Initialized"]["reason"] == "PodCompleted"
    assert done["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert done["initContainerStatuses"][1]["state"]["terminated"]["exitCode"] == podstatus.STOPPED_EXIT_CODE


def test_a_sidecar_started_again_for_its_new_image_shows_its_count_and_the_one_stopped_before() -> None:
    spec = with_inits(CHECK, PROXY)
    run = podstatus.InitRun().then(STARTED).ended(NOW).then(NOW)
    stopped = podstatus.terminated_state(ALL_IDS["proxy"], NOW, podstatus.Ended.stopped(LATER))
    again = run.started_again(1, "proxy", podstatus.Restarted(1, "dra-testbed://u-proxy-1", {}, stopped), LATER)
    check, proxy = podstatus.running_status(spec, NOW, ALL_IDS, LATER, again)["initContainerStatuses"]
    assert check["state"]["terminated"]["finishedAt"] == NOW and check["restartCount"] == 0, "left as it ran"
    assert proxy["state"] == {"running": {"startedAt": LATER}} and proxy["containerID"] == "dra-testbed://u-proxy-1"
    assert proxy["restartCount"] == 1 and proxy["lastState"]["terminated"]["exitCode"] == podstatus.STOPPED_EXIT_CODE
    assert again.runs(1) and not again.runs(0)


def test_an_ephemeral_container_not_made_yet_waits_as_the_spec_names_it() -> None:
    debugger = {"name": "debugger", "image": "registry.invalid/debug"}
    status = podstatus.ephemeral_status(debugger, "", {"waiting": {"reason": "PodInitializing"}})
    assert status == {
        "name": "debugger",
        "image": "registry.invalid/debug",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "lastState": {},
        "state": {"waiting": {"reason": "PodInitializing"}},
    }


def test_a_sidecar_whose_probes_have_not_passed_is_not_started_or_not_ready_and_holds_the_pod_unready() -> None:
    spec = with_inits(CHECK, PROXY)
    run = podstatus.InitRun().then(STARTED).ended(NOW).then(NOW)
    starting = podstatus.initializing_status(spec, STARTED, ALL_IDS, run, ADDRESSES, NOW, {"proxy": "starting"})
    proxy = starting["initContainerStatuses"][1]
    assert "running" in proxy["state"] and (proxy["started"], proxy["ready"]) == (False, False)
    unready = podstatus.running_status(spec, NOW, ALL_IDS, NOW, run, probing={"proxy": "unready"})
    proxy = unready["initContainerStatuses"][1]
    assert (proxy["started"], proxy["ready"]) == (True, False)
    assert by_type(unready)["ContainersReady"]["message"] == "containers with unready status: [proxy]"


def test_a_pod_deleted_before_it_initialized_fails_with_its_containers_never_started() -> None:
    spec = with_inits(CHECK, {**CHECK, "name": "quick"})
    stopped = podstatus.stopped_initializing_status(spec, ALL_IDS, podstatus.InitRun().then(NOW), LATER)
    conditions = by_type(stopped)
    assert stopped["phase"] == "Failed"
    assert conditions["PodReadyToStartContainers"]["message"] == "pod sandbox is not ready"
    assert conditions["Initialized"]["message"] == "containers with incomplete status: [check quick]"
    assert conditions["Ready"]["reason"] == "ContainersNotReady", "worked out for the Pending pod it was"
    assert stopped["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == podstatus.STOPPED_EXIT_CODE
    assert stopped["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    # Its sandbox never made: only the first init container is marked as lost.
    gone = podstatus.never_ran_status(spec, LATER)
    first, second = gone["initContainerStatuses"]
    assert first["state"]["terminated"]["reason"] == "ContainerStatusUnknown"
    assert second["state"] == gone["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_an_init_container_that_exits_non_zero_shows_its_status_and_fails_a_pod_that_never_restarts() -> None:
    spec = with_inits(CHECK, {**CHECK, "name": "quick"})
    exited = podstatus.terminated_state(ALL_IDS["check"], STARTED, podstatus.Ended.exit_status(2, NOW))
    running = {"running": {"startedAt": LATER}}
    again = podstatus.InitRun().then(STARTED).failed(podstatus.Restarted(1, "dra-testbed://u-check-1", running, exited))
    pending = podstatus.initializing_status(spec, STARTED, ALL_IDS, again, ADDRESSES, LATER)
    check, quick = pending["initContainerStatuses"]
    assert pending["phase"] == "Pending" and (check["restartCount"], check["state"]) == (1, running)
    assert check["lastState"]["terminated"]["exitCode"] == 2 and check["lastState"]["terminated"]["reason"] == "Error"
    assert quick["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert again.runs(0) and not again.failed(podstatus.Restarted(0, "", exited, {})).runs(0)
    # restartPolicy Never: the pod fails there.
    failed_run = (
        podstatus.InitRun().then(STARTED).failed(podstatus.Restarted(0, ALL_IDS["check"], exited, {})).ended(NOW)
    )
    failed = podstatus.failed_initializing_status(spec, ALL_IDS, failed_run, LATER)
    assert failed["phase"] == "Failed" and not failed_run.runs(0)
    assert failed["initContainerStatuses"][0]["state"] == exited
    assert by_type(failed)["Initialized"]["message"] == "containers with incomplete status: [check quick]"
    assert failed["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


class StatusWrites:
    """An API server that keeps the pod manager's status writes and takes its delete."""

    def __init__(self) -> None:
        self.statuses: list[Obj] = []
        self.deletes = 0
        self.events: list[Obj] = []

    async def create(self, path: str, body: Obj) -> Obj:
        self.events.append(body)
        return body

    async def patch(self, path: str, body: Obj, kind: str) -> Obj:
        self.statuses.append(body["status"])
        return {}

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        self.deletes += 1
        return {}


def test_the_pod_manager_runs_init_containers_first_and_writes_each_state_once(tmp_path: Path) -> None:
    """Pending while the init container runs, Running once it completed, Succeeded when the
    pod's own container ends; deleted afterwards, the pod gets no second terminal status."""
    api = StatusWrites()
    manager = PodManager(cast(KubeClient, api), NodeSpec("node"), cast(PluginManager, None), tmp_path / "cdi")
    meta = {"namespace": "ns", "name": "job", "uid": "u", "generation": 1}
    spec = {
        "restartPolicy": "Never",
        "initContainers": [{"name": "check", "image": "registry.invalid/check", "command": ["sleep", "0.05"]}],
        "containers": [{"name": "main", "image": "registry.invalid/work", "command": ["sleep", "0.05"]}],
    }
    pod = {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}

    async def until_written(count: int) -> None:
        deadline = time.monotonic() + 5
        while len(api.statuses) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        manager.observe("ADDED", pod)
        await until_written(3)
        deleting = {**meta, "deletionTimestamp": "2026-11-28T00:00:00Z"}
        manager.observe("MODIFIED", {**pod, "metadata": deleting, "status": {"phase": "Succeeded"}})
        await asyncio.wait_for(asyncio.gather(*manager._workers.values()), 5)
        await asyncio.wait_for(manager.events_sent(), 5)

    asyncio.run(scenario())
    assert [s["phase"] for s in api.statuses] == ["Pending", "Running", "Succeeded"]
    told = [(e["involvedObject"]["fieldPath"], e["reason"]) for e in api.events]
    started = ["Pulling", "Pulled", "Created", "Started"]
    assert told == [("spec.initContainers{check}", r) for r in started] + [
        ("spec.containers{main}", r) for r in started
    ], "each container's start told in order, and no Killing: it completed before the deletion"
    initializing, running, done = api.statuses
    assert "running" in initializing["initContainerStatuses"][0]["state"]
    assert running["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert done["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert api.deletes == 1


def start_after_a_restart(api: StatusWrites, tmp_path: Path, pod: Obj) -> Obj:
    """A pod manager as a kubelet restarted on its node (its checkpoint there) takes the
    pod on, as its status shows it: its first Running status."""
    checkpoint = tmp_path / "dra_manager_state.json"
    checkpoint.write_text("[]")
    manager = PodManager(
        cast(KubeClient, api), NodeSpec("node"), cast(PluginManager, None), tmp_path / "cdi", checkpoint=checkpoint
    )
    manager.dra.load_checkpoint()

    async def scenario() -> None:
        manager.observe("ADDED", pod)
        deadline = time.monotonic() + 5
        while not any(s["phase"] == "Running" for s in api.statuses) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await cancel_and_wait(*manager._workers.values())
        await asyncio.wait_for(manager.events_sent(), 5)

    asyncio.run(scenario())
    return next(s for s in api.statuses if s["phase"] == "Running")


def test_a_kubelet_restarted_while_a_pod_initializes_goes_on_where_the_one_before_stopped(tmp_path: Path) -> None:
    """As the real kubelet finds the pod's sandbox and containers in the runtime: the init
    container that completed is not run again, the one running ends at its own time
    (its start kept), and only what had not started yet is started (told so)."""
    api = StatusWrites()
    began = float(int(time.time())) - 1.0  # whole seconds, as timestamps are written
    meta = {"namespace": "ns", "name": "job", "uid": "u", "generation": 1}
    spec = {
        "restartPolicy": "Never",
        "initContainers": [
            {"name": "first", "image": "registry.invalid/first", "command": ["sleep", "0"]},
            {"name": "second", "image": "registry.invalid/second", "command": ["sleep", "1.5"]},
        ],
        "containers": [{"name": "main", "image": "registry.invalid/work", "command": ["sleep", "3600"]}],
    }
    before = podstatus.initializing_status(
        {"metadata": meta, "spec": spec},
        rfc3339(began - 1),
        {c["name"]: f"dra-testbed://u-{c['name']}" for c in [*spec["initContainers"], *spec["containers"]]},
        podstatus.InitRun(((rfc3339(began - 1), rfc3339(began - 1)), (rfc3339(began), ""))),
        {"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]},
        rfc3339(began),
    )
    pod = {"metadata": meta, "spec": spec, "status": {**before, "phase": "Pending"}}

    running = start_after_a_restart(api, tmp_path, pod)
    second = running["initContainerStatuses"][1]["state"]["terminated"]
    assert second["startedAt"] == rfc3339(began) and second["finishedAt"] == rfc3339(began + 1.5)
    assert running["podIP"] == "10.0.0.5", "the sandbox, and so its IP, outlived the restart"
    told = [(e["involvedObject"]["fieldPath"], e["reason"]) for e in api.events]
    assert told == [("spec.containers{main}", r) for r in ("Pulling", "Pulled", "Created", "Started")]


def test_a_kubelet_restarted_while_a_container_waits_for_its_image_keeps_those_started_meanwhile(
    tmp_path: Path,
) -> None:
    """The containers started while another waited for its image run on through the
    kubelet's restart (their start kept, nothing told again); the one that waited starts."""
    api = StatusWrites()
    spec = pod()
    spec["metadata"] |= {"namespace": "ns", "name": "web"}
    spec["spec"]["containers"] = [{"name": n, "image": f"registry.invalid/{n}:v1"} for n in ("main", "agent")]
    early = {"main": podstatus.Restarted(0, "dra-testbed://u-main", {"running": {"startedAt": STARTED}}, {})}
    failed = podstatus.CreateFailed("100.64.0.9", {"agent": ("ErrImagePull", "pull QPS exceeded")})
    spec["status"] = podstatus.waiting_status(spec, "10.100.0.2", NOW, failed, early)

    running = start_after_a_restart(api, tmp_path, spec)
    states = {c["name"]: c["state"]["running"]["startedAt"] for c in running["containerStatuses"]}
    assert states["main"] == STARTED and states["agent"] != STARTED
    told = [(e["involvedObject"]["fieldPath"], e["reason"]) for e in api.events]
    assert told == [("spec.containers{agent}", r) for r in ("Pulling", "Pulled", "Created", "Started")]


def test_the_pod_manager_starts_a_running_container_again_with_its_new_image_and_leaves_a_completed_one(
    tmp_path: Path,
) -> None:
    api = StatusWrites()
    manager = PodManager(cast(KubeClient, api), NodeSpec("node"), cast(PluginManager, None), tmp_path / "cdi")
    meta = {"namespace": "ns", "name": "web", "uid": "u", "generation": 1}
    main = {"name": "main", "image": "registry.invalid/work:v1", "command": ["sleep", "3600"]}
    done = {"name": "done", "image": "registry.invalid/done:v1", "command": ["sh", "-c", "exit 0"]}
    done["restartPolicy"] = "Never"
    pod = {"metadata": meta, "spec": {"containers": [main, done]}, "status": {"phase": "Pending"}}

    def shown(status: Obj) -> dict[str, tuple[str, int]]:
        return {c["name"]: (c["image"], c["restartCount"]) for c in status.get("containerStatuses", [])}

    async def until(check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 5
        while not check() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        manager.observe("ADDED", pod)
        await until(lambda: any("terminated" in c["state"] for s in api.statuses for c in s["containerStatuses"]))
        images = {"main": "registry.invalid/work:v2", "done": "registry.invalid/done:v2"}
        changed = {"containers": [{**c, "image": images[c["name"]]} for c in (main, done)]}
        status = {"phase": "Running", "observedGeneration": 1}
        manager.observe("MODIFIED", {"metadata": {**meta, "generation": 2}, "spec": changed, "status": status})
        await until(lambda: shown(api.statuses[-1]).get("main", ("", 0))[1] == 1)
        deleting = {**meta, "generation": 3, "deletionTimestamp": "2026-11-28T00:00:00Z"}
        manager.observe("MODIFIED", {"metadata": deleting, "spec": changed, "status": status})
        await asyncio.wait_for(asyncio.gather(*manager._workers.values()), 5)
        await asyncio.wait_for(manager.events_sent(), 5)

    asyncio.run(scenario())
    restarted = next(s for s in api.statuses if shown(s).get("main", ("", 0))[1] == 1)
    assert shown(restarted) == {"done": ("registry.invalid/done:v1", 0), "main": ("registry.invalid/work:v2", 1)}
    main_status = next(c for c in restarted["containerStatuses"] if c["name"] == "main")
    assert main_status["lastState"]["terminated"]["exitCode"] == podstatus.STOPPED_EXIT_CODE
    assert "running" in main_status["state"] and main_status["containerID"].endswith("-main-1")
    told = [
        (e["reason"], e["message"]) for e in api.events if e["involvedObject"]["fieldPath"] == "spec.containers{main}"
    ]
    assert told[4:7] == [
        ("Killing", "Container main definition changed, will be restarted"),
        ("Pulling", 'Pulling image "registry.invalid/work:v2"'),
        ("Pulled", told[6][1]),
    ]


def test_a_container_that_exits_at_once_is_shown_exited_from_its_first_status_never_running(tmp_path: Path) -> None:
    """As the kubelet's first status after a start comes from the relist that finds such a
    container gone: exited (then started again at once and exited, counted once), its pod
    never Ready; a pod whose containers all exit so keeps its phase until it ends."""
    api = StatusWrites()
    manager = PodManager(cast(KubeClient, api), NodeSpec("node"), cast(PluginManager, None), tmp_path / "cdi")
    main = {"name": "main", "image": "registry.invalid/work:v1", "command": ["sleep", "3600"]}
    quick = {"name": "quick", "image": "registry.invalid/quick:v1", "command": ["sh", "-c", "exit 2"]}
    beside = {"metadata": {"namespace": "ns", "name": "beside", "uid": "b", "generation": 1}}
    beside |= {"spec": {"containers": [main, quick]}, "status": {"phase": "Pending"}}
    fails = {"metadata": {"namespace": "ns", "name": "fails", "uid": "f", "generation": 1}}
    fails |= {"spec": {"restartPolicy": "Never", "containers": [quick]}, "status": {"phase": "Pending"}}
    written: dict[str, list[Obj]] = {"beside": [], "fails": []}

    async def patch(path: str, body: Obj, kind: str) -> Obj:
        written[path.split("/")[-2]].append(body["status"])
        return {}

    api.patch = patch  # type: ignore[method-assign]

    def quick_shown(status: Obj) -> tuple[int, str]:
        shown = next(c for c in status["containerStatuses"] if c["name"] == "quick")
        return shown["restartCount"], next(iter(shown["state"]))

    async def scenario() -> None:
        manager.observe("ADDED", beside)
        manager.observe("ADDED", fails)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
            len(written["beside"]) < 2 or [s["phase"] for s in written["fails"]][-1:] != ["Failed"]
        ):
            await asyncio.sleep(0.01)
        await manager.stop()

    asyncio.run(scenario())
    assert [quick_shown(s) for s in written["beside"]][:2] == [(0, "terminated"), (1, "terminated")]
    assert all(s["phase"] == "Running" for s in written["beside"])
    ready = [c["status"] for s in written["beside"] for c in s["conditions"] if c["type"] == "Ready"]
    assert set(ready) == {"False"}, "never Ready: one of its containers is not"
    assert [(s["phase"], quick_shown(s)) for s in written["fails"]] == [
        ("Pending", (0, "terminated")),
        ("Failed", (0, "terminated")),
    ]


def test_a_container_that_keeps_exiting_is_started_again_at_once_then_after_a_doubling_back_off() -> None:
    delays, back_off, at = [], None, 0.0
    for _ in range(8):
        delay, back_off = restart_delay(back_off, at)
        delays.append(delay)
        at += delay + 3  # it runs 3 s each time
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300]
    assert restart_delay(back_off, at + 601)[0] == 0, "forgotten once set over 10 minutes before"
    assert [go_duration(s) for s in (10, 80, 300)] == ["10s", "1m20s", "5m0s"]


def test_a_back_off_is_over_at_the_first_pod_sync_after_it_each_sync_before_blocked() -> None:
    for _ in range(20):
        blocked, restart = back_off_syncs(0.0)
        assert blocked == [] and 0 <= restart < 1, "started again at the relist that sees the exit"
        blocked, restart = back_off_syncs(10.0)
        assert len(blocked) == 1 and blocked[0] < 1 and 10 <= restart < 15.5, "requeued for the back-off's end"
        blocked, restart = back_off_syncs(20.0)
        assert len(blocked) == 1 and 20 <= restart < 30.5
        # Ready by a readiness probe: its next run (every 2 s) finds it exited and syncs once more.
        blocked, restart = back_off_syncs(10.0, probed_every=2.0)
        assert len(blocked) == 2 and blocked[0] <= blocked[1] < blocked[0] + 2 and 10 <= restart < 15.5
        assert back_off_syncs(0.0, probed_every=2.0)[0] == [], "started again at once: nothing to block"
        # Longer than the pod's resync: blocked again every 60-90 s until it is over.
        blocked, restart = back_off_syncs(300.0, resync_s=60.0)
        gaps = [b - a for a, b in itertools.pairwise([*blocked, restart])]
        assert 4 <= len(blocked) <= 6 and all(g <= 90 for g in gaps) and 300 <= restart < 390, (blocked, restart)


def test_a_restarted_container_shows_its_count_its_state_and_the_container_before() -> None:
    exited = podstatus.terminated_state("dra-testbed://u-main", STARTED, podstatus.Ended.completed(NOW))
    waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container=main"}}
    backing_off = {"main": podstatus.Restarted(1, "dra-testbed://u-main-1", waiting, exited)}
    status = podstatus.running_status(pod(), STARTED, IDS, LATER, restarted=backing_off)
    [main] = status["containerStatuses"]
    assert (main["restartCount"], main["state"], main["lastState"]) == (1, waiting, exited)
    assert status["phase"] == "Running" and by_type(status)["Ready"]["reason"] == "ContainersNotReady"
    assert podstatus.Restarted.from_status({**pod(), "status": status}) == backing_off
    completed = {"main": podstatus.Restarted(0, "dra-testbed://u-main", exited, {})}
    shown = podstatus.running_status(pod(), STARTED, IDS, LATER, restarted=completed)
    assert podstatus.Restarted.from_status({**pod(), "status": shown}) == completed, "exited for good, read back"
    running = podstatus.running_status(pod(), STARTED, IDS, LATER)
    assert podstatus.Restarted.from_status({**pod(), "status": running}) == {}
    # Deleted meanwhile: it stays as it exited; a running one ends as stopped.
    ended = podstatus.ended_status(pod(), STARTED, IDS, podstatus.Ended.stopped(LATER), restarted=backing_off)
    assert ended["containerStatuses"][0]["state"] == exited and ended["containerStatuses"][0]["restartCount"] == 1


def test_probes_hold_a_container_unready_until_they_pass_as_the_kubelets_prober_runs_them() -> None:
    def probe(**timing: int) -> Obj:
        return {"exec": {"command": ["true"]}, **timing}

    containers = [
        {"name": "main", "readinessProbe": probe(initialDelaySeconds=5, periodSeconds=2)},
        {"name": "warm", "startupProbe": probe(initialDelaySeconds=3), "readinessProbe": probe(periodSeconds=4)},
        {"name": "twice", "readinessProbe": probe(periodSeconds=3, successThreshold=2)},
        {"name": "at-once", "readinessProbe": probe(), "livenessProbe": probe(initialDelaySeconds=60)},
        {"name": "plain"},
    ]
    waiting, changes = probe_plan({"spec": {"containers": containers}})
    assert waiting == {"main": "unready", "warm": "starting", "twice": "unready"}, "a probe passing at 0 holds none"
    assert changes == [(3.0, "twice", None), (6.0, "main", None), (10.0, "warm", "unready"), (12.0, "warm", None)]
    status = podstatus.running_status(pod(), STARTED, IDS, NOW, probing={"main": "starting"})
    [main] = status["containerStatuses"]
    assert (main["ready"], main["started"]) == (False, False)
    assert by_type(status)["ContainersReady"]["message"] == "containers with unready status: [main]"


def test_a_driver_process_beside_the_kubelet_comes_back_when_its_back_off_lets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command-line driver's process, for its driver pod's container: the kubelet's
    back-off says when it starts again (at once, then after the back-off), each sync it
    blocks telling BackOff, the second showing CrashLoopBackOff; started again, the
    container's last state is its exit, not the wait. (The back-off shortened 30-fold.)"""
    monkeypatch.setattr(backoff, "CRASH_LOOP_INITIAL_S", 0.4)
    monkeypatch.setattr(backoff, "SYNC_ERROR_BACKOFF_S", 0.1)
    monkeypatch.setattr(backoff, "PLEG_RELIST_S", 0.05)
    api = StatusWrites()
    manager = PodManager(cast(KubeClient, api), NodeSpec("node"), cast(PluginManager, None), tmp_path / "cdi")
    meta = {"namespace": "dra-testbed", "name": "drv-node", "uid": "u", "generation": 1}
    spec = {"containers": [{"name": "driver", "image": "registry.invalid/drv:v1", "command": ["run-until-deleted"]}]}
    pod = {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}

    async def scenario() -> list[float]:
        manager.observe("ADDED", pod)
        deadline = time.monotonic() + 5
        while not any(s["phase"] == "Running" for s in api.statuses) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        away = []
        for _ in range(2):
            exited = time.monotonic()
            await manager.process_changed("dra-testbed", "drv-node", "driver", 137)
            await manager.process_restart("dra-testbed", "drv-node", "driver")
            away.append(time.monotonic() - exited)
            await manager.process_changed("dra-testbed", "drv-node", "driver", None)
        await manager.events_sent()
        return away

    away = asyncio.run(scenario())
    assert away[0] < 0.1 and away[1] >= 0.4, away
    backing_off = [e for e in api.events if e["reason"] == "BackOff"]
    assert backing_off and all("Back-off restarting failed container driver" in e["message"] for e in backing_off)
    waiting = [s["containerStatuses"][0]["state"].get("waiting", {}) for s in api.statuses]
    assert any(w.get("reason") == "CrashLoopBackOff" for w in waiting), waiting
    last = api.statuses[-1]["containerStatuses"][0]
    assert last["restartCount"] == 2 and "running" in last["state"]
    assert last["lastState"]["terminated"]["exitCode"] == 137, last["lastState"]


def test_a_pod_past_the_nodes_room_is_refused_once_and_the_room_a_gone_pod_held_is_free_again(
    tmp_path: Path,
) -> None:
    """Admission counts the pods the kubelet took and still runs: the second pod of
    600m on a 1-CPU node is refused (Failed, the kubelet's reason and words, a Warning
    Event, never started), and a third is taken once the first is gone."""
    api = StatusWrites()
    node = NodeSpec("node", capacity={"cpu": "1", "memory": "1Gi", "pods": "10", "ephemeral-storage": "1Gi"})
    manager = PodManager(cast(KubeClient, api), node, cast(PluginManager, None), tmp_path / "cdi")
    main = {"name": "main", "image": "registry.invalid/work:v1", "resources": {"requests": {"cpu": "600m"}}}

    def pod(name: str, **meta: str) -> Obj:
        return {
            "metadata": {"namespace": "ns", "name": name, "uid": name, "generation": 1, **meta},
            "spec": {"containers": [main]},
            "status": {"phase": "Pending"},
        }

    async def phases(count: int) -> list[str]:
        deadline = time.monotonic() + 5
        while len(api.statuses) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return [s["phase"] for s in api.statuses]

    async def scenario() -> None:
        manager.observe("ADDED", pod("first"))
        assert await phases(1) == ["Running"]
        manager.observe("ADDED", pod("second"))
        assert await phases(2) == ["Running", "Failed"]
        manager.observe("MODIFIED", pod("first", deletionTimestamp="2026-11-30T00:00:00Z"))
        await asyncio.wait_for(manager._workers["first"], 5)
        manager.observe("DELETED", pod("first", deletionTimestamp="2026-11-30T00:00:00Z"))
        manager.observe("ADDED", pod("third"))
        assert (await phases(4))[-1] == "Running"
        await asyncio.wait_for(manager.events_sent(), 5)
        await cancel_and_wait(*manager._workers.values())

    asyncio.run(scenario())
    refused = api.statuses[1]
    assert (refused["reason"], refused["message"]) == (
        "OutOfcpu",
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 600, used: 600, capacity: 1000",
    )
    assert "containerStatuses" not in refused and "conditions" not in refused
    told = [(e["involvedObject"]["name"], e["type"], e["reason"]) for e in api.events]
    assert ("second", "Warning", "OutOfcpu") in told
    assert not [t for t in told if t[0] == "second" and t[2] != "OutOfcpu"], "the refused pod never started"


def test_pods_that_come_in_together_are_admitted_oldest_first(tmp_path: Path) -> None:
    """As at a kubelet's start, when every pod bound to the node is listed at once: the
    older of two 600m pods on a 1-CPU node is taken, though listed second."""
    api = StatusWrites()
    node = NodeSpec("node", capacity={"cpu": "1", "memory": "1Gi", "pods": "10", "ephemeral-storage": "1Gi"})
    manager = PodManager(cast(KubeClient, api), node, cast(PluginManager, None), tmp_path / "cdi")
    main = {"name": "main", "image": "registry.invalid/work:v1", "resources": {"requests": {"cpu": "600m"}}}

    def pod(name: str, created: str) -> Obj:
        return {
            "metadata": {"namespace": "ns", "name": name, "uid": name, "generation": 1, "creationTimestamp": created},
            "spec": {"containers": [main]},
            "status": {"phase": "Pending"},
        }

    async def scenario() -> None:
        manager.observe("ADDED", pod("a-newer", "2026-11-30T05:00:02Z"))
        manager.observe("ADDED", pod("b-older", "2026-11-30T05:00:01Z"))
        deadline = time.monotonic() + 5
        while len(api.statuses) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(manager.events_sent(), 5)
        await cancel_and_wait(*manager._workers.values())

    asyncio.run(scenario())
    assert sorted(s["phase"] for s in api.statuses) == ["Failed", "Running"]
    refused = [e["involvedObject"]["name"] for e in api.events if e["reason"] == "OutOfcpu"]
    assert refused == ["a-newer"]
