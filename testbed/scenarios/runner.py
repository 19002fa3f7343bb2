"""Run a scenario against a running testbed cluster and collect what the report needs.

Everything happens in one namespace per run. Pod startup is timed as a watch sees it:
from the pod's ADDED event to the first event that shows it Running. Claim allocation
is timed from the claim's ADDED event to the first event with an allocation. A phase
that stops making progress while pods stay unschedulable ends with those pods counted,
so asking for more devices than exist reports instead of hanging; pods already on nodes
are given a kubelet's retry (KUBELET_RETRY_S) first.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import itertools
import json
import math
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fake_devices.hardware import build_inventory
from testbed import heap
from testbed.controlplane.components import Ports
from testbed.controlplane.processes import process_start_ticks
from testbed.drivers import PROFILES, class_kinds, load_profile
from testbed.errors import TestbedError
from testbed.keys import MAINTENANCE_TAINT, PHASE_LABEL, PROFILE_LABEL, RUN_LABEL, RUNNER_ANNOTATION
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.kubelet.node import SYNTHETIC_TOLERATION
from testbed.kubeletplugin.leftovers import prepared_state
from testbed.report.breakdown import NODEHOSTS, ONLY, Snapshot, machine_cpu
from testbed.report.metrics import Only, Scrape, fleet_increase, scrape
from testbed.scenarios.spec import Fault, Phase, Scenario, faults_to_undo
from testbed.tasks import watch_lateness

CLEANUP_TIMEOUT_S = 30.0
"""How long a run that lost its control plane tries to delete its namespace."""
CLASS_KINDS = class_kinds()
PUBLICATION_GRACE_S = 15.0
"""How long a class the scenario asks for may have no device before the run gives up on
it: nodes that just came up may still be publishing their slices."""


@dataclass
class PodRecord:
    phase: str
    added: float
    running: float | None = None
    finished: float | None = None
    removed: float | None = None
    """Deleted before it finished, not by the run (e.g. the Job controller removing a
    surplus pod it created twice when a create's answer was lost)."""
    node: str = ""
    bound: float | None = None
    """When the scheduler's binding (``spec.nodeName``) was first seen."""
    failed: bool = False
    """It finished Failed (its container exited non-zero, or it was evicted)."""
    evicted: str = ""
    """Why the control plane deleted it (its DisruptionTarget condition's reason, e.g.
    DeletionByDeviceTaintManager for a device tainted NoExecute), if it did."""
    job: str = ""
    """The Job that made it."""
    seen_late: bool = False
    """Its first event already showed it bound: the watch missed its creation (it was
    re-listing after a lost connection), so its measured startup is understated."""


LOOP_PROBE_S = 0.05
"""How often the run checks that its own event loop is free to read the watches."""
LOOP_HOLD_KEPT_S = 0.02
"""A hold of the run's event loop this long is recorded (shorter ones are noise)."""

KUBELET_RETRY_S = 100.0
"""A kubelet tries a failed start (a prepare that met an API server restart, say) again
at the pod's next sync, 60-90 s later: a phase whose waiting pods are all on nodes waits
that long before it calls itself stalled."""


def stall_window(stall_seconds: float, waiting: list[PodRecord], retry_back_off_s: float = 0.0) -> float:
    """How long a phase may go without progress: ``stall_seconds``, or a kubelet's retry
    when every pod it waits for is bound (those are not unschedulable: their kubelets
    have them, and may be waiting for their next sync); longer by the Job controller's
    back-off where failed pods are replaced (none waits meanwhile)."""
    window = stall_seconds + retry_back_off_s
    if waiting and all(p.bound is not None for p in waiting):
        return max(window, KUBELET_RETRY_S)
    return window


def disrupted(pod: Obj) -> str:
    """The reason of the pod's DisruptionTarget condition (set by whoever evicts it: the
    device or node taint managers, preemption, the eviction API), or ""."""
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return str(condition.get("reason") or "DisruptionTarget")
    return ""


def _job_of(pod: Obj) -> str:
    labels = pod["metadata"].get("labels", {})
    return str(labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or "")


def job_ended(job: Obj) -> bool:
    """Complete or Failed: the Job controller makes no more pods for it."""
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in job.get("status", {}).get("conditions", [])
    )


def running_together(pods: list[PodRecord]) -> int:
    """How many of the pods run now: started, neither finished nor removed."""
    return sum(1 for p in pods if p.running is not None and p.finished is None and p.removed is None)


def never_ran(pods: list[PodRecord]) -> tuple[int, int]:
    """Pods that never ran and were not removed: (never bound to a node, bound)."""
    left = [p for p in pods if p.running is None and p.removed is None]
    unbound = sum(1 for p in left if p.bound is None)
    return unbound, len(left) - unbound


@dataclass
class PhaseResult:
    name: str
    jobs: int
    pods_expected: int
    started: float
    ended: float = 0.0
    pods_running: int = 0
    pods_succeeded: int = 0
    pods_failed: int = 0
    pods_removed: int = 0
    pods_evicted: int = 0
    """Of the pods that failed or were removed, those the control plane evicted."""
    unschedulable: int = 0
    """Pods that never ran and were never bound to a node."""
    not_started: int = 0
    """Pods bound to a node whose kubelet never ran them."""
    stalled: bool = False
    interrupted: bool = False
    """Cut short (Ctrl-C, the control plane gone): what it did not get to is not measured."""


NodeHostMetrics = Callable[[], Awaitable[list[tuple[str, str]]]]
"""Each NodeHost's metrics text, asked of the actor wherever it runs, or why it could not
be had ("" when it could): Fleet.metrics_texts."""


@dataclass
class Endpoints:
    kcm: str
    scheduler: str
    nodehosts: NodeHostMetrics | None = None
    etcd: str = ""
    """etcd's plain /metrics URL; "" where it serves none the run can read."""
    apiserver: bool = True
    """Scrape the API server's /metrics with the run's own credentials."""

    @classmethod
    def local(cls, ports: Ports, nodehosts: NodeHostMetrics | None = None) -> Endpoints:
        """Where a control plane the testbed started serves its metrics (all on 127.0.0.1)."""
        return cls(
            kcm=f"https://127.0.0.1:{ports.controller_manager}/metrics",
            scheduler=f"https://127.0.0.1:{ports.scheduler}/metrics",
            nodehosts=nodehosts,
            etcd=f"http://127.0.0.1:{ports.etcd_metrics}/metrics" if ports.etcd_metrics else "",
        )


@dataclass
class RunData:
    scenario: Scenario
    namespace: str
    started_wall: float
    started: float
    devices: dict[str, int] = field(default_factory=dict)
    nodes: int = 0
    """Synthetic nodes when the run started."""
    slices: int = 0
    """ResourceSlices those nodes published (their layout is a knob: devicesPerSlice)."""
    phases: list[PhaseResult] = field(default_factory=list)
    pods: dict[str, PodRecord] = field(default_factory=dict)
    claims: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    claims_untimed: set[str] = field(default_factory=set)
    """Claims first seen already allocated (a watch that re-listed): not timed."""
    timeline: list[tuple[float, int, float, float]] = field(default_factory=list)
    """(seconds since start, pods running, KCM resource_claim queue depth, scheduler pending pods)."""
    snapshots: list[Snapshot] = field(default_factory=list)
    """Taken as each phase starts and once at the end: phase i runs from snapshot i to i+1."""
    before: dict[str, Scrape] = field(default_factory=dict)
    after: dict[str, Scrape] = field(default_factory=dict)
    interrupted: bool = False
    ended: float = 0.0
    fleet_partial: str = ""
    """Why the fleet's figures cover only part of the run ("" when whole)."""
    error: str = ""
    """Why the run could not go on (a control-plane component gone); verdict ERROR."""
    left_behind: str = ""
    """What the run could not clean up, and how to do it by hand."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    """The faults injected: when, on which nodes, and any error."""
    faults_undone: list[dict[str, Any]] = field(default_factory=list)
    """What the run did as it ended to undo the faults it left in force (faults_to_undo)."""
    loop_holds: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since start, seconds) of each time this process's event loop could not
    run for LOOP_HOLD_KEPT_S or more (a probe's sleep woke that much later than asked):
    no watch event was read meanwhile, so a pod whose creation and start both fell in
    one reads as starting faster than it did."""
    jobs_ended: dict[str, set[str]] = field(default_factory=dict)
    """Per phase, its Jobs that ended (Complete or Failed): a pod evicted from a failed
    device is replaced by its Job, so a phase that waits for its Jobs waits for those
    of its evicted pods to end, not for a count of pods alone."""


def count_devices(slices: list[Obj], device_class: str) -> int:
    """Free-standing devices a class can get (untainted), from the published slices."""
    if device_class not in CLASS_KINDS:
        return 0
    driver, kind = CLASS_KINDS[device_class]
    total = 0
    for item in slices:
        if item["spec"]["driver"] != driver:
            continue
        for device in item["spec"].get("devices", []):
            attributes = device.get("attributes", {})
            if attributes.get("type", {}).get("string") == kind and not device.get("taints"):
                total += 1
    return total


def _asked_for(scenario: Scenario, which: Callable[[str], bool]) -> dict[str, list[str]]:
    """The device classes the scenario's phases ask for that ``which`` picks, each with the
    phases that ask."""
    picked: dict[str, list[str]] = {}
    for phase in scenario.phases:
        if phase.jobs == 0:
            continue
        for request in phase.requests:
            if which(request.device_class):
                asking = picked.setdefault(request.device_class, [])
                if phase.name not in asking:
                    asking.append(phase.name)
    return picked


def unserved(scenario: Scenario, devices: dict[str, int]) -> dict[str, list[str]]:
    """The testbed's classes the scenario asks for of which no device is published, each
    with the phases that ask. Other drivers' classes are not counted, so not judged."""
    return _asked_for(scenario, lambda name: name in CLASS_KINDS and not devices.get(name))


def absent_classes_error(scenario: Scenario, classes: set[str]) -> TestbedError | None:
    """The classes the scenario asks for that are not DeviceClasses of the cluster: their
    pods could never be scheduled, and the run would only wait out its stall."""
    absent = _asked_for(scenario, lambda name: name not in classes)
    if not absent:
        return None
    wanted = ", ".join(f"{name} (phase{'s' if len(p) > 1 else ''} {', '.join(p)})" for name, p in absent.items())
    return TestbedError(
        f"scenario {scenario.name} asks for DeviceClass {wanted}, which this cluster does not have",
        hint=f"its DeviceClasses: {', '.join(sorted(classes)) or 'none'}; a driver of your own comes "
        "with its DeviceClass (kubectl apply it)",
    )


def unserved_error(scenario: Scenario, missing: dict[str, list[str]], profiles: Counter[str]) -> TestbedError:
    nodes = ", ".join(f"{count} x {profile}" for profile, count in sorted(profiles.items())) or "none"
    wanted = ", ".join(
        f"{device_class} devices (phase{'s' if len(phases) > 1 else ''} {', '.join(phases)})"
        for device_class, phases in missing.items()
    )
    own = scenario.cluster
    having = profiles_with(list(missing))
    hint = "run it on nodes that have them: testbed up " + (
        " or ".join(f"--profile {name}" for name in having) or "--profile <one with them>"
    )
    if own.profile in having:
        hint += f"; or on a cluster of its own ({own.nodes} x {own.profile}): "
        hint += f"testbed run {scenario.name} --up --name {scenario.name}"
    return TestbedError(
        f"scenario {scenario.name} asks for {wanted}, and no synthetic node of this cluster "
        f"publishes any (its nodes: {nodes})",
        hint=hint,
    )


def profiles_with(device_classes: list[str]) -> list[str]:
    """The shipped hardware profiles whose nodes have devices of every one of these classes."""
    kinds = {CLASS_KINDS[name][1] for name in device_classes}
    having = []
    for name in PROFILES.shipped():
        devices, _ = build_inventory(load_profile(name), "any", 0)
        if kinds <= {device.kind for device in devices}:
            having.append(name)
    return having


def job_manifest(name: str, phase: Phase, run_id: str) -> Obj:
    command = ["run-until-deleted"]
    if phase.run_seconds is not None:
        command = ["sleep", f"{phase.run_seconds:g}"]
        if phase.exit_code:
            command = ["sh", "-c", f"sleep {phase.run_seconds:g}; exit {phase.exit_code}"]
    labels = {RUN_LABEL: run_id, PHASE_LABEL: phase.name}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completions": phase.completions,
            "parallelism": phase.parallelism,
            "backoffLimit": phase.backoff_limit,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec(phase, command)},
        },
    }


WORKLOAD_IMAGE = "registry.invalid/dra-testbed-workload:v1"
"""Tagged, so pulled once per node (IfNotPresent) as a load test's pause image is: a pod
started after the first on a node is told "already present", not pulled again."""
EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
"""Every DeviceClass is also an extended resource of this name plus its own."""


def pod_spec(phase: Phase, command: list[str]) -> Obj:
    container: Obj = {"name": "work", "image": WORKLOAD_IMAGE, "command": command}
    spec: Obj = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "tolerations": [SYNTHETIC_TOLERATION],
        # Synthetic nodes only: on a kind cluster the real nodes would try to pull the image.
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": PROFILE_LABEL, "operator": "Exists"}]}]
                }
            }
        },
        "containers": [container],
    }
    if phase.node_selector:
        spec["nodeSelector"] = dict(phase.node_selector)
    if phase.requests and phase.request_as == "extended-resource":
        limits = Counter(f"{EXTENDED_RESOURCE_PREFIX}{r.device_class}" for r in phase.requests)
        container["resources"] = {"limits": {name: str(count) for name, count in limits.items()}}
    elif phase.requests:
        spec["resourceClaims"] = [{"name": "devices", "resourceClaimTemplateName": phase.name}]
        container["resources"] = {"claims": [{"name": "devices"}]}
    return spec


def claim_template(phase: Phase) -> Obj:
    requests = []
    for request in phase.requests:
        exactly: dict[str, Any] = {"deviceClassName": request.device_class}
        if request.selector:
            exactly["selectors"] = [{"cel": {"expression": request.selector}}]
        if request.capacity:
            exactly["capacity"] = {"requests": dict(request.capacity)}
        requests.append({"name": request.name, "exactly": exactly})
    devices: dict[str, Any] = {"requests": requests}
    if phase.constraints:
        devices["constraints"] = phase.constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": phase.name},
        "spec": {"spec": {"devices": devices}},
    }


@dataclass(frozen=True)
class Injected:
    """What one fault reached: its nodes, and how it went where that says more (a rollout's summary)."""

    nodes: list[str]
    outcome: str = ""


FaultInjector = Callable[[Fault], Awaitable[Injected]]
"""Applies one fault to every node its pattern names."""


async def _nodes_reached(injecting: Awaitable[Injected]) -> list[str]:
    return (await injecting).nodes


def _node_of(resource_slice: Obj) -> str:
    """The node a slice's devices are on: its node, or for a pool of its own, the pool's
    name (a synthetic node's pools are named after it)."""
    return str(resource_slice["spec"].get("nodeName") or resource_slice["spec"]["pool"]["name"])


class Runner:
    def __init__(
        self,
        client: KubeClient,
        scenario: Scenario,
        endpoints: Endpoints,
        progress: Any = None,
        injector: FaultInjector | None = None,
    ):
        self.client = client
        self.scenario = scenario
        self.endpoints = endpoints
        self._fleet_start: list[Scrape] = []
        self.progress = progress
        run_id = uuid.uuid4().hex[:6]
        self.run_id = run_id
        self.data = RunData(scenario, f"run-{scenario.name}-{run_id}", time.time(), time.monotonic())
        self._changed = asyncio.Event()
        """Set (and replaced) at each change the watches see: a waiter takes the current
        one before it looks, so that no change between its look and its wait is missed."""
        self.injector = injector
        self._injected: list[Fault] = []
        """Faults that reached nodes (or were under way when the run ended), in order."""
        self._taint_rules: list[tuple[Fault, dict[str, str]]] = []
        """The DeviceTaintRules each ``taint-rule`` fault made (each one's node), deleted as
        the run ends."""
        self._rule_numbers = itertools.count()
        self._profiles: Counter[str] = Counter()

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.step(message)

    # --- observation ---------------------------------------------------------------

    async def _watch_pods(self) -> None:
        path = path_for("v1", "pods", namespace=self.data.namespace)
        async for kind, pod in self.client.watch(path):
            now = time.monotonic()
            uid = pod["metadata"]["uid"]
            record = self.data.pods.get(uid)
            if record is None:
                phase = pod["metadata"].get("labels", {}).get(PHASE_LABEL, "")
                record = self.data.pods[uid] = PodRecord(phase, now, job=_job_of(pod))
                record.seen_late = bool(pod["spec"].get("nodeName"))
            if record.bound is None and pod["spec"].get("nodeName"):
                record.bound = now
            status = pod.get("status", {}).get("phase")
            if status == "Running" and record.running is None:
                record.running = now
                record.node = pod["spec"].get("nodeName", "")
            if status in ("Succeeded", "Failed") and record.finished is None:
                record.finished = now
                record.failed = status == "Failed"
                if record.running is None:
                    record.running = now
            if kind == "DELETED" and record.finished is None:
                record.removed = now
            if not record.evicted:
                record.evicted = disrupted(pod)
            self._note_change()

    def _loop_held(self, asked: float, held: float) -> None:
        if held >= LOOP_HOLD_KEPT_S:
            self.data.loop_holds.append((asked - self.data.started, held))

    def _note_change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _watch_jobs(self) -> None:
        path = path_for("batch/v1", "jobs", namespace=self.data.namespace)
        async for _, job in self.client.watch(path):
            if job_ended(job):
                phase = job["metadata"].get("labels", {}).get(PHASE_LABEL, "")
                self.data.jobs_ended.setdefault(phase, set()).add(job["metadata"]["name"])
                self._note_change()

    async def _watch_claims(self) -> None:
        path = path_for("resource.k8s.io/v1", "resourceclaims", namespace=self.data.namespace)
        async for _, claim in self.client.watch(path):
            uid = claim["metadata"]["uid"]
            allocated_now = bool(claim.get("status", {}).get("allocation"))
            if uid not in self.data.claims and allocated_now:
                self.data.claims_untimed.add(uid)  # its creation was not seen: nothing to time from
            added, allocated = self.data.claims.get(uid, (time.monotonic(), None))
            if allocated is None and allocated_now:
                allocated = time.monotonic()
            self.data.claims[uid] = (added, allocated)

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        while True:
            kcm = await scrape(session, self.endpoints.kcm, only=("workqueue_depth",))
            scheduler = await scrape(session, self.endpoints.scheduler, only=("scheduler_pending_pods",))
            depth = kcm.value("workqueue_depth", {"name": "resource_claim"})
            pending = scheduler.value("scheduler_pending_pods", {})
            running = sum(1 for p in self.data.pods.values() if p.running is not None and p.finished is None)
            self.data.timeline.append((time.monotonic() - self.data.started, running, depth, pending))
            await asyncio.sleep(1.0)

    async def _scrape_all(self, session: aiohttp.ClientSession, end: bool = False) -> dict[str, Scrape]:
        """At the end, the NodeHosts' figures become what each counted during the run."""
        if self.data.error:  # the components are gone: their figures with them
            return {}
        hosts = await self._nodehost_scrapes()
        fleet = Scrape()  # at the start: nothing counted yet
        if end:
            fleet, self.data.fleet_partial = fleet_increase(self._fleet_start, hosts)
        else:
            self._fleet_start = hosts
        kcm, scheduler = await scrape(session, self.endpoints.kcm), await scrape(session, self.endpoints.scheduler)
        return {"kcm": kcm, "scheduler": scheduler, "fleet": fleet}

    async def _snapshot(self, session: aiohttp.ClientSession) -> None:
        """What every source says now, kept to the series the phase breakdown reads."""
        snapshot = Snapshot(time.monotonic() - self.data.started, machine=machine_cpu())
        self.data.snapshots.append(snapshot)
        if self.data.error:  # the components are gone: their figures with them
            return
        apiserver = Scrape(failed="not scraped")
        if self.endpoints.apiserver:
            try:
                apiserver = Scrape.parse(await self.client.get_text("/metrics"), ONLY["kube-apiserver"])
            except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                apiserver = Scrape(failed=f"kube-apiserver /metrics: {type(exc).__name__} {exc}".strip())
        snapshot.components["kube-apiserver"] = apiserver
        for component, url in (
            ("etcd", self.endpoints.etcd),
            ("kube-controller-manager", self.endpoints.kcm),
            ("kube-scheduler", self.endpoints.scheduler),
        ):
            snapshot.components[component] = (
                await scrape(session, url, ONLY[component]) if url else Scrape(failed="no metrics endpoint")
            )
        snapshot.nodehosts = await self._nodehost_scrapes(ONLY[NODEHOSTS])

    async def _nodehost_scrapes(self, only: Only = ()) -> list[Scrape]:
        """One per NodeHost; a host that did not answer is a failed scrape, never an empty one."""
        if self.endpoints.nodehosts is None:
            return []
        return [
            Scrape(failed=why) if why else Scrape.parse(text, only) for text, why in await self.endpoints.nodehosts()
        ]

    async def _inject_faults(self) -> None:
        """Each fault at its time, those counted from the same moment one after another in
        the order of their times; what happened goes into the report."""
        groups: dict[str | None, list[Fault]] = {}
        for fault in sorted(self.scenario.faults, key=lambda f: f.at_seconds):
            groups.setdefault(fault.after_running, []).append(fault)
        await asyncio.gather(*(self._inject_from(anchor, faults) for anchor, faults in groups.items()))

    async def _inject_from(self, phase: str | None, faults: list[Fault]) -> None:
        """Faults whose times count from one moment: the run's start, or the moment the
        named phase has all its pods running together."""
        start = self.data.started
        if phase is not None:
            running = await self._all_running(phase)
            if running is None:
                for fault in faults:
                    self.data.faults.append(
                        {
                            **self._fault_entry(fault),
                            "error": f"not injected: phase {phase} ended before its pods all ran at once",
                        }
                    )
                    self._say(f"fault {fault.action} {fault.target}".strip() + f" left out: phase {phase} never ran")
                return
            start = running
        for fault in faults:
            delay = start + fault.at_seconds - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._inject(fault)

    def _fault_entry(self, fault: Fault) -> dict[str, Any]:
        return {
            "at_s": round(time.monotonic() - self.data.started, 2),
            "action": fault.action,
            "target": fault.target,
            "nodes_pattern": fault.nodes,
            **({"after_running": fault.after_running} if fault.after_running else {}),
            **({"fatal": True} if fault.fatal else {}),
        }

    async def _inject(self, fault: Fault) -> None:
        entry = self._fault_entry(fault)
        self._injected.append(fault)  # one cut short by the run's end may have reached some nodes
        try:
            if fault.action == "taint-rule":
                injected = await self._taint(fault)
            elif self.injector is None:
                raise RuntimeError("this cluster has no fleet of the testbed's to inject faults into")
            else:
                injected = await self.injector(fault)
            entry["nodes"], entry["outcome"] = injected.nodes, injected.outcome
            entry["error"] = "" if injected.nodes else f"no node matches {fault.nodes!r}"
        except Exception as exc:  # reported, not fatal: the run goes on
            entry["error"] = f"{type(exc).__name__}: {exc}"
        if not entry.get("nodes"):
            self._injected.remove(fault)
        self.data.faults.append(entry)
        fatal = " (fatal)" if fault.fatal else ""
        what = f"{fault.action} {fault.target}".strip()
        self._say(f"fault {what}{fatal} on {len(entry.get('nodes', []))} node(s)")

    async def _all_running(self, phase: str) -> float | None:
        """When the phase first had every pod its Jobs run at once running together
        (None: it ended, or the run did, before that)."""
        while True:
            changed = self._changed
            result = next((r for r in self.data.phases if r.name == phase), None)
            if result is not None:
                mine = [p for p in self.data.pods.values() if p.phase == phase]
                if running_together(mine) >= result.jobs * self._phase(phase).parallelism:
                    return time.monotonic()
                if result.ended:
                    return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)

    def _phase(self, name: str) -> Phase:
        return next(phase for phase in self.scenario.phases if phase.name == name)

    async def _taint(self, fault: Fault) -> Injected:
        """As an admin takes a device out of service: a DeviceTaintRule for it in the pool
        of each node the pattern names whose slices have it (a synthetic node's pool is
        named after it), marked as this run's so that a later run can delete what a killed
        one left (``_reclaim_abandoned``)."""
        exact = not any(c in fault.nodes for c in "*?[")
        query = {"fieldSelector": f"spec.nodeName={fault.nodes}"} if exact else {}
        slices = (await self.client.get(path_for("resource.k8s.io/v1", "resourceslices"), query))["items"]
        targets = sorted(
            {
                (_node_of(item), item["spec"]["driver"], item["spec"]["pool"]["name"])
                for item in slices
                if fnmatch.fnmatchcase(_node_of(item), fault.nodes)
                and any(device["name"] == fault.device for device in item["spec"].get("devices", []))
            }
        )
        if not targets:
            raise ValueError(f"no ResourceSlice of a node matching {fault.nodes!r} has a device {fault.device!r}")
        made: dict[str, str] = {}
        self._taint_rules.append((fault, made))
        for node, driver, pool in targets:
            name = f"{self.data.namespace}-{next(self._rule_numbers)}"
            meta = {
                "name": name,
                "labels": {RUN_LABEL: self.run_id},
                "annotations": {RUNNER_ANNOTATION: json.dumps(runner_identity())},
            }
            taint = {"key": MAINTENANCE_TAINT, "value": self.run_id, "effect": fault.effect or "NoExecute"}
            selector = {"driver": driver, "pool": pool, "device": fault.device}
            rule = {"metadata": meta, "spec": {"deviceSelector": selector, "taint": taint}}
            await self.client.create(path_for("resource.k8s.io/v1", "devicetaintrules"), rule)
            made[name] = node
        return Injected(list(made.values()), f"{len(made)} DeviceTaintRule(s), {taint['effect']}")

    async def _undo_faults(self) -> None:
        """Put the nodes back as the run found them (faults_to_undo; its DeviceTaintRules
        deleted), so that the next run starts from the same fleet; bounded, since a fleet
        or an API server gone would not answer."""
        work: list[tuple[Fault, str, Awaitable[list[str]]]] = []
        if self.injector is not None:
            work += [(f, f.action, _nodes_reached(self.injector(f))) for f in faults_to_undo(self._injected)]
        work += [(f, "deleted taint-rule", self._delete_taint_rules(rules)) for f, rules in self._taint_rules]
        if not work:
            return
        self._say(f"undoing {len(work)} fault(s) left in force")
        deadline = asyncio.get_running_loop().time() + CLEANUP_TIMEOUT_S
        for fault, action, undoing in work:
            entry: dict[str, Any] = {"action": action, "target": fault.target, "nodes_pattern": fault.nodes}
            try:
                async with asyncio.timeout_at(deadline):
                    entry["nodes"], entry["error"] = await undoing, ""
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
            self.data.faults_undone.append(entry)

    async def _delete_taint_rules(self, rules: dict[str, str]) -> list[str]:
        """Delete them; the nodes they were for."""
        for name in rules:
            await self.client.delete_if_exists(path_for("resource.k8s.io/v1", "devicetaintrules", name))
        return list(rules.values())

    # --- phases --------------------------------------------------------------------

    async def _servable_devices(self) -> dict[str, int]:
        """The devices of each class, once every class the scenario asks for has some:
        a phase no device can serve would only wait out its stall and fail."""
        listing = await self.client.get(path_for("resource.k8s.io/v1", "deviceclasses"))
        absent = absent_classes_error(self.scenario, {c["metadata"]["name"] for c in listing["items"]})
        if absent is not None:
            raise absent
        deadline = time.monotonic() + PUBLICATION_GRACE_S
        said = False
        while True:
            devices = await self._devices()
            missing = unserved(self.scenario, devices)
            if not missing:
                return devices
            if time.monotonic() > deadline:
                raise unserved_error(self.scenario, missing, self._profiles)
            if not said:
                self._say(f"waiting for the nodes to publish {', '.join(missing)} devices")
                said = True
            await asyncio.sleep(0.5)

    async def _devices(self) -> dict[str, int]:
        """Devices on the synthetic nodes, where the scenario's pods go."""
        nodes = await self.client.get(path_for("v1", "nodes"), {"labelSelector": PROFILE_LABEL})
        synthetic = {n["metadata"]["name"] for n in nodes["items"]}
        self._profiles = Counter(n["metadata"]["labels"][PROFILE_LABEL] for n in nodes["items"])
        listing = await self.client.get(path_for("resource.k8s.io/v1", "resourceslices"))
        slices = [s for s in listing["items"] if s["spec"].get("nodeName") in synthetic]
        self.data.nodes, self.data.slices = len(synthetic), len(slices)
        return {name: count_devices(slices, name) for name in CLASS_KINDS}

    def _jobs_for(self, phase: Phase, held: int) -> int:
        if phase.jobs is not None:
            return phase.jobs
        available = self.data.devices.get(phase.requests[0].device_class, 0)
        if phase.fraction is not None:
            return math.floor(available * phase.fraction / phase.parallelism)
        return max(0, (available - held) // phase.parallelism)

    async def _run_phase(self, phase: Phase, held: int, session: aiohttp.ClientSession) -> PhaseResult:
        await self._snapshot(session)
        jobs = self._jobs_for(phase, held)
        expected = jobs * phase.pods_per_job
        result = PhaseResult(phase.name, jobs, expected, time.monotonic() - self.data.started)
        self.data.phases.append(result)  # recorded now, so an interrupted run still reports it
        self._say(f"phase {phase.name}: {jobs} Job{'' if jobs == 1 else 's'} at {phase.qps:g}/s")
        if phase.requests and phase.request_as == "claim":
            await self.client.create(
                path_for("resource.k8s.io/v1", "resourceclaimtemplates", namespace=self.data.namespace),
                claim_template(phase),
            )
        jobs_path = path_for("batch/v1", "jobs", namespace=self.data.namespace)
        begin = time.monotonic()
        for i in range(jobs):
            delay = begin + i / phase.qps - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.client.create(jobs_path, job_manifest(f"{phase.name}-{i}", phase, self.run_id))
        await self._wait(phase, jobs, result)
        self._settle(result)
        return result

    def _settle(self, result: PhaseResult) -> None:
        result.ended = time.monotonic() - self.data.started
        mine = [p for p in self.data.pods.values() if p.phase == result.name]
        result.pods_running = sum(1 for p in mine if p.running is not None)
        result.pods_succeeded = sum(1 for p in mine if p.finished is not None and not p.failed)
        result.pods_failed = sum(1 for p in mine if p.failed)
        result.pods_removed = sum(1 for p in mine if p.removed is not None)
        result.pods_evicted = sum(1 for p in mine if p.evicted)
        result.unschedulable, result.not_started = never_ran(mine)

    async def _wait(self, phase: Phase, jobs: int, result: PhaseResult) -> None:
        if phase.wait == "none":
            return
        want = jobs * phase.pods_per_job
        deadline = time.monotonic() + phase.timeout_seconds
        last_progress, last_count = time.monotonic(), (-1, -1)
        while True:
            changed = self._changed
            mine = [p for p in self.data.pods.values() if p.phase == phase.name]
            jobs_ended = self.data.jobs_ended.get(phase.name, set())
            ended = len(jobs_ended)
            if phase.wait == "running":
                done = sum(1 for p in mine if p.running is not None)
                if done >= want:
                    return
            else:
                # Counting pods ends a phase as its last pod ends (a Job's own Complete
                # comes up to a second later, its controller batching pod updates), but
                # an evicted pod's successor is not counted: its Job is waited for.
                done = sum(1 for p in mine if p.finished is not None)
                evicted_jobs = {p.job for p in mine if p.evicted}
                if ended >= jobs or (done >= want and evicted_jobs <= jobs_ended):
                    return
            if (done, ended) != last_count:
                last_progress, last_count = time.monotonic(), (done, ended)
                if self.progress is not None:
                    self.progress.update(
                        f"phase {phase.name}: {done}/{want} pods running"
                        if phase.wait == "running"
                        else f"phase {phase.name}: {ended}/{jobs} Jobs done ({done} pods finished)"
                    )
            now = time.monotonic()
            waiting = [
                p for p in mine if p.removed is None and (p.running if phase.wait == "running" else p.finished) is None
            ]
            window = stall_window(phase.stall_seconds, waiting, phase.retry_back_off_s)
            if now - last_progress > window or now > deadline:
                result.stalled = True
                self._say(f"phase {phase.name}: no progress for {window:.0f}s at {done}/{want}; moving on")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)

    async def _reclaim_abandoned(self) -> None:
        """Delete the namespaces of earlier runs on this machine whose `testbed run` is gone
        (killed: it could not clean up), whose pods would hold devices this run needs; say
        so of runs going on now, or run from elsewhere, whose pods compete with this one's."""
        listed = await self.client.get(path_for("v1", "namespaces"), {"labelSelector": RUN_LABEL})
        deleted = []
        for namespace in listed.get("items", []):
            meta = namespace["metadata"]
            runner = _runner_of(meta)
            if "deletionTimestamp" in meta:
                deleted.append(meta["name"])
            elif runner is not None and abandoned(runner):
                self._say(f"deleting namespace {meta['name']}, left by a run that was killed (pid {runner['pid']})")
                await self.client.delete_if_exists(path_for("v1", "namespaces", meta["name"]))
                deleted.append(meta["name"])
            else:
                where = "" if runner is None else f" (pid {runner.get('pid')} on {runner.get('host')})"
                self._say(f"warning: namespace {meta['name']} of another run{where} is still there; its pods compete")
        rules: Obj = {}
        with contextlib.suppress(ApiError):  # a cluster without DeviceTaintRules has none of ours
            rules = await self.client.get(
                path_for("resource.k8s.io/v1", "devicetaintrules"), {"labelSelector": RUN_LABEL}
            )
        for rule in rules.get("items", []):
            runner = _runner_of(rule["metadata"])
            if runner is not None and abandoned(runner):
                self._say(f"deleting DeviceTaintRule {rule['metadata']['name']}, left by a run that was killed")
                await self.client.delete_if_exists(
                    path_for("resource.k8s.io/v1", "devicetaintrules", rule["metadata"]["name"])
                )
        for name in deleted:  # their pods hold devices until they are gone
            if not await self._gone(name):
                self._say(f"warning: namespace {name} is still being deleted; its pods may hold devices")

    async def _clean_up(self) -> None:
        """Delete the run's namespace and wait until its pods and claims are gone."""
        ns = self.data.namespace
        await self.client.delete_if_exists(path_for("v1", "namespaces", ns))
        await self._gone(ns)

    async def _gone(self, namespace: str, timeout_s: float = 120.0) -> bool:
        """Wait until a namespace being deleted is gone (its pods and claims with it)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                await self.client.get(path_for("v1", "namespaces", namespace))
            except ApiError as exc:
                if exc.not_found:
                    return True
            await asyncio.sleep(0.5)
        return False

    async def run(self) -> RunData:
        self.data.devices = await self._servable_devices()
        await self._reclaim_abandoned()
        metadata = {
            "name": self.data.namespace,
            "labels": {RUN_LABEL: self.run_id},
            "annotations": {RUNNER_ANNOTATION: json.dumps(runner_identity())},
        }
        await self.client.create(path_for("v1", "namespaces"), {"metadata": metadata})
        with heap.settled():  # a full collection mid-phase would stop the watches that time the pods
            async with aiohttp.ClientSession() as session:
                self.data.before = await self._scrape_all(session)
                watches = (
                    self._watch_pods(),
                    self._watch_jobs(),
                    self._watch_claims(),
                    self._sample(session),
                    watch_lateness(LOOP_PROBE_S, self._loop_held),
                )
                tasks = [asyncio.create_task(t) for t in watches]
                if self.scenario.faults:
                    tasks.append(asyncio.create_task(self._inject_faults()))
                held = 0
                try:
                    for phase in self.scenario.phases:
                        result = await self._run_phase(phase, held, session)
                        if phase.run_seconds is None:  # long-running pods keep their devices
                            held += result.pods_running
                except (asyncio.CancelledError, KeyboardInterrupt):
                    self.data.interrupted = True
                    if self.data.phases and not self.data.phases[-1].ended:
                        self.data.phases[-1].interrupted = True
                        self._settle(self.data.phases[-1])
                    raise
                finally:
                    self.data.ended = time.monotonic() - self.data.started
                    await self._snapshot(session)
                    self.data.after = await self._scrape_all(session, end=True)
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    await self._undo_faults()
                    self._say(f"cleaning up namespace {self.data.namespace}")
                    try:
                        # Bounded: with the API server gone, retries would go on for minutes.
                        async with asyncio.timeout(CLEANUP_TIMEOUT_S if self.data.error else None):
                            await self._clean_up()
                    except (TimeoutError, ApiError, aiohttp.ClientError, OSError) as exc:
                        self.data.left_behind = (
                            f"namespace {self.data.namespace} ({type(exc).__name__}): delete it once the API "
                            f"server is back: kubectl delete namespace {self.data.namespace}"
                        )
        return self.data


def runner_identity() -> dict[str, object]:
    """This `testbed run`, as its namespace records it."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start_ticks": process_start_ticks(pid) or 0}


def _runner_of(meta: Obj) -> dict[str, Any] | None:
    try:
        runner = json.loads(meta.get("annotations", {})[RUNNER_ANNOTATION])
    except (KeyError, ValueError):
        return None
    return runner if isinstance(runner, dict) else None


def abandoned(runner: dict[str, Any]) -> bool:
    """Whether the run that recorded itself so has ended on this machine (another
    machine's runs cannot be told: they are never taken as abandoned)."""
    if runner.get("host") != socket.gethostname():
        return False
    try:
        pid, ticks = int(runner["pid"]), int(runner["start_ticks"])
    except (KeyError, TypeError, ValueError):
        return False
    return process_start_ticks(pid) != ticks


def nodes_dir_leaks(
    nodes_dir: Path, namespace: str | None = None, claim_uids: set[str] | None = None
) -> dict[str, int]:
    """What a finished run must not leave on the synthetic nodes' disks, when they are on
    this machine (a fleet's NodeHosts answer for their own nodes: Fleet.leaks)."""
    return prepared_state([p for p in nodes_dir.iterdir() if p.is_dir()], namespace, claim_uids)
