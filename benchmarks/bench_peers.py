"""KWOK and the testbed side by side on one control plane: what emulating a node costs.

    python benchmarks/bench_peers.py [--nodes 500] [--pods 200] [--qps 20] [--idle-seconds 30]
                                     [--runs 3] [--reports DIR] [--identities per-node|shared]

``--identities shared`` runs the testbed's nodes on the fleet's credentials, as KWOK's
are (by default each node has its own, as real nodes do, which costs the control plane
three more requests per node and a TLS connection per kubelet): what emulating a node
costs, apart from what real identities cost.

``--reports DIR`` keeps each side's full run report (DIR/run<N>/kwok, DIR/run<N>/testbed):
the per-phase breakdown says where the time went when a ratio is off.

KWOK (sigs.k8s.io/kwok, built from the Go module proxy once and cached) runs nodes that go
Ready and keep a Lease, and pods that run once bound (benchmarks/kwok/config.yaml). Each
KWOK node gets the 8-GPU ResourceSlice the testbed's gpu8 profile publishes, written by
this script, as a fake GPU operator does: KWOK calls no driver, so its pods' claims are
allocated and never prepared. Then the testbed starts as many gpu8 synthetic nodes, and
both run the same workload: pods without a claim, then pods with a GPU claim, at a rate.
Each run starts both sides afresh (the testbed with a Ray of its own), the first side
alternating from run to run: the control plane is the same process for both, and its
warm-up favours whichever comes second. With more than one run, each ratio is taken within
a run and the median of those printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench_fleet import cpu_seconds, processes_matching, ray_head_pid

from fake_devices.hardware import build_inventory
from testbed.config import ControlPlaneConfig, cache_root
from testbed.controlplane import cluster
from testbed.controlplane.processes import descendants
from testbed.drivers import KINDS, load_profile
from testbed.environment import install_device_classes, start_fleet
from testbed.errors import TestbedError, run_coroutine, run_interruptibly
from testbed.fleet import raycluster
from testbed.fleet.spec import DEFAULT_NODES_PER_HOST, single_pool
from testbed.keys import PROFILE_LABEL, SLICE_NODE_LABEL, SYNTHETIC
from testbed.kubeapi import KubeClient, path_for, until_answered
from testbed.kubeletplugin.slices import desired_slices, slice_object
from testbed.progress import ConsoleProgress
from testbed.report import report as reporting
from testbed.report.metrics import Scrape
from testbed.scenarios import runner, spec

KWOK_VERSION = "v0.8.0"
KWOK_CONFIG = Path(__file__).with_name("kwok") / "config.yaml"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU = "gpu.dra-testbed.io"
T = TypeVar("T")


def kwok_binary() -> Path:
    """The pinned KWOK, built from the Go module proxy on first use."""
    target = cache_root() / f"kwok-{KWOK_VERSION}"
    binary = target / "kwok"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise TestbedError("bench-peers needs Go to build KWOK once", hint="install Go 1.24+ and run it again")
    print(f"building KWOK {KWOK_VERSION} from the Go module proxy (once) ...", flush=True)
    env = {**os.environ, "GOBIN": str(target), "CGO_ENABLED": "0"}
    subprocess.run(["go", "install", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"], env=env, check=True)
    return binary


def kwok_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {"kubernetes.io/hostname": name, PROFILE_LABEL: "kwok-gpu8", SYNTHETIC: "true"},
        },
        "spec": {"taints": [{"key": SYNTHETIC, "value": "true", "effect": "NoSchedule"}]},
    }


async def _bounded(calls: list[Any], limit: int = 24) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(call: Any) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(c) for c in calls))


async def _ready_nodes(client: KubeClient, selector: str) -> int:
    nodes = await client.get(path_for("v1", "nodes"), {"labelSelector": selector})
    return sum(
        1
        for n in nodes["items"]
        for c in n.get("status", {}).get("conditions", [])
        if c["type"] == "Ready" and c["status"] == "True"
    )


KWOK_SELECTOR = f"{PROFILE_LABEL}=kwok-gpu8"
SETTLE_S = 300.0
"""How long KWOK's nodes get to become Ready, or to be gone: beyond it, something broke."""


async def kwok_nodes_up(client: KubeClient, count: int) -> float:
    """Nodes KWOK makes Ready, each with a gpu8 slice; seconds until all are Ready."""
    names = [f"kwok-{i:04d}" for i in range(count)]
    started = time.monotonic()
    await _bounded([client.create(path_for("v1", "nodes"), kwok_node(n)) for n in names])
    profile = load_profile("gpu8")
    slices = []
    for name in names:
        devices, pools = KINDS[GPU].select(*build_inventory(profile, name, seed=0))
        specs = desired_slices(GPU, name, devices, pools, [])
        slices += [slice_object(GPU, name, s, 1, len(specs)) for s in specs]
    await _bounded([client.create(path_for("resource.k8s.io/v1", "resourceslices"), s) for s in slices])
    while (ready := await _ready_nodes(client, KWOK_SELECTOR)) < count:
        if time.monotonic() - started > SETTLE_S:
            raise TestbedError(f"KWOK made {ready} of {count} nodes Ready in {SETTLE_S:.0f} s", hint="see kwok.log")
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def kwok_nodes_down(client: KubeClient) -> None:
    """KWOK's nodes, their slices and Leases deleted, and waited for: the next run
    creates nodes of the same names, which a Node or Lease left behind would spoil."""
    nodes, slices = path_for("v1", "nodes"), path_for("resource.k8s.io/v1", "resourceslices")
    deadline = time.monotonic() + SETTLE_S
    while True:
        await client.request("DELETE", slices, params={"labelSelector": SLICE_NODE_LABEL})
        await client.request("DELETE", nodes, params={"labelSelector": KWOK_SELECTOR})
        left = (await client.get(nodes, {"labelSelector": KWOK_SELECTOR}))["items"]
        if not left:
            break
        if time.monotonic() > deadline:
            raise TestbedError(f"{len(left)} KWOK nodes still there {SETTLE_S:.0f} s after their deletion")
        await asyncio.sleep(1.0)
    leases = path_for("coordination.k8s.io/v1", "leases", namespace="kube-node-lease")
    for lease in (await client.get(leases))["items"]:
        if lease["metadata"]["name"].startswith("kwok-"):
            await client.delete_if_exists(f"{leases}/{lease['metadata']['name']}")


def workload(pods: int, qps: float) -> spec.Scenario:
    return spec.Scenario.model_validate(
        {
            "name": "peers",
            "phases": [
                {"name": "no-claim", "jobs": pods, "qps": qps, "requests": [], "stallSeconds": 60},
                {"name": "gpu-claim", "jobs": pods, "qps": qps, "stallSeconds": 60},
            ],
        }
    )


def run_workload(
    state: cluster.ClusterState, scenario: spec.Scenario, nodehosts: runner.NodeHostMetrics | None, keep: Path | None
) -> dict[str, Any]:
    endpoints = runner.Endpoints.local(state.ports, nodehosts)
    data = run_coroutine(_with_client(state, lambda client: runner.Runner(client, scenario, endpoints).run()))
    report = reporting.build(data, {"checkpoint_entries": 0, "cdi_specs": 0}, {})
    if keep is not None:
        print(f"  report: {reporting.write(report, data, keep)}")
    return report


def idle_cpu(pids: list[int], seconds: float) -> float:
    """Cores the processes used while nothing happened."""
    before = sum(cpu_seconds(p) for p in pids)
    time.sleep(seconds)  # measuring idleness: nothing to wait for but time
    return (sum(cpu_seconds(p) for p in pids) - before) / seconds


@dataclass(frozen=True)
class SideFigures:
    """One side's figures from one run."""

    ready_s: float
    idle_cores: float
    start_cpu: dict[str, float]
    """CPU-seconds per component over the start."""
    start_requests: dict[str, float]
    """API requests per node over the start, by verb and resource."""
    workload_requests: dict[str, float]
    """API requests per pod over the workload (both phases), by verb and resource."""
    report: dict[str, Any]
    """The workload's run report."""
    runtime_start_s: float | None = None
    """Of ``ready_s``, the start of what runs the nodes: Ray's head for the testbed (KWOK's
    process is started before its clock runs)."""


class TimedProgress(ConsoleProgress):
    """Progress as `testbed up` shows it, remembering how long each framed task took."""

    def __init__(self) -> None:
        super().__init__()
        self.took: dict[str, float] = {}

    @contextmanager
    def task(self, message: str) -> Iterator[None]:
        started = time.monotonic()
        with super().task(message):
            yield
        self.took[message] = time.monotonic() - started


def kwok_side(
    state: cluster.ClusterState, args: argparse.Namespace, scenario: spec.Scenario, keep: Path | None
) -> SideFigures:
    """KWOK started, its nodes made Ready with slices (timed), idle, the workload; then its
    nodes deleted and KWOK stopped, leaving the control plane as it found it."""
    components = {r.name: r.pid for r in state.processes}
    with open(state.root / "kwok.log", "ab") as log:
        kwok_process = subprocess.Popen(
            [
                str(kwok_binary()),
                f"--kubeconfig={state.kubeconfig}",
                f"--config={KWOK_CONFIG}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--cidr=10.200.0.0/16",
                "--node-ip=10.201.0.1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        requests = api_requests(state)
        before = {n: cpu_seconds(p) for n, p in components.items()} | {"emulation": cpu_seconds(kwok_process.pid)}
        ready_s = run_coroutine(_with_client(state, lambda client: kwok_nodes_up(client, args.nodes)))
        print(f"KWOK: {args.nodes} nodes Ready with slices in {ready_s:.1f} s", flush=True)
        start_cpu = {n: cpu_seconds(p) - before[n] for n, p in components.items()}
        start_cpu["emulation"] = cpu_seconds(kwok_process.pid) - before["emulation"]
        start_requests = per_node(requests, api_requests(state), args.nodes)
        idle = idle_cpu([kwok_process.pid], args.idle_seconds)
        requests = api_requests(state)
        report = run_workload(state, scenario, None, keep)
        workload_requests = per_node(requests, api_requests(state), pods_run(scenario))
        run_coroutine(_with_client(state, kwok_nodes_down))
    finally:
        kwok_process.terminate()
        kwok_process.wait(timeout=30)
    return SideFigures(ready_s, idle, start_cpu, start_requests, workload_requests, report)


def testbed_side(
    state: cluster.ClusterState, args: argparse.Namespace, scenario: spec.Scenario, keep: Path | None
) -> SideFigures:
    """Ray and the fleet started, its nodes Ready with slices (timed, Ray's start
    included), idle, the workload; then the nodes removed and Ray stopped."""
    components = {r.name: r.pid for r in state.processes}
    requests = api_requests(state)
    before = {n: cpu_seconds(p) for n, p in components.items()}
    started, progress = time.monotonic(), TimedProgress()
    pool = single_pool(args.nodes, "gpu8", args.nodes_per_host).model_copy(update={"identities": args.identities})
    fleet = start_fleet(state, pool, progress)
    try:
        ready_s = time.monotonic() - started
        ray_s = sum(s for task, s in progress.took.items() if task.startswith("starting Ray"))
        print(f"testbed: {args.nodes} nodes Ready with slices in {ready_s:.1f} s ({ray_s:.1f} s of it Ray's start)")
        start_cpu = {n: cpu_seconds(p) - before[n] for n, p in components.items()}
        start_requests = per_node(requests, api_requests(state), args.nodes)
        head = ray_head_pid(state)
        start_cpu["emulation"] = sum(cpu_seconds(p) for p in processes_matching("ray::NodeHost", head))
        idle = idle_cpu(sorted(descendants(head)), args.idle_seconds)  # the NodeHosts and Ray itself
        requests = api_requests(state)
        report = run_workload(state, scenario, fleet.metrics_texts, keep)
        workload_requests = per_node(requests, api_requests(state), pods_run(scenario))
    finally:
        try:
            fleet.stop(remove_nodes=True)
        except Exception as exc:  # Ray is stopped all the same: the next side needs the machine
            print(f"removing the testbed's nodes failed ({type(exc).__name__}: {exc}); stopping Ray anyway", flush=True)
        raycluster.disconnect()
        for record in [r for r in state.processes if r.name == "ray"]:
            raycluster.stop_head(record, state.root)
            state.processes.remove(record)
        state.fleet = None
        state.save()
    return SideFigures(ready_s, idle, start_cpu, start_requests, workload_requests, report, ray_s)


REQUESTS = "apiserver_request_total"
SCRAPE_PATIENCE_S = 300.0


def api_requests(state: cluster.ClusterState) -> dict[str, float]:
    """The API server's requests so far, by verb and resource ("POST nodes"); every
    client's, this benchmark's own reads included."""

    async def read(client: KubeClient) -> str:
        # Right after 5,000 nodes start, the API server can take longer than a scrape's
        # usual 10 s even to accept the connection.
        async with asyncio.timeout(SCRAPE_PATIENCE_S):
            return await until_answered(lambda: client.get_text("/metrics", timeout_s=60.0), "reading /metrics")

    scrape = Scrape.parse(run_coroutine(_with_client(state, read)), (REQUESTS,))
    counts: dict[str, float] = {}
    for labels, value in scrape.samples.get(REQUESTS, {}).items():
        named = dict(labels)
        resource = "/".join(filter(None, (named.get("resource", ""), named.get("subresource", ""))))
        key = f"{named.get('verb', '?')} {resource or named.get('component', '?')}"
        counts[key] = counts.get(key, 0.0) + value
    return counts


def per_node(before: dict[str, float], after: dict[str, float], nodes: int) -> dict[str, float]:
    """Requests between two readings, per node (or per pod: any divisor)."""
    return {key: (value - before.get(key, 0.0)) / nodes for key, value in after.items() if value > before.get(key, 0.0)}


def pods_run(scenario: spec.Scenario) -> int:
    return sum(phase.jobs or 0 for phase in scenario.phases)


async def _with_client(state: cluster.ClusterState, work: Callable[[KubeClient], Awaitable[T]]) -> T:
    client = KubeClient.from_kubeconfig(state.kubeconfig)
    try:
        return await work(client)
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--qps", type=float, default=20.0)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--nodes-per-host", type=int, default=DEFAULT_NODES_PER_HOST)
    parser.add_argument("--runs", type=int, default=3, help="runs of both sides, the first side alternating")
    parser.add_argument(
        "--identities",
        choices=("per-node", "shared"),
        default="per-node",
        help="the testbed's nodes under identities of their own (as real nodes), or the fleet's (as KWOK's)",
    )
    parser.add_argument("--reports", type=Path, help="keep each side's run report under this directory")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    kwok_binary()  # built before anything starts
    scratch = Path(tempfile.mkdtemp(prefix="tbp-"))
    config = ControlPlaneConfig.from_env(name="bench-peers", state_dir=scratch / "c")
    state = cluster.up(config)
    runs: list[dict[str, SideFigures]] = []
    try:
        install_device_classes(state.kubeconfig)
        scenario = workload(args.pods, args.qps)
        sides = {"KWOK": kwok_side, "testbed": testbed_side}
        for index in range(args.runs):
            order = list(sides) if index % 2 == 0 else list(reversed(sides))
            print(f"run {index + 1} of {args.runs}: {order[0]} first", flush=True)
            figures = {}
            for name in order:
                keep = args.reports / f"run{index + 1}" / name.lower() if args.reports else None
                figures[name] = sides[name](state, args, scenario, keep)
            runs.append(figures)
            print_run(args, figures)
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        from testbed import environment

        environment.down(config)
        shutil.rmtree(scratch, ignore_errors=True)
    if len(runs) > 1:
        print_medians(args, runs)
    return 0


Row = tuple[str, float | None, float | None, str]
"""measure, KWOK, testbed, target (testbed/KWOK)."""


def rows(args: argparse.Namespace, kwok: SideFigures, bed: SideFigures) -> list[Row]:
    def phase(side: SideFigures, name: str) -> dict[str, Any]:
        return next(p for p in side.report["phases"] if p["name"] == name)

    table: list[Row] = [
        (f"{args.nodes} gpu8 nodes Ready with slices, s", kwok.ready_s, bed.ready_s, "<= 1.3x"),
        ("  the same, the emulator's process(es) up, s", kwok.ready_s, _less(bed.ready_s, bed.runtime_start_s), ""),
        (
            "idle emulation CPU per 100 nodes, cores",
            kwok.idle_cores * 100 / args.nodes,
            bed.idle_cores * 100 / args.nodes,
            "<= 2x",
        ),
    ]
    for name, target in (("no-claim", "<= 1.1x"), ("gpu-claim", "<= 1.2x")):
        first, second = phase(kwok, name), phase(bed, name)
        table += [
            (f"{name}: startup p50, s", first["pod_startup_s"]["p50"], second["pod_startup_s"]["p50"], target),
            (f"{name}: startup p99, s", first["pod_startup_s"]["p99"], second["pod_startup_s"]["p99"], ""),
            (f"{name}: pods/s", first["pods_per_s"], second["pods_per_s"], ">= 0.9x"),
        ]
    return table


def _less(total: float, part: float | None) -> float | None:
    return None if part is None else total - part


def _ratio(kwok: float | None, bed: float | None) -> float | None:
    return bed / kwok if kwok and bed else None


def _shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def print_rows(title: str, table: list[tuple[str, float | None, float | None, float | None, str]]) -> None:
    print(f"\n{title}")
    print(f"  {'measure':<44}{'KWOK':>10}{'testbed':>10}{'ratio':>8}  target (testbed/KWOK)")
    for label, kwok, bed, ratio, target in table:
        shown_ratio = "n/a" if ratio is None else f"{ratio:.2f}x"
        print(f"  {label:<44}{_shown(kwok):>10}{_shown(bed):>10}{shown_ratio:>8}  {target}")


def print_run(args: argparse.Namespace, figures: dict[str, SideFigures]) -> None:
    measured = rows(args, figures["KWOK"], figures["testbed"])
    table = [(label, kwok, bed, _ratio(kwok, bed), target) for label, kwok, bed, target in measured]
    print_rows(
        f"peers benchmark: {args.nodes} nodes ({args.identities} identities on the testbed's), "
        f"{args.pods} pods per phase at {args.qps:g}/s, {os.cpu_count()} cores",
        table,
    )
    for side_name, side in figures.items():
        cpu = ", ".join(f"{n} {s:.1f}" for n, s in sorted(side.start_cpu.items(), key=lambda kv: -kv[1]))
        print(f"  {side_name} start-up CPU-seconds: {cpu}")
        for what, requests in (
            ("start-up API requests per node", side.start_requests),
            ("workload API requests per pod", side.workload_requests),
        ):
            asked = sorted(requests.items(), key=lambda kv: -kv[1])
            shown = ", ".join(f"{key} {count:.2f}" for key, count in asked if count >= 0.05)
            print(f"  {side_name} {what}: {shown}")
        for p in side.report["phases"]:
            spent = p.get("breakdown", {}).get("cpu_seconds", {})
            listed = ", ".join(f"{n} {s:g}" for n, s in spent.items() if s is not None)
            print(f"  {side_name} {p['name']} CPU-seconds: {listed}")


def print_medians(args: argparse.Namespace, runs: list[dict[str, SideFigures]]) -> None:
    """Each ratio is taken within a run (both sides met the same moment of the machine),
    then the median over the runs; the figures beside it are each side's medians."""
    tables = [rows(args, figures["KWOK"], figures["testbed"]) for figures in runs]

    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    table = []
    for position, (label, _, _, target) in enumerate(tables[0]):
        column = [t[position] for t in tables]
        table.append(
            (
                label,
                median([r[1] for r in column]),
                median([r[2] for r in column]),
                median([_ratio(r[1], r[2]) for r in column]),
                target,
            )
        )
    print_rows(f"medians of {len(runs)} runs (ratios within each run, then their median):", table)


if __name__ == "__main__":
    sys.exit(run_interruptibly(main))
