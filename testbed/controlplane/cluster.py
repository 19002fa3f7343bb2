"""Bring a local control plane up, report on it, and take it down, leaving nothing behind.

A cluster is a directory (``<state>/clusters/<name>``) holding its PKI, kubeconfigs,
etcd data, component logs and ``state.json``, the record of the processes it started.
``state.json`` is written after every process start, so even a `testbed up` killed
half-way leaves enough for `testbed down` (or the next `testbed up`) to clean up.
"""

from __future__ import annotations

import json
import logging
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from testbed import files
from testbed.config import ControlPlaneConfig
from testbed.controlplane import components, pki, processes, supervisor
from testbed.controlplane.binaries import Binaries, ensure_binaries
from testbed.controlplane.components import Layout, Ports
from testbed.controlplane.processes import ProcessRecord
from testbed.errors import TestbedError
from testbed.files import write_secret
from testbed.progress import Progress, SilentProgress

log = logging.getLogger(__name__)

STOP_STAGES = (("kube-scheduler", "kube-controller-manager"), ("kube-apiserver",), ("etcd",))
"""Clients first, etcd last: an apiserver whose etcd is gone takes seconds to give up."""
STOP_ORDER = tuple(name for stage in STOP_STAGES for name in stage)
SUPERVISOR = "supervisor"
"""Restarts dead components (see supervisor.py); stopped first, so it restarts nothing during a stop."""
OWNERSHIP_MARKER = ".dra-testbed-cluster"
"""Written first into every cluster directory the testbed uses. Only a directory holding
it is ever cleared or deleted: a user's own directory that happens to contain ``logs/``
or ``state.json`` is never touched."""
POLL_INTERVAL_S = 0.1
OWN_PORTS = {
    "etcd": ("etcd_client", "etcd_peer", "etcd_metrics"),
    "kube-apiserver": ("apiserver",),
    "kube-controller-manager": ("controller_manager",),
    "kube-scheduler": ("scheduler",),
}
"""The ports each component listens on: what changes when one lost a port race."""
PORT_RACE_RETRIES = 3
"""Fresh ports a component gets when another process took its port between choosing and binding."""


@dataclass
class FleetRecord:
    """Where a cluster's fleet runs, for the commands that come later (status, scale,
    run, down); filled in as `testbed up` gets that far."""

    spec: dict[str, Any]
    """The fleet file, as JSON (its current pool sizes after a scale)."""
    ray_address: str = ""
    nodes_dir: str = ""
    fleet_id: str = ""

    @property
    def joined_ray(self) -> str:
        """The address of a Ray cluster the user runs ("" for a head of the testbed's own)."""
        return str((self.spec.get("ray") or {}).get("address") or "")


@dataclass
class ClusterState:
    name: str
    root: Path
    ports: Ports
    binaries: str
    processes: list[ProcessRecord] = field(default_factory=list)
    ready: bool = False
    started_at: float = field(default_factory=time.time)
    timings: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    """The tunables it was started with, for reports."""
    fleet: FleetRecord | None = None
    attached_to: str = ""
    """The kubeconfig of a cluster the testbed attached to rather than started."""
    advertise_address: str = "127.0.0.1"
    """Where the API server listens (and what its kubeconfigs name)."""
    owner: ProcessRecord | None = None
    """The process the cluster lives for (a pytest session), if any: once it is gone
    without taking the cluster down (killed outright), the supervisor does."""
    starter: ProcessRecord | None = None
    """The `testbed up` starting it, until the control plane is ready, and again while
    that `up` starts the fleet."""

    @property
    def fleet_id(self) -> str:
        """The running fleet's ("" until one started)."""
        return self.fleet.fleet_id if self.fleet is not None else ""

    @property
    def layout(self) -> Layout:
        return Layout(self.root)

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    @property
    def apiserver_url(self) -> str:
        host = f"[{self.advertise_address}]" if ":" in self.advertise_address else self.advertise_address
        return f"https://{host}:{self.ports.apiserver}"

    def save(self) -> None:
        document = {
            "name": self.name,
            "root": str(self.root),
            "ports": self.ports.as_dict(),
            "binaries": self.binaries,
            "processes": [p.to_json() for p in self.processes],
            "ready": self.ready,
            "started_at": self.started_at,
            "timings": self.timings,
            "settings": self.settings,
            "fleet": asdict(self.fleet) if self.fleet is not None else None,
            "attached_to": self.attached_to,
            "advertise_address": self.advertise_address,
            "starter": self.starter.to_json() if self.starter is not None else None,
            "owner": self.owner.to_json() if self.owner is not None else None,
        }
        temporary = self.layout.state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(document, indent=2))
        temporary.replace(self.layout.state_file)

    @classmethod
    def load(cls, root: Path) -> ClusterState | None:
        path = Layout(root).state_file
        if not path.exists() or not owned(root):
            return None
        try:
            data = json.loads(path.read_text())
            return cls(
                name=data["name"],
                root=Path(data["root"]),
                ports=Ports(**data["ports"]),
                binaries=data["binaries"],
                processes=_current(root, [ProcessRecord.from_json(p) for p in data["processes"]]),
                ready=bool(data["ready"]),
                started_at=float(data["started_at"]),
                timings=dict(data.get("timings", {})),
                settings=dict(data.get("settings", {})),
                fleet=FleetRecord(**data["fleet"]) if data.get("fleet") else None,
                attached_to=str(data.get("attached_to", "")),
                advertise_address=str(data.get("advertise_address", "127.0.0.1")),
                starter=ProcessRecord.from_json(data["starter"]) if data.get("starter") else None,
                owner=ProcessRecord.from_json(data["owner"]) if data.get("owner") else None,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TestbedError(
                f"cannot read {path}: {exc}",
                hint=f"`testbed down --state-dir {root}` removes it once no process uses it (it names any that do)",
            ) from exc

    @property
    def supervised(self) -> bool:
        """Whether a supervisor runs to restart this cluster's components."""
        keeper = next((p for p in self.processes if p.name == SUPERVISOR), None)
        return keeper is not None and keeper.alive()

    @property
    def supervision(self) -> dict[str, supervisor.Component]:
        """What the supervisor knows: restarts and last exit of each component."""
        return supervisor.read(self.root)

    def live_processes(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.alive()]

    def cut_short(self) -> str:
        """What a `testbed up` killed before it finished (its terminal closed, say) left
        unfinished: "control plane" or "fleet"; "" if none was."""
        if self.starter is None or self.starter.alive():
            return ""
        return "fleet" if self.ready else "control plane"

    def stop_processes(self) -> list[str]:
        """Stop stage by stage; anything not in a stage (a future component) goes first."""
        known = set(STOP_ORDER)
        # Ray drains for up to 30 s on SIGTERM; a throw-away cluster need not wait.
        stopped = processes.stop([p for p in self.processes if p.name not in known], timeout_s=2.0)
        for stage in STOP_STAGES:
            stopped += processes.stop([p for p in self.processes if p.name in stage])
        return stopped


def _current(root: Path, records: list[ProcessRecord]) -> list[ProcessRecord]:
    """The processes that run now: the supervisor's record for a component it restarted."""
    restarted = supervisor.read(root)
    return [restarted[r.name].process if r.name in restarted else r for r in records]


class ComponentFailed(TestbedError):
    pass


# --- health ------------------------------------------------------------------------


def admin_ssl_context(layout: Layout) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(layout.pki.ca_cert))
    context.load_cert_chain(str(layout.pki.client_cert(pki.ADMIN)), str(layout.pki.client_key(pki.ADMIN)))
    return context


def etcd_ssl_context(layout: Layout) -> ssl.SSLContext:
    """As kube-apiserver talks to etcd: its own client certificate, etcd's CA."""
    context = ssl.create_default_context(cafile=str(layout.pki.etcd_ca_cert))
    context.load_cert_chain(str(layout.pki.etcd_client_cert), str(layout.pki.etcd_client_key))
    return context


def _self_signed_context() -> ssl.SSLContext:
    """KCM and scheduler serve with certs they sign themselves; we only ask their health."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def http_status(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


@dataclass(frozen=True)
class HealthCheck:
    name: str
    url: str
    context: ssl.SSLContext | None


def health_checks(state: ClusterState) -> dict[str, HealthCheck]:
    admin = admin_ssl_context(state.layout)
    insecure = _self_signed_context()
    ports = state.ports
    return {
        "etcd": HealthCheck("etcd", f"https://127.0.0.1:{ports.etcd_client}/health", etcd_ssl_context(state.layout)),
        "kube-apiserver": HealthCheck("kube-apiserver", f"{state.apiserver_url}/readyz", admin),
        "kube-controller-manager": HealthCheck(
            "kube-controller-manager",
            f"https://127.0.0.1:{ports.controller_manager}/healthz",
            insecure,
        ),
        "kube-scheduler": HealthCheck("kube-scheduler", f"https://127.0.0.1:{ports.scheduler}/readyz", insecure),
    }


# --- up ------------------------------------------------------------------------------


def owned(root: Path) -> bool:
    return (root / OWNERSHIP_MARKER).is_file()


def _refuse_foreign(root: Path) -> None:
    if root.exists() and not owned(root) and (not root.is_dir() or any(root.iterdir())):
        raise TestbedError(
            f"{root} is not a testbed cluster directory (it has no {OWNERSHIP_MARKER} marker); "
            "nothing there was stopped or deleted",
            hint="give --state-dir a new or empty directory, or the one `testbed up` used",
        )


def refuse_while_in_use(unreadable: TestbedError, paths: list[Path]) -> None:
    """A cluster whose state cannot be read cannot say which processes are its own: its
    directory (``paths[0]``, and the others: its files elsewhere) goes only once no
    process uses it."""
    root, users = paths[0], processes.using(paths)
    if users:
        listed = "; ".join(f"{pid} {command[:120]}" for pid, command in users)
        raise TestbedError(
            f"{unreadable.message}, and {_processes(len(users))} {root}: {listed}. Nothing was stopped or deleted",
            hint=f"stop them (`kill {' '.join(str(pid) for pid, _ in users)}`) and run `testbed down` again",
        )


def _processes(count: int) -> str:
    return "1 process still uses" if count == 1 else f"{count} processes still use"


def _created_by_testbed(root: Path) -> bool:
    """False when the user handed us an empty directory of theirs: it stays on `down`."""
    try:
        return bool(json.loads((root / OWNERSHIP_MARKER).read_text()).get("created_dir", True))
    except (OSError, ValueError, AttributeError):
        return True


def _clear(root: Path) -> None:
    """Delete a cluster directory, or only its contents if the user made it (empty)."""
    if _created_by_testbed(root):
        shutil.rmtree(root)
        return
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _prepare_directory(config: ControlPlaneConfig, progress: Progress) -> Path:
    """Refuse a running cluster; clear what a killed run left; never delete foreign files."""
    root = config.cluster_dir
    _refuse_foreign(root)
    state = ClusterState.load(root) if root.exists() else None
    if state is not None:
        live = state.live_processes()
        if live:
            if state.starter is not None and state.starter.alive():
                by = f"another `testbed up` (pid {state.starter.pid})"
                where = "; its control plane is up, its nodes are still starting" if state.ready else ""
                raise TestbedError(
                    f"cluster {config.name!r} is being started by {by}{where}",
                    hint=f"wait for it, then use the cluster; or `testbed down --name {config.name}` to stop it",
                )
            if state.ready:
                message = f"cluster {config.name!r} is already running (kubeconfig {state.kubeconfig})"
            else:
                running = ", ".join(f"{p.name} (pid {p.pid})" for p in live)
                message = f"cluster {config.name!r} is partly running: {running}"
            raise TestbedError(
                message,
                hint=f"use it as it is, or run `testbed down --name {config.name}` first",
            )
        progress.step(f"clearing stale state of an earlier run that was killed: {root}")
    created_dir = _created_by_testbed(root) if owned(root) else not root.exists()
    if owned(root):
        _clear(root)
    if config.state_dir is not None:
        files.check_can_make(root, "--state-dir", "give a directory you can write in (made if missing)")
    else:
        files.check_can_make(root, "cluster directory", "set TESTBED_STATE_DIR to a directory you can write in")
    root.mkdir(parents=True, exist_ok=True)
    marker = {"cluster": config.name, "created_dir": created_dir}
    (root / OWNERSHIP_MARKER).write_text(json.dumps(marker) + "\n")
    return root


def _choose_ports(config: ControlPlaneConfig) -> Ports:
    if config.apiserver_port is not None and processes.port_in_use(config.apiserver_port, config.advertise_address):
        raise TestbedError(
            f"port {config.apiserver_port} on {config.advertise_address} is already in use",
            hint="pick another with --port, or leave --port out to get a free one",
        )
    etcd_client, etcd_peer, apiserver, controller_manager, scheduler, etcd_metrics = processes.free_ports(6)
    return Ports(
        etcd_client=etcd_client,
        etcd_peer=etcd_peer,
        apiserver=config.apiserver_port or apiserver,
        controller_manager=controller_manager,
        scheduler=scheduler,
        etcd_metrics=etcd_metrics,
    )


def _wait_healthy(
    state: ClusterState,
    running: dict[str, tuple[object, ProcessRecord]],
    names: list[str],
    deadline: float,
    progress: Progress,
    on_new_ports: Callable[[str], bool] = lambda name: False,
) -> None:
    """``on_new_ports(name)``: starts ``name`` again on fresh ports when it exited
    because another process took its port; False when it may not (or tried enough)."""
    pending = list(names)
    checks = health_checks(state)  # SSL contexts: built once, not each round
    while pending:
        dead = next(((n, r) for n, (_, r) in running.items() if not r.alive()), None)
        if dead is not None:
            name, record = dead
            if lost_port_race(record) and on_new_ports(name):
                checks = health_checks(state)  # at its new port
                continue
            state.stop_processes()
            raise ComponentFailed(
                f"{name} exited during start-up",
                detail=f"last lines of {record.log}:\n{processes.log_tail(record.log)}",
                hint="the log names the cause; a port race or a bad flag are the usual ones",
            )
        pending = [n for n in pending if http_status(checks[n].url, checks[n].context) != 200]
        if not pending:
            return
        if time.monotonic() > deadline:
            name = pending[0]
            record = running[name][1]
            raise ComponentFailed(
                f"{', '.join(pending)} not healthy within the start-up timeout",
                detail=f"last lines of {record.log}:\n{processes.log_tail(record.log)}",
                hint="a slow machine may need a longer --timeout",
            )
        progress.update(f"waiting for {', '.join(pending)}")
        time.sleep(POLL_INTERVAL_S)


def lost_port_race(record: ProcessRecord) -> bool:
    """Whether the process ended because its listening port was taken (all four
    components say so in Go's words as their last line)."""
    return "address already in use" in processes.log_tail(record.log, lines=3)


def _wait_for(
    description: str,
    ready: Callable[[], bool],
    state: ClusterState,
    deadline: float,
    progress: Progress,
) -> None:
    while not ready():
        dead = [p for p in state.processes if not p.alive()]
        if dead:
            raise ComponentFailed(
                f"{dead[0].name} exited while waiting for {description}",
                detail=f"last lines of {dead[0].log}:\n{processes.log_tail(dead[0].log)}",
            )
        if time.monotonic() > deadline:
            raise ComponentFailed(f"timed out waiting for {description}")
        progress.update(f"waiting for {description}")
        time.sleep(POLL_INTERVAL_S)


def attach(config: ControlPlaneConfig, kubeconfig: Path, progress: Progress | None = None) -> ClusterState:
    """Use a cluster someone else runs (kind, or any other): no control-plane processes,
    only a record of the cluster, its kubeconfig, and what the layers above start."""
    progress = progress or SilentProgress()
    if not kubeconfig.is_file():
        raise TestbedError(f"kubeconfig {kubeconfig} does not exist", hint="e.g. `kind get kubeconfig > FILE`")
    root = _prepare_directory(config, progress)
    layout = Layout(root)
    write_secret(layout.admin_kubeconfig, kubeconfig.read_bytes())
    state = ClusterState(
        name=config.name,
        root=root,
        ports=Ports(0, 0, 0, 0, 0),
        binaries=f"none: an existing cluster ({kubeconfig})",
        ready=True,
        attached_to=str(kubeconfig),
    )
    state.save()
    return state


def up(
    config: ControlPlaneConfig,
    progress: Progress | None = None,
    binaries: Binaries | None = None,
    alongside: Callable[[ClusterState], None] | None = None,
    owner: ProcessRecord | None = None,
) -> ClusterState:
    """Start etcd, kube-apiserver, kube-controller-manager and kube-scheduler; wait for
    all four to be healthy and the default service account to exist. ``alongside``:
    launches more while etcd and the API server start (the fleet's Ray head); what it
    adds to ``state.processes`` is stopped if the start fails. ``owner``: the process
    whose end, however it ends, ends the cluster too (ClusterState.owner)."""
    progress = progress or SilentProgress()
    t0 = time.monotonic()
    root = _prepare_directory(config, progress)
    binaries = binaries or ensure_binaries(progress)
    t_binaries = time.monotonic()
    progress.step(f"binaries: {binaries.source}")

    layout = Layout(root)
    ports = _choose_ports(config)
    state = ClusterState(
        name=config.name,
        root=root,
        ports=ports,
        binaries=binaries.source,
        advertise_address=config.advertise_address,
        starter=processes.this_process("testbed up"),
        owner=owner,
    )
    running: dict[str, tuple[object, ProcessRecord]] = {}

    port_races = dict.fromkeys(OWN_PORTS, 0)

    def launch(name: str, command: list[str]) -> None:
        proc, record = processes.start(name, command, layout.log(name), cwd=root)
        running[name] = (proc, record)
        state.processes.append(record)
        state.save()

    def command_of(name: str) -> list[str]:
        return {
            "etcd": components.etcd_command,
            "kube-apiserver": components.apiserver_command,
            "kube-controller-manager": components.controller_manager_command,
            "kube-scheduler": components.scheduler_command,
        }[name](binaries, layout, state.ports, config)

    def on_new_ports(name: str) -> bool:
        """Ports are chosen free but bound only when a component starts; another process
        on the machine may take one in between. Such a component starts again elsewhere."""
        if port_races[name] >= PORT_RACE_RETRIES or (name == "kube-apiserver" and config.apiserver_port):
            return False
        port_races[name] += 1
        fields = OWN_PORTS[name]
        state.ports = replace(state.ports, **dict(zip(fields, processes.free_ports(len(fields)), strict=True)))
        if name == "kube-apiserver":
            for who in pki.CLIENTS:
                components.write_kubeconfig(layout, who, state.apiserver_url, config.name)
        # The API server reaches etcd by its client port: it follows etcd to the new one.
        again = [name, "kube-apiserver"] if name == "etcd" and "kube-apiserver" in running else [name]
        processes.stop([running[n][1] for n in again])
        state.processes = [p for p in state.processes if p.name not in again]
        progress.step(f"{name}: another process took its port; starting it again on a new one")
        for restarted in again:
            launch(restarted, command_of(restarted))
        return True

    try:
        pki.generate(layout.root / "pki", config.advertise_address)
        for who in pki.CLIENTS:
            components.write_kubeconfig(layout, who, state.apiserver_url, config.name)
        state.save()
        deadline = time.monotonic() + config.startup_timeout_s

        launch("etcd", command_of("etcd"))
        launch("kube-apiserver", command_of("kube-apiserver"))
        if alongside is not None:
            alongside(state)
            state.save()
        with progress.task("starting etcd and kube-apiserver"):
            _wait_healthy(state, running, ["etcd", "kube-apiserver"], deadline, progress, on_new_ports)
        t_apiserver = time.monotonic()

        launch("kube-controller-manager", command_of("kube-controller-manager"))
        launch("kube-scheduler", command_of("kube-scheduler"))
        with progress.task("starting kube-controller-manager and kube-scheduler"):
            _wait_healthy(
                state, running, ["kube-controller-manager", "kube-scheduler"], deadline, progress, on_new_ports
            )
            # Pods cannot be created before the service-account controller made `default`.
            context = admin_ssl_context(layout)
            sa_url = f"{state.apiserver_url}/api/v1/namespaces/default/serviceaccounts/default"
            _wait_for(
                "the default service account",
                lambda: http_status(sa_url, context) == 200,
                state,
                deadline,
                progress,
            )
        t_ready = time.monotonic()
        launch(SUPERVISOR, [sys.executable, "-m", "testbed.controlplane.supervisor", str(root)])
        state.ready = True
        state.starter = None
        state.timings = {
            "binaries_s": round(t_binaries - t0, 3),
            "apiserver_ready_s": round(t_apiserver - t_binaries, 3),
            "all_ready_s": round(t_ready - t_binaries, 3),
        }
        state.save()
        progress.step(
            f"control plane {config.name!r} ready in {t_ready - t_binaries:.1f}s "
            f"(apiserver {state.apiserver_url}, logs in {layout.logs})"
        )
        return state
    except BaseException:
        # Ctrl-C, a failed component, anything: leave no process behind.
        state.stop_processes()
        layout.state_file.unlink(missing_ok=True)
        raise


# --- down and status ------------------------------------------------------------------


def record_process(root: Path, record: ProcessRecord) -> None:
    """One more process of the cluster (a test fleet's Ray head), stopped with it: by
    `down`, and by its supervisor should the cluster's owner be killed."""
    state = ClusterState.load(root)
    if state is not None:
        state.processes.insert(0, record)
        state.save()


def down(config: ControlPlaneConfig, keep_state: bool = False) -> list[str]:
    """Stop every process the cluster started; remove its directory unless asked not to."""
    root = config.cluster_dir
    _refuse_foreign(root)
    if not owned(root):
        return []
    unreadable = False
    try:
        state = ClusterState.load(root)
    except TestbedError as error:
        refuse_while_in_use(error, [root])
        state, unreadable = None, True
    stopped = state.stop_processes() if state is not None else []
    if keep_state:
        Layout(root).state_file.unlink(missing_ok=True)
    else:
        _clear(root)
        if unreadable:
            log.warning("removed %s: its state could not be read, and no process used it", root)
    return stopped


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    healthy: bool
    log: str
    restarts: int = 0
    last_exit: str = ""


def status(config: ControlPlaneConfig) -> tuple[ClusterState | None, list[ComponentStatus]]:
    state = ClusterState.load(config.cluster_dir) if config.cluster_dir.exists() else None
    if state is None:
        return None, []
    checks: dict[str, HealthCheck | None] = {}
    if not state.attached_to:  # an attached cluster is not ours to check
        try:
            checks = dict(health_checks(state))
        except OSError:  # its start was cut short before its certificates were written
            checks = dict.fromkeys(("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"))
    report = []
    supervised = state.supervision
    for record in state.processes:
        alive = record.alive()
        check = checks.get(record.name)
        # Components without an HTTP health endpoint (Ray) count as healthy while alive.
        if record.name not in checks:
            healthy = alive
        else:
            healthy = alive and check is not None and http_status(check.url, check.context) == 200
        seen = supervised.get(record.name)
        restarts, last_exit = (seen.restarts, seen.last_exit) if seen else (0, "")
        report.append(ComponentStatus(record.name, record.pid, alive, healthy, record.log, restarts, last_exit))
    return state, report
