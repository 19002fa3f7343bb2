"""Find the control-plane binaries: explicit dir, cache, release download, or Go build.

The order is the user's: an explicit ``TESTBED_KUBE_BIN_DIR`` wins; a per-user cache
is reused; a release download is tried where the network allows (checked against the
published sha256 sums); otherwise the pinned wrapper modules under ``scripts/`` are
built with the local Go toolchain, which is what runs on machines without a route to
the release sites.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from testbed import config, locks
from testbed.errors import TestbedError
from testbed.progress import Progress, SilentProgress

SOURCE_FILE = "SOURCE"
"""Written next to cached binaries: where they came from, for `testbed status`."""

BUILD_INFO_FILE = "build-info.json"
"""How long the cold build took, for `make bench` to report without rebuilding."""

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
"""What a Kubernetes release publishes and the wrapper module builds from k8s.io/kubernetes."""

OWN_SOURCES = {name: f"cmd/{name}" for name in ("testbed-cri", *config.BENCH_BINARIES)}
"""Binaries built from this project's own Go code: rebuilt when their source changes."""

GO_PACKAGES = {
    **{name: f"k8s.io/kubernetes/cmd/{name}" for name in KUBE_COMMANDS},
    **{name: f"dra-testbed/kube-build/{directory}" for name, directory in OWN_SOURCES.items()},
    **config.UPSTREAM_DRIVERS,
}
"""Every binary the kube-build wrapper module makes, by its package."""


@dataclass(frozen=True)
class Binaries:
    directory: Path
    source: str

    def path(self, name: str) -> Path:
        return self.directory / name

    def has(self, name: str) -> bool:
        return os.access(self.path(name), os.X_OK)


class NetworkUnavailable(Exception):
    """The release site cannot be reached; not an error, a reason to build instead."""


def go_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def scripts_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "scripts"


def missing_binaries(directory: Path, names: tuple[str, ...] = config.CONTROL_PLANE_BINARIES) -> list[str]:
    return [n for n in names if not os.access(directory / n, os.X_OK)]


def ensure_binaries(progress: Progress | None = None, allow_download: bool = True) -> Binaries:
    """Return a directory with all four control-plane binaries, obtaining them if needed."""
    progress = progress or SilentProgress()
    override = config.kube_bin_dir_override()
    if override is not None:
        missing = missing_binaries(override)
        if missing:
            raise TestbedError(
                f"TESTBED_KUBE_BIN_DIR={override} lacks {', '.join(missing)}",
                hint="point TESTBED_KUBE_BIN_DIR at a directory with executable etcd, "
                "kube-apiserver, kube-controller-manager and kube-scheduler, or unset it",
            )
        return Binaries(override, f"TESTBED_KUBE_BIN_DIR ({override})")

    cache = config.binaries_cache_dir()
    cached = _cached(cache)
    if cached:
        return cached

    cache.parent.mkdir(parents=True, exist_ok=True)
    with _obtaining(cache.parent, progress):
        cached = _cached(cache)  # another process may have finished while we waited
        if cached:
            return cached
        network_reason = "downloads disabled"
        if allow_download:
            try:
                return _download(cache, progress)
            except NetworkUnavailable as exc:
                network_reason = str(exc)
                progress.step(f"release downloads unreachable ({exc}); building from Go modules")
        go = shutil.which("go")
        if go is None:
            raise TestbedError(
                f"no Kubernetes {config.KUBERNETES_VERSION} control-plane binaries: none cached "
                f"in {cache}, release downloads unreachable ({network_reason}), and no Go "
                "toolchain on PATH to build them",
                hint="any one of: (1) set TESTBED_KUBE_BIN_DIR to a directory holding etcd, "
                "kube-apiserver, kube-controller-manager and kube-scheduler; (2) allow network "
                f"access to {config.RELEASE_BASE_URL}; (3) install Go >= 1.26 so they can be "
                "built from the Go module proxy",
            )
        return _build(cache, go, progress)


def ensure_node_binaries(progress: Progress | None = None) -> Binaries:
    """The kubelet and the fake CRI for real-kubelet nodes, next to the control plane.

    A cache made before they existed gets them added by a build of those two alone
    (minutes, not the full build), under the same lock as a full build."""
    return _ensure_added(config.NODE_BINARIES, "real-kubelet nodes", "use `kubelet: fake` pools", progress)


def ensure_bench_binaries(progress: Progress | None = None) -> Binaries:
    """The kubelet's Go DRA client and the helper-based yardstick driver, for `make bench`."""
    return _ensure_added(config.BENCH_BINARIES, "driver benchmarks", "skip those benchmarks", progress)


def ensure_named(names: tuple[str, ...], progress: Progress | None = None) -> Binaries:
    """Whichever of the binaries the testbed knows are asked for by name (``testbed
    binaries NAME``), the control plane's and those built on first use alike."""
    unknown = sorted(set(names) - set(known_binaries()))
    if unknown:
        raise TestbedError(
            f"no binary named {', '.join(unknown)}",
            hint=f"name one of {', '.join(known_binaries())}",
        )
    found = ensure_binaries(progress)
    later = tuple(name for name in names if name not in config.CONTROL_PLANE_BINARIES)
    return _ensure_added(later, "`testbed binaries`", "name those already there", progress) if later else found


def known_binaries() -> tuple[str, ...]:
    return (
        *config.CONTROL_PLANE_BINARIES,
        *config.OPTIONAL_BINARIES,
        *config.NODE_BINARIES,
        *config.BENCH_BINARIES,
        *config.UPSTREAM_DRIVERS,
    )


def _ensure_added(names: tuple[str, ...], purpose: str, otherwise: str, progress: Progress | None) -> Binaries:
    """``names`` next to the control-plane binaries, built now if missing or stale."""
    progress = progress or SilentProgress()
    found = ensure_binaries(progress)
    missing = _stale_or_missing(found.directory, names)
    if not missing:
        return found
    if config.kube_bin_dir_override() is not None:
        raise TestbedError(
            f"TESTBED_KUBE_BIN_DIR={found.directory} lacks {', '.join(missing)}, which {purpose} need",
            hint="add them (go build ./cmd/<name> in scripts/kube-build) to that directory, "
            "or unset TESTBED_KUBE_BIN_DIR to use the cache",
        )
    go = shutil.which("go")
    if go is None:
        raise TestbedError(
            f"{purpose} need {', '.join(missing)}, which are built from Go modules, and no Go toolchain is on PATH",
            hint=f"install Go >= 1.26 and retry, or {otherwise}",
        )
    with _obtaining(found.directory.parent, progress):
        missing = _stale_or_missing(found.directory, names)
        if missing:
            staging = Path(tempfile.mkdtemp(prefix=".build-", dir=found.directory.parent))
            try:
                progress.step(f"building {', '.join(missing)} for {purpose} (new, or its source changed)")
                with progress.task(f"go build {', '.join(missing)}"):
                    ldflags = version_ldflags(dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
                    _go_build(go, _kube_module(), [GO_PACKAGES[n] for n in missing], staging, ldflags, progress)
                for name in missing:  # go names a binary after its package's directory
                    (staging / GO_PACKAGES[name].rsplit("/", 1)[-1]).rename(found.directory / name)
                _stamp_sources(found.directory)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return found


def _source_digest(name: str) -> str:
    directory = scripts_dir() / "kube-build" / OWN_SOURCES[name]
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*.go")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _stale(directory: Path, name: str) -> bool:
    """Built here from an older version of its source (or with no record of it)."""
    stamp = directory / f"{name}.source-sha256"
    if not (directory / name).exists():
        return False
    return not stamp.is_file() or stamp.read_text().strip() != _source_digest(name)


def _stale_or_missing(directory: Path, names: tuple[str, ...]) -> list[str]:
    if config.kube_bin_dir_override() is not None:  # the user's binaries, used as they are
        return missing_binaries(directory, names)
    stale = {name for name in names if name in OWN_SOURCES and _stale(directory, name)}
    return sorted(set(missing_binaries(directory, names)) | stale)


def _stamp_sources(directory: Path) -> None:
    for name in OWN_SOURCES:
        if (directory / name).exists():
            (directory / f"{name}.source-sha256").write_text(_source_digest(name) + "\n")


def _kube_module() -> Path:
    module = scripts_dir() / "kube-build"
    if not (module / "go.mod").exists():
        raise TestbedError(
            f"the Go wrapper module is not in {module.parent}",
            hint="build from a checkout of dra-testbed (pip install -e .), or set TESTBED_KUBE_BIN_DIR",
        )
    return module


def _cached(cache: Path) -> Binaries | None:
    if cache.is_dir() and not missing_binaries(cache):
        source_file = cache / SOURCE_FILE
        source = source_file.read_text().strip() if source_file.exists() else "unknown"
        return Binaries(cache, f"cache {cache} ({source})")
    return None


def _obtaining(cache_root: Path, progress: Progress) -> contextlib.AbstractContextManager[None]:
    """One process at a time builds or downloads into the cache; the others wait for it
    (a build takes minutes: they say whose) and then find its binaries."""
    return locks.held(
        cache_root / ".obtain.lock",
        holder="another testbed process",
        waiting=lambda who: progress.step(f"waiting for {who}, which is filling {cache_root}"),
    )


def _publish(staging: Path, cache: Path, source: str) -> Binaries:
    """Move a complete staging dir into place so a half-finished one is never used."""
    (staging / SOURCE_FILE).write_text(source + "\n")
    if cache.exists():
        shutil.rmtree(cache)
    staging.rename(cache)
    return Binaries(cache, f"{source}; cached in {cache}")


# --- download ------------------------------------------------------------------------


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=config.DOWNLOAD_TIMEOUT_S) as response:
            data: bytes = response.read()
            return data
    except urllib.error.HTTPError as exc:
        raise TestbedError(f"download of {url} failed: HTTP {exc.code}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise NetworkUnavailable(f"{url}: {reason}") from exc


def _verified(data: bytes, expected_hex: str, what: str) -> bytes:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_hex.lower():
        raise TestbedError(
            f"{what}: sha256 {actual} does not match the published {expected_hex}",
            hint="the download was corrupted or tampered with; retry, or build from Go "
            "modules by blocking downloads (TESTBED_KUBE_BIN_DIR or offline)",
        )
    return data


def _download(cache: Path, progress: Progress) -> Binaries:
    arch = go_arch()
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache.parent))
    try:
        base = f"{config.RELEASE_BASE_URL}/{config.KUBERNETES_VERSION}/bin/linux/{arch}"
        for name in KUBE_COMMANDS:
            with progress.task(f"downloading {name} {config.KUBERNETES_VERSION}"):
                expected = _fetch(f"{base}/{name}.sha256").decode().split()[0]
                data = _verified(_fetch(f"{base}/{name}"), expected, name)
            target = staging / name
            target.write_bytes(data)
            target.chmod(0o755)
        tarball = f"etcd-{config.ETCD_VERSION}-linux-{arch}.tar.gz"
        etcd_base = f"{config.ETCD_RELEASE_BASE_URL}/{config.ETCD_VERSION}"
        with progress.task(f"downloading etcd {config.ETCD_VERSION}"):
            sums = _fetch(f"{etcd_base}/SHA256SUMS").decode()
            expected = next((line.split()[0] for line in sums.splitlines() if line.endswith(tarball)), "")
            if not expected:
                raise TestbedError(f"etcd SHA256SUMS has no entry for {tarball}")
            archive = _verified(_fetch(f"{etcd_base}/{tarball}"), expected, tarball)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.getmember(f"{tarball.removesuffix('.tar.gz')}/etcd")
            extracted = tar.extractfile(member)
            if extracted is None:
                raise TestbedError(f"{tarball} holds no etcd binary")
            (staging / "etcd").write_bytes(extracted.read())
            (staging / "etcd").chmod(0o755)
        return _publish(staging, cache, "downloaded release binaries, sha256 verified")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --- build from Go modules -------------------------------------------------------------


def version_ldflags(build_date: str) -> str:
    """Stamp the version into both places a component reads it, so /version is real."""
    major, minor = config.KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={config.KUBERNETES_VERSION}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate={build_date}",
        ]
    return " ".join(flags)


def _go_build(go: str, module_dir: Path, packages: list[str], output: Path, ldflags: str, progress: Progress) -> None:
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
    command = [go, "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", f"{output}/", *packages]
    compiled = 0
    tail: list[str] = []
    with subprocess.Popen(
        command,
        cwd=module_dir,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip()
            tail = [*tail[-30:], line]
            if line and not line.startswith(("go: ", "#")):
                compiled += 1
                progress.update(f"compiled {compiled} packages (now {line})")
        code = proc.wait()
    if code != 0:
        raise TestbedError(
            f"go build in {module_dir} failed (exit {code})",
            detail="\n".join(tail),
            hint="check the Go toolchain (>= 1.26) and access to the Go module proxy",
        )


def _build(cache: Path, go: str, progress: Progress) -> Binaries:
    scripts = scripts_dir()
    kube_module, etcd_module = scripts / "kube-build", scripts / "etcd-build"
    if not (kube_module / "go.mod").exists() or not (etcd_module / "go.mod").exists():
        raise TestbedError(
            f"the Go wrapper modules are not in {scripts}",
            hint="build from a checkout of dra-testbed (pip install -e .), or set TESTBED_KUBE_BIN_DIR",
        )
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=cache.parent))
    build_date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    build_started = time.monotonic()
    try:
        progress.step(
            f"building Kubernetes {config.KUBERNETES_VERSION} from Go modules with {go_version} "
            "(first time only; about 10-20 minutes on 2 cores)"
        )
        built_now = [name for name in GO_PACKAGES if name not in config.UPSTREAM_DRIVERS]  # those: on first use
        packages = [GO_PACKAGES[name] for name in built_now]
        with progress.task(f"go build {', '.join(built_now)}"):
            _go_build(go, kube_module, packages, staging, version_ldflags(build_date), progress)
        with progress.task(f"go build etcd {config.ETCD_VERSION}"):
            etcd_dir = staging / "etcd-out"
            etcd_dir.mkdir()
            _go_build(go, etcd_module, ["go.etcd.io/etcd/server/v3"], etcd_dir, "-s -w", progress)
            built = next(etcd_dir.iterdir())
            built.rename(staging / "etcd")
            etcd_dir.rmdir()
        seconds = time.monotonic() - build_started
        source = (
            f"built from Go modules (k8s.io/kubernetes {config.KUBERNETES_VERSION}, "
            f"go.etcd.io/etcd/server/v3 {config.ETCD_VERSION}) with {go_version} on {build_date} "
            f"in {seconds / 60:.1f} min"
        )
        (staging / BUILD_INFO_FILE).write_text(
            json.dumps({"seconds": round(seconds, 1), "go": go_version, "date": build_date})
        )
        _stamp_sources(staging)
        return _publish(staging, cache, source)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
