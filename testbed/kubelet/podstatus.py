"""A pod's status as kubelet v1.37 writes it (generateAPIPodStatus), for the states the
fake kubelet puts a pod in: waiting for its sandbox (a failed prepare), running,
completed (its containers exited 0), and stopped for its deletion (or deleted before it
ever ran). Pure: the pod as last seen and a few facts in, the status out.

Compared field by field with a real kubelet's (tests/integration/test_real_and_fake_kubelet.py):
- the kubelet's five conditions, in its order, after the conditions others own (a
  readiness gate's, DisruptionTarget), each with the pod's generation as
  ``observedGeneration``, as is ``status.observedGeneration``; a condition keeps its
  transition time while its status stays;
- Ready waits for the pod's readiness gates, in the kubelet's words;
- once the containers stopped, the sandbox is gone: PodReadyToStartContainers is False;
- each container's status names its image with the tag a runtime reports (``:latest``
  when none was given), an image ID, its volume mounts and the resources it was given
  (claims included); a terminated state carries the container ID and when it started.

The real kubelet writes intermediate states too (Pending with the sandbox not ready, then
ContainerCreating); the fake one writes a pod's status once per state it reaches, as a
kubelet whose status manager coalesced them would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from testbed.kubeapi import Obj

KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
"""Those the kubelet owns and writes, in the order it writes them."""
SANDBOX_NOT_READY = "PodSandboxNotReady"
SANDBOX_GONE_MESSAGE = "pod sandbox is not ready"
NO_SANDBOX_MESSAGE = "no pod sandbox exists"
CONTAINER_NOT_FOUND = "The container could not be located when the pod was terminated"
STOPPED_EXIT_CODE = 143
"""A container stopped for its pod's deletion ends as one that exits on SIGTERM does."""


@dataclass(frozen=True)
class Ended:
    """How a pod's containers ended."""

    phase: str
    """Succeeded (they completed) or Failed (stopped for the pod's deletion)."""
    exit_code: int
    reason: str
    at: str

    @classmethod
    def completed(cls, at: str) -> Ended:
        return cls("Succeeded", 0, "Completed", at)

    @classmethod
    def stopped(cls, at: str) -> Ended:
        return cls("Failed", STOPPED_EXIT_CODE, "Error", at)


def running_status(pod: Obj, started: str, container_ids: Mapping[str, str], now: str) -> Obj:
    """The status that makes the pod Running (addresses and device health are the
    caller's): every container running since ``started``."""
    return {
        "phase": "Running",
        "observedGeneration": _generation(pod),
        "startTime": started,
        **_conditions(pod, None, now),
        "containerStatuses": [
            container_status(c, container_ids[c["name"]], {"running": {"startedAt": started}}, ready=True)
            for c in pod["spec"].get("containers", [])
        ],
    }


def ended_status(pod: Obj, started: str, container_ids: Mapping[str, str], ended: Ended) -> Obj:
    """The terminal status: every container terminated as ``ended`` says."""

    def terminated(container_id: str) -> Obj:
        state = {"containerID": container_id, "exitCode": ended.exit_code, "reason": ended.reason}
        return {"terminated": {**state, "startedAt": started, "finishedAt": ended.at}}

    return {
        "phase": ended.phase,
        "observedGeneration": _generation(pod),
        **_conditions(pod, ended.phase, ended.at),
        "containerStatuses": [
            container_status(c, container_ids[c["name"]], terminated(container_ids[c["name"]]), ready=False)
            for c in pod["spec"].get("containers", [])
        ],
    }


@dataclass(frozen=True)
class CreateFailed:
    """The runtime made the pod's sandbox (with its IP) but not this container."""

    pod_ip: str
    container: str
    message: str


def waiting_status(pod: Obj, host_ip: str, now: str, failed: CreateFailed | None = None) -> Obj:
    """The status of a pod whose containers are not running yet: Pending, its containers
    ContainerCreating; without ``failed``, its sandbox could not be made (its claims not
    prepared, its network not set up), with it the sandbox exists and the runtime refused
    that container (CreateContainerError, in the runtime's words)."""

    def state(container: Obj) -> Obj:
        if failed is not None and container["name"] == failed.container:
            return {"waiting": {"reason": "CreateContainerError", "message": failed.message}}
        return {"waiting": {"reason": "ContainerCreating"}}

    addresses = {} if failed is None else {"podIP": failed.pod_ip, "podIPs": [{"ip": failed.pod_ip}]}
    return {
        "phase": "Pending",
        "observedGeneration": _generation(pod),
        "startTime": pod.get("status", {}).get("startTime") or now,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        **addresses,
        **_conditions(pod, None, now, sandbox=failed is not None, running=False),
        "containerStatuses": [_unstarted_status(c, state(c)) for c in pod["spec"].get("containers", [])],
    }


def never_ran_status(pod: Obj, now: str) -> Obj:
    """The terminal status of a pod deleted before its containers ever ran."""
    unknown = {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": CONTAINER_NOT_FOUND}
    return {
        "phase": "Failed",
        "observedGeneration": _generation(pod),
        **_conditions(pod, None, now, sandbox=False, running=False),
        "containerStatuses": [_unstarted_status(c, {"terminated": unknown}) for c in pod["spec"].get("containers", [])],
    }


def readiness_update(pod: Obj, now: str) -> Obj | None:
    """The conditions to write when a running pod's Ready condition no longer says what
    its readiness gates do (someone set a gate's condition); None if it still does."""
    current = {c.get("type"): c for c in pod.get("status", {}).get("conditions") or []}
    wanted = _ready(pod)
    have = current.get("Ready", {})
    if (have.get("status"), have.get("reason"), have.get("message")) == (
        wanted["status"],
        wanted.get("reason"),
        wanted.get("message"),
    ):
        return None
    return _conditions(pod, None, now)


def container_status(container: Obj, container_id: str, state: Obj, ready: bool) -> Obj:
    image = image_reference(container.get("image", ""))
    status: Obj = {
        "name": container["name"],
        "image": image,
        "imageID": image_id(image),
        "containerID": container_id,
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "lastState": {},
        "state": state,
        # The resources the container was given (in-place resizing made them status).
        "resources": dict(container.get("resources") or {}),
    }
    requests = (container.get("resources") or {}).get("requests")
    if requests:
        status["allocatedResources"] = dict(requests)
    mounts = [_mount_status(m) for m in container.get("volumeMounts") or []]
    if mounts:
        status["volumeMounts"] = mounts
    return status


def _unstarted_status(container: Obj, state: Obj) -> Obj:
    """What the kubelet knows of a container the runtime never made: the spec's image as
    written, no image ID, no container ID."""
    status: Obj = {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "lastState": {},
        "state": state,
    }
    mounts = [_mount_status(m) for m in container.get("volumeMounts") or []]
    if mounts:
        status["volumeMounts"] = mounts
    return status


def image_reference(image: str) -> str:
    """As a runtime reports the image it ran: ``:latest`` added when neither a tag nor a
    digest was given."""
    if not image or "@" in image or ":" in image.rsplit("/", 1)[-1]:
        return image
    return f"{image}:latest"


def image_id(image: str) -> str:
    """A digested reference, as a runtime reports the image's ID (the digest made up)."""
    if "@" in image:
        return image
    repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"{repository}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _mount_status(mount: Obj) -> Obj:
    status: Obj = {"name": mount["name"], "mountPath": mount["mountPath"]}
    if mount.get("readOnly"):
        status["readOnly"] = True
        status["recursiveReadOnly"] = "Enabled" if mount.get("recursiveReadOnly") == "Enabled" else "Disabled"
    return status


def _generation(pod: Obj) -> int:
    return int(pod["metadata"].get("generation") or 1)


def _conditions(pod: Obj, ended: str | None, now: str, sandbox: bool = True, running: bool = True) -> Obj:
    """The kubelet's conditions after the others' (as it lists them), with the order
    the strategic-merge patch must keep; ``ended``: the terminal phase, if any;
    ``sandbox``: whether the pod's sandbox exists; ``running``: its containers."""
    generation = _generation(pod)
    if not running:
        names = " ".join(c["name"] for c in pod["spec"].get("containers", []))
        unready = {
            "status": "False",
            "reason": "ContainersNotReady",
            "message": f"containers with unready status: [{names}]",
        }
        missing = {"status": "False", "reason": SANDBOX_NOT_READY, "message": NO_SANDBOX_MESSAGE}
        mine = [
            {"type": "PodReadyToStartContainers", **({"status": "True"} if sandbox else missing)},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", **unready},
            {"type": "ContainersReady", **unready},
        ]
    elif ended is None:
        mine = [
            {"type": "PodReadyToStartContainers", "status": "True"},
            {"type": "Initialized", "status": "True"},
            _ready(pod),
            {"type": "ContainersReady", "status": "True"},
        ]
    else:
        reason = "PodCompleted" if ended == "Succeeded" else "PodFailed"
        initialized = {"reason": "PodCompleted"} if ended == "Succeeded" else {}
        mine = [
            {
                "type": "PodReadyToStartContainers",
                "status": "False",
                "reason": SANDBOX_NOT_READY,
                "message": SANDBOX_GONE_MESSAGE,
            },
            {"type": "Initialized", "status": "True", **initialized},
            {"type": "Ready", "status": "False", "reason": reason},
            {"type": "ContainersReady", "status": "False", "reason": reason},
        ]
    mine.append({"type": "PodScheduled", "status": "True"})
    before = {c.get("type"): c for c in pod.get("status", {}).get("conditions") or []}
    conditions = []
    for condition in mine:
        previous = before.get(condition["type"], {})
        stays = previous.get("status") == condition["status"] and previous.get("lastTransitionTime")
        since = previous["lastTransitionTime"] if stays else now
        # A strategic-merge patch keeps what it does not name: a reason or message gone is null.
        cleared = {key: None for key in ("reason", "message") if previous.get(key) and key not in condition}
        conditions.append(
            {
                **condition,
                **cleared,
                "observedGeneration": generation,
                "lastProbeTime": None,
                "lastTransitionTime": since,
            }
        )
    others = [t for t in before if t not in KUBELET_CONDITIONS]
    return {
        "$setElementOrder/conditions": [{"type": t} for t in [*others, *KUBELET_CONDITIONS]],
        "conditions": conditions,
    }


def _ready(pod: Obj) -> Obj:
    """Ready for running containers: True unless a readiness gate's condition is missing
    or not True (GeneratePodReadyCondition's messages)."""
    present = {c.get("type"): c.get("status") for c in pod.get("status", {}).get("conditions") or []}
    unready = []
    for gate in pod["spec"].get("readinessGates") or []:
        kind = gate["conditionType"]
        if kind not in present:
            unready.append(f'corresponding condition of pod readiness gate "{kind}" does not exist.')
        elif present[kind] != "True":
            unready.append(f'the status of pod readiness gate "{kind}" is not "True", but {present[kind]}')
    if unready:
        return {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady", "message": ", ".join(unready)}
    return {"type": "Ready", "status": "True"}
