"""A pod's init containers, run in order before its own, and its sidecars, as kubelet
v1.37 runs them (pods.py tells the whole)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from testbed.kubeapi import (
    Obj,
    now_rfc3339,
    parse_rfc3339,
    rfc3339,
)
from testbed.kubelet import backoff, commands, containerevents, metrics, podstatus
from testbed.kubelet.podcore import PodCore, container_ids, start_time


class InitContainers(PodCore):
    """Init containers and sidecars: each run to its end (``sleep N``), started again on
    failure under the pod's restart policy, and shown in the pod's status meanwhile."""

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
        now = run.carried.get(name) or podstatus.Restarted(0, container_ids(state.pod)[name], {}, {})
        ended = podstatus.Ended.exit_status(code, now_rfc3339())
        exited = podstatus.terminated_state(now.container_id, run.spans[-1][0], ended)
        run = state.inits = run.failed(podstatus.Restarted(now.count, now.container_id, exited, now.last))
        await self._write_initializing(uid)
        latest = state.pod
        before = podstatus.initializing_status(
            latest, start_time(latest), container_ids(latest), run, {}, now_rfc3339()
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
            probed = {name: container_ids(self._pod(uid))[name]}
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
            pod, container_ids(pod), self._pods[uid].init_run(), now_rfc3339()
        )
        await self._patch_status(pod, {"status": status})

    async def _retry_init(self, uid: str, container: Obj, code: int) -> podstatus.InitRun | None:
        """An init container exited with ``code``: if it is not to be started again
        (``commands.should_restart``: under restartPolicy Never, say), the run with it
        failed; else, as the kubelet, it is started again, at once the first time, then
        after a back-off (``backoff.restart_delay``, ``backoff.back_off_syncs``; shown exited meanwhile),
        the pod Pending, until the pod is deleted (None). Its command ends alike each
        time, so it never gets further."""
        state, name = self._pods[uid], container["name"]
        pod, run = state.pod, state.init_run()
        first_id = container_ids(pod)[name]
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
