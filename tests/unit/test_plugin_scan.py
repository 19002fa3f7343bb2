"""The kubelet's periodic look at its plugin registry: one stat while nothing changed, and
a socket that appears is never missed."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

from testbed.kubelet.plugins import PluginManager


def _age(directory: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(directory, (then, then))


def _socket_at(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    return server


def test_a_settled_empty_registry_is_not_listed_again_until_a_socket_appears(short_tmp_path: Path) -> None:
    registry = short_tmp_path / "plugins_registry"
    registry.mkdir()
    manager = PluginManager(registry, watch_health=False)
    _age(registry, 10)
    asyncio.run(manager.scan())
    assert manager._unchanged()
    server = _socket_at(registry / "driver.sock")  # a driver starts
    try:
        assert not manager._unchanged()
    finally:
        server.close()


def test_a_change_just_before_a_scan_is_not_trusted_to_be_the_last(short_tmp_path: Path) -> None:
    registry = short_tmp_path / "plugins_registry"
    registry.mkdir()
    manager = PluginManager(registry, watch_health=False)
    asyncio.run(manager.scan())  # the directory was made a moment ago: same clock tick as a change to come
    assert not manager._unchanged()


def test_a_socket_that_did_not_answer_is_looked_at_again(short_tmp_path: Path) -> None:
    registry = short_tmp_path / "plugins_registry"
    registry.mkdir()
    server = _socket_at(registry / "silent.sock")  # bound, not listening: GetInfo fails
    try:
        manager = PluginManager(registry, watch_health=False)
        _age(registry, 10)
        asyncio.run(manager.scan())
        assert manager.drivers() == []
        assert not manager._unchanged()
    finally:
        server.close()


def test_sockets_in_subdirectories_are_found_as_the_kubelet_walks_them(short_tmp_path: Path) -> None:
    """The kubelet's plugin watcher walks the registry directory's subdirectories too,
    skips names starting with '.', and follows no symlinks."""
    registry = short_tmp_path / "plugins_registry"
    (registry / "vendor" / "deeper").mkdir(parents=True)
    (short_tmp_path / "elsewhere").mkdir()
    (registry / "link").symlink_to(short_tmp_path / "elsewhere")
    servers = [
        _socket_at(path)
        for path in (
            registry / "top.sock",
            registry / "vendor" / "deeper" / "nested.sock",
            registry / "vendor" / ".hidden.sock",
            short_tmp_path / "elsewhere" / "linked.sock",
        )
    ]
    try:
        manager = PluginManager(registry, watch_health=False)
        assert manager._listing() == {registry / "top.sock", registry / "vendor" / "deeper" / "nested.sock"}
        for directory in (registry, registry / "vendor", registry / "vendor" / "deeper", registry / "link"):
            _age(directory, 10)
        manager._scanned_stamp = manager._stamp()
        assert manager._unchanged()
        servers.append(_socket_at(registry / "vendor" / "deeper" / "later.sock"))  # a driver starts down there
        assert not manager._unchanged()
    finally:
        for server in servers:
            server.close()
