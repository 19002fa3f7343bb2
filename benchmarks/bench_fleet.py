"""Fleet scale: N synthetic nodes up (all Ready, all slices published), and their memory.

    python benchmarks/bench_fleet.py [--nodes 1000] [--profile h100x8] [--nodes-per-host 50]
                                     [--identities per-node|shared] [--external-driver]

--external-driver runs the GPU driver as a process per node from its command (as a
driver developer's own driver runs), to compare its cost with the built-in one.

Memory per node is the NodeHost actors' total RSS, less what the same number of empty
NodeHosts take, divided by N (targets: <= 60 s for 1,000 h100x8 nodes; <= 2 MB per node
beyond the Ray base). CPU seconds per component show what the start-up was waiting on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray

from testbed.config import ControlPlaneConfig
from testbed.controlplane import cluster
from testbed.controlplane.processes import descendants
from testbed.environment import install_device_classes, start_fleet
from testbed.errors import TestbedError, run_interruptibly
from testbed.fleet.nodehost import NodeHost
from testbed.fleet.spec import single_pool
from testbed.progress import ConsoleProgress

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def processes_matching(fragment: str, within: int | None = None) -> list[int]:
    """Processes whose command line holds ``fragment``; with ``within``, only that
    process and its descendants (this benchmark's Ray, not another one on the machine)."""
    scope = descendants(within) if within is not None else None
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (scope is None or int(entry.name) in scope):
            try:
                if fragment in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def ray_head_pid(state: cluster.ClusterState) -> int:
    """The `ray start` process of the Ray this benchmark started: every Ray process of
    its own (NodeHosts included) descends from it."""
    return next(r.pid for r in state.processes if r.name == "ray")


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def ready_nodes(state: cluster.ClusterState) -> int:
    from kubernetes import client as k8s

    from testbed.kube import api_client

    api = api_client(state.kubeconfig)
    try:
        nodes = k8s.CoreV1Api(api).list_node(label_selector="dra-testbed.io/synthetic=true", _request_timeout=60).items
    except Exception:
        return -1
    finally:
        api.close()
    return sum(1 for n in nodes for c in (n.status.conditions or []) if c.type == "Ready" and c.status == "True")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--profile", default="h100x8")
    parser.add_argument("--nodes-per-host", type=int, default=50)
    parser.add_argument(
        "--identities", choices=["per-node", "shared"], default="per-node", help="run the two to see their cost"
    )
    parser.add_argument(
        "--external-driver",
        action="store_true",
        help="the GPU driver as a process per node (testbed-driver from its command) instead of built in",
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tbf-"))
    config = ControlPlaneConfig.from_env(name="bench-fleet", state_dir=scratch / "c")
    state = cluster.up(config)
    try:
        install_device_classes(state.kubeconfig)
        components = {r.name: r.pid for r in state.processes}
        cpu_before = {name: cpu_seconds(pid) for name, pid in components.items()}
        started = time.monotonic()
        try:
            drivers = None
            if args.external_driver:
                gpu = "gpu.dra-testbed.io"
                env = {"DRIVERS": gpu, "HARDWARE_PROFILE": args.profile, "HEALTH_PORT": "-1", "METRICS_PORT": "-1"}
                drivers = ["nic", {"name": gpu, "command": [sys.executable, "-m", "testbed.drivers.main"], "env": env}]
            spec = single_pool(args.nodes, args.profile, args.nodes_per_host, drivers=drivers)
            fleet = start_fleet(state, spec.model_copy(update={"identities": args.identities}), ConsoleProgress())
        except TestbedError as exc:
            # Where it breaks is a figure too: how far it got, and what gave.
            elapsed = time.monotonic() - started
            ready = ready_nodes(state)
            print(
                f"\nfleet benchmark: {args.nodes} x {args.profile} did NOT come up: {ready} nodes Ready after "
                f"{elapsed:.0f} s ({exc.message}; {str(exc.detail or '').strip().splitlines()[-1:]})"
            )
            return 1
        elapsed = time.monotonic() - started
        cpu = {name: cpu_seconds(pid) - cpu_before.get(name, 0.0) for name, pid in components.items()}
        head = ray_head_pid(state)
        hosts = processes_matching("ray::NodeHost", head)
        cpu["NodeHosts"] = sum(cpu_seconds(pid) for pid in hosts)  # they began with the fleet
        drivers_pids = processes_matching("testbed.drivers.main")  # may outlive their NodeHost: not under Ray
        if drivers_pids:
            cpu["external drivers"] = sum(cpu_seconds(pid) for pid in drivers_pids)
        hosts_rss = rss_mb(hosts)
        empty = [
            ray.remote(NodeHost).options(num_cpus=0).remote(str(state.kubeconfig), str(scratch), [])
            for _ in fleet.hosts
        ]
        ray.get([e.metrics_port.remote() for e in empty])  # wait until they exist
        empty_rss = rss_mb(processes_matching("ray::NodeHost", head)) - hosts_rss
        ray_base = rss_mb(processes_matching("ray", head)) - hosts_rss - empty_rss
        per_node = (hosts_rss - empty_rss) / args.nodes
        print(
            f"\nfleet benchmark: {args.nodes} x {args.profile}, {len(fleet.hosts)} NodeHosts "
            f"({args.nodes_per_host} nodes each), identities {args.identities}, "
            f"GPU driver {'external (a process per node)' if args.external_driver else 'built in'}, "
            f"{os.cpu_count()} cores"
        )
        print(
            f"  all nodes Ready and slices published in {elapsed:.1f} s "
            f"({args.nodes / elapsed:.1f} nodes/s); target for 1,000 h100x8: <= 60 s"
        )
        print(
            f"  NodeHost RSS {hosts_rss:.0f} MB; the same number of empty NodeHosts {empty_rss:.0f} MB; "
            f"other Ray processes {ray_base:.0f} MB"
        )
        print(f"  memory per synthetic node beyond the Ray base: {per_node:.2f} MB (target <= 2 MB)")
        if drivers_pids:
            driver_rss = rss_mb(drivers_pids)
            print(
                f"  external driver processes: {len(drivers_pids)}, RSS {driver_rss:.0f} MB "
                f"({driver_rss / len(drivers_pids):.1f} MB each)"
            )
        busiest = sorted(cpu.items(), key=lambda kv: -kv[1])
        print(
            "  CPU seconds during start-up: "
            + ", ".join(f"{n} {s:.1f}" for n, s in busiest)
            + f"; {sum(cpu.values()) / elapsed:.2f} of {os.cpu_count()} cores busy on average"
        )
        for actor in empty:
            ray.kill(actor)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        from testbed import environment

        environment.down(config)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_interruptibly(main))
