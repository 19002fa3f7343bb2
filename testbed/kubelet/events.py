"""What a kubelet's event recorder writes for an Event on a pod or its Node, decided
without I/O (``write_event`` at the end does the writing).

Kubelets record events through client-go's recorder, whose correlator shapes what the
API sees, and users read the result in `kubectl describe pod`:
- the same event again (source, object, type, reason, message) raises the count of the
  Event recorded before (a PATCH of count, lastTimestamp and message), so a pod failing
  every 10 s shows one Event counting its attempts;
- the tenth different message of one type and reason within 10 minutes is folded into
  an Event of its own, "(combined from similar events): <message>", counted up from then
  on, so a driver whose error text changes each time does not flood the pod with Events;
- a spam filter per object and type lets 25 events through at once and then one every
  5 minutes; one held back still counts, so the next written count jumps.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.kubeapi import ApiError, KubeClient, Obj, now_rfc3339, path_for

SPAM_BURST = 25
SPAM_REFILL_PER_S = 1 / 300
SIMILAR_MESSAGES = 10
"""Different messages of one type and reason from which on they are combined."""
SIMILAR_WINDOW_S = 600
"""A type and reason quiet for this long starts counting its messages afresh."""
COMBINED = "(combined from similar events): "


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


Key = tuple[str, str, str | None]
"""An event's type, reason and message (None: the combined Event of that type and
reason): the same again is counted on one Event."""


@dataclass(frozen=True)
class Write:
    """Create ``body`` (``name`` is None) or patch the Event ``name`` with it."""

    name: str | None
    body: Obj
    key: Key = field(default=("", "", None), compare=False)
    """Which Event this is, for `EventRecorder.recreated`."""


@dataclass
class _Recorded:
    name: str
    count: int
    first: str
    message: str = ""
    written: bool = False
    """The Event exists in the API (the first ones may all have been held back)."""


@dataclass
class _Similar:
    """The messages one type and reason had lately (client-go's aggregate record)."""

    last: float
    messages: set[str] = field(default_factory=set)


@dataclass
class _PodEvents:
    recorded: dict[Key, _Recorded] = field(default_factory=dict)
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    similar: dict[tuple[str, str], _Similar] = field(default_factory=dict)

    def correlate(self, kind: str, reason: str, message: str, now: float) -> tuple[Key, str]:
        """The Event this one is counted on, and the message it writes there."""
        similar = self.similar.get((kind, reason))
        if similar is None or now - similar.last > SIMILAR_WINDOW_S:
            similar = self.similar[(kind, reason)] = _Similar(now)
        similar.last = now
        similar.messages.add(message)
        if len(similar.messages) < SIMILAR_MESSAGES:
            return (kind, reason, message), message
        similar.messages.pop()  # any one, as client-go drops any: the set stays below the bar
        return (kind, reason, None), COMBINED + message


class EventRecorder:
    def __init__(self, host: str, clock: Callable[[], float] = time.monotonic):
        self.host = host
        self.clock = clock
        self._pods: dict[str, _PodEvents] = {}

    def record(self, pod: Obj, kind: str, reason: str, message: str, stamp: str) -> Write | None:
        """The write for this event on ``pod`` (or on a Node: an object whose ``kind``
        says so), ``stamp`` being now (RFC 3339); None if held back."""
        events = self._pods.setdefault(pod["metadata"]["uid"], _PodEvents())
        now = self.clock()
        key, message = events.correlate(kind, reason, message, now)
        seen = events.recorded.get(key)
        if seen is None:
            seen = events.recorded[key] = _Recorded(_event_name(pod), 0, stamp)
        seen.count += 1
        seen.message = message
        if not events.buckets.setdefault(kind, _Bucket(now)).take(now):
            return None
        if seen.written:
            return Write(seen.name, {"count": seen.count, "lastTimestamp": stamp, "message": message[:1024]}, key)
        seen.written = True
        return Write(None, self._event(pod, key, seen, stamp), key)

    def recreated(self, pod: Obj, patch: Write, stamp: str) -> Write | None:
        """The Event to create when the one ``patch`` was for is gone (Events expire
        after an hour): under the same name, with the count so far. None if the pod was
        forgotten meanwhile (it went while the patch was on its way)."""
        events = self._pods.get(pod["metadata"]["uid"])
        seen = events.recorded.get(patch.key) if events is not None else None
        if seen is None:
            return None
        return Write(None, self._event(pod, patch.key, seen, stamp), patch.key)

    def forget(self, pod_uid: str) -> None:
        self._pods.pop(pod_uid, None)

    def _event(self, pod: Obj, key: Key, seen: _Recorded, stamp: str) -> Obj:
        meta = pod["metadata"]
        kind, reason, _ = key
        if pod.get("kind") == "Node":  # the kubelet's node reference: no namespace, no apiVersion
            involved = {"kind": "Node", "name": meta["name"], "uid": meta["uid"]}
        else:
            involved = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            }
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": seen.name, "namespace": event_namespace(pod)},
            "involvedObject": involved,
            "reason": reason,
            "message": seen.message[:1024],
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


def event_namespace(obj: Obj) -> str:
    """Where an Event on ``obj`` goes: its namespace, or "default" for a Node."""
    return str(obj["metadata"].get("namespace") or "default")


async def write_event(
    client: KubeClient, recorder: EventRecorder, obj: Obj, kind: str, reason: str, message: str
) -> None:
    """Record an Event on ``obj`` as the kubelet's recorder does: created, counted up on the
    one recorded before, or created again under its name if it expired meanwhile."""
    namespace, stamp = event_namespace(obj), now_rfc3339()
    write = recorder.record(obj, kind, reason, message, stamp)
    if write is None:
        return
    events = path_for("v1", "events", namespace=namespace)
    if write.name is None:
        await client.create(events, write.body)
        return
    try:
        await client.patch(path_for("v1", "events", write.name, namespace), write.body, "strategic")
    except ApiError as exc:
        if not exc.not_found:
            raise
        again = recorder.recreated(obj, write, stamp)
        if again is not None:
            await client.create(events, again.body)
