"""When the kubelet's pod workers sync a pod again, and the crash-loop back-off of a
container that exited (kubelet v1.37's figures and words). Pure: no I/O, no clock of its
own (times are given, or drawn from ``random`` for the jitter)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from testbed.config import KUBELET_SYNC_FREQUENCY_S
from testbed.kubeapi import Obj
from testbed.kubelet.containerevents import Told

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


@dataclass
class BackingOff:
    """A container that exited, until the pod worker's sync that starts it again: the
    syncs before that its back-off blocks (``back_off_syncs``, as monotonic times)."""

    delay: float
    blocked: list[float]
    restart_at: float
    synced: bool = False
    """Whether a sync was blocked already (the next shows CrashLoopBackOff)."""

    def next_sync(self) -> float:
        return self.blocked[0] if self.blocked else self.restart_at


def jittered(seconds: float) -> float:
    return seconds * (1 + JITTER * random.random())


def until_next_relist() -> float:
    """The PLEG lists containers on a fixed period: what changed now is seen within one."""
    return PLEG_RELIST_S * random.random()


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
    message = f"back-off {go_duration(delay)} restarting failed container={name} pod={_described(pod)}"
    return {"waiting": {"reason": "CrashLoopBackOff", "message": message}}


def _described(pod: Obj) -> str:
    """As the kubelet names a pod in its messages (format.Pod)."""
    meta = pod["metadata"]
    return f"{meta['name']}_{meta['namespace']}({meta['uid']})"


def go_duration(seconds: float) -> str:
    """As Go prints a whole number of seconds: 10s, 1m20s, 5m0s."""
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"
