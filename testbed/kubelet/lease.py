"""A node's Lease in ``kube-node-lease``, kept as the kubelet's lease controller keeps it.

The node lifecycle controller judges a node by this Lease, so how it is renewed through
failures is behaviour a fleet relies on. Each sync, as upstream's controller does (read
in component-helpers' ``apimachinery/lease`` and the kubelet's ``SetNodeOwnerFunc``):

- PUT the Lease as last seen with a new renewTime, up to five times at once; a conflict
  reads it again (or creates it) before the next try;
- when that fails, read the Lease (creating it if missing) with a backoff from 0.2 s
  doubling up to 7 s, for as long as it takes, then PUT once more;
- a Lease is created, and one without an owner is written, only with its Node as owner,
  read from the API server: while the Node is gone, no Lease is made.

A fleet's node may be served by one of several NodeHosts (``LeaseFence``): its Lease
carries the serving one's stamp, and a server that finds another's stamp writes nothing
more.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from testbed.keys import SERVED_BY_ANNOTATION
from testbed.kubeapi import ApiError, KubeClient, Obj, now_rfc3339, path_for

log = logging.getLogger(__name__)

DURATION_S = 40
RENEW_S = 10.0
RENEW_JITTER = 0.04
"""The kubelet waits ``RENEW_S`` times 1 to 1.04 after each sync ends."""
UPDATE_TRIES = 5
HEARTBEAT_TIMEOUT_S = 10.0
"""The kubelet's heartbeat client (Lease and Node status requests) gives each request its
status update frequency, 10 s (at most the lease's duration)."""
ENSURE_FIRST_BACKOFF_S = 0.2
ENSURE_MAX_BACKOFF_S = 7.0
TAKE_POLL_S = 1.0

LEASES = path_for("coordination.k8s.io/v1", "leases", namespace="kube-node-lease")


class LeaseFence(Protocol):
    """For a node that one of several servers may run (a fleet's NodeHosts): the Lease
    carries the serving one's stamp, and only it renews the Lease (fleet/fencing.py)."""

    stamp: str

    def wait_s(self, lease: Obj) -> float:
        """How long before this server may take the node from the Lease's holder."""
        ...

    def lost(self, stamp: str | None) -> None:
        """Another server took the node: stop serving it, writing nothing more."""
        ...


class NodeLease:
    def __init__(self, client: KubeClient, node: str, fence: LeaseFence | None = None):
        self.client = client
        self.node = node
        self.fence = fence
        self.lost = False
        """Another server took the node (with a fence): nothing is written any more."""
        self.latest: Obj | None = None
        """The Lease as last written or read."""
        self._new_node_uid = ""
        """The uid of a Node just created, whose Lease cannot exist yet (see `node_created`)."""

    @property
    def path(self) -> str:
        return f"{LEASES}/{self.node}"

    def node_created(self, uid: str) -> None:
        """The caller just created the Node: its first Lease is created without first
        reading it or the Node (the kubelet reads both; the outcome is the same, and a
        fleet start saves two requests per node)."""
        self._new_node_uid = uid

    async def sync(self) -> None:
        """One renewal, as the kubelet's lease controller makes it every 10 s."""
        if self.lost:
            return
        if self.latest is not None and await self._update(self.latest):
            return
        lease, created = await self._ensure_with_backoff()
        self.latest = lease
        if lease is not None and not created and not await self._update(lease):
            log.warning("lease of node %s: %d renewals failed; next sync in %.0f s", self.node, UPDATE_TRIES, RENEW_S)

    async def _update(self, base: Obj) -> bool:
        for attempt in range(UPDATE_TRIES):
            if self.lost:
                return False
            try:
                lease = await self._renewed(base)
                self.latest = await self._call("PUT", self.path, lease)
                return True
            except Exception as exc:  # the server away or slow: try again at once, as upstream
                log.debug("lease of node %s: renewal failed: %s", self.node, exc)
                if isinstance(exc, ApiError) and exc.conflict:  # another writer since: read it again
                    again, _ = await self._ensure_with_backoff()
                    if again is None:
                        return False
                    base = again
                elif attempt > 0:
                    self.client.close_idle_connections()
        return False

    async def _call(self, method: str, path: str, body: Obj | None = None) -> Obj:
        """One request of the heartbeat client: one try, its own timeout."""
        return await self.client.request(method, path, body, timeout_s=HEARTBEAT_TIMEOUT_S, attempts=1)

    async def _ensure_with_backoff(self) -> tuple[Obj | None, bool]:
        """The Lease as the server has it, created if missing; (None, False) when it may
        not be made (the Node is gone) or the node was lost to another server."""
        backoff = ENSURE_FIRST_BACKOFF_S / 2
        while not self.lost:
            try:
                return await self._ensure()
            except Exception as exc:
                backoff = min(2 * backoff, ENSURE_MAX_BACKOFF_S)
                log.info("lease of node %s: cannot read or create it (%s); again in %.1f s", self.node, exc, backoff)
                await asyncio.sleep(backoff)
        return None, False

    async def _ensure(self) -> tuple[Obj | None, bool]:
        if not self._new_node_uid:
            try:
                lease = await self._call("GET", self.path)
            except ApiError as exc:
                if not exc.not_found:
                    raise
            else:
                return (None, False) if self._taken_by_another(lease) else (lease, False)
        uid, self._new_node_uid = self._new_node_uid or await self._node_uid(), ""
        if not uid:
            return None, False
        # A 409 (made meanwhile, by another server say) is retried as any error: read then.
        return await self._call("POST", LEASES, self._new(uid)), True

    async def _renewed(self, base: Obj) -> Obj:
        """``base`` with a new renewTime, and its Node as owner if it had none."""
        meta = base.get("metadata", {})
        if not meta.get("ownerReferences"):
            uid = await self._node_uid()
            if not uid:
                raise ApiError(404, "NotFound", f"node {self.node} is gone: its Lease is given no owner")
            meta = dict(meta, ownerReferences=[_owner(self.node, uid)])
        return dict(base, metadata=meta, spec=self._spec())

    async def _node_uid(self) -> str:
        """The Node's uid, or "" if there is no such Node."""
        try:
            node = await self._call("GET", path_for("v1", "nodes", self.node))
        except ApiError as exc:
            if not exc.not_found:
                raise
            log.warning("lease of node %s: the Node is gone, so no Lease is made for it", self.node)
            return ""
        return str(node["metadata"]["uid"])

    async def take(self) -> None:
        """Stamp the Lease as this server's once its previous holder's claim has lapsed
        (a fenced node, before any write in its name)."""
        assert self.fence is not None
        lease = None if self._new_node_uid else await self._read()
        while True:
            if lease is None:
                uid, self._new_node_uid = self._new_node_uid or await self._node_uid(), ""
                if not uid:
                    raise ApiError(404, "NotFound", f"node {self.node} is gone: it cannot be served")
                try:
                    self.latest = await self.client.create(LEASES, self._new(uid))
                    return
                except ApiError as exc:
                    if not exc.conflict:
                        raise
            elif (wait := self.fence.wait_s(lease)) > 0:
                await asyncio.sleep(min(wait, TAKE_POLL_S))
            else:
                stamped = self._stamped(lease)
                try:
                    self.latest = await self.client.replace(self.path, stamped)
                    return
                except ApiError as exc:
                    if not exc.conflict:  # 409: the holder renewed meanwhile; judge it again
                        raise
            lease = await self._read()

    async def _read(self) -> Obj | None:
        try:
            return await self.client.get(self.path)
        except ApiError as exc:
            if not exc.not_found:
                raise
            return None

    def _taken_by_another(self, lease: Obj) -> bool:
        if self.fence is None:
            return False
        stamp = lease.get("metadata", {}).get("annotations", {}).get(SERVED_BY_ANNOTATION)
        if stamp == self.fence.stamp:
            return False
        self.lost = True
        self.latest = None
        self.fence.lost(stamp)
        return True

    def _stamped(self, lease: Obj) -> Obj:
        assert self.fence is not None
        meta = dict(lease["metadata"])
        meta["annotations"] = {**meta.get("annotations", {}), SERVED_BY_ANNOTATION: self.fence.stamp}
        return dict(lease, metadata=meta, spec=self._spec())

    def _spec(self) -> Obj:
        return {"holderIdentity": self.node, "leaseDurationSeconds": DURATION_S, "renewTime": now_rfc3339(micro=True)}

    def _new(self, node_uid: str) -> Obj:
        meta: Obj = {"name": self.node, "ownerReferences": [_owner(self.node, node_uid)]}
        if self.fence is not None:
            meta["annotations"] = {SERVED_BY_ANNOTATION: self.fence.stamp}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": self._spec()}


def _owner(node: str, uid: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
