"""The CPU of the processes a NodeHost runs beside itself: command-line drivers, and the
kubelet, runtime and driver of real-kubelet nodes.

The host's own ``process_cpu_seconds_total`` counts the host alone, so a run whose nodes
run your driver as processes would show the emulation's cost without the driver's. Each
is counted here under a label of what it is (``driver gpu.example.com``, ``real kubelet``),
summed over the host's nodes, as ``dra_testbed_node_process_cpu_seconds_total``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from testbed.controlplane import processes

METRIC = "dra_testbed_node_process_cpu_seconds"


class RunsProcesses(Protocol):
    def cpu_processes(self) -> Iterable[tuple[str, int]]:
        """(label, PID) of each process it runs now."""
        ...


class ProcessCpu(Collector):
    """Read when scraped: each process's CPU (its children's included) from /proc. A
    process that ended keeps what it was last read at (its last moments are lost)."""

    def __init__(self) -> None:
        self.owners: weakref.WeakSet[RunsProcesses] = weakref.WeakSet()
        self.seen: dict[tuple[str, int], float] = {}

    def watch(self, owner: RunsProcesses) -> None:
        self.owners.add(owner)

    def collect(self) -> Iterator[CounterMetricFamily]:
        running = [entry for owner in list(self.owners) for entry in owner.cpu_processes()]
        if running:
            used = processes.tree_cpu_seconds([pid for _, pid in running])
            for label, pid in running:
                if pid in used:
                    self.seen[(label, pid)] = used[pid]
        totals: dict[str, float] = {}
        for (label, _), seconds in self.seen.items():
            totals[label] = totals.get(label, 0.0) + seconds
        family = CounterMetricFamily(
            METRIC, "CPU-seconds of the processes run beside the NodeHost, by what they are", labels=["process"]
        )
        for label, seconds in sorted(totals.items()):
            family.add_metric([label], seconds)
        yield family


PROCESS_CPU = ProcessCpu()
REGISTRY.register(PROCESS_CPU)
