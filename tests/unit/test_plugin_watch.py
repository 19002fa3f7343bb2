"""The fake kubelet learns of registration sockets as a kubelet does, from inotify: a
driver that starts is registered within a moment however seldom the registry would be
polled, in subdirectories made later too, and a socket that went is deregistered."""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from testbed.kubelet import dirwatch
from testbed.kubelet.plugins import PluginManager
from testbed.kubeletplugin.grpc_services import RegistrationService, add_registration_service

NEVER_S = 3600.0
"""A poll interval no test outlives: what is seen, inotify told of."""
DEADLINE_S = 10.0

pytestmark = pytest.mark.skipif(
    not Path("/proc/sys/fs/inotify").exists(), reason="inotify is Linux's; elsewhere the registry is polled"
)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:.0f} s: {what}"
        await asyncio.sleep(0.02)


class FirstAnswersUnavailable(RegistrationService):
    """A driver whose first GetInfo fails (still starting up)."""

    def __init__(self, driver: str, endpoint: str):
        super().__init__(driver, endpoint)
        self.asked = 0

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.asked += 1
        if self.asked == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
        return await super().GetInfo(request, context)


async def _serve(socket: Path, registration: RegistrationService) -> grpc.aio.Server:
    server = grpc.aio.server()
    add_registration_service(server, registration)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


def test_a_directory_watcher_wakes_on_entries_made_and_removed(short_tmp_path: Path) -> None:
    async def run() -> None:
        watcher = dirwatch.watcher()
        assert watcher is not None
        woken = asyncio.Event()
        watch = watcher.watch(short_tmp_path, woken.set)
        (short_tmp_path / "made").touch()
        await asyncio.wait_for(woken.wait(), DEADLINE_S)
        woken.clear()
        (short_tmp_path / "made").unlink()
        await asyncio.wait_for(woken.wait(), DEADLINE_S)
        watcher.unwatch(watch)
        assert watcher.watched == 0

    asyncio.run(run())


def test_a_driver_starting_in_a_new_subdirectory_is_registered_and_its_removal_seen(short_tmp_path: Path) -> None:
    registry = short_tmp_path / "plugins_registry"

    async def run() -> None:
        manager = PluginManager(registry, scan_interval_s=NEVER_S, watch_health=False)
        manager.start()
        await _until(lambda: bool(manager._watches), "the registry watched")
        (registry / "vendor").mkdir()  # after the kubelet started: it is watched once seen
        socket = registry / "vendor" / "driver.sock"
        server = await _serve(socket, RegistrationService("gpu.example.com", str(short_tmp_path / "dra.sock")))
        try:
            await asyncio.wait_for(manager.wait_for_driver("gpu.example.com", DEADLINE_S), DEADLINE_S)
        finally:
            await server.stop(None)
        socket.unlink(missing_ok=True)
        await _until(lambda: manager.drivers() == [], "the driver deregistered after its socket went")
        await manager.stop()
        assert not manager._watches

    asyncio.run(run())


def test_a_registration_that_failed_is_tried_again_without_any_change_on_disk(short_tmp_path: Path) -> None:
    registry = short_tmp_path / "plugins_registry"

    async def run() -> None:
        manager = PluginManager(registry, scan_interval_s=NEVER_S, watch_health=False)
        manager.start()
        await _until(lambda: bool(manager._watches), "the registry watched")
        registration = FirstAnswersUnavailable("nic.example.com", str(short_tmp_path / "dra.sock"))
        server = await _serve(registry / "driver.sock", registration)
        try:
            await asyncio.wait_for(manager.wait_for_driver("nic.example.com", DEADLINE_S), DEADLINE_S)
            assert registration.asked == 2
        finally:
            await server.stop(None)
            await manager.stop()

    asyncio.run(run())


def test_a_subdirectory_removed_and_made_again_is_watched_anew(short_tmp_path: Path) -> None:
    registry = short_tmp_path / "plugins_registry"

    async def run() -> None:
        manager = PluginManager(registry, scan_interval_s=NEVER_S, watch_health=False)
        manager.start()
        vendor = registry / "vendor"
        vendor.mkdir(parents=True)
        await _until(lambda: vendor in manager._watches, "the subdirectory watched")
        old = manager._watches[vendor]
        vendor.rmdir()  # and made again before the kubelet looks: its old watch went with it
        vendor.mkdir()
        await _until(lambda: manager._watches.get(vendor, old) != old, "the new subdirectory watched")
        server = await _serve(
            vendor / "driver.sock", RegistrationService("gpu.example.com", str(short_tmp_path / "d.sock"))
        )
        try:
            await asyncio.wait_for(manager.wait_for_driver("gpu.example.com", DEADLINE_S), DEADLINE_S)
        finally:
            await server.stop(None)
            await manager.stop()

    asyncio.run(run())


def test_with_no_inotify_watch_left_the_registry_is_polled_and_that_said_once(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """fs.inotify.max_user_watches reached (ENOSPC, as the kernel answers): registration
    still happens, by polling, and a NodeHost of hundreds of nodes says so once."""

    def no_watch_left(self: dirwatch.DirectoryWatcher, directory: Path, wake: dirwatch.Wake) -> dirwatch.Watch:
        self.exhausted = True
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dirwatch.DirectoryWatcher, "watch", no_watch_left)

    async def run() -> None:
        registries = [short_tmp_path / f"node{i}" / "plugins_registry" for i in range(2)]
        managers = [PluginManager(registry, scan_interval_s=0.05, watch_health=False) for registry in registries]
        servers = []
        for manager, registry in zip(managers, registries, strict=True):
            manager.start()
            registration = RegistrationService("nic.example.com", str(registry.parent / "dra.sock"))
            servers.append(await _serve(registry / "driver.sock", registration))
        try:
            for manager in managers:
                await asyncio.wait_for(manager.wait_for_driver("nic.example.com", DEADLINE_S), DEADLINE_S)
                assert not manager._watches
        finally:
            for server in servers:
                await server.stop(None)
            for manager in managers:
                await manager.stop()

    with caplog.at_level("DEBUG", logger="testbed.kubelet.plugins"):
        asyncio.run(run())
    said = [r for r in caplog.records if "max_user_watches" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "DEBUG"], said
