"""A kubelet's liveness probing of one driver process, as it probes a DaemonSet's container.

The good practice is a liveness probe on the driver's gRPC health endpoint, so that a
driver whose socket broke is restarted. Here the probe is asked every period once the
initial delay passed; each failure is an "Unhealthy" Event on the driver's pod; the
failureThreshold-th failure in a row ends the probing, and the caller kills and restarts
the process (a new process is probed afresh, delay and count included).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from testbed.grpcapi.probe import ProbeResult, grpc_health_check


@dataclass(frozen=True)
class LivenessSettings:
    """A livenessProbe.grpc, in seconds (the fleet file's LivenessProbe)."""

    service: str = ""
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    failure_threshold: int = 3
    grace_s: float | None = None

    def as_probe(self, port: int) -> dict[str, object]:
        """The livenessProbe a pod spec carries for it, probing ``port``."""
        grpc: dict[str, object] = {"port": port, **({"service": self.service} if self.service else {})}
        probe: dict[str, object] = {
            "grpc": grpc,
            "initialDelaySeconds": round(self.initial_delay_s),
            "periodSeconds": max(1, round(self.period_s)),
            "timeoutSeconds": max(1, round(self.timeout_s)),
            "failureThreshold": self.failure_threshold,
        }
        if self.grace_s is not None:
            probe["terminationGracePeriodSeconds"] = max(1, round(self.grace_s))
        return probe


Probe = Callable[[], Awaitable[ProbeResult]]
Tell = Callable[[str, str, str], None]
"""An Event on the driver's pod: type, reason, message."""


def grpc_probe(settings: LivenessSettings, port: int) -> Probe:
    target = f"127.0.0.1:{port}"
    return lambda: grpc_health_check(target, settings.service, settings.timeout_s)


async def until_unhealthy(settings: LivenessSettings, probe: Probe, tell: Tell) -> str:
    """Probe until ``failure_threshold`` failures in a row; what the last one saw. Never
    returns while the probe passes (the caller cancels it when the process exits)."""
    await asyncio.sleep(settings.initial_delay_s)
    failures = 0
    while True:
        asked = time.monotonic()
        result = await probe()
        if result.passed:
            failures = 0
        else:
            failures += 1
            tell("Warning", "Unhealthy", f"Liveness probe failed: {result.output}")
            if failures >= settings.failure_threshold:
                return result.output
        await asyncio.sleep(max(0.0, settings.period_s - (time.monotonic() - asked)))
