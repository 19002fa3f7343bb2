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

The work is in layers, each class built on the one before: podcore.py (each pod's state
and how it is shown: status writes, Events, probes, spec changes, containers stopped,
claims released), initcontainers.py (init containers and sidecars), restarts.py
(containers started again: restart rules, back-off, a changed image, a restart in
place) and this module's PodManager (the pod watch, admission, a pod's run from its
start to its end, deletion).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Collection, Mapping

from testbed.http11 import TransportError
from testbed.keys import CONTAINER_ENV_ANNOTATION
from testbed.kubeapi import (
    ApiError,
    Obj,
    now_rfc3339,
    parse_rfc3339,
    path_for,
)
from testbed.kubelet import admission, backoff, commands, containerevents, metrics, podstatus, probes
from testbed.kubelet.containerevents import Told
from testbed.kubelet.dra import PREPARE_FAILED, StartFailed
from testbed.kubelet.node import node_object
from testbed.kubelet.podcore import (
    SANDBOX_FAILED,
    container_ids,
    sandbox_shown,
    sandbox_with_own_ip,
    start_time,
    started_now,
)
from testbed.kubelet.podstate import PodState
from testbed.kubelet.restarts import ContainerRestarts
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RECONCILE_S = 60.0
"""How often claims of pods that are gone are looked for, as the kubelet's DRA manager does."""
CREATE_CONTAINER_ERROR = "CreateContainerError"
DEADLINE_EXCEEDED = "DeadlineExceeded"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
"""The kubelet's words (its active deadline handler) for a pod past activeDeadlineSeconds."""


class PodManager(ContainerRestarts):
    """The pods bound to this node, each taken by a worker of its own from its admission
    to its end; what the layers below it do is theirs."""

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
        if before is None and sandbox_with_own_ip(pod):
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

    def _arm_deadline(self, uid: str) -> None:
        """Fail the pod once its activeDeadlineSeconds passed, counted from its startTime as
        the kubelet counts it (from now for a pod new here)."""
        state = self._pods[uid]
        state.forget_deadline()
        seconds = _deadline(state.pod)
        if seconds is None:
            return
        began = parse_rfc3339(start_time(state.pod))
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
            state.running_since = start_time(pod)
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
        ids, restarted = container_ids(pod), self._pods[uid].restarted
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
        if status.get("phase") != "Pending" or not sandbox_shown(pod) or not self.dra.prepared_before_restart(pod):
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
        status = podstatus.running_status(pod, stamp, container_ids(pod), now_rfc3339(), inits, restarted, probing)
        if exited and commands.run_seconds(pod) == 0:
            # All exited and none restarts: the kubelet keeps the phase it wrote before
            # until its pod worker has stopped the pod (then Succeeded or Failed).
            status["phase"] = "Pending"
        self._add_device_health(pod, status["containerStatuses"])
        status.update(startTime=start_time(pod, stamp), **addresses)
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
            probed_ids = container_ids(pod)
            self._in_background(self._follow_probes(meta["uid"], changes, probed_ids), f"pod-probes-{meta['uid']}")

    def _exited_at_once(self, pod: Obj, started: str, besides: Collection[str] = ()) -> set[str]:
        """The pod's containers whose command ends as it starts, noted exited (restart
        count 0): the kubelet's first status after their start comes from the PLEG relist
        after it, which finds them exited already, so they never show running (or ready).
        ``besides``: those started before (``started_now`` noted them)."""
        uid = pod["metadata"]["uid"]
        restarted = self._pods[uid].restarted
        exited = set()
        for container in pod["spec"].get("containers", []):
            name = container["name"]
            if name in besides:
                exited |= {name} if "terminated" in restarted[name].state else set()
            elif commands.exits_at_once(pod, container):
                restarted[name] = started_now(pod, container, started)
                exited.add(name)
        return exited

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
            status = podstatus.ended_status(pod, started, container_ids(pod), ended, inits, state.restarted)
            if state.ephemeral:
                status["ephemeralContainerStatuses"] = self._ephemeral_statuses(pod, now)
        elif state.inits is not None:
            stopped = failed is not None
            status = podstatus.stopped_initializing_status(pod, container_ids(pod), state.inits, now, stopped)
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


def _deadline(pod: Obj) -> float | None:
    seconds = pod["spec"].get("activeDeadlineSeconds")
    return None if seconds is None else float(seconds)


def _images_shown(pod: Obj) -> dict[str, str]:
    """By container name: the image each container made runs, as the pod's status shows it."""
    status = pod.get("status", {})
    shown = [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]
    return {s["name"]: s["image"] for s in shown if s.get("containerID") and s.get("image")}


def _ephemeral_shown(pod: Obj) -> dict[str, Obj]:
    """By name: the state of each ephemeral container made, as the pod's status shows it."""
    shown = pod.get("status", {}).get("ephemeralContainerStatuses") or []
    return {s["name"]: s.get("state") or {} for s in shown if s.get("containerID")}


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
