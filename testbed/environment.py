"""A whole testbed: control plane, DeviceClasses, and a fleet of synthetic nodes.

The fleet's NodeHost actors are detached and live in a Ray head that the cluster owns
(recorded as the "ray" process), so they keep running after `testbed up` returns;
`testbed down` stops them gracefully, then Ray, then the control plane.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import config, locks
from testbed.config import ControlPlaneConfig, nodes_dir
from testbed.controlplane import cluster, processes
from testbed.controlplane.binaries import Binaries, ensure_node_binaries
from testbed.drivers import deviceclasses
from testbed.errors import TestbedError, run_coroutine
from testbed.fleet import orphans, raycluster
from testbed.fleet.external import prune_short_paths, stop_recorded_drivers
from testbed.fleet.fleet import Fleet, rollout_summary
from testbed.fleet.spec import FleetFile, FleetFileError, recorded
from testbed.kubeapi import KubeClient
from testbed.progress import Progress, SilentProgress
from testbed.realnode.node import unsupported_reason

if TYPE_CHECKING:  # a run's modules, loaded only by what runs one
    from testbed.scenarios.runner import FaultInjector, Injected
    from testbed.scenarios.spec import Fault

log = logging.getLogger(__name__)

SCALE_LOCK = "scale.lock"
TAKEN_DOWN = "taken-down"
"""Written into a cluster's directory by `down` before it stops a scale under way, so
that the scale says why it stopped."""
SCALE_STOP_GRACE_S = 30.0


def install_device_classes(kubeconfig: Path) -> list[str]:
    async def run() -> list[str]:
        client = KubeClient.from_kubeconfig(kubeconfig)
        try:
            return await deviceclasses.install(client)
        finally:
            await client.close()

    return run_coroutine(run())


def up(
    config: ControlPlaneConfig,
    fleet: FleetFile | None = None,
    progress: Progress | None = None,
    binaries: Binaries | None = None,
    external_kubeconfig: Path | None = None,
) -> cluster.ClusterState:
    """``external_kubeconfig``: bring the fleet to that cluster instead of starting one."""
    progress = progress or SilentProgress()
    for pool in fleet.pools if fleet is not None else []:
        pool.check_socket_paths(nodes_dir(config.cluster_dir))
    if fleet is not None and fleet.real_kubelets:
        check_real_kubelets(fleet, progress)
    if fleet is not None and fleet.ray.address:
        raycluster.check_reachable(fleet.ray.address)  # before anything starts, not after
    elif fleet is not None:
        raycluster.check_temp_dir(config.cluster_dir)  # for the Ray head this cluster starts
    ray_head: raycluster.StartingHead | None = None
    if external_kubeconfig is not None:
        state = cluster.attach(config, external_kubeconfig, progress)
        progress.step(f"using the cluster of {external_kubeconfig}; no control plane started")
    else:
        own_ray = fleet is not None and not fleet.ray.address
        state, ray_head = _start_control_plane(config, progress, binaries, with_ray=own_ray)
    state.settings = config.tunables()
    state.save()
    try:
        names = install_device_classes(state.kubeconfig)
        progress.step(f"DeviceClasses: {', '.join(names)}")
        if fleet is not None:  # even with empty pools: `testbed scale` fills them later
            state.starter = processes.this_process("testbed up")  # a second `up` says the nodes are coming
            state.save()
            start_fleet(state, fleet, progress, ray_head)
            state.starter = None
            state.save()
        return state
    except BaseException:
        down(config)
        raise


def _start_control_plane(
    config: ControlPlaneConfig, progress: Progress, binaries: Binaries | None, with_ray: bool
) -> tuple[cluster.ClusterState, raycluster.StartingHead | None]:
    """The control plane and, ``with_ray``, the fleet's Ray head, launched while etcd and
    the API server start: each takes about 3 s, mostly waiting."""
    if not with_ray:
        return cluster.up(config, progress, binaries), None
    heads: list[raycluster.StartingHead] = []

    def launch_ray(state: cluster.ClusterState) -> None:
        head = raycluster.launch_head(state.root, state.layout.log("ray"))
        state.processes.insert(0, head.record)
        heads.append(head)

    try:
        state = cluster.up(config, progress, binaries, alongside=launch_ray)
    except BaseException:
        for head in heads:  # stopped with the control plane; its temp dir is left to us
            raycluster.remove_temp_dir(head.cluster_root)
        raise
    return state, heads[0]


def check_real_kubelets(fleet: FleetFile, progress: Progress) -> None:
    """Refuse real-kubelet pools in one line before anything starts; build what they run."""
    reason = unsupported_reason()
    if reason:
        pools = ", ".join(p.name for p in fleet.pools if p.kubelet == "real")
        raise TestbedError(f"pool {pools}: {reason}", hint="run as root, or set `kubelet: fake` on that pool")
    ensure_node_binaries(progress)


def start_fleet(
    state: cluster.ClusterState, spec: FleetFile, progress: Progress, head: raycluster.StartingHead | None = None
) -> Fleet:
    """``head``: the cluster's Ray head, already launched (and recorded in ``state``)."""
    joined = spec.ray.address
    if joined:
        raycluster.check_reachable(joined)
        progress.step(f"joining the Ray cluster at {joined}")
    # Framed until this process is in Ray: most of Ray's start comes after its head listens.
    with contextlib.nullcontext() if joined else progress.task("starting Ray on 127.0.0.1"):
        if joined:
            address = joined
        elif head is not None:
            address = head.wait()
        else:
            record, address = raycluster.start_head(state.root, state.layout.log("ray"))
            state.processes.insert(0, record)
        fleet_record = state.fleet = cluster.FleetRecord(spec.model_dump(mode="json", by_alias=True), address)
        state.save()
        raycluster.connect(address, state.name, None if joined else state.root)
    nodes = config.nodes_dir(state.root)
    fleet_record.nodes_dir = str(nodes)
    state.save()
    fleet = Fleet(spec, state.kubeconfig, nodes, detached=True)
    fleet_record.fleet_id = fleet.id
    state.save()
    fleet.start(progress)
    return fleet


def attach_fleet(state: cluster.ClusterState) -> Fleet:
    """The fleet `testbed up` left running in the cluster's Ray."""
    record = state.fleet
    if record is None or not record.fleet_id or not record.ray_address:
        raise TestbedError(
            f"cluster {state.name!r} has no fleet",
            hint="start one with `testbed up --nodes N --profile P` or `--fleet FILE`",
        )
    spec = recorded_fleet(state)
    raycluster.check_reachable(record.ray_address)
    raycluster.connect(record.ray_address, state.name, state.root)
    return Fleet.attach(spec, state.kubeconfig, Path(record.nodes_dir), record.fleet_id)


def recorded_fleet(state: cluster.ClusterState) -> FleetFile:
    """The fleet `testbed up` (and every scale since) recorded for the cluster."""
    assert state.fleet is not None
    try:
        return recorded(state.fleet.spec, str(state.layout.state_file))
    except FleetFileError as exc:
        raise TestbedError(
            str(exc),
            hint=f"the fleet cannot be read back as it is; `testbed down --name {state.name}` stops it, "
            "and `testbed up` starts a new one",
        ) from None


def scale_pool(state: cluster.ClusterState, pool: str, count: int, progress: Progress) -> Fleet:
    """Interrupted, what the NodeHosts were told goes on there (fleet.ScaleInterrupted says
    what was given up): the count asked for is recorded all the same, so that `status`
    compares the nodes with it."""
    fleet = attach_fleet(state)
    try:
        fleet.scale(pool, count, progress, recorded=_recorder(state.root))
    except KeyboardInterrupt:
        fleet.pool(pool).count = count
        raise
    finally:
        assert state.fleet is not None  # attach_fleet found it
        state.fleet.spec = fleet.spec.model_dump(mode="json", by_alias=True)
        state.save()
    return fleet


def roll_driver_out(
    state: cluster.ClusterState,
    driver: str,
    command: list[str] | None,
    max_surge: int,
    max_unavailable: int,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Fleet.rollout on the running fleet; its pools' new generation and command are
    recorded before the first node rolls (nodes added later run them)."""
    fleet = attach_fleet(state)
    return fleet.rollout(driver, command, max_surge, max_unavailable, progress, recorded=_recorder(state.root))


def _recorder(root: Path) -> Callable[[FleetFile], None]:
    """What keeps a changed fleet spec in the cluster's state (read afresh, as another
    command may have saved it meanwhile)."""

    def record(spec: FleetFile) -> None:
        state = cluster.ClusterState.load(root)
        if state is not None and state.fleet is not None:
            state.fleet.spec = spec.model_dump(mode="json", by_alias=True)
            state.save()

    return record


def fault_injector(fleet: Fleet, cluster_root: Path | None = None) -> FaultInjector:
    """What applies a scenario's faults to ``fleet``: a hardware fault on each node its
    pattern names; a rollout on every node that runs the driver, as `testbed rollout`,
    holding the cluster's scale lock (``cluster_root``'s): one under way refuses it."""

    from testbed.scenarios.runner import Injected

    async def inject(fault: Fault) -> Injected:
        if fault.action == "rollout":
            return await _roll_out(fleet, fault, cluster_root)
        nodes = fleet.nodes_matching(fault.nodes)
        for node in nodes:
            await fleet.apply_fault(node, fault.action, fault.target, fault.message, fault.fatal)
        return Injected(nodes)

    return inject


async def _roll_out(fleet: Fleet, fault: Fault, cluster_root: Path | None) -> Injected:
    from testbed.scenarios.runner import Injected

    def refuse(who: str) -> None:
        raise TestbedError(f"{who} is under way", hint="a scenario's rollout waits for no scale or rollout")

    driver, (surge, unavailable) = str(fault.driver), fault.rollout_batch
    with locks.held(cluster_root / SCALE_LOCK, "a scenario's rollout", refuse) if cluster_root else nullcontext():
        recorded = _recorder(cluster_root) if cluster_root else None
        rolled = await fleet.roll_out(driver, None, surge, unavailable, recorded=recorded)
    return Injected([r["node"] for r in rolled], rollout_summary(driver, rolled))


def fleet_metrics(state: cluster.ClusterState) -> Callable[[], Awaitable[list[tuple[str, str]]]] | None:
    """Where a run reads the NodeHosts' metrics: through their actors (None: no fleet). A
    fleet that cannot be reached gives a failed scrape, so the report says so."""
    if not state.fleet_id:
        return None
    try:
        return attach_fleet(state).metrics_texts
    except TestbedError as exc:
        reason = f"the fleet cannot be reached: {exc.message}"
        log.warning("NodeHost metrics: %s", reason)

        async def unreachable() -> list[tuple[str, str]]:
            return [("", reason)]

        return unreachable


@contextlib.contextmanager
def scaling(root: Path, what: str, waiting: Callable[[str], None]) -> Iterator[None]:
    """One `testbed scale` of a cluster at a time: two would place the same nodes on two
    hosts and each record its own count. ``waiting`` is told whose scale this one waits
    for; a cluster `down` is taking away is refused."""
    with locks.held(root / SCALE_LOCK, holder=what, waiting=waiting):
        if taken_down(root):
            raise TestbedError(f"cluster {root.name!r} is being taken down (`testbed down`)")
        yield


def taken_down(root: Path) -> bool:
    return (root / TAKEN_DOWN).exists()


def _stop_scaling(root: Path, grace_s: float = SCALE_STOP_GRACE_S) -> None:
    """Scales under way stop before `down` takes Ray away from under them (they would wait
    a minute for it, then die with Ray's own message). Each is sent SIGTERM, as Ctrl-C."""
    lock = root / SCALE_LOCK
    deadline = time.monotonic() + grace_s
    signalled: set[int] = set()
    while (pid := locks.holder(lock)) is not None and time.monotonic() < deadline:
        if pid not in signalled:
            (root / TAKEN_DOWN).touch()
            signalled.add(pid)
            if _is_testbed(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        time.sleep(0.1)


def _is_testbed(pid: int) -> bool:
    """A lock's holder writes its pid just after it takes the lock: never signal a pid
    that is not (or no longer) a testbed command's."""
    try:
        return b"testbed" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def down(config: ControlPlaneConfig, keep_state: bool = False) -> list[str]:
    """Stop Ray (and with it the NodeHosts), then the control plane. The synthetic nodes
    are not asked to stop one by one: their directories go with the cluster's."""
    root = config.cluster_dir
    if cluster.owned(root):
        _stop_scaling(root)
    try:
        state = cluster.ClusterState.load(root) if root.exists() else None
    except TestbedError as unreadable:  # removed only when nothing uses it, Ray's files included
        cluster.refuse_while_in_use(unreadable, [root, raycluster.ray_temp_dir(root).parent])
        state = None
    left_out: list[str] = []
    if state is not None and state.attached_to and state.fleet_id:
        # The cluster stays: take the synthetic nodes out of it, in drain order.
        try:
            attach_fleet(state).stop(remove_nodes=True)
        except Exception as exc:  # Ray gone (its NodeHosts with it), or the cluster
            log.warning("could not drain the synthetic nodes out of %s: %s", state.attached_to, exc)
            left_out = _delete_fleet_nodes(state)
    elif state is not None and state.fleet is not None and state.fleet_id and state.fleet.joined_ray:
        # A Ray cluster the user runs outlives this one: its NodeHosts must not.
        try:
            attach_fleet(state).stop()
        except Exception as exc:  # that Ray gone too: nothing of ours left in it
            log.warning("could not stop the NodeHosts in the Ray cluster at %s: %s", state.fleet.joined_ray, exc)
    if state is not None and state.fleet is not None and raycluster.connected_to(state.fleet.ray_address):
        raycluster.disconnect()  # before the head stops, or Ray's client ends this process
    owned = cluster.owned(root)
    stopped = cluster.down(config, keep_state=keep_state)
    if state is not None or owned:
        where = root if state is None else state.root
        raycluster.remove_temp_dir(where)
        # Processes of their own, which may outlive their NodeHost: stopped by PID.
        stopped += stop_recorded_drivers(nodes_dir(where))
        if not keep_state:
            shutil.rmtree(nodes_dir(where), ignore_errors=True)
            prune_short_paths()
    if keep_state:
        (root / TAKEN_DOWN).unlink(missing_ok=True)
    if left_out:
        stopped.append(f"{len(left_out)} synthetic Nodes, deleted from the cluster directly (no NodeHost answered)")
    return stopped


def _delete_fleet_nodes(state: cluster.ClusterState) -> list[str]:
    """The fleet's Nodes in a cluster it attached to, when its NodeHosts cannot drain them."""
    assert state.fleet is not None
    pools = [str(pool["name"]) for pool in state.fleet.spec.get("pools", [])]
    try:
        return orphans.delete_pool_nodes(state.kubeconfig, pools)
    except Exception as exc:  # the cluster unreachable too: nothing more to do from here
        log.warning("could not delete the synthetic Nodes from %s either: %s", state.attached_to, exc)
        return []
