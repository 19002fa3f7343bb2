"""One driver instance for one node: sockets up, slices published, stopped cleanly.

Start order follows what a kubelet expects: the DRA socket exists before the
registration socket appears, since the kubelet connects to the endpoint GetInfo names.
On stop an instance removes only its own sockets (another instance may be taking over
during a rolling update) and leaves the slices: the kubelet wipes them if no instance
comes back.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2_grpc

from testbed.config import MAX_SOCKET_PATH
from testbed.errors import TestbedError
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.kubeletplugin import metrics
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.driver import Driver
from testbed.kubeletplugin.grpc_services import (
    HEALTH_CHECK_TIMEOUT_S,
    CallLog,
    LivenessService,
    RegistrationService,
    add_dra_services,
    add_registration_service,
)
from testbed.kubeletplugin.prepare import ClaimPreparer, DriverPaths
from testbed.kubeletplugin.slices import SlicePublisher, SliceWatcher, desired_slices
from testbed.tasks import cancel_and_wait, first_of

log = logging.getLogger(__name__)
PUBLISH_RETRY_S = 1.0
RESYNC_S = 300.0
"""Republish this often with no hardware change (the publisher then checks the API now and
then). Every 30 s meant building slices for nothing 333 times a second at 5,000 nodes."""


class DriverPlugin:
    def __init__(
        self,
        driver: Driver,
        node: str,
        paths: DriverPaths,
        client: KubeClient,
        claims: ClaimReader,
        liveness_port: int | None = None,
        publish_slices: bool = True,
        durable: bool = True,
        slice_watcher: SliceWatcher | None = None,
        call_log: Path | None = None,
        devices_per_slice: int | None = None,
        health_timeout_s: int = HEALTH_CHECK_TIMEOUT_S,
    ):
        """``durable``: fsync checkpoint and CDI writes (a real node). Synthetic nodes, whose
        state is throw-away, skip it, as the testbed's etcd does. ``slice_watcher``: a
        watch shared with other nodes' drivers; by default the driver watches its own.
        ``call_log``: append every DRA call a kubelet makes to this file (JSON lines).
        ``devices_per_slice``: a smaller slice size than the API's limits (None: the limits).
        ``health_timeout_s``: the health-check timeout it advertises for its devices."""
        self.driver = driver
        self.name = driver.name
        self.node = node
        self.paths = paths
        self.client = client
        self.preparer = ClaimPreparer(driver, node, paths, claims, durable)
        self.publisher = SlicePublisher(client, self.name, node)
        self.call_log = CallLog(call_log, self.name)
        # No re-list on registration: the slice watch sees a starting kubelet's wipe
        # whenever it lands, and a re-list per driver cost a fleet 1,000 LISTs at start.
        self.registration = RegistrationService(self.name, str(paths.dra_socket), self.call_log)
        self.publish_slices = publish_slices
        self.health_timeout_s = health_timeout_s
        self.devices_per_slice = devices_per_slice
        self._own_watcher = slice_watcher is None
        self.slice_watcher = slice_watcher or SliceWatcher.for_node(client, node, self.name)
        self.liveness_port = liveness_port
        self._server: grpc.aio.Server | None = None
        self._registration_server: grpc.aio.Server | None = None
        self._liveness: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.published = asyncio.Event()

    def _check_paths(self) -> None:
        for sock in (self.paths.registration_socket, self.paths.dra_socket):
            length = len(str(sock).encode())
            if length > MAX_SOCKET_PATH:
                raise TestbedError(
                    f"socket path {sock} is {length} bytes; gRPC binds unix sockets of at most {MAX_SOCKET_PATH}",
                    hint="use a shorter state or kubelet directory",
                )

    async def start(self) -> None:
        self._check_paths()
        for directory in (self.paths.registry_dir, self.paths.plugin_dir, self.paths.cdi_dir):
            directory.mkdir(parents=True, exist_ok=True)
        await self.preparer.repair()
        for sock in (self.paths.dra_socket, self.paths.registration_socket):
            sock.unlink(missing_ok=True)  # our own name: a leftover of a crash of this instance
        # Each socket its own server, as upstream serves them: the registration socket
        # answers registration only, and it appears only once the DRA socket is up.
        dra = grpc.aio.server()
        add_dra_services(dra, self.preparer, self.driver, self.node, self.call_log, self.health_timeout_s)
        dra.add_insecure_port(f"unix://{self.paths.dra_socket}")
        await dra.start()
        self._server = dra
        registration = grpc.aio.server()
        add_registration_service(registration, self.registration)
        registration.add_insecure_port(f"unix://{self.paths.registration_socket}")
        await registration.start()
        self._registration_server = registration
        if self.liveness_port is not None:
            liveness = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(
                LivenessService([(str(self.paths.registration_socket), str(self.paths.dra_socket))]),
                liveness,
            )
            self.liveness_port = liveness.add_insecure_port(f"127.0.0.1:{self.liveness_port}")
            await liveness.start()
            self._liveness = liveness
        if self.publish_slices:
            self.slice_watcher.add(self.node, self.publisher)
            if self._own_watcher:
                self.slice_watcher.start()
            self._tasks.append(asyncio.create_task(self._publish_loop(), name=f"slices-{self.name}-{self.node}"))

    async def publish_once(self) -> bool:
        inventory = await self.driver.inventory()
        _, health = await self.driver.health()
        specs = desired_slices(
            self.name, self.node, inventory.devices, inventory.counter_sets, health, self.devices_per_slice
        )
        if self.publisher.owner is None:
            self.publisher.owner = await self._node_owner()
        before = self.publisher.writes
        changed = await self.publisher.publish(specs)
        metrics.SLICE_WRITES.labels(self.name).inc(self.publisher.writes - before)
        return changed

    async def _node_owner(self) -> Obj | None:
        try:
            node = await self.client.get(path_for("v1", "nodes", self.node))
        except ApiError:
            return None
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }

    async def _publish_loop(self) -> None:
        # A slice written before the watch lists and deleted before that list would reach
        # no publisher, which would go on believing the slice exists.
        await self.slice_watcher.wait_synced()
        generation = 0
        while True:
            try:
                generation = (await self.driver.inventory()).generation
                await self.publish_once()
                self.published.set()
            except (ApiError, OSError) as exc:
                reason = str(exc) or type(exc).__name__  # a timeout has no message
                log.warning("%s on %s: publishing slices failed (%s); retrying", self.name, self.node, reason)
                await asyncio.sleep(PUBLISH_RETRY_S)
                continue
            except Exception:
                log.exception("%s on %s: publishing slices failed", self.name, self.node)
                await asyncio.sleep(PUBLISH_RETRY_S)
                continue
            await self._wait_for_work(generation)

    async def _wait_for_work(self, generation: int) -> None:
        """Until the hardware changes, the slices were disturbed, or RESYNC_S passed."""
        disturbed = self.publisher.disturbed
        if not disturbed.is_set():
            await first_of(self.driver.wait_for_change(generation, RESYNC_S), disturbed.wait())
        disturbed.clear()

    async def stop(self, grace_s: float = 1.0) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        self.slice_watcher.remove(self.node, self.publisher)
        if self._own_watcher:
            await self.slice_watcher.stop()
        for server in (self._liveness, self._registration_server, self._server):
            if server is not None:
                await server.stop(grace_s)
        self._server = self._registration_server = self._liveness = None
        for sock in (self.paths.registration_socket, self.paths.dra_socket):
            sock.unlink(missing_ok=True)
