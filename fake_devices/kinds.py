"""What a kind of device is to the emulator: a profile section that builds devices.

A hardware profile is a few node-wide fields plus one section per kind of device
(``gpus:``, ``nics:``, ...). Each section is a ``DeviceSpec``: a validated model that
knows how to build its devices for one node. The emulator ships no kinds of its own;
whoever loads profiles says which sections exist, so a new kind of device is written
next to its driver and nothing here changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

AttributeValue = str | int | bool


@dataclass(frozen=True)
class SharedPool:
    """Capacity that several devices draw from (one per partitionable GPU)."""

    name: str
    capacity: Mapping[str, int]


@dataclass(frozen=True)
class SharePolicy:
    """How one share of a shareable device consumes one of its capacities: ``default``
    when the request names no amount, otherwise the amount rounded up to ``minimum`` plus
    a multiple of ``step``, at most ``maximum`` (None: the whole capacity)."""

    default: int
    minimum: int = 0
    step: int = 0
    maximum: int | None = None


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    """What the device is to its driver, e.g. "gpu", "partition", "nic"."""
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, int]
    pool: str | None = None
    draws: Mapping[str, int] = field(default_factory=dict)
    parent: str | None = None
    """For a partition, the whole device it is carved from."""
    env: Mapping[str, str] = field(default_factory=dict)
    """What a container using this device sees in its environment."""
    pci_ids: tuple[str, str, str] | None = None
    """(vendor, device, class) when the device is a PCI function: it then appears in the
    sysfs-like tree under its ``pciBusID`` attribute."""
    shareable: bool = False
    """Several claims may hold it at once, each a share consuming part of its capacity
    (a port shared through virtual functions); together they never exceed it."""
    share_policies: Mapping[str, SharePolicy] = field(default_factory=dict)
    """For a shareable device, how a share consumes each capacity."""
    share_env_prefix: str = ""
    """A share's container sees ``<prefix>_SHARE`` (its slot on the device, from 0) and
    ``<prefix>_<CAPACITY>`` (what it consumes of each capacity)."""
    behind_fabric: bool = False
    """It sits in a chassis shared by many nodes and reaches a node over a fabric: the
    fabric manager must attach it to the node that claims it before anything there uses it."""


@dataclass(frozen=True)
class NodeSlots:
    """Where one node's devices go: its name and seed (for stable identities) and its
    NUMA nodes. Device ``index`` of every kind sits on PCIe root ``index``, so GPU i and
    NIC i share a root; each kind takes its own bus on that root."""

    node: str
    seed: int
    numa_nodes: int

    def numa_node(self, index: int, count: int) -> int:
        per_numa = max(1, -(-count // self.numa_nodes))
        return index // per_numa

    @staticmethod
    def pci_bus_id(index: int, function: int) -> str:
        return f"0000:{0x20 + index * 0x0C + function:02x}:00.0"  # 16 devices stay below 0xff

    @staticmethod
    def pcie_root(index: int) -> str:
        return f"pci0000:{0x20 + index * 0x0C - 1:02x}"

    def uuid(self, kind: str, index: int | str) -> str:
        h = _digest(self.seed, self.node, kind, index).hex()
        return f"{kind.upper()}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def mac(self, index: int) -> str:
        raw = bytearray(_digest(self.seed, self.node, "mac", index)[:6])
        raw[0] = (raw[0] & 0xFC) | 0x02  # locally administered, unicast
        return ":".join(f"{b:02x}" for b in raw)


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()


class DeviceSpec(BaseModel):
    """One section of a hardware profile. Subclasses name their section and build."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    section: ClassVar[str]
    """The profile key, e.g. ``gpus``."""
    pci_function: ClassVar[int] = 0
    """Which bus of its PCIe root this kind takes (0-11): kinds must not share one."""

    count: int = Field(ge=0, le=16)

    def build(self, slots: NodeSlots) -> tuple[list[Device], list[SharedPool]]:
        raise NotImplementedError
