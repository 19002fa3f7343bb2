"""The emulated hardware of one node: its devices, who uses them, their health, faults.

Devices are described in neutral terms (``kinds.Device``): attributes, capacities, and
what they draw from a shared pool (a GPU's memory slices and multiprocessors). A whole
GPU draws all of its pool and a partition draws its placement, so two devices conflict exactly when their
draws together exceed the pool. A driver can publish this so a scheduler works the
conflicts out by itself; the hardware still refuses a double use, as real hardware would.

Everything is deterministic from (seed, node name): UUIDs, MACs, injected failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from fake_devices.atomic import replace_file
from fake_devices.kinds import Device, NodeSlots, SharedPool
from fake_devices.profiles import HardwareProfile

log = logging.getLogger(__name__)


class Health(StrEnum):
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"


@dataclass(frozen=True)
class DeviceHealth:
    device: str
    health: Health
    message: str
    updated_unix: int
    fatal: bool = False
    """Unhealthy past running work (a GPU fallen off the bus): what ran on it is lost,
    where a device merely unhealthy (too hot, say) still serves the work it has."""


@dataclass(frozen=True)
class PreparedDevice:
    name: str
    env: Mapping[str, str]
    """What a container using this device would see in its environment."""
    share_id: str | None = None
    """Set for one share of a shareable device."""


@dataclass(frozen=True)
class Share:
    """One of several allocations of a shareable device, and what it consumes of each of
    the device's capacities."""

    device: str
    id: str
    consumes: Mapping[str, int]


class HardwareError(Exception):
    """A device operation failed as real hardware might (busy, lost, injected fault)."""


def build_inventory(profile: HardwareProfile, node: str, seed: int) -> tuple[list[Device], list[SharedPool]]:
    """The devices of one node, section by section."""
    slots = NodeSlots(node, seed, profile.numa_nodes)
    devices: list[Device] = []
    pools: list[SharedPool] = []
    for spec in profile.devices.values():
        built, shared = spec.build(slots)
        devices += built
        pools += shared
    return devices, pools


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()


@dataclass
class Faults:
    fail_next_prepares: int = 0
    fail_message: str = "injected device failure"
    latency_s: float = 0.0
    failure_rate: float = 0.0
    """Probability that a prepare fails, drawn from the node's seeded RNG."""

    def __post_init__(self) -> None:
        # A NaN or infinite delay would sit in the event loop's timer heap, where it
        # breaks the order every other node's timers rely on.
        if self.fail_next_prepares < 0:
            raise ValueError(f"fail_next_prepares must be 0 or more, not {self.fail_next_prepares}")
        if not 0 <= self.latency_s < math.inf:
            raise ValueError(f"latency_s must be a finite number of seconds, 0 or more, not {self.latency_s}")
        if not 0 <= self.failure_rate <= 1:
            raise ValueError(f"failure_rate must be from 0 to 1, not {self.failure_rate}")


class NodeHardware:
    """The hardware of one node. Async so latency faults cost no thread."""

    def __init__(self, node: str, profile: HardwareProfile, seed: int = 0, kept_in: Path | None = None):
        """``kept_in``: a file the faults in force are kept in (see ``fault_record``), and
        taken from when it exists: whoever runs this hardware again after a crash (a
        NodeHost restarted by Ray) finds its devices as broken as they were, since a GPU
        does not mend because its emulator died."""
        self.node = node
        self.profile = profile
        self.seed = seed
        devices, pools = build_inventory(profile, node, seed)
        self._devices = {d.name: d for d in devices}
        self._pools = {p.name: p for p in pools}
        self._lost: set[str] = set()
        self._health: dict[str, DeviceHealth] = {}
        self._claims: dict[str, list[str]] = {}
        """claim UID -> devices it holds."""
        self._shares: dict[str, dict[str, Share]] = {}
        """claim UID -> the shares it holds, by share ID."""
        self._slots: dict[tuple[str, str], int] = {}
        """(device, share ID) -> the share's slot on the device (its virtual function)."""
        self._admin_claims: set[str] = set()
        self._busy: dict[str, str] = {}
        """device -> why it cannot be released now (a process still holds it)."""
        self.faults = Faults()
        self._rng = random.Random(int.from_bytes(_digest(seed, node, "faults")[:8], "big"))
        self.generation = 1
        """Bumped whenever the inventory or health changes."""
        self._changed = asyncio.Event()
        self.kept_in = kept_in
        if kept_in is not None and kept_in.exists():
            self._take_record(kept_in)

    # --- inventory and health ------------------------------------------------------

    def devices(self) -> list[Device]:
        return [d for name, d in self._devices.items() if name not in self._lost]

    def lost(self) -> frozenset[str]:
        """Devices that fell off the bus (their partitions, gone with them, unnamed)."""
        return frozenset(d for d in self._lost if self._devices[d].parent not in self._lost)

    def faults_in_force(self) -> list[str]:
        """What is broken now, in words (for a status): devices unhealthy, busy or lost
        (a GPU named alone, not its partitions), and the prepare faults."""
        said = [
            f"{d} unhealthy{' (fatal)' if h.fatal else ''}" + (f": {h.message}" if h.message else "")
            for d, h in sorted(self._health.items())
            if d not in self._lost
        ]
        said += [f"{d} busy: {message}" for d, message in sorted(self._busy.items())]
        said += [f"{d} lost" for d in sorted(self.lost())]
        if self.faults.fail_next_prepares:
            said.append(f"next {self.faults.fail_next_prepares} prepares fail: {self.faults.fail_message}")
        if self.faults.latency_s:
            said.append(f"prepares {self.faults.latency_s * 1000:g} ms slower")
        if self.faults.failure_rate:
            said.append(f"prepares fail at rate {self.faults.failure_rate:g}")
        return said

    def built_with(self) -> frozenset[str]:
        """Every device the node was built with, lost ones too."""
        return frozenset(self._devices)

    def pools(self) -> list[SharedPool]:
        return list(self._pools.values())

    def device(self, name: str) -> Device:
        if name not in self._devices or name in self._lost:
            raise HardwareError(f"{self.node}: no device {name!r}")
        return self._devices[name]

    def health(self) -> list[DeviceHealth]:
        """A full snapshot; a partition is as sick as the GPU it is carved from."""
        now = int(time.time())
        snapshot = []
        for device in self.devices():
            sick = self._health.get(device.name)
            if sick is None and device.parent:
                sick = self._health.get(device.parent)
            if sick is None:
                snapshot.append(DeviceHealth(device.name, Health.HEALTHY, "", now))
            else:
                snapshot.append(DeviceHealth(device.name, sick.health, sick.message, sick.updated_unix, sick.fatal))
        return snapshot

    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        """Long poll: returns the generation once it moves past ``after_generation``."""
        if self.generation > after_generation:
            return self.generation
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        return self.generation

    # --- faults --------------------------------------------------------------------

    def fault_record(self) -> dict[str, Any]:
        """The faults in force, as JSON: what a crash must not lose."""
        return {
            "unhealthy": {
                d: {"message": h.message, "fatal": h.fatal, "since": h.updated_unix}
                for d, h in sorted(self._health.items())
            },
            "busy": dict(sorted(self._busy.items())),
            "lost": sorted(self._lost),
            "prepares": {
                "failNext": self.faults.fail_next_prepares,
                "failMessage": self.faults.fail_message,
                "latencySeconds": self.faults.latency_s,
                "failureRate": self.faults.failure_rate,
            },
        }

    def _take_record(self, path: Path) -> None:
        try:
            record = json.loads(path.read_text())
            sick, busy, lost = record.get("unhealthy", {}), record.get("busy", {}), record.get("lost", [])
            unknown = {*sick, *busy, *lost} - set(self._devices)
            if unknown:
                raise ValueError(f"no device {sorted(unknown)} on this node")
            health = {
                d: DeviceHealth(d, Health.UNHEALTHY, str(h["message"]), int(h["since"]), bool(h["fatal"]))
                for d, h in sick.items()
            }
            prepares, default = record.get("prepares", {}), Faults()
            faults = Faults(
                int(prepares.get("failNext", default.fail_next_prepares)),
                str(prepares.get("failMessage", default.fail_message)),
                float(prepares.get("latencySeconds", default.latency_s)),
                float(prepares.get("failureRate", default.failure_rate)),
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("%s: faults kept in %s not taken (%r): it starts without faults", self.node, path, exc)
            return
        self._health, self._busy, self._lost, self.faults = health, {**busy}, {*lost}, faults

    def _faults_changed(self) -> None:
        if self.kept_in is None:
            return
        try:
            replace_file(self.kept_in, json.dumps(self.fault_record(), indent=1) + "\n")
        except OSError as exc:  # the faults hold in memory all the same
            log.warning("%s: cannot keep the faults in %s: %s", self.node, self.kept_in, exc)

    def inject(
        self,
        *,
        fail_next_prepares: int | None = None,
        latency_s: float | None = None,
        failure_rate: float | None = None,
        message: str | None = None,
    ) -> None:
        now = self.faults
        self.faults = replace(  # checked whole (Faults.__post_init__) before any of it holds
            now,
            fail_next_prepares=now.fail_next_prepares if fail_next_prepares is None else fail_next_prepares,
            latency_s=now.latency_s if latency_s is None else latency_s,
            failure_rate=now.failure_rate if failure_rate is None else failure_rate,
            fail_message=now.fail_message if message is None else message,
        )
        self._faults_changed()

    def set_health(self, device: str, health: Health, message: str = "", fatal: bool = False) -> None:
        """``fatal``: the device cannot serve even the work it has (see DeviceHealth)."""
        self.device(device)
        if health is Health.HEALTHY:
            self._health.pop(device, None)
        else:
            self._health[device] = DeviceHealth(device, health, message, int(time.time()), fatal)
        self._faults_changed()
        self._bump()

    def set_busy(self, device: str, message: str | None) -> None:
        """While busy (``message`` set), a claim holding the device cannot be released, as
        when a process still has it open; None: free again."""
        self.device(device)
        if message is None:
            self._busy.pop(device, None)
        else:
            self._busy[device] = message
        self._faults_changed()

    def clear_faults(self) -> None:
        """Every device healthy and free to release again, no prepare failing or slower;
        a lost device stays lost (it is not on the node any more)."""
        self._health.clear()
        self._busy.clear()
        self.faults = Faults()
        self._faults_changed()
        self._bump()

    def lose_device(self, device: str) -> None:
        """The device vanishes (fell off the bus): it and its partitions leave the inventory."""
        self.device(device)
        self._lost.add(device)
        self._lost.update(d.name for d in self._devices.values() if d.parent == device)
        self._faults_changed()
        self._bump()

    # --- use -----------------------------------------------------------------------

    def _check_conflicts(self, claim_uid: str, names: list[str], shares: Collection[Share]) -> None:
        drawn: dict[str, dict[str, int]] = {}
        for uid, held in self._claims.items():
            if uid == claim_uid or uid in self._admin_claims:
                continue
            for name in held:
                device = self._devices[name]
                if device.pool:
                    for counter, amount in device.draws.items():
                        drawn.setdefault(device.pool, {}).setdefault(counter, 0)
                        drawn[device.pool][counter] += amount
                elif name in names or any(share.device == name for share in shares):
                    raise HardwareError(f"{self.node}: {name} is in use by claim {uid}")
        self._check_shares(claim_uid, names, shares)
        for name in names:
            device = self._devices[name]
            if not device.pool:
                continue
            pool = self._pools[device.pool]
            for counter, amount in device.draws.items():
                used = drawn.setdefault(device.pool, {}).get(counter, 0)
                if used + amount > pool.capacity[counter]:
                    others = {
                        u
                        for u, held in self._claims.items()
                        if u != claim_uid
                        for n in held
                        if self._devices[n].pool == device.pool
                    }
                    gpu = device.pool.removesuffix("-counters")
                    raise HardwareError(
                        f"{self.node}: {name} overlaps devices of {gpu} already in use by "
                        f"claim(s) {', '.join(sorted(others))}"
                    )
                drawn[device.pool][counter] = used + amount

    def _check_shares(self, claim_uid: str, names: list[str], shares: Collection[Share]) -> None:
        """A shared device is held whole by no one, and its shares together consume no more
        than it has: the scheduler sees to both; the hardware refuses what slips through."""
        others = [
            (uid, share)
            for uid, held in self._shares.items()
            if uid not in self._admin_claims
            for share in held.values()
            if uid != claim_uid
        ]
        for name in names:
            holders = sorted({uid for uid, share in others if share.device == name})
            if holders:
                raise HardwareError(f"{self.node}: {name} is shared by claim(s) {', '.join(holders)}")
        for device_name in sorted({share.device for share in shares}):
            device = self._devices[device_name]
            if not device.shareable:
                raise HardwareError(f"{self.node}: {device_name} cannot be shared: it allows one allocation")
            mine = [s for s in shares if s.device == device_name]
            theirs = [s for _, s in others if s.device == device_name]
            for capacity, total in device.capacity.items():
                used = sum(s.consumes.get(capacity, 0) for s in [*mine, *theirs])
                if used > total:
                    raise HardwareError(
                        f"{self.node}: {device_name} has {total} {capacity}; its shares would consume {used}"
                    )

    async def prepare(
        self,
        claim_uid: str,
        names: list[str],
        settings: Mapping[str, Mapping[str, str]] | None = None,
        admin_access: bool = False,
        shares: Collection[Share] = (),
        reassert: bool = False,
    ) -> list[PreparedDevice]:
        """Reserve ``names`` (whole devices) and ``shares`` (parts of shareable ones) for
        the claim and apply each device's settings (sharing strategy and the like).
        Idempotent: the same claim and devices again returns the same answer. A claim may
        be prepared in parts (one per driver whose devices it has, a GPU's and a NIC's):
        it holds them all. ``reassert``: a restarted driver holds again what its claim held
        before; nothing is set up, so the prepare faults and the devices' health do not
        apply (a sick GPU still holds the work it has), only that the devices are there
        and no other claim holds them."""
        settings = settings or {}
        held = self._claims.get(claim_uid, [])
        held_shares = self._shares.get(claim_uid, {})
        if set(names) <= set(held) and all(held_shares.get(share.id) == share for share in shares):
            return self._answer(names, shares, settings)
        if not reassert:
            self._fail_as_injected()
        for name in [*names, *(share.device for share in shares)]:
            self.device(name)
            sick = self._health.get(name)
            if sick is not None and not reassert:
                raise HardwareError(f"{self.node}: {name} is unhealthy: {sick.message}")
        merged = {**held_shares, **{share.id: share for share in shares}}
        if not admin_access:
            self._check_conflicts(claim_uid, names, list(merged.values()))
        else:
            self._admin_claims.add(claim_uid)
        self._claims[claim_uid] = sorted({*held, *names})
        if merged:
            self._shares[claim_uid] = merged
        for share in shares:
            self._take_slot(share)
        if self.faults.latency_s and not reassert:  # reserved, then slow to come up: a crash can land here
            await asyncio.sleep(self.faults.latency_s)
        return self._answer(names, shares, settings)

    def _fail_as_injected(self) -> None:
        if self.faults.fail_next_prepares > 0:
            self.faults.fail_next_prepares -= 1
            self._faults_changed()
            raise HardwareError(f"{self.node}: {self.faults.fail_message}")
        if self.faults.failure_rate and self._rng.random() < self.faults.failure_rate:
            raise HardwareError(f"{self.node}: {self.faults.fail_message} (random)")

    def _take_slot(self, share: Share) -> None:
        if (share.device, share.id) in self._slots:
            return
        taken = {slot for (device, _), slot in self._slots.items() if device == share.device}
        self._slots[(share.device, share.id)] = min(set(range(len(taken) + 1)) - taken)

    def _answer(
        self, names: list[str], shares: Collection[Share], settings: Mapping[str, Mapping[str, str]]
    ) -> list[PreparedDevice]:
        whole = [self._prepared(n, settings.get(n)) for n in sorted(names)]
        ordered = sorted(shares, key=lambda s: (s.device, s.id))
        parts = [self._prepared_share(s, settings.get(s.device)) for s in ordered]
        return whole + parts

    def _prepared(self, name: str, settings: Mapping[str, str] | None) -> PreparedDevice:
        return PreparedDevice(name, {**self._devices[name].env, **(settings or {})})

    def _prepared_share(self, share: Share, settings: Mapping[str, str] | None) -> PreparedDevice:
        device = self._devices[share.device]
        prefix = device.share_env_prefix or share.device.upper().replace("-", "_")
        env = {**device.env, f"{prefix}_SHARE": str(self._slots[(share.device, share.id)])}
        env.update({f"{prefix}_{_env_name(k)}": str(v) for k, v in sorted(share.consumes.items())})
        return PreparedDevice(share.device, {**env, **(settings or {})}, share.id)

    async def unprepare(self, claim_uid: str, kinds: Collection[str] | None = None) -> bool:
        """Release the claim's devices (only those of these kinds, when given: one driver's
        part of a claim). Unknown claims are fine (already released); True if any device
        was released."""
        if self.faults.latency_s:
            await asyncio.sleep(self.faults.latency_s)
        held = self._claims.get(claim_uid, [])
        shares = self._shares.get(claim_uid, {})

        def releases(name: str) -> bool:
            return kinds is None or self._devices[name].kind in kinds

        releasing = [n for n in held if releases(n)]
        releasing_shares = [s for s in shares.values() if releases(s.device)]
        for name in [*releasing, *(s.device for s in releasing_shares)]:
            if name in self._busy:
                raise HardwareError(f"{self.node}: {name} is busy: {self._busy[name]}")
        kept = [n for n in held if n not in releasing]
        kept_shares = {s.id: s for s in shares.values() if s not in releasing_shares}
        for share in releasing_shares:
            self._slots.pop((share.device, share.id), None)
        if kept_shares:
            self._shares[claim_uid] = kept_shares
        else:
            self._shares.pop(claim_uid, None)
        if kept:
            self._claims[claim_uid] = kept
        else:
            self._claims.pop(claim_uid, None)
        if not kept and not kept_shares:
            self._admin_claims.discard(claim_uid)
        return bool(releasing or releasing_shares)

    def claims(self) -> dict[str, list[str]]:
        """Each claim's devices, a shared device once for each share the claim holds."""
        held = {uid: list(names) for uid, names in self._claims.items() if names}
        for uid, shares in self._shares.items():
            held.setdefault(uid, []).extend(sorted(s.device for s in shares.values()))
        return held


def _env_name(capacity: str) -> str:
    """``virtualFunctions`` -> ``VIRTUAL_FUNCTIONS``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", capacity).upper()
