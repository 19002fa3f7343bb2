"""Containers started again, as kubelet v1.37 starts them (pods.py tells the whole): by
their restart rules or policy after the back-off, at once when their image changed,
or every container of the pod at once (a restart in place); and the processes that
run beside the kubelet (a synthetic node's driver pods), told of as containers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

from testbed.kubeapi import (
    Obj,
    now_rfc3339,
)
from testbed.kubelet import backoff, commands, podstatus
from testbed.kubelet.containerevents import Told
from testbed.kubelet.initcontainers import InitContainers
from testbed.kubelet.podcore import container_ids


class ContainerRestarts(InitContainers):
    """A running pod's containers that end, and what starts them again."""

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
        ids, restarted = container_ids(pod), self._pods[uid].restarted
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
        pod, first_id, now = self._pod(uid), container_ids(pod)[name], now_rfc3339()
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
        pod, restarted, ids = state.pod, state.restarted, container_ids(state.pod)
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
            now, ids = restarted[container["name"]], container_ids(pod)
            restarted[container["name"]] = now.started_again(f"{ids[container['name']]}-{now.count}", now_rfc3339())
            self._probe_again(uid, container, restarted[container["name"]].container_id)
        await self._write_running(uid)
        return not self._ending(uid)

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
            now = podstatus.Restarted(0, container_ids(pod)[container], running, {})
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
            container_id = f"{container_ids(pod)[container]}-{count}"
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
