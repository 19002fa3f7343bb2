"""NodeHost: a Ray actor that hosts many synthetic nodes in one asyncio process.

Each node's kubelet watches its own pods, as a kubelet does (``spec.nodeName=<node>``):
the API server sends a host only the events of its nodes, so a host's cost does not grow
with the rest of the cluster. The drivers read each claim they prepare, as the upstream
kubelet-plugin helper does, rather than every host watching every claim. The host also
exposes the hardware's fault switches, so scenarios and tests can break devices on purpose.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import platform
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, generate_latest

from fake_devices import sysfs
from fake_devices.hardware import Health, NodeHardware
from fake_devices.profiles import HardwareProfile
from testbed import heap
from testbed.config import log_to_stderr
from testbed.controlplane.binaries import ensure_node_binaries
from testbed.drivers import drivers_for, load_profile
from testbed.errors import TestbedError
from testbed.files import private_dir, write_secret
from testbed.fingerprint import code_version
from testbed.fleet.drain import DrainResult, drain, drain_process_node
from testbed.fleet.external import (
    ExternalDriver,
    ExternalDriverSpec,
    ShortPaths,
    driver_environment,
    next_generation,
)
from testbed.fleet.fencing import NodeFence, Server
from testbed.fleet.identity import (
    DRIVER_CONTAINER,
    DRIVER_NAMESPACE,
    DriverPod,
    NodeAuthority,
    bind_driver_token,
    driver_token,
)
from testbed.fleet.instances import RolledOut, replace_instance, socket_inodes, wait_connected
from testbed.fleet.loopwatch import LoopWatch
from testbed.fleet.membership import Membership, NodeRecipe, in_ray
from testbed.fleet.processcpu import PROCESS_CPU
from testbed.fleet.synthetic_node import HARDWARE_FAULTS, SyntheticNode
from testbed.fleet.tlsmemory import small_tls_read_buffers
from testbed.kubeapi import KubeClient, path_for
from testbed.kubelet.declared import cluster_declared_features
from testbed.kubelet.node import NodeWatcher
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.leftovers import prepared_state
from testbed.kubeletplugin.slices import SliceWatcher
from testbed.metrics_server import MetricsServer
from testbed.realnode.kubelet_api import reference_lines
from testbed.realnode.node import ContainerRef, ProcessNode

log = logging.getLogger(__name__)
START_CONCURRENCY = 8
"""Nodes a host brings up at once; the fleet lowers it when there are many hosts."""

HOST_CONNECTIONS = 16
"""HTTP/1.1 connections a NodeHost keeps to the API server. Each new one costs a TLS
handshake; 64 per host made handshakes a tenth of a starting NodeHost's CPU, and the
API server, not the connection count, is what limits a fleet's start."""

CREDENTIALS_DIR = ".credentials"
REAL_KUBELET_SCRAPE_S = 4.0


def _driver_container(pod: DriverPod) -> ContainerRef:
    return ContainerRef(DRIVER_NAMESPACE, pod.name, DRIVER_CONTAINER)


def _ray_node() -> str:
    """The Ray node this process runs on ("" outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # not in a Ray actor
        return ""


def _ray_node_address() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else ""  # type: ignore[no-untyped-call]
    except Exception:  # not in a Ray actor
        return ""


def _restarted_by_ray() -> bool:
    """Asked once, as the host starts: a restart is a new process. (Ray's answer reads a
    property Ray itself deprecated, whose warning would open every NodeHost's log.)"""
    if not in_ray():  # a plain object in a test or a script, joined to Ray or not
        return False
    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


class NodeHost:
    def __init__(
        self,
        kubeconfig: str | bytes,
        nodes_dir: str,
        nodes: list[NodeRecipe],
        seed: int = 0,
        name: str = "",
        authority: NodeAuthority | None = None,
        declared_features: list[str] | None = None,
        log_level: str = "warning",
    ):
        """``nodes``: what to run; profiles are shipped names or YAML paths. ``name``: the
        actor's name; with it the host remembers its nodes on disk, so a host that Ray
        restarts after the fleet was scaled comes back with the nodes it had, not the
        ones it was created with. ``authority``: run each node under its own identity
        (see identity.py); None: every node uses the host's credentials. ``kubeconfig``:
        a path, or the content (flattened): a host on another machine writes it there.
        ``declared_features``: what its kubelets declare (declared.py; the fleet reads it
        once for all its hosts); None: read from the API server at start. ``log_level``:
        the fleet's (config.LOG_LEVELS)."""
        small_tls_read_buffers()
        self.authority = authority
        self.node_clients: dict[str, list[KubeClient]] = {}
        """A node's own clients (kubelet, drivers), closed when the node goes."""
        log_to_stderr(log_level)
        self.log_level = log_level
        self.nodes_dir = Path(nodes_dir)
        self.kubeconfig = self._own_copy(kubeconfig, name) if isinstance(kubeconfig, bytes) else Path(kubeconfig)
        self.recipes = {recipe.name: recipe for recipe in nodes}
        self.seed = seed
        self.membership = Membership(name) if name and in_ray() else None
        pid = os.getpid()
        self.server = Server(name or f"pid-{pid}", uuid.uuid4().hex[:12], _ray_node() or platform.node(), pid)
        """This run of the host: it stamps the Leases of the nodes it serves (fencing.py)."""
        self.nodes: dict[str, SyntheticNode] = {}
        self.process_nodes: dict[str, ProcessNode] = {}
        """Real-kubelet nodes: their kubelet, runtime and driver run as processes."""
        self.process_drivers: dict[str, list[ExternalDriver]] = {}
        """Real-kubelet nodes' command-line drivers, which this host runs beside their kubelet."""
        self.process_hardware: dict[str, NodeHardware] = {}
        """Real-kubelet nodes' emulated hardware, as their drivers are told of it (faults)."""
        self.kubelet_restarts: Counter[str] = Counter()
        """Kubelets restarted in place (``restart_kubelet``) since this host started, by node."""
        self.client: KubeClient | None = None
        self.declared_features = declared_features
        self.watch_client: KubeClient | None = None
        self.token_connections: KubeClient | None = None
        """Shared by every node's drivers: their tokens ride on the same TLS connections."""
        self.claims: ClaimReader | None = None
        self.slice_watcher: SliceWatcher | None = None
        self.node_watcher: NodeWatcher | None = None
        self.metrics = MetricsServer()
        self.loop_watch = LoopWatch()
        self._restart: asyncio.Task[list[str]] | None = None
        self._letting_go: set[asyncio.Task[None]] = set()
        self._removals: dict[str, asyncio.Task[DrainResult]] = {}
        """Drains under way, by node: they go on when the caller is gone (`testbed scale`
        interrupted), and a second removal of the same node waits for the first."""
        self._drain_gate = asyncio.Semaphore(START_CONCURRENCY)
        self.ready_count = 0
        self.restarted = _restarted_by_ray()
        if self.restarted:
            # Ray re-ran the constructor after this host died: bring the same nodes back.
            # Their drivers repair from the checkpoints on disk; their kubelets find their
            # pods through the pod watch. The event loop already runs here.
            self.recipes = self._remembered() or self.recipes
            self._restart = asyncio.get_event_loop().create_task(self.start())
        else:
            self._remember()

    def _own_copy(self, content: bytes, name: str) -> Path:
        """The host's kubeconfig on the machine it runs on (0600, in a 0700 directory)."""
        private_dir(self.nodes_dir.parent)
        private_dir(self.nodes_dir)
        path = private_dir(self.nodes_dir / CREDENTIALS_DIR) / f"{name or os.getpid()}.kubeconfig"
        write_secret(path, content)
        return path

    def _remember(self) -> None:
        if self.membership is not None:
            self.membership.save(self.recipes.values())

    def _remembered(self) -> dict[str, NodeRecipe] | None:
        return None if self.membership is None else self.membership.load()

    def _fence(self, node: str) -> NodeFence:
        return NodeFence(node, self.server, self._lost)

    def _lost(self, node: str, holder: Server | None) -> None:
        """Another server took ``node`` (this host was presumed lost): stop serving it
        here without a word to the API server, and leave the fleet's memory alone: it
        is the new server's now."""
        running = self.nodes.pop(node, None)
        self.recipes.pop(node, None)
        if running is None:
            return
        self.ready_count -= 1
        task = asyncio.get_running_loop().create_task(self._let_go(running), name=f"let-go-{node}")
        self._letting_go.add(task)
        task.add_done_callback(self._letting_go.discard)

    async def _let_go(self, node: SyntheticNode) -> None:
        await node.stop()
        await self._close_clients(node.name)

    async def _watch_own_nodes(self) -> None:
        """Point the host's watches at its synthetic nodes (a real-kubelet node's kubelet
        and driver watch their own)."""
        for watcher in (self.slice_watcher, self.node_watcher):
            if watcher is not None:
                await watcher.watch_nodes(self.nodes)

    async def start(self, ready_timeout_s: float = 300.0, concurrency: int = START_CONCURRENCY) -> list[str]:
        await self._start_services()
        with heap.starting_nodes():
            await self._add_nodes(list(self.recipes.values()), ready_timeout_s, concurrency)
        return self._names()

    async def _start_services(self) -> None:
        """What every node of the host shares: clients, watches, metrics."""
        self.client = KubeClient.from_kubeconfig(self.kubeconfig, HOST_CONNECTIONS)
        # Each kubelet's pod watch holds a connection; under shared credentials they come
        # from here, unbounded, and the nodes' requests keep the host's few connections.
        self.watch_client = KubeClient(self.client.credentials, connection_limit=0)
        if self.authority is not None:
            self.token_connections = self.authority.token_connections(HOST_CONNECTIONS)
        self.claims = ClaimReader(self.client)
        self.slice_watcher = SliceWatcher.for_host(self.client)
        self.slice_watcher.start()
        self.node_watcher = NodeWatcher.for_host(self.client)
        self.node_watcher.start()
        self.loop_watch.start()
        if self.declared_features is None:
            self.declared_features = await cluster_declared_features(self.client)
        await self.metrics.start()

    async def add_nodes(
        self, recipes: list[NodeRecipe], ready_timeout_s: float = 300.0, concurrency: int = START_CONCURRENCY
    ) -> list[str]:
        """Start these nodes (those not already running) and wait until they are ready."""
        with heap.starting_nodes():
            return await self._add_nodes(recipes, ready_timeout_s, concurrency)

    async def _add_nodes(self, recipes: list[NodeRecipe], ready_timeout_s: float, concurrency: int) -> list[str]:
        assert self.client is not None and self.claims is not None, "start() first"
        profiles = {name: load_profile(name) for name in {recipe.profile for recipe in recipes}}
        fresh: list[SyntheticNode | ProcessNode] = []
        for recipe in recipes:
            if recipe.name in self.nodes or recipe.name in self.process_nodes:
                continue
            self.recipes[recipe.name] = recipe
            if recipe.kubelet == "real":
                process_node = self._process_node(recipe, profiles[recipe.profile])
                self.process_nodes[recipe.name] = process_node
                fresh.append(process_node)
                continue
            kubelet_client, driver_client, bind_drivers = self._identity(recipe.name)
            profile = profiles[recipe.profile]
            node = SyntheticNode(
                recipe.name,
                profiles[recipe.profile],
                self.nodes_dir / recipe.name,
                kubelet_client,
                self.claims,
                self.seed,
                labels=recipe.labels,
                taints=recipe.taints,
                slice_watcher=self.slice_watcher,
                node_watcher=self.node_watcher,
                driver_client=driver_client,
                bind_drivers=bind_drivers,
                devices_per_slice=recipe.devices_per_slice,
                drivers=list(recipe.drivers) if recipe.drivers is not None else drivers_for(profile),
                external=list(recipe.external),
                driver_credentials=self._external_credentials(recipe.name) if recipe.external else None,
                watch_client=self.watch_client if self.authority is None else None,
                fence=self._fence(recipe.name),
                declared_features=self.declared_features,
                address=recipe.address,
                sync_frequency_s=recipe.sync_frequency_s,
                pull_limit=recipe.pull_limit,
            )
            self.nodes[recipe.name] = node
            fresh.append(node)
        self._remember()
        await self._watch_own_nodes()
        # Bounded: a burst of every node at once makes etcd time out, and retries waste more.
        gate = asyncio.Semaphore(concurrency)

        client = self.client

        async def bring_up(node: SyntheticNode | ProcessNode) -> None:
            async with gate:
                if isinstance(node, ProcessNode):
                    await self._issue_credentials(node)
                await node.start()
                if isinstance(node, ProcessNode):
                    if node.drivers:  # under shared credentials there are no driver pods
                        pod = DriverPod(node.name) if self.authority is not None else None
                        node.keep_driver_running(None if pod is None else _driver_container(pod))
                    await self._start_process_drivers(node, ready_timeout_s)
                    await node.wait_ready(ready_timeout_s, client)
                else:
                    await node.wait_ready(ready_timeout_s)
                self.ready_count += 1

        await asyncio.gather(*(bring_up(node) for node in fresh))
        return [node.name for node in fresh]

    def _identity(self, node: str) -> tuple[KubeClient, KubeClient, Callable[[], Awaitable[None]] | None]:
        """The node's kubelet client, its drivers' client, and what binds the drivers'
        token once the Node exists; the host's own client for both without an authority."""
        assert self.client is not None
        if self.authority is None:
            return self.client, self.client, None
        admin = self.client
        kubelet = self.authority.kubelet_client(node)
        drivers = self.authority.driver_client(self.token_connections)
        self.node_clients[node] = [kubelet, drivers]
        return kubelet, drivers, lambda: bind_driver_token(admin, drivers, node)

    def _external_credentials(self, node: str) -> Callable[[DriverPod], Awaitable[tuple[Path, str]]]:
        """What a command-line driver on ``node`` authenticates with, and its pod's UID:
        with node identities, a kubeconfig holding a token bound to its own driver pod
        (of a generation: a rollout's new instance has a pod of its own)."""

        async def issue(pod: DriverPod) -> tuple[Path, str]:
            assert self.client is not None
            if self.authority is None:
                return self.kubeconfig, str(uuid.uuid5(uuid.NAMESPACE_URL, f"dra-testbed/{pod.name}"))
            token, pod_uid = await driver_token(self.client, pod)
            path = self.nodes_dir / node / "private" / f"{pod.name}.kubeconfig"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_secret(path, self.authority.kubeconfig({"token": token}))
            return path, pod_uid

        return issue

    async def _issue_credentials(self, node: ProcessNode) -> None:
        """A real-kubelet node's kubelet gets a kubeconfig of its own identity, and its
        built-in drivers what their DaemonSet's pod gives them (command-line drivers get
        theirs in _start_process_drivers): a token bound to their pod, its name and UID
        (which name their sockets), the kubelet's directories by names short enough for
        those sockets."""
        if self.authority is not None:
            private = node.root / "private"
            private.mkdir(parents=True, exist_ok=True)
            node.kubelet_kubeconfig = private / "kubelet.kubeconfig"
            write_secret(node.kubelet_kubeconfig, self.authority.kubelet_kubeconfig(node.name))
        if not node.drivers:
            return
        pod, short = DriverPod(node.name), ShortPaths.for_node(node.root)
        node.driver_kubeconfig, pod_uid = await self._external_credentials(node.name)(pod)
        short.link(node.kubelet_dir)
        node.driver_env = {
            "POD_NAME": pod.name,
            "POD_UID": pod_uid,
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(short.registry),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(short.plugins),
        }

    async def _close_clients(self, node: str) -> None:
        for client in self.node_clients.pop(node, []):
            await client.close()

    def _process_node(self, recipe: NodeRecipe, profile: HardwareProfile) -> ProcessNode:
        spec = SyntheticNode.node_spec(
            recipe.name, profile.name, recipe.labels, recipe.taints, address=recipe.address, kubelet="real"
        )
        root = self.nodes_dir / recipe.name
        built_in = list(recipe.drivers) if recipe.drivers is not None else drivers_for(profile)
        node = ProcessNode(spec, recipe.profile, built_in, root, self.kubeconfig, ensure_node_binaries(), "real")
        node.devices_per_slice = recipe.devices_per_slice
        node.sync_frequency_s = recipe.sync_frequency_s
        node.pull_limit = recipe.pull_limit
        node.foreign_drivers = [e.name for e in recipe.external]
        node.verbose = self.log_level == "debug"
        self.process_hardware[recipe.name] = NodeHardware(recipe.name, profile, self.seed, root / HARDWARE_FAULTS)
        PROCESS_CPU.watch(node)
        return node

    async def _start_process_drivers(self, node: ProcessNode, timeout_s: float) -> None:
        """A real-kubelet node's command-line drivers, each as on a fake-kubelet node: a
        driver pod and token of its own, the environment its DaemonSet's pod gets, its
        log, restarts and liveness probe kept by this host; each waited for until the
        kubelet connected to it (a driver that keeps crashing fails the node's start)."""
        specs = self.recipes[node.name].external
        if not specs:
            return
        ShortPaths.for_node(node.root).link(node.kubelet_dir)
        self._publish_hardware(node.name)
        started = self.process_drivers.setdefault(node.name, [])
        since = node.kubelet_log_size()
        for spec in specs:
            driver = self._process_driver(node, spec)
            await driver.start(await self._process_driver_environment(node, driver))
            started.append(driver)
        deadline = time.monotonic() + timeout_s
        for driver in started:
            await wait_connected(node, driver, deadline - time.monotonic(), since)

    def _process_driver(self, node: ProcessNode, spec: ExternalDriverSpec) -> ExternalDriver:
        """A command-line driver beside a real kubelet, which runs its pod: the pod's
        container ends when the driver exits, and the driver comes back when the kubelet
        starts that container again (at once, then after the kubelet's back-off). Under
        shared credentials there are no driver pods: it comes back after its own back-off."""
        if self.authority is None:
            return ExternalDriver(spec, node.name, node.root)
        container = _driver_container(DriverPod(node.name, spec.name, spec.generation))

        async def exited(exit_code: int | None) -> None:
            if exit_code is not None:
                node.end_container(container, exit_code)

        return ExternalDriver(
            spec, node.name, node.root, on_process=exited, restart_when=lambda: node.started_again(container)
        )

    async def _process_driver_environment(self, node: ProcessNode, driver: ExternalDriver) -> dict[str, str]:
        """The real kubelet runs the driver's pod in its fake runtime (a container that does
        nothing), so the pod carries no probe: the kubelet would send it to that container."""
        pod = DriverPod(node.name, driver.spec.name, driver.spec.generation)
        kubeconfig, pod_uid = await self._external_credentials(node.name)(pod)
        short = ShortPaths.for_node(node.root)
        return driver_environment(node.name, node.root, (pod.name, pod_uid), kubeconfig, short)

    async def _stop_process_drivers(self, name: str) -> None:
        for driver in self.process_drivers.pop(name, []):
            await driver.stop()

    async def remove_nodes(self, names: list[str], timeout_s: float = 300.0) -> list[dict[str, Any]]:
        """Drain these nodes and delete them from the cluster (see drain.py for the order)."""
        assert self.client is not None, "start() first"
        for name in names:
            if name not in self._removals:
                task = asyncio.get_running_loop().create_task(self._retire(name, timeout_s), name=f"retire-{name}")
                self._removals[name] = task
                task.add_done_callback(functools.partial(self._removed, name))
        results = await asyncio.gather(*(asyncio.shield(self._removals[name]) for name in names))
        heap.release()
        await self._watch_own_nodes()
        return [asdict(r) for r in results]

    def _removed(self, name: str, task: asyncio.Task[DrainResult]) -> None:
        if self._removals.get(name) is task:
            del self._removals[name]

    async def _retire(self, name: str, timeout_s: float) -> DrainResult:
        assert self.client is not None
        async with self._drain_gate:
            if name in self.process_nodes:
                node, external = self.process_nodes.pop(name), self.process_drivers.pop(name, [])
                self.process_hardware.pop(name, None)
                result = await drain_process_node(self.client, node, timeout_s, external)
                ShortPaths.for_node(node.root).unlink()
            else:
                result = await drain(self.client, self._node(name), timeout_s)
                del self.nodes[name]
                await self._close_clients(name)
        self.recipes.pop(name, None)
        self.ready_count -= 1
        self._remember()
        return result

    async def forget(self) -> None:
        """This host is being retired or its fleet stopped: drop its memory in the GCS."""
        if self.membership is not None:
            self.membership.forget()

    async def ready(self) -> list[str]:
        """The nodes, once started (waits for a restart to finish)."""
        if self._restart is not None:
            await self._restart
        return self._names()

    async def draining(self) -> list[str]:
        """Nodes being removed (a `testbed scale` interrupted while it drained them)."""
        return sorted(self._removals)

    async def settled(self) -> list[str]:
        """The nodes, once the removals under way are done (failed ones stay)."""
        await self.ready()
        await asyncio.gather(*(asyncio.shield(t) for t in list(self._removals.values())), return_exceptions=True)
        return self._names()

    def _names(self) -> list[str]:
        return sorted([*self.nodes, *self.process_nodes])

    async def progress(self) -> int:
        """Nodes ready so far (for the fleet's progress while it starts)."""
        return self.ready_count

    async def metrics_text(self) -> str:
        """What this host's /metrics serves, for a run that cannot reach its port, and
        its real-kubelet nodes' own DRA histograms (kubelet_api.reference_lines): the
        reference a run's report sets the fake kubelets' figures beside."""
        text = generate_latest(REGISTRY).decode()
        real = [node for node in self.process_nodes.values() if node.kind == "real"]
        if not real:
            return text
        answers = await asyncio.gather(
            # Well inside the 10 s a run gives a host's answer: one slow kubelet must not
            # cost the run the whole host's figures.
            *(asyncio.wait_for(node.kubelet_metrics(), REAL_KUBELET_SCRAPE_S) for node in real),
            return_exceptions=True,
        )
        lines = []
        for node, answer in zip(real, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("node %s: kubelet metrics not read: %s", node.name, answer)
                continue
            lines += reference_lines(node.name, answer)
        return text + "".join(f"{line}\n" for line in lines)

    async def metrics_port(self) -> int:
        """Where this host's drivers and kubelets export their metrics (one registry)."""
        return self.metrics.port

    async def stop(self) -> None:
        await asyncio.gather(*self._letting_go, return_exceptions=True)
        await self.metrics.stop()
        await self.loop_watch.stop()
        await asyncio.gather(*(node.stop() for node in self.nodes.values()), return_exceptions=True)
        await asyncio.gather(*(node.stop() for node in self.process_nodes.values()), return_exceptions=True)
        stopping = [self._stop_process_drivers(name) for name in list(self.process_drivers)]
        await asyncio.gather(*stopping, return_exceptions=True)
        for node in self.process_nodes.values():
            ShortPaths.for_node(node.root).unlink()
        for name in list(self.node_clients):
            await self._close_clients(name)
        for watcher in (self.slice_watcher, self.node_watcher):
            if watcher is not None:
                await watcher.stop()
        if self.client is not None:
            await self.client.close()
        if self.watch_client is not None:
            await self.watch_client.close()
        if self.token_connections is not None:
            await self.token_connections.close()

    def _node(self, name: str) -> SyntheticNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"this host has no node {name!r}") from None

    # --- rollouts --------------------------------------------------------------------

    async def roll_driver(
        self,
        node: str,
        driver: str,
        command: list[str] | None,
        surge: bool,
        generation: int | None = None,
        timeout_s: float = 120.0,
    ) -> dict[str, Any]:
        """Roll ``driver`` out anew on ``node`` (SyntheticNode.roll_external), as
        ``generation`` (the pool's new one; default: the node's next), remember the new
        instance for a restart of this host, and delete the driver pod it replaced."""
        new_command = None if command is None else tuple(command)
        if node in self.process_nodes:
            instances = self.process_drivers.get(node, [])
            rolling = self._roll_process_driver(
                self.process_nodes[node], driver, new_command, surge, timeout_s, generation
            )
        else:
            instances = self._node(node).external
            rolling = self._node(node).roll_external(driver, new_command, surge, timeout_s, generation)
        before = next((e.spec.generation for e in instances if e.spec.name == driver), 0)
        try:
            rolled = await rolling
        except BaseException:
            if any(e.spec.name == driver and e.spec.generation == before for e in instances):
                # Rolled back: the surge pod that never got ready goes, as a DaemonSet's would.
                await self._delete_driver_pod(DriverPod(node, driver, max(generation or 0, before + 1)))
            raise
        finally:  # the instance the node runs now, whether or not the new one came up
            recipe = self.recipes[node]
            current = {e.spec.name: e.spec for e in instances}
            self.recipes[node] = replace(recipe, external=tuple(current.get(e.name, e) for e in recipe.external))
            self._remember()
        await self._delete_driver_pod(DriverPod(node, driver, before))
        return asdict(rolled)

    async def _roll_process_driver(
        self,
        node: ProcessNode,
        driver: str,
        command: tuple[str, ...] | None,
        surge: bool,
        timeout_s: float,
        generation: int | None,
    ) -> RolledOut:
        """SyntheticNode.roll_external on a real-kubelet node, whose kubelet tells of the
        new instance in its log."""
        instances = self.process_drivers.get(node.name, [])
        old = next((e for e in instances if e.spec.name == driver), None)
        if old is None:
            raise TestbedError(f"node {node.name} runs no command-line driver {driver}")
        started, new = time.monotonic(), self._process_driver(node, next_generation(old.spec, command, generation))
        environment = await self._process_driver_environment(node, new)
        marks: dict[str, Any] = {}

        def before_start() -> None:
            # Taken once the old instance stopped (maxUnavailable): its socket inodes are
            # free for the new one's, and the kubelet has no other instance to connect to.
            marks.update(since=node.kubelet_log_size(), made_before=socket_inodes(new))

        async def registered() -> None:
            replacing = old if surge else None
            await wait_connected(node, new, timeout_s, marks["since"], replacing, marks["made_before"])

        return await replace_instance(instances, new, environment, surge, registered, started, before_start)

    async def _delete_driver_pod(self, pod: DriverPod) -> None:
        """Under shared credentials there are no driver pods."""
        if self.authority is not None:
            assert self.client is not None
            await self.client.delete_if_exists(path_for("v1", "pods", pod.name, DRIVER_NAMESPACE))

    # --- faults and inspection -----------------------------------------------------

    async def inject(self, node: str, **faults: Any) -> None:
        self._hardware_of(node).inject(**faults)
        self._publish_hardware(node, fail_next_prepares=faults.get("fail_next_prepares"))

    async def set_health(self, node: str, device: str, healthy: bool, message: str = "", fatal: bool = False) -> None:
        self._hardware_of(node).set_health(device, Health.HEALTHY if healthy else Health.UNHEALTHY, message, fatal)
        self._publish_hardware(node)

    async def clear_faults(self, node: str) -> None:
        self._hardware_of(node).clear_faults()
        self._publish_hardware(node, fail_next_prepares=0)

    async def restart_kubelet(self, node: str) -> None:
        """The node's kubelet restarted in place (``SyntheticNode.restart_kubelet``; the
        real kubelet's process on a real-kubelet node), its pods and drivers running on."""
        if node in self.process_nodes:
            process = self.process_nodes[node]
            await process.stop_process("kubelet")
            await process.start_kubelet()
        else:
            await self._node(node).restart_kubelet()
        self.kubelet_restarts[node] += 1

    async def lose_device(self, node: str, device: str) -> None:
        self._hardware_of(node).lose_device(device)
        self._publish_hardware(node)

    def _hardware_of(self, node: str) -> NodeHardware:
        """The node's emulated hardware: on a real-kubelet node, the model its drivers
        follow (they run as processes of their own)."""
        return self.process_hardware[node] if node in self.process_nodes else self._node(node).hardware

    def _publish_hardware(self, node: str, fail_next_prepares: int | None = None) -> None:
        """Show a change of the hardware to the node's drivers: on a real-kubelet node,
        $HARDWARE_DIR for command-line drivers and the faults file `testbed-driver`
        follows. ``fail_next_prepares``: told to `testbed-driver` only with the change
        that asks for it, as it counts them down itself."""
        if node not in self.process_nodes:
            self._node(node).publish_hardware()
            return
        process, hardware = self.process_nodes[node], self.process_hardware[node]
        if self.recipes[node].external:
            sysfs.write(hardware, process.root / "hardware")
        if process.drivers:
            faults, sick = hardware.faults, {h.device: h for h in hardware.health() if h.health is Health.UNHEALTHY}
            named = {d: h for d, h in sick.items() if hardware.device(d).parent not in sick}
            process.set_faults(  # a partition is as sick as its GPU: the GPU alone is named
                unhealthy={d: h.message for d, h in named.items()},
                fatal=[d for d, h in named.items() if h.fatal],
                latency_ms=faults.latency_s * 1000,
                lost=hardware.lost(),
                fail_next_prepares=fail_next_prepares,
                failure_rate=faults.failure_rate,
                fail_message=faults.fail_message,
            )

    async def leaks(self, namespace: str | None, claim_uids: list[str] | None) -> dict[str, int]:
        """Prepared state its nodes still hold for these claims, read on this host."""
        roots = [n.root for n in self.nodes.values()] + [n.root for n in self.process_nodes.values()]
        return prepared_state(roots, namespace, None if claim_uids is None else set(claim_uids))

    async def hardware_claims(self, node: str) -> dict[str, list[str]]:
        return self._node(node).hardware.claims()

    async def pid(self) -> int:
        return os.getpid()

    async def code_version(self) -> dict[str, str]:
        """Which testbed this host runs, and where: every host must run the fleet's."""
        return {"version": code_version(), "where": f"{platform.node()} (pid {os.getpid()})"}

    async def describe(self) -> dict[str, Any]:
        """For `testbed status`: how many nodes, how many ready, where it runs, which code."""
        return {
            "nodes": len(self.nodes) + len(self.process_nodes),
            "ready": self.ready_count,
            "pid": os.getpid(),
            "ray_node": _ray_node(),
            "ray_node_address": _ray_node_address(),
            "node_names": self._names(),
            "incarnation": self.server.incarnation,
            "restarted": self.restarted,
            "kubelet_restarts": sum(self.kubelet_restarts.values()),
            "code": code_version(),
            "faults": {node: said for node in self._names() if (said := self._hardware_of(node).faults_in_force())},
        }

    async def node_dir(self, node: str) -> str:
        return str(self._node(node).root)
