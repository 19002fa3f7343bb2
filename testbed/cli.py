"""`testbed`, the command line (`testbed --help` lists its commands).

stdout carries what scripts consume (the kubeconfig path, last line of `up`; `status
--json`) and the tables people read; progress and diagnostics go to stderr.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from rich.console import Console
from rich.markup import escape

from fake_devices.profiles import ProfileError
from testbed import clusterstatus, environment, files, runs
from testbed import config as cfg
from testbed.controlplane import binaries as binaries_module
from testbed.controlplane import cluster
from testbed.drivers import load_profile
from testbed.errors import TestbedError, interrupt_on_sigterm, run_coroutine
from testbed.fleet import spec as fleet_spec
from testbed.fleet.external import (
    check_runs_here,
    log_of_running_instance,
    running_generations,
)
from testbed.fleet.fleet import FAULT_ACTIONS, ScaleInterrupted, rollout_summary
from testbed.nodelogs import lines_of_node
from testbed.progress import ConsoleProgress, counted
from testbed.realnode import kubelet_api
from testbed.realnode.node import recorded_kubelet_pid

F = TypeVar("F", bound=Callable[..., Any])
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def reports_errors(command: F) -> F:
    """Every command: a TestbedError as its message and hint (exit 1), and so an error of
    Ray's (a NodeHost gone, its cluster taken down); Ctrl-C or SIGTERM through the
    command's cleanup (exit 130)."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        interrupt_on_sigterm()
        try:
            return command(*args, **kwargs)
        except TestbedError as exc:
            stderr.print(f"[bold red]error:[/] {escape(exc.message)}")
            if exc.detail:
                stderr.print(exc.detail.rstrip(), markup=False)
            if exc.hint:
                stderr.print(f"[yellow]hint:[/] {escape(exc.hint)}")
            sys.exit(1)
        except KeyboardInterrupt:
            stderr.print("interrupted")
            sys.exit(130)
        except Exception as exc:
            if not type(exc).__module__.startswith("ray."):
                raise
            said = str(exc).strip().splitlines()
            stderr.print(f"[bold red]error:[/] Ray: {escape(said[0] if said else type(exc).__name__)}")
            stderr.print(
                "[yellow]hint:[/] was the cluster taken down (`testbed down`) meanwhile? "
                "`testbed status` shows what runs, and a NodeHost's log is in Ray's session logs"
            )
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def cluster_options(command: F) -> F:
    command = click.option(
        "--state-dir",
        type=click.Path(path_type=Path),
        default=None,
        help="Cluster directory (default: <TESTBED_STATE_DIR>/clusters/<name>).",
    )(command)
    return click.option("--name", default=cfg.DEFAULT_CLUSTER_NAME, show_default=True, help="Cluster name.")(command)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("dra-testbed")
    except PackageNotFoundError:
        own = "unknown"
    return f"dra-testbed {own} (Kubernetes {cfg.KUBERNETES_VERSION}, etcd {cfg.ETCD_VERSION})"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(message="%(version)s", version=_version())
def main() -> None:
    """A fake-hardware testbed for Kubernetes Dynamic Resource Allocation."""


def _about(name: str, what: str) -> None:
    """The first line of every command that changes a cluster: which one, so a default
    name never acts on someone else's cluster unnoticed. A name that cannot be a
    cluster's is refused before it is announced."""
    cfg.check_cluster_name(name)
    stderr.print(f"cluster {name!r}: {what}", markup=False)


def _running(name: str, state_dir: Path | None) -> cluster.ClusterState:
    config = cfg.ControlPlaneConfig(name=name, state_dir=state_dir)
    state = cluster.ClusterState.load(config.cluster_dir) if config.cluster_dir.exists() else None
    if state is None or not state.ready:
        raise TestbedError(f"cluster {name!r} is not running", hint="start it with `testbed up`, or see `testbed list`")
    return state


def _kubectl() -> Path:
    """The kubectl built with the control plane: its version matches the cluster's."""
    override = cfg.kube_bin_dir_override()
    found = (override or cfg.binaries_cache_dir()) / "kubectl"
    if not os.access(found, os.X_OK):
        raise TestbedError(
            f"no kubectl at {found}", hint="run `make install` (it builds kubectl with the control plane)"
        )
    return found


@main.command()
@cluster_options
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="kube-apiserver port (default: a free one).")
@click.option(
    "--advertise-address",
    default="127.0.0.1",
    show_default=True,
    help="An IP address of this machine for kube-apiserver to listen on and name in its certificate, "
    "so NodeHosts on other machines can reach it.",
)
@click.option(
    "--kcm-qps",
    type=click.FloatRange(min=0, min_open=True),
    default=75.0,
    show_default=True,
    help="kube-controller-manager's API client QPS (the guide's floor for the pod-startup SLO is 75).",
)
@click.option(
    "--kcm-burst", type=click.IntRange(min=1), default=150, show_default=True, help="Its burst above the QPS."
)
@click.option(
    "--scheduler-qps",
    type=click.FloatRange(min=0, min_open=True),
    default=100.0,
    show_default=True,
    help="kube-scheduler's API client QPS.",
)
@click.option(
    "--scheduler-burst", type=click.IntRange(min=1), default=200, show_default=True, help="Its burst above the QPS."
)
@click.option(
    "--percentage-of-nodes-to-score",
    type=click.IntRange(0, 100),
    default=None,
    help="kube-scheduler's percentageOfNodesToScore (default: its adaptive choice; 100 scores every node).",
)
@click.option(
    "--binding-timeout",
    type=click.IntRange(min=1),
    default=None,
    metavar="SECONDS",
    help="How long kube-scheduler waits for devices' binding conditions (devices behind a fabric) "
    "before it allocates again (default: its 600).",
)
@click.option(
    "--scheduler-parallelism",
    type=click.IntRange(1, 1024),
    default=None,
    help="kube-scheduler's parallelism: workers that filter and score nodes (default 16).",
)
@click.option(
    "--devices-per-slice",
    type=click.IntRange(1, 128),
    default=None,
    help="At most this many devices per ResourceSlice on every synthetic node (default: the API's limits, "
    "128, or 64 with taints or counters).",
)
@click.option(
    "--alpha",
    is_flag=True,
    help="Turn on every alpha DRA feature gate and alpha/beta APIs on all components (also: TESTBED_ALPHA=1).",
)
@click.option(
    "--feature-gates",
    default="",
    help="Extra gates for all components, e.g. DRADeviceCompatibilityGroups=true (also: TESTBED_FEATURE_GATES).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Start-up timeout, seconds.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=0, max=fleet_spec.MAX_POOL_NODES),
    default=0,
    show_default=True,
    help="Synthetic nodes to start (each with hardware, drivers and a fake kubelet).",
)
@click.option(
    "--profile",
    default="tiny",
    show_default=True,
    help="Hardware profile of the synthetic nodes: gpu8, h100x8, tiny, shared-nic, fabric-gpu, fpga4, or a YAML file.",
)
@click.option(
    "--real-nodes",
    type=click.IntRange(min=0, max=100),
    default=0,
    show_default=True,
    help="Also run this many nodes (real-000, ...) with the real kubelet v1.37 in place of the fake one, "
    "the same profile and drivers: the reference to compare the fake kubelet against (root only, ~180 MB each).",
)
@click.option(
    "--nodes-per-host",
    type=click.IntRange(min=1, max=10_000),
    default=fleet_spec.DEFAULT_NODES_PER_HOST,
    show_default=True,
    help="Synthetic nodes per NodeHost Ray actor.",
)
@click.option(
    "--fleet",
    "fleet_file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="A fleet file: node pools (count, profile, labels, taints), nodes per host, Ray address.",
)
@click.option(
    "--identities",
    type=click.Choice(["per-node", "shared"]),
    default=None,
    help="per-node (default): each kubelet is system:node:<name> and each node's drivers hold a token bound "
    "to a driver pod there, so RBAC and admission apply as on a real cluster; shared: all nodes use the "
    "admin's credentials (3 fewer API calls per node at start-up). Overrides the fleet file's `identities`.",
)
@click.option(
    "--log-level",
    type=click.Choice(cfg.LOG_LEVELS),
    default=None,
    help="What the NodeHosts log (`testbed logs NODE nodehost`): warning (default); info: pods told of "
    "(SyncLoop ADD, DELETE, REMOVE), drivers registered and gone; debug: every NodePrepareResources/"
    "NodeUnprepareResources call, its claims and answer, as a kubelet at -v=4 (real-kubelet nodes run at -v=4). "
    "Overrides the fleet file's `logLevel`.",
)
@click.option(
    "--driver-command",
    default=None,
    metavar="'CMD ARGS'",
    help="Run this command as the DRA driver of every synthetic node (instead of the built-in ones), "
    "with the environment a DaemonSet pod gets: NODE_NAME, POD_UID, KUBELET_REGISTRAR_DIRECTORY_PATH, "
    "KUBELET_PLUGINS_DIRECTORY_PATH, CDI_DIR, KUBECONFIG, HARDWARE_DIR. Needs --driver-name.",
)
@click.option("--driver-name", default=None, help="The DRA driver name --driver-command registers (a.example.com).")
@click.option(
    "--driver-env",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra environment for --driver-command (repeatable); $(VAR) names another variable, as in a pod spec.",
)
@click.option(
    "--driver-liveness-probe",
    default=None,
    metavar="YAML",
    help="Probe --driver-command as a kubelet probes its DaemonSet's container and restart it when it fails: "
    "a livenessProbe as in a fleet file, e.g. '{grpc: {}, initialDelaySeconds: 10}'; the driver serves "
    "grpc.health.v1 on $(LIVENESS_PORT), a port per node.",
)
@click.option(
    "--untainted",
    is_flag=True,
    help="Register the synthetic nodes without the taint dra-testbed.io/synthetic=true:NoSchedule, so "
    "manifests written for real nodes (a driver's demos) schedule on them unchanged; on a cluster of your "
    "own (--kubeconfig), its DaemonSets then come to them too. In a fleet file: a pool's `taints: []`.",
)
@click.option(
    "--kubeconfig",
    "external_kubeconfig",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="Bring the fleet to this existing cluster (kind, ...) instead of starting a control plane.",
)
@reports_errors
def up(
    name: str,
    state_dir: Path | None,
    port: int | None,
    advertise_address: str,
    kcm_qps: float,
    kcm_burst: int,
    scheduler_qps: float,
    scheduler_burst: int,
    percentage_of_nodes_to_score: int | None,
    scheduler_parallelism: int | None,
    binding_timeout: int | None,
    devices_per_slice: int | None,
    alpha: bool,
    feature_gates: str,
    timeout: float,
    nodes: int,
    real_nodes: int,
    profile: str,
    nodes_per_host: int,
    fleet_file: Path | None,
    identities: str | None,
    log_level: str | None,
    driver_command: str | None,
    driver_name: str | None,
    driver_env: tuple[str, ...],
    driver_liveness_probe: str | None,
    untainted: bool,
    external_kubeconfig: Path | None,
) -> None:
    """Start a local control plane (and synthetic nodes); print the kubeconfig path last.

    With --kubeconfig, start no control plane: the synthetic nodes join that cluster, and
    `testbed down` takes them out of it again."""
    _about(name, "starting" + (f" (state in {state_dir})" if state_dir else ""))
    config = cfg.ControlPlaneConfig.from_env(
        name=name,
        state_dir=state_dir,
        apiserver_port=port,
        advertise_address=advertise_address,
        kcm_qps=kcm_qps,
        kcm_burst=kcm_burst,
        scheduler_qps=scheduler_qps,
        scheduler_burst=scheduler_burst,
        percentage_of_nodes_to_score=percentage_of_nodes_to_score,
        scheduler_parallelism=scheduler_parallelism,
        binding_timeout_s=binding_timeout,
        alpha=alpha,
        startup_timeout_s=timeout,
        extra_feature_gates=cfg.parse_feature_gates(feature_gates, "--feature-gates"),
    )
    cfg.check_advertise_address(advertise_address)
    fleet = None
    if fleet_file is not None and (nodes or real_nodes):
        raise TestbedError(
            "give --fleet or --nodes/--real-nodes, not both",
            hint="put every pool in the fleet file (`kubelet: real` for real-kubelet nodes)",
        )
    if fleet_file is not None and driver_command is not None:
        raise TestbedError(
            "--driver-command goes with --nodes", hint="with --fleet, list the driver in a pool's `drivers:`"
        )
    if fleet_file is not None and untainted:
        raise TestbedError("--untainted goes with --nodes", hint="with --fleet, give the pools `taints: []`")
    try:  # a bad fleet or profile fails before anything starts
        if fleet_file is not None:
            fleet = fleet_spec.load(fleet_file)
        else:
            load_profile(profile)  # even for no nodes: a mistyped name is said, not ignored
        if fleet_file is None and (nodes or real_nodes):
            drivers = _command_driver(driver_command, driver_name, driver_env, driver_liveness_probe)
            fleet = fleet_spec.single_pool(
                nodes,
                profile,
                nodes_per_host,
                devices_per_slice=devices_per_slice,
                drivers=drivers,
                real=real_nodes,
                untainted=untainted,
            )
    except ProfileError as exc:
        if str(exc).startswith("no hardware profile named"):
            hint = "give --profile one of those, or a path to a profile YAML file"
        else:
            hint = _spec_fix(str(exc), "fake_devices/profiles/ (the shipped profiles)")
        raise TestbedError(str(exc), hint=hint) from None
    except fleet_spec.FleetFileError as exc:
        raise TestbedError(str(exc), hint=_spec_fix(str(exc), "examples/fleet.yaml")) from None
    for flag, given in (("--identities", identities), ("--log-level", log_level)):
        if fleet is None and given is not None:
            raise TestbedError(
                f"{flag} is for synthetic nodes, and this cluster has none",
                hint="give --nodes N (or --real-nodes N, or --fleet FILE) with it, or leave it out",
            )
    if fleet is not None and identities is not None:
        fleet = fleet.model_copy(update={"identities": identities})
    if fleet is not None and log_level is not None:
        fleet = fleet.model_copy(update={"log_level": log_level})
    if fleet is not None and devices_per_slice is not None:
        pools = [pool.model_copy(update={"devices_per_slice": devices_per_slice}) for pool in fleet.pools]
        fleet = fleet.model_copy(update={"pools": pools})
    if fleet is not None and fleet.ray.address is None:  # every NodeHost runs on this machine
        for pool in fleet.pools:
            for each in pool.external_drivers:
                check_runs_here(each.name, each.command, f"pool {pool.name}")
    try:
        state = environment.up(config, fleet, ConsoleProgress(), external_kubeconfig=external_kubeconfig)
    except KeyboardInterrupt:  # environment.up has stopped what it started
        stderr.print("interrupted: everything this command started has been stopped")
        sys.exit(130)
    click.echo(str(state.kubeconfig))


def _spec_fix(message: str, example: str) -> str:
    """The hint for a spec file's error: what to fix in it, or where to point instead."""
    if " is not valid YAML: " in message:
        return f"fix the YAML where it points; see {example}"
    if " does not exist" in message:
        return f"give the path of an existing file; see {example}"
    return f"fix the field it names; see {example}"


def _command_driver(
    command: str | None, name: str | None, env: tuple[str, ...], liveness_probe: str | None = None
) -> list[object] | None:
    """--driver-command/--driver-name/--driver-env/--driver-liveness-probe as a pool's
    `drivers:` list (validated with the pool, so errors name the field)."""
    if command is None:
        if name or env or liveness_probe:
            raise TestbedError(
                "--driver-name, --driver-env and --driver-liveness-probe go with --driver-command",
                hint="add --driver-command",
            )
        return None
    if not name:
        raise TestbedError(
            "--driver-command needs --driver-name", hint="the DRA driver name it registers, e.g. gpu.example.com"
        )
    runnable = fleet_spec.runnable_from(shlex.split(command), Path.cwd())
    driver: dict[str, object] = {"name": name, "command": runnable, "env": _environment(env, "--driver-env")}
    if liveness_probe is not None:
        driver["livenessProbe"] = _yaml_mapping(liveness_probe, "--driver-liveness-probe")
    return [driver]


def _yaml_mapping(text: str, option: str) -> dict[str, object]:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TestbedError(f"{option}: not YAML ({exc})".replace("\n", " "), hint="e.g. '{grpc: {}}'") from None
    if not isinstance(value, dict):
        raise TestbedError(f"{option}: {text!r} is not a mapping", hint="e.g. '{grpc: {}, initialDelaySeconds: 10}'")
    return value


def _environment(items: tuple[str, ...], option: str) -> dict[str, str]:
    variables = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TestbedError(f"{option} {item!r} is not KEY=VALUE", hint=f"e.g. {option} LOG_LEVEL=debug")
        variables[key] = value
    return variables


@main.command()
@cluster_options
@click.argument("node")
@click.argument("log_name", required=False)
@click.option("--tail", "tail_lines", type=click.IntRange(min=1), default=None, help="Only the last N lines.")
@click.option(
    "--all-nodes",
    is_flag=True,
    help="nodehost: every line of the NodeHost's log, also those about its other nodes.",
)
@reports_errors
def logs(
    node: str, log_name: str | None, name: str, state_dir: Path | None, tail_lines: int | None, all_nodes: bool
) -> None:
    """Print a node's log: an external driver's (by driver name), a real-kubelet node's
    kubelet, driver or cri, or (nodehost) the lines of the log of the NodeHost that runs a
    synthetic node's kubelet and built-in drivers that name the node or none of the host's
    others (--all-nodes: all of them). Without a name, list the node's logs."""
    _about(name, f"logs of node {node}")
    state = _running(name, state_dir)
    nodes = state.fleet.nodes_dir if state.fleet else ""
    directory = Path(nodes) / node / "logs" if nodes else None
    if directory is None or not (directory.parent).is_dir():
        raise TestbedError(f"cluster {name!r} has no node {node!r}", hint=f"see `testbed status --name {name}`")
    available = sorted(p.stem for p in directory.glob("*.log")) if directory.is_dir() else []
    if log_name is None:
        if not available:
            stderr.print(
                f"node {node}: no logs of its own (its built-in drivers and kubelet log in their NodeHost's: "
                f"`testbed logs {node} {NODEHOST_LOG}`)",
                markup=False,
            )
        for listed in available:
            click.echo(listed)
        return
    if log_name == NODEHOST_LOG and log_name not in available:
        path, host_nodes = _nodehost_log(state, node)
        lines = path.read_text(errors="replace").splitlines()
        if not all_nodes and len(host_nodes) > 1:
            lines = lines_of_node(lines, node, host_nodes)
            stderr.print(
                f"{node}: only its lines and the NodeHost's own; --all-nodes adds those of the host's "
                f"{len(host_nodes) - 1} other node(s)",
                markup=False,
            )
        click.echo("\n".join(lines[-tail_lines:] if tail_lines else lines))
        return
    # A driver's name means its instance running now (after rollouts, not the first's).
    newest = log_of_running_instance(available, log_name, running_generations(directory.parent, log_name))
    if newest is None:
        raise TestbedError(
            f"node {node} has no log {log_name!r}",
            hint=f"its logs: {', '.join([*available, NODEHOST_LOG])} ({NODEHOST_LOG}: its NodeHost's lines about it)",
        )
    if newest != log_name:
        stderr.print(f"{log_name} on {node}: its running instance's log, {newest} (`testbed logs {node}` lists all)")
    lines = (directory / f"{newest}.log").read_text(errors="replace").splitlines()
    click.echo("\n".join(lines[-tail_lines:] if tail_lines else lines))


NODEHOST_LOG = "nodehost"


def _nodehost_log(state: cluster.ClusterState, node: str) -> tuple[Path, list[str]]:
    """The log (Ray's worker stderr) of the NodeHost that holds ``node``, on this machine,
    and the nodes that host runs."""
    from testbed.fleet.raycluster import ray_temp_dir

    described = environment.attach_fleet(state).describe()
    for host_name, host in sorted(described.items()):
        if node not in host.get("node_names", ()):
            continue
        pid = host["pid"]
        logs = ray_temp_dir(state.root) / "session_latest" / "logs"
        found = sorted(logs.glob(f"worker-*-{pid}.err"))
        if not found:
            raise TestbedError(
                f"node {node} runs in NodeHost {host_name} (pid {pid}), whose log is not on this machine",
                hint=f"it is on Ray node {host.get('ray_node_address', '?')}, in its Ray session logs: "
                f"worker-*-{pid}.err",
            )
        stderr.print(f"{node}: the log of NodeHost {host_name} (pid {pid}), {found[-1]}", markup=False)
        return found[-1], list(host["node_names"])
    unreachable = [name for name, host in described.items() if "error" in host]
    raise TestbedError(
        f"no NodeHost answering holds node {node}",
        hint=f"{len(unreachable)} did not answer; `testbed status` shows them" if unreachable else "",
    )


@main.command("metrics")
@cluster_options
@click.argument("node")
@click.option(
    "--only", "prefixes", multiple=True, help="Only the metrics whose names start with this (repeatable): --only dra_"
)
@reports_errors
def metrics_command(node: str, name: str, state_dir: Path | None, prefixes: tuple[str, ...]) -> None:
    """Print what a process node's kubelet serves on /metrics: the real kubelet's (HTTPS
    inside its namespace, with the cluster admin's credentials) or a fake kubelet
    process's. Synthetic nodes' kubelets count in their NodeHost's /metrics."""
    _about(name, f"the kubelet metrics of node {node}")
    state = _running(name, state_dir)
    nodes = state.fleet.nodes_dir if state.fleet else ""
    root = Path(nodes) / node if nodes else None
    if root is None or not root.is_dir():
        raise TestbedError(f"cluster {name!r} has no node {node!r}", hint=f"see `testbed status --name {name}`")
    text = run_coroutine(kubelet_api.kubelet_metrics(root, node, state.kubeconfig, recorded_kubelet_pid(root)))
    if prefixes:
        families = tuple(f"# {kind} {prefix}" for kind in ("HELP", "TYPE") for prefix in prefixes)
        text = "".join(line for line in text.splitlines(keepends=True) if line.startswith((*prefixes, *families)))
    click.echo(text, nl=False)


@main.command()
@cluster_options
@click.option("--keep-state", is_flag=True, help="Keep logs, PKI and etcd data on disk.")
@reports_errors
def down(name: str, state_dir: Path | None, keep_state: bool) -> None:
    """Stop everything `testbed up` started."""
    config = cfg.ControlPlaneConfig(name=name, state_dir=state_dir)
    _about(name, "stopping")
    stopped = environment.down(config, keep_state=keep_state)
    if stopped:
        stderr.print(f"stopped {', '.join(stopped)}")
    else:
        stderr.print(f"cluster {name!r}: nothing was running")


@main.command()
@cluster_options
@reports_errors
def kubeconfig(name: str, state_dir: Path | None) -> None:
    """Print the admin kubeconfig path of a running cluster."""
    click.echo(str(_running(name, state_dir).kubeconfig))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@cluster_options
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@reports_errors
def kubectl(name: str, state_dir: Path | None, args: tuple[str, ...]) -> None:
    """Run the cluster's own kubectl (v1.37, no version skew) on it: testbed kubectl get nodes."""
    state = _running(name, state_dir)
    binary = _kubectl()
    os.execve(binary, [str(binary), *args], {**os.environ, "KUBECONFIG": str(state.kubeconfig)})


@main.command()
@cluster_options
@reports_errors
def env(name: str, state_dir: Path | None) -> None:
    """Print shell lines that point kubectl at the cluster: eval "$(testbed env)"."""
    state = _running(name, state_dir)
    click.echo(f"export KUBECONFIG={shlex.quote(str(state.kubeconfig))}")
    click.echo(f"export PATH={shlex.quote(str(_kubectl().parent))}:$PATH")


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the clusters as a JSON list (for scripts).")
@reports_errors
def list_clusters(as_json: bool) -> None:
    """The clusters under the state directory: name, whether they run, nodes, kubeconfig."""
    root = cfg.state_root() / "clusters"
    found = clusterstatus.listed(root)
    if as_json:
        click.echo(json.dumps([asdict(each) for each in found], indent=1))
        return
    out = Console(highlight=False, soft_wrap=True)
    if not found:
        out.print(f"no clusters in {root}: start one with `testbed up`", markup=False)
        return
    out.print(clusterstatus.listed_table(root, found))


@main.command()
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object (for scripts).")
@reports_errors
def status(name: str, state_dir: Path | None, as_json: bool) -> None:
    """Say what runs, and whether it is healthy. Exit 0 only if all is."""
    config = cfg.ControlPlaneConfig(name=name, state_dir=state_dir)
    found = clusterstatus.gather(config)
    out = Console(highlight=False, soft_wrap=True)
    if found is None:
        if as_json:
            click.echo(json.dumps({"name": name, "running": False}))
        else:
            out.print(f"cluster {name!r}: not running")
        sys.exit(1)
    if as_json:
        click.echo(json.dumps({**found.to_json(), "running": True}, indent=1))
    else:
        clusterstatus.render(found, out)
    if not found.healthy:
        sys.exit(1)


@main.command()
@cluster_options
@click.option(
    "--kubeconfig",
    "kubeconfig_file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Check this cluster instead of a testbed one.",
)
@click.option("--node", default=None, help="Run the GPU pod on this synthetic node (e.g. a real-kubelet one).")
@reports_errors
def check(name: str, state_dir: Path | None, kubeconfig_file: Path | None, node: str | None) -> None:
    """Prove the cluster allocates DRA devices; with synthetic nodes, run a GPU pod too."""
    if kubeconfig_file is None:
        _about(name, "checking" + (f" on node {node}" if node else ""))
    from testbed.controlplane import selfcheck
    from testbed.kube import api_client

    if kubeconfig_file is None:
        config = cfg.ControlPlaneConfig(name=name, state_dir=state_dir)
        state = cluster.ClusterState.load(config.cluster_dir) if config.cluster_dir.exists() else None
        if state is None or not state.ready:
            raise TestbedError(f"cluster {name!r} is not running", hint="start it with `testbed up`")
        kubeconfig_file = state.kubeconfig
    api = api_client(kubeconfig_file)
    try:
        result = selfcheck.run_allocation_check(api)
        nodes = selfcheck.synthetic_nodes(api)
        if node is not None and node not in nodes:
            raise TestbedError(f"no synthetic node {node!r}", hint=f"pick one of {', '.join(sorted(nodes)) or 'none'}")
        pod = selfcheck.run_dra_pod_check(api, node=node) if nodes else None
    finally:
        api.close()  # type: ignore[no-untyped-call]
    click.echo(
        f"ok: Kubernetes {result.version} allocated {result.driver}/{result.pool}/{result.device} "
        f"to claim {result.claim}, reserved it for the pod and bound the pod to "
        f"{result.bound_node} in {result.seconds:.2f}s"
    )
    if pod is not None:
        seen = f"env {', '.join(sorted(pod.env))}" if pod.env else "its container env is the runtime's"
        health = ", ".join(f"{rid} {state}" for rid, state in sorted(pod.health.items())) or "no device health yet"
        click.echo(
            f"ok: a pod with a GPU claim ran on synthetic node {pod.node} ({pod.device}, {seen}; {health}) "
            f"after {pod.seconds_to_running:.2f}s; unprepared and removed {pod.seconds_to_removed:.2f}s "
            f"after deletion ({counted(len(nodes), 'synthetic node')})"
        )


@main.command("run")
@click.argument("scenario")
@cluster_options
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a scenario field, e.g. phases.0.qps=20 (repeatable); the index past a list's end adds an entry.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Report directory (default: <state dir>/runs/<cluster>-<scenario>-<time>, kept after down).",
)
@click.option(
    "--up",
    "start",
    is_flag=True,
    help="If the cluster is not running, start the one the scenario's `cluster:` section describes "
    "(nodes, profile, KCM and scheduler settings, devices per slice), and stop it after the run.",
)
@click.option(
    "--junit",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Also write JUnit XML here: one test case per phase (its SLO verdict) and one for leaks.",
)
@reports_errors
def run_scenario(
    scenario: str,
    name: str,
    state_dir: Path | None,
    overrides: tuple[str, ...],
    output: Path | None,
    start: bool,
    junit: Path | None,
) -> None:
    """Run a scenario (smoke, cl2-dra, steady-churn, baseline, fabric, or a YAML file); print the report dir last."""
    _about(name, f"running scenario {scenario}")
    import yaml

    from testbed.scenarios import spec

    values = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key or "" in key.split("."):
            raise TestbedError(f"--set {item!r} is not KEY=VALUE", hint="e.g. --set phases.0.qps=20")
        try:
            values[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "malformed"
            raise TestbedError(
                f"--set {item!r}: the value is not valid YAML ({problem})",
                hint=f"a number, a word or YAML; to give it as text, quote it for YAML: --set \"{key}='{value}'\"",
            ) from None
    try:
        chosen = spec.load(scenario, values)
    except spec.ScenarioError as exc:
        if isinstance(exc, spec.ScenarioNotFound):
            hint = "give a shipped scenario's name or the path of a scenario file (ending in .yaml)"
        elif values:
            hint = "check your --set keys and values against the scenario file"
        else:
            hint = "fix the file"
        raise TestbedError(str(exc), hint=f"{hint}; see testbed/scenarios/shipped/ for examples") from None
    runs.check_writable(output, junit)
    config = cfg.ControlPlaneConfig(name=name, state_dir=state_dir)
    state = cluster.ClusterState.load(config.cluster_dir) if config.cluster_dir.exists() else None
    c = chosen.cluster
    started_here = False
    if state is None or not state.ready:
        if not start:
            raise TestbedError(
                f"cluster {name!r} is not running",
                hint=f"add --up, or start what {chosen.name} expects: testbed up --name {name} --nodes {c.nodes} "
                f"--profile {c.profile} --kcm-qps {c.kcm_qps:g} --kcm-burst {c.kcm_burst} --scheduler-qps "
                f"{c.scheduler_qps:g} --scheduler-burst {c.scheduler_burst}",
            )
        started_here = True
        wanted = cfg.ControlPlaneConfig.from_env(
            name=name,
            state_dir=state_dir,
            kcm_qps=c.kcm_qps,
            kcm_burst=c.kcm_burst,
            scheduler_qps=c.scheduler_qps,
            scheduler_burst=c.scheduler_burst,
            percentage_of_nodes_to_score=c.percentage_of_nodes_to_score,
            scheduler_parallelism=c.scheduler_parallelism,
            binding_timeout_s=c.binding_timeout_s,
        )
        pool = fleet_spec.single_pool(c.nodes, c.profile, c.nodes_per_host, devices_per_slice=c.devices_per_slice)
        try:
            state = environment.up(wanted, pool, ConsoleProgress())
        except BaseException:
            environment.down(config)
            raise
    try:
        runs.wait_for_fleet(state, ConsoleProgress())
        code = runs.run_and_report(state, chosen, name, output, junit)
    finally:
        if started_here:
            stderr.print(f"stopping cluster {name!r} (started by --up)")
            environment.down(config)
    if code:
        sys.exit(code)


@main.command()
@click.argument("run_a", type=click.Path(path_type=Path, exists=True))
@click.argument("run_b", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--fail-if",
    "fail_if",
    multiple=True,
    metavar="FIGURE=RATIO",
    help="Exit 1 when B is worse than A by more than RATIO in any phase, e.g. startup_p99=1.2 "
    "(repeatable; figures: startup_p50, startup_p99, pods_per_s, scheduling_sli_p99, cpu_seconds, ...).",
)
@reports_errors
def compare(run_a: Path, run_b: Path, fail_if: tuple[str, ...]) -> None:
    """Compare two runs' reports phase by phase: the settings that differ, then each figure and how much worse B is."""
    from testbed.report import compare as comparing

    thresholds = comparing.parse_thresholds(fail_if)
    result = comparing.compare(comparing.load(run_a), comparing.load(run_b), thresholds)
    click.echo("\n".join(result.lines))
    if result.regressions:
        stderr.print(f"{len(result.regressions)} regression(s) beyond the allowed ratio:", markup=False)
        for line in result.regressions:
            stderr.print(f"  {line}", markup=False)
        sys.exit(1)


COUNTED_FAULTS = {
    "fail-prepare": "a count of prepares",
    "latency": "milliseconds",
    "fail-attach": "a count of attaches",
    "hang-attach": "a count of attaches",
}
UNTARGETED_FAULTS = ("clear", "restart-kubelet")
"""The faults whose target is a number, and what it counts."""


@main.command(context_settings={"ignore_unknown_options": True})  # so `latency -5` is refused as a value
@click.argument("node")
@click.argument("action", type=click.Choice(FAULT_ACTIONS))
@click.argument("target", required=False, default="")
@cluster_options
@click.option("--message", default="", help="What the driver reports for an unhealthy device (e.g. 'XID 79').")
@click.option(
    "--fatal",
    is_flag=True,
    help="With unhealthy: the device cannot serve even the work it has (fallen off the bus); built-in "
    "drivers taint it NoExecute, so the controller-manager evicts the pods whose claims do not tolerate it.",
)
@reports_errors
def fault(node: str, action: str, target: str, name: str, state_dir: Path | None, message: str, fatal: bool) -> None:
    """Break a synthetic node's emulated hardware: NODE unhealthy|healthy|lost DEVICE, or
    NODE fail-prepare N (the next N prepares fail), or NODE latency MS (every prepare), or
    NODE fail-attach N (the next N attaches of devices behind a fabric to NODE fail), or
    NODE hang-attach N (they never end: the scheduler's binding timeout gives them up);
    NODE clear undoes them all (a lost device stays lost). NODE restart-kubelet restarts
    the node's kubelet in place, its pods and drivers running on: the new kubelet deletes
    the node's slices, registers the drivers again and finds its pods as they were.
    NODE may be a shell-style pattern ('node-00*'): every node it matches.

    Built-in drivers act on it at once (slices, health stream, prepare); external drivers
    see health and lost devices in $HARDWARE_DIR/inventory.json."""
    if fatal and action != "unhealthy":
        raise TestbedError(
            f"--fatal is for unhealthy, not {action}", hint=f"testbed fault {node} unhealthy DEVICE --fatal"
        )
    if action in UNTARGETED_FAULTS and target:
        raise TestbedError(f"{action} takes no target, not {target!r}", hint=f"testbed fault {node} {action}")
    if action not in UNTARGETED_FAULTS and not target:
        wanted, example = (COUNTED_FAULTS[action], "3") if action in COUNTED_FAULTS else ("a device", "gpu-0")
        raise TestbedError(f"{action} needs {wanted}", hint=f"testbed fault {node} {action} {example}")
    what = f"{action} {target}".strip()
    _about(name, f"{what} on node {node}")
    number = None
    if action in COUNTED_FAULTS:
        try:
            number = float(target)
        except ValueError:
            number = -1.0
        if not math.isfinite(number) or number < 0 or (action != "latency" and not number.is_integer()):
            raise TestbedError(f"{action} {target!r}: give {COUNTED_FAULTS[action]}, a number of at least 0")
    state = _running(name, state_dir)
    fleet = environment.attach_fleet(state)
    nodes = [node]
    if any(c in node for c in "*?["):
        nodes = fleet.nodes_matching(node)
        if not nodes:
            raise TestbedError(f"no synthetic node matches {node!r}", hint="`testbed status` lists the pools")

    said = ", ".join(word for word in (message, "fatal" if fatal else "") if word)
    for each in nodes:
        run_coroutine(fleet.apply_fault(each, action, target if number is None else f"{number:g}", message, fatal))
        stderr.print(f"node {each}: {what}" + (f" ({said})" if said else ""), markup=False)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@cluster_options
@click.option("--driver-name", default="", help="The name the driver must register as (default: what it says).")
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE", help="Extra environment for the driver.")
@click.option("--junit", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Also write JUnit XML.")
@click.option(
    "--check",
    "wanted",
    multiple=True,
    metavar="TEXT",
    help="Run only the checks whose names contain TEXT (repeatable; any case), with the ones they "
    "stand on: e.g. --check health --check 'per-claim'.",
)
@click.option(
    "--node",
    "node",
    default="",
    help="Check the driver already serving this synthetic node instead of running a command "
    "(with --driver-name when the node runs several); checks that restart it are skipped.",
)
@click.option(
    "--liveness-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="The driver's gRPC liveness port (what its DaemonSet's livenessProbe.grpc.port says; "
    "set the driver to listen there): checked to say SERVING, and not once its DRA socket is gone. "
    "Without it, a driver whose command or --env names $(LIVENESS_PORT) is checked on the port handed over.",
)
@click.option("--liveness-address", default="127.0.0.1", show_default=True, help="Where the liveness port listens.")
@click.option(
    "--registration-timeout",
    "registration_timeout_s",
    type=click.FloatRange(1, 3600),
    default=60,
    show_default=True,
    metavar="SECONDS",
    help="How long the driver has to create its registration socket and answer GetInfo, each time it starts.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@reports_errors
def sanity(
    name: str,
    state_dir: Path | None,
    driver_name: str,
    env_items: tuple[str, ...],
    junit: Path | None,
    wanted: tuple[str, ...],
    node: str,
    liveness_port: int | None,
    liveness_address: str,
    registration_timeout_s: float,
    command: tuple[str, ...],
) -> None:
    """Check a DRA kubelet plugin as a kubelet relies on it: testbed sanity [OPTIONS] -- CMD ARGS...

    Runs the command as the driver of a fresh node of its own on the running cluster
    (the environment a DaemonSet pod gets), or checks the driver of a running node
    (--node N), plays the kubelet's part on the wire, and has the real scheduler
    allocate the claims it prepares. One line per check; exit 0 only without FAIL."""
    from testbed import sanity as sanity_suite
    from testbed.sanity.checks import Result, Status, junit_xml, select

    try:
        only = select(wanted) if wanted else None
    except ValueError as exc:
        raise TestbedError(f"--check: {exc}", hint="give part of a check's name, as the suite prints it") from None
    if bool(node) == bool(command):
        raise TestbedError(
            "give the driver's command (after --) or --node N, one of the two",
            hint="testbed sanity -- ./my-driver --flag   or   testbed sanity --node NODE --driver-name NAME",
        )
    _about(name, f"sanity of {' '.join(command) or f'the driver of node {node}'}")
    if junit is not None:
        files.check_can_make(junit, "--junit", "give a file in a writable directory")
    state = _running(name, state_dir)
    env = _environment(env_items, "--env")
    running = None
    if node:
        if state.fleet is None or not state.fleet.nodes_dir:
            raise TestbedError(f"cluster {name!r} has no fleet, so no node {node!r}")
        running = sanity_suite.RunningNode(node, Path(state.fleet.nodes_dir) / node)
    colours = {Status.PASS: "green", Status.FAIL: "red", Status.WARN: "yellow", Status.SKIP: "dim"}

    def say(result: Result) -> None:
        stderr.print(
            f"[{colours[result.status]}]{result.status:<4}[/] {result.name}: {escape(result.detail)} "
            f"[dim]({result.seconds:.1f} s)[/]"
        )

    runnable = fleet_spec.runnable_from(list(command), Path.cwd()) if command else []
    liveness = None if liveness_port is None else (liveness_address, liveness_port)
    results, driver = sanity_suite.run(
        state.kubeconfig,
        runnable,
        env,
        driver_name,
        lambda line: stderr.print(line, markup=False),
        say,
        running,
        only,
        liveness,
        registration_timeout_s,
    )
    counts = {status: sum(1 for r in results if r.status is status) for status in Status}
    stderr.print(", ".join(f"{n} {status}" for status, n in counts.items() if n))
    if junit is not None:
        try:
            junit.parent.mkdir(parents=True, exist_ok=True)
            junit.write_text(junit_xml(results, driver or "driver"))
        except OSError as exc:
            raise TestbedError(
                f"--junit {junit}: {exc.strerror}",
                hint="the results are the lines above; free space there, or give another file",
            ) from None
    if counts[Status.FAIL]:
        sys.exit(1)


@main.command(context_settings={"ignore_unknown_options": True})  # so `-1` reaches COUNT and is refused there
@click.argument("pool")
@click.argument("count", type=click.IntRange(min=0, max=fleet_spec.MAX_POOL_NODES))
@cluster_options
@reports_errors
def scale(pool: str, count: int, name: str, state_dir: Path | None) -> None:
    """Grow or shrink a node pool of a running fleet, while pods run.

    Shrinking drains the pool's highest-numbered nodes in the order the DRA good
    practices ask for: cordon, evict pods, unprepare their claims, stop the drivers,
    remove the slices, delete the Node.
    """
    _about(name, f"scaling pool {pool} to {counted(count, 'node')}")
    config = cfg.ControlPlaneConfig(name=name, state_dir=state_dir)
    if not cluster.owned(config.cluster_dir):  # and no lock file left in a directory not ours
        raise TestbedError(f"cluster {name!r} is not running", hint="start it with `testbed up --nodes N`")
    with environment.scaling(
        config.cluster_dir,
        f"`testbed scale {pool} {count}`",
        waiting=lambda who: stderr.print(f"waiting for {who} to finish"),
    ):
        _scale_held(name, pool, count, config)


def _scale_held(name: str, pool: str, count: int, config: cfg.ControlPlaneConfig) -> None:
    state = cluster.ClusterState.load(config.cluster_dir) if config.cluster_dir.exists() else None
    if state is None or not state.ready:
        raise TestbedError(f"cluster {name!r} is not running", hint="start it with `testbed up --nodes N`")
    try:
        fleet = environment.scale_pool(state, pool, count, ConsoleProgress())
    except KeyboardInterrupt as interrupted:
        if environment.taken_down(config.cluster_dir):
            stderr.print(f"stopped: `testbed down` is taking cluster {name!r} down, and its NodeHosts with it")
            sys.exit(130)
        carrying_on = f"`testbed status --name {name}` shows how far they are"
        if isinstance(interrupted, ScaleInterrupted) and interrupted.given_up:
            again = f"`testbed scale --name {name} {pool} {count}` adds them"
            if interrupted.handed:
                stderr.print(
                    f"interrupted: {interrupted.handed} nodes handed to NodeHosts come up all the same "
                    f"({carrying_on}); {interrupted.given_up} were not started: {again}"
                )
            else:
                stderr.print(f"interrupted before any of the {interrupted.given_up} nodes was started: {again}")
        else:
            stderr.print(f"interrupted: the NodeHosts go on taking pool {pool} to {count} nodes; {carrying_on}")
        sys.exit(130)
    pools = ", ".join(f"{p.name}: {p.count}" for p in fleet.spec.pools)
    stderr.print(
        f"fleet now: {pools} ({counted(len(fleet.host_of), 'node')} on {counted(len(fleet.hosts), 'NodeHost')})"
    )


@main.command()
@click.argument("driver")
@click.option(
    "--command",
    "new_command",
    default=None,
    metavar="'CMD ARGS'",
    help="The new version's command line (default: the one running now, as `kubectl rollout restart`).",
)
@click.option(
    "--max-surge",
    type=click.IntRange(min=0),
    default=None,
    help="Nodes at a time whose new instance starts beside the old one, which stops once the kubelet "
    "registered the new (the seamless upgrade; the default, 1).",
)
@click.option(
    "--max-unavailable",
    type=click.IntRange(min=0),
    default=None,
    help="Nodes at a time whose old instance stops before the new one starts (no seamless upgrade).",
)
@cluster_options
@reports_errors
def rollout(
    driver: str,
    new_command: str | None,
    max_surge: int | None,
    max_unavailable: int | None,
    name: str,
    state_dir: Path | None,
) -> None:
    """Roll a command-line DRIVER out anew on every node that runs it, while pods run, as
    its DaemonSet's rolling update would (a new driver pod and instance per node)."""
    surge, unavailable = (1, 0) if max_surge is None and max_unavailable is None else (max_surge, max_unavailable)
    if bool(surge) == bool(unavailable):
        raise TestbedError(
            f"--max-surge {surge or 0} and --max-unavailable {unavailable or 0}: give one of them, above 0",
            hint="--max-surge 1 starts each node's new instance before stopping the old one (the seamless "
            "upgrade); --max-unavailable 1 stops the old one first",
        )
    surge, unavailable = surge or 0, unavailable or 0
    how = f"maxSurge {surge}" if surge else f"maxUnavailable {unavailable}"
    _about(name, f"rolling {driver} out ({how})")
    config = cfg.ControlPlaneConfig(name=name, state_dir=state_dir)
    command = None if new_command is None else fleet_spec.runnable_from(shlex.split(new_command), Path.cwd())
    if not cluster.owned(config.cluster_dir):
        raise TestbedError(f"cluster {name!r} is not running", hint="start it with `testbed up --nodes N`")
    with environment.scaling(
        config.cluster_dir,
        f"`testbed rollout {driver}`",
        waiting=lambda who: stderr.print(f"waiting for {who} to finish"),
    ):
        state = cluster.ClusterState.load(config.cluster_dir)
        if state is None or not state.ready:
            raise TestbedError(f"cluster {name!r} is not running", hint="start it with `testbed up --nodes N`")
        if command is not None and state.fleet is not None and environment.recorded_fleet(state).ray.address is None:
            check_runs_here(driver, command, "--command")
        rolled = environment.roll_driver_out(state, driver, command, surge, unavailable, ConsoleProgress())
    stderr.print(rollout_summary(driver, rolled), markup=False)


@main.command("binaries")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--no-download", is_flag=True, help="Skip release downloads; build if not cached.")
@reports_errors
def binaries_command(names: tuple[str, ...], no_download: bool) -> None:
    """Obtain the control-plane and node binaries (cache, download or build); print their
    directory. With NAMEs, obtain those (built on first use, e.g. dra-test-driver, the
    Kubernetes project's own DRA test driver) and print the path of each."""
    if names:
        found = binaries_module.ensure_named(names, ConsoleProgress())
        for name in names:
            click.echo(str(found.path(name)))
        return
    found = binaries_module.ensure_binaries(ConsoleProgress(), allow_download=not no_download)
    if shutil.which("go") is not None and cfg.kube_bin_dir_override() is None:
        found = binaries_module.ensure_node_binaries(ConsoleProgress())
    stderr.print(f"binaries: {found.source}")
    click.echo(str(found.directory))


if __name__ == "__main__":
    main()
