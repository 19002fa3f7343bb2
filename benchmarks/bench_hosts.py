"""A fleet on one Ray host and on two: nodes/s, and where the CPU goes, per host and per
component. The hosts are namespaces on this machine (testbed/twohosts.py; needs root),
so they share its cores: the figures show what a second host costs and what each piece
of the fleet costs per node, which is what the capacity model in docs/benchmarks.md is built on.

    python benchmarks/bench_hosts.py [--nodes 500] [--profile gpu8] [--nodes-per-host 50] [--idle-s 20]

Each layout: `testbed up` with an empty pool, then `testbed scale` to N nodes, timed
(nodes Ready with slices published); then the fleet idles for --idle-s seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench_fleet import cpu_seconds, rss_mb

from testbed import twohosts
from testbed.errors import run_interruptibly

CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")


def _component(pid: int, host: str) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    command = b" ".join(argv).decode(errors="replace")
    name = Path(argv[0].decode(errors="replace")).name
    if name in CONTROL_PLANE:
        return name
    if "ray::NodeHost" in command:
        return f"NodeHosts on {host} host"
    if "testbed.cli" in command:
        return None  # the command being timed, not the fleet
    return f"Ray on {host} host"


def _sample(hosts: twohosts.TwoHosts) -> dict[int, tuple[str, float]]:
    found = {}
    for host in ("first", "second"):
        for pid in hosts.pids(host):
            component = _component(pid, host)
            if component is not None:
                found[pid] = (component, cpu_seconds(pid))
    return found


def _spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    spent: dict[str, float] = {}
    for pid, (component, cpu) in after.items():
        spent[component] = spent.get(component, 0.0) + cpu - before.get(pid, (component, 0.0))[1]
    return spent


def _run(hosts: twohosts.TwoHosts, layout: str, args: argparse.Namespace, scratch: Path) -> dict[str, object]:
    placement = "{labels: {dra-testbed.io/host: first}}" if layout == "one host" else "{strategy: SPREAD}"
    fleet = scratch / f"fleet-{layout.replace(' ', '-')}.yaml"
    fleet.write_text(
        f"ray: {{address: '{hosts.ray_address}'}}\nnodesPerHost: {args.nodes_per_host}\n"
        f"pools: [{{name: b, count: 0, profile: {args.profile}, placement: {placement}}}]\n"
    )
    cluster = f"bench-{layout.split()[0]}"
    hosts.testbed(cluster, "up", "--fleet", str(fleet), "--advertise-address", hosts.first_ip)
    try:
        before = _sample(hosts)
        started = time.monotonic()
        hosts.testbed(cluster, "scale", "b", str(args.nodes))
        elapsed = time.monotonic() - started
        start_cpu = _spent(before, _sample(hosts))
        idle_from = _sample(hosts)
        time.sleep(args.idle_s)  # the fleet idling is what is measured
        idle = {k: v / args.idle_s for k, v in _spent(idle_from, _sample(hosts)).items()}
        nodehosts = [pid for pid, (component, _) in _sample(hosts).items() if component.startswith("NodeHosts")]
        rss = rss_mb(nodehosts)
    finally:
        hosts.testbed(cluster, "down")
    return {"elapsed": elapsed, "start": start_cpu, "idle": idle, "rss": rss, "nodehosts": len(nodehosts)}


def _listed(figures: dict[str, float], scale: float, form: str) -> str:
    ranked = sorted(figures.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {value * scale:{form}}" for name, value in ranked)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--profile", default="gpu8")
    parser.add_argument("--nodes-per-host", type=int, default=50)
    parser.add_argument("--idle-s", type=float, default=20.0)
    args = parser.parse_args()
    why = twohosts.why_not()
    if why:
        print(f"bench_hosts: skipped ({why})")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="tbh-"))
    results = {}
    try:
        with twohosts.two_hosts(scratch) as hosts:
            for layout in ("one host", "two hosts"):
                results[layout] = _run(hosts, layout, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"\nhosts benchmark: {args.nodes} x {args.profile}, {args.nodes_per_host} nodes per NodeHost, "
        f"{os.cpu_count()} cores shared by both hosts"
    )
    for layout, result in results.items():
        elapsed = float(result["elapsed"])  # type: ignore[arg-type]
        start: dict[str, float] = result["start"]  # type: ignore[assignment]
        idle: dict[str, float] = result["idle"]  # type: ignore[assignment]
        rate = args.nodes / elapsed
        print(f"  {layout}: {args.nodes} nodes Ready with slices in {elapsed:.1f} s ({rate:.1f} nodes/s)")
        print(f"    CPU-s to start them: {_listed(start, 1, '.1f')}")
        print(f"    CPU-ms per node started: {_listed(start, 1000 / args.nodes, '.0f')}")
        print(f"    idle, cores: {_listed(idle, 1, '.3f')}")
        rss = float(result["rss"])  # type: ignore[arg-type]
        print(
            f"    NodeHost memory: {rss:.0f} MB in {result['nodehosts']} processes, "
            f"{rss / args.nodes:.2f} MB per node with the NodeHosts' own base"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_interruptibly(main))
