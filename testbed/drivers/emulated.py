"""A driver over emulated hardware: what every built-in driver is, given its kind.

A ``DriverKind`` says what one driver is (its name, its section of a hardware profile,
the devices it publishes, the opaque configs it accepts, its DeviceClasses);
``EmulatedDriver`` turns that and a node's hardware into the framework's ``Driver``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_devices.hardware import DeviceHealth, HardwareError, PreparedDevice, Share
from fake_devices.kinds import Device, DeviceSpec, SharedPool
from testbed.drivers.backend import DeviceBackend
from testbed.keys import FABRIC_ATTACHED
from testbed.kubeapi import KubeClient
from testbed.kubeletplugin.driver import ClaimFailed, ClaimToPrepare, Inventory
from testbed.kubeletplugin.opaque_config import ConfigError, OpaqueConfig, configs_for_request


@dataclass(frozen=True)
class DriverKind:
    name: str
    """The DRA driver name, e.g. ``gpu.dra-testbed.io``."""
    hardware: type[DeviceSpec]
    """Its section of a hardware profile: present with a count > 0, the node runs it."""
    classes: Mapping[str, str]
    """DeviceClass name -> the device kind (the ``type`` attribute) it selects."""
    configs: Mapping[str, type[OpaqueConfig]] = field(default_factory=dict)
    """The opaque configs it accepts, by ``kind``."""
    driver: type[EmulatedDriver] | None = None
    """The driver class when it does more than the default one."""
    profiles: Path | None = None
    """A directory of hardware profiles this kind ships."""

    @property
    def published(self) -> tuple[str, ...]:
        """The kinds of device it publishes: those its classes select."""
        return tuple(dict.fromkeys(self.classes.values()))

    def select(self, devices: list[Device], pools: list[SharedPool]) -> tuple[list[Device], list[SharedPool]]:
        """Of a node's devices and counter sets, this driver's."""
        mine = [d for d in devices if d.kind in self.published]
        used = {d.pool for d in mine if d.pool}
        return mine, [p for p in pools if p.name in used]

    def device_classes(self) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {
                    "selectors": [
                        {
                            "cel": {
                                "expression": f"device.driver == '{self.name}' && "
                                f"device.attributes['{self.name}'].type == '{kind}'"
                            }
                        }
                    ]
                },
            }
            for name, kind in self.classes.items()
        ]

    def make(self, backend: DeviceBackend, client: KubeClient | None = None, node: str = "") -> EmulatedDriver:
        return (self.driver or EmulatedDriver)(self, backend, client, node)


class EmulatedDriver:
    """One driver's view of a node's emulated hardware: its own devices only."""

    def __init__(self, kind: DriverKind, backend: DeviceBackend, client: KubeClient | None = None, node: str = ""):
        self.kind = kind
        self.name = kind.name
        self.backend = backend
        self.client = client
        """For drivers that write to the API (the claim status of a NIC)."""
        self.node = node
        """The node it serves, for its log lines (a fleet host's log holds many nodes')."""
        self._mine: tuple[int, frozenset[str]] = (-1, frozenset())
        self._behind_fabric: frozenset[str] | None = None
        """Its devices that sit behind a fabric (a device's place never changes)."""

    async def inventory(self) -> Inventory:
        generation, devices, pools = await self.backend.inventory()
        mine, counter_sets = self.kind.select(devices, pools)
        self._mine = (generation, frozenset(d.name for d in mine))
        self._behind_fabric = frozenset(d.name for d in mine if d.behind_fabric)
        return Inventory(generation, mine, counter_sets)

    async def health(self) -> tuple[int, list[DeviceHealth]]:
        generation, health = await self.backend.health()
        if self._mine[0] != generation:
            await self.inventory()
        return generation, [h for h in health if h.device in self._mine[1]]

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        return await self.backend.wait_for_change(after_generation, timeout_s)

    def configs(self, claim: ClaimToPrepare) -> dict[str, list[OpaqueConfig]]:
        """Per device, the opaque configs of this driver that apply to it, in order."""
        try:
            return {
                device.device: configs_for_request(self.name, claim.configs, device.request, self.kind.configs)
                for device in claim.devices
            }
        except ConfigError as exc:
            raise ClaimFailed("InvalidConfig", str(exc)) from None

    def settings(self, claim: ClaimToPrepare) -> dict[str, dict[str, str]]:
        """Per device, the environment its configs give it (later configs win)."""
        return {
            device: {k: v for config in configs for k, v in config.env().items()}
            for device, configs in self.configs(claim).items()
        }

    async def prepare(self, claim: ClaimToPrepare) -> list[PreparedDevice]:
        if not claim.repair:
            await self._check_attached(claim)
        settings = self.settings(claim)
        whole = [d.device for d in claim.devices if d.share_id is None]
        shares = [Share(d.device, d.share_id, d.consumed) for d in claim.devices if d.share_id is not None]
        try:
            return await self.backend.prepare(
                claim.ref.uid, whole, settings, claim.admin_access, shares, reassert=claim.repair
            )
        except HardwareError as exc:
            raise ClaimFailed("DeviceError", str(exc)) from None

    async def _check_attached(self, claim: ClaimToPrepare) -> None:
        """A device behind a fabric is on the node only once the fabric manager attached
        it, which it records as a binding condition in the claim's status: without it
        there is nothing to prepare, as on a node whose fabric never attached the GPU.
        (The scheduler binds no pod before that condition; it would only with the
        DRADeviceBindingConditions gate off.)"""
        if self._behind_fabric is None:
            await self.inventory()
        behind = self._behind_fabric or frozenset()
        missing = [d.device for d in claim.devices if d.device in behind and FABRIC_ATTACHED not in d.conditions]
        if missing:
            raise ClaimFailed(
                "NotAttached",
                f"{', '.join(missing)} behind the fabric not attached to this node: the claim's "
                f"status.devices has no {FABRIC_ATTACHED}=True for "
                + ("it" if len(missing) == 1 else "them")
                + " (the fabric manager sets it once attached, before the scheduler binds the pod)",
            )

    async def unprepare(self, claim_uid: str) -> None:
        try:  # its own devices alone: the claim may hold another driver's too
            await self.backend.unprepare(claim_uid, self.kind.published)
        except HardwareError as exc:
            raise ClaimFailed("DeviceError", str(exc)) from None
