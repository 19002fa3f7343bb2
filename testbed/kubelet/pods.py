"""Pods bound to this node: prepare their claims, "run" them, unprepare, remove them.

For each pod: wait until every claim is allocated and reserved for it; call
NodePrepareResources once per driver for the claims not yet prepared on this node
(claims shared by several pods are prepared once and unprepared when the last user is
gone); resolve each container's CDI device IDs against the spec files as a runtime
would (an unknown ID fails the start); set the pod Running, with its IP from the Node's
pod CIDR (podnetwork.py) and the environment a container would see (the runtime's
report) in the ``dra-testbed.io/container-env`` annotation of that same status write. A
container's command says how it ends (commands.py: after ``sleep N``, with ``exit N``'s
status); a pod whose containers all end and are not started again ends then (Succeeded,
or Failed if one exited non-zero), as does one that carries ``dra-testbed.io/run-seconds``.
As kubelet v1.37 does:
- a pod is admitted when first seen, before anything of it starts (admission.py), and
  again when this kubelet starts, oldest first, with those that come in together: one
  the node has no room for, whose node selector or affinity the node's labels do not
  match, whose host ports are taken or that does not tolerate a NoExecute taint is
  refused: a Warning Event, and the pod Failed with the reason and "Pod was rejected: "
  before the words; none of its claims is prepared. One running through a restart and
  refused then is stopped, and its claims unprepared;
- init containers run in order before the pod's own (``sleep N`` for N seconds, any
  other command ending at once), the pod Pending while one runs; a sidecar
  (restartPolicy Always) runs beside the pod's containers until they end; one that exits
  non-zero fails the pod under restartPolicy Never, else is started again as below;
- a container whose command ends is started again if its restart rules, its own
  restartPolicy or the pod's say so (commands.should_restart: Always, or OnFailure for
  one that exits non-zero), at once the first time, then after a back-off of 10 s
  doubling to 5 minutes; its claims stay prepared. One that is not shows its exit while
  the others run on. One whose command ends as it starts (``exit 1``) is shown exited
  from the pod's first status, never running (``_exited_at_once``);
- an ephemeral container added to a running pod (``kubectl debug``) is started and
  listed, and every spec change is observed on the status (``_observe_generation``);
- a running container (or sidecar) whose image is changed is killed and started again
  with the new one, whatever the restart policy, and one backing off starts at once
  (``_start_redefined``); each container's status names the image it was made with;
- a container whose exit a RestartAllContainers rule of its names restarts the pod in
  place: every container killed, shown waiting and counted once more, the init
  containers run again, then the pod's own; its IP and claims stay (``_restart_in_place``);
- a container with a readiness (or startup) probe is held unready (not started) until
  the probe would pass, the workload taken to answer it (``probe_plan``);
- a container gets the CDI devices of the claim requests it names, matched EXACTLY
  against the ``request_names`` the driver returned (a device with none goes to all);
- each status PATCH carries the pod's UID (PatchPodStatus), so a write meant for a pod
  deleted meanwhile is refused instead of landing on a namesake created since; the status
  itself is the kubelet's (podstatus.py): its conditions at the pod's generation, Ready
  following the readiness gates, Pending with its containers ContainerCreating while a
  prepare fails or is slow (``CREATING_SHOWN_AFTER_S``), and a terminal status before a
  deleted pod is removed;
- a failed prepare is recorded as an event and made again at the pod's next sync (60 s,
  jittered to 60-90 s), or at once when the pod changes beyond its status; a container
  the runtime could not create is tried again at the next PLEG relist (which sees the
  sandbox the attempt left), then every 10-15 s;
- Events are written as the kubelet's event recorder writes them (events.py), behind
  the pod's start: a repeat counts up the Event recorded before, the tenth different
  message of one reason is combined into an Event of its own, and a pod's burst of
  events is rate-limited. Each container's start and stop is told as the kubelet tells
  it (containerevents.py): its image pulled or found, Created, Started, and Killing when
  the pod is deleted or a sidecar stopped;
- when a pod's containers end, its claims are unprepared BEFORE the new status is
  written, and a failed unprepare is retried until it succeeds (once more at the next
  PLEG relist, then every 10-15 s); a deleted pod is removed for good only after that;
- prepared claims are checkpointed (``<kubelet dir>/dra_manager_state.json``), so a
  restarted kubelet does not prepare again what its running pods already have;
- extended resources backed by DRA: the claim the scheduler made for them
  (``status.extendedResourceClaimStatus``) is prepared with the pod's own claims, and
  each container gets the devices of the requests mapped to the resources it asks for;
- a claim is known by namespace and name: while one is being unprepared, no new pod
  gets it, nor a new claim made under its name; every 60 s, claims held only by pods
  that are gone (force-deleted, or deleted while this kubelet was down) are unprepared;
- ``status.containerStatuses[].allocatedResourcesStatus`` shows each claimed device's
  health from the drivers' health streams, updated when health changes, when the pod
  changes beyond its status and on every periodic pod sync, each pod's own 60-90 s
  after its last (resync.py); a device not heard of within its timeout reads Unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testbed.config import KUBELET_SYNC_FREQUENCY_S
from testbed.http11 import TransportError
from testbed.keys import CONTAINER_ENV_ANNOTATION
from testbed.kubeapi import ApiError, ClaimRef, KubeClient, Obj, WatchPosition, now_rfc3339, parse_rfc3339, path_for
from testbed.kubelet import admission, claiminfo, commands, containerevents, metrics, podstatus, skips
from testbed.kubelet.claiminfo import PreparedClaim
from testbed.kubelet.containerevents import Told
from testbed.kubelet.events import EventQueue, EventRecorder
from testbed.kubelet.node import NodeSpec, node_object
from testbed.kubelet.plugins import PluginCallError, PluginManager, PreparedDevice
from testbed.kubelet.podnetwork import AddressesExhausted, PodAddresses
from testbed.kubelet.resync import ResyncSchedule
from testbed.kubelet.statuswriter import StatusWriter
from testbed.kubeletplugin import cdi
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)
T = TypeVar("T")

CRASH_LOOP_INITIAL_S, CRASH_LOOP_MAX_S = 10.0, 300.0
"""The kubelet's back-off before it starts again a container that exited."""
SYNC_ERROR_BACKOFF_S = 10.0
"""The kubelet's backOffPeriod: a pod whose sync failed (a container the runtime could not
create, an unprepare the driver refused) is synced again this long later."""
PLEG_RELIST_S = 1.0
"""How often the kubelet's PLEG lists containers: a pod whose containers just stopped is
synced again at its next relist, whatever the last sync's outcome."""
JITTER = 0.5
"""The kubelet's pod workers requeue after ``d`` plus up to half of ``d`` more."""
RECONCILE_S = 60.0
"""How often claims of pods that are gone are looked for, as the kubelet's DRA manager does."""
CREATING_SHOWN_AFTER_S = 1.0
"""A start (the claims' prepare) that takes longer shows the pod Pending with its
containers ContainerCreating, as the kubelet's status at the start of its sync does; a
quicker one goes straight to Running (the kubelet's ContainerCreating then lasts a
fraction of a second), saving one status write per pod."""
PREPARE_FAILED = "FailedPrepareDynamicResources"
PREPARE_FAILED_MESSAGE = "Failed to prepare dynamic resources: prepare dynamic resources"
"""The event's words and the kubelet's own wrapping of every PrepareResources error."""
SANDBOX_FAILED = "FailedCreatePodSandBox"
CREATE_CONTAINER_ERROR = "CreateContainerError"
DEADLINE_EXCEEDED = "DeadlineExceeded"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
"""The kubelet's words (its active deadline handler) for a pod past activeDeadlineSeconds."""
NO_RELATIONSHIP = "no relationship found between node"
"""The node authorizer's refusal of an object it does not (yet) link to the node."""
AUTHORIZER_CATCH_UP_S = (0.005, 0.01, 0.02, 0.04, 0.08)
POD_GROUP_API = "scheduling.k8s.io"
EXTENDED_RESOURCES = ":extended-resources"
"""Stands for the pod's extended-resource claim among its claim names (no pod claim can be
named so: those are DNS labels)."""


@dataclass
class _BackingOff:
    """A container that exited, until the pod worker's sync that starts it again: the
    syncs before that its back-off blocks (``back_off_syncs``, as monotonic times)."""

    delay: float
    blocked: list[float]
    restart_at: float
    synced: bool = False
    """Whether a sync was blocked already (the next shows CrashLoopBackOff)."""

    def next_sync(self) -> float:
        return self.blocked[0] if self.blocked else self.restart_at


@dataclass
class LinkWait:
    """How long a pod start waited for the node authorizer to link its claims to the node."""

    seconds: float = 0.0


class StartFailed(Exception):
    def __init__(self, reason: str, message: str, created: tuple[str, str] | None = None):
        """``created``: the runtime made the sandbox, and this container (its name) it
        refused, in these words (the runtime's); the Event is then about that container."""
        super().__init__(message)
        self.reason = reason
        self.created = created
        self.container = created[0] if created else ""


class PodManager:
    def __init__(
        self,
        client: KubeClient,
        node: NodeSpec,
        plugins: PluginManager,
        cdi_dir: Path,
        watch_pods: bool = True,
        checkpoint: Path | None = None,
        watch_client: KubeClient | None = None,
        durable: bool = True,
        pod_cidr: Callable[[], str | None] = lambda: None,
        images: containerevents.ImageStore | None = None,
        sync_frequency_s: float = KUBELET_SYNC_FREQUENCY_S,
        node_seen: Callable[[], Obj | None] = lambda: None,
    ):
        """``durable``: fsync the checkpoint, as the kubelet does (a real node); synthetic
        nodes, whose state is throw-away, skip it. ``pod_cidr``: the Node's, as last seen
        (pods get their IPs from it: podnetwork.py). ``images``: the node's, as its
        runtime keeps them (none to start with, forgotten on a restart, if not given).
        ``sync_frequency_s``: the KubeletConfiguration's syncFrequency. ``node_seen``: the
        Node as last seen (pods are admitted against it; None: as it was registered)."""
        self.client = client
        self.node_seen = node_seen
        self.watch_client = watch_client or client
        self.checkpoint = checkpoint
        self.durable = durable
        self._checkpoint_behind = False
        """The last checkpoint write failed: the claims in memory are the truth until one succeeds."""
        self.node = node
        self.plugins = plugins
        self.cdi_dir = cdi_dir
        self.watch_pods = watch_pods
        self.pod_cidr = pod_cidr
        self._addresses = PodAddresses()
        self.claims: dict[str, PreparedClaim] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._latest: dict[str, Obj] = {}
        self._updated: dict[str, asyncio.Event] = {}
        self._changes: dict[str, int] = {}
        """By pod UID: how often the pod changed beyond its status (or was deleted)."""
        self._task: asyncio.Task[None] | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self._reconcile_task: asyncio.Task[None] | None = None
        self._position = WatchPosition()
        """How far the pod watch got: set once its first list was handed over."""
        self._status_tasks: set[asyncio.Task[None]] = set()
        self._events = EventRecorder(node.name)
        self._told = EventQueue(client, self._events)
        self._statuses = StatusWriter(client)
        self._images = images or containerevents.ImageStore()
        self._running: dict[str, str] = {}
        """Pods whose containers run, by UID: when they started (RFC 3339)."""
        self.sync_frequency_s = sync_frequency_s
        self._resync_schedule = ResyncSchedule(sync_frequency_s, JITTER)
        self._resync_wake = asyncio.Event()
        """Set when a pod starts running: it may be due before the one slept for."""
        self._claim_uids: dict[str, dict[str, str]] = {}
        """By pod UID: the pod's claim name -> ResourceClaim UID."""
        self._terminated: set[str] = set()
        """Pods whose claims were released after their containers stopped, until the API
        says they are gone: their late events must not release them again."""
        self._resources_status: dict[str, object] = {}
        """By pod UID: the allocatedResourcesStatus last written, to write only changes."""
        self._waiting: dict[str, dict[str, tuple[str, str]] | None] = {}
        """Pods shown Pending (podstatus.py), with the container the runtime refused."""
        self._inits: dict[str, podstatus.InitRun] = {}
        """Pods whose init containers ran or run: how far they got."""
        self._initializing: set[str] = set()
        """Pods whose init containers run now (``_initialize``)."""
        self._restarted: dict[str, dict[str, podstatus.Restarted]] = {}
        """By pod UID and container name: containers that exited and are started again."""
        self._started_early: dict[str, dict[str, podstatus.Restarted]] = {}
        """By pod UID and container name: containers started while others of their pod
        wait for their image (``_pull_images``), as they are; the pod is not running yet."""
        self._process_changes: dict[tuple[str, str, str], list[int | None]] = {}
        """By namespace, pod and container: ``process_changed`` calls made before the pod
        ran here (a NodeHost taking a node over restarts its driver before its kubelet
        has adopted the driver pod), told once it runs."""
        self._process_back_off: dict[tuple[str, str, str], tuple[float, float]] = {}
        """Per container whose process runs beside this kubelet: its back-off (restart_delay)."""
        self._probing: dict[str, dict[str, str]] = {}
        """By pod UID and container name: containers whose probes have not passed yet."""
        self._ephemeral: dict[str, dict[str, Obj]] = {}
        """Ephemeral containers started (``kubectl debug``), by pod: each one's state."""
        self._ran_images: dict[str, dict[str, str]] = {}
        """By pod UID and container name: the image each container was last created with
        (the spec's may have changed since: ``_redefined``)."""
        self._generation_syncs: dict[str, bool] = {}
        """Pods whose spec change is being synced: whether another came meanwhile."""
        self._past_deadline: set[str] = set()
        """Pods past their activeDeadlineSeconds: their workers stop them (``_ending``)."""
        self._deadline_timers: dict[str, asyncio.TimerHandle] = {}
        self._admitted: set[str] = set()
        """Pods this kubelet took (admission.py): the others it counts while it admits one."""
        self._rejected: set[str] = set()
        """Pods it refused: never started (or stopped, if running through a restart), Failed
        until deleted."""
        self._to_admit: list[str] = []
        """Pods seen and not admitted yet: those that came in together are admitted
        together, oldest first (``_admission``)."""
        self._verdicts: dict[str, admission.Refusal | None] = {}
        self._started_before_restart: set[str] = set()
        """Pods whose claims were prepared when the checkpoint was written: those still
        Running kept their containers through this kubelet's restart."""
        self._restarted_node = False
        """Whether this kubelet's state (its checkpoint) was there when it started: then
        its pods Running without claims kept their containers too, as a runtime keeps
        them through a kubelet's restart."""

    def _load_checkpoint(self) -> None:
        if self.checkpoint is None:
            return
        self._restarted_node = self.checkpoint.exists()
        if not self._restarted_node:
            # As the kubelet's DRA manager does at its first start: an empty checkpoint,
            # whose presence tells a restart from a first start.
            with contextlib.suppress(OSError):
                claiminfo.write_checkpoint(self.checkpoint, {}, durable=self.durable)
        claims = claiminfo.read_checkpoint(self.checkpoint, self.node.name)
        for claim in claims.values():
            if claim.prepared:
                self._started_before_restart |= claim.users
            # As the kubelet restores its claim info: not prepared until a driver says so
            # again, so a pod that starts now (one more user of a shared claim, or a pod
            # made again after a reboot) asks the driver once more.
            claim.prepared = False
        self.claims = claims

    def _save_checkpoint(self) -> None:
        """Raises OSError (a full disk, say). As the kubelet's claim info cache, what is
        in memory stays the truth and the next write that succeeds records all of it."""
        if self.checkpoint is None:
            return
        try:
            claiminfo.write_checkpoint(self.checkpoint, self.claims, durable=self.durable)
        except OSError:
            self._checkpoint_behind = True
            raise
        self._checkpoint_behind = False

    def _checkpoint_for_start(self, what: str) -> None:
        """A failed write fails the pod's start in the kubelet's words (its next sync tries again)."""
        try:
            self._save_checkpoint()
        except OSError as exc:
            raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: {what}: {go_path_error(exc)}") from None

    def start(self) -> None:
        self._load_checkpoint()
        metrics.CLAIMS_IN_USE.books.add(self)
        if self.watch_pods:
            self._task = asyncio.create_task(self._watch(), name=f"pods-{self.node.name}")
        self._resync_task = asyncio.create_task(self._resync(), name=f"pod-sync-{self.node.name}")
        self._reconcile_task = asyncio.create_task(self._reconcile(), name=f"claim-reconcile-{self.node.name}")

    async def stop(self) -> None:
        metrics.CLAIMS_IN_USE.books.discard(self)
        await cancel_and_wait(
            self._task, self._resync_task, self._reconcile_task, *self._status_tasks, *self._workers.values()
        )
        await self._told.close()
        await self._statuses.stop()
        self._workers.clear()

    async def _watch(self) -> None:
        path = path_for("v1", "pods")
        async for kind, pod in self.watch_client.watch(
            path, {"fieldSelector": f"spec.nodeName={self.node.name}"}, position=self._position
        ):
            self.observe(kind, pod)

    def observe(self, kind: str, pod: Obj) -> None:
        """Feed a pod event (from this manager's watch, or a watch shared by many nodes).
        As the kubelet, only a change beyond the status wakes the pod's worker."""
        uid = pod["metadata"]["uid"]
        before = self._latest.get(uid)
        self._latest[uid] = dict(pod, _deleted=kind == "DELETED")
        if before is None and _running_with_own_ip(pod):
            # Running before this kubelet started: its IP is held from now on, as a network
            # plugin's IPAM keeps it on disk, so that no pod new here gets it meanwhile.
            with contextlib.suppress(StartFailed):
                self._pod_ip(pod)
        if (
            kind != "DELETED"
            and before is not None
            and uid in self._workers
            and podstatus.generation(before) != podstatus.generation(pod)
            and "observedGeneration" in pod.get("status", {})
        ):
            self._sync_spec(uid)
        if kind == "DELETED" or before is None or _differs_beyond_status(before, pod):
            self._changes[uid] = self._changes.get(uid, 0) + 1
            self._updated.setdefault(uid, asyncio.Event()).set()
            if kind != "DELETED" and before is not None and uid in self._running and not _own_write(before, pod):
                # A running pod's worker syncs it now: its status is worked out again
                # (a device whose health went stale turns Unknown), and the next
                # periodic sync comes a syncFrequency after this one.
                self._resync_schedule.add(uid, time.monotonic())
                if self._claim_uids.get(uid):
                    self._in_background(self._sync_status(uid), f"pod-status-{uid}")
        elif uid in self._running and pod["spec"].get("readinessGates"):
            self._follow_readiness_gates(pod)
        if uid in self._workers:
            if before is not None and _deadline(before) != _deadline(pod):
                self._arm_deadline(uid)  # activeDeadlineSeconds may be set or shortened on a running pod
            return
        if kind == "DELETED" and uid in self._terminated:
            self._forget(uid)  # released, and now gone from the API: nothing is left to do
        elif kind != "DELETED" and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            if uid in self._rejected and not self._deleting(uid):
                return  # its Failed status is not written yet
            if uid not in self._rejected:
                self._to_admit.append(uid)
            self._workers[uid] = asyncio.create_task(self._run(uid), name=f"pod-{uid}")
        elif pod["metadata"].get("deletionTimestamp"):
            self._workers[uid] = asyncio.create_task(self._finish_deletion(uid), name=f"pod-del-{uid}")

    # --- helpers ---------------------------------------------------------------------

    def _pod(self, uid: str) -> Obj:
        return self._latest[uid]

    def _deleting(self, uid: str) -> bool:
        pod = self._latest[uid]
        return bool(pod.get("_deleted") or pod["metadata"].get("deletionTimestamp"))

    def _ending(self, uid: str) -> bool:
        """Being deleted, or past its active deadline: its worker stops what it does."""
        return uid in self._past_deadline or self._deleting(uid)

    def _arm_deadline(self, uid: str) -> None:
        """Fail the pod once its activeDeadlineSeconds passed, counted from its startTime as
        the kubelet counts it (from now for a pod new here)."""
        if (timer := self._deadline_timers.pop(uid, None)) is not None:
            timer.cancel()
        seconds = _deadline(self._pod(uid))
        if seconds is None:
            return
        began = parse_rfc3339(_start_time(self._pod(uid)))
        delay = max(0.0, began + seconds - time.time())
        self._deadline_timers[uid] = asyncio.get_running_loop().call_later(delay, self._deadline_passed, uid)

    def _deadline_passed(self, uid: str) -> None:
        self._deadline_timers.pop(uid, None)
        if uid not in self._latest or uid in self._terminated or self._deleting(uid):
            return
        self._past_deadline.add(uid)
        self._changes[uid] = self._changes.get(uid, 0) + 1
        self._updated.setdefault(uid, asyncio.Event()).set()

    async def _pause(self, uid: str, seconds: float, seen: int | None = None) -> None:
        """Sleep, but wake at once if the pod changes (e.g. is being deleted), or return at
        once if it changed since ``seen`` (from ``_changes``, taken when the attempt that
        ends here began): as a kubelet's pod worker syncs again right away for an update
        that came in during a sync."""
        event = self._updated.setdefault(uid, asyncio.Event())
        event.clear()
        if seen is not None and self._changes.get(uid, 0) != seen:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)

    def tell(self, pod: Obj, told: Told, container: str = "") -> None:
        """Record an Event on the pod, or on its ``container``, as a kubelet's event
        recorder does (events.py): written behind, in the order told."""
        where = containerevents.field_path(pod, container) if container else ""
        self._told.tell(pod, told.kind, told.reason, told.message, where)

    def _tell_started(self, pod: Obj, container: Obj, pull: containerevents.Pull | None = None) -> None:
        """A container is created and started: told so, and the image it runs noted.
        ``pull``: its image was made sure of already (``_pull_images``)."""
        self._ran_images.setdefault(pod["metadata"]["uid"], {})[container["name"]] = container.get("image", "")
        if pull is None:
            pull = containerevents.Pull(self._images.ensure(container))
        elif pull.started_told:
            return
        for each in [*pull.told, containerevents.CREATED, containerevents.STARTED]:
            self.tell(pod, each, container["name"])

    def _pull_images(self, pod: Obj, before: Mapping[str, containerevents.Pull]) -> dict[str, containerevents.Pull]:
        """Make sure of the images of the pod's containers, in spec order, as the kubelet
        does before it creates each: a pull may fail (the node's pull limit) or be backed
        off (``ImageStore.pull``), which is told at once; then the pod waits for its next
        sync. The kubelet starts the others meanwhile, and does not pull their images
        again (``before``): they run, and are shown so, while the pod stays Pending."""
        uid, pulls = pod["metadata"]["uid"], {}
        containers = {container["name"]: container for container in pod["spec"].get("containers", [])}
        for name, container in containers.items():
            pull = before.get(name)
            if pull is None or pull.failed is not None:
                pull = self._images.pull(container, uid)
            pulls[name] = pull
        if any(pull.failed for pull in pulls.values()):
            for name, pull in pulls.items():
                if pull.failed is None and not pull.started_told:
                    self._tell_started(pod, containers[name], pull)
                    self._started_early.setdefault(uid, {})[name] = _started_now(pod, containers[name])
                    pulls[name] = containerevents.Pull([], None, started_told=True)
                else:
                    for told in pull.told:
                        self.tell(pod, told, name)
                    if pull.failed is not None:
                        metrics.STARTED_CONTAINER_ERRORS.labels("container", pull.failed[0]).inc()
                    pulls[name] = containerevents.Pull([], pull.failed, pull.started_told)
        return pulls

    async def events_sent(self) -> None:
        """Until every Event told so far was written."""
        await self._told.sent()

    # --- lifecycle -------------------------------------------------------------------

    def _admission(self, uid: str) -> admission.Refusal | None:
        """This pod's verdict. Every pod seen since the last admission is admitted first,
        oldest first, as the kubelet takes the pods that reach it together: all of them
        at its start, so a restarted kubelet checks again the pods running through the
        restart, and one the node no longer admits (its labels changed, say) is refused
        and stopped."""
        if self._to_admit:
            waiting, self._to_admit = self._to_admit, []
            waiting = [other for other in waiting if other in self._latest]
            for other in sorted(waiting, key=lambda u: self._latest[u]["metadata"].get("creationTimestamp") or ""):
                self._verdicts[other] = self._admit(other)
        return self._verdicts.pop(uid, None)

    def _admit(self, uid: str) -> admission.Refusal | None:
        """Take the pod, or say why not (the kubelet's admission when it first sees a pod);
        once taken, a pod is not checked again until this kubelet restarts."""
        pod = self._pod(uid)
        if uid in self._admitted:
            return None
        refused = admission.refusal(pod, self._node_object(), self._admitted_pods(uid))
        if refused is None:
            self._admitted.add(uid)
        return refused

    def _node_object(self) -> Obj:
        return self.node_seen() or node_object(self.node)

    def _admitted_pods(self, besides: str) -> list[Obj]:
        """The pods taken and not yet ended: what the kubelet counts as in use."""
        return [
            self._latest[uid]
            for uid in sorted(self._admitted & self.active_uids())
            if uid != besides and uid in self._latest and uid not in self._terminated
        ]

    async def _refuse(self, uid: str, refused: admission.Refusal) -> bool:
        """Fail a pod the kubelet does not take, unless a fresh read of the Node lets it
        in after all (the pod's node affinity was the only reason: a label may be new).
        True if refused."""
        if refused.only_affinity:
            with contextlib.suppress(ApiError, TransportError):
                node = await self.client.get(path_for("v1", "nodes", self.node.name))
                again = admission.refusal(self._pod(uid), node, self._admitted_pods(uid))
                if again is None:
                    self._admitted.add(uid)
                    return False
                refused = again
        pod = self._pod(uid)
        self._rejected.add(uid)
        metrics.ADMISSION_REJECTIONS.labels(admission.metric_reason(refused.reason)).inc()
        self.tell(pod, Told("Warning", refused.reason, refused.message))
        message = admission.REJECTED + refused.message
        if self._kept_running(pod):
            # Its containers ran through this kubelet's restart: they are stopped and its
            # claims unprepared, and its status tells of them, as for any pod the kubelet fails.
            self._running[uid] = _start_time(pod)
            self._inits[uid] = podstatus.InitRun.from_status(pod) or podstatus.InitRun.complete(pod, now_rfc3339())
            self._restarted[uid] = podstatus.Restarted.from_status(pod)
            await self._terminate(uid, {"reason": refused.reason, "message": message})
            return True
        status = podstatus.rejected_status(pod, refused.reason, message, now_rfc3339())
        await self._patch_status(pod, {"status": status})
        return True

    async def _run(self, uid: str) -> None:
        try:
            refused = self._admission(uid)
            if refused is not None and await self._refuse(uid, refused):
                started = False
            else:
                self._arm_deadline(uid)
                started = await self._start(uid)
            if started:
                seconds = commands.run_seconds(self._pod(uid))
                if seconds is None:
                    while (source := await self._restart_exited(uid)) is not None:
                        if not await self._restart_in_place(uid, source):
                            break
                elif await self._run_to_the_end(uid, seconds):
                    # Its containers ended, its sidecars are stopped. The kubelet
                    # unprepares after the containers stopped and before the pod's new
                    # status reaches the API server.
                    since = self._not_running(uid)  # first: its own containers completed, only sidecars stop
                    await self._stop_containers(uid)
                    await self._release(uid)
                    codes = {c["name"]: commands.exit_code(c) for c in self._pod(uid)["spec"]["containers"]}
                    await self._set_ended(uid, since, podstatus.Ended.exited(codes, now_rfc3339()))
            if uid in self._past_deadline and uid not in self._terminated:
                await self._exceed_deadline(uid)
            while not self._deleting(uid):  # ended, failed, or never to start (an init container failed)
                await self._pause(uid, 3600)
            await self._finish_deletion(uid)
        except asyncio.CancelledError:
            raise
        except ApiError as exc:
            if not exc.not_found:
                log.exception("pod worker %s on %s failed", uid, self.node.name)
                return
            # Deleted (or replaced by a namesake) before its status could be written:
            # release what it held.
            log.info("pod %s on %s is gone: %s", uid, self.node.name, exc.message)
            await self._finish_deletion(uid)
        except Exception:
            log.exception("pod worker %s on %s failed", uid, self.node.name)
        finally:
            self._workers.pop(uid, None)

    async def _run_to_the_end(self, uid: str, seconds: float) -> bool:
        """The containers of a pod that ends run as their commands say: one that ends
        before the last is shown exited (with its status; the pod Running, not ready) at
        its own time; one whose image changed is started again with it
        (``_start_redefined``) and runs its command's time once more. True once the last
        one ended (or the pod's run-seconds annotation's time is over), False if the pod
        is being deleted first."""
        begin, pod = time.monotonic(), self._pod(uid)
        ids, restarted = _container_ids(pod), self._restarted.setdefault(uid, {})
        # Those that had ended before this kubelet restarted stay so.
        ends = {name: begin + e.seconds for name, e in commands.endings(pod).items() if name not in restarted}
        last = begin + seconds
        while not self._ending(uid):
            seen = self._changes.get(uid, 0)
            for container in self._redefined(uid, ()):
                if not await self._start_redefined(uid, container):
                    return False
                if (ends_now := commands.endings(self._pod(uid)).get(container["name"])) is not None:
                    ends[container["name"]] = time.monotonic() + ends_now.seconds
            last = max(ends.values(), default=last)
            name = min(ends, key=ends.__getitem__, default=None)
            at = last if name is None or ends[name] >= last else ends[name]  # the last ones end with the pod
            if (left := at - time.monotonic()) > 0:
                await self._pause(uid, left, seen)
                continue
            if name is None or at == last:
                return True
            del ends[name]
            again = restarted.get(name) or podstatus.Restarted(0, ids[name], {}, {})
            began = again.state.get("running", {}).get("startedAt", self._running[uid])
            code = commands.exit_code(next(c for c in self._pod(uid)["spec"]["containers"] if c["name"] == name))
            exited = podstatus.terminated_state(
                again.container_id, began, podstatus.Ended.exit_status(code, now_rfc3339())
            )
            restarted[name] = podstatus.Restarted(again.count, again.container_id, exited, again.last)
            await self._write_running(uid)
        return False

    async def _start(self, uid: str) -> bool:
        """As the kubelet's pod worker: a failed attempt is made again at the next sync
        (sooner if the pod's spec, labels, annotations or deletion change)."""
        sandbox = False  # the kubelet prepares claims before the runtime makes it, containers after
        initialized: podstatus.InitRun | None = None  # its init containers, once done, run no more
        pulls: dict[str, containerevents.Pull] = {}
        while not self._ending(uid):
            seen, pod = self._changes.get(uid, 0), self._pod(uid)
            try:
                if self._kept_running(pod):
                    env = await self._adopt(pod)
                    inits = podstatus.InitRun.from_status(pod) or podstatus.InitRun.complete(pod, now_rfc3339())
                    self._restarted[uid] = podstatus.Restarted.from_status(pod)
                    self._ran_images[uid] = _images_shown(pod)  # the runtime's containers say it
                    self._ephemeral[uid] = _ephemeral_shown(pod)  # not to be started twice
                else:
                    waits = {name: pull.failed for name, pull in pulls.items() if pull.failed is not None}
                    if waits:
                        # The kubelet writes why the sync before failed as the next begins.
                        await self._set_waiting(pod, waits, initialized)
                    env = await self._creating_while(pod, self._prepare(pod))
                    if initialized is None:
                        ran = await self._initialize(pod)
                        if ran is None:
                            return False  # deleted while its init containers ran
                        if ran.failing is not None:
                            await self._fail_initializing(uid)
                            return False
                        initialized = ran
                    inits = initialized
                    pulled_before = {name for name, pull in pulls.items() if pull.failed is None}
                    pulls = self._pull_images(self._pod(uid), pulls)
                    if any(pull.failed for pull in pulls.values()):
                        # A sync that made the sandbox, or started a container whose image it
                        # pulled, is followed by the relist's; one that only failed to pull,
                        # by the pod worker's back-off.
                        pulled_now = {name for name, pull in pulls.items() if pull.failed is None} - pulled_before
                        made = not (sandbox or inits.spans) or bool(pulled_now)
                        next_sync = until_next_relist() if made else jittered(SYNC_ERROR_BACKOFF_S)
                        sandbox = True
                        await self._pause(uid, next_sync, seen)
                        continue
                # The pod as last seen: its status holds what the init containers' writes said.
                await self._set_running(self._pod(uid), env, inits, probed=not self._kept_running(pod), pulls=pulls)
                return True
            except StartFailed as exc:
                self._inits.pop(uid, None)
                self.tell(pod, Told("Warning", exc.reason, str(exc)), exc.container)
                if exc.reason in (PREPARE_FAILED, SANDBOX_FAILED):
                    await self._set_waiting(pod)
                elif exc.created is not None:
                    name, message = exc.created
                    await self._set_waiting(pod, {name: (CREATE_CONTAINER_ERROR, message)})
                if exc.reason == PREPARE_FAILED:
                    next_sync = jittered(self.sync_frequency_s)
                elif not sandbox:
                    # The sandbox the failed attempt left is new to the PLEG, whose next
                    # relist syncs the pod once more.
                    sandbox = True
                    next_sync = until_next_relist()
                else:
                    next_sync = jittered(SYNC_ERROR_BACKOFF_S)
            await self._pause(uid, next_sync, seen)
        return False

    async def _creating_while(self, pod: Obj, start: Coroutine[Any, Any, T]) -> T:
        """``start``'s result; once it took ``CREATING_SHOWN_AFTER_S``, the pod is shown
        ContainerCreating meanwhile (a slow driver's prepare), a write that always lands
        before the next one, as it is awaited first."""
        task = asyncio.ensure_future(start)
        try:
            done, _ = await asyncio.wait({task}, timeout=CREATING_SHOWN_AFTER_S)
            if not done:
                await self._set_waiting(pod)
        except asyncio.CancelledError:
            task.cancel()
            raise
        except BaseException:
            # The pod is gone: let the start end, so that what it prepared is recorded
            # and released with the pod.
            with contextlib.suppress(Exception):
                await task
            raise
        return await task

    async def _pod_claims(self, pod: Obj, link_wait: LinkWait | None = None) -> list[Obj]:
        """The pod's ResourceClaims, each allocated and reserved for it (and, made from a
        template, owned by it). Failures read as the kubelet's (FailedPrepareDynamicResources)."""
        link_wait = link_wait or LinkWait()
        meta = pod["metadata"]
        claims = []
        entries = list(pod["spec"].get("resourceClaims", []))
        extended = pod.get("status", {}).get("extendedResourceClaimStatus")
        if extended:  # the claim the scheduler made for the pod's extended resources
            entries.append({"name": EXTENDED_RESOURCES, "resourceClaimName": extended["resourceClaimName"]})
        for entry in entries:
            name, generated = pod_claim_name(pod, entry)
            if name is None:
                continue  # no claim was needed: the entry is ignored
            try:
                claim = await self._read_claim(
                    path_for("resource.k8s.io/v1", "resourceclaims", name, meta["namespace"]), link_wait
                )
            except ApiError as exc:
                raise StartFailed(
                    PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: fetch ResourceClaim {name}: {exc.message}"
                ) from None
            except (TransportError, TimeoutError) as exc:
                raise StartFailed(
                    PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: fetch ResourceClaim {name}: {exc or 'timed out'}"
                ) from None
            if generated and (not_ours := _not_made_for(pod, claim)):
                raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: {not_ours}")
            status = claim.get("status", {})
            if not _reserved_for(pod, claim):
                raise StartFailed(
                    PREPARE_FAILED,
                    f"{PREPARE_FAILED_MESSAGE}: pod {meta['name']} ({meta['uid']}) is not allowed to use "
                    f"ResourceClaim {name} ({claim['metadata']['uid']})",
                )
            if not status.get("allocation"):
                raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: ResourceClaim {name}: not allocated")
            claims.append(dict(claim, _pod_claim_name=entry["name"]))
        return claims

    async def _read_claim(self, path: str, link_wait: LinkWait) -> Obj:
        """The kubelet reads a claim only after it mounted the pod's volumes (at least its
        service-account token, by a reconciler that runs every 100 ms); by then the API
        server's node authorizer has linked the newly bound pod's claims to the node. This
        kubelet mounts nothing and asks at once, and so can ask before that link exists:
        it then asks again, for up to ~0.15 s, rather than fail a start the real kubelet
        would not have failed (its next attempt comes at the pod's next sync, 60-90 s
        later). The time refused is added to ``link_wait``: it stands in for the mount."""
        first_asked = asked = time.perf_counter()
        try:
            for delay in (*AUTHORIZER_CATCH_UP_S, None):
                try:
                    # As the kubelet's client-go: an API server that refuses the
                    # connection (restarting, say) fails the read, and so the start.
                    return await self.client.get(path, retry_unreachable=False)
                except ApiError as exc:
                    if delay is None or not (exc.status == 403 and NO_RELATIONSHIP in exc.message):
                        raise
                    metrics.CLAIM_READ_RETRIES.inc()
                await asyncio.sleep(delay)
                asked = time.perf_counter()
        finally:
            link_wait.seconds += asked - first_asked
        raise AssertionError("unreachable")

    def _kept_running(self, pod: Obj) -> bool:
        """Whether the pod's containers ran through this kubelet's restart: it is Running,
        and its claims were prepared here (the checkpoint says so) or it has none."""
        if pod.get("status", {}).get("phase") != "Running":
            return False
        claimless = not pod["spec"].get("resourceClaims") and not pod["status"].get("extendedResourceClaimStatus")
        return pod["metadata"]["uid"] in self._started_before_restart or (self._restarted_node and claimless)

    async def _adopt(self, pod: Obj) -> dict[str, dict[str, str]]:
        """A pod whose containers outlived this kubelet's restart: the kubelet prepares
        resources only for a pod sandbox it creates, so no driver is asked; the
        containers' devices are those the checkpoint recorded."""
        claims = await self._pod_claims(pod)
        return self._container_env(pod, claims) if claims else {}

    async def _prepare(self, pod: Obj) -> dict[str, dict[str, str]]:
        """The timed part is what a kubelet times as PrepareResources: reading the pod's
        claims from the API server and the NodePrepareResources calls, for every pod
        start (claim-less pods too). Not timed: resolving CDI IDs (the runtime's work),
        and the reads the node authorizer refused while it caught up (they stand in for
        the volume mount a kubelet waits for before it prepares anything)."""
        uid = pod["metadata"]["uid"]
        started = time.perf_counter()
        link_wait = LinkWait()
        failed = True
        try:
            claims = await self._pod_claims(pod, link_wait)
            if claims:
                await self._prepare_claims(uid, claims)
            failed = False
        finally:
            metrics.OPERATIONS.labels("PrepareResources", str(failed).lower()).observe(
                time.perf_counter() - started - link_wait.seconds
            )
            if link_wait.seconds:
                metrics.LINK_WAITS.observe(link_wait.seconds)
        return self._container_env(pod, claims) if claims else {}

    async def _prepare_claims(self, pod_uid: str, claims: list[Obj]) -> None:
        """As the kubelet does, a claim is recorded (and checkpointed) with its pod BEFORE
        the driver is asked: a claim whose prepare failed is still unprepared when the
        pod goes. A claim counts as prepared once every driver it uses prepared it; the
        others are asked again on the next attempt (prepare is idempotent).

        As in the kubelet, only the bookkeeping is one step (here: no await within it);
        the drivers are called while other pods' claims are prepared and unprepared, so a
        driver gets concurrent calls, as from a real kubelet's parallel pod workers."""
        by_driver: dict[str, list[Obj]] = {}
        for claim in claims:
            spared = skips.skipped_calls(claim)
            for driver in _drivers(claim):
                # Before any claim is recorded, as the kubelet checks: a pod that never
                # reached a driver leaves nothing to unprepare. A driver it does not call
                # need not be there.
                if skips.PREPARE not in spared.get(driver, ()) and self.plugins.plugin_for(driver) is None:
                    raise StartFailed(
                        PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: DRA driver {driver} is not registered"
                    )
        try:
            for claim in claims:
                known = self._record_user(pod_uid, claim)
                if not known.prepared:
                    for driver in known.drivers:
                        if known.calls(driver, skips.PREPARE):
                            by_driver.setdefault(driver, []).append(claim)
                        else:
                            metrics.PREPARE_SKIPS.labels(driver).inc()
        except BaseException:
            with contextlib.suppress(OSError):  # the claims recorded before the refused one
                self._save_checkpoint()
            raise
        self._checkpoint_for_start("checkpoint ResourceClaim cache")
        answered: dict[str, set[str]] = {}
        devices: dict[str, list[PreparedDevice]] = {}
        for driver, driver_claims in by_driver.items():
            refs = [
                ClaimRef(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in driver_claims
            ]
            try:
                results = await self.plugins.prepare(driver, refs)
            except PluginCallError as exc:
                # As the kubelet: the first failure ends the attempt; drivers that did
                # prepare are asked again next time (prepare is idempotent). Nothing to
                # save: the claims were checkpointed with their pod above.
                raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: {exc}") from None
            for claim_uid, prepared in results.items():
                answered.setdefault(claim_uid, set()).add(driver)
                devices.setdefault(claim_uid, []).extend(prepared)
        for claim in claims:
            held = self.claims.get(claim["metadata"]["uid"])
            if held is None:  # as the kubelet words it; the pod's user record prevents it
                meta = claim["metadata"]
                raise StartFailed(
                    PREPARE_FAILED,
                    f"{PREPARE_FAILED_MESSAGE}: internal error: unable to get claim info for ResourceClaim "
                    f"{meta['name']} in namespace {meta['namespace']}",
                )
            called = {d for d in held.drivers if held.calls(d, skips.PREPARE)}
            if not held.prepared and answered.get(held.uid, set()) == called:
                held.devices, held.prepared = devices.get(held.uid, []), True
        self._checkpoint_for_start("checkpoint ResourceClaim state")

    def _record_user(self, pod_uid: str, claim: Obj) -> PreparedClaim:
        """The claim, known from now on to be used by this pod. As the kubelet keeps its
        claim info by namespace and name: a claim that a pod force-deleted earlier still
        holds under the same name, or whose unprepare has begun, is not for a new pod
        until its unprepare succeeded (the claims before it stay recorded, as there)."""
        meta = claim["metadata"]
        name, uid = meta["name"], meta["uid"]
        known = self.claim_named(meta["namespace"], name)
        if known is None:
            known = self.claims[uid] = PreparedClaim(
                meta["namespace"], name, uid, _drivers(claim), skipped=skips.skipped_calls(claim)
            )
        elif known.uid != uid:
            raise StartFailed(
                PREPARE_FAILED,
                f"{PREPARE_FAILED_MESSAGE}: old ResourceClaim with same name {name} and different UID "
                f"{known.uid} still exists (previous pod force-deleted?!)",
            )
        elif known.unpreparing:
            raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: ResourceClaim {name} is being unprepared")
        known.users.add(pod_uid)
        return known

    def _container_env(self, pod: Obj, claims: list[Obj]) -> dict[str, dict[str, str]]:
        self._claim_uids[pod["metadata"]["uid"]] = {c["_pod_claim_name"]: c["metadata"]["uid"] for c in claims}
        by_pod_name = {c["_pod_claim_name"]: self.claims[c["metadata"]["uid"]] for c in claims}
        env: dict[str, dict[str, str]] = {}
        spec = pod["spec"]
        # Init containers too: the runtime gives each its devices when it starts.
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            wanted = [(ref["name"], ref.get("request")) for ref in container.get("resources", {}).get("claims", [])]
            wanted += [(EXTENDED_RESOURCES, request) for request in _extended_requests(pod, container)]
            ids: list[str] = []
            for claim_name, request in wanted:
                prepared = by_pod_name.get(claim_name)
                if prepared is None:
                    continue
                for device in prepared.devices:
                    # Exactly as the kubelet matches (ClaimInfo.cdiDevicesAsList): a driver
                    # that returns "req/sub" instead of "req" leaves the container without it.
                    if not request or not device.request_names or request in device.request_names:
                        ids.extend(device.cdi_device_ids)
            try:
                env[container["name"]] = cdi.resolve(self.cdi_dir, ids)
            except cdi.CdiResolutionError as exc:
                refused = (container["name"], f"failed to inject CDI devices: {exc}")
                raise StartFailed("Failed", f"Error: {refused[1]}", refused) from None
        return env

    async def _initialize(
        self, pod: Obj, carried: Mapping[str, podstatus.Restarted] | None = None
    ) -> podstatus.InitRun | None:
        """Run the pod's init containers in order before its own, as the kubelet does: each
        to its end (``sleep N``: N seconds; ``sleep infinity``: never; any other command at
        once), a sidecar (restartPolicy Always) started and left running. While one runs,
        the pod shows Pending with it running. One that exits non-zero (``exit N``) fails
        the pod under restartPolicy Never (returned ``failing``), else is started again
        until the pod is deleted (``_retry_init``). None if the pod is deleted meanwhile.
        ``carried``: they run again, the pod restarted in place (``InitRun.carried``)."""
        uid = pod["metadata"]["uid"]
        run = podstatus.InitRun(carried=carried or {})
        self._initializing.add(uid)
        self._sandbox_made(uid)
        try:
            while True:
                for container in pod["spec"].get("initContainers") or []:
                    pull = await self._pull_init_image(uid, container, run)
                    if pull is None:
                        return None
                    self._tell_started(pod, container, pull)
                    run = self._inits[uid] = run.then(now_rfc3339())
                    if podstatus.is_sidecar(container):
                        if not await self._start_sidecar(uid, container):
                            return None
                        continue
                    seconds = commands.init_seconds(container)
                    if seconds != 0:
                        await self._write_initializing(uid)
                        if not await self._runs_for(uid, seconds):
                            return None
                    if code := commands.exit_code(container):
                        if commands.restarts_all(container, code):
                            break  # the pod restarts in place: from its first init container again
                        return await self._retry_init(uid, container, code)
                    run = self._inits[uid] = run.ended(now_rfc3339())
                else:
                    return run
                if (again := await self._restart_initializing(uid, container, code)) is None:
                    return None
                run = again
        finally:
            self._initializing.discard(uid)

    async def _pull_init_image(self, uid: str, container: Obj, run: podstatus.InitRun) -> containerevents.Pull | None:
        """Make sure of an init container's image before it starts: while the pull fails
        (the node's pull limit, then the pod's back-off), the kubelet starts nothing more
        of the pod and tries again at its next sync, whose start shows why the one before
        failed (``Init:ErrImagePull``, then ``Init:ImagePullBackOff``). None if the pod is
        ending first. A sidecar's failed pull holds the pod up too, where the kubelet goes
        on with the next init container."""
        made_sandbox = not run.spans
        while True:
            pull = self._images.pull(container, uid)
            if pull.failed is None:
                return pull
            pod = self._pod(uid)
            for told in pull.told:
                self.tell(pod, told, container["name"])
            metrics.STARTED_CONTAINER_ERRORS.labels("init_container", pull.failed[0]).inc()
            # A sync that made the sandbox is followed by the relist's, another by the
            # pod worker's back-off.
            next_sync = until_next_relist() if made_sandbox else jittered(SYNC_ERROR_BACKOFF_S)
            made_sandbox = False
            if not await self._runs_for(uid, next_sync):
                return None
            self._inits[uid] = run
            await self._write_initializing(uid, {container["name"]: pull.failed})

    async def _restart_initializing(self, uid: str, source: Obj, code: int) -> podstatus.InitRun | None:
        """Init container ``source`` exited with ``code``, as a RestartAllContainers rule
        of its says: seen at the next PLEG relist and shown so (AllContainersRestarting),
        the pod restarts in place (``_remove_all``); the run its init containers start
        again with, None if the pod is ending first."""
        if not await self._runs_for(uid, until_next_relist()):
            return None
        run, name = self._inits[uid], source["name"]
        now = run.carried.get(name) or podstatus.Restarted(0, _container_ids(self._pod(uid))[name], {}, {})
        ended = podstatus.Ended.exit_status(code, now_rfc3339())
        exited = podstatus.terminated_state(now.container_id, run.spans[-1][0], ended)
        self._inits[uid] = run.failed(podstatus.Restarted(now.count, now.container_id, exited, now.last))
        await self._write_initializing(uid)
        latest = self._pod(uid)
        before = podstatus.initializing_status(
            latest, _start_time(latest), _container_ids(latest), self._inits[uid], {}, now_rfc3339()
        )
        await self._remove_all(uid, before)
        return self._inits[uid]

    async def _start_sidecar(self, uid: str, container: Obj) -> bool:
        """A sidecar is probed from its start, as the pod's containers are from theirs;
        the kubelet starts the next container once its startup probe passed (shown
        running, not started, meanwhile; then started, the next one shown from the
        relist after). False if the pod is deleted first."""
        name, began = container["name"], time.monotonic()
        changes = self._probed_from_start(uid, container)
        probing = self._probing[uid]
        if probing.get(name) == "starting":
            await self._write_initializing(uid)
            (started_after, _, then), *changes = changes  # its startup probe's pass comes first
            if not await self._runs_for(uid, started_after):
                return False
            if then is None:
                probing.pop(name, None)
            else:
                probing[name] = then
            # The probe's result syncs the pod: shown started, and the next container,
            # started by that sync, shown running from the relist after.
            await self._write_initializing(uid)
            if not await self._runs_for(uid, until_next_relist()):
                return False
        if changes:
            probed = {name: _container_ids(self._pod(uid))[name]}
            self._in_background(self._follow_probes(uid, changes, probed, began), f"pod-probes-{probed[name]}")
        return True

    async def _fail_initializing(self, uid: str) -> None:
        """The pod failed for its init container (restartPolicy Never): as for a pod whose
        containers ended, its sidecars stopped and its claims unprepared before its
        terminal status is written."""
        await self._stop_containers(uid)
        self._not_running(uid)
        await self._release(uid)
        pod = self._pod(uid)
        status = podstatus.failed_initializing_status(pod, _container_ids(pod), self._inits[uid], now_rfc3339())
        await self._patch_status(pod, {"status": status})

    async def _write_initializing(self, uid: str, waits: Mapping[str, tuple[str, str]] | None = None) -> None:
        """``waits``: containers not started, with the reason and message they wait for."""
        latest = self._pod(uid)
        addresses = self._addresses_of(latest)
        status = podstatus.initializing_status(
            latest,
            _start_time(latest),
            _container_ids(latest),
            self._inits[uid],
            addresses,
            now_rfc3339(),
            self._probing.get(uid),
            self._restarted.get(uid),
            waits,
        )
        self._add_device_health(latest, status["containerStatuses"])  # its claims are prepared
        await self._patch_status(latest, {"status": status})

    async def _runs_for(self, uid: str, seconds: float | None) -> bool:
        """Until ``seconds`` passed (None: for good); False if the pod is ending (``_ending``)."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self._ending(uid):
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return True
            await self._pause(uid, left)
        return False

    async def _retry_init(self, uid: str, container: Obj, code: int) -> podstatus.InitRun | None:
        """An init container exited with ``code``: if it is not to be started again
        (``commands.should_restart``: under restartPolicy Never, say), the run with it
        failed; else, as the kubelet, it is started again, at once the first time, then
        after a back-off (``restart_delay``, ``back_off_syncs``; shown exited meanwhile),
        the pod Pending, until the pod is deleted (None). Its command ends alike each
        time, so it never gets further."""
        pod, name = self._pod(uid), container["name"]
        first_id = _container_ids(pod)[name]
        run = self._inits[uid]
        carried = run.carried.get(name) or podstatus.Restarted(0, first_id, {}, {})
        now = carried.started_again(carried.container_id, run.spans[-1][0])
        back_off: tuple[float, float] | None = None
        seconds = commands.init_seconds(container)
        while True:
            ended = podstatus.Ended.exit_status(code, now_rfc3339())
            exited = podstatus.terminated_state(now.container_id, now.state["running"]["startedAt"], ended)
            run = self._inits[uid] = run.failed(podstatus.Restarted(now.count, now.container_id, exited, now.last))
            if not commands.should_restart(pod, container, code):
                run = self._inits[uid] = run.ended(ended.at)
                return run
            exited_at = time.monotonic()
            delay, back_off = restart_delay(back_off, exited_at)
            # Shown exited by the sync that finds it so (started again at once, the kubelet's
            # write of it may be overtaken by the next: its status manager sends the latest).
            await self._write_initializing(uid)
            blocked, restart_at = back_off_syncs(delay, resync_s=self.sync_frequency_s)
            for synced, at in enumerate(blocked):
                if not await self._runs_for(uid, exited_at + at - time.monotonic()):
                    return None
                self.tell(pod, back_off_told(pod, name), name)
                if synced:  # the sync before was blocked too
                    run = await self._show_init_crash_loop(uid, name, delay)
            if not await self._runs_for(uid, exited_at + restart_at - time.monotonic()):
                return None
            if blocked:  # the sync that starts it shows first why the one before failed
                run = await self._show_init_crash_loop(uid, name, delay)
            self._tell_started(pod, container)
            count = now.count + 1
            now = podstatus.Restarted(count, f"{first_id}-{count}", {"running": {"startedAt": now_rfc3339()}}, exited)
            run = self._inits[uid] = run.failed(now)
            if seconds != 0:  # one that ends at once is gone before the next relist could show it running
                await self._write_initializing(uid)
            if not await self._runs_for(uid, seconds):
                return None

    async def _show_init_crash_loop(self, uid: str, name: str, delay: float) -> podstatus.InitRun:
        """The failing init container ``name`` shown waiting in CrashLoopBackOff, as for the
        pod's own containers (``_show_crash_loop``), if it does not show it yet."""
        run = self._inits[uid]
        failing = run.failing
        if failing is not None and "terminated" in failing.state:
            waiting = crash_loop_state(self._pod(uid), name, delay)
            run = self._inits[uid] = run.failed(
                podstatus.Restarted(failing.count, failing.container_id, waiting, failing.state)
            )
            await self._write_initializing(uid)
        return run

    async def _set_running(
        self,
        pod: Obj,
        env: Mapping[str, Mapping[str, str]],
        inits: podstatus.InitRun = podstatus.NO_INITS,
        probed: bool = True,
        pulls: Mapping[str, containerevents.Pull] | None = None,
    ) -> None:
        """``probed``: its containers just started, so their probes have yet to pass (a
        restarted kubelet finds them passed). ``pulls``: their images made sure of."""
        meta = pod["metadata"]
        # A restarted kubelet finds its pods running: their start time stays what it was.
        previous = pod.get("status", {})
        stamp = previous.get("startTime") if previous.get("phase") == "Running" else None
        stamp = stamp or now_rfc3339()
        addresses = self._addresses_of(pod)
        self._running[meta["uid"]] = stamp
        self._inits[meta["uid"]] = inits
        self._sandbox_made(meta["uid"])
        self._waiting.pop(meta["uid"], None)
        self._resync_schedule.add(meta["uid"], time.monotonic())
        self._resync_wake.set()

        early = self._started_early.pop(meta["uid"], {})
        if early:  # as they are since, the rest start now
            self._restarted[meta["uid"]] = {**early, **self._restarted.get(meta["uid"], {})}
        if probed:  # they start now (a restarted kubelet finds them running)
            for container in pod["spec"].get("containers", []):
                if container["name"] in early:
                    continue
                self._tell_started(pod, container, (pulls or {}).get(container["name"]))
                # The kubelet runs its postStart hook before it starts the next one, and
                # writes the pod Running once all have started.
                hook_s = commands.hook_seconds(container, "postStart")
                if hook_s and not await self._runs_for(meta["uid"], hook_s):
                    return
        probing, changes = probe_plan(pod) if probed else ({}, [])
        exited = self._exited_at_once(pod, stamp, besides=early) if probed else set()
        probing = {name: waits for name, waits in probing.items() if name not in exited}
        changes = [change for change in changes if change[1] not in exited]
        probing = self._probing[meta["uid"]] = {**self._probing.get(meta["uid"], {}), **probing}  # sidecars' kept
        restarted = self._restarted.get(meta["uid"])  # a restarted kubelet's, read from the status
        status = podstatus.running_status(pod, stamp, _container_ids(pod), now_rfc3339(), inits, restarted, probing)
        if exited and commands.run_seconds(pod) == 0:
            # All exited and none restarts: the kubelet keeps the phase it wrote before
            # until its pod worker has stopped the pod (then Succeeded or Failed).
            status["phase"] = "Pending"
        self._add_device_health(pod, status["containerStatuses"])
        status.update(startTime=_start_time(pod, stamp), **addresses)
        body: Obj = {"status": status}
        if any(env.values()):
            # The runtime's report rides in the one write that makes the pod Running, so
            # watchers see one change, as with a real kubelet, not an annotation and then
            # the status. pods/status keeps annotations, and NodeRestriction lets a node
            # change them there (labels only are refused).
            body["metadata"] = {"annotations": {CONTAINER_ENV_ANNOTATION: json.dumps(env, sort_keys=True)}}
        await self._patch_status(pod, body)
        for container in pod["spec"].get("containers", []):
            for exit_code in self._process_changes.pop((meta["namespace"], meta["name"], container["name"]), []):
                await self.process_changed(meta["namespace"], meta["name"], container["name"], exit_code)
        if changes:
            probed_ids = _container_ids(pod)
            self._in_background(self._follow_probes(meta["uid"], changes, probed_ids), f"pod-probes-{meta['uid']}")

    def _exited_at_once(self, pod: Obj, started: str, besides: Collection[str] = ()) -> set[str]:
        """The pod's containers whose command ends as it starts, noted exited (restart
        count 0): the kubelet's first status after their start comes from the PLEG relist
        after it, which finds them exited already, so they never show running (or ready).
        ``besides``: those started before (``_started_now`` noted them)."""
        uid = pod["metadata"]["uid"]
        restarted = self._restarted.setdefault(uid, {})
        exited = set()
        for container in pod["spec"].get("containers", []):
            name = container["name"]
            if name in besides:
                exited |= {name} if "terminated" in restarted[name].state else set()
            elif commands.exits_at_once(pod, container):
                restarted[name] = _started_now(pod, container, started)
                exited.add(name)
        return exited

    def _probe_again(self, uid: str, container: Obj, container_id: str) -> None:
        """A container started again is probed as a new one (the prober resets its result
        for a new container ID): unready, or not started, until its probes pass."""
        changes = self._probed_from_start(uid, container)
        if changes:
            probed = {container["name"]: container_id}
            self._in_background(self._follow_probes(uid, changes, probed), f"pod-probes-{container_id}")

    def _probed_from_start(self, uid: str, container: Obj) -> list[tuple[float, str, str | None]]:
        """A container starting now: what it waits for first noted in ``_probing``; the
        changes to come, in seconds from now (``probe_plan``)."""
        waiting, changes = probe_plan({"spec": {"containers": [container]}})
        probing = self._probing.setdefault(uid, {})
        probing.pop(container["name"], None)
        probing.update(waiting)
        return changes

    def _readiness_period(self, uid: str, container: Obj) -> float | None:
        """How often the container's readiness probe runs, if it passed (the container is
        ready by it); else None."""
        probe = container.get("readinessProbe")
        if probe is None or container["name"] in self._probing.get(uid, {}):
            return None
        return float(probe.get("periodSeconds") or 10)

    async def _follow_probes(
        self,
        uid: str,
        changes: list[tuple[float, str, str | None]],
        probed_ids: Mapping[str, str],
        started: float | None = None,
    ) -> None:
        """As the kubelet's prober passes a container's startup and readiness probes (their
        commands taken to succeed): each change written when it comes (``changes``' times
        count from ``started``, monotonic, else now), while the pod runs or initializes
        (a sidecar's) and the container is the one probed (``probed_ids``: not one
        started since)."""
        started = time.monotonic() if started is None else started
        for after, name, waits_for in changes:
            await asyncio.sleep(max(0.0, started + after - time.monotonic()))
            probing = self._probing.get(uid)
            running = uid in self._running
            if probing is None or not (running or uid in self._initializing) or self._ending(uid):
                return
            again = self._restarted.get(uid, {}).get(name)
            if again is not None and again.container_id != probed_ids[name]:
                continue  # it exited since; the one started after it has probes of its own
            if waits_for is None:
                probing.pop(name, None)
            else:
                probing[name] = waits_for
            await (self._write_running(uid) if running else self._write_initializing(uid))

    async def _set_waiting(
        self, pod: Obj, refused: Mapping[str, tuple[str, str]] | None = None, inits: podstatus.InitRun | None = None
    ) -> None:
        """Pending with its containers ContainerCreating, as the kubelet shows a pod whose
        sandbox it could not make yet, or with those that ``refused`` names waiting for
        that reason and message (CreateContainerError in the runtime's words, or its image
        not pulled): written when that changes. ``inits``: its init containers ran."""
        uid = pod["metadata"]["uid"]
        if uid in self._waiting and self._waiting[uid] == refused:
            return  # a container starts early only as its wait ends (``_pull_images``): shown
        early = self._started_early.get(uid, {})
        probing = probe_plan({"spec": {"containers": [c for c in pod["spec"]["containers"] if c["name"] in early]}})[0]
        if inits is not None and inits.spans:
            addresses = self._addresses_of(pod)
            ids, now = _container_ids(pod), now_rfc3339()
            status = podstatus.initializing_status(
                pod, _start_time(pod), ids, inits, addresses, now, probing, waits=refused, started_early=early
            )
        else:
            failed = None
            if refused is not None:  # the sandbox exists, with its IP
                try:
                    pod_ip = self._sandbox_ip(pod)
                except StartFailed:  # none left: the node's, as without a CIDR
                    pod_ip = self.node.internal_ip()
                failed = podstatus.CreateFailed(pod_ip, dict(refused))
            status = podstatus.waiting_status(pod, self.node.internal_ip(), now_rfc3339(), failed, early, probing)
        try:
            await self._patch_status(pod, {"status": status})
        except ApiError as exc:
            if exc.not_found:
                raise
            log.debug("pod %s: status update failed: %s", pod["metadata"]["name"], exc)
            return
        self._waiting[uid] = dict(refused) if refused is not None else None

    async def _restart_exited(self, uid: str) -> str | None:
        """As the kubelet restarts the containers of a pod that does not end of itself
        (``commands.run_seconds`` None): a container whose command ends exits and, under
        restartPolicy Always or when it failed under OnFailure, is started again, at once
        the first time, then after a back-off (``restart_delay``), by the first of the
        pod worker's syncs (``back_off_syncs``: at the next relist, then at the back-off's
        end) that finds it over: shown exited, then CrashLoopBackOff once a sync was
        blocked (each blocked sync tells BackOff; the one that starts it again shows
        CrashLoopBackOff for a moment), the pod Running throughout with that container not ready
        meanwhile, its claims left prepared (a container restart is no concern of the
        drivers'); one that completed under OnFailure stays so. A container (or sidecar)
        whose image changed is started again with the new one at once (``_redefined``).
        Returns the name of one whose exit restarts all of the pod's containers
        (``_restart_in_place``), or None once the pod is ending (``_ending``)."""
        pod = self._pod(uid)
        periods = {
            c["name"]: seconds
            for c in pod["spec"].get("containers", [])
            if (seconds := commands.restart_seconds(pod, c)) is not None
        }
        ids, restarted = _container_ids(pod), self._restarted.setdefault(uid, {})
        for container in pod["spec"].get("containers", []):  # exited for good before this kubelet restarted
            again = restarted.get(container["name"])
            if again is not None and "terminated" in again.state and not commands.restarts(pod, container):
                periods.pop(container["name"], None)
        due = {name: time.monotonic() + seconds for name, seconds in periods.items()}
        back_off: dict[str, tuple[float, float]] = {}
        for name in periods:  # shown exited at their first start (``_exited_at_once``): their restart at once is now
            if (again := restarted.get(name)) is not None and again.count == 0 and "terminated" in again.state:
                _, back_off[name] = restart_delay(None, time.monotonic())
        backed_off: dict[str, _BackingOff] = {}
        """Containers that exited, until started again."""
        while not self._ending(uid):
            seen = self._changes.get(uid, 0)
            for container in self._redefined(uid, backed_off):
                if not await self._start_redefined(uid, container):
                    return None
                name = container["name"]
                # Its back-off was the old image's: the new one's starts now, as for a first start.
                _, back_off[name] = restart_delay(None, time.monotonic())
                backed_off.pop(name, None)
                if name in periods:
                    due[name] = time.monotonic() + periods[name]
            if not due:
                await self._pause(uid, 3600, seen)
                continue
            name = min(due, key=due.__getitem__)
            if (left := due[name] - time.monotonic()) > 0:
                await self._pause(uid, left, seen)
                continue
            pod, again = self._pod(uid), restarted.get(name)
            if again is None:  # the first container of that name
                running = {"running": {"startedAt": self._running[uid]}}
                again = restarted[name] = podstatus.Restarted(0, ids[name], running, {})
            if "running" in again.state:  # it exits now, its command done
                container = next(c for c in pod["spec"]["containers"] if c["name"] == name)
                ended = podstatus.Ended.exit_status(commands.exit_code(container), now_rfc3339())
                exited = podstatus.terminated_state(again.container_id, again.state["running"]["startedAt"], ended)
                restarted[name] = podstatus.Restarted(again.count, again.container_id, exited, again.last)
                if commands.restarts_all(container, commands.exit_code(container)):
                    return str(name)
                if not commands.restarts(pod, container):
                    del periods[name], due[name]
                    await self._write_running(uid)
                    continue
                exited_at = time.monotonic()
                delay, back_off[name] = restart_delay(back_off.get(name), exited_at)
                # Shown exited by the sync that finds it so, whether or not it starts it again.
                await self._write_running(uid)
                probed_every = self._readiness_period(uid, container)
                blocked, restart_at = back_off_syncs(delay, probed_every, self.sync_frequency_s)
                backed_off[name] = _BackingOff(delay, [exited_at + at for at in blocked], exited_at + restart_at)
                due[name] = backed_off[name].next_sync()
                continue
            plan: _BackingOff | None = backed_off.pop(name, None)  # None: found so by a restarted kubelet
            if plan is not None and plan.blocked:  # a sync its back-off blocks
                plan.blocked.pop(0)
                await self._blocked_sync(uid, name, plan)
                backed_off[name] = plan
                due[name] = plan.next_sync()
                continue
            if plan is not None:
                await self._show_crash_loop(uid, name, plan)
            count = again.count + 1
            container = next(c for c in pod["spec"]["containers"] if c["name"] == name)
            self._tell_started(pod, container)
            running = {"running": {"startedAt": now_rfc3339()}}
            before = again.last if "waiting" in again.state else again.state
            restarted[name] = podstatus.Restarted(count, f"{ids[name]}-{count}", running, before)
            self._probe_again(uid, container, restarted[name].container_id)
            if periods[name]:  # one that exits at once is gone before the next relist could show it running
                await self._write_running(uid)
            due[name] = time.monotonic() + periods[name]
        return None

    def _redefined(self, uid: str, to_start: Collection[str]) -> list[Obj]:
        """The containers running (the pod's own and its sidecars) or to be started again
        (``to_start``) whose spec names an image other than the one they were made with:
        as the kubelet compares a container's hash (its name and image) with the spec's."""
        pod, ran = self._pod(uid), self._ran_images.get(uid, {})
        running = self._running_containers(uid)
        ephemeral = pod["spec"].get("ephemeralContainers") or []
        candidates = [c for c in running if c not in ephemeral]
        candidates += [c for c in pod["spec"].get("containers", []) if c["name"] in to_start and c not in running]
        return [
            c
            for c in candidates
            if c["name"] in ran
            and podstatus.image_reference(ran[c["name"]]) != podstatus.image_reference(c.get("image", ""))
        ]

    async def _start_redefined(self, uid: str, container: Obj) -> bool:
        """As kubelet v1.37 handles a container whose image changed: one running is killed
        (Killing "Container X definition changed, will be restarted", or "Init container
        X definition changed" for a sidecar; its preStop hook run, cut short at the grace
        period) and, whatever the restart policy, started again at once with the new
        image, counted once more, the one before shown stopped; one waiting out a back-off
        is started at once (its back-off was the old image's). The pod's status written;
        its claims stay prepared. False if the pod is ending first."""
        pod, name = self._pod(uid), container["name"]
        index = next((i for i, c in enumerate(pod["spec"].get("initContainers") or []) if c["name"] == name), None)
        running = any(c["name"] == name for c in self._running_containers(uid))
        if running:
            words = f"Init container {name} definition changed" if index is not None else None
            words = words or f"Container {name} definition changed, will be restarted"
            self.tell(pod, Told("Normal", "Killing", words), name)
            hook_s = commands.pre_stop_seconds([container], commands.grace_seconds(pod))
            if hook_s and not await self._runs_for(uid, hook_s):
                return False
        pod, first_id, now = self._pod(uid), _container_ids(pod)[name], now_rfc3339()
        if index is not None:  # a sidecar: it runs in the init containers' run
            run = self._inits[uid]
            before = run.carried.get(name) or podstatus.Restarted(0, first_id, {}, {})
            stopped = podstatus.terminated_state(before.container_id, run.spans[index][0], podstatus.Ended.stopped(now))
            again = podstatus.Restarted(before.count + 1, f"{first_id}-{before.count + 1}", {}, stopped)
            self._inits[uid] = run.started_again(index, name, again, now)
        else:
            restarted = self._restarted.setdefault(uid, {})
            before = restarted.get(name) or podstatus.Restarted(
                0, first_id, {"running": {"startedAt": self._running[uid]}}, {}
            )
            if running:
                began = before.state["running"]["startedAt"]
                ended = podstatus.terminated_state(before.container_id, began, podstatus.Ended.stopped(now))
            else:
                ended = before.state if "terminated" in before.state else before.last
            count = before.count + 1
            again = podstatus.Restarted(count, f"{first_id}-{count}", {"running": {"startedAt": now}}, ended)
            restarted[name] = again
        self._tell_started(pod, container)
        self._probe_again(uid, container, again.container_id)
        if (ends := commands.ending(container)) is None or ends.seconds:  # else gone before the next relist
            await self._write_running(uid)
        return not self._ending(uid)

    async def _restart_in_place(self, uid: str, source: str) -> bool:
        """Container ``source`` exited as a RestartAllContainers rule of its says: as
        kubelet v1.37 (RestartAllContainersOnContainerExits, beta and on), the pod shown
        AllContainersRestarting, every container that runs killed at once (Killing
        "killing": no preStop hook, no grace; the pod's own, then its sidecars), all
        removed and shown waiting, each counted once more (``podstatus.restarting_status``);
        then its init containers run again and its own start, with no back-off. Its
        sandbox, IP and prepared claims stay: no driver is called. False if the pod is
        ending first, or an init container fails it now."""
        if not await self._runs_for(uid, until_next_relist()):  # the exit, as the PLEG sees it
            return False
        await self._write_running(uid)  # the source shown exited: AllContainersRestarting
        pod, restarted = self._pod(uid), self._restarted.setdefault(uid, {})
        before = podstatus.running_status(
            pod, self._running[uid], _container_ids(pod), now_rfc3339(), self._inits[uid], restarted
        )
        status = await self._remove_all(uid, before)
        # The pod's own are to start again, each under a container ID of its own.
        for container in pod["spec"].get("containers", []):
            restarted[container["name"]] = podstatus.Restarted.shown(status, container["name"])
        carried = self._inits[uid].carried
        ran = await self._initialize(self._pod(uid), carried)
        if ran is None:
            return False  # deleted meanwhile
        if ran.failing is not None:
            await self._fail_initializing(uid)
            return False
        pod = self._pod(uid)
        for container in pod["spec"].get("containers", []):
            self._tell_started(pod, container)
            hook_s = commands.hook_seconds(container, "postStart")
            if hook_s and not await self._runs_for(uid, hook_s):
                return False
            now, ids = restarted[container["name"]], _container_ids(pod)
            restarted[container["name"]] = now.started_again(f"{ids[container['name']]}-{now.count}", now_rfc3339())
            self._probe_again(uid, container, restarted[container["name"]].container_id)
        await self._write_running(uid)
        return not self._ending(uid)

    async def _remove_all(self, uid: str, before: Obj) -> Obj:
        """Restarting the pod in place, as the kubelet: its running containers killed at
        once (the pod's own, then its sidecars), and all removed; the status that shows
        them so, worked out from the one written ``before``, written and returned. Its
        init containers are to run again (``InitRun.carried``), each under a container ID
        of its own."""
        pod = self._pod(uid)
        running = self._running_containers(uid)  # ephemeral ones, not the pod's, run on
        mains = [c for c in running if c in pod["spec"].get("containers", [])]
        inits = [c for c in running if c in (pod["spec"].get("initContainers") or [])]
        for container in [*mains, *reversed(inits)]:
            self.tell(pod, containerevents.removed_in_place(container), container["name"])
        status = podstatus.restarting_status(pod, before, now_rfc3339())
        self._add_device_health(pod, status["containerStatuses"])
        ids, carried = _container_ids(pod), {}
        for shown in status.get("initContainerStatuses") or []:
            name, count = shown["name"], shown["restartCount"]
            carried[name] = podstatus.Restarted(
                count, f"{ids[name]}-{count}" if count else ids[name], {}, shown["lastState"]
            )
        self._inits[uid] = podstatus.InitRun(carried=carried)
        await self._patch_status(pod, {"status": status})
        return status

    async def _blocked_sync(self, uid: str, name: str, plan: _BackingOff) -> None:
        """A pod worker's sync that finds container ``name`` still backing off: BackOff
        told, and CrashLoopBackOff shown if a sync before was blocked too."""
        self.tell(self._pod(uid), back_off_told(self._pod(uid), name), name)
        await self._show_crash_loop(uid, name, plan)
        plan.synced = True

    async def _show_crash_loop(self, uid: str, name: str, plan: _BackingOff) -> None:
        """Container ``name`` shown waiting in CrashLoopBackOff once a sync was blocked by
        its back-off: the kubelet writes a pod's status at the start of each sync, with
        the reason the sync before failed for, so the sync that starts it again shows it
        too, for a moment (written only if the container does not show it yet)."""
        restarted = self._restarted[uid]
        again = restarted[name]
        if plan.synced and "terminated" in again.state:
            waiting = crash_loop_state(self._pod(uid), name, plan.delay)
            restarted[name] = podstatus.Restarted(again.count, again.container_id, waiting, again.state)
            await self._write_running(uid)

    async def _write_running(self, uid: str) -> None:
        """The status of a Running pod whose containers changed since it started."""
        pod, started = self._pod(uid), self._running[uid]
        restarted, inits = self._restarted.get(uid), self._inits.get(uid, podstatus.NO_INITS)
        status = podstatus.running_status(
            pod, started, _container_ids(pod), now_rfc3339(), inits, restarted, self._probing.get(uid)
        )
        self._add_device_health(pod, status["containerStatuses"])
        status["startTime"] = _start_time(pod, started)
        await self._patch_status(pod, {"status": status})

    def _addresses_of(self, pod: Obj) -> Obj:
        """The host's and the pod's addresses, as its status shows them."""
        host, pod_ip = self.node.internal_ip(), self._sandbox_ip(pod)
        return {"hostIP": host, "hostIPs": [{"ip": host}], "podIP": pod_ip, "podIPs": [{"ip": pod_ip}]}

    def _sandbox_ip(self, pod: Obj) -> str:
        """The node's IP for a pod on the host's network, else its own (``_pod_ip``)."""
        return self.node.internal_ip() if pod["spec"].get("hostNetwork") else self._pod_ip(pod)

    def _pod_ip(self, pod: Obj) -> str:
        """From the Node's pod CIDR (the node's IP without one); a pod running when this
        kubelet started (its sandbox outlived a restart) keeps the IP it had."""
        kept = pod["status"]["podIP"] if _running_with_own_ip(pod) else None
        try:
            address = self._addresses.address(pod["metadata"]["uid"], self.pod_cidr(), kept)
        except AddressesExhausted as exc:
            raise StartFailed(SANDBOX_FAILED, f"Failed to create pod sandbox: setting up its network: {exc}") from None
        return address or self.node.internal_ip()

    async def _patch_status(self, pod: Obj, body: Obj) -> None:
        """Through the status writer (statuswriter.py): raises ApiError 404 if the pod is
        gone or was replaced; what the API server cannot take now is written later. Each
        container made is shown with the image it was made with, as the runtime reports
        it, whatever the spec says now (a container not restarted for its new image: one
        that completed, or one stopping to be restarted)."""
        status, ran = body.get("status", {}), self._ran_images.get(pod["metadata"]["uid"], {})
        for shown in [*status.get("containerStatuses", []), *status.get("initContainerStatuses", [])]:
            image = ran.get(shown["name"])
            if image is not None and shown.get("containerID"):
                reference = podstatus.image_reference(image)
                shown.update(image=reference, imageID=podstatus.image_id(reference))
        await self._statuses.patch(pod, body)

    def _running_container_statuses(self, pod: Obj, stamp: str) -> list[Obj]:
        uid = pod["metadata"]["uid"]
        restarted, probing = self._restarted.get(uid), self._probing.get(uid)
        statuses = podstatus.running_containers(pod, stamp, _container_ids(pod), restarted, probing)
        self._add_device_health(pod, statuses)
        return statuses

    def _add_device_health(self, pod: Obj, statuses: list[Obj]) -> None:
        """Each container's ``allocatedResourcesStatus``, noted to write only changes."""
        uid = pod["metadata"]["uid"]
        containers = {c["name"]: c for c in pod["spec"].get("containers", [])}
        for status in statuses:
            resources = self._allocated_resources_status(uid, containers[status["name"]])
            if resources:
                status["allocatedResourcesStatus"] = resources
        self._resources_status[uid] = [s.get("allocatedResourcesStatus") for s in statuses]

    def _allocated_resources_status(self, pod_uid: str, container: Obj) -> list[Obj]:
        """As the kubelet builds it (dra Manager.UpdateAllocatedResourcesStatus): one entry
        per claim reference of the container, named ``claim:<name>[/<request>]``, with the
        health of each device of that request, identified by its first CDI ID."""
        claim_uids = self._claim_uids.get(pod_uid, {})
        now = time.monotonic()
        result = []
        for ref in container.get("resources", {}).get("claims", []):
            prepared = self.claims.get(claim_uids.get(ref["name"], ""))
            if prepared is None:
                continue
            request = ref.get("request") or ""
            base = request.split("/", 1)[0]
            resources: list[Obj] = []
            seen = set()
            for device in prepared.devices:
                if request and device.request_names and base not in device.request_names:
                    continue
                resource_id = (
                    device.cdi_device_ids[0]
                    if device.cdi_device_ids
                    else f"{device.driver}/{device.pool}/{device.device}"
                )
                if resource_id in seen:
                    continue
                seen.add(resource_id)
                health, message = self.plugins.health.get(device.driver, device.pool, device.device, now)
                entry: Obj = {"resourceID": resource_id, "health": health.value}
                if message:
                    entry["message"] = message
                resources.append(entry)
            if resources:
                name = f"claim:{ref['name']}" + (f"/{request}" if request else "")
                result.append({"name": name, "resources": resources})
        return result

    def _follow_readiness_gates(self, pod: Obj) -> None:
        """A running pod's gate conditions changed (someone else writes them): Ready
        follows at once, as the kubelet's status manager makes it."""
        if pod.get("status", {}).get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            return
        update = podstatus.readiness_update(pod, now_rfc3339())
        if update is not None:
            self._in_background(self._patch_status(pod, {"status": update}), f"pod-ready-{pod['metadata']['uid']}")

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        async def logged() -> None:
            try:
                await work
            except ApiError as exc:
                log.debug("%s on %s: %s", name, self.node.name, exc)

        task = asyncio.create_task(logged(), name=name)
        self._status_tasks.add(task)
        task.add_done_callback(self._status_tasks.discard)

    def health_changed(self, driver: str, devices: list[tuple[str, str]]) -> None:
        """A driver's health stream changed these (pool, device): resync the pods using them."""
        changed = set(devices)
        for uid in list(self._running):
            claim_uids = self._claim_uids.get(uid, {}).values()
            if any(
                d.driver == driver and (d.pool, d.device) in changed
                for claim_uid in claim_uids
                if (claim := self.claims.get(claim_uid)) is not None
                for d in claim.devices
            ):
                self._in_background(self._sync_status(uid), f"pod-status-{uid}")

    async def _resync(self) -> None:
        """Sync each running pod again 60-90 s after its last sync (resync.py)."""
        while True:
            next_at = self._resync_schedule.next_at()
            self._resync_wake.clear()
            with contextlib.suppress(TimeoutError):
                wait_s = None if next_at is None else max(0.0, next_at - time.monotonic())
                await asyncio.wait_for(self._resync_wake.wait(), wait_s)
            for uid in self._resync_schedule.due(time.monotonic()):
                if uid not in self._running:
                    continue
                if self._claim_uids.get(uid):
                    await self._sync_status(uid)
                if uid in self._running:
                    self._resync_schedule.add(uid, time.monotonic())

    def _sync_spec(self, uid: str) -> None:
        """Sync the pod's spec change (``_observe_generation``) now, or once more when
        the sync under way is done."""
        if uid in self._generation_syncs:
            self._generation_syncs[uid] = True
        else:
            self._generation_syncs[uid] = False
            self._in_background(self._observe_generation(uid), f"pod-generation-{uid}")

    def _sandbox_made(self, uid: str) -> None:
        """The pod's sandbox exists now (its init containers or its own start): ephemeral
        containers added before are started, as the kubelet's next sync starts them."""
        pod, started = self._latest.get(uid), self._ephemeral.get(uid, {})
        if pod is not None and any(c["name"] not in started for c in pod["spec"].get("ephemeralContainers") or []):
            self._sync_spec(uid)

    async def _observe_generation(self, uid: str) -> None:
        """The pod's spec changed: as the kubelet's next sync, its status says it observed
        that generation, and an ephemeral container added to a running pod is started
        (its Events as any container's) and shown running, never ready; it runs as its
        command says, is never started again, and stops with the pod. One sync at a time
        per pod, as its pod worker makes them, each from the pod as last seen."""
        try:
            while True:
                await self._sync_generation(uid)
                if not self._generation_syncs.get(uid):
                    return
                self._generation_syncs[uid] = False
        finally:
            self._generation_syncs.pop(uid, None)

    async def _sync_generation(self, uid: str) -> None:
        pod = self._latest.get(uid)
        if pod is None or self._ending(uid):
            return
        status = podstatus.generation_update(pod)
        started = self._ephemeral.setdefault(uid, {})
        new = []
        if uid in self._running or uid in self._initializing:  # its sandbox exists
            new = [c for c in pod["spec"].get("ephemeralContainers") or [] if c["name"] not in started]
        if started or new:  # the sync's status: the new ones not made yet
            waiting = podstatus.POD_INITIALIZING if uid in self._initializing else podstatus.CONTAINER_CREATING
            status["ephemeralContainerStatuses"] = self._ephemeral_statuses(pod, unmade=new, waiting=waiting)
        with contextlib.suppress(ApiError):
            await self._patch_status(pod, {"status": status})
        if not new:
            return
        for container in new:
            self._tell_started(pod, container)
            started[container["name"]] = {"running": {"startedAt": now_rfc3339()}}
            if (ends := commands.ending(container)) is not None:
                self._in_background(self._end_ephemeral(uid, container, ends), f"pod-debug-{uid}")
        with contextlib.suppress(ApiError):  # as the relist after sees them
            await self._patch_status(pod, {"status": {"ephemeralContainerStatuses": self._ephemeral_statuses(pod)}})

    async def _end_ephemeral(self, uid: str, container: Obj, ends: commands.Ending) -> None:
        if not await self._runs_for(uid, ends.seconds):
            return
        started, pod = self._ephemeral[uid], self._pod(uid)
        ended = podstatus.Ended.exit_status(ends.exit_code, now_rfc3339())
        began = started[container["name"]]["running"]["startedAt"]
        started[container["name"]] = podstatus.terminated_state(_ephemeral_id(pod, container), began, ended)
        with contextlib.suppress(ApiError):
            await self._patch_status(pod, {"status": {"ephemeralContainerStatuses": self._ephemeral_statuses(pod)}})

    def _ephemeral_statuses(
        self, pod: Obj, stopped_at: str | None = None, unmade: Iterable[Obj] = (), waiting: str = ""
    ) -> list[Obj]:
        """The statuses of the pod's ephemeral containers started so far, and those
        ``unmade`` yet (``waiting`` for that reason), by name as the kubelet lists them;
        with ``stopped_at``, those running stopped then (the pod ended)."""
        started = self._ephemeral.get(pod["metadata"]["uid"], {})
        statuses = [podstatus.ephemeral_status(c, "", {"waiting": {"reason": waiting}}) for c in unmade]
        for container in pod["spec"].get("ephemeralContainers") or []:
            state = started.get(container["name"])
            if state is None:
                continue
            container_id = _ephemeral_id(pod, container)
            if stopped_at is not None and "running" in state:
                state = podstatus.terminated_state(
                    container_id, state["running"]["startedAt"], podstatus.Ended.stopped(stopped_at)
                )
            statuses.append(podstatus.ephemeral_status(container, container_id, state))
        return sorted(statuses, key=lambda status: str(status["name"]))

    async def _sync_status(self, uid: str) -> None:
        """Write the running pod's container statuses again if their device health changed."""
        pod, stamp = self._latest.get(uid), self._running.get(uid)
        if pod is None or stamp is None or self._ending(uid):
            return
        before = self._resources_status.get(uid)
        statuses = self._running_container_statuses(pod, stamp)
        if self._resources_status.get(uid) == before:
            return
        meta = pod["metadata"]
        try:
            await self._patch_status(pod, {"status": {"containerStatuses": statuses}})
        except ApiError as exc:
            self._resources_status.pop(uid, None)  # try again at the next sync
            log.debug("pod %s: status update failed: %s", meta["name"], exc)

    async def _set_ended(self, uid: str, started: str, ended: podstatus.Ended) -> None:
        pod = self._pod(uid)
        inits, restarted = self._inits.get(uid, podstatus.NO_INITS), self._restarted.get(uid)
        status = podstatus.ended_status(pod, started, _container_ids(pod), ended, inits, restarted)
        if self._ephemeral.get(uid):
            status["ephemeralContainerStatuses"] = self._ephemeral_statuses(pod, ended.at)
        await self._patch_status(pod, {"status": status})

    async def _release(self, pod_uid: str) -> None:
        """Unprepare the claims this pod was the last user of, once the pod's containers
        stopped (the kubelet's terminated-pod sync); tried again after the kubelet's
        sync-error backoff until the driver succeeds (the pod is not finished before),
        sooner if the pod changes. A pod whose termination was synced is not again when
        it is deleted later, as in the kubelet."""
        if pod_uid in self._terminated:
            return
        retry_in = until_next_relist()  # the containers' exit, seen at the next relist, syncs the pod once more
        while True:
            seen = self._changes.get(pod_uid, 0)
            if await self._release_once(pod_uid):
                break
            await self._pause(pod_uid, retry_in, seen)
            retry_in = jittered(SYNC_ERROR_BACKOFF_S)
        self._claim_uids.pop(pod_uid, None)
        self._terminated.add(pod_uid)

    async def _release_once(self, pod_uid: str) -> bool:
        """True once nothing is left to unprepare for this pod. As the kubelet: a claim
        other pods still use only loses this user; a claim this pod was the last user of
        keeps it as its user until every driver unprepared it, and is then forgotten.
        Every attempt is timed as the kubelet's UnprepareResources, for every pod (those
        without claims, or sharing them, too)."""
        started = time.perf_counter()
        done = False
        try:
            last: list[PreparedClaim] = []
            changed = False
            for claim in self.claims.values():
                if pod_uid in claim.users:
                    changed = True
                    if len(claim.users) > 1:
                        claim.users.discard(pod_uid)
                    else:
                        last.append(claim)
            done = await self._unprepare(last)
            if changed or self._checkpoint_behind:
                try:
                    self._save_checkpoint()
                except OSError as exc:  # as the kubelet: this attempt failed, the next writes it
                    log.warning("unprepare on %s: checkpoint ResourceClaim state: %s", self.node.name, exc)
                    done = False
        finally:
            metrics.OPERATIONS.labels("UnprepareResources", str(not done).lower()).observe(
                time.perf_counter() - started
            )
        return done

    async def _unprepare(self, claims: list[PreparedClaim]) -> bool:
        """Ask each driver to unprepare these claims; False if one failed: the attempt ends
        there, as in the kubelet, and is made again later. They are marked as being
        unprepared before the first call, so no new pod may use them until then."""
        if not claims:
            return True
        failed = False
        for claim in claims:
            claim.unpreparing = True
            for driver in [d for d in claim.drivers if not claim.calls(d, skips.UNPREPARE)]:
                metrics.UNPREPARE_SKIPS.labels(driver).inc()
                claim.drivers.remove(driver)
        for driver in sorted({d for c in claims for d in c.drivers}):
            mine = [c for c in claims if driver in c.drivers]
            try:
                await self.plugins.unprepare(driver, [c.ref for c in mine])
            except PluginCallError as exc:
                failed = True
                log.warning("unprepare on %s failed, will retry: %s", self.node.name, exc)
                break
            for claim in mine:
                claim.drivers = [d for d in claim.drivers if d != driver]
        for claim in claims:
            if not claim.drivers:
                self.claims.pop(claim.uid, None)
        return not failed

    def active_uids(self) -> set[str]:
        """Pods this kubelet still runs or is still stopping (the kubelet's active pods)."""
        return set(self._workers) | {
            uid
            for uid, pod in self._latest.items()
            if not pod.get("_deleted") and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        }

    def active_pods(self) -> list[Obj]:
        return [self._latest[uid] for uid in sorted(self.active_uids()) if uid in self._latest]

    def known_pod(self, namespace: str, name: str) -> Obj | None:
        """A pod bound here that is still in the API, by name."""
        return next(
            (
                pod
                for pod in self._latest.values()
                if not pod.get("_deleted")
                and pod["metadata"]["name"] == name
                and pod["metadata"]["namespace"] == namespace
            ),
            None,
        )

    async def process_changed(self, namespace: str, name: str, container: str, exit_code: int | None) -> None:
        """A container whose process runs beside this kubelet (a node's command-line
        driver, for its driver pod) exited with ``exit_code``, or was started again (None):
        shown in the pod's status as the kubelet shows its own containers' (terminated,
        then running with restartCount one up and the exit as lastState, with the Events
        of a start). Kept until the pod runs here, if it does not yet."""
        pod = self.known_pod(namespace, name)
        uid = "" if pod is None else pod["metadata"]["uid"]
        if pod is None or uid not in self._running:
            self._process_changes.setdefault((namespace, name, container), []).append(exit_code)
            return
        if self._ending(uid):
            return
        spec = next((c for c in pod["spec"].get("containers", []) if c["name"] == container), None)
        if spec is None:
            return
        restarted = self._restarted.setdefault(uid, {})
        now = restarted.get(container)
        if now is None:
            running = {"running": {"startedAt": self._running[uid]}}
            now = podstatus.Restarted(0, _container_ids(pod)[container], running, {})
        if exit_code is not None:
            if "running" not in now.state:
                return
            ended = podstatus.Ended.exit_status(exit_code, now_rfc3339())
            exited = podstatus.terminated_state(now.container_id, now.state["running"]["startedAt"], ended)
            restarted[container] = podstatus.Restarted(now.count, now.container_id, exited, now.last)
        else:
            if "running" in now.state:
                return
            count = now.count + 1
            running = {"running": {"startedAt": now_rfc3339()}}
            container_id = f"{_container_ids(pod)[container]}-{count}"
            before = now.last if "waiting" in now.state else now.state
            restarted[container] = podstatus.Restarted(count, container_id, running, before)
            self._tell_started(pod, spec)
        await self._write_running(uid)

    async def process_restart(self, namespace: str, name: str, container: str) -> None:
        """After process_changed told an exit: until this kubelet starts that container
        again, as it does its own (``_restart_exited``): at once the first time, then
        after its back-off, telling BackOff at each sync that back-off blocks and showing
        CrashLoopBackOff once one was blocked. For a pod not running here (yet), the
        back-off alone."""
        key, exited_at = (namespace, name, container), time.monotonic()
        delay, self._process_back_off[key] = restart_delay(self._process_back_off.get(key), exited_at)
        pod = self.known_pod(namespace, name)
        uid = "" if pod is None else pod["metadata"]["uid"]
        if pod is None or uid not in self._running or container not in self._restarted.get(uid, {}):
            await asyncio.sleep(delay)
            return
        blocked, restart_at = back_off_syncs(delay, resync_s=self.sync_frequency_s)
        plan = _BackingOff(delay, [exited_at + at for at in blocked], exited_at + restart_at)
        while plan.blocked:
            await asyncio.sleep(max(0.0, plan.blocked.pop(0) - time.monotonic()))
            if self._ending(uid):
                return
            await self._blocked_sync(uid, container, plan)
        await asyncio.sleep(max(0.0, plan.restart_at - time.monotonic()))
        if not self._ending(uid):
            await self._show_crash_loop(uid, container, plan)

    def prepared_drivers(self) -> list[list[str]]:
        """For each claim prepared here, the drivers it uses (for dra_resource_claims_in_use)."""
        return [c.drivers for c in self.claims.values() if c.prepared]

    def claim_named(self, namespace: str, name: str) -> PreparedClaim | None:
        """The claim this kubelet holds under that name (as the kubelet keys them)."""
        return next((c for c in self.claims.values() if c.name == name and c.namespace == namespace), None)

    async def _reconcile(self) -> None:
        """As the kubelet's DRA manager every RECONCILE_S, once its pod source synced:
        claims held only by pods that are gone (deleted while this kubelet was down, say,
        or force-deleted) are unprepared, and such pods stop counting as users of claims
        that live pods still use."""
        while True:
            await asyncio.sleep(RECONCILE_S)
            if self._pods_listed():
                await self.reconcile_once(self.active_uids())

    async def reconcile_once(self, active: set[str]) -> None:
        """``active``: the pods still running or stopping here."""
        # (no users at all: a claim recorded so by a fake kubelet before 2026-11-23)
        stale = [c for c in self.claims.values() if c.users - active or not c.users]
        for claim in stale:
            if claim.users & active:
                claim.users &= active
        if stale or self._checkpoint_behind:
            await self._unprepare([c for c in stale if not c.users & active])
            try:
                self._save_checkpoint()
            except OSError as exc:  # the next reconcile writes it
                log.warning("reconcile on %s: checkpoint ResourceClaim state: %s", self.node.name, exc)

    def _pods_listed(self) -> bool:
        """Whether the pods bound here are all known: before, every pod looks gone. Fed
        by someone else's watch, it cannot tell, and claims are left alone."""
        return self.watch_pods and bool(self._position.resource_version)

    async def _stop_containers(self, uid: str) -> None:
        """Stop each container that runs now, telling of it: the pod's own (unless they
        completed), then its init containers still running (sidecars, stopped last); after
        their preStop hooks, as the kubelet runs them (a sleep action takes its time, cut
        short at the grace period), unless the pod is gone from the API meanwhile."""
        pod = self._pod(uid)
        running = self._running_containers(uid)
        about = pod
        if uid in self._rejected:
            # Refused after its containers ran through a restart: the kubelet stops them as
            # the runtime lists them, so its Events name the pod without a resourceVersion.
            meta = {k: v for k, v in pod["metadata"].items() if k != "resourceVersion"}
            about = {**pod, "metadata": meta}
        for container in running:
            self.tell(about, containerevents.stopping(container), container["name"])
        deadline = time.monotonic() + commands.pre_stop_seconds(running, commands.grace_seconds(pod))
        while (left := deadline - time.monotonic()) > 0 and not self._pod(uid).get("_deleted"):
            await self._pause(uid, left)

    def _running_containers(self, uid: str) -> list[Obj]:
        pod, restarted = self._pod(uid), self._restarted.get(uid, {})
        spec = pod["spec"]
        running = []
        if uid in self._running:
            running = [
                c
                for c in spec.get("containers", [])
                if c["name"] not in restarted or "running" in restarted[c["name"]].state
            ]
        elif early := self._started_early.get(uid):
            running = [
                c for c in spec.get("containers", []) if c["name"] in early and "running" in early[c["name"]].state
            ]
        ephemeral = self._ephemeral.get(
            uid, {}
        )  # started once its sandbox was there, before its init containers ended maybe
        running += [c for c in spec.get("ephemeralContainers") or [] if "running" in ephemeral.get(c["name"], {})]
        run = self._inits.get(uid, podstatus.NO_INITS)  # those started so far
        inits = enumerate((spec.get("initContainers") or [])[: len(run.spans)])
        running += reversed([c for index, c in inits if run.runs(index)])
        return running

    def _not_running(self, uid: str) -> str:
        """Its containers and sandbox are gone (its status keeps the IP it had); when they
        had started ("" if they never ran)."""
        started = self._running.pop(uid, "")
        self._addresses.release(uid)
        self._resync_schedule.remove(uid)
        return started

    async def _exceed_deadline(self, uid: str) -> None:
        """Past its activeDeadlineSeconds, as the kubelet's active deadline handler has it:
        the pod Failed (DeadlineExceeded), its containers stopped and its claims
        unprepared; it stays in the API, Failed, until someone deletes it."""
        self.tell(self._pod(uid), Told("Normal", DEADLINE_EXCEEDED, DEADLINE_MESSAGE))
        await self._terminate(uid, {"reason": DEADLINE_EXCEEDED, "message": DEADLINE_MESSAGE})

    async def _terminate(self, uid: str, failed: Obj | None = None) -> None:
        """Stop the pod's containers, release its claims, and write the terminal status of
        what it had reached, unless it ended before (its status says so). ``failed``: the
        pod-level reason and message of a pod the kubelet failed."""
        ended_before = uid in self._terminated  # its containers completed: its status says so
        if uid in self._latest and not ended_before:
            await self._stop_containers(uid)
        started = self._not_running(uid)
        await self._release(uid)
        pod = self._latest.get(uid)
        if pod is None or pod.get("_deleted") or ended_before:
            return
        now, status = now_rfc3339(), None
        if started:
            inits, restarted = self._inits.get(uid, podstatus.NO_INITS), self._restarted.get(uid)
            ended = podstatus.Ended.stopped(now)
            status = podstatus.ended_status(pod, started, _container_ids(pod), ended, inits, restarted)
            if self._ephemeral.get(uid):
                status["ephemeralContainerStatuses"] = self._ephemeral_statuses(pod, now)
        elif uid in self._inits:
            inits = self._inits[uid]
            status = podstatus.stopped_initializing_status(pod, _container_ids(pod), inits, now, failed is not None)
            if self._ephemeral.get(uid):
                status["ephemeralContainerStatuses"] = self._ephemeral_statuses(pod, now)
        elif uid in self._waiting or failed is not None:
            made = self._waiting.get(uid) is not None
            status = podstatus.never_ran_status(pod, now, made, self._started_early.get(uid))
        if status is not None:
            if uid in self._rejected:
                status = podstatus.stopped_after_rejection(status)
            with contextlib.suppress(ApiError):
                await self._patch_status(pod, {"status": {**status, **(failed or {})}})

    async def _finish_deletion(self, uid: str) -> None:
        await self._terminate(uid)  # as the kubelet: the stopped containers' terminal status, then the delete
        pod = self._latest.get(uid)
        if pod is not None and not pod.get("_deleted"):
            with contextlib.suppress(ApiError):  # gone already, or replaced
                await self._statuses.delete(pod)
        if pod is None or pod.get("_deleted"):
            self._forget(uid)
        else:
            # Still in the API until the delete above shows: its released claims stay
            # released when its last events come in (the DELETED one forgets it).
            self._forget(uid, keep_terminated=True)
        self._workers.pop(uid, None)

    def _forget(self, uid: str, keep_terminated: bool = False) -> None:
        if (timer := self._deadline_timers.pop(uid, None)) is not None:
            timer.cancel()
        self._past_deadline.discard(uid)
        self._admitted.discard(uid)
        self._rejected.discard(uid)
        self._verdicts.pop(uid, None)
        self._latest.pop(uid, None)
        self._waiting.pop(uid, None)
        self._inits.pop(uid, None)
        self._restarted.pop(uid, None)
        self._started_early.pop(uid, None)
        self._probing.pop(uid, None)
        self._ephemeral.pop(uid, None)
        self._ran_images.pop(uid, None)
        self._images.back_off.forget(uid)
        self._updated.pop(uid, None)
        self._changes.pop(uid, None)
        self._resources_status.pop(uid, None)
        if not keep_terminated:
            self._terminated.discard(uid)
            self._statuses.forget(uid)
        self._events.forget(uid)


def _extended_requests(pod: Obj, container: Obj) -> list[str]:
    """The requests of the pod's extended-resource claim that this container gets: those
    the scheduler mapped to an extended resource the container asks for (not zero)."""
    extended = pod.get("status", {}).get("extendedResourceClaimStatus")
    if not extended:
        return []
    requests = container.get("resources", {}).get("requests", {})
    asked = {name for name, quantity in requests.items() if _nonzero(quantity)}
    return [
        m["requestName"]
        for m in extended.get("requestMappings", [])
        if m.get("containerName") == container["name"] and m.get("resourceName") in asked
    ]


def _nonzero(quantity: object) -> bool:
    number = re.match(r"[+-]?(\d+\.?\d*|\.\d+)", str(quantity))
    return number is None or float(number.group()) != 0


def jittered(seconds: float) -> float:
    return seconds * (1 + JITTER * random.random())


def until_next_relist() -> float:
    """The PLEG lists containers on a fixed period: what changed now is seen within one."""
    return PLEG_RELIST_S * random.random()


def probe_plan(pod: Obj) -> tuple[dict[str, str], list[tuple[float, str, str | None]]]:
    """How the pod's containers' probes go, as the kubelet's prober runs them and a
    workload that answers passes them: what each container waits for as it starts
    ("starting": its startup probe, which holds back its readiness probe; "unready": its
    readiness probe), and when (seconds after it started) that changes (None: ready).
    Liveness probes pass, and change nothing."""
    waiting: dict[str, str] = {}
    changes: list[tuple[float, str, str | None]] = []
    for container in pod["spec"].get("containers", []):
        name, startup, readiness = container["name"], container.get("startupProbe"), container.get("readinessProbe")
        started_after = 0.0
        if startup:
            started_after = _passes_after(startup)
            waiting[name] = "starting"
            changes.append((started_after, name, "unready" if readiness else None))
        if readiness:
            waiting.setdefault(name, "unready")
            changes.append((_passes_after(readiness, started_after), name, None))
    changes.sort(key=lambda change: change[0])
    while changes and changes[0][0] <= 0:  # passed by the first probe, as the container starts
        _, name, waits_for = changes.pop(0)
        if waits_for is None:
            waiting.pop(name, None)
        else:
            waiting[name] = waits_for
    return waiting, changes


def _passes_after(probe: Obj, after: float = 0.0) -> float:
    """When a probe passes, in seconds after its container started: its worker probes at
    once and then every ``periodSeconds``; a probe counts once the container ran
    ``initialDelaySeconds`` (and, for readiness, once the startup probe passed at
    ``after``), and ``successThreshold`` in a row make it pass."""
    period = float(probe.get("periodSeconds") or 10)
    first = math.ceil(max(float(probe.get("initialDelaySeconds") or 0), after) / period)
    return (first + int(probe.get("successThreshold") or 1) - 1) * period


def restart_delay(back_off: tuple[float, float] | None, exited: float) -> tuple[float, tuple[float, float]]:
    """How long the kubelet waits before it starts again a container that exited at
    ``exited``, and its back-off from then on (seconds, when last set), given the one
    before: none the first time (it is then set to 10 s), else the back-off, doubled for
    the next time up to 5 minutes; forgotten once it was last set over 10 minutes before
    (the kubelet's flowcontrol.Backoff)."""
    if back_off is None or exited - back_off[1] > 2 * CRASH_LOOP_MAX_S:
        return 0.0, (CRASH_LOOP_INITIAL_S, exited)
    return back_off[0], (min(back_off[0] * 2, CRASH_LOOP_MAX_S), exited)


def back_off_syncs(
    delay: float, probed_every: float | None = None, resync_s: float = KUBELET_SYNC_FREQUENCY_S
) -> tuple[list[float], float]:
    """When, in seconds after a container exited into a back-off of ``delay``, the pod
    worker syncs the pod and finds it still backing off (each sync a BackOff Event), and
    when the sync that starts it again comes, as kubelet v1.37 times them: the first at
    the next relist; a blocked sync requeues the pod for the back-off's end (its error
    carries it), jittered up to half of the time left later, and never more than a
    ``resync_s`` (jittered alike) away, so only a back-off longer than that blocks more
    than once. ``probed_every``: the container was ready by a readiness probe run that
    often, whose next run after the relist finds it exited, turns it unready and so
    syncs the pod once more."""
    blocked: list[float] = []
    at = until_next_relist()
    if not delay:
        return blocked, at
    if probed_every is not None:
        blocked.append(at)
        at += probed_every * random.random()
    while at < delay:
        blocked.append(at)
        at += jittered(min(delay - at, resync_s))
    return blocked, at


def back_off_told(pod: Obj, name: str) -> Told:
    """The Event of a sync that container ``name``'s back-off blocked."""
    return Told("Warning", "BackOff", f"Back-off restarting failed container {name} in pod {_described(pod)}")


def crash_loop_state(pod: Obj, name: str, delay: float) -> Obj:
    """Container ``name`` waiting out a back-off of ``delay`` seconds, in the kubelet's words."""
    message = f"back-off {_go_duration(delay)} restarting failed container={name} pod={_described(pod)}"
    return {"waiting": {"reason": "CrashLoopBackOff", "message": message}}


def _described(pod: Obj) -> str:
    """As the kubelet names a pod in its messages (format.Pod)."""
    meta = pod["metadata"]
    return f"{meta['name']}_{meta['namespace']}({meta['uid']})"


def go_path_error(exc: OSError) -> str:
    """An OSError as Go prints the same failure (``write /path: no space left on device``)."""
    why = exc.strerror or str(exc)
    why = why[:1].lower() + why[1:]
    return f"write {exc.filename}: {why}" if exc.filename else why


def _go_duration(seconds: float) -> str:
    """As Go prints a whole number of seconds: 10s, 1m20s, 5m0s."""
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def _start_time(pod: Obj, default: str | None = None) -> str:
    """When the kubelet first took the pod on: kept from its first status write on."""
    return str(pod.get("status", {}).get("startTime") or default or now_rfc3339())


def _deadline(pod: Obj) -> float | None:
    seconds = pod["spec"].get("activeDeadlineSeconds")
    return None if seconds is None else float(seconds)


def _started_now(pod: Obj, container: Obj, at: str | None = None) -> podstatus.Restarted:
    """A container the runtime starts ``at`` (default: now), as the next relist finds it:
    running, or exited already if its command ends as it starts."""
    name, at = container["name"], at or now_rfc3339()
    container_id = _container_ids(pod)[name]
    if commands.exits_at_once(pod, container):
        ended = podstatus.Ended.exit_status(commands.exit_code(container), now_rfc3339())
        return podstatus.Restarted(0, container_id, podstatus.terminated_state(container_id, at, ended), {})
    return podstatus.Restarted(0, container_id, {"running": {"startedAt": at}}, {})


def _container_ids(pod: Obj) -> dict[str, str]:
    uid, spec = pod["metadata"]["uid"], pod["spec"]
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    return {c["name"]: f"dra-testbed://{uid}-{c['name']}" for c in containers}


def _images_shown(pod: Obj) -> dict[str, str]:
    """By container name: the image each container made runs, as the pod's status shows it."""
    status = pod.get("status", {})
    shown = [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]
    return {s["name"]: s["image"] for s in shown if s.get("containerID") and s.get("image")}


def _ephemeral_shown(pod: Obj) -> dict[str, Obj]:
    """By name: the state of each ephemeral container made, as the pod's status shows it."""
    shown = pod.get("status", {}).get("ephemeralContainerStatuses") or []
    return {s["name"]: s.get("state") or {} for s in shown if s.get("containerID")}


def _ephemeral_id(pod: Obj, container: Obj) -> str:
    return f"dra-testbed://{pod['metadata']['uid']}-{container['name']}"


def _running_with_own_ip(pod: Obj) -> bool:
    status = pod.get("status", {})
    return bool(status.get("phase") == "Running" and status.get("podIP") and not pod["spec"].get("hostNetwork"))


def _differs_beyond_status(before: Obj, after: Obj) -> bool:
    """What makes the kubelet sync a pod again at once: its spec, labels, annotations or
    deletion changed. A status-only change is merely noted."""
    old, new = before["metadata"], after["metadata"]
    return (
        before.get("spec") != after.get("spec")
        or any(old.get(k) != new.get(k) for k in ("labels", "annotations", "deletionTimestamp"))
        or old.get("deletionGracePeriodSeconds") != new.get("deletionGracePeriodSeconds")
    )


def _own_write(before: Obj, after: Obj) -> bool:
    """Nothing beyond the status changed but the container-env annotation this kubelet
    writes with the pod's Running status (a real kubelet writes none): no sync for it."""

    def without_it(pod: Obj) -> Obj:
        annotations = pod["metadata"].get("annotations") or {}
        kept = {k: v for k, v in annotations.items() if k != CONTAINER_ENV_ANNOTATION}
        return {**pod, "metadata": {**pod["metadata"], "annotations": kept}}

    return not _differs_beyond_status(without_it(before), without_it(after))


def pod_claim_name(pod: Obj, entry: Obj) -> tuple[str | None, bool]:
    """The name of the ResourceClaim a pod's claim entry stands for, and whether it was
    made from a template (its owner must then be the pod); None: no claim was needed."""
    meta = pod["metadata"]
    if entry.get("resourceClaimName"):
        return entry["resourceClaimName"], False
    if entry.get("resourceClaimTemplateName"):
        for status in pod.get("status", {}).get("resourceClaimStatuses", []):
            if status.get("name") == entry["name"]:
                return status.get("resourceClaimName"), True
        raise StartFailed(
            PREPARE_FAILED,
            f'{PREPARE_FAILED_MESSAGE}: pod "{meta["namespace"]}/{meta["name"]}": ResourceClaim not created yet',
        )
    raise StartFailed(
        PREPARE_FAILED,
        f'{PREPARE_FAILED_MESSAGE}: pod "{meta["namespace"]}/{meta["name"]}", spec.resourceClaim '
        f'"{entry.get("name")}": none of the supported fields are set',
    )


def _controlled_by(obj: Obj, owner_uid: str) -> bool:
    return any(r.get("controller") and r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences", []))


def _pod_group(pod: Obj) -> str | None:
    return (pod["spec"].get("schedulingGroup") or {}).get("podGroupName")


def _not_made_for(pod: Obj, claim: Obj) -> str | None:
    """Why a claim made from a template is not the pod's to use (None: it is): made for
    another pod, or, for a pod of a PodGroup, neither for it nor for its group
    (DRAWorkloadResourceClaims, which the testbed's clusters enable, kubelets included:
    a PodGroup's claim is the group's, owned by the PodGroup, which the pod knows by name
    only)."""
    meta = pod["metadata"]
    if _controlled_by(claim, meta["uid"]):
        return None
    namespace = meta["namespace"]
    about = f"ResourceClaim {namespace}/{claim['metadata']['name']} was not created for Pod {namespace}/{meta['name']}"
    group = _pod_group(pod)
    if group is None:
        return f"{about} (Pod is not owner)"
    controller: Obj = next((r for r in claim["metadata"].get("ownerReferences", []) if r.get("controller")), {})
    if (
        controller.get("kind") == "PodGroup"
        and controller.get("name") == group
        and str(controller.get("apiVersion", "")).startswith(f"{POD_GROUP_API}/")
    ):
        return None
    return f"{about} (neither Pod nor PodGroup {group} is the owner)"


def _reserved_for(pod: Obj, claim: Obj) -> bool:
    """The claim is reserved for the pod, or for its PodGroup (known by name: a pod does
    not know its group's UID)."""
    group = _pod_group(pod)
    for consumer in claim.get("status", {}).get("reservedFor", []):
        if consumer.get("uid") == pod["metadata"]["uid"]:
            return True
        if (
            group is not None
            and consumer.get("apiGroup") == POD_GROUP_API
            and consumer.get("resource") == "podgroups"
            and consumer.get("name") == group
        ):
            return True
    return False


def _drivers(claim: Obj) -> list[str]:
    return sorted({r["driver"] for r in claim["status"]["allocation"]["devices"]["results"]})
