"""How the driver reaches the emulated hardware: in-process, or in a Ray actor.

The driver uses nothing of ``fake_devices`` beyond this small interface, so its logic is
the same whether the hardware lives in the same process or elsewhere in a Ray cluster.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from fake_devices.hardware import (
    DeviceHealth,
    HardwareError,
    NodeHardware,
    PreparedDevice,
    Share,
)
from fake_devices.kinds import Device, SharedPool


class DeviceBackend(Protocol):
    async def inventory(self) -> tuple[int, list[Device], list[SharedPool]]: ...
    async def health(self) -> tuple[int, list[DeviceHealth]]: ...
    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int: ...
    async def prepare(
        self,
        claim_uid: str,
        devices: list[str],
        settings: Mapping[str, Mapping[str, str]],
        admin_access: bool,
        shares: Collection[Share] = (),
        reassert: bool = False,
    ) -> list[PreparedDevice]: ...
    async def unprepare(self, claim_uid: str, kinds: Collection[str] | None = None) -> bool: ...
    async def claims(self) -> dict[str, list[str]]: ...


class LocalBackend:
    """The hardware object itself, in this process."""

    def __init__(self, hardware: NodeHardware):
        self.hardware = hardware

    async def inventory(self) -> tuple[int, list[Device], list[SharedPool]]:
        return self.hardware.generation, self.hardware.devices(), self.hardware.pools()

    async def health(self) -> tuple[int, list[DeviceHealth]]:
        return self.hardware.generation, self.hardware.health()

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        return await self.hardware.wait_for_change(after_generation, timeout_s)

    async def prepare(
        self,
        claim_uid: str,
        devices: list[str],
        settings: Mapping[str, Mapping[str, str]],
        admin_access: bool,
        shares: Collection[Share] = (),
        reassert: bool = False,
    ) -> list[PreparedDevice]:
        return await self.hardware.prepare(claim_uid, devices, settings, admin_access, shares, reassert)

    async def unprepare(self, claim_uid: str, kinds: Collection[str] | None = None) -> bool:
        return await self.hardware.unprepare(claim_uid, kinds)

    async def claims(self) -> dict[str, list[str]]:
        return self.hardware.claims()


class RayBackend:
    """A node's hardware held by a ``fake_devices.actor.HardwareHost`` actor."""

    def __init__(self, actor: Any, node: str):
        self.actor = actor
        self.node = node

    async def inventory(self) -> tuple[int, list[Device], list[SharedPool]]:
        result: tuple[int, list[Device], list[SharedPool]] = await self.actor.inventory.remote(self.node)
        return result

    async def health(self) -> tuple[int, list[DeviceHealth]]:
        result: tuple[int, list[DeviceHealth]] = await self.actor.health.remote(self.node)
        return result

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        result: int = await self.actor.wait_for_change.remote(self.node, after_generation, timeout_s)
        return result

    async def prepare(
        self,
        claim_uid: str,
        devices: list[str],
        settings: Mapping[str, Mapping[str, str]],
        admin_access: bool,
        shares: Collection[Share] = (),
        reassert: bool = False,
    ) -> list[PreparedDevice]:
        try:
            result: list[PreparedDevice] = await self.actor.prepare.remote(
                self.node,
                claim_uid,
                devices,
                {k: dict(v) for k, v in settings.items()},
                admin_access,
                list(shares),
                reassert,
            )
        except Exception as exc:  # a HardwareError arrives wrapped in a RayTaskError
            cause = getattr(exc, "cause", None)
            raise HardwareError(str(cause or exc)) from exc
        return result

    async def unprepare(self, claim_uid: str, kinds: Collection[str] | None = None) -> bool:
        result: bool = await self.actor.unprepare.remote(self.node, claim_uid, None if kinds is None else list(kinds))
        return result

    async def claims(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = await self.actor.claims.remote(self.node)
        return result
