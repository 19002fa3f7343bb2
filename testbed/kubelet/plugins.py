"""The kubelet's side of DRA plugins: watch the registration dir, register, call.

What kubelet v1.37 does (pkg/kubelet/pluginmanager, pkg/kubelet/cm/dra/plugin):
- it is told by inotify of what is made or removed in ``plugins_registry`` and its
  subdirectories; its reconciler acts on that within a second (this one at once), and
  tries again what failed;
- a socket appearing there (names starting with ``.`` ignored) gets GetInfo; a
  ``DRAPlugin`` with a DRA service the kubelet knows (the first of the plugin's
  ``supported_versions`` among v1, v1beta1) is registered and told so by
  NotifyRegistrationStatus, anything else is told why not. A socket re-created at the
  same path (a restarted driver) is a new registration;
- it keeps a connection to each instance's DRA endpoint and watches it. When no
  instance of a driver is connected, its ResourceSlices of this node are deleted 30 s
  later unless one connects again: a SIGKILLed driver leaves its socket behind, and
  it is the connection, not the socket, that counts;
- calls go to the most recent connected instance (else the most recent one) with a
  45 s timeout;
- right after registration it opens NodeWatchResources (v1, else v1alpha1) and keeps
  it open, re-opening it 5 s after it ends, unless the driver answers UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from testbed.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from testbed.grpcapi.channels import unix_channel
from testbed.grpcapi.status import go_status_name
from testbed.kubeapi import ClaimRef
from testbed.kubelet import dirwatch, metrics
from testbed.kubelet.health import DeviceHealthStatus, DeviceReport, HealthCache, timeout_from_wire, truncate_message
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 45.0
WIPE_SLICES_AFTER_S = 30.0
SCAN_INTERVAL_S = 1.0
"""How often the registry is looked at where inotify cannot be had (see dirwatch)."""
RETRY_S = 1.0
"""The kubelet's reconciler runs every second: a socket whose GetInfo failed is tried again
after this long."""
STAMP_SETTLED_NS = 1_000_000_000
DRA_SERVICES: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
HEALTH_SERVICES: dict[str, tuple[Any, Any]] = {
    "v1.DRAResourceHealth": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}
HEALTH_RETRY_S = 5.0
"""The kubelet re-opens an ended health stream after this long."""
RECONNECT_BACKOFF_MAX_MS = 5000
"""gRPC's default of 120 s would let a driver that came back at the same endpoint go
unnoticed for minutes."""


class PluginCallError(Exception):
    """A failed call or an answer the kubelet refuses, worded as the kubelet words it
    (pkg/kubelet/cm/dra/manager.go), for the pod's events and the logs."""


@dataclass(frozen=True)
class PreparedDevice:
    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    driver: str = ""
    share_id: str | None = None


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
    identity: tuple[int, int] = (0, 0)
    """(inode, ctime) of the registration socket: a new file is a new instance."""
    connected: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def stub(self) -> Any:
        return DRA_SERVICES[self.service][1].DRAPluginStub(self.channel)

    @property
    def pb2(self) -> Any:
        return DRA_SERVICES[self.service][0]


def choose_service(supported: list[str]) -> str | None:
    """The first entry of the plugin's list that this kubelet knows."""
    return next((s for s in supported if s in DRA_SERVICES), None)


def _identity(sock: Path) -> tuple[int, int]:
    try:
        stat = sock.stat()
    except OSError:
        return (0, 0)
    return (stat.st_ino, stat.st_ctime_ns)


class WatchesExhausted(Exception):
    """No inotify watch left for this user: the registry is polled instead."""

    def __init__(self, message: str, first: bool):
        """``first``: the first time this process ran out (said once, not per node)."""
        super().__init__(message)
        self.first = first


class PluginManager:
    def __init__(
        self,
        registry_dir: Path,
        on_driver_gone: Callable[[str], Awaitable[None]] | None = None,
        scan_interval_s: float = SCAN_INTERVAL_S,
        on_health_change: Callable[[str, list[tuple[str, str]]], None] | None = None,
        watch_health: bool = True,
        node: str = "",
    ):
        """``on_driver_gone(driver)``: no instance connected for 30 s (wipe its slices).
        ``on_health_change(driver, [(pool, device)])``: health of these devices changed.
        ``node``: the node's name, for the log (a NodeHost logs for hundreds of nodes)."""
        self.registry_dir = registry_dir
        self._on = f"{node}: " if node else ""
        """What the log's lines start with."""
        self.scan_interval_s = scan_interval_s
        self.on_driver_gone = on_driver_gone
        self.on_health_change = on_health_change
        self.watch_health = watch_health
        self.health = HealthCache()
        self._by_socket: dict[Path, Plugin] = {}
        self._rejected: set[Path] = set()
        self._wipe_tasks: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        self._scanned_stamp: list[int] | None = None
        """The mtimes of the registry directory and its subdirectories when a scan last
        found nothing left to do."""
        self._subdirs: list[Path] = []
        """Subdirectories of the registry directory at the last scan."""
        self._scanning = asyncio.Lock()
        self._directories: dirwatch.DirectoryWatcher | None = None
        self._watches: dict[Path, dirwatch.Watch] = {}
        self._woken = asyncio.Event()
        self._unfinished = False
        """The last scan left a socket neither registered nor refused (its GetInfo failed)."""

    def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._watch(), name=f"plugin-watcher-{self.registry_dir}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task, *self._wipe_tasks.values())
        for plugin in self._by_socket.values():
            await cancel_and_wait(*plugin.tasks)
            await plugin.channel.close()
        self._by_socket.clear()

    def drivers(self) -> list[str]:
        return sorted({p.driver for p in self._by_socket.values()})

    def instances(self, driver: str) -> list[Plugin]:
        """The driver's registered instances, oldest first."""
        return [p for p in self._by_socket.values() if p.driver == driver]

    def plugin_for(self, driver: str) -> Plugin | None:
        """The newest connected instance, else the newest one."""
        instances = [p for p in self._by_socket.values() if p.driver == driver]
        connected = [p for p in instances if p.connected]
        preferred = connected or instances
        return preferred[-1] if preferred else None

    def connected(self, driver: str) -> bool:
        return any(p.connected for p in self._by_socket.values() if p.driver == driver)

    async def wait_for_driver(self, driver: str, timeout_s: float) -> Plugin:
        async with asyncio.timeout(timeout_s):
            while (plugin := self.plugin_for(driver)) is None:
                await self.changed.wait()
        return plugin

    async def _watch(self) -> None:
        """Scan whenever inotify tells of a change, and a second after a scan that left a
        socket unregistered; poll where there is no inotify, or no watch left to add."""
        self._directories = dirwatch.watcher()
        try:
            while self._directories is not None:
                self._woken.clear()
                try:
                    await self.scan()
                    wait_s = RETRY_S if self._unfinished else None
                except Exception:
                    log.exception("plugin watcher scan of %s failed", self.registry_dir)
                    wait_s = self.scan_interval_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._woken.wait(), wait_s)
        finally:
            if self._directories is not None:
                self._watch_only([])
        await self._poll()

    def _wake(self) -> None:
        self._woken.set()

    def _watch_only(self, directories: list[Path]) -> list[Path]:
        """Be told of changes in these directories and in no others; returns those newly
        watched (a directory removed and made again is watched anew)."""
        assert self._directories is not None
        wanted = set(directories)
        for directory in set(self._watches) - wanted:
            self._directories.unwatch(self._watches.pop(directory))
        added = []
        for directory in directories:
            known = self._watches.get(directory)
            if known is not None and self._directories.live(known):
                continue
            said = self._directories.exhausted
            try:
                self._watches[directory] = self._directories.watch(directory, self._wake)
            except FileNotFoundError:
                self._watches.pop(directory, None)
                continue  # gone since it was listed
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise WatchesExhausted(
                        f"cannot watch {directory}: fs.inotify.max_user_watches reached (raise it to watch)", not said
                    ) from exc
                raise
            added.append(directory)
        return added

    async def _poll(self) -> None:
        while True:
            try:
                if not self._unchanged():
                    await self.scan()
            except Exception:
                log.exception("plugin watcher scan of %s failed", self.registry_dir)
            await asyncio.sleep(self.scan_interval_s)

    def _unchanged(self) -> bool:
        """A socket created, removed or replaced moves its directory's mtime: a stat of the
        directory and of each subdirectory stands in for a listing while nothing changed
        (a kubelet is told by inotify)."""
        try:
            return self._stamp() == self._scanned_stamp
        except FileNotFoundError:
            return False

    def _stamp(self) -> list[int]:
        """(A subdirectory gone counts as -1; the registry directory itself must exist.)"""
        stamps = [self.registry_dir.stat().st_mtime_ns]
        for directory in self._subdirs:
            try:
                stamps.append(directory.stat().st_mtime_ns)
            except FileNotFoundError:
                stamps.append(-1)
        return stamps

    def _listing(self) -> set[Path]:
        """The sockets in the registry directory and its subdirectories, as the kubelet's
        plugin watcher walks them (symlinks not followed; names starting with '.' skipped);
        the subdirectories seen are remembered for the next stamp."""
        sockets: set[Path] = set()
        subdirs: list[Path] = []
        pending = [self.registry_dir]
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(Path(entry.path))
                        pending.append(Path(entry.path))
                    elif not entry.name.startswith(".") and stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                        sockets.add(Path(entry.path))
        self._subdirs = subdirs
        return sockets

    def _watched_listing(self) -> set[Path]:
        """The listing, taken after the directories it covers are watched (as the kubelet
        adds its watch before it walks): a socket made after the listing is told of. With
        no watch left to add, the watcher turns to polling."""
        if self._directories is not None:
            try:
                self._watch_only([self.registry_dir, *self._subdirs])
                while True:
                    present = self._listing()
                    if not self._watch_only([self.registry_dir, *self._subdirs]):
                        return present  # no subdirectory new since the listing began
            except WatchesExhausted as exc:
                first = exc.first
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "%s; the registry %s is polled every %g s%s",
                    exc,
                    self.registry_dir,
                    self.scan_interval_s,
                    " (and so are those of this process's other nodes that find none)" if first else "",
                )
                self._watch_only([])
                self._directories = None
                self._woken.set()
        return self._listing()

    async def scan(self) -> None:
        """Register what appeared, deregister what went or was replaced. Anyone may call it
        (a fleet, to register the drivers it just started at once); scans never overlap."""
        async with self._scanning:
            await self._scan()

    async def _scan(self) -> None:
        present = self._watched_listing()
        stamp = self._stamp() if self._directories is None else None  # what a poll compares
        replaced = {s for s, p in self._by_socket.items() if s in present and _identity(s) != p.identity}
        for sock in set(self._by_socket) - present | replaced:
            await self._deregister(sock)
        for sock in sorted(present - set(self._by_socket) - self._rejected):
            await self._register(sock)
        self._rejected &= present
        self._unfinished = not present - self._rejected <= set(self._by_socket)
        if stamp is not None:
            # Trusted only when settled: a stamp under a second old may share its clock tick
            # with a change made just after the listing, and a failed GetInfo is retried.
            settled = time.time_ns() - max(stamp) > STAMP_SETTLED_NS
            self._scanned_stamp = stamp if settled and not self._unfinished else None

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def _register(self, sock: Path) -> None:
        async with unix_channel(sock) as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5.0)
            except grpc.aio.AioRpcError as exc:
                log.debug("GetInfo on %s failed (%s); will retry", sock, exc.code().name)
                return
            problem = self._validate(info)
            if problem:
                self._rejected.add(sock)
                log.warning("%srejecting plugin at %s: %s", self._on, sock, problem)
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
                unix_channel(info.endpoint, ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS)),
                identity=_identity(sock),
            )
            self._by_socket[sock] = plugin
            plugin.tasks.append(asyncio.create_task(self._watch_connection(plugin), name=f"conn-{sock}"))
            if self.watch_health and health:
                plugin.tasks.append(asyncio.create_task(self._watch_health(plugin), name=f"health-{sock}"))
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(
                    pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5.0
                )
            log.info("%sregistered DRA plugin %s at %s using %s", self._on, info.name, info.endpoint, service)
            self._sync(info.name)
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
        await cancel_and_wait(*plugin.tasks)
        await plugin.channel.close()
        log.info("%sDRA plugin %s at %s is gone", self._on, plugin.driver, sock)
        self._sync(plugin.driver)
        self._notify()

    def _sync(self, driver: str) -> None:
        """After any change of a driver's instances or connections: a connected driver
        cancels a pending wipe; a driver with none connected gets one (once)."""
        if self.connected(driver):
            wipe = self._wipe_tasks.pop(driver, None)
            if wipe is not None:
                wipe.cancel()
        elif driver not in self._wipe_tasks and self.on_driver_gone is not None:
            self._wipe_tasks[driver] = asyncio.create_task(self._wipe_later(driver), name=f"wipe-{driver}")

    async def _wipe_later(self, driver: str) -> None:
        await asyncio.sleep(WIPE_SLICES_AFTER_S)
        self._wipe_tasks.pop(driver, None)
        if not self.connected(driver) and self.on_driver_gone is not None:
            log.info(
                "%sno instance of DRA driver %s connected for %.0f s: wiping its slices",
                self._on,
                driver,
                WIPE_SLICES_AFTER_S,
            )
            await self.on_driver_gone(driver)

    async def _watch_connection(self, plugin: Plugin) -> None:
        """Follow the DRA endpoint's connection as the kubelet's gRPC stats handler does."""
        channel = plugin.channel
        state = channel.get_state(try_to_connect=True)
        while True:
            connected = state is grpc.ChannelConnectivity.READY
            if connected != plugin.connected:
                plugin.connected = connected
                log.debug("%sDRA plugin %s at %s connected: %s", self._on, plugin.driver, plugin.endpoint, connected)
                self._sync(plugin.driver)
                self._notify()
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)

    async def _watch_health(self, plugin: Plugin) -> None:
        pb2, pb2_grpc = HEALTH_SERVICES[plugin.health_service]
        stub = pb2_grpc.DRAResourceHealthStub(plugin.channel)
        names = {pb2.HEALTHY: DeviceHealthStatus.HEALTHY, pb2.UNHEALTHY: DeviceHealthStatus.UNHEALTHY}
        while True:
            try:
                async for snapshot in stub.NodeWatchResources(pb2.NodeWatchResourcesRequest()):
                    reports = [
                        DeviceReport(
                            d.device.pool_name,
                            d.device.device_name,
                            names.get(d.health, DeviceHealthStatus.UNKNOWN),
                            truncate_message(d.message),
                            timeout_from_wire(d.health_check_timeout_seconds),
                        )
                        for d in snapshot.devices
                    ]
                    changed = self.health.update(plugin.driver, reports, time.monotonic())
                    if changed and self.on_health_change is not None:
                        self.on_health_change(plugin.driver, changed)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    self.health.clear_driver(plugin.driver)
                    return
                log.debug("%shealth stream of %s ended: %s", self._on, plugin.driver, exc.code().name)
            self.health.clear_driver(plugin.driver)
            await asyncio.sleep(HEALTH_RETRY_S)

    # --- calls ---------------------------------------------------------------------------

    async def _call(self, driver: str, method: str, claims: list[ClaimRef]) -> Any:
        """One batched call of ``method`` (NodePrepareResources or NodeUnprepareResources)
        on the driver's current instance, in the DRA version chosen at registration; the
        answer checked as the kubelet checks it: no claim it did not ask about, none with
        an error, none left out."""
        plugin = self.plugin_for(driver)
        if plugin is None:
            raise PluginCallError(f"DRA driver {driver} is not registered")
        pb2 = plugin.pb2
        request_type = getattr(pb2, f"{method}Request")
        request = request_type(claims=[pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims])
        # As the kubelet logs its DRA calls at -v=4: the claims asked, then the answer.
        debug = log.isEnabledFor(logging.DEBUG)
        if debug:
            log.debug("%scalling %s of %s at %s for %s", self._on, method, driver, plugin.endpoint, _named(claims))
        started = time.perf_counter()
        status = grpc.StatusCode.OK
        response = None
        try:
            response = await getattr(plugin.stub(), method)(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            status = exc.code()
            code = go_status_name(status)
            raise PluginCallError(f"{method}: rpc error: code = {code} desc = {exc.details()}") from exc
        finally:
            # As the kubelet's client interceptor times every unary call on the connection.
            full_method = f"/{pb2.DESCRIPTOR.package}.DRAPlugin/{method}"
            elapsed = time.perf_counter() - started
            metrics.GRPC_OPERATIONS.labels(driver, full_method, go_status_name(status)).observe(elapsed)
            if debug:
                answer = _answered(claims, response) if response is not None else go_status_name(status)
                log.debug("%s%s of %s answered in %.1f ms: %s", self._on, method, driver, elapsed * 1000, answer)
        asked = {c.uid: c for c in claims}
        for uid, entry in response.claims.items():
            claim = asked.get(uid)
            if claim is None:
                raise PluginCallError(f"{method} returned result for unknown claim UID {uid}")
            if entry.error:
                raise PluginCallError(f"{method} failed for ResourceClaim {claim.name}: {entry.error}")
        if len(response.claims) != len(claims):
            raise PluginCallError(f"{method} skipped {len(claims) - len(response.claims)} ResourceClaims")
        return response

    async def prepare(self, driver: str, claims: list[ClaimRef]) -> dict[str, list[PreparedDevice]]:
        """Each claim's devices; PluginCallError unless every claim was prepared."""
        response = await self._call(driver, "NodePrepareResources", claims)
        return {
            uid: [
                PreparedDevice(
                    list(d.request_names),
                    d.pool_name,
                    d.device_name,
                    list(d.cdi_device_ids),
                    driver,
                    # share_id: in v1 only, set for a device shared through consumable capacity
                    d.share_id if "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id") else None,
                )
                for d in entry.devices
            ]
            for uid, entry in response.claims.items()
        }

    async def unprepare(self, driver: str, claims: list[ClaimRef]) -> None:
        """PluginCallError unless every claim was unprepared."""
        await self._call(driver, "NodeUnprepareResources", claims)


def _named(claims: list[ClaimRef]) -> str:
    return ", ".join(f"{c.namespace}/{c.name} ({c.uid})" for c in claims)


def _answered(claims: list[ClaimRef], response: Any) -> str:
    """Each claim's answer as the log shows it, in the order asked: its devices and CDI
    IDs, or its error."""
    answers = response.claims
    named = [(c.uid, f"{c.namespace}/{c.name}") for c in claims if c.uid in answers]
    asked = {c.uid for c in claims}
    named += [(uid, f"unknown claim UID {uid}") for uid in answers if uid not in asked]
    parts = []
    for uid, name in named:
        entry = answers[uid]
        if entry.error:
            parts.append(f"{name}: error {entry.error!r}")
        elif hasattr(entry, "devices"):
            devices = [f"{d.pool_name}/{d.device_name} {list(d.cdi_device_ids)}" for d in entry.devices]
            parts.append(f"{name}: {', '.join(devices) or 'no devices'}")
        else:
            parts.append(f"{name}: done")
    return "; ".join(parts) or "no claims"
