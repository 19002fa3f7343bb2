"""One synthetic node: its hardware, a driver instance per driver, and its fake kubelet.

Everything a real node has, laid out as on a real node under ``<root>``:
``kubelet/plugins_registry``, ``kubelet/plugins/<driver>/`` (sockets, checkpoint, lock)
and ``cdi/``. The kubelet reaches the drivers only through those sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from fake_devices.hardware import NodeHardware
from fake_devices.profiles import HardwareProfile
from testbed.driver.backend import LocalBackend
from testbed.driver.claims import ClaimCache
from testbed.driver.opaque_config import GPU_DRIVER, NIC_DRIVER
from testbed.driver.plugin import DriverPlugin
from testbed.driver.prepare import DriverPaths
from testbed.driver.slices import SliceWatcher
from testbed.kubeapi import KubeClient
from testbed.kubelet.kubelet import FakeKubelet
from testbed.kubelet.node import PROFILE_LABEL, NodeSpec

PLUGIN_SCAN_INTERVAL_S = 10.0
"""A synthetic node's drivers start next to its kubelet, which scans as they do; the poll
is a safety net. A hundred nodes polling every second cost a NodeHost ~10% of its CPU."""


def drivers_for(profile: HardwareProfile) -> list[str]:
    return [d for d, present in ((GPU_DRIVER, profile.gpu_count), (NIC_DRIVER, profile.nic_count)) if present]


class SyntheticNode:
    def __init__(
        self,
        name: str,
        profile: HardwareProfile,
        root: Path,
        client: KubeClient,
        claims: ClaimCache,
        seed: int = 0,
        labels: Mapping[str, str] | None = None,
        watch_pods: bool = True,
        taints: list[dict[str, str]] | None = None,
        slice_watcher: SliceWatcher | None = None,
        driver_client: KubeClient | None = None,
        bind_drivers: Callable[[], Awaitable[None]] | None = None,
        runtime_client: KubeClient | None = None,
        devices_per_slice: int | None = None,
    ):
        """``client``: the kubelet's; ``driver_client``: the drivers'; ``runtime_client``:
        the emulated container runtime's (all the same by default). ``bind_drivers``: run
        once the Node exists and before the drivers start (it gives the drivers their
        node-bound credentials)."""
        self.name = name
        self.bind_drivers = bind_drivers
        self.root = root
        self.hardware = NodeHardware(name, profile, seed)
        self.backend = LocalBackend(self.hardware)
        kubelet_dir, cdi_dir = root / "kubelet", root / "cdi"
        self.kubelet = FakeKubelet(
            client,
            self.node_spec(name, profile.name, labels, taints),
            kubelet_dir,
            cdi_dir,
            watch_pods=watch_pods,
            scan_interval_s=PLUGIN_SCAN_INTERVAL_S,
            runtime_client=runtime_client,
        )
        self.drivers = [
            DriverPlugin(
                driver,
                name,
                DriverPaths.for_node(kubelet_dir, driver, cdi_dir),
                self.backend,
                driver_client or client,
                claims,
                durable=False,
                slice_watcher=slice_watcher,
                devices_per_slice=devices_per_slice,
            )
            for driver in drivers_for(profile)
        ]

    @staticmethod
    def node_spec(
        name: str, profile: str, labels: Mapping[str, str] | None, taints: list[dict[str, str]] | None
    ) -> NodeSpec:
        spec = NodeSpec(name, labels={PROFILE_LABEL: profile, **(labels or {})})
        if taints is not None:
            spec.taints = [dict(t) for t in taints]
        return spec

    async def start(self) -> None:
        await self.kubelet.start()  # the Node first: slices are owned by it
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.name,
            "uid": self.kubelet.node.uid,
            "controller": True,
        }
        if self.bind_drivers is not None and self.drivers:
            await self.bind_drivers()
        for driver in self.drivers:
            driver.publisher.owner = owner
            if self.kubelet.node.created:  # a new Node owns no slices yet
                driver.publisher.assume_none_exist()
            await driver.start()
        await self.kubelet.plugins.scan()  # register now rather than at the next poll

    async def wait_ready(self, timeout_s: float) -> None:
        """Every driver registered with the kubelet and its slices published."""
        for driver in self.drivers:
            await self.kubelet.plugins.wait_for_driver(driver.driver, timeout_s)
            async with asyncio.timeout(timeout_s):
                await driver.published.wait()

    async def stop(self) -> None:
        for driver in self.drivers:
            await driver.stop()
        await self.kubelet.stop()
