"""ResourceSlices for one driver on one node: built from the inventory, published idempotently.

The pool is named after the node. Shared counters (a partitionable GPU's memory slices
and multiprocessors) go in a slice of their own; devices that consume them go in other
slices of the same pool, all with one generation. Slices are split to honour the API's
limits, and the publisher only writes when the desired content differs from what is
there, bumping the pool generation when it does.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fake_devices.hardware import DeviceHealth, Health
from fake_devices.kinds import Device, SharedPool, SharePolicy
from testbed import quantity
from testbed.keys import FABRIC_ATTACH_FAILED, FABRIC_ATTACHED, SLICE_NODE_LABEL, UNHEALTHY_TAINT_KEY
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.routedwatch import RoutedWatch

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_COUNTER_SETS = 8
MAX_ATTRIBUTES_AND_CAPACITIES = 32
STANDARD_ATTRIBUTES = {"pciBusID", "pcieRoot"}
RELIST_S = 600.0
"""At most this long (at least half) between a publisher's checks of what the API holds."""


def _attribute(value: str | int | bool, name: str) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if name == "driverVersion":
        return {"version": value}
    return {"string": value}


def device_entry(device: Device, health: DeviceHealth | None) -> Obj:
    attributes = {
        (f"resource.kubernetes.io/{k}" if k in STANDARD_ATTRIBUTES else k): _attribute(v, k)
        for k, v in device.attributes.items()
    }
    capacity: dict[str, Obj] = {k: {"value": quantity.canonical(v)} for k, v in device.capacity.items()}
    for name, policy in device.share_policies.items():
        capacity[name]["requestPolicy"] = _request_policy(policy)
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ValueError(f"{device.name}: more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes+capacities")
    entry: Obj = {"name": device.name, "attributes": attributes, "capacity": capacity}
    if device.shareable:
        entry["allowMultipleAllocations"] = True
    if device.behind_fabric:
        entry["bindingConditions"] = [FABRIC_ATTACHED]
        entry["bindingFailureConditions"] = [FABRIC_ATTACH_FAILED]
    if device.pool:
        entry["consumesCounters"] = [
            {
                "counterSet": device.pool,
                "counters": {k: {"value": quantity.canonical(v)} for k, v in device.draws.items()},
            }
        ]
    if health is not None and health.health is Health.UNHEALTHY:
        # NoSchedule keeps new claims off a sick device; NoExecute also has the
        # controller-manager evict the pods of claims that do not tolerate it.
        effect = "NoExecute" if health.fatal else "NoSchedule"
        entry["taints"] = [{"key": UNHEALTHY_TAINT_KEY, "value": "true", "effect": effect}]
    return entry


def _request_policy(policy: SharePolicy) -> Obj:
    """How a share consumes a capacity, as the scheduler reads it (``requestPolicy``)."""
    valid_range: Obj = {"min": quantity.canonical(policy.minimum)}
    if policy.maximum is not None:
        valid_range["max"] = quantity.canonical(policy.maximum)
    if policy.step:
        valid_range["step"] = quantity.canonical(policy.step)
    return {"default": quantity.canonical(policy.default), "validRange": valid_range}


@dataclass(frozen=True)
class SliceSpec:
    """One slice's content, without pool generation or count (set when publishing)."""

    name: str
    devices: tuple[Obj, ...] = ()
    shared_counters: tuple[Obj, ...] = ()


def _chunks(items: list[Obj], size: int) -> Iterable[list[Obj]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def desired_slices(
    driver: str,
    node: str,
    devices: list[Device],
    pools: list[SharedPool],
    health: list[DeviceHealth],
    devices_per_slice: int | None = None,
) -> list[SliceSpec]:
    """``devices``: the driver's. ``devices_per_slice``: fewer devices per slice than the
    API allows (a layout knob: the scheduler and the API server handle many small slices
    differently from a few large ones)."""
    by_name = {h.device: h for h in health}
    entries = [device_entry(d, by_name.get(d.name)) for d in devices]
    used_pools = {d.pool for d in devices if d.pool}
    counter_sets = [
        {"name": p.name, "counters": {k: {"value": quantity.canonical(v)} for k, v in p.capacity.items()}}
        for p in pools
        if p.name in used_pools
    ]
    prefix = slice_name_prefix(driver, node)
    specs = [
        SliceSpec(f"{prefix}counters-{i}", shared_counters=tuple(chunk))
        for i, chunk in enumerate(_chunks(counter_sets, MAX_COUNTER_SETS))
    ]
    plain = [e for e in entries if "consumesCounters" not in e and "taints" not in e]
    limited = [e for e in entries if "consumesCounters" in e or "taints" in e]
    most = devices_per_slice or MAX_DEVICES
    groups = list(_chunks(plain, min(most, MAX_DEVICES))) + list(
        _chunks(limited, min(most, MAX_DEVICES_WITH_TAINTS_OR_COUNTERS))
    )
    specs += [SliceSpec(f"{prefix}{i}", devices=tuple(group)) for i, group in enumerate(groups)]
    if not specs:  # an empty pool is still published, so the scheduler knows it is empty
        specs.append(SliceSpec(f"{prefix}0"))
    return specs


def slice_name_prefix(driver: str, node: str) -> str:
    """How the names of a driver's slices on a node begin."""
    return f"{node}-{driver.split('.')[0]}-"


def slice_object(driver: str, node: str, spec: SliceSpec, generation: int, count: int) -> Obj:
    body: Obj = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
    }
    if spec.devices:
        body["devices"] = list(spec.devices)
    if spec.shared_counters:
        body["sharedCounters"] = list(spec.shared_counters)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": spec.name, "labels": {SLICE_NODE_LABEL: node}},
        "spec": body,
    }


def _comparable(spec: Obj) -> Obj:
    """What must match for an existing slice to count as up to date."""
    pool = spec.get("pool", {})
    devices = []
    for device in spec.get("devices") or []:
        if "taints" in device:  # the API server stamps timeAdded on taints
            device = dict(
                device,
                taints=[{k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]],
            )
        devices.append(device)
    return {
        "devices": devices,
        "sharedCounters": spec.get("sharedCounters") or [],
        "count": pool.get("resourceSliceCount"),
        "nodeName": spec.get("nodeName"),
    }


class SlicePublisher:
    """Keeps the API's slices for (driver, node) equal to the desired ones."""

    def __init__(self, client: KubeClient, driver: str, node: str, owner: Obj | None = None):
        self.client = client
        self.driver = driver
        self.node = node
        self.owner = owner
        """An ownerReference (the Node), so slices go when the node goes."""
        self.writes = 0
        self._prefix = slice_name_prefix(driver, node)
        self._known: dict[str, Obj] | None = None
        """The slices as this publisher last wrote them; None: ask the API server."""
        self._rechecks = 0
        """Counts ``recheck``: a list answered while it grew may already be out of date."""
        self._listed_at = 0.0
        self._writing: set[str] = set()
        self.disturbed = asyncio.Event()
        """Set when the API's slices may no longer be what this publisher wrote: a kubelet
        wiped them (at its start, or after losing the driver), or someone edited one."""

    def observe(self, kind: str, obj: Obj) -> None:
        """A slice event from a watch (metadata only). A slice of ours deleted, or at a
        resourceVersion this publisher did not write, means: look again and republish."""
        metadata = obj.get("metadata", {})
        name = metadata.get("name", "")
        if not name.startswith(self._prefix):
            return  # another driver's slice on this node
        if self._known is None or name in self._writing:
            # A list or a write of it is under way, and its answer may predate this
            # event: a kubelet that wipes the node's slices while the driver creates
            # them must not leave the driver believing they exist.
            if kind == "DELETED":
                self.recheck()
            return
        ours = self._known.get(name)
        if ours is None:
            return
        if kind == "DELETED" or metadata.get("resourceVersion") != ours["metadata"].get("resourceVersion"):
            self.recheck()

    def recheck(self) -> None:
        """Forget what was written and wake the publish loop."""
        self._known = None
        self._rechecks += 1
        self.disturbed.set()

    def assume_none_exist(self) -> None:
        """The node was just created, so it owns no slices yet: skip the first LIST.
        Thousands of nodes starting at once would otherwise each list ResourceSlices."""
        self._known = {}
        self._listed_at = time.monotonic()

    async def existing(self, consistent: bool = False) -> list[Obj]:
        """This node's slices of this driver. By default from the API server's watch cache
        (resourceVersion 0): a fleet's worth of consistent lists falls through to etcd
        when the cache lags, and that stalled a 5,000-node start-up. A stale answer only
        costs a conflict and a retry."""
        params = {"fieldSelector": f"spec.driver={self.driver},spec.nodeName={self.node}"}
        if not consistent:
            params["resourceVersion"] = "0"
        listing = await self.client.get(path_for(API_VERSION, "resourceslices"), params)
        items: list[Obj] = listing.get("items", [])
        return items

    async def publish(self, specs: list[SliceSpec]) -> bool:
        """Make the API match; return True if anything was written. A write the API
        server refuses (a conflict: someone else changed a slice) makes the next call
        list again."""
        try:
            return await self._publish(specs)
        except ApiError:
            self._known = None
            raise

    async def _publish(self, specs: list[SliceSpec]) -> bool:
        # Now and then look again, in case someone else deleted or changed a slice; the
        # interval is spread so a fleet's nodes do not all list at once.
        current = self._known
        if current is None or time.monotonic() - self._listed_at > RELIST_S * random.uniform(0.5, 1.0):
            rechecks = self._rechecks
            current = {s["metadata"]["name"]: s for s in await self.existing()}
            self._listed_at = time.monotonic()
            # Kept only if nothing was deleted meanwhile; otherwise the loop, woken by
            # the recheck, lists again.
            self._known = current if rechecks == self._rechecks else None
        count = len(specs)
        generation = max((s["spec"]["pool"]["generation"] for s in current.values()), default=0)
        desired = {s.name: slice_object(self.driver, self.node, s, generation, count) for s in specs}
        up_to_date = (
            set(current) == set(desired)
            and all(_comparable(current[n]["spec"]) == _comparable(desired[n]["spec"]) for n in desired)
            and len({s["spec"]["pool"]["generation"] for s in current.values()}) <= 1
        )
        if up_to_date:
            return False
        generation += 1
        for name, spec in zip(desired, specs, strict=True):
            obj = slice_object(self.driver, self.node, spec, generation, count)
            if self.owner:
                obj["metadata"]["ownerReferences"] = [self.owner]
            path = path_for(API_VERSION, "resourceslices", name)
            # Only the metadata comes back: a slice can be 100 KB, and parsing the echo of
            # it was a sixth of a NodeHost's CPU while a fleet started. What was sent is
            # what is remembered.
            self._writing.add(name)  # its watch event may come before the answer
            try:
                written = await self._write(path, obj, current.get(name))
            finally:
                self._writing.discard(name)
            current[name] = dict(obj, metadata=written["metadata"])
            self.writes += 1
        for name in set(current) - set(desired):
            await self.client.delete_if_exists(path_for(API_VERSION, "resourceslices", name))
            del current[name]
            self.writes += 1
        return True

    async def _write(self, path: str, obj: Obj, existing: Obj | None) -> Obj:
        """Replace the slice, or create it. One deleted since it was last seen (a kubelet
        wiping the node's slices as it restarts, a stale list) is created again at once,
        not left to the next try seconds later with a warning."""
        if existing is not None:
            obj["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            try:
                return await self.client.replace(path, obj, metadata_only=True)
            except ApiError as exc:
                if not exc.not_found:
                    raise
            del obj["metadata"]["resourceVersion"]
        return await self.client.create(path_for(API_VERSION, "resourceslices"), obj, metadata_only=True)

    async def remove_all(self) -> None:
        self._known = None
        try:
            for item in await self.existing():
                await self.client.delete_if_exists(path_for(API_VERSION, "resourceslices", item["metadata"]["name"]))
        except ApiError:
            pass


class SliceWatcher(RoutedWatch):
    """One metadata-only watch of ResourceSlices feeding the publishers of one node (a
    driver on a real node) or of every node of a NodeHost (routedwatch.py)."""

    def __init__(self, client: KubeClient, params: dict[str, str] | None):
        super().__init__(client, path_for(API_VERSION, "resourceslices"), SLICE_NODE_LABEL, params, metadata_only=True)

    @classmethod
    def for_node(cls, client: KubeClient, node: str, driver: str) -> SliceWatcher:
        return cls(client, {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"})

    @classmethod
    def for_host(cls, client: KubeClient) -> SliceWatcher:
        return cls(client, None)
