"""What a kubelet's event recorder writes for an Event on a pod, decided without I/O.

Kubelets record events through client-go's recorder, whose correlator shapes what the
API sees, and users read the result in `kubectl describe pod`:
- the same event again (source, object, type, reason, message) raises the count of the
  Event recorded before (a PATCH of count, lastTimestamp and message), so a pod failing
  every 10 s shows one Event counting its attempts;
- a spam filter per object and type lets 25 events through at once and then one every
  5 minutes; one held back still counts, so the next written count jumps.
(Its folding of more than 10 similar events with different messages is not done here.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.kubeapi import Obj

SPAM_BURST = 25
SPAM_REFILL_PER_S = 1 / 300


@dataclass
class _Bucket:
    """client-go's token bucket: ``SPAM_BURST`` at most, refilled continuously."""

    at: float
    tokens: float = SPAM_BURST

    def take(self, now: float) -> bool:
        self.tokens = min(SPAM_BURST, self.tokens + (now - self.at) * SPAM_REFILL_PER_S)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(frozen=True)
class Write:
    """Create ``body`` (``name`` is None) or patch the Event ``name`` with it."""

    name: str | None
    body: Obj


@dataclass
class _Recorded:
    name: str
    count: int
    first: str
    written: bool = False
    """The Event exists in the API (the first ones may all have been held back)."""


Key = tuple[str, str, str]
"""An event's type, reason and message: the same again is counted on one Event."""


@dataclass
class _PodEvents:
    recorded: dict[Key, _Recorded] = field(default_factory=dict)
    buckets: dict[str, _Bucket] = field(default_factory=dict)


class EventRecorder:
    def __init__(self, host: str, clock: Callable[[], float] = time.monotonic):
        self.host = host
        self.clock = clock
        self._pods: dict[str, _PodEvents] = {}

    def record(self, pod: Obj, kind: str, reason: str, message: str, stamp: str) -> Write | None:
        """The write for this event (``stamp``: now, RFC 3339), or None if held back."""
        events = self._pods.setdefault(pod["metadata"]["uid"], _PodEvents())
        key = (kind, reason, message)
        seen = events.recorded.get(key)
        if seen is None:
            seen = events.recorded[key] = _Recorded(_event_name(pod), 0, stamp)
        seen.count += 1
        now = self.clock()
        if not events.buckets.setdefault(kind, _Bucket(now)).take(now):
            return None
        if seen.written:
            return Write(seen.name, {"count": seen.count, "lastTimestamp": stamp, "message": message[:1024]})
        seen.written = True
        return Write(None, self._event(pod, key, seen, stamp))

    def recreated(self, pod: Obj, kind: str, reason: str, message: str, stamp: str) -> Write:
        """The Event to create when the one to patch is gone (Events expire after an
        hour): under a new name, with the count so far."""
        events = self._pods.setdefault(pod["metadata"]["uid"], _PodEvents())
        key = (kind, reason, message)
        seen = events.recorded.setdefault(key, _Recorded("", 1, stamp))
        seen.name, seen.written = _event_name(pod), True
        return Write(None, self._event(pod, key, seen, stamp))

    def forget(self, pod_uid: str) -> None:
        self._pods.pop(pod_uid, None)

    def _event(self, pod: Obj, key: Key, seen: _Recorded, stamp: str) -> Obj:
        meta = pod["metadata"]
        kind, reason, message = key
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": seen.name, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "count": seen.count,
            "firstTimestamp": seen.first,
            "lastTimestamp": stamp,
            "source": {"component": "kubelet", "host": self.host},
            "reportingComponent": "kubelet",
            "reportingInstance": self.host,
        }


def _event_name(pod: Obj) -> str:
    return f"{pod['metadata']['name']}.{uuid.uuid4().hex[:16]}"
