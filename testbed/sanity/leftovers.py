"""What a killed sanity run left behind, taken away by the next run.

A run that ends, even by Ctrl-C or SIGTERM, takes away what it made. One killed outright
(SIGKILL, the OOM killer, a CI runner torn down) leaves its node with its slices, its
driver pod and its Lease, its namespace and DeviceClass, and, on the machine it ran on,
the driver it started: still publishing, and holding what it bound (the built-in
driver's metrics port, so the next run's driver could not start). The next run finds
such runs two ways: in the cluster, a run's node whose Lease nobody renews any more (the
run may have been on another machine); here, a run's directory whose process is gone
(its cluster may be gone too).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from testbed.controlplane import processes
from testbed.files import write_atomically
from testbed.fleet.external import ShortPaths
from testbed.fleet.identity import DRIVER_NAMESPACE, DriverPod
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for

OWNER_FILE = "run.json"
"""In a run's directory: the process running it (PID and start time)."""
RUN_LABEL = "dra-testbed.io/sanity-run"
"""On a sanity run's own node: the run's id (its namespace is sanity-<id>)."""
STALE_AFTER_S = 60.0
"""A run's kubelet renews its node's Lease every 10 s, and the node lifecycle controller
calls a node lost after 40 s without: a minute unrenewed is a run that is gone."""
RESOURCE = "resource.k8s.io/v1"


@dataclass(frozen=True)
class DeadRun:
    run_id: str
    why: str
    """How it was found dead, for the user: its Lease unrenewed for so long, or its process gone."""

    @property
    def node(self) -> str:
        """The run's own node (a run that checked a fleet node's driver made none)."""
        return f"sanity-{self.run_id}"

    @property
    def namespace(self) -> str:
        return f"sanity-{self.run_id}"

    @property
    def device_class(self) -> str:
        return f"sanity-{self.run_id}.dra-testbed.io"


def dead_runs(
    nodes: list[Obj], renewed: Mapping[str, str], now: datetime, stale_after_s: float = STALE_AFTER_S
) -> list[DeadRun]:
    """The runs among ``nodes`` (labelled RUN_LABEL) whose Lease, by node name in
    ``renewed`` (its renewTime), or else whose Node's creation, is ``stale_after_s`` old."""
    dead = []
    for node in nodes:
        meta = node["metadata"]
        run_id = (meta.get("labels") or {}).get(RUN_LABEL, "")
        stamp = renewed.get(meta["name"]) or meta.get("creationTimestamp")
        if not run_id or not stamp:
            continue
        silent = (now - _parse_time(stamp)).total_seconds()
        if silent >= stale_after_s and meta["name"] == f"sanity-{run_id}":
            dead.append(DeadRun(run_id, f"its node's Lease unrenewed for {silent:.0f} s"))
    return dead


def record_owner(run_dir: Path) -> None:
    """Mark ``run_dir`` as this process's run: first thing, before a sweep could see it."""
    pid = os.getpid()
    owner = processes.ProcessRecord("testbed sanity", pid, processes.process_start_ticks(pid) or 0, "", [])
    write_atomically(run_dir / OWNER_FILE, json.dumps(owner.to_json()).encode())


def dead_here(runs_dir: Path, now: float, stale_after_s: float = STALE_AFTER_S) -> list[DeadRun]:
    """The runs of this machine whose process is gone. A directory without an owner (left
    by a version that recorded none, or by a run killed in its first instant) counts once
    it is ``stale_after_s`` old."""
    dead = []
    for run_dir in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        try:
            owner = processes.ProcessRecord.from_json(json.loads((run_dir / OWNER_FILE).read_text()))
        except FileNotFoundError:
            if now - run_dir.stat().st_mtime >= stale_after_s:
                dead.append(DeadRun(run_dir.name, "its directory here has no owner"))
            continue
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: not ours to judge
        if not owner.alive():
            dead.append(DeadRun(run_dir.name, f"the process that ran it here (pid {owner.pid}) is gone"))
    return dead


def _parse_time(stamp: str) -> datetime:
    """RFC 3339, with or without fractions (a Lease's renewTime has microseconds)."""
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def sweep(admin: KubeClient, runs_dir: Path, stale_after_s: float = STALE_AFTER_S) -> list[DeadRun]:
    """Take away what dead runs left, in the cluster and in ``runs_dir`` (where this
    machine's runs keep their directories, the drivers they ran recorded there)."""
    nodes = (await admin.get(path_for("v1", "nodes"), {"labelSelector": RUN_LABEL}))["items"]
    renewed = {}
    for node in nodes:
        name = node["metadata"]["name"]
        with contextlib.suppress(ApiError):
            lease = await admin.get(path_for("coordination.k8s.io/v1", "leases", name, "kube-node-lease"))
            renewed[name] = lease.get("spec", {}).get("renewTime", "")
    dead = dead_here(runs_dir, time.time(), stale_after_s)
    found_here = {run.run_id for run in dead}
    dead += [run for run in dead_runs(nodes, renewed, datetime.now(UTC), stale_after_s) if run.run_id not in found_here]
    for run in dead:
        _stop_its_drivers(runs_dir / run.run_id)
        await remove_from_cluster(admin, run.namespace, run.device_class, run.node)
        ShortPaths.for_node(runs_dir / run.run_id).unlink()
        shutil.rmtree(runs_dir / run.run_id, ignore_errors=True)
    return dead


async def remove_from_cluster(admin: KubeClient, namespace: str, device_class: str, node: str | None) -> None:
    """What a run makes in the cluster: its namespace and DeviceClass, and, unless it
    checked a fleet node's driver (``node`` None), its own node with the node's driver
    pod, slices and Lease. Each is tried even when another could not be removed."""
    for path in [path_for("v1", "namespaces", namespace), path_for(RESOURCE, "deviceclasses", device_class)]:
        with contextlib.suppress(ApiError):
            await admin.delete_if_exists(path)
    if node is None:
        return
    with contextlib.suppress(ApiError):
        await admin.delete_if_exists(path_for("v1", "pods", DriverPod(node).name, DRIVER_NAMESPACE))
    with contextlib.suppress(ApiError):
        await admin.request(
            "DELETE", path_for(RESOURCE, "resourceslices"), params={"fieldSelector": f"spec.nodeName={node}"}
        )
    for path in [path_for("coordination.k8s.io/v1", "leases", node, "kube-node-lease"), path_for("v1", "nodes", node)]:
        with contextlib.suppress(ApiError):
            await admin.delete_if_exists(path)


def _stop_its_drivers(root: Path) -> None:
    """The drivers a run on this machine started (recorded with their start time, so a
    PID used again since is left alone)."""
    for path in root.glob("driver-*.process.json"):
        try:
            record = processes.ProcessRecord.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        processes.stop([record])
