"""A fleet of synthetic nodes spread over NodeHost actors in a Ray cluster."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.fleet.nodehost import NodeHost
from testbed.progress import Progress, SilentProgress

DEFAULT_NODES_PER_HOST = 50


@dataclass(frozen=True)
class FleetSpec:
    count: int
    profile: str
    name_prefix: str = "node"
    nodes_per_host: int = DEFAULT_NODES_PER_HOST
    seed: int = 0

    def node_names(self) -> list[str]:
        width = max(3, len(str(self.count - 1)))
        return [f"{self.name_prefix}-{i:0{width}d}" for i in range(self.count)]


class Fleet:
    def __init__(self, spec: FleetSpec, kubeconfig: Path, nodes_dir: Path, detached: bool = False):
        """``nodes_dir``: where each node's directory tree (and sockets) goes."""
        self.spec = spec
        self.kubeconfig = kubeconfig
        self.nodes_dir = nodes_dir
        self.detached = detached
        self.hosts: list[Any] = []
        self.host_of: dict[str, Any] = {}

    def start(self, progress: Progress | None = None, timeout_s: float = 300.0) -> None:
        import ray

        progress = progress or SilentProgress()
        actor = ray.remote(NodeHost)
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 10000}
        if self.detached:
            options["lifetime"] = "detached"
        names = self.spec.node_names()
        size = self.spec.nodes_per_host
        groups = [names[i : i + size] for i in range(0, len(names), size)]
        for index, group in enumerate(groups):
            host = actor.options(name=f"nodehost-{index}", **options).remote(
                str(self.kubeconfig),
                str(self.nodes_dir),
                [(n, self.spec.profile) for n in group],
                self.spec.seed,
            )
            self.hosts.append(host)
            self.host_of.update(dict.fromkeys(group, host))
        pending = {host.start.remote(timeout_s): host for host in self.hosts}
        ready = 0
        with progress.task(f"starting {len(names)} synthetic nodes on {len(self.hosts)} NodeHost actors"):
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s)
                if not done:
                    raise TestbedError(f"synthetic nodes not ready within {timeout_s:.0f}s")
                try:
                    ready += len(ray.get(done[0]))
                except ray.exceptions.RayError as exc:
                    raise TestbedError("a NodeHost failed to start its nodes", detail=str(exc)) from exc
                pending.pop(done[0])
                progress.update(f"{ready}/{len(names)} nodes ready")
        progress.step(f"{ready} synthetic nodes ({self.spec.profile}) ready and publishing slices")

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
