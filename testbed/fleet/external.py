"""A driver the testbed did not write, run on a synthetic node as its DaemonSet would run it.

One process per node: the environment a driver pod gets (its node, pod UID, the
kubelet's plugin directories, CDI directory, credentials bound to that node), its
output in the node's ``logs/<driver>.log``, restarted with back-off when it dies, and
stopped with SIGTERM (SIGKILL after a grace period) when the node is drained. The fake
kubelet reaches it only through the sockets it registers, as a kubelet would.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from testbed.config import runtime_root
from testbed.controlplane import processes
from testbed.errors import TestbedError
from testbed.files import private_dir, write_atomically

log = logging.getLogger(__name__)

RESTART_FIRST_DELAY_S = 1.0
RESTART_MAX_DELAY_S = 30.0
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class ExternalDriverSpec:
    name: str
    """The DRA driver name it registers (e.g. fpga.example.com): the kubelet looks it up by it."""
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def recorded_drivers(nodes_dir: Path) -> dict[str, list[processes.ProcessRecord]]:
    """External driver processes under a fleet's nodes dir, by node, as last started."""
    found: dict[str, list[processes.ProcessRecord]] = {}
    for path in sorted(nodes_dir.glob("*/driver-*.process.json")):
        try:
            record = processes.ProcessRecord.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.setdefault(path.parent.name, []).append(record)
    return found


def prune_short_paths() -> None:
    """Drop the short names whose node directories are gone (a cluster taken down)."""
    base = runtime_root() / "a"
    for alias in base.glob("*") if base.is_dir() else []:
        if alias.is_symlink() and not alias.exists():
            alias.unlink(missing_ok=True)


@dataclass(frozen=True)
class ShortPaths:
    """Short names for a node's plugins_registry and plugins directories (symlinks).

    A unix socket path must fit in 107 bytes, and drivers name their sockets after
    themselves and their pod's UID (``<driver>-<uid>-reg.sock``, 60-odd bytes): under a
    synthetic node's directory that overflows, where a real node's /var/lib/kubelet does
    not. So the kubelet and the driver both use these."""

    registry: Path
    plugins: Path

    @classmethod
    def for_node(cls, root: Path) -> ShortPaths:
        base = private_dir(runtime_root() / "a")
        digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
        return cls(base / f"{digest}r", base / f"{digest}p")

    def link(self, kubelet_dir: Path) -> None:
        for alias, target in (
            (self.registry, kubelet_dir / "plugins_registry"),
            (self.plugins, kubelet_dir / "plugins"),
        ):
            target.mkdir(parents=True, exist_ok=True)
            if alias.is_symlink() and alias.readlink() == target:
                continue
            alias.unlink(missing_ok=True)
            alias.symlink_to(target)

    def unlink(self) -> None:
        for alias in (self.registry, self.plugins):
            alias.unlink(missing_ok=True)


def driver_environment(node: str, root: Path, pod_uid: str, kubeconfig: Path, short: ShortPaths) -> dict[str, str]:
    """What a DaemonSet's pod spec would hand a driver on ``node`` (downward API, hostPath
    mounts), under the names the common DRA drivers read."""
    kubelet = root / "kubelet"
    return {
        "NODE_NAME": node,
        "POD_UID": pod_uid,
        "POD_NAMESPACE": "dra-testbed",
        "KUBELET_DIR": str(kubelet),
        "KUBELET_REGISTRAR_DIRECTORY_PATH": str(short.registry),
        "KUBELET_PLUGINS_DIRECTORY_PATH": str(short.plugins),
        "CDI_DIR": str(root / "cdi"),
        "CDI_ROOT": str(root / "cdi"),
        "HARDWARE_DIR": str(root / "hardware"),
        "KUBECONFIG": str(kubeconfig),
    }


class ExternalDriver:
    """One foreign driver process on one node, kept running until ``stop``."""

    def __init__(
        self,
        spec: ExternalDriverSpec,
        node: str,
        root: Path,
    ):
        self.spec = spec
        self.node = node
        self.root = root
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.restarted = asyncio.Event()
        """Set (and replaced) at each restart: what a wait for this driver wakes on."""
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def log_path(self) -> Path:
        return self.root / "logs" / f"{self.spec.name}.log"

    @property
    def records(self) -> Path:
        """Which process serves this driver on this node, for a NodeHost that takes over."""
        return self.root / f"driver-{self.spec.name}.process.json"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def start(self, environment: Mapping[str, str]) -> None:
        """Start it (after stopping what an earlier NodeHost of this node left running)."""
        self._reap_leftover()
        self._stopping = False
        for sub in ("logs", "work", "cdi", "kubelet/plugins_registry", "kubelet/plugins"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._environment = {**environment, **self.spec.env}
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"driver-{self.spec.name}-{self.node}")

    async def _spawn(self) -> None:
        with open(self.log_path, "ab") as handle:
            handle.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(self.spec.command)}\n".encode())
            handle.flush()
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self.spec.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=handle,
                    stderr=handle,
                    cwd=self.root / "work",
                    env=dict(os.environ, **self._environment),
                    start_new_session=True,
                )
            except OSError as exc:
                raise TestbedError(
                    f"node {self.node}: cannot run driver {self.spec.name}'s command {self.spec.command[0]!r}: "
                    f"{exc.strerror or exc}",
                    hint="give the path of an executable (and its arguments)",
                ) from None
        self._remember()

    async def _supervise(self) -> None:
        """Restart it when it exits, waiting 1 s, doubling to 30 s while it keeps dying
        within a minute of its start (as a kubelet's back-off does for a crashing pod)."""
        delay = RESTART_FIRST_DELAY_S
        while True:
            assert self.process is not None
            started = time.monotonic()
            code = await self.process.wait()
            if self._stopping:
                return
            delay = RESTART_FIRST_DELAY_S if time.monotonic() - started > 60 else delay
            log.warning(
                "node %s: driver %s exited with %s; restarting in %.0f s (log: %s)",
                self.node,
                self.spec.name,
                code,
                delay,
                self.log_path,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_DELAY_S)
            if self._stopping:
                return
            self.restarts += 1
            await self._spawn()
            self.restarted.set()
            self.restarted = asyncio.Event()

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self) -> int | None:
        """SIGTERM, and SIGKILL after STOP_GRACE_S; the exit code (None if not running)."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        process, self.process = self.process, None
        self.records.unlink(missing_ok=True)
        if process is None or process.returncode is not None:
            return None if process is None else process.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            return await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            return await process.wait()

    def _remember(self) -> None:
        assert self.process is not None
        pid = self.process.pid
        record = processes.ProcessRecord(
            self.spec.name, pid, processes.process_start_ticks(pid) or 0, str(self.log_path), list(self.spec.command)
        )
        # In one step: a reader (a NodeHost taking over, a sanity sweep) that met the file
        # half-written would not know which process to stop, and two would serve the node.
        write_atomically(self.records, json.dumps(record.to_json()).encode(), durable=False)

    def _reap_leftover(self) -> None:
        """A NodeHost that was killed leaves its drivers running: two instances of one
        driver must never serve one node, so the old one goes first."""
        try:
            record = processes.ProcessRecord.from_json(json.loads(self.records.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return
        if processes.stop([record]):
            log.warning(
                "node %s: stopped driver %s (pid %d), left by an earlier host", self.node, record.name, record.pid
            )
        self.records.unlink(missing_ok=True)
