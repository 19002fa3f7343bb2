"""What `testbed status` reports: gathered once, then shown as tables or as JSON.

A status says what it can: a part that does not answer (the API server, Ray, the fabric
manager) is reported as not answering, and never fails the whole. Scripts read the JSON
(`testbed status --json`); its keys are this module's field names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from testbed import config as cfg
from testbed import environment
from testbed.controlplane import cluster, leftovers, processes
from testbed.errors import TestbedError
from testbed.fingerprint import code_version
from testbed.fleet import spec as fleet_spec
from testbed.fleet.external import Restarts, recorded_drivers, recorded_generations, recorded_restarts
from testbed.realnode.node import recorded_driver_restarts, recorded_processes

FAULTY_NODES_SHOWN = 20
LOG_LINES_SHOWN = 5


@dataclass
class Component:
    name: str
    pid: int
    alive: bool
    healthy: bool
    restarts: int
    last_exit: str
    log: str
    log_tail: str = ""
    """Its log's last lines, when it is unhealthy or was restarted."""


@dataclass
class Pool:
    name: str
    profile: str
    kubelet: str
    ready: int
    """Its nodes Ready, as the API server says."""
    asked: int


@dataclass
class NodeHost:
    name: str
    error: str = ""
    """Why it did not answer; the other fields are then empty."""
    nodes: int = 0
    ready: int = 0
    pid: int = 0
    ray_node: str = ""
    ray_node_address: str = ""
    restarted: bool = False
    kubelet_restarts: int = 0
    code: str = ""


@dataclass
class Fleet:
    pools: list[Pool] = field(default_factory=list)
    record_error: str = ""
    """The fleet `up` recorded could not be read back: its pools are unknown."""
    api_error: str = ""
    """The API server did not answer: the pools' Ready counts are unknown."""
    ray_address: str | None = None
    hosts: list[NodeHost] = field(default_factory=list)
    hosts_error: str = ""
    """The NodeHosts could not be reached at all (Ray gone, say)."""
    faults: dict[str, list[str]] = field(default_factory=dict)
    """By node: the faults in force on its hardware and on the fabric to it."""
    fabric: dict[str, Any] | None = None
    """The fabric manager's attach figures since it started; None without one."""
    fabric_error: str = ""
    identities: str = ""
    """What the fleet's nodes run as (per-node or shared), as `up` was told."""
    log_level: str = ""
    """What its NodeHosts log (`testbed logs NODE nodehost`)."""

    @property
    def complete(self) -> bool:
        """Whether every node asked for is Ready."""
        return not self.record_error and not self.api_error and all(p.ready >= p.asked for p in self.pools)


@dataclass
class ProcessNode:
    """A real-kubelet node: its processes on this machine."""

    node: str
    alive: dict[str, bool]
    """By process (kubelet, driver, cri): whether it runs. A node of command-line drivers
    only runs no built-in driver."""
    driver_restarts: int | None
    command_line_drivers: bool
    logs: str


@dataclass
class ExternalDriver:
    driver: str
    nodes: int
    running: int
    gone: int
    restarts: int
    liveness_kills: int
    generations: dict[int, int]
    """Generation -> nodes running it (two during a rollout)."""


@dataclass
class ClusterStatus:
    name: str
    root: str
    components: list[Component]
    attached_to: str
    apiserver: str
    kubeconfig: str
    logs: str
    binaries: str
    pending_leftovers: list[str]
    """Runs' namespaces left while the API server was gone, deleted once it answers."""
    fleet: Fleet | None
    process_nodes: list[ProcessNode]
    external_drivers: list[ExternalDriver]
    cut_short: str
    """What the `testbed up` that started it left unfinished ("control plane", "fleet"), or ""."""
    starter_pid: int | None
    code: str = field(default_factory=code_version)
    """This checkout's code, which the NodeHosts' is compared with."""

    @property
    def healthy(self) -> bool:
        return all(c.healthy for c in self.components) and not self.cut_short

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "healthy": self.healthy, "fleet_complete": self.fleet.complete if self.fleet else None}


def fleet_file(state: cluster.ClusterState) -> fleet_spec.FleetFile | None:
    """The fleet `testbed up` recorded for this cluster, if any."""
    return environment.recorded_fleet(state) if state.fleet else None


@dataclass(frozen=True)
class Listed:
    """One cluster of `testbed list`."""

    name: str
    state: str
    """running, stopped, starting, start cut short, running (up cut short), or its
    state unreadable."""
    synthetic_nodes: int
    kubeconfig: str


UP_CUT_SHORT = "running (up cut short)"
UNREADABLE = "state unreadable (see `testbed status`)"


def listed(root: Path) -> list[Listed]:
    """The clusters whose directories are under ``root``, by name."""
    found = []
    for directory in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            state = cluster.ClusterState.load(directory) if cluster.owned(directory) else None
        except TestbedError:  # one cluster's unreadable state must not hide the others
            found.append(Listed(directory.name, UNREADABLE, 0, str(directory / "kubeconfig")))
            continue
        if state is None:
            continue
        running = state.ready and any(p.alive() for p in state.processes)
        if state.attached_to:
            running = state.ready
        cut = state.cut_short()
        if cut == "control plane" and state.live_processes():
            said = "start cut short"
        elif cut == "fleet" and running:
            said = UP_CUT_SHORT
        elif state.starter is not None and state.starter.alive():
            said = "starting"
        else:
            said = "running" if running else "stopped"
        try:
            fleet = fleet_file(state)
        except TestbedError:  # one cluster's unreadable record must not hide the others
            fleet, said = None, f"{said}, its fleet record unreadable (see `testbed status`)"
        found.append(Listed(state.name, said, fleet.count if fleet else 0, str(state.kubeconfig)))
    return found


def listed_table(root: Path, clusters: list[Listed]) -> Table:
    table = Table(title=f"clusters in {root}")
    for column in ("name", "state", "synthetic nodes", "kubeconfig"):
        table.add_column(column)
    for each in clusters:
        if each.state == UP_CUT_SHORT:
            shown = "running ([red]its `up` was cut short[/]: see `testbed status`)"
        else:
            shown = each.state if each.state in ("running", "starting") else f"[red]{each.state}[/]"
        table.add_row(each.name, shown, str(each.synthetic_nodes), each.kubeconfig)
    return table


def gather(config: cfg.ControlPlaneConfig) -> ClusterStatus | None:
    """The cluster's status; None if it is not running (no state on disk)."""
    state, components = cluster.status(config)
    if state is None:
        return None
    shown = [
        Component(
            c.name,
            c.pid,
            c.alive,
            c.healthy,
            c.restarts,
            c.last_exit,
            c.log,
            processes.log_tail(c.log, LOG_LINES_SHOWN) if not c.healthy or c.restarts else "",
        )
        for c in components
    ]
    fleet = _fleet(state) if state.fleet and state.fleet.fleet_id else None
    nodes_dir = Path(state.fleet.nodes_dir) if state.fleet and state.fleet.nodes_dir else None
    cut = state.cut_short()
    if cut == "fleet" and fleet is not None and fleet.complete:
        cut = ""  # its NodeHosts finished what it asked of them
    return ClusterStatus(
        name=state.name,
        root=str(state.root),
        components=shown,
        attached_to=state.attached_to or "",
        apiserver=state.apiserver_url,
        kubeconfig=str(state.kubeconfig),
        logs=str(state.layout.logs),
        binaries=str(state.binaries),
        pending_leftovers=list(leftovers.pending(state.root)),
        fleet=fleet,
        process_nodes=_process_nodes(nodes_dir) if nodes_dir else [],
        external_drivers=_external_drivers(nodes_dir) if nodes_dir else [],
        cut_short=cut,
        starter_pid=state.starter.pid if state.starter is not None else None,
    )


def _fleet(state: cluster.ClusterState) -> Fleet | None:
    """Pools (nodes Ready of those asked for, from the API server) and NodeHosts (from Ray)."""
    from testbed.controlplane.selfcheck import ready_synthetic_nodes
    from testbed.kube import api_client

    assert state.fleet is not None
    try:
        spec = environment.recorded_fleet(state)
    except TestbedError as exc:
        return Fleet(ray_address=state.fleet.ray_address, record_error=f"{exc.message}\nhint: {exc.hint}")
    fleet = Fleet(ray_address=state.fleet.ray_address, identities=spec.identities, log_level=spec.log_level)
    api = api_client(state.kubeconfig)
    try:
        ready = ready_synthetic_nodes(api)
    except Exception as exc:  # a status must say what it can, not fail
        fleet.api_error = type(exc).__name__
        return fleet
    finally:
        api.close()  # type: ignore[no-untyped-call]
    ready_by_pool = Counter(node.rsplit("-", 1)[0] for node in ready)  # nodes are named <pool>-NNN
    fleet.pools = [Pool(p.name, p.profile, p.kubelet, ready_by_pool.get(p.name, 0), p.count) for p in spec.pools]
    try:
        attached = environment.attach_fleet(state)
        described = attached.describe()
    except TestbedError as exc:
        fleet.hosts_error = exc.message
        return fleet
    for name, host in sorted(described.items()):
        if "error" in host:
            fleet.hosts.append(NodeHost(name, error=str(host["error"])))
            continue
        fleet.hosts.append(
            NodeHost(
                name,
                nodes=int(host["nodes"]),
                ready=int(host["ready"]),
                pid=int(host["pid"]),
                ray_node=str(host["ray_node"]),
                ray_node_address=str(host.get("ray_node_address", "")),
                restarted=bool(host["restarted"]),
                kubelet_restarts=int(host.get("kubelet_restarts", 0)),
                code=str(host.get("code", "?")),
            )
        )
        for node, said in host.get("faults", {}).items():
            fleet.faults.setdefault(node, []).extend(said)
    try:
        fabric = attached.fabric_state()
    except Exception as exc:  # a status must say what it can, not fail
        fleet.fabric_error = type(exc).__name__
    else:
        if fabric is not None:
            fleet.fabric, attach_faults = fabric
            for node, said in attach_faults.items():
                fleet.faults.setdefault(node, []).extend(said)
    fleet.faults = dict(sorted(fleet.faults.items()))
    return fleet


def _process_nodes(nodes_dir: Path) -> list[ProcessNode]:
    drivers = recorded_drivers(nodes_dir)
    restarts = recorded_driver_restarts(nodes_dir)
    shown = []
    for node, records in recorded_processes(nodes_dir).items():
        alive = {r.name: r.alive() for r in records}
        shown.append(
            ProcessNode(
                node,
                alive,
                restarts.get(node, 0) if "driver" in alive else None,
                bool(drivers.get(node)),
                str(Path(records[0].log).parent),
            )
        )
    return shown


def _external_drivers(nodes_dir: Path) -> list[ExternalDriver]:
    by_driver: dict[str, list[bool]] = {}
    for records in recorded_drivers(nodes_dir).values():
        for record in records:
            by_driver.setdefault(record.name, []).append(record.alive())
    restarted = recorded_restarts(nodes_dir)
    generations = recorded_generations(nodes_dir)
    shown = []
    for driver, states in sorted(by_driver.items()):
        counts = restarted.get(driver, Restarts())
        shown.append(
            ExternalDriver(
                driver,
                nodes=len(states),
                running=states.count(True),
                gone=states.count(False),
                restarts=counts.restarts,
                liveness_kills=counts.liveness_kills,
                generations=dict(sorted(generations.get(driver, Counter()).items())),
            )
        )
    return shown


# --- as tables ------------------------------------------------------------------------


def render(status: ClusterStatus, out: Console) -> None:
    table = Table(title=f"cluster {status.name!r} ({status.root})")
    for column in ("component", "pid", "process", "health", "restarts", "last exit"):
        table.add_column(column)
    for c in status.components:
        table.add_row(
            c.name,
            str(c.pid),
            "running" if c.alive else "[red]gone[/]",
            "[green]healthy[/]" if c.healthy else "[red]unhealthy[/]",
            str(c.restarts),
            escape(c.last_exit) or "-",
        )
    out.print(table)
    for c in status.components:
        if c.log_tail:
            out.print(f"last lines of {c.log}:", markup=False)
            out.print(escape(c.log_tail), markup=False)
    if status.attached_to:
        out.print(f"attached to the cluster of {status.attached_to} (no control plane of its own)")
    else:
        out.print(f"apiserver: {status.apiserver}")
    out.print(f"kubeconfig: {status.kubeconfig}")
    out.print(f"logs: {status.logs}")
    out.print(f"binaries: {status.binaries}")
    if status.pending_leftovers:
        out.print(
            "left behind by runs while the API server was gone, deleted once it answers: "
            + ", ".join(status.pending_leftovers),
            markup=False,
        )
    if status.fleet is not None:
        _render_fleet(status.fleet, status.code, out)
    if status.process_nodes:
        out.print(_process_nodes_table(status.process_nodes))
    if status.external_drivers:
        out.print(_external_drivers_table(status.external_drivers))
    if status.cut_short:
        out.print(
            f"[red]the `testbed up` that started it (pid {status.starter_pid}) ended before its "
            f"{status.cut_short} was up[/]: "
            f"{'some nodes may be missing' if status.cut_short == 'fleet' else 'it is not ready'}; "
            f"`testbed down --name {status.name}`, then `testbed up` again"
        )


def _render_fleet(fleet: Fleet, code_here: str, out: Console) -> None:
    if fleet.record_error:
        out.print(f"fleet: {fleet.record_error}", markup=False)
        return
    if fleet.api_error:
        out.print(f"fleet: the API server did not answer ({fleet.api_error})", markup=False)
        return
    settings = f" (identities {fleet.identities}, NodeHosts log at {fleet.log_level})" if fleet.identities else ""
    table = Table(title=f"fleet pools{settings}")
    for column in ("pool", "profile", "kubelet", "nodes Ready / asked for"):
        table.add_column(column)
    for pool in fleet.pools:
        table.add_row(pool.name, pool.profile, pool.kubelet, f"{pool.ready} / {pool.asked}")
    out.print(table)
    if fleet.hosts_error:
        out.print(f"NodeHosts: {fleet.hosts_error}", markup=False)
        return
    table = Table(title=f"NodeHosts (Ray at {fleet.ray_address})")
    columns = ("NodeHost", "nodes ready / held", "pid", "Ray node", "restarted", "kubelets restarted", "testbed code")
    for column in columns:
        table.add_column(column)
    for host in fleet.hosts:
        if host.error:
            table.add_row(host.name, f"[red]{escape(host.error)}[/]", "-", "-", "-", "-", "-")
            continue
        table.add_row(
            host.name,
            f"{host.ready} / {host.nodes}",
            str(host.pid),
            host.ray_node[:12],
            "yes" if host.restarted else "no",
            str(host.kubelet_restarts),
            "as here" if host.code == code_here else f"[red]{host.code}, here {code_here}[/]",
        )
    out.print(table)
    out.print(_ray_nodes_table(fleet.hosts))
    if fleet.faults:
        out.print(_faults_table(fleet.faults))
    if fleet.fabric_error:
        out.print(f"fabric manager: did not answer ({fleet.fabric_error})", markup=False)
    elif fleet.fabric is not None:
        said = ", ".join(f"{count} {what}" for what, count in fleet.fabric.items())
        out.print(f"fabric manager (since it last started): {said}", markup=False)


def _ray_nodes_table(hosts: list[NodeHost]) -> Table:
    """The fleet per Ray node (per machine): where the nodes run, and what was restarted."""
    per_node: dict[str, list[NodeHost]] = {}
    for host in hosts:
        if not host.error:
            per_node.setdefault(host.ray_node, []).append(host)
    table = Table(title="fleet per Ray node")
    for column in ("Ray node", "address", "NodeHosts", "nodes ready / held", "NodeHosts restarted"):
        table.add_column(column)
    for ray_node, on_it in sorted(per_node.items()):
        table.add_row(
            ray_node[:12],
            on_it[0].ray_node_address,
            str(len(on_it)),
            f"{sum(h.ready for h in on_it)} / {sum(h.nodes for h in on_it)}",
            str(sum(1 for h in on_it if h.restarted)),
        )
    unreachable = sum(1 for host in hosts if host.error)
    if unreachable:
        table.add_row("[red]unreachable[/]", "-", str(unreachable), "-", "-")
    return table


def _faults_table(faults: dict[str, list[str]]) -> Table:
    """The nodes whose emulated hardware, or the fabric to them, has faults in force."""
    table = Table(title="faults in force (testbed fault NODE clear undoes them)")
    for column in ("node", "faults"):
        table.add_column(column)
    faulty = list(faults.items())
    for node, said in faulty[:FAULTY_NODES_SHOWN]:
        table.add_row(node, escape("; ".join(said)))
    if len(faulty) > FAULTY_NODES_SHOWN:
        table.add_row("...", f"{len(faulty) - FAULTY_NODES_SHOWN} more nodes")
    return table


def _process_nodes_table(nodes: list[ProcessNode]) -> Table:
    table = Table(title="real-kubelet nodes (processes on this machine)")
    for column in ("node", "kubelet", "built-in drivers", "their restarts", "runtime", "logs"):
        table.add_column(column)
    for node in nodes:

        def cell(name: str, node: ProcessNode = node) -> str:
            if name not in node.alive:  # a node of command-line drivers only runs none
                return "none (command-line drivers below)" if name == "driver" and node.command_line_drivers else "-"
            return "[green]running[/]" if node.alive[name] else "[red]gone[/]"

        restarts = "-" if node.driver_restarts is None else str(node.driver_restarts)
        table.add_row(node.node, cell("kubelet"), cell("driver"), restarts, cell("cri"), node.logs)
    return table


def _external_drivers_table(drivers: list[ExternalDriver]) -> Table:
    table = Table(title="external drivers (a process per node; `testbed logs NODE DRIVER`)")
    for column in ("driver", "nodes", "running", "gone", "restarts", "by liveness probe", "generation"):
        table.add_column(column)
    for driver in drivers:
        table.add_row(
            driver.driver,
            str(driver.nodes),
            str(driver.running),
            f"[red]{driver.gone}[/]" if driver.gone else "0",
            str(driver.restarts),
            str(driver.liveness_kills),
            generations_cell(Counter(driver.generations)),
        )
    return table


def generations_cell(nodes_by_generation: Counter[int]) -> str:
    """``2`` when every node runs generation 2; ``1 (3 nodes), 2 (1 node)`` mid-rollout.
    (A surge runs two instances on one node for a moment: both count.)"""
    if len(nodes_by_generation) <= 1:
        return ", ".join(str(g) for g in nodes_by_generation) or "-"
    return ", ".join(f"{g} ({n} {'node' if n == 1 else 'nodes'})" for g, n in sorted(nodes_by_generation.items()))
