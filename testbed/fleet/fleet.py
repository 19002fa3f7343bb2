"""A fleet of synthetic nodes spread over NodeHost actors in a Ray cluster."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testbed.drivers import load_profile
from testbed.errors import TestbedError, run_coroutine
from testbed.files import private_dir
from testbed.fingerprint import code_version, strangers
from testbed.fleet.external import ExternalDriverSpec
from testbed.fleet.fabric import FabricManager
from testbed.fleet.identity import NodeAuthority, install_access_policy
from testbed.fleet.liveness import LivenessSettings
from testbed.fleet.membership import Membership, NodeRecipe
from testbed.fleet.nodehost import NodeHost
from testbed.fleet.spec import BUILT_IN_DRIVERS, MAX_POOL_NODES, ExternalDriver, FleetFile, Placement, Pool
from testbed.kubeapi import KubeClient, flattened_kubeconfig
from testbed.kubelet.declared import cluster_declared_features
from testbed.progress import Progress, SilentProgress, counted

T = TypeVar("T")
FAULT_ACTIONS = (
    "unhealthy",
    "healthy",
    "lost",
    "fail-prepare",
    "latency",
    "fail-attach",
    "hang-attach",
    "clear",
    "restart-kubelet",
)
RAY_BUILT_IN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
RAY_LABELS = ("node:", "accelerator_type:")
"""Resources Ray gives every node by itself: not what a placement would ask for."""
DRAIN_PROGRESS_EVERY_S = 2.0
"""How often a scale-down says how many nodes are drained."""
FLEET_START_CONCURRENCY = 24
"""Synthetic nodes started at once across all hosts: on 2 cores more makes etcd time out."""


class ScaleInterrupted(KeyboardInterrupt):
    """Ctrl-C while a scale handed its nodes to NodeHosts: those handed come up all the
    same (the hosts carry on); the rest were given up, and their new hosts stopped."""

    def __init__(self, handed: int, given_up: int):
        super().__init__()
        self.handed = handed
        self.given_up = given_up


@dataclass(frozen=True)
class RolloutFailure:
    node: str
    message: str
    detail: str = ""
    hint: str = ""
    """The way out its cause named, when it names one of its own."""

    def __str__(self) -> str:
        said = self.message.startswith(f"node {self.node}:")  # the node's own errors name it
        return self.message if said else f"node {self.node}: {self.message}"


def rollout_stopped(
    driver: str, rolled: int, total: int, failed: list[RolloutFailure], surge: bool, untouched: int
) -> TestbedError:
    """One error for a batch in which some nodes failed: the first failure's cause, every
    failed node named, and what the rest of the fleet runs now."""
    first = failed[0]
    others = f" (and {len(failed) - 1} more: {', '.join(f.node for f in failed[1:])})" if len(failed) > 1 else ""
    touched = f"{untouched} {'node was' if untouched == 1 else 'nodes were'} not touched"
    if first.hint:  # the failure knows its way out
        hint = f"{first.hint}; {touched}"
    else:
        hint = (
            (
                "with maxSurge the old instance serves on where the new one failed; "
                if surge
                else "the new instance keeps being restarted where it failed; "
            )
            + f"{touched}; nodes added from now on run the new command (the pools' template changed, as a "
            "DaemonSet's). Fix it and run the rollout again"
        )
    return TestbedError(
        f"rollout of {driver} stopped after {rolled} of {total} nodes: {first}{others}",
        detail="\n".join(f.detail or str(f) for f in failed) if others or first.detail else "",  # not the message again
        hint=hint,
    )


def rollout_summary(driver: str, rolled: list[dict[str, Any]]) -> str:
    """One line: how many nodes, how long each took, and how long kubelets had no
    instance of the driver to call (where pods that need it cannot start)."""
    if not rolled:
        return f"{driver}: no node to roll out on"
    seconds = sorted(r["seconds"] for r in rolled)
    gaps = sorted(r["unavailable_s"] for r in rolled)
    generations = sorted({r["generation"] for r in rolled})
    generation = f"{generations[0]}" + (f"-{generations[-1]}" if len(generations) > 1 else "")
    return (
        f"{driver} rolled out on {counted(len(rolled), 'node')} (driver pod generation {generation}): "
        f"per node p50 {statistics.median(seconds):.1f} s, max {seconds[-1]:.1f} s; "
        f"kubelets without an instance to call: p50 {statistics.median(gaps):.2f} s, max {gaps[-1]:.2f} s"
    )


def _index_in(pool: str, node: str) -> int | None:
    """The node's number in ``pool`` (Pool.node_name), or None: not one of its nodes."""
    prefix, _, index = node.rpartition("-")
    return int(index) if prefix == pool and index.isdigit() else None


def _behind_fabric(profile: str) -> bool:
    return any(getattr(spec, "fabric", False) for spec in load_profile(profile).devices.values())


def _recipe(fleet: FleetFile, pool: Pool, index: int) -> NodeRecipe:
    return NodeRecipe(
        pool.node_name(index),
        pool.profile,
        dict(pool.labels),
        [t.model_dump() for t in pool.taints],
        pool.kubelet,
        pool.devices_per_slice,
        None if pool.built_in_drivers is None else tuple(pool.built_in_drivers),
        tuple(_external(d) for d in pool.external_drivers),
        fleet.node_address(pool, index),
        pool.sync_frequency_s,
        (pool.registry_pull_qps, pool.registry_burst),
    )


def _external(driver: ExternalDriver) -> ExternalDriverSpec:
    probe = driver.liveness_probe
    liveness = None
    if probe is not None:
        liveness = LivenessSettings(
            probe.grpc.service,
            probe.initial_delay_s,
            probe.period_s,
            probe.timeout_s,
            probe.failure_threshold,
            probe.grace_s,
        )
    return ExternalDriverSpec(
        driver.name, tuple(driver.command), dict(driver.env), liveness, driver.generation, float(driver.grace_s)
    )


def host_options(placement: Placement | None, detached: bool) -> dict[str, Any]:
    """How Ray is asked to run a NodeHost. It takes no CPU of Ray's accounting (it is
    mostly waiting), and a host that dies is started again with the same nodes."""
    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 10000, "max_restarts": -1}
    if detached:
        options["lifetime"] = "detached"
    if placement is not None:
        if placement.resources:
            options["resources"] = dict(placement.resources)
        if placement.labels or placement.prefer_labels:
            options["label_selector"] = {**placement.labels, **placement.prefer_labels}
        if placement.prefer_labels:  # no Ray node carries them: the required labels alone
            options["fallback_strategy"] = [{"label_selector": dict(placement.labels)}]
        if placement.strategy == "SPREAD":
            options["scheduling_strategy"] = "SPREAD"
    return options


def testbed_cause(error: BaseException) -> TestbedError | None:
    """The TestbedError a NodeHost raised, out of the RayTaskError that carries it here
    (whose text is a traceback from the actor): the message and hint people read."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, TestbedError) else None


class Fleet:
    def __init__(self, spec: FleetFile, kubeconfig: Path, nodes_dir: Path, detached: bool = False, fleet_id: str = ""):
        """``nodes_dir``: where each node's directory tree (and sockets) goes."""
        self.spec = spec
        self.kubeconfig = kubeconfig
        self.kubeconfig_content = flattened_kubeconfig(kubeconfig)
        """What NodeHosts get: content, not a path, since a host may run on another machine."""
        self.nodes_dir = nodes_dir
        self.detached = detached
        self.hosts: dict[str, Any] = {}
        """Actor name -> handle."""
        self.host_of: dict[str, str] = {}
        """Node name -> the name of the actor that runs it."""
        self.id = fleet_id or uuid.uuid4().hex[:6]
        """Several fleets can share one Ray; actor names carry this."""
        self._next_host = 0
        self._unstarted: set[str] = set()
        self._declared: list[str] | None = None
        """What the nodes' kubelets declare (declared.py), read once for every host."""
        self.host_pool: dict[str, str] = {}
        """Host name -> the pool it alone serves ("" for hosts shared by pools without a
        placement of their own)."""
        self.authority = NodeAuthority.for_cluster(kubeconfig) if spec.identities == "per-node" else None
        """Issues each node its identity; None: nodes use the fleet's credentials."""
        self.fabric: Any = None
        """The fabric manager actor (fabric.py), once a node has devices behind a fabric."""

    @classmethod
    def attach(cls, spec: FleetFile, kubeconfig: Path, nodes_dir: Path, fleet_id: str) -> Fleet:
        """The fleet a `testbed up` left running in its Ray cluster (connect to Ray first)."""
        import ray
        from ray.util import list_named_actors

        fleet = cls(spec, kubeconfig, nodes_dir, detached=True, fleet_id=fleet_id)
        prefix = f"nodehost-{fleet_id}-"
        names = sorted((n for n in list_named_actors() if n.startswith(prefix)), key=lambda n: int(n[len(prefix) :]))
        if not names and spec.count > 0:  # an empty fleet has no hosts yet
            raise TestbedError(
                f"no NodeHost actors of fleet {fleet_id} in this Ray cluster",
                hint="the fleet is gone (was Ray restarted?); `testbed down` and `testbed up` again",
            )
        for name in names:
            fleet.hosts[name] = ray.get_actor(name)
        with contextlib.suppress(ValueError):  # none: no node has devices behind a fabric
            fleet.fabric = ray.get_actor(fleet._fabric_name)
        members = fleet._ask_all("ready", timeout_s=300)
        for name, nodes in members.items():
            fleet.host_of.update(dict.fromkeys(nodes, name))
            fleet.host_pool[name] = fleet._placement_key(nodes[0]) if nodes else ""  # empty: the next scale retires it
        fleet._next_host = int(names[-1][len(prefix) :]) + 1 if names else 0
        return fleet

    def _ask_all(self, method: str, timeout_s: float) -> dict[str, Any]:
        """Every host's answer; a host Ray is moving (its machine was lost) is asked again
        until it answers or the time is up."""
        import ray

        deadline = time.monotonic() + timeout_s
        answers: dict[str, Any] = {}
        waiting = {getattr(host, method).remote(): name for name, host in self.hosts.items()}
        while waiting:
            done, _ = ray.wait(list(waiting), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                raise TestbedError(
                    f"NodeHosts {', '.join(sorted(waiting.values()))} did not answer within {timeout_s:.0f} s",
                    hint="see `testbed status`; a host whose Ray node was lost is restarted elsewhere",
                )
            name = waiting.pop(done[0])
            try:
                answers[name] = ray.get(done[0])
            except ray.exceptions.ActorUnavailableError:  # between two lives: ask again
                time.sleep(0.5)
                waiting[getattr(self.hosts[name], method).remote()] = name
        return answers

    def _placement_key(self, node: str) -> str:
        """The pool whose hosts ``node`` must run on ("" : the shared hosts)."""
        pool = next((p for p in self.spec.pools if node.rpartition("-")[0] == p.name), None)
        return pool.name if pool is not None and pool.placement is not None else ""

    def _new_host(self, recipes: list[NodeRecipe], key: str) -> str:
        import ray

        options = host_options(self.pool(key).placement if key else None, self.detached)
        name = f"nodehost-{self.id}-{self._next_host}"
        self._next_host += 1
        self._unstarted.add(name)
        self.host_pool[name] = key
        self.hosts[name] = (
            ray.remote(NodeHost)
            .options(name=name, **options)
            .remote(
                self.kubeconfig_content,
                str(self.nodes_dir),
                recipes,
                self.spec.seed,
                name,
                self.authority,
                self._declared_features(),
                self.spec.log_level,
            )
        )
        return name

    @property
    def _fabric_name(self) -> str:
        return f"fabric-{self.id}"

    def _ensure_fabric(self, recipes: list[NodeRecipe]) -> None:
        """Start the fabric manager once a node to come has devices behind a fabric."""
        import ray

        if self.fabric is not None or not any(_behind_fabric(p) for p in {r.profile for r in recipes}):
            return
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000, "max_restarts": -1}
        if self.detached:
            options["lifetime"] = "detached"
        self.fabric = (
            ray.remote(FabricManager)
            .options(name=self._fabric_name, get_if_exists=True, **options)
            .remote(self.kubeconfig_content, self.spec.fabric.attach_seconds, self.authority, self.spec.log_level)
        )

    def fabric_state(self) -> tuple[dict[str, Any], dict[str, list[str]]] | None:
        """The fabric manager's attach figures (made, failed, hung, under way) and, by node,
        the attach faults in force; None without a fabric manager. Asked together, so a
        manager that does not answer costs one wait, not two."""
        import ray

        if self.fabric is None:
            return None
        asked = [self.fabric.figures.remote(), self.fabric.faults_in_force.remote()]
        figures, faults = ray.get(asked, timeout=30)
        return dict(figures), dict(faults)

    def _declared_features(self) -> list[str]:
        """Read once: the API server's /metrics is megabytes, too much to ask per host."""
        if self._declared is None:
            self._declared = self._as_admin(cluster_declared_features)
        return self._declared

    def _as_admin(self, work: Callable[[KubeClient], Awaitable[T]]) -> T:
        """``work`` with a client of the fleet's kubeconfig, closed afterwards."""

        async def run() -> T:
            client = KubeClient.from_kubeconfig(self.kubeconfig)
            try:
                return await work(client)
            finally:
                await client.close()

        return run_coroutine(run())

    def _install_access_policy(self, progress: Progress) -> None:
        if self.authority is None:
            if self.spec.identities == "per-node":
                progress.step("identities: shared (no CA key of this cluster to issue node identities with)")
            return
        drivers = {d.name for p in self.spec.pools for d in p.external_drivers}
        self._as_admin(lambda admin: install_access_policy(admin, drivers))
        progress.step("identities: kubelets as system:node:<name>, drivers with tokens bound to a pod on their node")

    def start(self, progress: Progress | None = None, timeout_s: float = 900.0) -> None:
        for pool in self.spec.pools:
            pool.check_socket_paths(self.nodes_dir)
        # Node sockets and checkpoints go here: a directory only we can enter.
        private_dir(self.nodes_dir.parent)
        private_dir(self.nodes_dir)
        recipes = [_recipe(self.spec, pool, i) for pool in self.spec.pools for i in range(pool.count)]
        progress = progress or SilentProgress()
        self._check_resources()
        placement = self._place(recipes)  # the hosts' processes start while the policy goes in
        self._install_access_policy(progress)
        self._ensure_fabric(recipes)
        with progress.task(
            f"starting {counted(len(recipes), 'synthetic node')} on {counted(len(placement), 'NodeHost actor')}"
        ):
            self._bring_up(placement, progress, timeout_s)
        pools = ", ".join(f"{p.name}: {p.count} x {p.profile}" for p in self.spec.pools)
        # A node counts as ready once its drivers registered; only the built-in ones are
        # known to publish slices by then (a driver of one's own may publish none).
        external = any(p.external_drivers for p in self.spec.pools if p.count)
        state = "ready, their drivers registered" if external else "ready and publishing slices"
        progress.step(f"{len(self.host_of)} synthetic nodes ({pools}) {state}")

    def _bring_up(self, placement: dict[str, list[NodeRecipe]], progress: Progress, timeout_s: float) -> None:
        """Start the placed nodes on their hosts (new hosts were created with theirs), with
        progress, until all are ready."""
        import ray

        # Total start concurrency is what the control plane can absorb, not per host.
        concurrency = max(1, FLEET_START_CONCURRENCY // max(1, len(placement)))
        calls: dict[Any, str] = {}
        try:
            self._check_code([name for name in placement if name in self._unstarted])
            for name, recipes in placement.items():
                actor = self.hosts[name]
                if name in self._unstarted:  # made with its nodes
                    calls[actor.start.remote(timeout_s, concurrency)] = name
                else:
                    calls[actor.add_nodes.remote(recipes, timeout_s, concurrency)] = name
        except KeyboardInterrupt:
            told = set(calls.values())
            given_up = [name for name in placement if name not in told]
            self._stop_unstarted([name for name in given_up if name in self._unstarted])
            raise ScaleInterrupted(
                handed=sum(len(placement[name]) for name in told),
                given_up=sum(len(placement[name]) for name in given_up),
            ) from None
        self._unstarted.difference_update(placement)
        total = sum(len(r) for r in placement.values())
        before = sum(ray.get([self.hosts[name].progress.remote() for name in placement]))
        deadline = time.monotonic() + timeout_s
        pending = dict(calls)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as exc:
                    cause = testbed_cause(exc)
                    if cause is None:
                        raise TestbedError("a NodeHost failed to start its nodes", detail=str(exc)) from exc
                    raise TestbedError(
                        f"a NodeHost failed to start its nodes: {cause.message}", detail=cause.detail, hint=cause.hint
                    ) from exc
                host: str = pending.pop(ref)
                self.host_of.update(dict.fromkeys((r.name for r in placement[host]), host))
            if time.monotonic() > deadline:
                raise TestbedError(f"synthetic nodes not ready within {timeout_s:.0f}s")
            ready = sum(ray.get([self.hosts[name].progress.remote() for name in placement])) - before
            progress.update(f"{ready}/{total} nodes ready")

    def _stop_unstarted(self, names: list[str]) -> None:
        """New hosts never told to start hold nothing: they go at once (a host Ray is
        still creating is cancelled)."""
        self._let_go(names, politely=False)

    def _retire_empty_hosts(self) -> None:
        """Hosts without nodes go: each holds a Ray worker, its watches and a port."""
        busy = set(self.host_of.values())
        self._let_go([name for name in self.hosts if name not in busy], politely=True)

    def _let_go(self, names: list[str], politely: bool) -> None:
        """``politely``: each host first closes its watches and servers (it was started)."""
        import ray

        for name in names:
            host = self.hosts.pop(name)
            Membership(name).forget()  # what it recorded as made (a restart would bring it back)
            self.host_pool.pop(name, None)
            self._unstarted.discard(name)
            if politely:
                with contextlib.suppress(ray.exceptions.RayError):  # it is killed all the same
                    ray.get(host.stop.remote(), timeout=60)
            ray.kill(host)

    def _check_code(self, names: list[str]) -> None:
        """New hosts run the same testbed as this process, or none of them starts nodes: a
        host with other code would speak other protocols to its drivers and kubelets."""
        import ray

        if not names:
            return
        try:
            reports = ray.get([self.hosts[name].code_version.remote() for name in names], timeout=300)
        except ray.exceptions.RayError as exc:
            raise TestbedError(
                "a NodeHost could not start on its Ray host",
                hint="install dra-testbed and its dependencies on every Ray host (the same checkout or build)",
                detail=str(exc),
            ) from exc
        mine = code_version()
        different = strangers(mine, {report["where"]: report["version"] for report in reports})
        if different:
            raise TestbedError(
                f"Ray hosts run another dra-testbed than this machine ({mine}): {'; '.join(different)}",
                hint="install this same checkout or build on every Ray host, then run it again",
            )

    def scale(
        self,
        pool_name: str,
        count: int,
        progress: Progress | None = None,
        timeout_s: float = 900.0,
        recorded: Callable[[FleetFile], None] | None = None,
    ) -> None:
        """Grow or shrink a pool while pods run. Shrinking drains the pool's highest-numbered
        nodes (their pods are evicted and go elsewhere); growing fills hosts that have room,
        then adds hosts. The new count is the pool's (and handed to ``recorded``, to be
        kept) before the first node goes or comes, as a ReplicaSet's replicas change
        before its pods: a scale whose caller is killed leaves the hosts going on towards
        it and `testbed status` comparing the nodes with it."""

        progress = progress or SilentProgress()
        pool = self.pool(pool_name)
        if not 0 <= count <= MAX_POOL_NODES:
            raise TestbedError(f"a pool cannot have {count} nodes", hint=f"give a count from 0 to {MAX_POOL_NODES}")
        pool.check_socket_paths(self.nodes_dir, count)
        # A pool's nodes are numbered 0..count-1 (scaling removes the highest first). What
        # the hosts hold counts, not the pool's count: a scale interrupted here went on in
        # the hosts, so they may hold more or fewer nodes than the count last recorded,
        # and hosts it emptied or never started hold none (they go first: which pool such
        # a host was placed for is not known to a fleet attached afresh).
        self._settle(progress, timeout_s)
        self._retire_empty_hosts()
        present = {i for node in self.host_of if (i := _index_in(pool.name, node)) is not None}
        going = [pool.node_name(i) for i in sorted(present, reverse=True) if i >= count]
        wanted = [_recipe(self.spec, pool, i) for i in range(count) if i not in present]

        def commit() -> None:
            if pool.count != count:
                pool.count = count
                if recorded is not None:
                    recorded(self.spec)

        if going:
            commit()
            with progress.task(f"draining {counted(len(going), 'node')} of pool {pool.name}"):
                by_host: dict[str, list[str]] = {}
                for node in going:
                    by_host.setdefault(self.host_of[node], []).append(node)
                removing = [self.hosts[h].remove_nodes.remote(nodes) for h, nodes in by_host.items()]
                self._drain_with_progress(removing, by_host, progress, timeout_s)
                for node in going:
                    del self.host_of[node]
                self._retire_empty_hosts()
            progress.step(f"pool {pool.name}: {counted(len(going), 'node')} drained and deleted")
        if wanted:
            try:
                placement = self._place(wanted)
            except KeyboardInterrupt:
                self._stop_unstarted(sorted(self._unstarted))
                raise ScaleInterrupted(handed=0, given_up=len(wanted)) from None
            commit()
            self._ensure_fabric(wanted)
            with progress.task(f"adding {counted(len(wanted), 'node')} to pool {pool.name}"):
                self._bring_up(placement, progress, timeout_s)
            progress.step(f"pool {pool.name}: {counted(len(wanted), 'node')} added")
        pool.count = count

    def _drain_with_progress(
        self, removing: list[Any], by_host: dict[str, list[str]], progress: Progress, timeout_s: float
    ) -> None:
        """Wait for the hosts' removals, saying every few seconds how many nodes are drained
        (a node's drain waits for its pods' eviction and unprepare: minutes, for many)."""
        import ray

        total, deadline = sum(len(nodes) for nodes in by_host.values()), time.monotonic() + timeout_s
        while True:
            done, _ = ray.wait(removing, num_returns=len(removing), timeout=DRAIN_PROGRESS_EVERY_S)
            if len(done) == len(removing):
                ray.get(removing)  # a host's failure, raised here
                return
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"the nodes were not drained within {timeout_s:.0f} s",
                    hint="see `testbed status` and the NodeHost logs; a pod whose PodDisruptionBudget "
                    "allows no eviction holds its node",
                )
            left = 0
            for host, nodes in by_host.items():
                try:
                    left += len(set(ray.get(self.hosts[host].draining.remote(), timeout=10)) & set(nodes))
                except (ray.exceptions.RayError, TimeoutError):
                    left += len(nodes)  # not known: not counted as drained
            progress.update(f"{total - left}/{total} nodes drained")

    def _settle(self, progress: Progress, timeout_s: float) -> None:
        """Drains an interrupted scale left under way end first: the nodes they take are
        not there to keep, and the hosts they empty go."""
        draining = [node for nodes in self._ask_all("draining", timeout_s=60).values() for node in nodes]
        if not draining:
            return
        with progress.task(f"waiting for {counted(len(draining), 'node')} an interrupted scale is draining"):
            held = self._ask_all("settled", timeout_s)
        self.host_of = {node: host for host, nodes in held.items() for node in nodes}

    def _place(self, recipes: list[NodeRecipe]) -> dict[str, list[NodeRecipe]]:
        """Fill the hosts that have room, then start new ones; a pool with a placement of
        its own only ever shares hosts with itself."""
        load = Counter(self.host_of.values())
        placement: dict[str, list[NodeRecipe]] = {}
        by_key: dict[str, list[NodeRecipe]] = {}
        for recipe in recipes:
            by_key.setdefault(self._placement_key(recipe.name), []).append(recipe)
        size = self.spec.nodes_per_host
        for key, queue in by_key.items():
            for name in self.hosts:
                room = size - load[name] - len(placement.get(name, []))
                if self.host_pool.get(name, "") == key and room > 0 and queue:
                    placement.setdefault(name, []).extend(queue[:room])
                    queue = queue[room:]
            for i in range(0, len(queue), size):
                group = queue[i : i + size]
                placement[self._new_host(group, key)] = group
        return placement

    def _check_resources(self) -> None:
        """A pool asking for Ray resources or node labels no Ray node has would wait
        forever: refuse."""
        import ray

        self._check_labels()
        asked = {name for pool in self.spec.pools if pool.placement for name in pool.placement.resources}
        if not asked:
            return
        offered: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        missing = sorted(asked - set(offered))
        if missing:
            custom = sorted(k for k in offered if k not in RAY_BUILT_IN_RESOURCES and not k.startswith(RAY_LABELS))
            raise TestbedError(
                f"no Ray node offers {', '.join(missing)} (a pool's placement.resources asks for it); "
                f"this Ray cluster offers {', '.join(custom) or 'no custom resources'}",
                hint="start the Ray nodes meant for that pool with `ray start --resources` and name the "
                "cluster in the fleet file (ray.address), or drop placement.resources",
            )

    def _check_labels(self) -> None:
        import ray

        wanting = [p for p in self.spec.pools if p.placement is not None and p.placement.labels]
        if not wanting:
            return
        nodes = [n.get("Labels") or {} for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        for pool in wanting:
            assert pool.placement is not None
            wanted = pool.placement.labels
            if not any(all(labels.get(k) == v for k, v in wanted.items()) for labels in nodes):
                carried = sorted(
                    {f"{k}={v}" for labels in nodes for k, v in labels.items() if not k.startswith("ray.io/")}
                )
                raise TestbedError(
                    f"no Ray node carries the labels {', '.join(f'{k}={v}' for k, v in wanted.items())} "
                    f"(pool {pool.name}'s placement.labels); this Ray cluster's nodes carry "
                    f"{', '.join(carried) or 'no labels of their own'}",
                    hint="start the Ray nodes meant for that pool with `ray start --labels KEY=VALUE` and name "
                    "the cluster in the fleet file (ray.address), or drop placement.labels",
                )

    def rollout(
        self,
        driver: str,
        command: list[str] | None = None,
        max_surge: int = 1,
        max_unavailable: int = 0,
        progress: Progress | None = None,
        timeout_s: float = 300.0,
        recorded: Callable[[FleetFile], None] | None = None,
    ) -> list[dict[str, Any]]:
        """``roll_out``, for callers without an event loop."""
        return run_coroutine(self.roll_out(driver, command, max_surge, max_unavailable, progress, timeout_s, recorded))

    async def roll_out(
        self,
        driver: str,
        command: list[str] | None = None,
        max_surge: int = 1,
        max_unavailable: int = 0,
        progress: Progress | None = None,
        timeout_s: float = 300.0,
        recorded: Callable[[FleetFile], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Replace a command-line driver's instance on every node that runs it, as a
        DaemonSet's rolling update replaces its pods: ``max_surge`` nodes at a time with
        the new instance started beside the old (the seamless upgrade), or
        ``max_unavailable`` at a time with the old one stopped first. ``command``: the new
        version's (default: the same, as `kubectl rollout restart`). As a DaemonSet's
        template changes before any pod does, the pools' new generation and command are
        set (and handed to ``recorded``, to be kept) before the first node rolls: nodes
        added from then on run them, also when the rollout fails or its caller is killed.
        Each node's RolledOut, as a dict, in the order rolled."""
        import ray

        if (max_surge > 0) == (max_unavailable > 0):
            raise TestbedError(
                f"maxSurge {max_surge} and maxUnavailable {max_unavailable}: exactly one of them must be above 0",
                hint="--max-surge 1 starts each node's new instance before stopping the old one; "
                "--max-unavailable 1 stops the old one first",
            )
        pools = [p for p in self.spec.pools if any(d.name == driver for d in p.external_drivers)]
        if not pools:
            running = sorted({d.name for p in self.spec.pools for d in p.external_drivers})
            built_in = driver in BUILT_IN_DRIVERS.values() or driver in BUILT_IN_DRIVERS
            raise TestbedError(
                f"no pool runs a command-line driver {driver!r}"
                + (": the fleet's is built into its NodeHosts, which are not rolled out" if built_in else ""),
                hint=(f"the fleet's command-line drivers: {', '.join(running)}" if running else "")
                or "roll out a driver that a pool runs from a command (`drivers: [{name: ..., command: [...]}]`; "
                "`testbed-driver` is the built-in ones as a command)",
            )
        nodes = sorted(n for n in self.host_of if any(_index_in(p.name, n) is not None for p in pools))
        progress = progress or SilentProgress()
        batch = max_surge or max_unavailable
        rolled: list[dict[str, Any]] = []
        how = f"maxSurge {max_surge}" if max_surge else f"maxUnavailable {max_unavailable}"
        entries = [e for p in pools for e in p.external_drivers if e.name == driver]
        generation = max(e.generation for e in entries) + 1
        for entry in entries:
            entry.generation = generation
            if command is not None:
                entry.command = list(command)
        if recorded is not None:
            recorded(self.spec)

        async def roll(node: str) -> dict[str, Any]:
            return dict(await self.host(node).roll_driver.remote(node, driver, command, max_surge > 0, generation))

        with progress.task(f"rolling {driver} out on {counted(len(nodes), 'node')} ({how})"):
            for start in range(0, len(nodes), batch):
                group = nodes[start : start + batch]
                calls = {node: asyncio.ensure_future(roll(node)) for node in group}
                await asyncio.wait(calls.values(), timeout=timeout_s)  # the batch runs at once
                failed: list[RolloutFailure] = []
                for node, call in calls.items():
                    if not call.done():  # its host carries on; the rollout stops here
                        call.cancel()
                        failed.append(RolloutFailure(node, f"not rolled out within {timeout_s:.0f} s"))
                    elif isinstance(error := call.exception(), ray.exceptions.RayTaskError):
                        cause = testbed_cause(error)
                        message = cause.message if cause else str(error).splitlines()[0]
                        detail, hint = (cause.detail or "", cause.hint or "") if cause else (str(error), "")
                        failed.append(RolloutFailure(node, message, detail, hint))
                    elif error is not None:
                        raise error
                    else:
                        rolled.append(call.result())
                if failed:
                    untouched = len(nodes) - start - len(group)
                    raise rollout_stopped(driver, len(rolled), len(nodes), failed, max_surge > 0, untouched)
                progress.update(f"{len(rolled)}/{len(nodes)} nodes")
        return rolled

    def pool(self, name: str) -> Pool:
        for pool in self.spec.pools:
            if pool.name == name:
                return pool
        known = ", ".join(p.name for p in self.spec.pools)
        raise TestbedError(f"the fleet has no pool {name!r}", hint=f"its pools: {known}")

    async def metrics_texts(self, timeout_s: float = 10.0) -> list[tuple[str, str]]:
        """Each NodeHost's metrics, asked of the actor wherever it runs (no port of a
        remote host need be reachable from here): (text, "") or ("", why not)."""
        import ray

        async def one(name: str, host: Any) -> tuple[str, str]:
            try:
                return await asyncio.wait_for(host.metrics_text.remote(), timeout_s), ""
            except (ray.exceptions.RayError, TimeoutError) as exc:
                return "", f"NodeHost {name}: {type(exc).__name__} {exc}".strip()

        return list(await asyncio.gather(*(one(name, host) for name, host in self.hosts.items())))

    def metrics_urls(self) -> list[str]:
        """Where each NodeHost serves /metrics on its own machine (for a Prometheus there)."""
        import ray

        ports = ray.get([host.metrics_port.remote() for host in self.hosts.values()])
        return [f"http://127.0.0.1:{port}/metrics" for port in ports]

    def host(self, node: str) -> Any:
        """The Ray handle of the NodeHost running ``node`` (the methods below spare you it)."""
        return self.hosts[self.host_of[node]]

    def describe(self, timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
        """Each NodeHost by name: nodes, ready, pid, Ray node, restarted; an unreachable
        one says why instead."""
        import ray

        refs = {name: host.describe.remote() for name, host in self.hosts.items()}
        found: dict[str, dict[str, Any]] = {}
        for name, ref in refs.items():
            try:
                found[name] = ray.get(ref, timeout=timeout_s)
            except Exception as exc:  # dead, restarting, or timed out
                found[name] = {"error": type(exc).__name__}
        return found

    # --- one node's hardware and files, without Ray in the caller's code ---------------

    def _call(self, node: str, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        self._check_known(node)
        return ray.get(getattr(self.host(node), method).remote(*args, **kwargs), timeout=60)

    def _check_known(self, node: str) -> None:
        if node not in self.host_of:
            names = sorted(self.host_of)
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise TestbedError(f"no synthetic node {node!r} in this fleet", hint=f"its nodes: {shown or 'none'}")

    def hardware_claims(self, node: str) -> dict[str, list[str]]:
        """Claim UID -> devices the node's emulated hardware holds for it now."""
        claims: dict[str, list[str]] = self._call(node, "hardware_claims", node)
        return claims

    def set_health(self, node: str, device: str, healthy: bool, message: str = "", fatal: bool = False) -> None:
        """Mark a device unhealthy (tainted in its slice, reported on the health stream) or
        healthy again; ``fatal``: its taint evicts the pods using it."""
        self._call(node, "set_health", node, device, healthy, message, fatal)

    def nodes_matching(self, pattern: str) -> list[str]:
        """The fleet's nodes whose name matches the shell-style ``pattern`` (``gpu-*``), sorted."""
        return fnmatch.filter(sorted(self.host_of), pattern)

    async def apply_fault(self, node: str, action: str, target: str, message: str = "", fatal: bool = False) -> None:
        """One fault on one node's hardware (FAULT_ACTIONS): ``target`` is the device, or
        the count of prepares to fail, or the latency in milliseconds (none for clear:
        every fault on the node undone, a lost device aside; none for restart-kubelet:
        the node's kubelet restarted in place). ``fatal``: an unhealthy device cannot
        serve even the work it has (its pods are evicted)."""
        self._check_known(node)
        host = self.host(node)
        if action == "fail-prepare":
            call = host.inject.remote(node, fail_next_prepares=int(target), message=message or None)
        elif action == "latency":
            call = host.inject.remote(node, latency_s=float(target) / 1000)
        elif action == "lost":
            call = host.lose_device.remote(node, target)
        elif action in ("healthy", "unhealthy"):
            call = host.set_health.remote(node, target, action == "healthy", message, fatal)
        elif action == "restart-kubelet":
            call = host.restart_kubelet.remote(node)
        elif action == "clear":
            if self.fabric is not None:
                await asyncio.gather(self.fabric.fail_attach.remote(node, 0), self.fabric.hang_attach.remote(node, 0))
            call = host.clear_faults.remote(node)
        elif action in ("fail-attach", "hang-attach"):
            if self.fabric is None:
                raise TestbedError(
                    f"node {node}: no device of this fleet sits behind a fabric, so none is attached",
                    hint="give a pool a profile with `gpus: {fabric: true}` (the shipped fabric-gpu)",
                )
            method = self.fabric.fail_attach if action == "fail-attach" else self.fabric.hang_attach
            call = method.remote(node, int(target))
        else:
            raise TestbedError(f"unknown fault {action!r}", hint=f"use one of {', '.join(FAULT_ACTIONS)}")
        try:
            await call
        except Exception as exc:  # the host's own error (an unknown device) comes wrapped by Ray
            cause = getattr(exc, "cause", None)
            if cause is None:
                raise
            said = str(cause)  # the host's own words name the node already
            raise TestbedError(
                said if node in said else f"node {node}: {said}", hint="device names are in its ResourceSlices"
            ) from None

    def leaks(self, namespace: str | None = None, claim_uids: set[str] | None = None) -> dict[str, Any]:
        """Prepared state the fleet's nodes still hold for these claims, each NodeHost
        reading its own nodes wherever it runs. A host that does not answer is named
        under ``unchecked``: its nodes are not counted as clean."""
        import ray

        uids = None if claim_uids is None else sorted(claim_uids)
        calls = {name: host.leaks.remote(namespace, uids) for name, host in self.hosts.items()}
        totals: dict[str, Any] = {"checkpoint_entries": 0, "cdi_specs": 0, "unchecked": []}
        for name, call in calls.items():
            try:
                found = ray.get(call, timeout=60)
            except Exception as exc:  # a host gone with its machine, or busy past the deadline
                totals["unchecked"].append(f"{name} ({type(exc).__name__})")
                continue
            for key in ("checkpoint_entries", "cdi_specs"):
                totals[key] += found[key]
        return totals

    def lose_device(self, node: str, device: str) -> None:
        """The device falls off the bus: it and its partitions leave the inventory and the slices."""
        self._call(node, "lose_device", node, device)

    def inject(self, node: str, **faults: Any) -> None:
        """Hardware faults, e.g. ``fail_next_prepares=2``, ``latency_s=0.5``, ``failure_rate=0.1``."""
        self._call(node, "inject", node, **faults)

    def node_dir(self, node: str) -> Path:
        """The node's directory: kubelet/plugins_registry, kubelet/plugins/<driver>, cdi/."""
        return Path(self._call(node, "node_dir", node))

    def metrics_url(self, node: str) -> str:
        """Where the NodeHost running ``node`` serves its drivers' and kubelets' metrics."""
        return f"http://127.0.0.1:{self._call(node, 'metrics_port')}/metrics"

    def stop(self, remove_nodes: bool = False) -> None:
        """``remove_nodes``: drain and delete the Nodes too (a fleet leaving a cluster that
        stays); without it the Nodes stay behind and go NotReady."""
        import ray

        if remove_nodes:
            for pool in self.spec.pools:
                self.scale(pool.name, 0)
        if self.hosts:
            ray.get([host.stop.remote() for host in self.hosts.values()], timeout=60)
            ray.get([host.forget.remote() for host in self.hosts.values()], timeout=60)
            for host in self.hosts.values():
                ray.kill(host)
        if self.fabric is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(self.fabric.stop.remote(), timeout=10)
            ray.kill(self.fabric)
            self.fabric = None
        self.hosts.clear()
        self.host_of.clear()
