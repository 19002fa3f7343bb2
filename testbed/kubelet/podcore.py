"""What every part of the fake kubelet's pod handling stands on (pods.py tells the whole):
each pod's state (podstate.py), its status writes and the Events told of it, its probes,
the changes to its spec the kubelet observes, its containers stopped and its claims
released."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from testbed.config import KUBELET_SYNC_FREQUENCY_S
from testbed.kubeapi import (
    ApiError,
    KubeClient,
    Obj,
    WatchPosition,
    now_rfc3339,
)
from testbed.kubelet import backoff, commands, containerevents, metrics, podstatus, probes
from testbed.kubelet.containerevents import Told
from testbed.kubelet.dra import DRAManager, StartFailed
from testbed.kubelet.events import EventQueue, EventRecorder
from testbed.kubelet.node import NodeSpec
from testbed.kubelet.plugins import PluginManager
from testbed.kubelet.podnetwork import AddressesExhausted, PodAddresses
from testbed.kubelet.podstate import PodState
from testbed.kubelet.resync import ResyncSchedule
from testbed.kubelet.statuswriter import StatusWriter

log = logging.getLogger(__name__)
T = TypeVar("T")

CREATING_SHOWN_AFTER_S = 1.0
"""A start (the claims' prepare) that takes longer shows the pod Pending with its
containers ContainerCreating, as the kubelet's status at the start of its sync does; a
quicker one goes straight to Running (the kubelet's ContainerCreating then lasts a
fraction of a second), saving one status write per pod."""
SANDBOX_FAILED = "FailedCreatePodSandBox"


class PodCore:
    """The state of the node's pods, and the writes that show it; PodManager (pods.py)
    runs the pods on top of it."""

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
                    self._pods[uid].started_early[name] = started_now(pod, containers[name])
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

    async def _write_initializing(self, uid: str, waits: Mapping[str, tuple[str, str]] | None = None) -> None:
        """``waits``: containers not started, with the reason and message they wait for."""
        state = self._pods[uid]
        latest = state.pod
        addresses = self._addresses_of(latest)
        status = podstatus.initializing_status(
            latest,
            start_time(latest),
            container_ids(latest),
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
            ids, now = container_ids(pod), now_rfc3339()
            status = podstatus.initializing_status(
                pod, start_time(pod), ids, inits, addresses, now, probing, waits=refused, started_early=early
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
        ids, carried = container_ids(pod), {}
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
            pod, started, container_ids(pod), now_rfc3339(), inits, state.restarted, state.probing
        )
        self._add_device_health(pod, status["containerStatuses"])
        status["startTime"] = start_time(pod, started)
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
        kept = pod["status"]["podIP"] if sandbox_with_own_ip(pod) else None
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
        statuses = podstatus.running_containers(pod, stamp, container_ids(pod), state.restarted, state.probing)
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
        started[container["name"]] = podstatus.terminated_state(ephemeral_id(pod, container), began, ended)
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
            container_id = ephemeral_id(pod, container)
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
        status = podstatus.ended_status(pod, started, container_ids(pod), ended, inits, state.restarted)
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

    def known_pod(self, namespace: str, name: str) -> Obj | None:
        """A pod bound here that is still in the API, by name."""
        for state in self._pods.values():
            meta = state.pod["metadata"]
            if not state.pod.get("_deleted") and meta["name"] == name and meta["namespace"] == namespace:
                return state.pod
        return None

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


def start_time(pod: Obj, default: str | None = None) -> str:
    """When the kubelet first took the pod on: kept from its first status write on."""
    return str(pod.get("status", {}).get("startTime") or default or now_rfc3339())


def started_now(pod: Obj, container: Obj, at: str | None = None) -> podstatus.Restarted:
    """A container the runtime starts ``at`` (default: now), as the next relist finds it:
    running, or exited already if its command ends as it starts."""
    name, at = container["name"], at or now_rfc3339()
    container_id = container_ids(pod)[name]
    if commands.exits_at_once(pod, container):
        ended = podstatus.Ended.exit_status(commands.exit_code(container), now_rfc3339())
        return podstatus.Restarted(0, container_id, podstatus.terminated_state(container_id, at, ended), {})
    return podstatus.Restarted(0, container_id, {"running": {"startedAt": at}}, {})


def container_ids(pod: Obj) -> dict[str, str]:
    uid, spec = pod["metadata"]["uid"], pod["spec"]
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    return {c["name"]: f"dra-testbed://{uid}-{c['name']}" for c in containers}


def ephemeral_id(pod: Obj, container: Obj) -> str:
    return f"dra-testbed://{pod['metadata']['uid']}-{container['name']}"


def sandbox_shown(pod: Obj) -> bool:
    """Whether the pod's status shows its sandbox made (PodReadyToStartContainers)."""
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "PodReadyToStartContainers" and c.get("status") == "True" for c in conditions)


def sandbox_with_own_ip(pod: Obj) -> bool:
    """The pod has a sandbox with an IP of its own (not the host's network): it runs, or
    it starts and its status shows the sandbox."""
    status = pod.get("status", {})
    made = status.get("phase") == "Running" or (status.get("phase") == "Pending" and sandbox_shown(pod))
    return bool(made and status.get("podIP") and not pod["spec"].get("hostNetwork"))
