"""`testbed-driver`: the DRA driver alone, for one real node (the kind DaemonSet's command).

Configured from the environment, as a DaemonSet passes it:

    NODE_NAME          the node (downward API spec.nodeName)                 required
    POD_UID            this pod's UID (downward API): rolling-update socket names
    DRIVERS            drivers to serve, comma-separated   those the profile has devices for
    KUBELET_DIR        the kubelet's root                                 /var/lib/kubelet
    KUBELET_REGISTRAR_DIRECTORY_PATH   where the kubelet looks for plugins: KUBELET_DIR/plugins_registry
    KUBELET_PLUGINS_DIRECTORY_PATH     where plugins put their DRA sockets:  KUBELET_DIR/plugins
    CDI_DIR            where CDI specs go                                     /var/run/cdi
    HARDWARE_PROFILE   emulated hardware: a shipped profile name or a YAML path   gpu8
    HARDWARE_SEED      seed for UUIDs, MACs and random faults                        0
    HEALTH_PORT        grpc.health.v1 liveness port on 127.0.0.1 (0: any, -1: off)  51515
    HEALTH_ADDRESS     address the liveness and metrics servers bind          127.0.0.1
    METRICS_PORT       Prometheus /metrics port (0: any, -1: off)                  8080
    KUBECONFIG         a kubeconfig; without it, the pod's service account
    CALL_LOG           append every DRA call a kubelet makes to this file (JSON lines)
    FAULTS_FILE        a JSON file the driver follows: {"unhealthy": {"gpu-0": "XID 79"},
                       "fatal": ["gpu-0"], "busy": {"gpu-1": "held by pid 4242"},
                       "latencyMs": 3000, "lost": ["gpu-2"], "failNextPrepares": 2,
                       "failureRate": 0.1, "failMessage": "ECC error"}: the unhealthy
                       devices with that message (those listed fatal tainted NoExecute,
                       evicting their pods), the rest healthy; a busy device's claim cannot be
                       unprepared (the call fails with the message) until freed; every
                       prepare and unprepare that much slower; lost devices gone from the
                       inventory until the driver restarts; each time the file is written
                       with failNextPrepares, that many next prepares fail; each prepare
                       fails with probability failureRate
    DEVICES_PER_SLICE  at most this many devices per ResourceSlice (0: the API's limits)    0

SIGTERM or SIGINT stops it cleanly: it removes its own sockets and leaves the slices
(the kubelet wipes them if no instance comes back within 30 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2_grpc

from fake_devices.hardware import Faults, Health, NodeHardware
from fake_devices.profiles import ProfileError
from testbed.config import LOG_FORMAT
from testbed.drivers import KINDS, PROFILES, driver_on_node, drivers_for, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.errors import TestbedError
from testbed.kubeapi import KubeClient
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.grpc_services import LivenessService
from testbed.kubeletplugin.prepare import DriverPaths
from testbed.kubeletplugin.slices import MAX_DEVICES
from testbed.metrics_server import MetricsServer
from testbed.tasks import cancel_and_wait

log = logging.getLogger("testbed-driver")


def _optional_path(env: dict[str, str], name: str) -> Path | None:
    return Path(env[name]) if env.get(name) else None


def _slice_size(value: int) -> int | None:
    if not 0 <= value <= MAX_DEVICES:
        raise TestbedError(
            f"DEVICES_PER_SLICE={value} is out of range", hint=f"use 1-{MAX_DEVICES}, or 0 for the API's limits"
        )
    return value or None


@dataclass(frozen=True)
class Settings:
    node: str
    pod_uid: str | None
    drivers: list[str]
    kubelet_dir: Path
    registry_dir: Path | None
    plugins_dir: Path | None
    cdi_dir: Path
    profile: str
    seed: int
    health_port: int
    health_address: str
    metrics_port: int
    kubeconfig: Path | None
    call_log: Path | None = None
    faults_file: Path | None = None
    devices_per_slice: int | None = None

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Settings:
        node = env.get("NODE_NAME", "")
        if not node:
            raise TestbedError("NODE_NAME is not set", hint="set it from the downward API: fieldRef spec.nodeName")
        drivers = [d.strip() for d in env.get("DRIVERS", "").split(",") if d.strip()]
        unknown = [d for d in drivers if d not in KINDS]
        if unknown:
            raise TestbedError(
                f"DRIVERS names unknown drivers {unknown}",
                hint=f"use a comma-separated subset of {', '.join(KINDS)}, or leave it unset for those "
                "the hardware profile has devices for",
            )

        def integer(name: str, default: str) -> int:
            try:
                return int(env.get(name, default))
            except ValueError:
                raise TestbedError(f"{name}={env.get(name)!r} is not an integer") from None

        def port(name: str, default: str) -> int:
            value = integer(name, default)
            if not -1 <= value <= 65535:
                hint = "use 1-65535, 0 for any free port, -1 for none"
                raise TestbedError(f"{name}={value} is not a port", hint=hint)
            return value

        return cls(
            node=node,
            pod_uid=env.get("POD_UID") or None,
            drivers=drivers,
            kubelet_dir=Path(env.get("KUBELET_DIR", "/var/lib/kubelet")),
            registry_dir=_optional_path(env, "KUBELET_REGISTRAR_DIRECTORY_PATH"),
            plugins_dir=_optional_path(env, "KUBELET_PLUGINS_DIRECTORY_PATH"),
            cdi_dir=Path(env.get("CDI_DIR", "/var/run/cdi")),
            profile=env.get("HARDWARE_PROFILE", "gpu8"),
            seed=integer("HARDWARE_SEED", "0"),
            health_port=port("HEALTH_PORT", "51515"),
            health_address=env.get("HEALTH_ADDRESS", "127.0.0.1"),
            metrics_port=port("METRICS_PORT", "8080"),
            kubeconfig=_optional_path(env, "KUBECONFIG"),
            devices_per_slice=_slice_size(integer("DEVICES_PER_SLICE", "0")),
            call_log=_optional_path(env, "CALL_LOG"),
            faults_file=_optional_path(env, "FAULTS_FILE"),
        )


FAULTS_POLL_S = 0.5


@dataclass
class _Applied:
    """What of a faults file the hardware shows now."""

    marked: dict[str, dict[str, str]]
    fatal: frozenset[str] = frozenset()
    latency_ms: float = 0.0
    lost: frozenset[str] = frozenset()
    failure_rate: float = 0.0
    fail_message: str = ""


def _number(document: dict[str, object], key: str, highest: float | None = None) -> float:
    value = document.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:  # NaN too
        raise ValueError(f"{key} must be a number >= 0, not {value!r}")
    if highest is not None and value > highest:
        raise ValueError(f"{key} must be at most {highest:g}, not {value!r}")
    return float(value)


def _apply_faults(document: dict[str, object], hardware: NodeHardware, applied: _Applied) -> _Applied:
    """Bring the hardware to what ``document`` says, checked whole before any of it is
    applied, so a bad file changes nothing."""
    if not isinstance(document, dict):
        raise ValueError("the file must hold a JSON object")
    marked: dict[str, dict[str, str]] = {}
    for kind in applied.marked:
        entries = document.get(kind, {})
        if not isinstance(entries, dict):
            raise ValueError(f"{kind} must map devices to messages")
        marked[kind] = {str(d): str(m) for d, m in entries.items()}
    lost_listed = document.get("lost", [])
    if not isinstance(lost_listed, list):
        raise ValueError("lost must be a list of devices")
    lost = frozenset(str(d) for d in lost_listed)
    fatal_listed = document.get("fatal", [])
    if not isinstance(fatal_listed, list):
        raise ValueError("fatal must be a list of devices")
    fatal = frozenset(str(d) for d in fatal_listed)
    if fatal - set(marked["unhealthy"]):
        raise ValueError(f"fatal names {sorted(fatal - set(marked['unhealthy']))}, which unhealthy does not")
    latency_ms = _number(document, "latencyMs")
    failure_rate = _number(document, "failureRate", highest=1)
    fail_next = _number(document, "failNextPrepares")
    if not fail_next.is_integer():
        raise ValueError(f"failNextPrepares must be a whole number, not {fail_next:g}")
    unknown = set(lost).union(*(set(devices) for devices in marked.values())) - hardware.built_with()
    if unknown:
        raise ValueError(f"no device {sorted(unknown)} on this node (it has {sorted(hardware.built_with())})")

    present = {d.name for d in hardware.devices()}
    for device in sorted(lost):
        if device in present:  # not gone already, alone or with the GPU it is carved from
            hardware.lose_device(device)
            present = {d.name for d in hardware.devices()}
    if applied.lost - lost:
        log.warning("faults file: %s stay lost until the driver restarts", sorted(applied.lost - lost))
    for device in set(applied.marked["unhealthy"]) - set(marked["unhealthy"]):
        if device in present:
            hardware.set_health(device, Health.HEALTHY)
    for device, message in marked["unhealthy"].items():
        was = (applied.marked["unhealthy"].get(device), device in applied.fatal)
        if device in present and was != (message, device in fatal):
            hardware.set_health(device, Health.UNHEALTHY, message, fatal=device in fatal)
    for device in set(applied.marked["busy"]) - set(marked["busy"]):
        if device in present:
            hardware.set_busy(device, None)
    for device, message in marked["busy"].items():
        if device in present:
            hardware.set_busy(device, message)
    message = str(document.get("failMessage") or Faults.fail_message)
    hardware.inject(
        latency_s=latency_ms / 1000,
        failure_rate=failure_rate,
        fail_next_prepares=int(fail_next) if "failNextPrepares" in document else None,
        message=message,
    )
    now = _Applied(marked, fatal, latency_ms, lost | applied.lost, failure_rate, message)
    if now != applied or "failNextPrepares" in document:
        log.info(
            "faults file applied: unhealthy %s (fatal %s), busy %s, lost %s, latency %g ms, "
            "failure rate %g, next prepares to fail %d",
            sorted(marked["unhealthy"]),
            sorted(fatal),
            sorted(marked["busy"]),
            sorted(now.lost),
            latency_ms,
            failure_rate,
            hardware.faults.fail_next_prepares,
        )
    return now


async def follow_faults(path: Path, hardware: NodeHardware) -> None:
    """Apply the faults file whenever it changes (see the module's docstring for what it
    holds); a malformed one is logged and changes nothing."""
    seen: float | None = None
    applied = _Applied({"unhealthy": {}, "busy": {}})
    while True:
        try:
            stamp = path.stat().st_mtime_ns if path.exists() else None
            if stamp != seen:
                seen = stamp
                document = json.loads(path.read_text()) if stamp is not None else {}
                applied = _apply_faults(document, hardware, applied)
        except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
            log.warning(
                'faults file %s: %s; fix it (want {"unhealthy": {DEVICE: MESSAGE}, "fatal": [DEVICE], '
                '"busy": {DEVICE: MESSAGE}, '
                '"latencyMs": N, "lost": [DEVICE], "failNextPrepares": N, "failureRate": P, "failMessage": TEXT})',
                path,
                exc,
            )
        await asyncio.sleep(FAULTS_POLL_S)


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    try:
        profile = load_profile(settings.profile)
    except ProfileError as exc:
        raise TestbedError(
            str(exc), hint=f"set HARDWARE_PROFILE to one of {', '.join(PROFILES.shipped())} or a YAML path"
        ) from None
    client = KubeClient.from_kubeconfig(settings.kubeconfig)
    claims = ClaimReader(client)
    hardware = NodeHardware(settings.node, profile, settings.seed)
    backend = LocalBackend(hardware)
    faults = (
        asyncio.create_task(follow_faults(settings.faults_file, hardware), name="faults")
        if settings.faults_file is not None
        else None
    )
    plugins = [
        driver_on_node(
            driver,
            settings.node,
            DriverPaths.for_node(
                settings.kubelet_dir,
                driver,
                settings.cdi_dir,
                settings.pod_uid,
                settings.registry_dir,
                settings.plugins_dir,
            ),
            backend,
            client,
            claims,
            call_log=settings.call_log,
            devices_per_slice=settings.devices_per_slice,
        )
        for driver in settings.drivers or drivers_for(profile)
    ]
    liveness: grpc.aio.Server | None = None
    metrics = MetricsServer(settings.health_address, settings.metrics_port)
    try:
        if settings.metrics_port >= 0:
            try:
                log.info("metrics on http://%s:%d/metrics", settings.health_address, await metrics.start())
            except OSError as exc:
                address, port = settings.health_address, settings.metrics_port
                raise _unbindable("METRICS_PORT", address, port, exc.strerror) from None
        if settings.health_port >= 0:
            liveness = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(
                LivenessService([(str(p.paths.registration_socket), str(p.paths.dra_socket)) for p in plugins]),
                liveness,
            )
            try:
                port = liveness.add_insecure_port(f"{settings.health_address}:{settings.health_port}")
            except RuntimeError:  # grpc's word for a port it cannot bind (its log line says why)
                raise _unbindable("HEALTH_PORT", settings.health_address, settings.health_port, None) from None
            await liveness.start()
            log.info("liveness (grpc.health.v1) on %s:%d", settings.health_address, port)
        for plugin in plugins:
            await plugin.start()
            log.info(
                "serving %s on %s (registration %s)",
                plugin.name,
                plugin.paths.dra_socket,
                plugin.paths.registration_socket,
            )
        await stop.wait()
        log.info("stopping")
    finally:
        await cancel_and_wait(faults)
        await metrics.stop()
        if liveness is not None:
            await liveness.stop(1)
        for plugin in plugins:
            await plugin.stop()
        await client.close()


def _unbindable(variable: str, address: str, port: int, reason: str | None) -> TestbedError:
    """A port already taken (most often by another driver on this machine, each of which
    binds the same defaults) is a setting to change, not a crash."""
    return TestbedError(
        f"cannot listen on {address}:{port} ({variable}): {reason or 'in use, or not an address of this machine'}",
        hint=f"another process holds it (another testbed-driver on this machine?): set {variable} to a free "
        "port, 0 for any free port, or -1 for none",
    )


async def run(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop)


def log_level(value: str) -> int:
    """``LOG_LEVEL`` in any case, as manifests write it ("info", "DEBUG"), or a number."""
    name = value.strip().upper()
    if name.isdigit():
        return int(name)
    level = logging.getLevelNamesMapping().get(name)
    if level is None:
        raise TestbedError(f"LOG_LEVEL={value!r} is not a log level", hint="use debug, info, warning or error")
    return level


def main() -> None:
    try:
        logging.basicConfig(
            level=log_level(os.environ.get("LOG_LEVEL", "INFO")),
            format=LOG_FORMAT,
        )
        asyncio.run(run(Settings.from_env(dict(os.environ))))
    except TestbedError as exc:
        print(f"testbed-driver: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
