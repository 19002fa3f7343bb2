"""What a kubelet knows of device health, from its drivers' NodeWatchResources streams.

The rules are the kubelet's (v1.37, KEP-4680): every message is a full snapshot; a device
counts as heard of when the message arrives (the driver's own timestamp is not used); a
device not heard of within its health-check timeout (30 s when the driver gives none)
reads as Unknown, and so does a device the kubelet never heard of or whose driver's
stream ended. A device left out of a snapshot stays as it was until its timeout passes,
then reads Unknown and is forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

DEFAULT_TIMEOUT_S = 30.0
MESSAGE_MAX = 1024
"""The API's limit on a ResourceHealth message; longer ones are cut, ending in '...'."""


class DeviceHealthStatus(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DeviceReport:
    """One device of one snapshot, as the kubelet keeps it."""

    pool: str
    device: str
    health: DeviceHealthStatus
    message: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class _Entry:
    report: DeviceReport
    heard_at: float


def truncate_message(message: str) -> str:
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."


def timeout_from_wire(seconds: int) -> float:
    """Zero or negative means: the kubelet's default."""
    return float(seconds) if seconds > 0 else DEFAULT_TIMEOUT_S


class HealthCache:
    def __init__(self) -> None:
        self._drivers: dict[str, dict[tuple[str, str], _Entry]] = {}

    def update(self, driver: str, reports: list[DeviceReport], now: float) -> list[tuple[str, str]]:
        """Take one snapshot; return the (pool, device) whose health, message or timeout
        changed, including devices that just timed out after being left out."""
        devices = self._drivers.setdefault(driver, {})
        changed: list[tuple[str, str]] = []
        reported = set()
        for report in reports:
            key = (report.pool, report.device)
            reported.add(key)
            before = devices.get(key)
            if before is None or before.report != report:
                changed.append(key)
            devices[key] = _Entry(report, now)
        for key, entry in list(devices.items()):
            if key in reported or now - entry.heard_at <= entry.report.timeout_s:
                continue
            if entry.report.health is not DeviceHealthStatus.UNKNOWN:
                changed.append(key)
            del devices[key]
        return changed

    def clear_driver(self, driver: str) -> None:
        """The driver's stream ended: all its devices read Unknown from now on."""
        self._drivers.pop(driver, None)

    def get(self, driver: str, pool: str, device: str, now: float) -> tuple[DeviceHealthStatus, str]:
        entry = self._drivers.get(driver, {}).get((pool, device))
        if entry is None or now - entry.heard_at > entry.report.timeout_s:
            return DeviceHealthStatus.UNKNOWN, ""
        return entry.report.health, entry.report.message
