"""When each running pod is synced again: as the kubelet's pod workers requeue each pod
after its sync, its own ``syncFrequency`` later, jittered, so a node's pods are not all
synced in the same instant (nor a fleet's)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable


class ResyncSchedule:
    def __init__(self, every_s: float, jitter: float, rand: Callable[[], float] = random.random):
        """A pod is due ``every_s`` plus up to ``jitter`` times that after it was added."""
        self.every_s = every_s
        self.jitter = jitter
        self.rand = rand
        self._at: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        """(when, pod UID); entries whose time no longer matches ``_at`` are stale."""

    def add(self, uid: str, now: float) -> None:
        """(Re)schedule the pod: synced now, due next after the interval."""
        when = now + self.every_s * (1 + self.jitter * self.rand())
        self._at[uid] = when
        heapq.heappush(self._heap, (when, uid))

    def remove(self, uid: str) -> None:
        self._at.pop(uid, None)

    def next_at(self) -> float | None:
        """When the earliest pod is due; None with none scheduled."""
        while self._heap and self._at.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[str]:
        """The pods due by ``now``, taken off the schedule (``add`` them back once synced)."""
        found = []
        while (when := self.next_at()) is not None and when <= now:
            _, uid = heapq.heappop(self._heap)
            del self._at[uid]
            found.append(uid)
        return found

    def __len__(self) -> int:
        return len(self._at)
