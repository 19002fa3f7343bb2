"""Where a phase's time went: the scheduler by extension point and plugin, the API server
by resource and verb, etcd, CPU-seconds per component, and how busy the machine was.

Everything comes from two snapshots, taken when the phase started and when it ended;
each figure is what happened in between (counters and histograms as increases).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.report.metrics import Narrowed, Only, Scrape, by_label, fleet_increase, histogram, increase, label_sets

COMPONENTS = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")
"""The control-plane sources a snapshot scrapes, by the names reports use."""
NODEHOSTS = "nodehosts"
CPU = "process_cpu_seconds_total"
NODE_PROCESSES_CPU = "dra_testbed_node_process_cpu_seconds_total"
"""What the processes beside the NodeHosts used (command-line drivers, real-kubelet nodes'
kubelets, runtimes and drivers), by ``process`` (fleet/processcpu.py): not in the hosts' own."""

RESOURCES = ("resourceclaims", "resourceslices", "pods", "leases")
"""The API calls that matter for DRA: claims, slices, pods (and their binding and
status), and the node leases every kubelet renews."""
DRA_PLUGIN = "DynamicResources"
SCHEDULER = "scheduler_"
BINDING_CONDITIONS = "scheduler_dra_bindingconditions_"
"""How often and how long the scheduler waited in PreBind for devices' binding conditions."""
PLUGIN_SAMPLE_PERCENT = 10
"""The scheduler times plugins in one scheduling cycle in ten (pluginMetricsSamplePercent)."""

_OF_RESOURCES = tuple(f'resource="{resource}"' for resource in RESOURCES)
ONLY: dict[str, Only] = {
    "kube-apiserver": (
        CPU,
        "process_start_time_seconds",
        Narrowed("apiserver_request_duration_seconds", _OF_RESOURCES),
        Narrowed("etcd_request_duration_seconds", _OF_RESOURCES),
    ),
    "etcd": (CPU, "process_start_time_seconds", "etcd_disk_wal_fsync", "etcd_disk_backend_commit"),
    "kube-controller-manager": (CPU, "process_start_time_seconds"),
    "kube-scheduler": (
        CPU,
        "process_start_time_seconds",
        "scheduler_framework_extension_point_duration_seconds",
        "scheduler_plugin_execution_duration_seconds",
        "scheduler_schedule_attempts_total",
        "scheduler_scheduling_attempt_duration_seconds",
        "scheduler_queue_incoming_pods_total",
        "scheduler_pod_scheduling_sli_duration_seconds",
        BINDING_CONDITIONS,
    ),
    NODEHOSTS: (
        CPU,
        "process_start_time_seconds",
        "dra_operations_duration_seconds",
        "dra_testbed_kubelet_claim_link_wait_seconds",
        "dra_testbed_event_loop_lag_seconds",
        NODE_PROCESSES_CPU,
    ),
}
"""What each source's snapshot keeps: parsing a whole API server /metrics takes long
enough to delay the pod watch whose latencies the report measures."""


@dataclass
class Snapshot:
    """What every source said at one moment of a run."""

    t: float
    """Seconds since the run started."""
    components: dict[str, Scrape] = field(default_factory=dict)
    nodehosts: list[Scrape] = field(default_factory=list)
    machine: tuple[float, float] | None = None
    """This machine's (busy, total) CPU time from /proc/stat; None where unreadable."""
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)


def machine_cpu(stat: Path = Path("/proc/stat")) -> tuple[float, float] | None:
    """(busy, total) CPU ticks of all cores since boot: idle and iowait are not busy."""
    try:
        fields = [float(x) for x in stat.read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    total = sum(fields[:8])  # guest time is already in user/nice
    return total - fields[3] - (fields[4] if len(fields) > 4 else 0.0), total


def _cpu(start: Scrape, end: Scrape) -> float | None:
    if start.failed or end.failed or CPU not in end.samples:
        return None
    counted, _, _ = increase(start, end)
    return round(counted.value(CPU, {}), 2)


def _rows(
    counted: Scrape, name: str, labels: tuple[str, ...], keep: Callable[[tuple[str, ...]], bool] = lambda _: True
) -> list[dict[str, Any]]:
    """A histogram split by these labels: one row per combination that counted anything,
    the largest total time first."""
    rows = []
    for key in label_sets(counted, f"{name}_count", labels):
        if keep(key):
            match = dict(zip(labels, key, strict=True))
            rows.append({**match, **histogram(counted, name, match)})
    return sorted((r for r in rows if r["count"]), key=lambda r: -float(r["total_s"]))


def _scheduler(counted: Scrape) -> dict[str, Any]:
    plugins = _rows(counted, "scheduler_plugin_execution_duration_seconds", ("plugin", "extension_point"))
    attempts = by_label(counted, "scheduler_schedule_attempts_total", "result")
    incoming = by_label(counted, "scheduler_queue_incoming_pods_total", "event")
    return {
        "attempts": {result: round(attempts.get(result, 0.0)) for result in ("scheduled", "unschedulable", "error")},
        "attempt_duration": histogram(counted, "scheduler_scheduling_attempt_duration_seconds", {}),
        "sli_duration": histogram(counted, "scheduler_pod_scheduling_sli_duration_seconds", {}),
        "extension_points": _rows(
            counted, "scheduler_framework_extension_point_duration_seconds", ("extension_point",)
        ),
        "plugins": sorted(plugins, key=lambda p: p["plugin"] != DRA_PLUGIN),  # stable: DRA first, then by time
        "plugin_sample_percent": PLUGIN_SAMPLE_PERCENT,
        "incoming": {event: round(n) for event, n in sorted(incoming.items(), key=lambda kv: -kv[1]) if n},
        "binding_conditions": {
            # per claim device and attempt: success, failure (a failure condition), timeout, error
            "outcomes": {
                o: round(n)
                for o, n in sorted(by_label(counted, f"{BINDING_CONDITIONS}allocations_total", "status").items())
                if n
            },
            "wait": histogram(counted, f"{BINDING_CONDITIONS}wait_duration_seconds", {}),
        },
    }


def phase(start: Snapshot, end: Snapshot) -> dict[str, Any]:
    """The figures of the span between two snapshots."""
    partial = []
    counted: dict[str, Scrape] = {}
    for component in COMPONENTS:
        before, after = start.components.get(component, Scrape()), end.components.get(component, Scrape())
        if before.failed or after.failed or not after.samples:
            partial.append(f"{component} not scraped ({before.failed or after.failed or 'no source'})")
            continue
        counted[component], restarted, _ = increase(before, after)
        if restarted:
            partial.append(f"{component} restarted during the phase: what it counted before is lost")
    fleet, fleet_partial = fleet_increase(start.nodehosts, end.nodehosts)
    if fleet_partial:
        partial.append(fleet_partial)
    cpu: dict[str, float | None] = {
        component: _cpu(start.components.get(component, Scrape()), end.components.get(component, Scrape()))
        for component in COMPONENTS
    }
    cpu[NODEHOSTS] = round(fleet.value(CPU, {}), 2) if start.nodehosts and CPU in fleet.samples else None
    if start.nodehosts:
        for process, seconds in sorted(by_label(fleet, NODE_PROCESSES_CPU, "process").items()):
            cpu[process] = round(seconds, 2)
    seconds = max(end.t - start.t, 1e-9)
    machine = None
    if start.machine and end.machine and end.machine[1] > start.machine[1]:
        busy = (end.machine[0] - start.machine[0]) / (end.machine[1] - start.machine[1])
        machine = {"busy": round(busy, 3), "cores": end.cores}
    apiserver = counted.get("kube-apiserver", Scrape())
    etcd = counted.get("etcd", Scrape())
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": cpu,
        "machine": machine,
        "scheduler": _scheduler(counted.get("kube-scheduler", Scrape())),
        "apiserver": _rows(
            apiserver,
            "apiserver_request_duration_seconds",
            ("resource", "subresource", "verb"),
            lambda key: key[0] in RESOURCES,
        ),
        "etcd": _rows(
            apiserver, "etcd_request_duration_seconds", ("resource", "operation"), lambda key: key[0] in RESOURCES
        ),
        "etcd_disk": {
            "wal_fsync": histogram(etcd, "etcd_disk_wal_fsync_duration_seconds", {}),
            "backend_commit": histogram(etcd, "etcd_disk_backend_commit_duration_seconds", {}),
        },
        "nodes": {
            "prepare": histogram(fleet, "dra_operations_duration_seconds", {"operation_name": "PrepareResources"}),
            "link_wait": histogram(fleet, "dra_testbed_kubelet_claim_link_wait_seconds", {}),
            "event_loop_lag": histogram(fleet, "dra_testbed_event_loop_lag_seconds", {}),
        },
        "partial": "; ".join(partial),
    }
