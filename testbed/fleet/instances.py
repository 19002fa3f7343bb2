"""A driver instance on its node, beyond its process (external.py): waiting until the
node's kubelet, fake or real, registered it, and replacing it with the next generation
as a DaemonSet's rolling update replaces its pod."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.errors import TestbedError
from testbed.fleet.external import ExternalDriver
from testbed.kubelet.plugins import PluginManager
from testbed.tasks import first_of

if TYPE_CHECKING:
    from testbed.realnode.node import ProcessNode

CRASHES_WHILE_STARTING = 2
"""An external driver whose process ended this often before it ever registered fails the
node's start (at once: the second restart would wait for the kubelet's 10 s back-off)."""


@dataclass(frozen=True)
class RolledOut:
    """One node's driver replaced by a rollout."""

    node: str
    generation: int
    seconds: float
    """From the start of the node's turn until the new instance was registered and the old one stopped."""
    unavailable_s: float
    """How long the kubelet had no instance to call: the old one stopped until the new
    one registered (0 with surge: the new one registered first)."""


async def wait_registered(
    plugins: PluginManager, external: ExternalDriver, timeout_s: float, known: Collection[object] | None = None
) -> None:
    """Until the kubelet registered the external driver: woken by the plugin watcher and by
    the driver's restarts, so a driver that keeps crashing fails the start early. With
    ``known`` (a rollout's old instances, held, so that no new one can take an old one's
    id()), until an instance other than those is connected too: only then does the kubelet
    call it rather than an old one, so only then may the old one go (as a DaemonSet deletes
    the old pod once the new one is ready)."""
    try:
        async with asyncio.timeout(max(timeout_s, 0.0)):
            while True:
                changed, restarted = plugins.changed, external.changed  # before looking: no wake-up lost
                instances = plugins.instances(external.spec.name)
                if known is None and instances:
                    return
                if known is not None and any(p.connected and all(p is not k for k in known) for p in instances):
                    return
                if external.ended >= CRASHES_WHILE_STARTING:
                    raise _not_registered(external, _why_ended(external))
                await first_of(changed.wait(), restarted.wait())
    except TimeoutError:
        raise _not_registered(external, f"not within {timeout_s:.0f} s") from None


async def wait_connected(
    node: ProcessNode,
    external: ExternalDriver,
    timeout_s: float,
    since: int,
    replacing: ExternalDriver | None = None,
    made_before: Collection[int] = (),
) -> None:
    """The same for a real kubelet, which says so only in its log: until it connected to
    an instance of ``external``'s driver after the log's offset ``since`` (the instance
    started then, or a rollout's new one beside the old). ``replacing``: the old
    instance of a rollout, whose own connections do not count, though the log shows them
    anew when it came back from a restart meanwhile (the kubelet reconnects with a
    back-off): a socket named after the new pod's UID is the new one's, one named after
    the old pod's is not, and of a driver whose names carry neither, only a socket made
    since the new instance started counts: one not among ``made_before`` (socket_inodes,
    taken before it started)."""

    def its_own(endpoint: str) -> bool:
        if replacing is None or (external.pod_uid and external.pod_uid in endpoint):
            return True
        if replacing.pod_uid and replacing.pod_uid in endpoint:
            return False
        try:
            return os.stat(endpoint).st_ino not in made_before
        except OSError:
            return False

    def connected() -> bool:
        return any(
            up and name == external.spec.name and its_own(endpoint)
            for (name, endpoint), up in node.connections(since).items()
        )

    deadline = time.monotonic() + timeout_s
    while not connected():
        if external.ended >= CRASHES_WHILE_STARTING:
            raise _not_registered(external, _why_ended(external))
        if time.monotonic() > deadline:
            raise _not_registered(external, f"not within {timeout_s:.0f} s; the kubelet's log is {node.log('kubelet')}")
        await asyncio.sleep(0.2)


async def replace_instance(
    instances: list[ExternalDriver],
    new: ExternalDriver,
    environment: Mapping[str, str],
    surge: bool,
    registered: Callable[[], Awaitable[None]],
    started: float,
    before_start: Callable[[], None] = lambda: None,
) -> RolledOut:
    """Put ``new`` in the place of the instance of its driver in ``instances``, as a
    DaemonSet's rolling update replaces its pod: with ``surge`` it starts beside the old
    one, which stops once ``registered`` returned (maxSurge); else the old one stops
    first (maxUnavailable). A surge that fails leaves the old one serving. ``started``:
    when the node's turn began (``time.monotonic()``). ``before_start``: called as the new
    one is about to start, the old one stopped if it was to be: what ``registered`` is to
    tell the new instance from is taken then (a stopped instance's socket inodes and
    objects are free to be taken by the new one's)."""
    index = next(i for i, e in enumerate(instances) if e.spec.name == new.spec.name)
    old, stopped_at = instances[index], None
    if not surge:
        stopped_at = time.monotonic()
        await old.stop()
    instances[index] = new  # from here on the node's: drained and stopped with it
    before = _sockets(new)
    before_start()
    try:
        await new.start(environment, beside=old if surge else None)
        await registered()
    except BaseException:
        if surge:  # as a DaemonSet's surge pod that never gets ready: the old one serves on
            instances[index] = old
            await new.stop()
        raise  # else the new one is the node's, restarted with back-off while it fails
    registered_at = time.monotonic()
    if surge:
        made = [path for path, inode in _sockets(new).items() if before.get(path) != inode]
        await old.stop()
        if made and not any(path.exists() for path in made):
            raise _sockets_taken(new, made)
    return RolledOut(
        new.node,
        new.spec.generation,
        time.monotonic() - started,
        0.0 if stopped_at is None else registered_at - stopped_at,
    )


def socket_inodes(external: ExternalDriver) -> set[int]:
    """The sockets in its node's registry and its driver's plugin directory now, by inode."""
    return set(_sockets(external).values())


def _sockets(external: ExternalDriver) -> dict[Path, int]:
    """The unix sockets in its node's registry and its own plugin directory, by inode."""
    kubelet = external.root / "kubelet"
    found: dict[Path, int] = {}
    for directory in (kubelet / "plugins_registry", kubelet / "plugins" / external.spec.name):
        for path in directory.rglob("*") if directory.is_dir() else []:
            with contextlib.suppress(OSError):
                status = path.lstat()
                if stat.S_ISSOCK(status.st_mode):
                    found[path] = status.st_ino
    return found


def _sockets_taken(new: ExternalDriver, made: list[Path]) -> TestbedError:
    """A surge whose old instance, stopping, removed the sockets the new one had made at
    the same paths: on a real node too, the kubelet is left with no instance to call."""
    names = ", ".join(sorted(path.name for path in made))
    return TestbedError(
        f"node {new.node}: the old instance of {new.spec.name}, as it stopped, removed the sockets the new one "
        f"had made at the same paths ({names}): the kubelet has no instance of it to call",
        hint="a driver whose socket names do not carry its pod's UID cannot run two instances side by side: "
        "roll it out with --max-unavailable 1 (which serves this node again), or name its sockets after "
        "$POD_UID (the kubeletplugin helper's RollingUpdate option)",
    )


def _why_ended(external: ExternalDriver) -> str:
    if not external.liveness_kills:
        return f"it exited {external.ended} times"
    return (
        f"it ended {external.ended} times, killed {external.liveness_kills} of them for failing "
        "its liveness probe: does it serve grpc.health.v1 on $LIVENESS_PORT, within the probe's initialDelaySeconds?"
    )


def _not_registered(external: ExternalDriver, why: str) -> TestbedError:
    return TestbedError(
        f"node {external.node}: driver {external.spec.name} did not register with the kubelet ({why})",
        detail=external.log_tail(),
        hint=f"it must create its registration socket in $KUBELET_REGISTRAR_DIRECTORY_PATH; "
        f"its log is {external.log_path}",
    )
