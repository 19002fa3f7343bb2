"""A pod's status as kubelet v1.37 writes it (generateAPIPodStatus), for the states the
fake kubelet puts a pod in: waiting for its sandbox (a failed prepare), running its init
containers, running, completed (its containers exited 0), and stopped for its deletion
(or deleted before it ever ran). Pure: the pod as last seen and a few facts in, the
status out.

Compared field by field with a real kubelet's (tests/integration/test_real_and_fake_kubelet.py):
- the kubelet's five conditions, in its order, after the conditions others own (a
  readiness gate's, DisruptionTarget), each with the pod's generation as
  ``observedGeneration``, as is ``status.observedGeneration``; a condition keeps its
  transition time while its status stays;
- Ready waits for the pod's readiness gates, in the kubelet's words;
- once the containers stopped, the sandbox is gone: PodReadyToStartContainers is False;
- each container's status names its image with the tag a runtime reports (``:latest``
  when none was given), an image ID, its volume mounts and the resources it was given
  (claims included); a terminated state carries the container ID and when it started;
  the pod's containers are listed by name, its init containers in the spec's order;
- the Initialized, ContainersReady and Ready conditions are worked out from the container
  statuses as the kubelet's status generator does: an init container counts once it
  completed (a sidecar, restartPolicy Always, once started), sidecars count as the pod's
  containers for readiness.

The real kubelet writes intermediate states too (Pending with the sandbox not ready, then
ContainerCreating); the fake one writes a pod's status once per state it reaches, as a
kubelet whose status manager coalesced them would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from testbed.kubeapi import Obj
from testbed.kubelet import commands

KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
"""Those the kubelet owns and writes, in the order it writes them; AllContainersRestarting
after them for a pod one of whose containers has a RestartAllContainers rule."""
SANDBOX_NOT_READY = "PodSandboxNotReady"
SANDBOX_GONE_MESSAGE = "pod sandbox is not ready"
NO_SANDBOX_MESSAGE = "no pod sandbox exists"
CONTAINER_NOT_FOUND = "The container could not be located when the pod was terminated"
POD_INITIALIZING = "PodInitializing"
CONTAINER_CREATING = "ContainerCreating"
STOPPED_EXIT_CODE = 143
"""A container stopped for its pod's deletion ends as one that exits on SIGTERM does."""
ALL_RESTARTING = "AllContainersRestarting"
RESTARTING_ALL = "RestartingAllContainers"
RESTARTING_ALL_MESSAGE = "The container is removed because RestartAllContainers in place"
RESTART_ALL_STARTED = "RestartAllContainersStarted"
RESTART_ALL_STARTED_MESSAGE = "container exited with restart policy rule"
"""The kubelet's words while a RestartAllContainers rule restarts a pod in place: its
condition, then each container removed and waiting (the last one counted as ended so)."""


@dataclass(frozen=True)
class Ended:
    """How a pod's containers ended."""

    phase: str
    """Succeeded (they completed) or Failed (one exited non-zero, or they were stopped
    for the pod's deletion)."""
    exit_code: int
    reason: str
    at: str
    exit_codes: Mapping[str, int] = field(default_factory=dict)
    """Containers that ended with a status of their own (their command's ``exit N``)."""

    @classmethod
    def completed(cls, at: str) -> Ended:
        return cls.exit_status(0, at)

    @classmethod
    def stopped(cls, at: str) -> Ended:
        return cls("Failed", STOPPED_EXIT_CODE, "Error", at)

    @classmethod
    def exit_status(cls, code: int, at: str) -> Ended:
        """One container's exit with ``code``, worded as container runtimes word it."""
        return cls("Succeeded" if code == 0 else "Failed", code, "Completed" if code == 0 else "Error", at)

    @classmethod
    def exited(cls, exit_codes: Mapping[str, int], at: str) -> Ended:
        """A pod's containers, each ended with its own status: the pod Failed if one
        failed (the kubelet's phase for restartPolicy Never), else Succeeded."""
        failed = any(exit_codes.values())
        return replace(cls.exit_status(0, at), phase="Failed" if failed else "Succeeded", exit_codes=dict(exit_codes))

    def of(self, container: str) -> Ended:
        """How ``container`` ended."""
        code = self.exit_codes.get(container)
        return self if code is None else Ended.exit_status(code, self.at)


@dataclass(frozen=True)
class InitRun:
    """How far a pod's init containers got: for each started so far, in spec order, when
    it started and when it ended ("" while it runs: the one running now, or a sidecar)."""

    spans: tuple[tuple[str, str], ...] = ()
    failing: Restarted | None = None
    """The last one started, once it exited non-zero: how often it was started again, its
    state now and the one before (its spans's times no longer count)."""
    carried: Mapping[str, Restarted] = field(default_factory=dict)
    """Those run again since the pod restarted in place (``restarting_status``), or
    sidecars started again (``started_again``): each one's count, the container it is in
    this run and the one before (its state unused)."""

    def then(self, started: str, ended: str = "") -> InitRun:
        return InitRun((*self.spans, (started, ended)), carried=self.carried)

    def ended(self, at: str) -> InitRun:
        """The one running now has ended (exit 0, unless it is ``failing``)."""
        *done, (started, _) = self.spans
        return InitRun((*done, (started, at)), self.failing, self.carried)

    def failed(self, now: Restarted) -> InitRun:
        """The last one started exited non-zero (``now``: as it is now)."""
        return replace(self, failing=now)

    def started_again(self, index: int, name: str, again: Restarted, at: str) -> InitRun:
        """Sidecar ``name``, the init container at ``index``, started again ``at``, as
        ``again`` (its image changed)."""
        spans = (*self.spans[:index], (at, ""), *self.spans[index + 1 :])
        return InitRun(spans, self.failing, {**self.carried, name: again})

    def runs(self, index: int) -> bool:
        """Whether the init container at ``index`` runs now."""
        if index >= len(self.spans) or self.spans[index][1]:
            return False
        last = index == len(self.spans) - 1
        return not (last and self.failing is not None and "running" not in self.failing.state)

    @classmethod
    def complete(cls, pod: Obj, at: str) -> InitRun:
        """Every init container ran (each at ``at``): a pod found running whose status says
        nothing more (written before init containers were shown)."""
        return cls(tuple((at, "" if is_sidecar(c) else at) for c in pod["spec"].get("initContainers") or []))

    @classmethod
    def from_status(cls, pod: Obj) -> InitRun | None:
        """What the pod's status says ran (a kubelet restarted finds it there); None if it
        does not say every init container did."""
        run, inits = cls.so_far(pod), pod["spec"].get("initContainers") or []
        if len(run.spans) < len(inits):
            return None
        if any(not ended and not is_sidecar(c) for (_, ended), c in zip(run.spans, inits, strict=True)):
            return None
        return run

    @classmethod
    def so_far(cls, pod: Obj) -> InitRun:
        """What the pod's status says its init containers did, in order, up to the first
        that neither completed nor runs, or up to the one that runs now (a sidecar that
        runs does not stop it): where a kubelet restarted meanwhile goes on from."""
        statuses = {s.get("name"): s for s in pod.get("status", {}).get("initContainerStatuses") or []}
        written = {name: s.get("state") or {} for name, s in statuses.items()}
        carried = {
            name: Restarted(s["restartCount"], s.get("containerID", ""), {}, s.get("lastState") or {})
            for name, s in statuses.items()
            if s.get("restartCount")
        }
        spans: list[tuple[str, str]] = []
        for container in pod["spec"].get("initContainers") or []:
            state = written.get(container["name"], {})
            if "running" in state:
                spans.append((state["running"].get("startedAt", ""), ""))
                if not is_sidecar(container):
                    break
            elif "terminated" in state and state["terminated"].get("exitCode") == 0:
                spans.append((state["terminated"].get("startedAt", ""), state["terminated"].get("finishedAt", "")))
            else:
                break
        return cls(tuple(spans), carried=carried)


NO_INITS = InitRun()


def is_sidecar(container: Obj) -> bool:
    """An init container that keeps running beside the others (restartPolicy Always)."""
    return container.get("restartPolicy") == "Always"


@dataclass(frozen=True)
class Restarted:
    """A container that exited since its pod started: how often it was started again, the
    container it is now (running, exited and waiting for its restart, or exited for good)
    and the one before it."""

    count: int
    container_id: str
    state: Obj
    last: Obj

    @classmethod
    def from_status(cls, pod: Obj) -> dict[str, Restarted]:
        """Those the pod's status shows restarted or exited (a kubelet restarted finds
        them there)."""
        return {
            s["name"]: cls(s["restartCount"], s.get("containerID", ""), s.get("state") or {}, s.get("lastState") or {})
            for s in pod.get("status", {}).get("containerStatuses") or []
            if s.get("restartCount") or "terminated" in (s.get("state") or {})
        }

    @classmethod
    def shown(cls, status: Obj, name: str) -> Restarted:
        """Container ``name`` as ``status`` shows it."""
        shown = next(s for s in status.get("containerStatuses") or [] if s["name"] == name)
        return cls(shown["restartCount"], shown.get("containerID", ""), shown["state"], shown["lastState"])

    def removed(self) -> Restarted:
        """The container the kubelet removed to restart its pod in place (a
        RestartAllContainers rule fired): waiting, counted once more, the one before
        shown ended so; one waiting already (to be started again, or not started yet)
        stays as it is."""
        if "waiting" in self.state:
            return self
        words = {"reason": RESTARTING_ALL, "message": RESTARTING_ALL_MESSAGE}
        ended = {"terminated": {"exitCode": 137, **words}}
        return Restarted(self.count + 1, self.container_id, {"waiting": words}, ended)

    def started_again(self, container_id: str, at: str) -> Restarted:
        """Started again after the pod's restart in place, as ``container_id``."""
        return Restarted(self.count, container_id, {"running": {"startedAt": at}}, self.last)


def running_status(
    pod: Obj,
    started: str,
    container_ids: Mapping[str, str],
    now: str,
    inits: InitRun = NO_INITS,
    restarted: Mapping[str, Restarted] | None = None,
    probing: Mapping[str, str] | None = None,
) -> Obj:
    """The status of a Running pod (addresses and device health are the caller's): every
    container running since ``started``, after ``inits``, but those ``restarted``; those
    ``probing`` not ready yet (``running_containers``)."""
    return {
        **_status(
            pod,
            "Running",
            _init_statuses(pod, container_ids, inits, probing=probing),
            running_containers(pod, started, container_ids, restarted, probing),
            "ready",
            now,
        ),
        "startTime": started,
    }


def running_containers(
    pod: Obj,
    started: str,
    container_ids: Mapping[str, str],
    restarted: Mapping[str, Restarted] | None = None,
    probing: Mapping[str, str] | None = None,
) -> list[Obj]:
    """The statuses of a running pod's (regular) containers, sorted by name as the kubelet
    sorts them. ``probing``: those whose startup probe has not passed yet ("starting":
    neither started nor ready) or whose readiness probe has not ("unready")."""
    containers = pod["spec"].get("containers", [])
    return _by_name(_as_now(c, _as_restarted(c, started, container_ids, restarted), probing or {}) for c in containers)


def _as_now(container: Obj, now: Restarted, probing: Mapping[str, str]) -> Obj:
    """A container the runtime made, as it is ``now``; running and ``probing`` (see
    ``running_containers``): not ready, or not started, yet."""
    status = container_status(container, now.container_id, now.state, ready="running" in now.state)
    waits_for = probing.get(container["name"]) if "running" in now.state else None
    if waits_for is not None:
        status.update(ready=False, started=waits_for != "starting")
    return {**status, "restartCount": now.count, "lastState": now.last}


def _as_restarted(
    container: Obj, started: str, container_ids: Mapping[str, str], restarted: Mapping[str, Restarted] | None
) -> Restarted:
    """The container as ``restarted`` says, else the first of its name, running since ``started``."""
    name = container["name"]
    first = Restarted(0, container_ids[name], {"running": {"startedAt": started}}, {})
    return (restarted or {}).get(name) or first


def initializing_status(
    pod: Obj,
    started: str,
    container_ids: Mapping[str, str],
    inits: InitRun,
    addresses: Obj,
    now: str,
    probing: Mapping[str, str] | None = None,
    restarted: Mapping[str, Restarted] | None = None,
    waits: Mapping[str, tuple[str, str]] | None = None,
    started_early: Mapping[str, Restarted] | None = None,
) -> Obj:
    """Pending while init containers run: those done terminated, the one running now
    (the last of ``inits``), the rest and the pod's containers waiting (PodInitializing;
    with their counts when ``restarted`` in place); those in ``waits`` (init containers
    too) for its reason and message, their image not pulled; sidecars ``probing`` not
    ready (or not started) yet. Once they are done, the pod's containers ``started_early``
    (see ``waiting_status``) as they are."""
    early = started_early or {}
    mains = _by_name(
        _as_now(c, early[c["name"]], probing or {})
        if c["name"] in early
        else _waiting_for_inits(c, (restarted or {}).get(c["name"]))
        for c in pod["spec"].get("containers", [])
    )
    init_statuses = _init_statuses(pod, container_ids, inits, probing=probing)
    for status in [*init_statuses, *mains]:
        if status["name"] in (waits or {}) and "waiting" in status["state"]:
            reason, message = (waits or {})[status["name"]]
            status["state"] = {"waiting": {"reason": reason, "message": message}}
    return {
        **_status(pod, "Pending", init_statuses, mains, "ready", now),
        "startTime": started,
        **addresses,
    }


def restarting_status(pod: Obj, before: Obj, now: str) -> Obj:
    """What the kubelet writes once it removed every container of a pod to restart it in
    place (a RestartAllContainers rule fired), from the status it wrote ``before``: each
    container that was there waits, counted once more, the one before shown ended so (one
    that had ended keeps what its status said of it, one that ran is known only by its
    spec); one waiting already stays so. The pod stays Running (Pending while one has
    yet to run for the first time: an init container fired the rule) and, once so,
    Initialized."""
    spec = pod["spec"]
    waiting = {"waiting": {"reason": POD_INITIALIZING if spec.get("initContainers") else CONTAINER_CREATING}}

    def removed(container: Obj, old: Obj | None) -> Obj:
        old = old or _unstarted_status(container, waiting)
        state, count = old.get("state") or {}, old.get("restartCount", 0)
        base = old if "terminated" in state else _unstarted_status(container, waiting)
        if "waiting" in state:  # nothing to remove: as the spec says, its count kept
            return {**base, "restartCount": count, "lastState": old.get("lastState") or {}}
        now = Restarted(count, "", state, {}).removed()
        return {**base, "state": now.state, "restartCount": now.count, "lastState": now.last}

    def each(kind: str, key: str) -> list[Obj]:
        written = {s.get("name"): s for s in before.get(key) or []}
        return [removed(c, written.get(c["name"])) for c in spec.get(kind) or []]

    inits, mains = each("initContainers", "initContainerStatuses"), each("containers", "containerStatuses")
    # Pending while one of them has yet to run for the first time (an init container
    # restarted it before the pod's own ran), as getPhase counts a waiting container
    # that never ended; else Running: every one ran and is to start again.
    never_ran = any("waiting" in s["state"] and not s["lastState"] for s in [*inits, *mains])
    return _status(pod, "Pending" if never_ran else "Running", inits, _by_name(mains), "ready", now)


def ended_status(
    pod: Obj,
    started: str,
    container_ids: Mapping[str, str],
    ended: Ended,
    inits: InitRun = NO_INITS,
    restarted: Mapping[str, Restarted] | None = None,
) -> Obj:
    """The terminal status: every container terminated as ``ended`` says (sidecars and an
    init container still running are stopped, whatever the pod's phase), but a restarted
    one that had exited and not been started again: that stays as it ended."""
    mains = []
    for container in pod["spec"].get("containers", []):
        now = _as_restarted(container, started, container_ids, restarted)
        state = now.state
        if "running" in state:
            state = terminated_state(now.container_id, state["running"]["startedAt"], ended.of(container["name"]))
        elif "waiting" in state:  # to be started again: as the container before it ended
            state = now.last
        status = container_status(container, now.container_id, state, ready=False)
        mains.append({**status, "restartCount": now.count, "lastState": now.last})
    init_statuses = _init_statuses(pod, container_ids, inits, Ended.stopped(ended.at))
    return _status(pod, ended.phase, init_statuses, _by_name(mains), "gone", ended.at)


def stopped_initializing_status(
    pod: Obj, container_ids: Mapping[str, str], inits: InitRun, at: str, failed_by_kubelet: bool = False
) -> Obj:
    """The terminal status of a pod deleted while its init containers ran: the one running
    stopped, the pod's containers never started. The kubelet works its conditions out
    before it marks the pod Failed, as for a Pending pod; from Failed when it failed the
    pod itself (``failed_by_kubelet``: past its active deadline)."""
    waiting = {"waiting": {"reason": POD_INITIALIZING}}
    mains = _by_name(_unstarted_status(c, waiting) for c in pod["spec"].get("containers", []))
    init_statuses = _init_statuses(pod, container_ids, inits, Ended.stopped(at))
    conditions_phase = "Failed" if failed_by_kubelet else "Pending"
    return _status(pod, "Failed", init_statuses, mains, "gone", at, conditions_phase=conditions_phase)


def failed_initializing_status(pod: Obj, container_ids: Mapping[str, str], inits: InitRun, at: str) -> Obj:
    """The terminal status of a pod (restartPolicy Never) whose init container exited
    non-zero (``inits.failing``): Failed, the pod's containers never started."""
    waiting = {"waiting": {"reason": POD_INITIALIZING}}
    mains = _by_name(_unstarted_status(c, waiting) for c in pod["spec"].get("containers", []))
    init_statuses = _init_statuses(pod, container_ids, inits, Ended.stopped(at))
    return _status(pod, "Failed", init_statuses, mains, "gone", at)


@dataclass(frozen=True)
class CreateFailed:
    """The runtime made the pod's sandbox (with its IP) but not these containers."""

    pod_ip: str
    waits: Mapping[str, tuple[str, str]]
    """Each container not created, with the reason and message it waits for."""


def waiting_status(
    pod: Obj,
    host_ip: str,
    now: str,
    failed: CreateFailed | None = None,
    started_early: Mapping[str, Restarted] | None = None,
    probing: Mapping[str, str] | None = None,
) -> Obj:
    """The status of a pod whose containers are not running yet: Pending, its containers
    ContainerCreating (PodInitializing, with init containers); without ``failed``, its
    sandbox could not be made (its claims not prepared, its network not set up), with it
    the sandbox exists and the runtime refused that container (CreateContainerError, in
    the runtime's words, or its image not pulled). ``started_early``: those the kubelet
    started all the same (their images pulled), as they are now, ``probing`` as at
    their start; the pod stays Pending until every container has started."""
    inits, mains = _waiting_statuses(pod, failed)
    early = started_early or {}
    mains = [
        _as_now(c, early[c["name"]], probing or {}) if c["name"] in early else status
        for c, status in zip(_sorted_containers(pod), mains, strict=True)
    ]
    addresses = {} if failed is None else {"podIP": failed.pod_ip, "podIPs": [{"ip": failed.pod_ip}]}
    return {
        **_status(pod, "Pending", inits, mains, "none" if failed is None else "ready", now),
        "startTime": pod.get("status", {}).get("startTime") or now,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        **addresses,
    }


def never_ran_status(
    pod: Obj, now: str, sandbox_made: bool = False, started_early: Mapping[str, Restarted] | None = None
) -> Obj:
    """The terminal status of a pod deleted before its containers ever ran. As the kubelet
    marks it (TerminatePod), over the conditions of the Pending pod it was: containers not
    known to have run end ContainerStatusUnknown; with init containers, only the first of
    those (the pod never initialized: its containers stay waiting). ``sandbox_made``: the
    runtime had made its sandbox (and refused a container), now removed. Those
    ``started_early`` (see ``waiting_status``) were stopped, those that ended stay so."""
    early = started_early or {}
    inits, mains = _waiting_statuses(pod, None)
    unknown = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": CONTAINER_NOT_FOUND}}
    mains = [
        _stopped(c, early[c["name"]], now) if c["name"] in early else status
        for c, status in zip(_sorted_containers(pod), mains, strict=True)
    ]
    sandbox = "gone" if sandbox_made else "none"
    status = _status(pod, "Failed", inits, mains, sandbox, now, conditions_phase="Pending")
    ended = status["initContainerStatuses"][:1] if inits else status["containerStatuses"]
    for container in ended:
        if container["name"] not in early:
            container["state"] = unknown
    return status


def rejected_status(pod: Obj, reason: str, message: str, now: str) -> Obj:
    """The status of a pod the kubelet refused to admit (its rejectPod): Failed, with the
    reason and message alone; no container status, no condition of the kubelet's."""
    return {
        "phase": "Failed",
        "reason": reason,
        "message": message,
        "observedGeneration": generation(pod),
        "startTime": pod.get("status", {}).get("startTime") or now,
    }


def stopped_after_rejection(status: Obj) -> Obj:
    """The terminal status of a pod refused while its containers ran (a kubelet restart
    checks again every pod it finds): the statuses of the containers the runtime made
    without their volume mounts. The kubelet keeps those from the status it wrote before,
    and the rejection's had no container statuses; one never made is shown as the spec
    has it, mounts included."""
    stripped = dict(status)
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in stripped:
            stripped[key] = [
                {k: v for k, v in c.items() if k != "volumeMounts"} if c.get("containerID") else c
                for c in stripped[key]
            ]
    return stripped


def _waiting_statuses(pod: Obj, failed: CreateFailed | None) -> tuple[list[Obj], list[Obj]]:
    spec = pod["spec"]
    default = POD_INITIALIZING if spec.get("initContainers") else CONTAINER_CREATING

    def state(container: Obj) -> Obj:
        if failed is not None and container["name"] in failed.waits:
            reason, message = failed.waits[container["name"]]
            return {"waiting": {"reason": reason, "message": message}}
        return {"waiting": {"reason": default}}

    inits = [_unstarted_status(c, state(c)) for c in spec.get("initContainers") or []]
    return inits, [_unstarted_status(c, state(c)) for c in _sorted_containers(pod)]


def _stopped(container: Obj, was: Restarted, at: str) -> Obj:
    """A container the runtime made, stopped now if it ran (one that ended stays so)."""
    state = was.state
    if "running" in state:
        state = terminated_state(was.container_id, state["running"]["startedAt"], Ended.stopped(at))
    return {**container_status(container, was.container_id, state, ready=False), "restartCount": was.count}


def _sorted_containers(pod: Obj) -> list[Obj]:
    """The pod's own containers in the order the kubelet lists their statuses (by name)."""
    return sorted(pod["spec"].get("containers", []), key=lambda c: str(c["name"]))


def _waiting_for_inits(container: Obj, before: Restarted | None) -> Obj:
    """A container waiting for the init containers: as the spec says, with its count and
    the one before when the pod restarted in place (``before``)."""
    status = _unstarted_status(container, {"waiting": {"reason": POD_INITIALIZING}})
    if before is not None:
        status.update(restartCount=before.count, lastState=before.last)
    return status


def _init_statuses(
    pod: Obj,
    container_ids: Mapping[str, str],
    inits: InitRun,
    stopped: Ended | None = None,
    probing: Mapping[str, str] | None = None,
) -> list[Obj]:
    """In spec order, as the kubelet lists them: those that ran as ``inits`` says (with
    ``stopped``, those still running were stopped so), the rest waiting; running
    sidecars ``probing`` not ready, or not started (``running_containers``)."""
    statuses = []
    for index, container in enumerate(pod["spec"].get("initContainers") or []):
        carried = inits.carried.get(container["name"])
        if index >= len(inits.spans):
            statuses.append(_waiting_for_inits(container, carried))
            continue
        if inits.failing is not None and index == len(inits.spans) - 1:
            now = inits.failing
            state = now.state
            if stopped is not None and "running" in state:
                state = terminated_state(now.container_id, state["running"]["startedAt"], stopped)
            status = container_status(container, now.container_id, state, ready=False)
            statuses.append({**status, "restartCount": now.count, "lastState": now.last})
            continue
        container_id, (started, ended) = container_ids[container["name"]], inits.spans[index]
        if carried is not None:
            container_id = carried.container_id
        if ended:
            state = terminated_state(container_id, started, Ended.completed(ended))
        elif stopped is not None:
            state = terminated_state(container_id, started, stopped)
        else:
            state = {"running": {"startedAt": started}}
        done = "terminated" in state and state["terminated"]["exitCode"] == 0
        ready = "running" in state if is_sidecar(container) else done
        status = container_status(container, container_id, state, ready)
        waits_for = (probing or {}).get(container["name"]) if "running" in state and is_sidecar(container) else None
        if waits_for is not None:
            status.update(ready=False, started=waits_for != "starting")
        if carried is not None:
            status.update(restartCount=carried.count, lastState=carried.last)
        statuses.append(status)
    return statuses


def terminated_state(container_id: str, started: str, ended: Ended) -> Obj:
    state = {"containerID": container_id, "exitCode": ended.exit_code, "reason": ended.reason}
    return {"terminated": {**state, "startedAt": started, "finishedAt": ended.at}}


def _by_name(statuses: Iterable[Obj]) -> list[Obj]:
    return sorted(statuses, key=lambda s: str(s["name"]))


def _status(
    pod: Obj,
    phase: str,
    inits: list[Obj],
    mains: list[Obj],
    sandbox: str,
    now: str,
    conditions_phase: str | None = None,
) -> Obj:
    status: Obj = {
        "phase": phase,
        "observedGeneration": generation(pod),
        **_conditions(pod, conditions_phase or phase, sandbox, inits, mains, now),
        "containerStatuses": mains,
    }
    if inits:
        status["initContainerStatuses"] = inits
    return status


def readiness_update(pod: Obj, now: str) -> Obj | None:
    """The conditions to write when a running pod's Ready condition no longer says what
    its readiness gates do (someone set a gate's condition); None if it still does. Worked
    out from the container statuses the pod's status holds (this kubelet wrote them)."""
    status = pod.get("status", {})
    inits, mains = status.get("initContainerStatuses") or [], status.get("containerStatuses") or []
    update = _conditions(pod, "Running", "ready", inits, mains, now)
    wanted = next(c for c in update["conditions"] if c["type"] == "Ready")
    have: Obj = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    if all(have.get(key) == wanted.get(key) for key in ("status", "reason", "message")):
        return None
    return update


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


def ephemeral_status(container: Obj, container_id: str, state: Obj) -> Obj:
    """An ephemeral container's (``kubectl debug``) as the kubelet lists it: never ready,
    and with no started flag (the prober does not follow it); as the spec says while the
    runtime has not made it yet (no ``container_id``)."""
    if container_id:
        status = container_status(container, container_id, state, ready=False)
    else:
        status = _unstarted_status(container, state)
    del status["started"]
    return status


def generation_update(pod: Obj) -> Obj:
    """What a kubelet's sync changes in the status of a pod whose spec changed (its
    generation went up: an ephemeral container added, activeDeadlineSeconds set, its
    deletion begun) and nothing else: the generation it observed, on the status and on
    each of its conditions that carries one."""
    observed = generation(pod)
    kinds = [c["type"] for c in pod.get("status", {}).get("conditions") or [] if c.get("type") in KUBELET_CONDITIONS]
    return {
        "observedGeneration": observed,
        "conditions": [{"type": t, "observedGeneration": observed} for t in kinds],
    }


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


def generation(pod: Obj) -> int:
    return int(pod["metadata"].get("generation") or 1)


def _conditions(pod: Obj, phase: str, sandbox: str, inits: list[Obj], mains: list[Obj], now: str) -> Obj:
    """The kubelet's conditions after the others' (as it lists them), with the order the
    strategic-merge patch must keep, worked out as the kubelet does from the container
    statuses, the pod's ``phase`` and its ``sandbox``: "ready", "none" (never made) or
    "gone" (removed once the containers stopped)."""
    at_generation = generation(pod)
    sandbox_condition: Obj = {"status": "True"}
    if sandbox != "ready":
        message = NO_SANDBOX_MESSAGE if sandbox == "none" else SANDBOX_GONE_MESSAGE
        sandbox_condition = {"status": "False", "reason": SANDBOX_NOT_READY, "message": message}
    containers_ready = _containers_ready(pod, phase, inits, mains)
    ready = containers_ready if containers_ready["status"] != "True" else _gates(pod)
    mine = [
        {"type": "PodReadyToStartContainers", **sandbox_condition},
        {"type": "Initialized", **_initialized(pod, phase, inits, mains)},
        {"type": "Ready", **ready},
        {"type": "ContainersReady", **containers_ready},
        {"type": "PodScheduled", "status": "True"},
    ]
    before = {c.get("type"): c for c in pod.get("status", {}).get("conditions") or []}
    if mine[1]["status"] == "False" and before.get("Initialized", {}).get("status") == "True":
        # Once initialized, a pod stays so while its init containers run again (a
        # restart in place), as the kubelet keeps it.
        mine[1] = {"type": "Initialized", "status": "True"}
    if commands.may_restart_all(pod):
        mine.append({"type": ALL_RESTARTING, **_all_restarting(pod, phase, [*inits, *mains])})
    kinds = [c["type"] for c in mine]
    conditions = []
    for condition in mine:
        previous = before.get(condition["type"], {})
        stays = previous.get("status") == condition["status"] and previous.get("lastTransitionTime")
        since = previous["lastTransitionTime"] if stays else now
        # A strategic-merge patch keeps what it does not name: a reason or message gone is
        # null, even one the pod as last seen lacks (a write of ours not seen yet set it).
        cleared = {key: None for key in ("reason", "message") if key not in condition}
        # The kubelet gives the restart condition no generation.
        observed = {} if condition["type"] == ALL_RESTARTING else {"observedGeneration": at_generation}
        conditions.append({**condition, **cleared, **observed, "lastProbeTime": None, "lastTransitionTime": since})
    others = [t for t in before if t not in kinds]
    return {
        "$setElementOrder/conditions": [{"type": t} for t in [*others, *kinds]],
        "conditions": conditions,
    }


def _all_restarting(pod: Obj, phase: str, statuses: list[Obj]) -> Obj:
    """True from a container's exit that a RestartAllContainers rule matches until its
    pod's containers are removed to start again (GenerateAllContainersRestartingCondition)."""
    if phase in ("Succeeded", "Failed"):
        return {"status": "False", "reason": "PodCompleted" if phase == "Succeeded" else "PodFailed"}
    spec = pod["spec"]
    by_name = {c["name"]: c for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]}
    for status in statuses:
        ended = (status.get("state") or {}).get("terminated")
        container = by_name.get(status.get("name", ""))
        if ended and container and commands.restarts_all(container, int(ended.get("exitCode", 0))):
            return {"status": "True", "reason": RESTART_ALL_STARTED, "message": RESTART_ALL_STARTED_MESSAGE}
    return {"status": "False"}


def _none_left(names: list[str], reason: str, kind: str) -> Obj:
    """True, or False naming the containers left (as Go prints a list of names)."""
    if not names:
        return {"status": "True"}
    return {"status": "False", "reason": reason, "message": f"containers with {kind} status: [{' '.join(names)}]"}


def _initialized(pod: Obj, phase: str, inits: list[Obj], mains: list[Obj]) -> Obj:
    """Every init container done (a sidecar: started), once and for all when a container
    of the pod's own has started (GeneratePodInitializedCondition)."""
    if phase == "Succeeded":
        return {"status": "True", "reason": "PodCompleted"}
    if any("waiting" not in (s.get("state") or {"waiting": {}}) for s in mains):
        return {"status": "True"}
    statuses = {s["name"]: s for s in inits}
    incomplete = []
    for container in pod["spec"].get("initContainers") or []:
        status = statuses.get(container["name"], {})
        if not (status.get("started") if is_sidecar(container) else status.get("ready")):
            incomplete.append(container["name"])
    return _none_left(incomplete, "ContainersNotInitialized", "incomplete")


def _containers_ready(pod: Obj, phase: str, inits: list[Obj], mains: list[Obj]) -> Obj:
    """Sidecars and the pod's own containers all ready (GenerateContainersReadyCondition)."""
    if phase in ("Succeeded", "Failed"):
        return {"status": "False", "reason": "PodCompleted" if phase == "Succeeded" else "PodFailed"}
    ready = {s["name"]: s.get("ready") for s in [*inits, *mains]}
    spec = pod["spec"]
    names = [c["name"] for c in spec.get("initContainers") or [] if is_sidecar(c)]
    names += [c["name"] for c in spec.get("containers", [])]
    return _none_left([name for name in names if not ready.get(name)], "ContainersNotReady", "unready")


def _gates(pod: Obj) -> Obj:
    """Ready for ready containers: True unless a readiness gate's condition is missing
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
        return {"status": "False", "reason": "ReadinessGatesNotReady", "message": ", ".join(unready)}
    return {"status": "True"}
