"""The built-in drivers, by name: the one place that lists them.

Each folder here is one kind of device and its driver (see ``gpu/``, ``nic/``,
``fpga/``): its section of a hardware profile, the devices it publishes, its opaque
config and DeviceClasses. Adding a kind is a folder and a line in ``FOLDERS``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from fake_devices.profiles import HardwareProfile, ProfileLoader
from testbed.drivers.backend import DeviceBackend
from testbed.drivers.emulated import DriverKind
from testbed.errors import TestbedError
from testbed.kubeapi import KubeClient
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.grpc_services import HEALTH_CHECK_TIMEOUT_S
from testbed.kubeletplugin.plugin import DriverPlugin
from testbed.kubeletplugin.prepare import DriverPaths
from testbed.kubeletplugin.slices import SliceWatcher

FOLDERS = ("gpu", "nic", "fpga")

KINDS: dict[str, DriverKind] = {
    kind.name: kind for kind in (importlib.import_module(f"{__name__}.{folder}").KIND for folder in FOLDERS)
}
"""Driver name -> what the driver is."""

PROFILES = ProfileLoader(
    (kind.hardware for kind in KINDS.values()),
    [kind.profiles for kind in KINDS.values() if kind.profiles is not None],
)


def load_profile(name_or_path: str) -> HardwareProfile:
    """A hardware profile whose device sections are the built-in kinds'."""
    return PROFILES.load(name_or_path)


def kind_of(driver: str) -> DriverKind:
    try:
        return KINDS[driver]
    except KeyError:
        raise TestbedError(f"unknown driver {driver!r}", hint=f"use one of {', '.join(KINDS)}") from None


def drivers_for(profile: HardwareProfile) -> list[str]:
    """The drivers a node with this hardware runs: those whose devices it has."""
    return [name for name, kind in KINDS.items() if profile.count(kind.hardware.section)]


def device_classes() -> list[dict[str, Any]]:
    return [doc for kind in KINDS.values() for doc in kind.device_classes()]


def class_kinds() -> dict[str, tuple[str, str]]:
    """DeviceClass name -> (driver, device kind it selects)."""
    return {cls: (kind.name, device) for kind in KINDS.values() for cls, device in kind.classes.items()}


def driver_on_node(
    driver: str,
    node: str,
    paths: DriverPaths,
    backend: DeviceBackend,
    client: KubeClient,
    claims: ClaimReader,
    *,
    durable: bool = True,
    publish_slices: bool = True,
    slice_watcher: SliceWatcher | None = None,
    devices_per_slice: int | None = None,
    liveness_port: int | None = None,
    call_log: Path | None = None,
    health_timeout_s: int = HEALTH_CHECK_TIMEOUT_S,
) -> DriverPlugin:
    """A built-in driver serving one node: what the standalone driver, synthetic nodes,
    tests and benchmarks all run (the options are DriverPlugin's)."""
    return DriverPlugin(
        kind_of(driver).make(backend, client, node),
        node,
        paths,
        client,
        claims,
        liveness_port=liveness_port,
        publish_slices=publish_slices,
        durable=durable,
        slice_watcher=slice_watcher,
        call_log=call_log,
        devices_per_slice=devices_per_slice,
        health_timeout_s=health_timeout_s,
    )
