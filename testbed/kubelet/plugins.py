"""The kubelet's side of DRA plugins: watch the registration dir, register, call.

Exactly what a kubelet does: a socket appearing in ``plugins_registry`` (names starting
with ``.`` ignored) gets GetInfo; a ``DRAPlugin`` with a DRA service the kubelet knows
(the first of the plugin's ``supported_versions`` among v1, v1beta1) is registered and
told so by NotifyRegistrationStatus, anything else is told why not. Calls go to the most
recently registered instance of a driver (during a rolling update, the new one) with a
45 s timeout. When a driver's last instance is gone for 30 s, its ResourceSlices for
this node are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from testbed.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 45.0
WIPE_SLICES_AFTER_S = 30.0
SCAN_INTERVAL_S = 1.0
"""A kubelet reacts to inotify; polling every second is close enough for one node. Whoever
starts a driver next to a kubelet can call ``scan()`` at once, and then poll less often."""
DRA_SERVICES: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


class PluginCallError(Exception):
    pass


@dataclass(frozen=True)
class PreparedDevice:
    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]


@dataclass
class ClaimAnswer:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


@dataclass
class Plugin:
    driver: str
    registration_socket: Path
    endpoint: str
    service: str
    health_service: str
    channel: grpc.aio.Channel

    def stub(self) -> Any:
        return DRA_SERVICES[self.service][1].DRAPluginStub(self.channel)

    @property
    def pb2(self) -> Any:
        return DRA_SERVICES[self.service][0]


def choose_service(supported: list[str]) -> str | None:
    """The first entry of the plugin's list that this kubelet knows."""
    return next((s for s in supported if s in DRA_SERVICES), None)


class PluginManager:
    def __init__(
        self,
        registry_dir: Path,
        on_driver_gone: Callable[[str], Any] | None = None,
        scan_interval_s: float = SCAN_INTERVAL_S,
    ):
        self.registry_dir = registry_dir
        self.scan_interval_s = scan_interval_s
        self.on_driver_gone = on_driver_gone
        self._by_socket: dict[Path, Plugin] = {}
        self._rejected: set[Path] = set()
        self._wipe_tasks: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()

    def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._watch(), name=f"plugin-watcher-{self.registry_dir}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task, *self._wipe_tasks.values())
        for plugin in self._by_socket.values():
            await plugin.channel.close()
        self._by_socket.clear()

    def drivers(self) -> list[str]:
        return sorted({p.driver for p in self._by_socket.values()})

    def plugin_for(self, driver: str) -> Plugin | None:
        instances = [p for p in self._by_socket.values() if p.driver == driver]
        return instances[-1] if instances else None

    async def wait_for_driver(self, driver: str, timeout_s: float) -> Plugin:
        async with asyncio.timeout(timeout_s):
            while (plugin := self.plugin_for(driver)) is None:
                await self.changed.wait()
        return plugin

    async def _watch(self) -> None:
        while True:
            try:
                await self.scan()
            except Exception:
                log.exception("plugin watcher scan of %s failed", self.registry_dir)
            await asyncio.sleep(self.scan_interval_s)

    async def scan(self) -> None:
        present = {p for p in self.registry_dir.iterdir() if not p.name.startswith(".") and p.is_socket()}
        for sock in sorted(present - set(self._by_socket) - self._rejected):
            await self._register(sock)
        for sock in set(self._by_socket) - present:
            await self._deregister(sock)
        self._rejected &= present

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def _register(self, sock: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5.0)
            except grpc.aio.AioRpcError as exc:
                log.debug("GetInfo on %s failed (%s); will retry", sock, exc.code().name)
                return
            problem = self._validate(info)
            if problem:
                self._rejected.add(sock)
                log.warning("rejecting plugin at %s: %s", sock, problem)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.NotifyRegistrationStatus(
                        pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error=problem),
                        timeout=5.0,
                    )
                return
            service = choose_service(list(info.supported_versions))
            assert service is not None
            health = next((h for h in HEALTH_SERVICES if h in info.supported_versions), "")
            plugin = Plugin(
                info.name,
                sock,
                info.endpoint,
                service,
                health,
                grpc.aio.insecure_channel(f"unix://{info.endpoint}"),
            )
            self._by_socket[sock] = plugin
            wipe = self._wipe_tasks.pop(info.name, None)
            if wipe is not None:
                wipe.cancel()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(
                    pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5.0
                )
            log.info("registered DRA plugin %s at %s using %s", info.name, info.endpoint, service)
            self._notify()

    @staticmethod
    def _validate(info: Any) -> str:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not info.name:
            return "plugin reports an empty driver name"
        if not info.endpoint.startswith("/"):
            return f"endpoint {info.endpoint!r} is not an absolute socket path"
        if not info.supported_versions:
            return "empty list of supported gRPC services"
        if choose_service(list(info.supported_versions)) is None:
            return (
                f"none of the plugin's services {list(info.supported_versions)} are known to this "
                f"kubelet ({', '.join(DRA_SERVICES)})"
            )
        return ""

    async def _deregister(self, sock: Path) -> None:
        plugin = self._by_socket.pop(sock)
        await plugin.channel.close()
        log.info("DRA plugin %s at %s is gone", plugin.driver, sock)
        if self.plugin_for(plugin.driver) is None and self.on_driver_gone is not None:
            self._wipe_tasks[plugin.driver] = asyncio.create_task(self._wipe_later(plugin.driver))
        self._notify()

    async def _wipe_later(self, driver: str) -> None:
        await asyncio.sleep(WIPE_SLICES_AFTER_S)
        if self.plugin_for(driver) is None and self.on_driver_gone is not None:
            await self.on_driver_gone(driver)
        self._wipe_tasks.pop(driver, None)

    # --- calls ---------------------------------------------------------------------------

    async def _call(self, driver: str, method: str, claims: list[tuple[str, str, str]]) -> Any:
        """One batched call of ``method`` (NodePrepareResources or NodeUnprepareResources)
        on the driver's current instance, in the DRA version chosen at registration."""
        plugin = self.plugin_for(driver)
        if plugin is None:
            raise PluginCallError(f"DRA driver {driver} is not registered on this node")
        pb2 = plugin.pb2
        request_type = getattr(pb2, f"{method}Request")
        request = request_type(claims=[pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        try:
            return await getattr(plugin.stub(), method)(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise PluginCallError(f"{method} on {driver}: {exc.code().name}: {exc.details()}") from exc

    async def prepare(self, driver: str, claims: list[tuple[str, str, str]]) -> dict[str, ClaimAnswer]:
        """claims: (namespace, uid, name). Every claim must be answered, as the API says."""
        response = await self._call(driver, "NodePrepareResources", claims)
        answers: dict[str, ClaimAnswer] = {}
        for _, uid, name in claims:
            if uid not in response.claims:
                answers[uid] = ClaimAnswer(error=f"{driver} returned no result for claim {name}")
                continue
            entry = response.claims[uid]
            devices = [
                PreparedDevice(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
                for d in entry.devices
            ]
            answers[uid] = ClaimAnswer(devices, entry.error)
        return answers

    async def unprepare(self, driver: str, claims: list[tuple[str, str, str]]) -> dict[str, str]:
        response = await self._call(driver, "NodeUnprepareResources", claims)
        return {
            uid: (response.claims[uid].error if uid in response.claims else f"{driver} returned no result")
            for _, uid, _ in claims
        }
