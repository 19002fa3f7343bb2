"""A driver the testbed did not write, run on a synthetic node as its DaemonSet would run it.

One process per node: the environment a driver pod gets (its node, pod UID, the
kubelet's plugin directories, CDI directory, credentials bound to that node), its
output in the node's ``logs/<driver>.log`` (``<driver>_<generation>.log`` once rolled
out), restarted with back-off when it dies (and at once when it fails its liveness
probe, liveness.py), and stopped with SIGTERM (SIGKILL after a grace period) when the
node is drained. The fake kubelet reaches it only through the sockets it registers, as
a kubelet would.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from testbed.config import MAX_SOCKET_PATH, POD_GRACE_S, runtime_root
from testbed.controlplane import processes
from testbed.errors import TestbedError
from testbed.files import private_dir, write_atomically
from testbed.fleet.liveness import LivenessSettings, Tell, grpc_probe, until_unhealthy
from testbed.fleet.processcpu import PROCESS_CPU
from testbed.kubeletplugin.prepare import DriverPaths
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

LIVENESS_PORT = "LIVENESS_PORT"
"""The variable that holds the port a driver's liveness endpoint is probed on: one per node,
as every node's driver pod has the DaemonSet's port on an address of its own."""


def check_runs_here(driver: str, command: list[str], where: str) -> None:
    """A driver command that cannot run on this machine, refused before anything starts
    (`up`, `rollout`) where every NodeHost runs here, instead of failing its first node
    once the control plane and Ray are up. The driver's PATH is this process's."""
    executable = command[0]
    if shutil.which(executable) is None:
        found = "not on PATH" if "/" not in executable else "not an executable file"
        raise TestbedError(
            f"{where}: driver {driver}'s command {executable!r} is {found} here",
            hint="give the path of an executable (a relative one is taken from the fleet file's directory, "
            "or the current one on the command line)",
        )


@dataclass(frozen=True)
class ExternalDriverSpec:
    name: str
    """The DRA driver name it registers (e.g. fpga.example.com): the kubelet looks it up by it."""
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    liveness: LivenessSettings | None = None
    generation: int = 0
    """How often it was rolled out on its node: which driver pod its instance stands for."""
    grace_s: float = float(POD_GRACE_S)
    """SIGTERM, then SIGKILL this long after (its pod's terminationGracePeriodSeconds)."""

    @classmethod
    def from_json(cls, entry: Mapping[str, object]) -> ExternalDriverSpec:
        liveness = entry.get("liveness")
        return cls(
            str(entry["name"]),
            tuple(entry["command"]),  # type: ignore[arg-type]
            dict(entry["env"]),  # type: ignore[call-overload]
            LivenessSettings(**liveness) if isinstance(liveness, dict) else None,
            int(entry.get("generation", 0)),  # type: ignore[call-overload]
            float(entry.get("grace_s", POD_GRACE_S)),  # type: ignore[arg-type]
        )

    def refers_to(self, variable: str) -> bool:
        """Whether its command or environment names ``$(variable)``."""
        return any(f"$({variable})" in text for text in (*self.command, *self.env.values()))


def next_generation(
    spec: ExternalDriverSpec, command: tuple[str, ...] | None, generation: int | None = None
) -> ExternalDriverSpec:
    """What a rollout starts: ``generation`` (the pool's new one; never one this node ran
    already, so never a driver pod's name again), of ``command`` or the same one."""
    return replace(spec, command=command or spec.command, generation=max(generation or 0, spec.generation + 1))


def expand(text: str, variables: Mapping[str, str]) -> str:
    """``$(NAME)`` replaced by the variable's value, as Kubernetes expands a container's
    command, args and env values: ``$$`` is a literal ``$``; a reference to an unknown
    variable, and a ``$`` that opens none, stay as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(" and (close := text.find(")", i + 2)) != -1:
            name = text[i + 2 : close]
            out.append(variables.get(name, f"$({name})"))
            i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


def container_environment(given: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """``given`` (what the testbed hands every driver) and the driver's ``own`` variables,
    each of which may refer to those before it, as a pod's env entries may."""
    environment = dict(given)
    for name, value in own.items():
        environment[name] = expand(value, environment)
    return environment


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


def stop_recorded_drivers(nodes_dir: Path) -> list[str]:
    """Stop the external driver processes under a fleet's nodes dir, which outlive their
    NodeHosts (SIGTERM, then SIGKILL once each one's grace period is over); says which
    it stopped."""
    drivers = [r for records in recorded_drivers(nodes_dir).values() for r in records]
    return [f"driver {name}" for name in processes.stop(drivers)]


@dataclass(frozen=True)
class Restarts:
    """How often a driver was started again on a fleet's nodes (a NodeHost taking a node
    over starts it again too), and how many of those its liveness probe asked for."""

    restarts: int = 0
    liveness_kills: int = 0


def recorded_restarts(nodes_dir: Path) -> dict[str, Restarts]:
    """By driver, summed over the nodes under ``nodes_dir``."""
    found: dict[str, Restarts] = {}
    for path in nodes_dir.glob("*/driver-*.process.json"):
        try:
            data = json.loads(path.read_text())
            name, restarts, kills = str(data["name"]), int(data.get("restarts", 0)), int(data.get("livenessKills", 0))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        before = found.get(name, Restarts())
        found[name] = Restarts(before.restarts + restarts, before.liveness_kills + kills)
    return found


def recorded_generations(nodes_dir: Path) -> dict[str, Counter[int]]:
    """By driver, how many nodes run each generation of it: after a rollout that stopped
    half-way, the nodes still on the old one."""
    found: dict[str, Counter[int]] = {}
    for path in nodes_dir.glob("*/driver-*.process.json"):
        if instance := _instance_of(path):
            found.setdefault(instance[0], Counter())[instance[1]] += 1
    return found


def _instance_of(record: Path) -> tuple[str, int] | None:
    """(driver, generation) of a process record's file (``_record_name``)."""
    match = re.fullmatch(r"driver-(.+?)(?:_([0-9]+))?\.process\.json", record.name)
    return (match.group(1), int(match.group(2) or 0)) if match else None


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
    synthetic node's directory, whose name holds the node's, that overflows, where a real
    node's /var/lib/kubelet does not. So the kubelet and the drivers use these: always
    with command-line drivers; for the built-in ones, whose sockets carry no UID, only
    where a long node name would overflow theirs (``needed_by``: two symlinks cost a
    node's start as much as two files do)."""

    registry: Path
    plugins: Path

    @classmethod
    def for_node(cls, root: Path) -> ShortPaths:
        return cls.named(root, private_dir(runtime_root() / "a"))

    @classmethod
    def named(cls, root: Path, base: Path) -> ShortPaths:
        """The short names of node directory ``root`` under ``base``, made nowhere."""
        digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
        return cls(base / f"{digest}r", base / f"{digest}p")

    @staticmethod
    def needed_by(kubelet_dir: Path, drivers: Iterable[str]) -> bool:
        """Whether built-in drivers' sockets (their registration sockets are the longer)
        would overflow under the node's own kubelet directory, a long node name's."""
        return any(
            len(str(DriverPaths.for_node(kubelet_dir, driver, Path()).registration_socket).encode()) > MAX_SOCKET_PATH
            for driver in drivers
        )

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


def driver_environment(
    node: str, root: Path, pod: tuple[str, str], kubeconfig: Path, short: ShortPaths
) -> dict[str, str]:
    """What a DaemonSet's pod spec would hand a driver on ``node`` (downward API, hostPath
    mounts), under the names the common DRA drivers read; ``pod``: its name and UID."""
    kubelet = root / "kubelet"
    return {
        "NODE_NAME": node,
        "POD_NAME": pod[0],
        "POD_UID": pod[1],
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
        tell: Tell | None = None,
        on_process: Callable[[int | None], Awaitable[None]] | None = None,
        restart_when: Callable[[], Awaitable[None]] | None = None,
    ):
        """``tell``: records an Event on the node's driver pod (the probe's, the kills');
        ``on_process``: told each exit (its code, as a container runtime gives it) and
        each start after the first (None), for the driver pod's status; ``restart_when``:
        returns when it is to be started again after an exit (a real kubelet starting its
        container again), instead of this class's own back-off."""
        self.spec = spec
        self.node = node
        self.root = root
        self.tell: Tell = tell or (lambda kind, reason, message: None)
        self.on_process = on_process
        self.restart_when = restart_when
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.ended = 0
        """How often its process ended: exited, or killed for failing its liveness probe."""
        self.liveness_kills = 0
        self.liveness_port: int | None = None
        """$LIVENESS_PORT, where its liveness endpoint is (to be) probed: given when it has a
        probe or names the variable, and kept across its restarts (but when another
        process took it meanwhile)."""
        self._given: dict[str, str] = {}
        """The environment its pod gives it, before its own ``env`` and $(VAR)s."""
        self._environment: dict[str, str] = {}
        self._command: list[str] = []
        self.changed = asyncio.Event()
        """Set (and replaced) at each end of its process and each restart: what a wait for
        this driver wakes on."""
        PROCESS_CPU.watch(self)
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def log_path(self) -> Path:
        """One file per generation, as a kubelet keeps one per pod: two generations run
        side by side in a surge rollout, and their lines must not interleave."""
        return self.root / "logs" / f"{instance_name(self.spec.name, self.spec.generation)}.log"

    @property
    def records(self) -> Path:
        """Which process serves this driver on this node, for a NodeHost that takes over
        (one file per generation: a rollout runs two side by side)."""
        return self.root / _record_name(self.spec.name, self.spec.generation)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_processes(self) -> list[tuple[str, int]]:
        process = self.process
        return [(f"driver {self.spec.name}", process.pid)] if process and process.returncode is None else []

    async def start(self, environment: Mapping[str, str], beside: ExternalDriver | None = None) -> None:
        """Start it, after stopping what an earlier NodeHost of this node left running of
        this driver, but for the instance ``beside`` it (a rollout's old one)."""
        taken_over = self._reap_leftovers(keep=None if beside is None else beside.records)
        self._stopping = False
        # As a DaemonSet's hostPath mounts (type DirectoryOrCreate) give them, the
        # driver's own plugin directory included: some drivers make only its parent.
        for sub in ("logs", "work", "cdi", "kubelet/plugins_registry", f"kubelet/plugins/{self.spec.name}"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._given = dict(environment)
        self.reserve_liveness_port()
        self._expand_environment()
        await self._spawn()
        if taken_over is not None:  # its pod shows the restart, as for any other
            await self._told_of(taken_over)
            await self._told_of(None)
        self._supervisor = asyncio.create_task(self._supervise(), name=f"driver-{self.spec.name}-{self.node}")

    @property
    def pod_uid(self) -> str:
        """Its driver pod's UID, as it was given it ("" before it started)."""
        return self._given.get("POD_UID", "")

    def reserve_liveness_port(self) -> int | None:
        """$LIVENESS_PORT, chosen once it has a probe or names the variable (before its pod
        is made: the pod's livenessProbe names the port)."""
        wants_port = self.spec.liveness is not None or self.spec.refers_to(LIVENESS_PORT)
        if wants_port and self.liveness_port is None:
            self.liveness_port = processes.free_port()
        return self.liveness_port

    def _expand_environment(self) -> None:
        given = dict(self._given)
        if self.liveness_port is not None:
            given[LIVENESS_PORT] = str(self.liveness_port)
        self._environment = container_environment(given, self.spec.env)
        self._command = [expand(arg, self._environment) for arg in self.spec.command]

    def _move_off_a_taken_liveness_port(self) -> None:
        """The port was free when chosen, not reserved: when another process listens on it
        once this driver is gone, the next instance gets a new one (a pod's port is its
        own network namespace's; here every node shares the machine's)."""
        if self.liveness_port is None or not processes.accepting_connections(self.liveness_port):
            return
        taken, self.liveness_port = self.liveness_port, processes.free_port()
        log.warning(
            "node %s: driver %s's liveness port %d is taken by another process; restarting it on %d",
            self.node,
            self.spec.name,
            taken,
            self.liveness_port,
        )
        self._expand_environment()

    async def _spawn(self) -> None:
        with open(self.log_path, "ab") as handle:
            handle.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(self._command)}\n".encode())
            handle.flush()
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self._command,
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
        """Restart it when it exits: once ``restart_when`` returns (its node's kubelet
        starting the pod's container again), or without one after processes.RestartBackoff's
        wait; kill it when it fails its liveness probe and start it again as soon as
        ``restart_when`` lets it (at once without one)."""
        backoff = processes.RestartBackoff()
        while True:
            assert self.process is not None
            started = time.monotonic()
            unhealthy = await self._until_exit_or_unhealthy(self.process)
            if self._stopping:
                return
            if unhealthy is not None:
                self.liveness_kills += 1
                log.warning(
                    "node %s: driver %s failed its liveness probe %d times in a row (%s); restarting it (log: %s)",
                    self.node,
                    self.spec.name,
                    self.spec.liveness.failure_threshold if self.spec.liveness else 0,
                    unhealthy,
                    self.log_path,
                )
                self.tell("Normal", "Killing", "Container driver failed liveness probe, will be restarted")
                grace = self.spec.liveness.grace_s if self.spec.liveness else None
                await self._told_of(await _terminate(self.process, self.spec.grace_s if grace is None else grace))
                self._changed(ended=True)
                if self.restart_when is not None:
                    await self.restart_when()
            else:
                await self._told_of(self.process.returncode)
                self._changed(ended=True)
                delay = backoff.after_exit(time.monotonic() - started)
                log.warning(
                    "node %s: driver %s exited with %s; restarting %s (log: %s)",
                    self.node,
                    self.spec.name,
                    self.process.returncode,
                    f"in {delay:.0f} s" if self.restart_when is None else "when the kubelet starts its container",
                    self.log_path,
                )
                await (asyncio.sleep(delay) if self.restart_when is None else self.restart_when())
            if self._stopping:
                return
            self.restarts += 1
            self._move_off_a_taken_liveness_port()
            await self._spawn()
            await self._told_of(None)
            self._changed()

    def _changed(self, ended: bool = False) -> None:
        self.ended += ended
        self.changed.set()
        self.changed = asyncio.Event()

    async def _told_of(self, exit_code: int | None) -> None:
        if self.on_process is None:
            return
        if exit_code is not None:
            exit_code = processes.exit_status(exit_code)
        try:
            await self.on_process(exit_code)
        except Exception:  # the driver pod's status is worth a log line, not the supervision
            log.exception("node %s: could not show driver %s's process in its pod", self.node, self.spec.name)

    async def _until_exit_or_unhealthy(self, process: asyncio.subprocess.Process) -> str | None:
        """None once ``process`` exits; what its liveness probe last saw if it failed first."""
        liveness = self.spec.liveness
        if liveness is None or self.liveness_port is None:
            await process.wait()
            return None
        exited = asyncio.ensure_future(process.wait())
        probing = asyncio.ensure_future(until_unhealthy(liveness, grpc_probe(liveness, self.liveness_port), self.tell))
        try:
            await asyncio.wait({exited, probing}, return_when=asyncio.FIRST_COMPLETED)
            return None if exited.done() else probing.result()
        finally:
            await cancel_and_wait(exited)
            await cancel_and_wait(probing)

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self) -> int | None:
        """SIGTERM, and SIGKILL after its grace period; the exit code (None if not running)."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        process, self.process = self.process, None
        self.records.unlink(missing_ok=True)
        if process is None or process.returncode is not None:
            return None if process is None else process.returncode
        return await _terminate(process, self.spec.grace_s)

    def _remember(self) -> None:
        assert self.process is not None
        pid = self.process.pid
        record = processes.ProcessRecord(
            self.spec.name,
            pid,
            processes.process_start_ticks(pid) or 0,
            str(self.log_path),
            list(self._command),
            self.spec.grace_s,
        )
        # In one step: a reader (a NodeHost taking over, a sanity sweep) that met the file
        # half-written would not know which process to stop, and two would serve the node.
        counts = {"restarts": self.restarts, "livenessKills": self.liveness_kills}
        write_atomically(self.records, json.dumps({**record.to_json(), **counts}).encode(), durable=False)

    def _reap_leftovers(self, keep: Path | None) -> int | None:
        """A NodeHost that was killed may leave its drivers running (of any generation, if
        it died in a rollout; Ray kills a dead worker's child processes, but not those of
        a host on a machine that went away): two instances of one driver must never serve
        one node but while rolling out, so the old ones go first. When this instance had
        a process before, the exit to show in its pod: 143 if it was stopped here
        (SIGTERM), 137 if it was gone already (killed with its host, as the kubelet shows
        a container it lost)."""
        taken_over = None
        for path in _records_of(self.root, self.spec.name):
            if path == keep:
                continue
            try:
                data = json.loads(path.read_text())
                record = processes.ProcessRecord.from_json(data)
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            stopped = processes.stop([record])
            if stopped:
                log.warning(
                    "node %s: stopped driver %s (pid %d), left by an earlier host", self.node, record.name, record.pid
                )
            if path == self.records:  # this instance again: its counts go on, as a pod's restartCount does
                self.restarts = int(data.get("restarts", 0)) + 1
                self.liveness_kills = int(data.get("livenessKills", 0))
                taken_over = 128 + (signal.SIGTERM if stopped else signal.SIGKILL)
            path.unlink(missing_ok=True)
        return taken_over


def _record_name(driver: str, generation: int) -> str:
    """``driver-<name>.process.json``, ``driver-<name>_<generation>.process.json`` after a rollout."""
    return f"driver-{instance_name(driver, generation)}.process.json"


def instance_name(driver: str, generation: int) -> str:
    """What a driver's instance's files are named after: ``<driver>``, and
    ``<driver>_<generation>`` after a rollout ('_' is in no driver name)."""
    return f"{driver}{f'_{generation}' if generation else ''}"


def log_of_running_instance(stems: Iterable[str], driver: str, running: Iterable[int] = ()) -> str | None:
    """Of a node's log names, the one of ``driver``'s instance running now: the newest of
    the ``running`` generations (a surge that failed left a newer log behind), else the
    newest there is a log of. None if the driver has none."""
    pattern = re.compile(re.escape(driver) + r"(?:_([0-9]+))?")
    generations = {int(m.group(1) or 0): stem for stem in stems if (m := pattern.fullmatch(stem))}
    serving = [g for g in running if g in generations]
    if serving:
        return generations[max(serving)]
    return generations[max(generations)] if generations else None


def running_generations(root: Path, driver: str) -> list[int]:
    """The generations of ``driver`` with a process recorded on the node at ``root``."""
    return [instance[1] for path in _records_of(root, driver) if (instance := _instance_of(path))]


def _records_of(root: Path, driver: str) -> list[Path]:
    """The records of every generation of ``driver`` on the node at ``root``."""
    first = _record_name(driver, 0)
    later = re.compile(re.escape(f"driver-{driver}_") + r"[0-9]+\.process\.json")
    return [p for p in root.glob(f"driver-{glob.escape(driver)}*") if p.name == first or later.fullmatch(p.name)]


async def _terminate(process: asyncio.subprocess.Process, grace_s: float) -> int:
    """SIGTERM to its process group, SIGKILL after ``grace_s``; its exit code."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return await process.wait()
