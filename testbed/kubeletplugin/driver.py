"""What a driver gives the kubelet-plugin framework: its devices, their health, and the
preparing and unpreparing of one claim.

Everything else a DRA kubelet plugin does (registration, the DRA and health gRPC
services in every version a kubelet speaks, reading claims, checkpoint and repair, CDI
specs, ResourceSlices within the API's limits, metrics) is the framework's, the same for
every driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fake_devices.hardware import DeviceHealth, PreparedDevice
from fake_devices.kinds import Device, SharedPool
from testbed.kubeapi import ClaimRef


class ClaimFailed(Exception):
    """This claim cannot be prepared (the others in the same call go on)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        """A short CamelCase cause, counted in the driver's error metric."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of a claim, for this driver."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    admin_access: bool = False
    consumed: Mapping[str, int] = field(default_factory=dict)
    """For one share of a shareable device: what it consumes of each capacity, as the
    scheduler recorded it (``consumedCapacity``)."""
    conditions: frozenset[str] = frozenset()
    """The condition types that are True for this device in the claim's ``status.devices``
    (a binding condition that someone, a fabric manager say, set before the pod was bound)."""


@dataclass(frozen=True)
class ClaimToPrepare:
    ref: ClaimRef
    devices: Sequence[AllocatedDevice]
    configs: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    """The allocation's config entries, class ones first, every driver's: a driver takes
    the opaque ones addressed to it (``opaque_config.configs_for_request``)."""
    repair: bool = False
    """True when a restarted driver re-asserts a claim its checkpoint holds as prepared:
    the devices must be held again, nothing else needs doing."""

    @property
    def admin_access(self) -> bool:
        return any(d.admin_access for d in self.devices)


@dataclass(frozen=True)
class Inventory:
    generation: int
    """Moves whenever the devices or their health change."""
    devices: list[Device]
    counter_sets: list[SharedPool]


class Driver(Protocol):
    """A driver's own logic; ``name`` is its DRA driver name (``gpu.example.com``)."""

    name: str

    async def inventory(self) -> Inventory:
        """The devices to publish, and the counter sets they consume."""
        ...

    async def health(self) -> tuple[int, list[DeviceHealth]]:
        """The health of every published device, and the inventory generation."""
        ...

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        """Returns once the generation moved past ``after_generation`` or at the timeout."""
        ...

    async def prepare(self, claim: ClaimToPrepare) -> list[PreparedDevice]:
        """Hold the claim's devices and say what a container using each sees (a share of a
        shareable device answered with its ``share_id``: each share gets a CDI device of
        its own). Raise ClaimFailed to fail this claim; it is unprepared again then.
        Idempotent."""
        ...

    async def unprepare(self, claim_uid: str) -> None:
        """Release the claim's devices; an unknown claim is already released."""
        ...
