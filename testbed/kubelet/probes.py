"""How a container's startup and readiness probes go, as the kubelet's prober runs them
against a workload that answers them: when each passes. Pure."""

from __future__ import annotations

import math

from testbed.kubeapi import Obj


def probe_plan(pod: Obj) -> tuple[dict[str, str], list[tuple[float, str, str | None]]]:
    """How the pod's containers' probes go, as the kubelet's prober runs them and a
    workload that answers passes them: what each container waits for as it starts
    ("starting": its startup probe, which holds back its readiness probe; "unready": its
    readiness probe), and when (seconds after it started) that changes (None: ready).
    Liveness probes pass, and change nothing."""
    waiting: dict[str, str] = {}
    changes: list[tuple[float, str, str | None]] = []
    for container in pod["spec"].get("containers", []):
        name, startup, readiness = container["name"], container.get("startupProbe"), container.get("readinessProbe")
        started_after = 0.0
        if startup:
            started_after = _passes_after(startup)
            waiting[name] = "starting"
            changes.append((started_after, name, "unready" if readiness else None))
        if readiness:
            waiting.setdefault(name, "unready")
            changes.append((_passes_after(readiness, started_after), name, None))
    changes.sort(key=lambda change: change[0])
    while changes and changes[0][0] <= 0:  # passed by the first probe, as the container starts
        _, name, waits_for = changes.pop(0)
        if waits_for is None:
            waiting.pop(name, None)
        else:
            waiting[name] = waits_for
    return waiting, changes


def _passes_after(probe: Obj, after: float = 0.0) -> float:
    """When a probe passes, in seconds after its container started: its worker probes at
    once and then every ``periodSeconds``; a probe counts once the container ran
    ``initialDelaySeconds`` (and, for readiness, once the startup probe passed at
    ``after``), and ``successThreshold`` in a row make it pass."""
    period = float(probe.get("periodSeconds") or 10)
    first = math.ceil(max(float(probe.get("initialDelaySeconds") or 0), after) / period)
    return (first + int(probe.get("successThreshold") or 1) - 1) * period
