"""The driver's gRPC services, exactly as a kubelet calls them.

- ``pluginregistration.Registration`` on ``<plugins_registry>/<driver>[-<podUID>]-reg.sock``
- DRA ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` on ``<plugins>/<driver>/dra[-<podUID>].sock``
- resource health ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` (full
  snapshots, pushed on every change)
- ``grpc.health.v1.Health`` on a TCP port, for a liveness probe: it really calls GetInfo
  on the registration socket and an empty NodePrepareResources on the DRA socket.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fake_devices.hardware import Health
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
from testbed.kubeletplugin import metrics
from testbed.kubeletplugin.driver import Driver
from testbed.kubeletplugin.prepare import ClaimPreparer

log = logging.getLogger(__name__)

SUPPORTED_SERVICES = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
]
"""Advertised in GetInfo, most preferred first; a kubelet takes the first DRA entry it knows."""

HEALTH_CHECK_TIMEOUT_S = 30
"""Advertised per device: a kubelet shows a device as Unknown once it has not heard of
it for this long, so every stream re-sends its full snapshot at least every third of it.
30 s is what a kubelet assumes of a driver that advertises none; a driver may choose."""
R = TypeVar("R")


def wire_request_names(names: list[str]) -> list[str]:
    """What the kubelet matches ``resources.claims[].request`` against: a prioritized-list
    subrequest ``req/sub`` is sent as ``req``, each name once, in order."""
    return list(dict.fromkeys(name.split("/", 1)[0] for name in names))


def _timed(driver: str, method: str, call: Callable[[], Awaitable[R]]) -> Awaitable[R]:
    async def run() -> R:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await call()
        except Exception:
            code = grpc.StatusCode.INTERNAL
            raise
        finally:
            metrics.GRPC_SERVED.labels(driver, method, go_status_name(code)).observe(time.perf_counter() - started)

    return run()


class CallLog:
    """Every call a kubelet makes on the driver, one JSON line each (time, method, claims,
    and the serving process: during a rolling update two instances share the file): the
    kubelet's side of the conversation, for a driver developer to read and for tests that
    compare a real kubelet with the fake one. Off unless given a file."""

    def __init__(self, path: Path | None = None, driver: str = ""):
        self.path = path
        self.driver = driver
        self._failed = False

    def record(self, method: str, claims: Any = (), **details: object) -> None:
        if self.path is None:
            return
        entry = {
            "time": time.time(),
            "pid": os.getpid(),
            "driver": self.driver,
            "method": method,
            "claims": [{"namespace": c.namespace, "name": c.name, "uid": c.uid} for c in claims],
            **details,
        }
        try:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(entry) + "\n")
        except OSError as exc:  # a diagnostic: a full disk must not fail the call it records
            if not self._failed:
                log.warning("call log %s: %s; calls are not logged until it can be written again", self.path, exc)
            self._failed = True
            return
        self._failed = False


class DraService:
    """NodePrepareResources/NodeUnprepareResources for one proto version (v1 or v1beta1)."""

    def __init__(self, pb2: Any, preparer: ClaimPreparer, with_share_id: bool, call_log: CallLog | None = None):
        self.pb2 = pb2
        self.preparer = preparer
        self.with_share_id = with_share_id
        self.package = pb2.DESCRIPTOR.package
        self.call_log = call_log or CallLog()

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        method = f"/{self.package}.DRAPlugin/NodePrepareResources"
        self.call_log.record(method, request.claims)
        return await _timed(self.preparer.name, method, lambda: self._prepare(request))

    async def _prepare(self, request: Any) -> Any:
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        results = await self.preparer.prepare(refs)
        response = self.pb2.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for record in result.devices:
                device = entry.devices.add(
                    request_names=wire_request_names(record.request_names),
                    pool_name=record.pool,
                    device_name=record.device,
                    cdi_device_ids=record.cdi_device_ids,
                )
                if self.with_share_id and record.share_id:
                    device.share_id = record.share_id
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        method = f"/{self.package}.DRAPlugin/NodeUnprepareResources"
        self.call_log.record(method, request.claims)
        return await _timed(self.preparer.name, method, lambda: self._unprepare(request))

    async def _unprepare(self, request: Any) -> Any:
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        errors = await self.preparer.unprepare(refs)
        response = self.pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, call_log: CallLog | None = None):
        self.driver = driver
        self.endpoint = endpoint
        self.call_log = call_log or CallLog()
        self.registered: bool | None = None
        self.registration_error = ""

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=SUPPORTED_SERVICES,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.call_log.record(
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            registered=request.plugin_registered,
            error=request.error,
        )
        self.registered = request.plugin_registered
        self.registration_error = request.error
        if not request.plugin_registered:
            log.error("%s: the kubelet refused the registration: %s", self.driver, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


class ResourceHealthService:
    """NodeWatchResources for one proto version: a full snapshot now, after every change,
    and at least every ``timeout_s / 3`` (a heartbeat), as a kubelet needs to keep a
    device from turning Unknown."""

    def __init__(
        self,
        pb2: Any,
        driver: Driver,
        pool: str,
        timeout_s: int = HEALTH_CHECK_TIMEOUT_S,
    ):
        self.pb2 = pb2
        self.driver = driver
        self.pool = pool
        self.timeout_s = timeout_s
        self._last: tuple[int, Any] | None = None
        """The last snapshot and its generation: a heartbeat re-sends it unchanged (a
        kubelet stamps each report with the time it arrives)."""

    async def _snapshot(self) -> tuple[int, Any]:
        generation, health = await self.driver.health()
        if self._last is not None and self._last[0] == generation:
            return self._last
        status = {Health.HEALTHY: self.pb2.HEALTHY, Health.UNHEALTHY: self.pb2.UNHEALTHY}
        response = self.pb2.NodeWatchResourcesResponse()
        for entry in health:
            response.devices.add(
                device=self.pb2.DeviceIdentifier(pool_name=self.pool, device_name=entry.device),
                health=status[entry.health],
                last_updated_time=entry.updated_unix,
                health_check_timeout_seconds=self.timeout_s,
                message=entry.message,
            )
        self._last = (generation, response)
        return self._last

    async def NodeWatchResources(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        generation, snapshot = await self._snapshot()
        yield snapshot
        while True:
            await self.driver.wait_for_change(generation, self.timeout_s / 3)
            generation, snapshot = await self._snapshot()
            yield snapshot


class MalformedRequests(logging.Filter):
    """gRPC logs a full traceback for every request it cannot decode; a hostile or
    broken client made 2 MB of log in one probe. This keeps one line per interval,
    saying how many more there were."""

    LOGGER = "grpc._cython.cygrpc"

    def __init__(self, interval_s: float = 10.0):
        super().__init__()
        self.interval_s = interval_s
        self._last = -float("inf")
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if type(error).__name__ != "DecodeError":
            return True
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._dropped += 1
            return False
        method = re.search(r"\[(/[^\]]+)\]", record.getMessage())
        record.msg = "malformed request to %s (%s)%s"
        more = f"; {self._dropped} more since the last report" if self._dropped else ""
        record.args = (method.group(1) if method else "?", str(error).split(":")[-1].strip(), more)
        record.exc_info, record.exc_text = None, None
        self._last, self._dropped = now, 0
        return True

    @classmethod
    def install(cls) -> None:
        logger = logging.getLogger(cls.LOGGER)
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())


def add_registration_service(server: grpc.aio.Server, registration: RegistrationService) -> None:
    """What the registration socket serves, and nothing else (as upstream plugins do)."""
    MalformedRequests.install()
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(registration, server)


def add_dra_services(
    server: grpc.aio.Server,
    preparer: ClaimPreparer,
    driver: Driver,
    pool: str,
    call_log: CallLog | None = None,
    health_timeout_s: int = HEALTH_CHECK_TIMEOUT_S,
) -> None:
    """What the DRA socket serves: DRA v1 and v1beta1, resource health v1 and v1alpha1."""
    MalformedRequests.install()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraService(dra_v1_pb2, preparer, True, call_log), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraService(dra_v1beta1_pb2, preparer, False, call_log), server)
    health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        ResourceHealthService(health_v1_pb2, driver, pool, health_timeout_s), server
    )
    health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        ResourceHealthService(health_v1alpha1_pb2, driver, pool, health_timeout_s), server
    )


class LivenessService(health_pb2_grpc.HealthServicer):
    """SERVING only if both sockets answer as a kubelet would need them to."""

    def __init__(self, sockets: list[tuple[str, str]], timeout_s: float = 5.0):
        """``sockets``: (registration socket, DRA socket) of every driver to vouch for."""
        self.sockets = sockets
        self.timeout_s = timeout_s

    async def probe(self) -> str:
        """Empty string if healthy, else what is wrong."""
        for registration_socket, dra_socket in self.sockets:
            try:
                async with unix_channel(registration_socket) as channel:
                    info = await pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                        pluginregistration_pb2.InfoRequest(), timeout=self.timeout_s
                    )
                    if info.type != "DRAPlugin":
                        return f"{registration_socket} answers type {info.type!r}"
                async with unix_channel(dra_socket) as channel:
                    await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(), timeout=self.timeout_s
                    )
            except grpc.aio.AioRpcError as exc:
                return f"{exc.code().name}: {exc.details()}"
        return ""

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        problem = await self.probe()
        if problem:
            log.warning("liveness check failed: %s", problem)
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
