"""One synthetic node: its hardware, a driver instance per driver, and its fake kubelet.

Everything a real node has, laid out as on a real node under ``<root>``:
``kubelet/plugins_registry``, ``kubelet/plugins/<driver>/`` (sockets, checkpoint, lock)
and ``cdi/``; beside them the faults its hardware has (``hardware-faults.json``), which
outlive the process that emulates it as the checkpoints do. The kubelet reaches the
drivers only through those sockets: built-in drivers run in this process, external ones
as processes of their own (external.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from fake_devices import sysfs
from fake_devices.hardware import NodeHardware
from fake_devices.profiles import HardwareProfile
from testbed.config import KUBELET_SYNC_FREQUENCY_S, REGISTRY_BURST, REGISTRY_PULL_QPS
from testbed.drivers import driver_on_node, drivers_for
from testbed.drivers.backend import LocalBackend
from testbed.errors import TestbedError
from testbed.fleet.external import (
    ExternalDriver,
    ExternalDriverSpec,
    ShortPaths,
    driver_environment,
    next_generation,
)
from testbed.fleet.identity import DRIVER_CONTAINER, DRIVER_IMAGE, DRIVER_NAMESPACE, DriverPod
from testbed.fleet.instances import RolledOut, replace_instance, wait_registered
from testbed.keys import KUBELET_LABEL, PROFILE_LABEL
from testbed.kubeapi import KubeClient
from testbed.kubelet.containerevents import Told
from testbed.kubelet.kubelet import FakeKubelet
from testbed.kubelet.lease import LeaseFence
from testbed.kubelet.node import NodeSpec, NodeWatcher
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.prepare import DriverPaths
from testbed.kubeletplugin.slices import SliceWatcher
from testbed.tasks import cancel_and_wait

PLUGIN_SCAN_INTERVAL_S = 10.0
"""How often a kubelet polls its registry where inotify cannot be had (see dirwatch): a
hundred nodes polling every second cost a NodeHost ~10% of its CPU."""
HEALTH_CHECK_TIMEOUT_S = 120
"""What a synthetic node's drivers advertise: their streams then re-send the health snapshot
every 40 s, not every 10 s. Changes still go out at once, and a stream that ends makes
every device Unknown at once; the timeout only bounds how long a hung driver's devices
read as they last were. The heartbeats were 43% of an idle NodeHost's CPU (200 gpu8
nodes: 0.072 core with them every 10 s, 0.041 without any)."""

HARDWARE_FAULTS = "hardware-faults.json"
"""In a node's root: the faults in force on its hardware (``NodeHardware.fault_record``)."""


class SyntheticNode:
    def __init__(
        self,
        name: str,
        profile: HardwareProfile,
        root: Path,
        client: KubeClient,
        claims: ClaimReader,
        seed: int = 0,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        slice_watcher: SliceWatcher | None = None,
        node_watcher: NodeWatcher | None = None,
        driver_client: KubeClient | None = None,
        bind_drivers: Callable[[], Awaitable[None]] | None = None,
        devices_per_slice: int | None = None,
        drivers: list[str] | None = None,
        external: list[ExternalDriverSpec] | None = None,
        driver_credentials: Callable[[DriverPod], Awaitable[tuple[Path, str]]] | None = None,
        watch_client: KubeClient | None = None,
        fence: LeaseFence | None = None,
        declared_features: list[str] | None = None,
        address: str | None = None,
        sync_frequency_s: float = KUBELET_SYNC_FREQUENCY_S,
        pull_limit: tuple[int, int] = (REGISTRY_PULL_QPS, REGISTRY_BURST),
    ):
        """``client``: the kubelet's; ``claims``: where drivers read claims without a
        ``driver_client`` of their own; ``driver_client``: the drivers' (the kubelet's by
        default); ``watch_client``: what the kubelet's pod watch holds a connection on
        (the kubelet's by default). ``bind_drivers``: run before the drivers start (it
        gives the drivers their node-bound credentials). ``drivers``: the built-in
        drivers to run (default: those the profile's hardware needs); ``external``:
        drivers run from a command, which ``driver_credentials`` gives a kubeconfig and a
        pod UID for a driver pod (each its own, of its generation: 0 unless rolled out). ``slice_watcher``,
        ``node_watcher``: the host's watches of its nodes' slices and Nodes (default: each of this node's own).
        ``fence``: the node is one of a fleet's, which one NodeHost at a time serves.
        ``declared_features``: what its kubelet declares (declared.py); ``address``: its
        InternalIP (default: derived from its name); ``sync_frequency_s``, ``pull_limit``:
        its kubelet's syncFrequency, registryPullQPS and registryBurst."""
        self.name = name
        self.bind_drivers = bind_drivers
        self.root = root
        self.hardware = NodeHardware(name, profile, seed, kept_in=root / HARDWARE_FAULTS)
        self.backend = LocalBackend(self.hardware)
        kubelet_dir, cdi_dir = root / "kubelet", root / "cdi"
        built_in = drivers_for(profile) if drivers is None else drivers
        built_in_short = ShortPaths.needed_by(kubelet_dir, built_in)
        self.short_paths = ShortPaths.for_node(root) if external or built_in_short else None
        if self.short_paths is not None:
            self.short_paths.link(kubelet_dir)
        short = self.short_paths if built_in_short else None
        spec = self.node_spec(name, profile.name, labels, taints, declared_features, address)

        def make_kubelet() -> FakeKubelet:
            return FakeKubelet(
                client,
                spec,
                kubelet_dir,
                cdi_dir,
                scan_interval_s=PLUGIN_SCAN_INTERVAL_S,
                registry_dir=None if self.short_paths is None else self.short_paths.registry,
                watch_client=watch_client,
                fence=fence,
                node_watcher=node_watcher,
                durable=False,  # as its drivers: a synthetic node's state is throw-away
                preloaded_images=(DRIVER_IMAGE,),
                sync_frequency_s=sync_frequency_s,
                pull_limit=pull_limit,
            )

        self._make_kubelet = make_kubelet
        self.kubelet = make_kubelet()
        self.drivers = [
            driver_on_node(
                driver,
                name,
                DriverPaths.for_node(
                    kubelet_dir,
                    driver,
                    cdi_dir,
                    registry_dir=None if short is None else short.registry,
                    plugins_dir=None if short is None else short.plugins,
                ),
                self.backend,
                driver_client or client,
                # Claim reads too go under the drivers' identity, so deploy/'s RBAC judges them.
                claims if driver_client is None else ClaimReader(driver_client),
                durable=False,
                slice_watcher=slice_watcher,
                devices_per_slice=devices_per_slice,
                health_timeout_s=HEALTH_CHECK_TIMEOUT_S,
            )
            for driver in built_in
        ]
        self.external = [self._external_driver(spec) for spec in external or []]
        self.driver_credentials = driver_credentials

    @staticmethod
    def node_spec(
        name: str,
        profile: str,
        labels: Mapping[str, str] | None,
        taints: list[dict[str, str]] | None,
        declared_features: list[str] | None = None,
        address: str | None = None,
        kubelet: str = "fake",
    ) -> NodeSpec:
        spec = NodeSpec(
            name,
            labels={PROFILE_LABEL: profile, KUBELET_LABEL: kubelet, **(labels or {})},
            declared_features=list(declared_features or []),
            address=address,
        )
        if taints is not None:
            spec.taints = [dict(t) for t in taints]
        return spec

    async def start(self) -> None:
        # The drivers' token names the driver pod's node whether or not the Node exists
        # yet, so it is fetched while the kubelet registers: two round trips off each
        # node's start.
        binding = None
        if self.bind_drivers is not None and self.drivers:
            binding = asyncio.ensure_future(self.bind_drivers())
        try:
            await self.kubelet.start()  # the Node first: slices are owned by it
        except BaseException:
            await cancel_and_wait(binding)
            raise
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.name,
            "uid": self.kubelet.node.uid,
            "controller": True,
        }
        if binding is not None:
            await binding
        for driver in self.drivers:
            driver.publisher.owner = owner
            if self.kubelet.node.created:  # a new Node owns no slices yet
                driver.publisher.assume_none_exist()
            await driver.start()
        await self.kubelet.plugins.scan()  # registered before the node counts as started
        if self.external:
            self.publish_hardware()
            for external in self.external:
                await external.start(await self._external_environment(external))

    def publish_hardware(self) -> None:
        """Rewrite $HARDWARE_DIR (inventory.json and the sysfs-like tree) for the node's
        external drivers; after every change of the emulated hardware."""
        if self.external:
            sysfs.write(self.hardware, self.root / "hardware")

    def _external_driver(self, spec: ExternalDriverSpec) -> ExternalDriver:
        """An instance whose driver pod (its own, of its generation) shows what happens to
        it, as the kubelet shows its container: the probe's and the kills' Events, its
        exits and restarts (when the kubelet's back-off lets it); nothing without the pod."""
        pod_name = DriverPod(self.name, spec.name, spec.generation).name

        def tell(kind: str, reason: str, message: str) -> None:
            pod = self.kubelet.pods.known_pod(DRIVER_NAMESPACE, pod_name)
            if pod is not None:
                self.kubelet.pods.tell(pod, Told(kind, reason, message), DRIVER_CONTAINER)

        async def process_changed(exit_code: int | None) -> None:
            await self.kubelet.pods.process_changed(DRIVER_NAMESPACE, pod_name, DRIVER_CONTAINER, exit_code)

        async def restart_when() -> None:  # the kubelet's back-off decides, as for its own containers
            await self.kubelet.pods.process_restart(DRIVER_NAMESPACE, pod_name, DRIVER_CONTAINER)

        return ExternalDriver(spec, self.name, self.root, tell, process_changed, restart_when)

    async def _external_environment(self, external: ExternalDriver) -> dict[str, str]:
        """What its pod gives it; the pod (made if need be) carries its liveness probe."""
        if self.driver_credentials is None:
            raise TestbedError(f"node {self.name}: no credentials to give its external drivers")
        spec, port = external.spec, external.reserve_liveness_port()
        probe = None if spec.liveness is None or port is None else spec.liveness.as_probe(port)
        pod = DriverPod(self.name, spec.name, spec.generation, probe)
        kubeconfig, pod_uid = await self.driver_credentials(pod)
        assert self.short_paths is not None  # a node with command-line drivers has them
        return driver_environment(self.name, self.root, (pod.name, pod_uid), kubeconfig, self.short_paths)

    async def roll_external(
        self, driver: str, command: tuple[str, ...] | None, surge: bool, timeout_s: float, generation: int | None = None
    ) -> RolledOut:
        """Replace ``driver``'s instance with one of ``generation`` (next_generation:
        ``command``, or the same one), as a DaemonSet's rolling update replaces its pod: with ``surge``
        the new one starts beside the old and the old stops once the kubelet registered
        the new (maxSurge); else the old stops first (maxUnavailable)."""
        old = next((e for e in self.external if e.spec.name == driver), None)
        if old is None:
            raise TestbedError(f"node {self.name} runs no command-line driver {driver}")
        started, new = time.monotonic(), self._external_driver(next_generation(old.spec, command, generation))
        environment = await self._external_environment(new)
        known: list[object] = []

        def before_start() -> None:
            known[:] = self.kubelet.plugins.instances(driver)

        async def registered() -> None:
            await wait_registered(self.kubelet.plugins, new, timeout_s, known)

        return await replace_instance(self.external, new, environment, surge, registered, started, before_start)

    async def restart_kubelet(self) -> None:
        """The node's kubelet restarted in place (an upgrade, a crash), everything else
        running on: its pods' containers and its drivers. As a kubelet starting on a node
        it ran on before, the new one deletes the node's slices (the drivers publish them
        again), registers the drivers anew from their sockets, admits its pods again and
        finds them as the runtime kept them, from its checkpoint."""
        await self.kubelet.stop()
        self.kubelet = self._make_kubelet()
        await self.kubelet.start()
        await self.kubelet.plugins.scan()

    async def wait_ready(self, timeout_s: float) -> None:
        """Every driver registered with the kubelet; the built-in ones' slices published
        (an external driver's slices are its own business: some publish none)."""
        for driver in self.drivers:
            await self.kubelet.plugins.wait_for_driver(driver.name, timeout_s)
            async with asyncio.timeout(timeout_s):
                await driver.published.wait()
        deadline = time.monotonic() + timeout_s
        for external in self.external:
            await wait_registered(self.kubelet.plugins, external, deadline - time.monotonic())

    async def stop_external(self) -> None:
        for external in self.external:
            await external.stop()
        if self.short_paths is not None:
            self.short_paths.unlink()

    async def stop(self) -> None:
        for driver in self.drivers:
            await driver.stop()
        await self.stop_external()
        await self.kubelet.stop()
