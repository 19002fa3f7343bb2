"""One node, one server: NodeHosts fence each other through the node's own Lease.

When a Ray host is lost, Ray starts its NodeHosts again on another machine, and they
start the same nodes. The lost machine may still be alive (cut off from Ray, not from
the API server), so a new server must not serve a node before the old one let it go,
or both would run its pods and publish its slices. Each server stamps the node's Lease
in ``kube-node-lease`` (annotation ``dra-testbed.io/served-by``) when it takes the node:

- a new server takes a node stamped by another only once that Lease has gone unrenewed
  for its duration (as the node lifecycle controller judges a kubelet gone), or at once
  when the old server ran on the same Ray node and its process has exited;
- a server whose renewal finds another's stamp lets the node go at once, and writes
  nothing more for it.
"""

from __future__ import annotations

import calendar
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.keys import SERVED_BY_ANNOTATION
from testbed.kubeapi import Obj

log = logging.getLogger(__name__)

CLOCK_SKEW_S = 2.0
"""How far apart the clocks of two Ray hosts may be: added to every Lease's duration."""


@dataclass(frozen=True)
class Server:
    """One run of one NodeHost: Ray restarts an actor under the same name, so the name
    alone cannot tell the old server from the new."""

    host: str
    incarnation: str
    machine: str
    """The Ray node it runs on (a process ID means something only there)."""
    pid: int

    def stamp(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def read(cls, stamp: str | None) -> Server | None:
        if not stamp:
            return None
        try:
            return cls(**json.loads(stamp))
        except (TypeError, ValueError):
            return None

    def __str__(self) -> str:
        return f"{self.host} (pid {self.pid} on Ray node {self.machine[:12]})"


def process_alive(pid: int) -> bool:
    """A zombie has exited: it serves nothing any more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def parse_time(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC time as the API writes it."""
    seconds, _, fraction = stamp.rstrip("Z").partition(".")
    whole = calendar.timegm(time.strptime(seconds, "%Y-%m-%dT%H:%M:%S"))
    return whole + (float(f"0.{fraction}") if fraction else 0.0)


def seconds_until_free(
    lease: Obj, me: Server, now: float, alive: Callable[[int], bool] = process_alive
) -> tuple[float, Server | None]:
    """How long ``me`` must wait before taking the node whose Lease this is (0: now), and
    the server that holds it meanwhile."""
    stamp = lease.get("metadata", {}).get("annotations", {}).get(SERVED_BY_ANNOTATION)
    if stamp == me.stamp():
        return 0.0, None
    previous = Server.read(stamp)
    if previous is not None and previous.machine == me.machine and not alive(previous.pid):
        return 0.0, previous
    spec = lease.get("spec", {})
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    if not renewed:
        return 0.0, previous
    expires = parse_time(renewed) + float(spec.get("leaseDurationSeconds") or 40) + CLOCK_SKEW_S
    return max(0.0, expires - now), previous


class NodeFence:
    """What a node's Lease agent is given: this server's stamp, when it may take the node,
    and what to do once another server has."""

    def __init__(self, node: str, me: Server, lost: Callable[[str, Server | None], None]):
        self.node = node
        self.me = me
        self.stamp = me.stamp()
        self._lost = lost
        self._waited_for: Server | None = None

    def wait_s(self, lease: Obj) -> float:
        wait, holder = seconds_until_free(lease, self.me, time.time())
        if wait > 0 and holder != self._waited_for:
            self._waited_for = holder
            log.warning(
                "node %s: waiting up to %.0f s for its previous server %s to let it go (its Lease must lapse)",
                self.node,
                wait,
                holder or "(a kubelet)",
            )
        return wait

    def lost(self, stamp: str | None) -> None:
        holder = Server.read(stamp)
        log.warning("node %s is served by %s now: %s lets it go", self.node, holder or stamp, self.me)
        self._lost(self.node, holder)
