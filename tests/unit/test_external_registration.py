"""A node with a driver of the user's own starts once its kubelet registered that driver,
and fails its start with the reason when the driver keeps crashing or never registers:
a user bringing a driver learns at once why a node did not come up, and from its log."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import grpc
import pytest

from testbed.errors import TestbedError
from testbed.fleet.external import ExternalDriver, ExternalDriverSpec
from testbed.fleet.instances import CRASHES_WHILE_STARTING, wait_registered
from testbed.kubelet.plugins import PluginManager
from testbed.kubeletplugin.grpc_services import RegistrationService, add_registration_service

DRIVER = "gpu.example.com"
PATIENCE_S = 60.0
"""The start timeout the node is given: every outcome here must come well before it."""

pytestmark = pytest.mark.skipif(
    not Path("/proc/sys/fs/inotify").exists(), reason="inotify is Linux's; elsewhere the registry is polled"
)


def _driver(short_tmp_path: Path, program: str) -> ExternalDriver:
    return ExternalDriver(
        ExternalDriverSpec(name=DRIVER, command=(sys.executable, "-c", program)), "node-0", short_tmp_path / "node"
    )


async def _wait(short_tmp_path: Path, external: ExternalDriver, timeout_s: float, serve_after_s: float | None) -> float:
    """Seconds until ``wait_registered`` returned; a registration socket is served from
    here after ``serve_after_s`` (the driver's own program stands for the rest)."""
    registry = short_tmp_path / "node" / "kubelet" / "plugins_registry"
    registry.mkdir(parents=True)
    manager = PluginManager(registry, scan_interval_s=3600.0, watch_health=False)
    manager.start()
    server = grpc.aio.server()
    add_registration_service(server, RegistrationService(DRIVER, str(short_tmp_path / "dra.sock")))

    async def serve_later() -> None:
        assert serve_after_s is not None
        await asyncio.sleep(serve_after_s)  # the driver's start-up, not a synchronisation
        server.add_insecure_port(f"unix://{registry / 'driver.sock'}")
        await server.start()

    started = time.monotonic()
    serving = asyncio.create_task(serve_later()) if serve_after_s is not None else None
    await external.start({})
    try:
        await wait_registered(manager, external, timeout_s)
        assert manager.plugin_for(DRIVER) is not None
        return time.monotonic() - started
    finally:
        await external.stop()
        if serving is not None:
            await serving
        await server.stop(None)
        await manager.stop()


def test_a_driver_that_registers_is_waited_for_and_no_longer(short_tmp_path: Path) -> None:
    external = _driver(short_tmp_path, "import time; time.sleep(60)")
    waited = asyncio.run(_wait(short_tmp_path, external, PATIENCE_S, serve_after_s=0.3))
    assert 0.3 <= waited < PATIENCE_S / 6  # told by the plugin watcher, not at the timeout


def test_a_driver_that_keeps_crashing_fails_the_start_early_with_its_log(short_tmp_path: Path) -> None:
    external = _driver(short_tmp_path, "print('no device plugin socket for you'); raise SystemExit(3)")
    started = time.monotonic()
    with pytest.raises(TestbedError) as failure:
        asyncio.run(_wait(short_tmp_path, external, PATIENCE_S, serve_after_s=None))
    assert f"exited {CRASHES_WHILE_STARTING} times" in str(failure.value)
    assert "did not register" in str(failure.value)
    assert "no device plugin socket for you" in str(failure.value.detail)
    assert time.monotonic() - started < PATIENCE_S / 2  # at its second exit (1 s apart), not the timeout


def test_a_driver_that_runs_but_never_registers_fails_at_the_timeout(short_tmp_path: Path) -> None:
    external = _driver(short_tmp_path, "import time; time.sleep(60)")
    with pytest.raises(TestbedError, match=r"did not register with the kubelet \(not within 1 s\)"):
        asyncio.run(_wait(short_tmp_path, external, 1.0, serve_after_s=None))


def test_a_driver_its_liveness_probe_keeps_killing_fails_the_start_saying_so(short_tmp_path: Path) -> None:
    """A driver that does not serve its health endpoint (or not within the probe's initial
    delay) is killed by the probe, not crashing: the error says which, and what to check."""
    from testbed.fleet.liveness import LivenessSettings

    spec = ExternalDriverSpec(
        DRIVER, (sys.executable, "-c", "import time; time.sleep(60)"), liveness=LivenessSettings(period_s=0.1)
    )
    external = ExternalDriver(spec, "node-0", short_tmp_path / "node")
    with pytest.raises(TestbedError) as failure:
        asyncio.run(_wait(short_tmp_path, external, PATIENCE_S, serve_after_s=None))
    assert external.liveness_kills == CRASHES_WHILE_STARTING
    assert "killed 2 of them for failing its liveness probe" in str(failure.value)
    assert "$LIVENESS_PORT" in str(failure.value)


@pytest.mark.parametrize(("grace_s", "code"), [(0.5, -9), (30.0, 143)])  # -9: killed (SIGKILL)
def test_a_driver_is_stopped_with_sigterm_and_killed_once_its_grace_period_is_over(
    short_tmp_path: Path, grace_s: float, code: int
) -> None:
    """As the kubelet stops a DaemonSet pod: SIGTERM, and SIGKILL after the pod's
    terminationGracePeriodSeconds. A driver still cleaning up after SIGTERM (here: one
    that takes 3 s to exit) is killed when its grace is shorter, and exits on its own
    otherwise."""
    program = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(143)))\n"
        "print('handler', 'set', flush=True)\n"
        "time.sleep(600)\n"
    )
    spec = ExternalDriverSpec(name=DRIVER, command=(sys.executable, "-c", program), grace_s=grace_s)
    external = ExternalDriver(spec, "node-0", short_tmp_path / "node")

    async def scenario() -> tuple[int | None, float]:
        await external.start({})
        deadline = time.monotonic() + PATIENCE_S
        while "handler set" not in (external.log_path.read_text() if external.log_path.exists() else ""):
            assert time.monotonic() < deadline, "the driver never started"
            await asyncio.sleep(0.05)
        began = time.monotonic()
        return await external.stop(), time.monotonic() - began

    exit_code, took_s = asyncio.run(scenario())
    assert exit_code == code
    assert min(grace_s, 3.0) <= took_s < min(grace_s, 3.0) + 2.0, took_s
