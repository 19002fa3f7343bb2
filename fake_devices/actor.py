"""A Ray actor holding the hardware of one or more nodes.

The class is plain Python with async methods; ``hardware_host_actor()`` wraps it with
``ray.remote`` on first use, so importing this module needs no running Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fake_devices.hardware import (
    DeviceHealth,
    Health,
    NodeHardware,
    PreparedDevice,
    Share,
)
from fake_devices.kinds import Device, SharedPool
from fake_devices.profiles import HardwareProfile


class HardwareHost:
    """Owns ``NodeHardware`` for each node it was given; every call names the node."""

    def __init__(self, nodes: Mapping[str, HardwareProfile], seed: int = 0):
        """``nodes`` maps node name -> its hardware profile."""
        self._nodes = {node: NodeHardware(node, profile, seed) for node, profile in nodes.items()}

    def _node(self, node: str) -> NodeHardware:
        try:
            return self._nodes[node]
        except KeyError:
            raise KeyError(f"this host has no node {node!r}; it has {sorted(self._nodes)}") from None

    async def nodes(self) -> list[str]:
        return sorted(self._nodes)

    async def inventory(self, node: str) -> tuple[int, list[Device], list[SharedPool]]:
        hw = self._node(node)
        return hw.generation, hw.devices(), hw.pools()

    async def health(self, node: str) -> tuple[int, list[DeviceHealth]]:
        hw = self._node(node)
        return hw.generation, hw.health()

    async def wait_for_change(self, node: str, after_generation: int, timeout_s: float) -> int:
        return await self._node(node).wait_for_change(after_generation, timeout_s)

    async def prepare(
        self,
        node: str,
        claim_uid: str,
        devices: list[str],
        settings: Mapping[str, Mapping[str, str]] | None,
        admin_access: bool,
        shares: list[Share] | None = None,
        reassert: bool = False,
    ) -> list[PreparedDevice]:
        return await self._node(node).prepare(claim_uid, devices, settings, admin_access, shares or (), reassert)

    async def unprepare(self, node: str, claim_uid: str, kinds: list[str] | None = None) -> bool:
        return await self._node(node).unprepare(claim_uid, kinds)

    async def claims(self, node: str) -> dict[str, list[str]]:
        return self._node(node).claims()

    async def inject(self, node: str, **faults: Any) -> None:
        self._node(node).inject(**faults)

    async def set_health(self, node: str, device: str, healthy: bool, message: str = "", fatal: bool = False) -> None:
        self._node(node).set_health(device, Health.HEALTHY if healthy else Health.UNHEALTHY, message, fatal)

    async def lose_device(self, node: str, device: str) -> None:
        self._node(node).lose_device(device)


_actor_class: Any = None


def hardware_host_actor() -> Any:
    """``ray.remote(HardwareHost)``, created once."""
    global _actor_class
    if _actor_class is None:
        import ray

        _actor_class = ray.remote(HardwareHost)
    return _actor_class
