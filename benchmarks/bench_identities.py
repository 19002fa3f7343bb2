"""What node identities cost per node, and who pays it: one NodeHost in this process
starts N gpu8 nodes under per-node identities, then N under shared credentials, a few
rounds interleaved, on one control plane. CPU-seconds per node of this process and of
each control-plane component (read from /proc, so the figures do not depend on how busy
the machine is; wall times do, and are printed beside them).

    python benchmarks/bench_identities.py [--nodes 200] [--rounds 3]

Per-node identities add, per node: a client certificate and TLS context for the kubelet
and its own connections; a driver pod, a token bound to it, and the kubelet's status
write that marks the pod Running. bench_fleet.py times the whole fleet both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_fleet import cpu_seconds, processes_matching

from testbed.config import ControlPlaneConfig
from testbed.controlplane import cluster
from testbed.environment import install_device_classes
from testbed.errors import run_coroutine, run_interruptibly
from testbed.fleet.identity import NodeAuthority, install_access_policy
from testbed.fleet.membership import NodeRecipe
from testbed.fleet.nodehost import NodeHost
from testbed.kubeapi import KubeClient

MODES = ("per-node", "shared")
SIDES = ("NodeHost", "kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")


def control_plane_cpu(state: cluster.ClusterState) -> dict[str, float]:
    return {record.name: cpu_seconds(record.pid) for record in state.processes}


async def one_round(state: cluster.ClusterState, scratch: Path, mode: str, nodes: int, tag: str) -> dict[str, float]:
    """Start ``nodes`` nodes in ``mode``; CPU-seconds per side and the wall time. The
    nodes are removed afterwards (not counted)."""
    authority = NodeAuthority.for_cluster(state.kubeconfig) if mode == "per-node" else None
    names = [f"id{tag}-{i:04d}" for i in range(nodes)]
    host = NodeHost(
        str(state.kubeconfig), str(scratch / tag), [NodeRecipe(n, "gpu8") for n in names], authority=authority
    )
    before, host_before, started = control_plane_cpu(state), time.process_time(), time.monotonic()
    await host.start()
    figures = {"wall": time.monotonic() - started, "NodeHost": time.process_time() - host_before}
    figures.update({name: cpu - before.get(name, 0.0) for name, cpu in control_plane_cpu(state).items()})
    await host.remove_nodes(names)
    await host.stop()
    return figures


Results = dict[str, list[dict[str, float]]]


async def measure(state: cluster.ClusterState, scratch: Path, nodes: int, rounds: int) -> Results:
    admin = KubeClient.from_kubeconfig(state.kubeconfig)
    try:
        await install_access_policy(admin)
    finally:
        await admin.close()
    await asyncio.to_thread(install_device_classes, state.kubeconfig)
    results: Results = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else reversed(MODES):
            figures = await one_round(state, scratch, mode, nodes, f"{r}{mode[0]}")
            results[mode].append(figures)
            print(
                f"  round {r + 1} {mode:8s}: {figures['wall']:.1f} s, CPU ms per node "
                + ", ".join(f"{side} {figures.get(side, 0.0) / nodes * 1000:.1f}" for side in SIDES),
                flush=True,
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if processes_matching("ray::NodeHost"):
        print("note: NodeHosts of another fleet are running; the control plane here is this benchmark's own")
    scratch = Path(tempfile.mkdtemp(prefix="tbi-"))
    config = ControlPlaneConfig.from_env(name="bench-identities", state_dir=scratch / "c")
    state = cluster.up(config)
    try:
        print(f"identity cost: {args.nodes} gpu8 nodes per round, {args.rounds} rounds of each mode, one NodeHost")
        results = run_coroutine(measure(state, scratch / "nodes", args.nodes, args.rounds))
    finally:
        cluster.down(config)
        shutil.rmtree(scratch, ignore_errors=True)

    def median_ms(mode: str, side: str) -> float:
        return float(statistics.median(r.get(side, 0.0) for r in results[mode])) / int(args.nodes) * 1000

    totals = {mode: sum(median_ms(mode, side) for side in SIDES) for mode in MODES}
    labels = ("NodeHost", "apiserver", "etcd", "KCM", "scheduler", "total")
    print(f"  {'CPU ms per node (medians)':28s}" + "".join(f"{label:>10s}" for label in labels))
    for mode in MODES:
        row = [median_ms(mode, side) for side in SIDES] + [totals[mode]]
        print(f"  {mode:28s}" + "".join(f"{v:10.1f}" for v in row))
    extra = [median_ms("per-node", side) - median_ms("shared", side) for side in SIDES]
    print(f"  {'identities add':28s}" + "".join(f"{v:+10.1f}" for v in [*extra, sum(extra)]))
    walls = {mode: statistics.median(r["wall"] for r in results[mode]) for mode in MODES}
    print(
        f"  identities: {sum(extra) / totals['per-node']:.0%} of the CPU a per-node start costs "
        f"({sum(extra[1:]) / sum(extra):.0%} of it in the control plane); "
        f"wall {walls['per-node']:.1f} s against {walls['shared']:.1f} s shared "
        f"({walls['per-node'] / walls['shared']:.2f}x, medians)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_interruptibly(main))
