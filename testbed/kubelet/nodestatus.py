"""The status a kubelet keeps writing to its Node, decided without I/O.

Every 10 s (``nodeStatusUpdateFrequency``) a kubelet works out its Node's status from
the Node as it last saw it, and patches it when the two differ (heartbeat times aside)
or when ``nodeStatusReportFrequency`` (5 minutes) has passed since its last report. So a
Node that the node lifecycle controller marked Unknown while its kubelet was silent (a
stalled host, a control-plane outage) is Ready again within 10 s of the kubelet being
heard from, and an idle node still reports every 5 minutes. After a report that changed
something, or the first one, the next periodic report comes 2.5-7.5 minutes later, so
nodes that started together do not report together; after that, every 5 minutes.

The patch is what the kubelet's two-way strategic merge patch holds: the fields that
changed, conditions merged by type with the list's order given, addresses replaced whole.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from testbed.kubeapi import Obj

STATUS_UPDATE_S = 10.0
STATUS_REPORT_S = 300.0
STATUS_UPDATE_TRIES = 5
"""Tries per status sync (``nodeStatusUpdateRetry``); a retry reads the Node afresh."""


def refreshed(observed: Obj, own: Obj, stamp: str) -> Obj:
    """The status the kubelet would write now: ``observed`` (its Node's status as last
    seen) with the kubelet's own fields (``own``) put over it. Each of its conditions is
    replaced whole, heartbeat ``stamp``, keeping its transition time unless its status
    changed; others' conditions and fields stay as they are."""
    status = dict(observed)
    for key, value in own.items():
        if key == "conditions":
            continue
        before = observed.get(key)
        status[key] = {**before, **value} if isinstance(value, dict) and isinstance(before, dict) else value
    conditions = list(observed.get("conditions") or [])
    where = {condition.get("type"): i for i, condition in enumerate(conditions)}
    for mine in own.get("conditions", []):
        i = where.get(mine["type"])
        before = conditions[i] if i is not None else None
        kept = before is not None and before.get("status") == mine["status"] and before.get("lastTransitionTime")
        condition = dict(mine, lastHeartbeatTime=stamp, lastTransitionTime=kept or stamp)
        if i is None:
            conditions.append(condition)
        else:
            conditions[i] = condition
    status["conditions"] = conditions
    return status


def changed(observed: Obj, desired: Obj) -> bool:
    """Whether ``desired`` differs from ``observed`` in more than heartbeat times."""

    def without_heartbeats(status: Obj) -> list[Obj]:
        conditions = status.get("conditions") or []
        return sorted(
            ({k: v for k, v in c.items() if k != "lastHeartbeatTime"} for c in conditions),
            key=lambda c: str(c.get("type")),
        )

    if without_heartbeats(observed) != without_heartbeats(desired):
        return True
    rest = {k: v for k, v in observed.items() if k != "conditions"}
    return rest != {k: v for k, v in desired.items() if k != "conditions"}


def status_patch(observed: Obj, desired: Obj) -> Obj:
    """The strategic merge patch that takes ``observed`` to ``desired``."""
    patch: Obj = {}
    for key, value in desired.items():
        before = observed.get(key)
        if key == "conditions" or before == value:
            continue
        if key == "addresses" and before:
            patch[key] = [*value, {"$patch": "replace"}]  # a merge by type would keep stale ones
        elif isinstance(value, dict) and isinstance(before, dict):
            patch[key] = {k: v for k, v in value.items() if before.get(k) != v} | {
                k: None for k in before if k not in value
            }
        else:
            patch[key] = value
    earlier = {c.get("type"): c for c in observed.get("conditions") or []}
    conditions = []
    for condition in desired.get("conditions") or []:
        before = earlier.get(condition["type"], {})
        diff = {k: v for k, v in condition.items() if before.get(k) != v}
        if diff:
            conditions.append({**diff, "type": condition["type"]})
    if conditions:
        patch["$setElementOrder/conditions"] = [{"type": c["type"]} for c in desired["conditions"]]
        patch["conditions"] = conditions
    return {"status": patch}


TRANSITION_EVENTS = {
    "MemoryPressure": ("NodeHasInsufficientMemory", "NodeHasSufficientMemory"),
    "DiskPressure": ("NodeHasDiskPressure", "NodeHasNoDiskPressure"),
    "PIDPressure": ("NodeHasInsufficientPID", "NodeHasSufficientPID"),
    "Ready": ("NodeReady", "NodeNotReady"),
}
"""The Event a kubelet records when it sets one of its conditions to True, or to
anything else."""


def transition_events(observed: Obj, desired: Obj) -> list[str]:
    """The reasons of the Events the kubelet records on its Node for this write, in its
    setters' order: one per condition whose status it changes, and per pressure condition
    it adds (Ready is added without one)."""
    before = {c.get("type"): c.get("status") for c in observed.get("conditions") or []}
    after = {c.get("type"): c.get("status") for c in desired.get("conditions") or []}
    reasons = []
    for kind, (when_true, otherwise) in TRANSITION_EVENTS.items():
        if kind not in after or before.get(kind) == after[kind] or (kind == "Ready" and kind not in before):
            continue
        reasons.append(when_true if after[kind] == "True" else otherwise)
    return reasons


class ReportClock:
    """When the next periodic status report is due."""

    def __init__(self, rand: Callable[[], float] = random.random):
        self.rand = rand
        self.last: float | None = None
        self.delay_s = 0.0

    def due(self, now: float) -> bool:
        return self.last is None or now - self.last >= STATUS_REPORT_S + self.delay_s

    def reported(self, now: float, changed: bool) -> None:
        """A report was written at ``now``; ``changed``: it changed the status (not only
        heartbeats), which, as the first report, spreads the next one by up to +-50%."""
        self.delay_s = STATUS_REPORT_S * (self.rand() - 0.5) if changed or self.last is None else 0.0
        self.last = now
