"""Real kubelet v1.37 against the fake kubelet, same driver, same control plane.

    python benchmarks/bench_kubelets.py [--pods N]

One real-kubelet node and one fake-kubelet node (gpu8 profile, ``testbed-driver`` as its
own process on both) on a fresh local control plane. Pods with a GPU claim are created
on both nodes at once, four at a time per node; each pod's created -> Running is read
from the pod itself (``status.conditions[Ready].lastTransitionTime`` has one-second
resolution, so the wall time of the poll that first saw Running is used). Prints p50
and p99 side by side, their ratio, each kubelet's own PrepareResources/UnprepareResources
and gRPC call times from its /metrics (counts and means), and the resident memory of the
real node's processes. Needs root; says why and exits 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from testbed.config import ControlPlaneConfig
from testbed.controlplane import cluster
from testbed.controlplane.binaries import ensure_node_binaries
from testbed.environment import install_device_classes
from testbed.errors import run_coroutine, run_interruptibly
from testbed.kubeapi import KubeClient, Obj, path_for
from testbed.kubelet.node import SYNTHETIC_TOLERATION, NodeSpec
from testbed.progress import ConsoleProgress
from testbed.realnode.node import KUBELET_KINDS, ProcessNode, unsupported_reason
from testbed.report.metrics import Scrape
from testbed.report.reference import FIGURES

GPU = "gpu.dra-testbed.io"
BATCH = 4


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def pod(name: str, node: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [SYNTHETIC_TOLERATION],
            "terminationGracePeriodSeconds": 1,  # 0 deletes at once: a device could be reused before unprepare
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/bench:v1",  # tagged: pulled once, as a load test's
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


async def startup_times(client: KubeClient, node: ProcessNode, namespace: str, count: int) -> list[float]:
    times: list[float] = []
    for start in range(0, count, BATCH):
        names = [f"p-{i}" for i in range(start, min(count, start + BATCH))]
        created = {}
        for name in names:
            created[name] = time.monotonic()
            await client.create(path_for("v1", "pods", namespace=namespace), pod(name, node.name))
        waiting = set(names)
        while waiting:
            for name in sorted(waiting):
                body = await client.get(path_for("v1", "pods", name, namespace))
                if body.get("status", {}).get("phase") == "Running":
                    times.append(time.monotonic() - created[name])
                    waiting.discard(name)
            await asyncio.sleep(0.02)
        for name in names:
            await client.delete(path_for("v1", "pods", name, namespace))
        for name in names:
            while True:
                try:
                    await client.get(path_for("v1", "pods", name, namespace))
                except Exception:
                    break
                await asyncio.sleep(0.05)
    return times


async def measure(state: cluster.ClusterState, root: Path, pods: int) -> None:
    client = KubeClient.from_kubeconfig(state.kubeconfig)
    binaries = ensure_node_binaries()
    nodes = {
        kind: ProcessNode(NodeSpec(f"bench-{kind}"), "gpu8", [GPU], root / kind, state.kubeconfig, binaries, kind)
        for kind in KUBELET_KINDS
    }
    try:
        for kind, node in nodes.items():
            namespace = f"bench-{kind}"
            await client.create(path_for("v1", "namespaces"), {"metadata": {"name": namespace}})
            template = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpu"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}}},
            }
            await client.create(path_for("resource.k8s.io/v1", "resourceclaimtemplates", namespace=namespace), template)
            await node.start()
        await asyncio.gather(*(node.wait_ready(120, client) for node in nodes.values()))
        results = await asyncio.gather(
            *(startup_times(client, node, f"bench-{kind}", pods) for kind, node in nodes.items())
        )
        figures = dict(zip(nodes, results, strict=True))
        memory = nodes["real"].memory_bytes()
        scrapes = {kind: Scrape.parse(await node.kubelet_metrics()) for kind, node in nodes.items()}
    finally:
        for node in nodes.values():
            await node.stop()
        await client.close()
    print(f"\npod with a GPU claim, created -> Running, {pods} pods per node, {BATCH} at a time per node:")
    print(f"{'':14}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for kind, times in figures.items():
        ms = [t * 1000 for t in times]
        print(
            f"{kind + ' kubelet':14}{percentile(ms, 0.5):10.0f}{percentile(ms, 0.99):10.0f}{statistics.mean(ms):10.0f}"
        )
    ratio = percentile(figures["fake"], 0.5) / percentile(figures["real"], 0.5)
    print(f"fake/real p50 ratio: {ratio:.2f}")
    print_kubelet_figures(scrapes)
    total = sum(memory.values())
    parts = ", ".join(f"{k} {v / 2**20:.0f} MB" for k, v in sorted(memory.items()))
    print(f"real-kubelet node resident memory: {total / 2**20:.0f} MB ({parts})")


def print_kubelet_figures(scrapes: dict[str, Scrape]) -> None:
    """Each kubelet's own histograms from its /metrics. The real kubelet's buckets start
    at 0.1 s, so only counts and means compare."""
    print("\nas each kubelet times them (its /metrics, whole run): count, mean ms")
    print(f"{'':24}" + "".join(f"{kind + ' kubelet':>24}" for kind in scrapes) + f"{'fake/real':>11}")
    for label, name, match in FIGURES:
        means = {}
        cells = ""
        for kind, scrape in scrapes.items():
            count = scrape.value(f"{name}_count", match)
            means[kind] = scrape.value(f"{name}_sum", match) / count * 1000 if count else float("nan")
            cells += f"{f'{count:.0f}, {means[kind]:.1f}':>24}"
        print(f"{label:24}{cells}{means['fake'] / means['real']:>10.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=40)
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason:
        print(f"bench_kubelets: skipped: {reason}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="tbk-"))
    config = ControlPlaneConfig(name="bench-kubelets", state_dir=root / "cluster")
    state = cluster.up(config, ConsoleProgress())
    try:
        install_device_classes(state.kubeconfig)
        run_coroutine(measure(state, root / "nodes", args.pods))
    finally:
        cluster.down(config)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_interruptibly(main))
