"""Binary resolution: override dir, cache, download (from a local release mirror), errors."""

import hashlib
import http.server
import io
import os
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import config
from testbed.controlplane import binaries
from testbed.errors import TestbedError

SCRIPT = b"#!/bin/sh\necho fake\n"


def _write_executables(directory: Path, names: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(SCRIPT)
        (directory / name).chmod(0o755)


@pytest.fixture
def isolated_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("TESTBED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TESTBED_KUBE_BIN_DIR", raising=False)
    return tmp_path / "cache"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_override_dir_is_used_as_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_executables(tmp_path, config.CONTROL_PLANE_BINARIES)
    monkeypatch.setenv("TESTBED_KUBE_BIN_DIR", str(tmp_path))
    found = binaries.ensure_binaries()
    assert found.directory == tmp_path
    assert "TESTBED_KUBE_BIN_DIR" in found.source


def test_override_dir_missing_a_binary_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_executables(tmp_path, ("etcd", "kube-apiserver"))
    monkeypatch.setenv("TESTBED_KUBE_BIN_DIR", str(tmp_path))
    with pytest.raises(TestbedError) as info:
        binaries.ensure_binaries()
    assert "kube-controller-manager, kube-scheduler" in str(info.value)


def test_complete_cache_is_reused(isolated_cache: Path) -> None:
    cache = config.binaries_cache_dir()
    _write_executables(cache, config.CONTROL_PLANE_BINARIES)
    (cache / binaries.SOURCE_FILE).write_text("built earlier\n")
    found = binaries.ensure_binaries(allow_download=False)
    assert found.directory == cache and "built earlier" in found.source


def test_nothing_available_gives_one_error_naming_three_ways_out(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(config, "RELEASE_BASE_URL", f"http://127.0.0.1:{_closed_port()}/release")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    with pytest.raises(TestbedError) as info:
        binaries.ensure_binaries()
    text = str(info.value)
    assert "TESTBED_KUBE_BIN_DIR" in text
    assert "network" in text and "Go" in text
    assert not config.binaries_cache_dir().exists()


class _Mirror:
    """A local copy of the release layout, served over HTTP on 127.0.0.1."""

    def __init__(self, root: Path, tamper: bool = False):
        arch = binaries.go_arch()
        kube = root / "release" / config.KUBERNETES_VERSION / "bin" / "linux" / arch
        kube.mkdir(parents=True)
        for name in binaries.KUBE_COMMANDS:
            (kube / name).write_bytes(SCRIPT + name.encode())
            digest = hashlib.sha256(SCRIPT + name.encode()).hexdigest()
            (kube / f"{name}.sha256").write_text("0" * 64 if tamper else digest)
        etcd = root / "etcd" / config.ETCD_VERSION
        etcd.mkdir(parents=True)
        stem = f"etcd-{config.ETCD_VERSION}-linux-{arch}"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            info = tarfile.TarInfo(f"{stem}/etcd")
            info.size, info.mode = len(SCRIPT), 0o755
            tar.addfile(info, io.BytesIO(SCRIPT))
        (etcd / f"{stem}.tar.gz").write_bytes(buffer.getvalue())
        digest = hashlib.sha256(buffer.getvalue()).hexdigest()
        (etcd / "SHA256SUMS").write_text(f"{digest}  {stem}.tar.gz\n")
        handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mirror_factory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[object]:
    mirrors: list[_Mirror] = []

    def make(tamper: bool = False) -> _Mirror:
        mirror = _Mirror(tmp_path / f"mirror{len(mirrors)}", tamper)
        mirrors.append(mirror)
        monkeypatch.setattr(config, "RELEASE_BASE_URL", f"{mirror.url}/release")
        monkeypatch.setattr(config, "ETCD_RELEASE_BASE_URL", f"{mirror.url}/etcd")
        return mirror

    yield make
    for mirror in mirrors:
        mirror.close()


def test_download_verifies_checksums_and_fills_the_cache(isolated_cache: Path, mirror_factory) -> None:  # type: ignore[no-untyped-def]
    mirror_factory()
    found = binaries.ensure_binaries()
    assert "sha256 verified" in found.source
    for name in (*config.CONTROL_PLANE_BINARIES, "kubectl"):
        assert os.access(found.path(name), os.X_OK), name
    assert (found.directory / "kube-scheduler").read_bytes().endswith(b"kube-scheduler")
    again = binaries.ensure_binaries()
    assert again.directory == found.directory and again.source.startswith("cache")


def test_a_tampered_download_is_refused_and_nothing_is_cached(isolated_cache: Path, mirror_factory) -> None:  # type: ignore[no-untyped-def]
    mirror_factory(tamper=True)
    with pytest.raises(TestbedError) as info:
        binaries.ensure_binaries()
    assert "does not match the published" in str(info.value)
    assert not config.binaries_cache_dir().exists()
    assert not [p for p in isolated_cache.iterdir() if p.name.startswith(".download-")]


def test_version_ldflags_stamp_both_version_packages() -> None:
    flags = binaries.version_ldflags("2026-01-01T00:00:00Z")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion={config.KUBERNETES_VERSION}" in flags
        assert f"-X {package}.gitMinor=37" in flags


def test_our_own_go_binary_is_rebuilt_when_its_source_changes(tmp_path: Path) -> None:
    """testbed-cri is built from this repository: a cached one from older source is stale."""
    (tmp_path / "testbed-cri").write_bytes(b"old build")
    assert binaries._stale(tmp_path, "testbed-cri"), "no record of its source: rebuild"
    binaries._stamp_sources(tmp_path)
    assert not binaries._stale(tmp_path, "testbed-cri")
    (tmp_path / "testbed-cri.source-sha256").write_text("0" * 64 + "\n")
    assert binaries._stale(tmp_path, "testbed-cri"), "the source changed since"
    assert not binaries._stale(tmp_path / "empty", "testbed-cri"), "missing is not stale (it is missing)"
