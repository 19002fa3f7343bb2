"""Pods bound to this node, as the kubelet's pod workers take them: admit them, have
their claims prepared, "run" them, have the claims unprepared, remove them.

For each pod: its claims prepared by the DRA manager (dra.py: each allocated and
reserved for it, NodePrepareResources once per driver for those not yet prepared on
this node, each container's CDI device IDs resolved against the spec files as a
runtime would: an unknown ID fails the start); set the pod Running, with its IP from
the Node's pod CIDR (podnetwork.py) and the environment a container would see (the
runtime's report) in the ``dra-testbed.io/container-env`` annotation of that same status
write. A container's command says how it ends (commands.py: after ``sleep N``, with ``exit N``'s
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
  the probe would pass, the workload taken to answer it (``probes.probe_plan``);
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
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from testbed.config import KUBELET_SYNC_FREQUENCY_S
from testbed.http11 import TransportError
from testbed.keys import CONTAINER_ENV_ANNOTATION
from testbed.kubeapi import (
    ApiError,
    KubeClient,
    Obj,
    WatchPosition,
    now_rfc3339,
    parse_rfc3339,
    path_for,
    rfc3339,
)
from testbed.kubelet import admission, backoff, commands, containerevents, metrics, podstatus, probes
from testbed.kubelet.containerevents import Told
from testbed.kubelet.dra import PREPARE_FAILED, DRAManager, StartFailed
from testbed.kubelet.events import EventQueue, EventRecorder
from testbed.kubelet.node import NodeSpec, node_object
from testbed.kubelet.plugins import PluginManager
from testbed.kubelet.podnetwork import AddressesExhausted, PodAddresses
from testbed.kubelet.podstate import PodState
from testbed.kubelet.resync import ResyncSchedule
from testbed.kubelet.statuswriter import StatusWriter
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)
T = TypeVar("T")

RECONCILE_S = 60.0
"""How often claims of pods that are gone are looked for, as the kubelet's DRA manager does."""
CREATING_SHOWN_AFTER_S = 1.0
"""A start (the claims' prepare) that takes longer shows the pod Pending with its
containers ContainerCreating, as the kubelet's status at the start of its sync does; a
quicker one goes straight to Running (the kubelet's ContainerCreating then lasts a
fraction of a second), saving one status write per pod."""
SANDBOX_FAILED = "FailedCreatePodSandBox"
CREATE_CONTAINER_ERROR = "CreateContainerError"
DEADLINE_EXCEEDED = "DeadlineExceeded"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
"""The kubelet's words (its active deadline handler) for a pod past activeDeadlineSeconds."""


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
        self.node = node
        self.plugins = plugins
        self.dra = DRAManager(client, node.name, plugins, cdi_dir, checkpoint, durable)
        self.watch_pods = watch_pods
        self.pod_cidr = pod_cidr
        self._addresses = PodAddresses()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._pods: dict[str, PodState] = {}
        """By UID: each pod bound here that this kubelet knows of, and how far it took it."""
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
        self.sync_frequency_s = sync_frequency_s
        self._resync_schedule = ResyncSchedule(sync_frequency_s, backoff.JITTER)
        self._resync_wake = asyncio.Event()
        """Set when a pod starts running: it may be due before the one slept for."""
        self._terminated: set[str] = set()
        """Pods whose claims were released after their containers stopped, until the API
        says they are gone: their late events must not release them again."""
        self._process_changes: dict[tuple[str, str, str], list[int | None]] = {}
        """By namespace, pod and container: ``process_changed`` calls made before the pod
        ran here (a NodeHost taking a node over restarts its driver before its kubelet
        has adopted the driver pod), told once it runs."""
        self._process_back_off: dict[tuple[str, str, str], tuple[float, float]] = {}
        """Per container whose process runs beside this kubelet: its back-off (backoff.restart_delay)."""
        self._to_admit: list[str] = []
        """Pods seen and not admitted yet: those that came in together are admitted
        together, oldest first (``_admission``)."""

    def start(self) -> None:
        self.dra.load_checkpoint()
        metrics.CLAIMS_IN_USE.books.add(self.dra)
        if self.watch_pods:
            self._task = asyncio.create_task(self._watch(), name=f"pods-{self.node.name}")
        self._resync_task = asyncio.create_task(self._resync(), name=f"pod-sync-{self.node.name}")
        self._reconcile_task = asyncio.create_task(self._reconcile(), name=f"claim-reconcile-{self.node.name}")

    async def stop(self) -> None:
        metrics.CLAIMS_IN_USE.books.discard(self.dra)
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
        uid, seen = pod["metadata"]["uid"], dict(pod, _deleted=kind == "DELETED")
        state = self._pods.get(uid)
        before = None if state is None else state.pod
        if state is None:
            state = self._pods[uid] = PodState(seen)
        else:
            state.pod = seen
        if log.isEnabledFor(logging.INFO):
            self._log_sync_loop(kind, before, pod)
        if before is None and _sandbox_with_own_ip(pod):
            # Its sandbox made before this kubelet started: its IP is held from now on, as a network
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
            state.changed()
            if kind != "DELETED" and before is not None and state.running_since and not _own_write(before, pod):
                # A running pod's worker syncs it now: its status is worked out again
                # (a device whose health went stale turns Unknown), and the next
                # periodic sync comes a syncFrequency after this one.
                self._resync_schedule.add(uid, time.monotonic())
                if self.dra.has_claims(uid):
                    self._in_background(self._sync_status(uid), f"pod-status-{uid}")
        elif state.running_since and pod["spec"].get("readinessGates"):
            self._follow_readiness_gates(pod)
        if uid in self._workers:
            if before is not None and _deadline(before) != _deadline(pod):
                self._arm_deadline(uid)  # activeDeadlineSeconds may be set or shortened on a running pod
            return
        if kind == "DELETED" and uid in self._terminated:
            self._forget(uid)  # released, and now gone from the API: nothing is left to do
        elif kind != "DELETED" and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            if state.rejected and not state.deleting():
                return  # its Failed status is not written yet
            if not state.rejected:
                self._to_admit.append(uid)
            self._workers[uid] = asyncio.create_task(self._run(uid), name=f"pod-{uid}")
        elif pod["metadata"].get("deletionTimestamp"):
            self._workers[uid] = asyncio.create_task(self._finish_deletion(uid), name=f"pod-del-{uid}")

    def _log_sync_loop(self, kind: str, before: Obj | None, pod: Obj) -> None:
        """What the kubelet logs at -v=2 of the pods its API watch tells it of."""
        meta = pod["metadata"]
        if kind == "DELETED":
            what = "REMOVE"
        elif before is None:
            what = "ADD"
        elif meta.get("deletionTimestamp") and not before["metadata"].get("deletionTimestamp"):
            what = "DELETE"
        else:
            return
        log.info("%s: SyncLoop %s pod %s/%s (%s)", self.node.name, what, meta["namespace"], meta["name"], meta["uid"])

    # --- helpers ---------------------------------------------------------------------

    def _pod(self, uid: str) -> Obj:
        return self._pods[uid].pod

    def _seen(self, uid: str) -> Obj | None:
        """The pod as last seen, if this kubelet still knows of it."""
        state = self._pods.get(uid)
        return None if state is None else state.pod

    def _runs(self, uid: str) -> bool:
        """Its containers run (it may be gone since the question came up)."""
        state = self._pods.get(uid)
        return state is not None and bool(state.running_since)

    def _deleting(self, uid: str) -> bool:
        return self._pods[uid].deleting()

    def _ending(self, uid: str) -> bool:
        """Being deleted, or past its active deadline: its worker stops what it does."""
        return self._pods[uid].ending()

    def _arm_deadline(self, uid: str) -> None:
        """Fail the pod once its activeDeadlineSeconds passed, counted from its startTime as
        the kubelet counts it (from now for a pod new here)."""
        state = self._pods[uid]
        state.forget_deadline()
        seconds = _deadline(state.pod)
        if seconds is None:
            return
        began = parse_rfc3339(_start_time(state.pod))
        delay = max(0.0, began + seconds - time.time())
        state.deadline_timer = asyncio.get_running_loop().call_later(delay, self._deadline_passed, uid)

    def _deadline_passed(self, uid: str) -> None:
        state = self._pods.get(uid)
        if state is None:
            return
        state.deadline_timer = None
        if uid in self._terminated or state.deleting():
            return
        state.past_deadline = True
        state.changed()

    async def _pause(self, uid: str, seconds: float, seen: int | None = None) -> None:
        """Sleep, but wake at once if the pod changes (e.g. is being deleted), or return at
        once if it changed since ``seen`` (from ``_changes``, taken when the attempt that
        ends here began): as a kubelet's pod worker syncs again right away for an update
        that came in during a sync."""
        state = self._pods.get(uid)
        if state is None:  # forgotten meanwhile: nothing can wake it
            await asyncio.sleep(seconds)
            return
        state.updated.clear()
        if seen is not None and state.changes != seen:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.updated.wait(), seconds)

    def tell(self, pod: Obj, told: Told, container: str = "") -> None:
        """Record an Event on the pod, or on its ``container``, as a kubelet's event
        recorder does (events.py): written behind, in the order told."""
        where = containerevents.field_path(pod, container) if container else ""
        self._told.tell(pod, told.kind, told.reason, told.message, where)

    def _tell_started(self, pod: Obj, container: Obj, pull: containerevents.Pull | None = None) -> None:
        """A container is created and started: told so, and the image it runs noted.
        ``pull``: its image was made sure of already (``_pull_images``)."""
        if (state := self._pods.get(pod["metadata"]["uid"])) is not None:
            state.ran_images[container["name"]] = container.get("image", "")
        if pull is None:
            pull = containerevents.Pull(self._images.ensure(container))
        elif pull.started_told:
            return
        for each in [*pull.told, containerevents.CREATED, containerevents.STARTED]:
            self.tell(pod, each, container["name"])

    def _sync_failed(self, pod: Obj, why: str) -> None:
        """As the kubelet's pod worker logs each failed sync ("Error syncing pod, skipping")."""
        meta = pod["metadata"]
        log.warning(
            "%s: error syncing pod %s/%s (%s), skipping: %s",
            self.node.name,
            meta["namespace"],
            meta["name"],
            meta["uid"],
            why,
        )

    def _containers_not_started(self, pod: Obj, failed: Mapping[str, tuple[str, str]]) -> None:
        """A sync that could not start containers (image not pulled, crash loop): each one's
        reason and message, in the kubelet's words."""
        said = [
            f'failed to "StartContainer" for {json.dumps(name)} with {why}: {json.dumps(words)}'
            for name, (why, words) in failed.items()
        ]
        self._sync_failed(pod, said[0] if len(said) == 1 else f"[{', '.join(said)}]")

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
                    self._pods[uid].started_early[name] = _started_now(pod, containers[name])
                    pulls[name] = containerevents.Pull([], None, started_told=True)
                else:
                    for told in pull.told:
                        self.tell(pod, told, name)
                    if pull.failed is not None:
                        metrics.STARTED_CONTAINER_ERRORS.labels("container", pull.failed[0]).inc()
                    pulls[name] = containerevents.Pull([], pull.failed, pull.started_told)
            self._containers_not_started(pod, {n: p.failed for n, p in pulls.items() if p.failed is not None})
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
            waiting = [other for other in waiting if other in self._pods]
            for other in sorted(waiting, key=lambda u: self._pod(u)["metadata"].get("creationTimestamp") or ""):
                self._pods[other].verdict = self._admit(other)
        state = self._pods[uid]
        verdict, state.verdict = state.verdict, None
        return verdict

    def _admit(self, uid: str) -> admission.Refusal | None:
        """Take the pod, or say why not (the kubelet's admission when it first sees a pod);
        once taken, a pod is not checked again until this kubelet restarts."""
        pod = self._pod(uid)
        if self._pods[uid].admitted:
            return None
        refused = admission.refusal(pod, self._node_object(), self._admitted_pods(uid))
        if refused is None:
            self._pods[uid].admitted = True
        return refused

    def _node_object(self) -> Obj:
        return self.node_seen() or node_object(self.node)

    def _admitted_pods(self, besides: str) -> list[Obj]:
        """The pods taken and not yet ended: what the kubelet counts as in use."""
        return [
            state.pod
            for uid in sorted(self.active_uids())
            if uid != besides
            and (state := self._pods.get(uid)) is not None
            and state.admitted
            and uid not in self._terminated
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
                    self._pods[uid].admitted = True
                    return False
                refused = again
        state = self._pods[uid]
        pod = state.pod
        state.rejected = True
        metrics.ADMISSION_REJECTIONS.labels(admission.metric_reason(refused.reason)).inc()
        self.tell(pod, Told("Warning", refused.reason, refused.message))
        message = admission.REJECTED + refused.message
        if self._kept_running(pod):
            # Its containers ran through this kubelet's restart: they are stopped and its
            # claims unprepared, and its status tells of them, as for any pod the kubelet fails.
            state.running_since = _start_time(pod)
            state.inits = podstatus.InitRun.from_status(pod) or podstatus.InitRun.complete(pod, now_rfc3339())
            state.restarted = podstatus.Restarted.from_status(pod)
            await self._terminate(uid, {"reason": refused.reason, "message": message})
            return True
        if (resumed := self._sandbox_kept(pod)) is not None:
            # Still starting, its sandbox kept through the restart: stopped as well.
            if podstatus.InitRun.from_status(pod) is None:
                state.inits = resumed
            else:
                self._resume_started_early(pod)
                state.shown_pending, state.refused = True, {}
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
            if self._pods[uid].past_deadline and uid not in self._terminated:
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
        ids, restarted = _container_ids(pod), self._pods[uid].restarted
        # Those that had ended before this kubelet restarted stay so.
        ends = {name: begin + e.seconds for name, e in commands.endings(pod).items() if name not in restarted}
        last = begin + seconds
        while not self._ending(uid):
            seen = self._pods[uid].changes
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
            began = again.state.get("running", {}).get("startedAt", self._pods[uid].running_since)
            code = commands.exit_code(next(c for c in self._pod(uid)["spec"]["containers"] if c["name"] == name))
            exited = podstatus.terminated_state(
                again.container_id, began, podstatus.Ended.exit_status(code, now_rfc3339())
            )
            restarted[name] = podstatus.Restarted(again.count, again.container_id, exited, again.last)
            await self._write_running(uid)
        return False

    def _kept_running(self, pod: Obj) -> bool:
        """Whether the pod's containers ran through this kubelet's restart: it is Running,
        and its claims were prepared here before or it has none."""
        return pod.get("status", {}).get("phase") == "Running" and self.dra.prepared_before_restart(pod)

    def _sandbox_kept(self, pod: Obj) -> podstatus.InitRun | None:
        """A pod still starting when this kubelet restarted, its sandbox made (its claims
        prepared): what its init containers did, as its status shows it. As the kubelet,
        which prepares claims only for a sandbox it creates, its claims are not prepared
        again, the init containers that ran stay done, the one running ends at its own
        time, and the containers started meanwhile (``_started_early``) run on. None: a
        pod to start from the beginning."""
        status = pod.get("status", {})
        if status.get("phase") != "Pending" or not _sandbox_shown(pod) or not self.dra.prepared_before_restart(pod):
            return None
        return podstatus.InitRun.so_far(pod)

    def _resume_started_early(self, pod: Obj) -> dict[str, containerevents.Pull]:
        """The pod's containers its status shows started (while others waited for their
        image, before this kubelet restarted): kept as they are, their images not pulled
        again."""
        uid, early = pod["metadata"]["uid"], {}
        for shown in pod.get("status", {}).get("containerStatuses") or []:
            state = shown.get("state") or {}
            if shown.get("containerID") and ("running" in state or "terminated" in state):
                count, last = shown.get("restartCount", 0), shown.get("lastState") or {}
                early[shown["name"]] = podstatus.Restarted(count, shown["containerID"], state, last)
        if early:
            self._pods[uid].started_early = early
        return {name: containerevents.Pull([], None, started_told=True) for name in early}

    async def _start(self, uid: str) -> bool:
        """As the kubelet's pod worker: a failed attempt is made again at the next sync
        (sooner if the pod's spec, labels, annotations or deletion change)."""
        sandbox = False  # the kubelet prepares claims before the runtime makes it, containers after
        initialized: podstatus.InitRun | None = None  # its init containers, once done, run no more
        pulls: dict[str, containerevents.Pull] = {}
        state = self._pods[uid]
        resumed = self._sandbox_kept(state.pod)
        if resumed is not None:
            sandbox = True
            pulls = self._resume_started_early(state.pod)
        while not self._ending(uid):
            seen, pod = state.changes, state.pod
            try:
                if self._kept_running(pod):
                    env = await self.dra.adopt(pod)
                    inits = podstatus.InitRun.from_status(pod) or podstatus.InitRun.complete(pod, now_rfc3339())
                    state.restarted = podstatus.Restarted.from_status(pod)
                    state.ran_images = _images_shown(pod)  # the runtime's containers say it
                    state.ephemeral = _ephemeral_shown(pod)  # not to be started twice
                else:
                    waits = {name: pull.failed for name, pull in pulls.items() if pull.failed is not None}
                    if waits:
                        # The kubelet writes why the sync before failed as the next begins.
                        await self._set_waiting(pod, waits, initialized)
                    if resumed is not None:  # no sandbox made, so nothing prepared
                        env = await self.dra.adopt(pod)
                    else:
                        env = await self._creating_while(pod, self.dra.prepare(pod))
                    if initialized is None:
                        ran = await self._initialize(pod, resumed=resumed)
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
                        next_sync = (
                            backoff.until_next_relist() if made else backoff.jittered(backoff.SYNC_ERROR_BACKOFF_S)
                        )
                        sandbox = True
                        await self._pause(uid, next_sync, seen)
                        continue
                # The pod as last seen: its status holds what the init containers' writes said.
                await self._set_running(self._pod(uid), env, inits, probed=not self._kept_running(pod), pulls=pulls)
                return True
            except StartFailed as exc:
                state.inits = None
                self._sync_failed(pod, str(exc))
                self.tell(pod, Told("Warning", exc.reason, str(exc)), exc.container)
                if exc.reason in (PREPARE_FAILED, SANDBOX_FAILED):
                    await self._set_waiting(pod)
                elif exc.created is not None:
                    name, message = exc.created
                    await self._set_waiting(pod, {name: (CREATE_CONTAINER_ERROR, message)})
                if exc.reason == PREPARE_FAILED:
                    next_sync = backoff.jittered(self.sync_frequency_s)
                elif not sandbox:
                    # The sandbox the failed attempt left is new to the PLEG, whose next
                    # relist syncs the pod once more.
                    sandbox = True
                    next_sync = backoff.until_next_relist()
                else:
                    next_sync = backoff.jittered(backoff.SYNC_ERROR_BACKOFF_S)
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

    async def _initialize(
        self,
        pod: Obj,
        carried: Mapping[str, podstatus.Restarted] | None = None,
        resumed: podstatus.InitRun | None = None,
    ) -> podstatus.InitRun | None:
        """Run the pod's init containers in order before its own, as the kubelet does: each
        to its end (``sleep N``: N seconds; ``sleep infinity``: never; any other command at
        once), a sidecar (restartPolicy Always) started and left running. While one runs,
        the pod shows Pending with it running. One that exits non-zero (``exit N``) fails
        the pod under restartPolicy Never (returned ``failing``), else is started again
        until the pod is deleted (``_retry_init``). None if the pod is deleted meanwhile.
        ``carried``: they run again, the pod restarted in place (``InitRun.carried``).
        ``resumed``: how far they got before this kubelet restarted (``_sandbox_kept``)."""
        uid = pod["metadata"]["uid"]
        run = resumed or podstatus.InitRun(carried=carried or {})
        ran_before = len(run.spans) if resumed else 0
        state = self._pods[uid]
        if resumed:
            state.inits = run
        state.initializing = True
        self._sandbox_made(uid)
        try:
            while True:
                for index, container in enumerate(pod["spec"].get("initContainers") or []):
                    seconds, ends_at = commands.init_seconds(container), None
                    if index < ran_before:
                        began, ended = run.spans[index]
                        if ended or podstatus.is_sidecar(container):
                            continue  # done, or running on, through this kubelet's restart
                        if seconds is not None:  # the one running then ends at its own time
                            ends_at = parse_rfc3339(began) + seconds
                            seconds = max(0.0, ends_at - time.time())
                    else:
                        pull = await self._pull_init_image(uid, container, run)
                        if pull is None:
                            return None
                        self._tell_started(pod, container, pull)
                        run = state.inits = run.then(now_rfc3339())
                        if podstatus.is_sidecar(container):
                            if not await self._start_sidecar(uid, container):
                                return None
                            continue
                    if seconds != 0:
                        await self._write_initializing(uid)
                        if not await self._runs_for(uid, seconds):
                            return None
                    if code := commands.exit_code(container):
                        if commands.restarts_all(container, code):
                            break  # the pod restarts in place: from its first init container again
                        return await self._retry_init(uid, container, code)
                    run = state.inits = run.ended(now_rfc3339() if ends_at is None else rfc3339(ends_at))
                else:
                    return run
                if (again := await self._restart_initializing(uid, container, code)) is None:
                    return None
                run, ran_before = again, 0
        finally:
            state.initializing = False

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
            self._containers_not_started(pod, {container["name"]: pull.failed})
            # A sync that made the sandbox is followed by the relist's, another by the
            # pod worker's back-off.
            next_sync = backoff.until_next_relist() if made_sandbox else backoff.jittered(backoff.SYNC_ERROR_BACKOFF_S)
            made_sandbox = False
            if not await self._runs_for(uid, next_sync):
                return None
            self._pods[uid].inits = run
            await self._write_initializing(uid, {container["name"]: pull.failed})

    async def _restart_initializing(self, uid: str, source: Obj, code: int) -> podstatus.InitRun | None:
        """Init container ``source`` exited with ``code``, as a RestartAllContainers rule
        of its says: seen at the next PLEG relist and shown so (AllContainersRestarting),
        the pod restarts in place (``_remove_all``); the run its init containers start
        again with, None if the pod is ending first."""
        if not await self._runs_for(uid, backoff.until_next_relist()):
            return None
        state, name = self._pods[uid], source["name"]
        run = state.init_run()
        now = run.carried.get(name) or podstatus.Restarted(0, _container_ids(state.pod)[name], {}, {})
        ended = podstatus.Ended.exit_status(code, now_rfc3339())
        exited = podstatus.terminated_state(now.container_id, run.spans[-1][0], ended)
        run = state.inits = run.failed(podstatus.Restarted(now.count, now.container_id, exited, now.last))
        await self._write_initializing(uid)
        latest = state.pod
        before = podstatus.initializing_status(
            latest, _start_time(latest), _container_ids(latest), run, {}, now_rfc3339()
        )
        await self._remove_all(uid, before)
        return state.init_run()

    async def _start_sidecar(self, uid: str, container: Obj) -> bool:
        """A sidecar is probed from its start, as the pod's containers are from theirs;
        the kubelet starts the next container once its startup probe passed (shown
        running, not started, meanwhile; then started, the next one shown from the
        relist after). False if the pod is deleted first."""
        name, began = container["name"], time.monotonic()
        changes = self._probed_from_start(uid, container)
        probing = self._pods[uid].probing
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
            if not await self._runs_for(uid, backoff.until_next_relist()):
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
        status = podstatus.failed_initializing_status(
            pod, _container_ids(pod), self._pods[uid].init_run(), now_rfc3339()
        )
        await self._patch_status(pod, {"status": status})

    async def _write_initializing(self, uid: str, waits: Mapping[str, tuple[str, str]] | None = None) -> None:
        """``waits``: containers not started, with the reason and message they wait for."""
        state = self._pods[uid]
        latest = state.pod
        addresses = self._addresses_of(latest)
        status = podstatus.initializing_status(
            latest,
            _start_time(latest),
            _container_ids(latest),
            state.init_run(),
            addresses,
            now_rfc3339(),
            state.probing,
            state.restarted,
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
        after a back-off (``backoff.restart_delay``, ``backoff.back_off_syncs``; shown exited meanwhile),
        the pod Pending, until the pod is deleted (None). Its command ends alike each
        time, so it never gets further."""
        state, name = self._pods[uid], container["name"]
        pod, run = state.pod, state.init_run()
        first_id = _container_ids(pod)[name]
        carried = run.carried.get(name) or podstatus.Restarted(0, first_id, {}, {})
        now = carried.started_again(carried.container_id, run.spans[-1][0])
        back_off: tuple[float, float] | None = None
        seconds = commands.init_seconds(container)
        while True:
            ended = podstatus.Ended.exit_status(code, now_rfc3339())
            exited = podstatus.terminated_state(now.container_id, now.state["running"]["startedAt"], ended)
            run = state.inits = run.failed(podstatus.Restarted(now.count, now.container_id, exited, now.last))
            if not commands.should_restart(pod, container, code):
                run = state.inits = run.ended(ended.at)
                return run
            exited_at = time.monotonic()
            delay, back_off = backoff.restart_delay(back_off, exited_at)
            # Shown exited by the sync that finds it so (started again at once, the kubelet's
            # write of it may be overtaken by the next: its status manager sends the latest).
            await self._write_initializing(uid)
            blocked, restart_at = backoff.back_off_syncs(delay, resync_s=self.sync_frequency_s)
            for synced, at in enumerate(blocked):
                if not await self._runs_for(uid, exited_at + at - time.monotonic()):
                    return None
                self._back_off_blocked(pod, name, delay)
                if synced:  # the sync before was blocked too
                    run = await self._show_init_crash_loop(uid, name, delay)
            if not await self._runs_for(uid, exited_at + restart_at - time.monotonic()):
                return None
            if blocked:  # the sync that starts it shows first why the one before failed
                run = await self._show_init_crash_loop(uid, name, delay)
            self._tell_started(pod, container)
            count = now.count + 1
            now = podstatus.Restarted(count, f"{first_id}-{count}", {"running": {"startedAt": now_rfc3339()}}, exited)
            run = state.inits = run.failed(now)
            if seconds != 0:  # one that ends at once is gone before the next relist could show it running
                await self._write_initializing(uid)
            if not await self._runs_for(uid, seconds):
                return None

    async def _show_init_crash_loop(self, uid: str, name: str, delay: float) -> podstatus.InitRun:
        """The failing init container ``name`` shown waiting in CrashLoopBackOff, as for the
        pod's own containers (``_show_crash_loop``), if it does not show it yet."""
        state = self._pods[uid]
        run = state.init_run()
        failing = run.failing
        if failing is not None and "terminated" in failing.state:
            waiting = backoff.crash_loop_state(state.pod, name, delay)
            run = state.inits = run.failed(
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
        state = self._pods[meta["uid"]]
        state.running_since, state.inits = stamp, inits
        self._sandbox_made(meta["uid"])
        state.shown_pending, state.refused = False, None
        self._resync_schedule.add(meta["uid"], time.monotonic())
        self._resync_wake.set()

        early, state.started_early = state.started_early, {}
        if early:  # as they are since, the rest start now
            state.restarted = {**early, **state.restarted}
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
        probing, changes = probes.probe_plan(pod) if probed else ({}, [])
        exited = self._exited_at_once(pod, stamp, besides=early) if probed else set()
        probing = {name: waits for name, waits in probing.items() if name not in exited}
        changes = [change for change in changes if change[1] not in exited]
        probing = state.probing = {**state.probing, **probing}  # sidecars' kept
        restarted = state.restarted  # a restarted kubelet's, read from the status
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
        restarted = self._pods[uid].restarted
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
        changes to come, in seconds from now (``probes.probe_plan``)."""
        waiting, changes = probes.probe_plan({"spec": {"containers": [container]}})
        probing = self._pods[uid].probing
        probing.pop(container["name"], None)
        probing.update(waiting)
        return changes

    def _readiness_period(self, uid: str, container: Obj) -> float | None:
        """How often the container's readiness probe runs, if it passed (the container is
        ready by it); else None."""
        probe = container.get("readinessProbe")
        if probe is None or container["name"] in self._pods[uid].probing:
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
            state = self._pods.get(uid)
            if state is None or not (state.running_since or state.initializing) or state.ending():
                return
            probing, running = state.probing, bool(state.running_since)
            again = state.restarted.get(name)
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
        state = self._pods[uid]
        if state.shown_pending and state.refused == refused:
            return  # a container starts early only as its wait ends (``_pull_images``): shown
        early = self._pods[uid].started_early
        probing = probes.probe_plan(
            {"spec": {"containers": [c for c in pod["spec"]["containers"] if c["name"] in early]}}
        )[0]
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
        state.shown_pending, state.refused = True, dict(refused) if refused is not None else None

    async def _restart_exited(self, uid: str) -> str | None:
        """As the kubelet restarts the containers of a pod that does not end of itself
        (``commands.run_seconds`` None): a container whose command ends exits and, under
        restartPolicy Always or when it failed under OnFailure, is started again, at once
        the first time, then after a back-off (``backoff.restart_delay``), by the first of the
        pod worker's syncs (``backoff.back_off_syncs``: at the next relist, then at the back-off's
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
        ids, restarted = _container_ids(pod), self._pods[uid].restarted
        for container in pod["spec"].get("containers", []):  # exited for good before this kubelet restarted
            again = restarted.get(container["name"])
            if again is not None and "terminated" in again.state and not commands.restarts(pod, container):
                periods.pop(container["name"], None)
        due = {name: time.monotonic() + seconds for name, seconds in periods.items()}
        back_off: dict[str, tuple[float, float]] = {}
        for name in periods:  # shown exited at their first start (``_exited_at_once``): their restart at once is now
            if (again := restarted.get(name)) is not None and again.count == 0 and "terminated" in again.state:
                _, back_off[name] = backoff.restart_delay(None, time.monotonic())
        backed_off: dict[str, backoff.BackingOff] = {}
        """Containers that exited, until started again."""
        while not self._ending(uid):
            seen = self._pods[uid].changes
            for container in self._redefined(uid, backed_off):
                if not await self._start_redefined(uid, container):
                    return None
                name = container["name"]
                # Its back-off was the old image's: the new one's starts now, as for a first start.
                _, back_off[name] = backoff.restart_delay(None, time.monotonic())
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
                running = {"running": {"startedAt": self._pods[uid].running_since}}
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
                delay, back_off[name] = backoff.restart_delay(back_off.get(name), exited_at)
                # Shown exited by the sync that finds it so, whether or not it starts it again.
                await self._write_running(uid)
                probed_every = self._readiness_period(uid, container)
                blocked, restart_at = backoff.back_off_syncs(delay, probed_every, self.sync_frequency_s)
                backed_off[name] = backoff.BackingOff(delay, [exited_at + at for at in blocked], exited_at + restart_at)
                due[name] = backed_off[name].next_sync()
                continue
            plan: backoff.BackingOff | None = backed_off.pop(name, None)  # None: found so by a restarted kubelet
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
        pod, ran = self._pod(uid), self._pods[uid].ran_images
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
            run = self._pods[uid].init_run()
            before = run.carried.get(name) or podstatus.Restarted(0, first_id, {}, {})
            stopped = podstatus.terminated_state(before.container_id, run.spans[index][0], podstatus.Ended.stopped(now))
            again = podstatus.Restarted(before.count + 1, f"{first_id}-{before.count + 1}", {}, stopped)
            self._pods[uid].inits = run.started_again(index, name, again, now)
        else:
            restarted = self._pods[uid].restarted
            before = restarted.get(name) or podstatus.Restarted(
                0, first_id, {"running": {"startedAt": self._pods[uid].running_since}}, {}
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
        if not await self._runs_for(uid, backoff.until_next_relist()):  # the exit, as the PLEG sees it
            return False
        await self._write_running(uid)  # the source shown exited: AllContainersRestarting
        state = self._pods[uid]
        pod, restarted, ids = state.pod, state.restarted, _container_ids(state.pod)
        before = podstatus.running_status(pod, state.running_since, ids, now_rfc3339(), state.init_run(), restarted)
        status = await self._remove_all(uid, before)
        # The pod's own are to start again, each under a container ID of its own.
        for container in pod["spec"].get("containers", []):
            restarted[container["name"]] = podstatus.Restarted.shown(status, container["name"])
        ran = await self._initialize(state.pod, state.init_run().carried)
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
        self._pods[uid].inits = podstatus.InitRun(carried=carried)
        await self._patch_status(pod, {"status": status})
        return status

    async def _blocked_sync(self, uid: str, name: str, plan: backoff.BackingOff) -> None:
        """A pod worker's sync that finds container ``name`` still backing off: BackOff
        told, and CrashLoopBackOff shown if a sync before was blocked too."""
        self._back_off_blocked(self._pod(uid), name, plan.delay)
        await self._show_crash_loop(uid, name, plan)
        plan.synced = True

    def _back_off_blocked(self, pod: Obj, name: str, delay: float) -> None:
        """A sync that container ``name``'s back-off (of ``delay`` s) kept from starting it:
        BackOff told, and the sync's failure logged."""
        self.tell(pod, backoff.back_off_told(pod, name), name)
        waiting = backoff.crash_loop_state(pod, name, delay)["waiting"]
        self._containers_not_started(pod, {name: (waiting["reason"], waiting["message"])})

    async def _show_crash_loop(self, uid: str, name: str, plan: backoff.BackingOff) -> None:
        """Container ``name`` shown waiting in CrashLoopBackOff once a sync was blocked by
        its back-off: the kubelet writes a pod's status at the start of each sync, with
        the reason the sync before failed for, so the sync that starts it again shows it
        too, for a moment (written only if the container does not show it yet)."""
        restarted = self._pods[uid].restarted
        again = restarted[name]
        if plan.synced and "terminated" in again.state:
            waiting = backoff.crash_loop_state(self._pod(uid), name, plan.delay)
            restarted[name] = podstatus.Restarted(again.count, again.container_id, waiting, again.state)
            await self._write_running(uid)

    async def _write_running(self, uid: str) -> None:
        """The status of a Running pod whose containers changed since it started."""
        state = self._pods[uid]
        pod, started, inits = state.pod, state.running_since, state.inits or podstatus.NO_INITS
        status = podstatus.running_status(
            pod, started, _container_ids(pod), now_rfc3339(), inits, state.restarted, state.probing
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
        kept = pod["status"]["podIP"] if _sandbox_with_own_ip(pod) else None
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
        state = self._pods.get(pod["metadata"]["uid"])
        status, ran = body.get("status", {}), {} if state is None else state.ran_images
        for shown in [*status.get("containerStatuses", []), *status.get("initContainerStatuses", [])]:
            image = ran.get(shown["name"])
            if image is not None and shown.get("containerID"):
                reference = podstatus.image_reference(image)
                shown.update(image=reference, imageID=podstatus.image_id(reference))
        await self._statuses.patch(pod, body)

    def _running_container_statuses(self, pod: Obj, stamp: str) -> list[Obj]:
        uid = pod["metadata"]["uid"]
        state = self._pods[uid]
        statuses = podstatus.running_containers(pod, stamp, _container_ids(pod), state.restarted, state.probing)
        self._add_device_health(pod, statuses)
        return statuses

    def _add_device_health(self, pod: Obj, statuses: list[Obj]) -> None:
        """Each container's ``allocatedResourcesStatus``, noted to write only changes."""
        uid = pod["metadata"]["uid"]
        containers = {c["name"]: c for c in pod["spec"].get("containers", [])}
        for status in statuses:
            resources = self.dra.allocated_resources_status(uid, containers[status["name"]])
            if resources:
                status["allocatedResourcesStatus"] = resources
        if (state := self._pods.get(uid)) is not None:
            state.resources_status = [s.get("allocatedResourcesStatus") for s in statuses]

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
        for uid in [uid for uid, state in self._pods.items() if state.running_since]:
            if self.dra.uses_devices(uid, driver, changed):
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
                if not self._runs(uid):
                    continue
                if self.dra.has_claims(uid):
                    await self._sync_status(uid)
                if self._runs(uid):
                    self._resync_schedule.add(uid, time.monotonic())

    def _sync_spec(self, uid: str) -> None:
        """Sync the pod's spec change (``_observe_generation``) now, or once more when
        the sync under way is done."""
        state = self._pods[uid]
        if state.generation_sync is not None:
            state.generation_sync = True
        else:
            state.generation_sync = False
            self._in_background(self._observe_generation(uid), f"pod-generation-{uid}")

    def _sandbox_made(self, uid: str) -> None:
        """The pod's sandbox exists now (its init containers or its own start): ephemeral
        containers added before are started, as the kubelet's next sync starts them."""
        state = self._pods.get(uid)
        if state is None:
            return
        started = state.ephemeral
        if any(c["name"] not in started for c in state.pod["spec"].get("ephemeralContainers") or []):
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
                state = self._pods.get(uid)
                if state is None or not state.generation_sync:
                    return
                state.generation_sync = False
        finally:
            if (state := self._pods.get(uid)) is not None:
                state.generation_sync = None

    async def _sync_generation(self, uid: str) -> None:
        pod = self._seen(uid)
        if pod is None or self._ending(uid):
            return
        state = self._pods[uid]
        status = podstatus.generation_update(pod)
        started = state.ephemeral
        new = []
        if state.running_since or state.initializing:  # its sandbox exists
            new = [c for c in pod["spec"].get("ephemeralContainers") or [] if c["name"] not in started]
        if started or new:  # the sync's status: the new ones not made yet
            waiting = podstatus.POD_INITIALIZING if state.initializing else podstatus.CONTAINER_CREATING
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
        started, pod = self._pods[uid].ephemeral, self._pod(uid)
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
        known = self._pods.get(pod["metadata"]["uid"])
        started = {} if known is None else known.ephemeral
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
        state = self._pods.get(uid)
        if state is None or not state.running_since or state.ending():
            return
        pod, stamp = state.pod, state.running_since
        before = state.resources_status
        statuses = self._running_container_statuses(pod, stamp)
        if state.resources_status == before:
            return
        meta = pod["metadata"]
        try:
            await self._patch_status(pod, {"status": {"containerStatuses": statuses}})
        except ApiError as exc:
            state.resources_status = None  # try again at the next sync
            log.debug("pod %s: status update failed: %s", meta["name"], exc)

    async def _set_ended(self, uid: str, started: str, ended: podstatus.Ended) -> None:
        state = self._pods[uid]
        pod, inits = state.pod, state.inits or podstatus.NO_INITS
        status = podstatus.ended_status(pod, started, _container_ids(pod), ended, inits, state.restarted)
        if state.ephemeral:
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
        retry_in = backoff.until_next_relist()  # the containers' exit, seen at the next relist, syncs the pod once more
        while True:
            seen = state.changes if (state := self._pods.get(pod_uid)) is not None else None
            if await self.dra.release(pod_uid):
                break
            await self._pause(pod_uid, retry_in, seen)
            retry_in = backoff.jittered(backoff.SYNC_ERROR_BACKOFF_S)
        self.dra.forget(pod_uid)
        self._terminated.add(pod_uid)

    def active_uids(self) -> set[str]:
        """Pods this kubelet still runs or is still stopping (the kubelet's active pods)."""
        ended = ("Succeeded", "Failed")
        return set(self._workers) | {
            uid
            for uid, state in self._pods.items()
            if not state.pod.get("_deleted") and state.pod.get("status", {}).get("phase") not in ended
        }

    def active_pods(self) -> list[Obj]:
        return [self._pod(uid) for uid in sorted(self.active_uids()) if uid in self._pods]

    def known_pod(self, namespace: str, name: str) -> Obj | None:
        """A pod bound here that is still in the API, by name."""
        for state in self._pods.values():
            meta = state.pod["metadata"]
            if not state.pod.get("_deleted") and meta["name"] == name and meta["namespace"] == namespace:
                return state.pod
        return None

    async def process_changed(self, namespace: str, name: str, container: str, exit_code: int | None) -> None:
        """A container whose process runs beside this kubelet (a node's command-line
        driver, for its driver pod) exited with ``exit_code``, or was started again (None):
        shown in the pod's status as the kubelet shows its own containers' (terminated,
        then running with restartCount one up and the exit as lastState, with the Events
        of a start). Kept until the pod runs here, if it does not yet."""
        pod = self.known_pod(namespace, name)
        uid = "" if pod is None else pod["metadata"]["uid"]
        if pod is None or not self._pods[uid].running_since:
            self._process_changes.setdefault((namespace, name, container), []).append(exit_code)
            return
        if self._ending(uid):
            return
        spec = next((c for c in pod["spec"].get("containers", []) if c["name"] == container), None)
        if spec is None:
            return
        restarted = self._pods[uid].restarted
        now = restarted.get(container)
        if now is None:
            running = {"running": {"startedAt": self._pods[uid].running_since}}
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
        delay, self._process_back_off[key] = backoff.restart_delay(self._process_back_off.get(key), exited_at)
        pod = self.known_pod(namespace, name)
        uid = "" if pod is None else pod["metadata"]["uid"]
        if pod is None or not self._pods[uid].running_since or container not in self._pods[uid].restarted:
            await asyncio.sleep(delay)
            return
        blocked, restart_at = backoff.back_off_syncs(delay, resync_s=self.sync_frequency_s)
        plan = backoff.BackingOff(delay, [exited_at + at for at in blocked], exited_at + restart_at)
        while plan.blocked:
            await asyncio.sleep(max(0.0, plan.blocked.pop(0) - time.monotonic()))
            if self._ending(uid):
                return
            await self._blocked_sync(uid, container, plan)
        await asyncio.sleep(max(0.0, plan.restart_at - time.monotonic()))
        if not self._ending(uid):
            await self._show_crash_loop(uid, container, plan)

    async def _reconcile(self) -> None:
        """The DRA manager's reconcile, every RECONCILE_S once the pods bound here are
        all known (``DRAManager.reconcile_once``)."""
        while True:
            await asyncio.sleep(RECONCILE_S)
            if self._pods_listed():
                await self.dra.reconcile_once(self.active_uids())

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
        if self._pods[uid].rejected:
            # Refused after its containers ran through a restart: the kubelet stops them as
            # the runtime lists them, each rebuilt from its labels as the one container of
            # a pod of its own, so its Events name the pod without a resourceVersion and
            # every container as one of spec.containers (an init container too).
            meta = {k: v for k, v in pod["metadata"].items() if k != "resourceVersion"}
            about = {**pod, "metadata": meta, "spec": {"containers": running}}
        for container in running:
            self.tell(about, containerevents.stopping(container), container["name"])
        deadline = time.monotonic() + commands.pre_stop_seconds(running, commands.grace_seconds(pod))
        while (left := deadline - time.monotonic()) > 0 and not self._pod(uid).get("_deleted"):
            await self._pause(uid, left)

    def _running_containers(self, uid: str) -> list[Obj]:
        state = self._pods[uid]
        spec, restarted = state.pod["spec"], state.restarted
        running = []
        if state.running_since:
            running = [
                c
                for c in spec.get("containers", [])
                if c["name"] not in restarted or "running" in restarted[c["name"]].state
            ]
        elif early := state.started_early:
            running = [
                c for c in spec.get("containers", []) if c["name"] in early and "running" in early[c["name"]].state
            ]
        # Ephemeral ones: started once its sandbox was there, before its init containers ended maybe.
        running += [c for c in spec.get("ephemeralContainers") or [] if "running" in state.ephemeral.get(c["name"], {})]
        run = state.inits or podstatus.NO_INITS  # those started so far
        inits = enumerate((spec.get("initContainers") or [])[: len(run.spans)])
        running += reversed([c for index, c in inits if run.runs(index)])
        return running

    def _not_running(self, uid: str) -> str:
        """Its containers and sandbox are gone (its status keeps the IP it had); when they
        had started ("" if they never ran)."""
        started = ""
        if (state := self._pods.get(uid)) is not None:
            started, state.running_since = state.running_since, ""
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
        if uid in self._pods and not ended_before:
            await self._stop_containers(uid)
        started = self._not_running(uid)
        await self._release(uid)
        state = self._pods.get(uid)
        if state is None or state.pod.get("_deleted") or ended_before:
            return
        pod, now, status = state.pod, now_rfc3339(), None
        if started:
            ended, inits = podstatus.Ended.stopped(now), state.inits or podstatus.NO_INITS
            status = podstatus.ended_status(pod, started, _container_ids(pod), ended, inits, state.restarted)
            if state.ephemeral:
                status["ephemeralContainerStatuses"] = self._ephemeral_statuses(pod, now)
        elif state.inits is not None:
            stopped = failed is not None
            status = podstatus.stopped_initializing_status(pod, _container_ids(pod), state.inits, now, stopped)
            if state.ephemeral:
                status["ephemeralContainerStatuses"] = self._ephemeral_statuses(pod, now)
        elif state.shown_pending or failed is not None:
            made = state.refused is not None
            status = podstatus.never_ran_status(pod, now, made, state.started_early)
        if status is not None:
            if state.rejected:
                status = podstatus.stopped_after_rejection(status)
            with contextlib.suppress(ApiError):
                await self._patch_status(pod, {"status": {**status, **(failed or {})}})

    async def _finish_deletion(self, uid: str) -> None:
        await self._terminate(uid)  # as the kubelet: the stopped containers' terminal status, then the delete
        pod = self._seen(uid)
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
        if (state := self._pods.pop(uid, None)) is not None:
            state.forget_deadline()
        self._images.back_off.forget(uid)
        if not keep_terminated:
            self._terminated.discard(uid)
            self._statuses.forget(uid)
        self._events.forget(uid)


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


def _sandbox_shown(pod: Obj) -> bool:
    """Whether the pod's status shows its sandbox made (PodReadyToStartContainers)."""
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "PodReadyToStartContainers" and c.get("status") == "True" for c in conditions)


def _sandbox_with_own_ip(pod: Obj) -> bool:
    """The pod has a sandbox with an IP of its own (not the host's network): it runs, or
    it starts and its status shows the sandbox."""
    status = pod.get("status", {})
    made = status.get("phase") == "Running" or (status.get("phase") == "Pending" and _sandbox_shown(pod))
    return bool(made and status.get("podIP") and not pod["spec"].get("hostNetwork"))


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
