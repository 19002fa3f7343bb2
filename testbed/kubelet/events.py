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

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.http11 import TransportError
from testbed.kubeapi import ApiError, KubeClient, Obj, now_rfc3339, path_for
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

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


Key = tuple[str, str, str | None, str]
"""An event's type, reason, message (None: the combined Event of that type and reason)
and the container it is about (its field path, "" for the pod or the combined Event):
the same again is counted on one Event."""


@dataclass(frozen=True)
class Write:
    """Create ``body`` (``name`` is None) or patch the Event ``name`` with it."""

    name: str | None
    body: Obj
    key: Key = field(default=("", "", None, ""), compare=False)
    """Which Event this is, for `EventRecorder.recreated`."""


@dataclass
class _Recorded:
    name: str
    count: int
    first: str
    message: str = ""
    about: Obj = field(default_factory=dict)
    """The involved object: the pod (or Node, or container) as it was when first told of."""
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

    def correlate(self, kind: str, reason: str, message: str, path: str, now: float) -> tuple[Key, str]:
        """The Event this one is counted on, and the message it writes there: messages are
        told apart per container, but counted as similar across the pod's containers."""
        similar = self.similar.get((kind, reason))
        if similar is None or now - similar.last > SIMILAR_WINDOW_S:
            similar = self.similar[(kind, reason)] = _Similar(now)
        similar.last = now
        similar.messages.add(message)
        if len(similar.messages) < SIMILAR_MESSAGES:
            return (kind, reason, message, path), message
        similar.messages.pop()  # any one, as client-go drops any: the set stays below the bar
        return (kind, reason, None, ""), COMBINED + message


class EventRecorder:
    def __init__(self, host: str, clock: Callable[[], float] = time.monotonic):
        self.host = host
        self.clock = clock
        self._pods: dict[str, _PodEvents] = {}
        self._last_name_ns = 0

    def record(self, pod: Obj, kind: str, reason: str, message: str, stamp: str, field_path: str = "") -> Write | None:
        """The write for this event on ``pod`` (or on a Node: an object whose ``kind``
        says so), or on one of its containers (``field_path``, as ``containerevents``
        names it), ``stamp`` being now (RFC 3339); None if held back."""
        events = self._pods.setdefault(pod["metadata"]["uid"], _PodEvents())
        now = self.clock()
        key, message = events.correlate(kind, reason, message, field_path, now)
        seen = events.recorded.get(key)
        if seen is None:
            seen = events.recorded[key] = _Recorded(self._event_name(pod), 0, stamp, about=_reference(pod, field_path))
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

    def _event_name(self, obj: Obj) -> str:
        """As client-go names an Event: the object's name and the time in hex nanoseconds
        (made unique here: two Events of one start may share a clock reading)."""
        self._last_name_ns = max(time.time_ns(), self._last_name_ns + 1)
        return f"{obj['metadata']['name']}.{self._last_name_ns:x}"

    def _event(self, pod: Obj, key: Key, seen: _Recorded, stamp: str) -> Obj:
        kind, reason, *_ = key
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": seen.name, "namespace": event_namespace(pod)},
            "involvedObject": seen.about,
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


def _reference(obj: Obj, field_path: str) -> Obj:
    """The involved object as the kubelet refers to it: a pod (or its container) by its
    name, UID and resourceVersion then; its Node by name and UID (nodeRefWithUID)."""
    meta = obj["metadata"]
    if obj.get("kind") == "Node":
        return {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}
    involved = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
    }
    if meta.get("resourceVersion"):
        involved["resourceVersion"] = meta["resourceVersion"]
    if field_path:
        involved["fieldPath"] = field_path
    return involved


def event_namespace(obj: Obj) -> str:
    """Where an Event on ``obj`` goes: its namespace, or "default" for a Node."""
    return str(obj["metadata"].get("namespace") or "default")


async def write_event(
    client: KubeClient,
    recorder: EventRecorder,
    obj: Obj,
    kind: str,
    reason: str,
    message: str,
    field_path: str = "",
) -> None:
    """Record an Event on ``obj`` as the kubelet's recorder does: created, counted up on the
    one recorded before, or created again under its name if it expired meanwhile."""
    stamp = now_rfc3339()
    write = recorder.record(obj, kind, reason, message, stamp, field_path)
    if write is not None:
        await _send(client, recorder, obj, write, stamp)


async def _send(client: KubeClient, recorder: EventRecorder, obj: Obj, write: Write, stamp: str) -> None:
    namespace = event_namespace(obj)
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


class EventQueue:
    """Events told now and written behind, one at a time in the order told, as the
    kubelet's event broadcaster sends them: a pod's start does not wait for its Events,
    and an Event counted up is never patched before it was created."""

    def __init__(self, client: KubeClient, recorder: EventRecorder):
        self.client, self.recorder = client, recorder
        self._pending: deque[tuple[Obj, Write, str]] = deque()
        self._sender: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def tell(self, obj: Obj, kind: str, reason: str, message: str, field_path: str = "") -> None:
        stamp = now_rfc3339()
        write = self.recorder.record(obj, kind, reason, message, stamp, field_path)
        if write is None:
            return
        self._pending.append((obj, write, stamp))
        self._idle.clear()
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all(), name=f"events-{self.recorder.host}")

    async def _send_all(self) -> None:
        try:
            while self._pending:
                obj, write, stamp = self._pending.popleft()
                try:
                    await _send(self.client, self.recorder, obj, write, stamp)
                except (ApiError, TransportError) as exc:  # the broadcaster drops it after its retries too
                    log.debug("could not record event %s on %s: %s", write.key[1], obj["metadata"]["name"], exc)
                except Exception:  # one Event's fault must not keep the rest from being written
                    log.exception("recording event %s on %s failed", write.key[1], obj["metadata"]["name"])
        finally:
            self._sender = None
            self._idle.set()

    async def sent(self) -> None:
        """Until every Event told so far was written (or given up on)."""
        await self._idle.wait()

    async def close(self) -> None:
        """Stop writing: what is left is dropped, as with a kubelet that stops."""
        self._pending.clear()
        await cancel_and_wait(self._sender)
