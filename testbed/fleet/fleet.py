"""A fleet of synthetic nodes spread over NodeHost actors in a Ray cluster."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.fleet.nodehost import NodeHost, NodeRecipe
from testbed.fleet.spec import FleetFile
from testbed.progress import Progress, SilentProgress

FLEET_START_CONCURRENCY = 24
"""Synthetic nodes started at once across all hosts: on 2 cores more makes etcd time out."""


class Fleet:
    def __init__(self, spec: FleetFile, kubeconfig: Path, nodes_dir: Path, detached: bool = False):
        """``nodes_dir``: where each node's directory tree (and sockets) goes."""
        self.spec = spec
        self.kubeconfig = kubeconfig
        self.nodes_dir = nodes_dir
        self.detached = detached
        self.hosts: list[Any] = []
        self.host_of: dict[str, Any] = {}
        self.id = uuid.uuid4().hex[:6]
        """Several fleets can share one Ray; actor names carry this."""

    def start(self, progress: Progress | None = None, timeout_s: float = 900.0) -> None:
        import ray

        progress = progress or SilentProgress()
        actor = ray.remote(NodeHost)
        # max_restarts: a NodeHost that dies is started again by Ray with the same nodes.
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 10000, "max_restarts": -1}
        if self.detached:
            options["lifetime"] = "detached"
        nodes = [
            NodeRecipe(name, pool.profile, dict(pool.labels), [t.model_dump() for t in pool.taints])
            for pool in self.spec.pools
            for name in pool.node_names()
        ]
        names = [n.name for n in nodes]
        size = self.spec.nodes_per_host
        for index, start in enumerate(range(0, len(nodes), size)):
            group = nodes[start : start + size]
            host = actor.options(name=f"nodehost-{self.id}-{index}", **options).remote(
                str(self.kubeconfig), str(self.nodes_dir), group, self.spec.seed
            )
            self.hosts.append(host)
            self.host_of.update(dict.fromkeys((n.name for n in group), host))
        # Total start concurrency is what the control plane can absorb, not per host.
        concurrency = max(1, FLEET_START_CONCURRENCY // max(1, len(self.hosts)))
        pending = {host.start.remote(timeout_s, concurrency): host for host in self.hosts}
        ready = 0
        deadline = time.monotonic() + timeout_s
        with progress.task(f"starting {len(names)} synthetic nodes on {len(self.hosts)} NodeHost actors"):
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in done:
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        raise TestbedError("a NodeHost failed to start its nodes", detail=str(exc)) from exc
                    pending.pop(ref)
                if time.monotonic() > deadline:
                    raise TestbedError(f"synthetic nodes not ready within {timeout_s:.0f}s")
                counts = ray.get([host.progress.remote() for host in self.hosts])
                ready = sum(counts)
                progress.update(f"{ready}/{len(names)} nodes ready")
            ready = sum(ray.get([host.progress.remote() for host in self.hosts]))
        pools = ", ".join(f"{p.name}: {p.count} x {p.profile}" for p in self.spec.pools)
        progress.step(f"{ready} synthetic nodes ({pools}) ready and publishing slices")

    def metrics_urls(self) -> list[str]:
        import ray

        ports = ray.get([host.metrics_port.remote() for host in self.hosts])
        return [f"http://127.0.0.1:{port}/metrics" for port in ports]

    def host(self, node: str) -> Any:
        return self.host_of[node]

    def stop(self) -> None:
        import ray

        if self.hosts:
            ray.get([host.stop.remote() for host in self.hosts], timeout=60)
            for host in self.hosts:
                ray.kill(host)
        self.hosts.clear()
        self.host_of.clear()
