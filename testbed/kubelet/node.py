"""Node registration and heartbeat, as a kubelet does them.

As the kubelet registers (``initialNode``), the Node is created with its status filled
in: Ready, with capacity, addresses and node info, so the node lifecycle controller has
only to take off the not-ready taint the API server's admission puts on every new Node
(not to see it NotReady, then Ready). It carries labels and
(by default) a NoSchedule taint that keeps ordinary DaemonSets and workloads off
synthetic nodes; its Lease in ``kube-node-lease`` is renewed every 10 s so the node
lifecycle controller keeps it Ready.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from testbed import config
from testbed.keys import SERVED_BY_ANNOTATION, SYNTHETIC
from testbed.kubeapi import ApiError, KubeClient, Obj, path_for
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

LEASE_DURATION_S = 40
LEASE_RENEW_S = 10.0
SYNTHETIC_TAINT = {"key": SYNTHETIC, "value": "true", "effect": "NoSchedule"}
"""Every synthetic node carries its hardware profile here; real nodes do not."""
SYNTHETIC_TOLERATION = {
    "key": SYNTHETIC,
    "operator": "Exists",
    "effect": "NoSchedule",
}


def now_rfc3339(micro: bool = False) -> str:
    """UTC now, as the API wants it. Formatted by hand: every lease renewal asks, and
    datetime.strftime showed up in a NodeHost's profile."""
    now = time.time()
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    return f"{seconds}.{int(now % 1 * 1_000_000):06d}Z" if micro else f"{seconds}Z"


@dataclass
class NodeSpec:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: list[Obj] = field(default_factory=lambda: [dict(SYNTHETIC_TAINT)])
    capacity: Mapping[str, str] = field(
        default_factory=lambda: {
            "cpu": "64",
            "memory": "512Gi",
            "pods": "250",
            "ephemeral-storage": "1Ti",
        }
    )

    def internal_ip(self) -> str:
        digest = hashlib.sha256(self.name.encode()).digest()
        return f"10.{100 + digest[0] % 100}.{digest[1]}.{digest[2] % 250 + 2}"


CONTROLLER_MANAGED_ATTACH = "volumes.kubernetes.io/controller-managed-attach-detach"
"""The kubelet's default: volumes are attached and detached by the controller manager."""


def node_object(spec: NodeSpec) -> Obj:
    """The Node as a kubelet registers it: metadata, spec and its first status."""
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        # The kubelet still sets the deprecated labels; without them the node lifecycle
        # controller patches them in.
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        SYNTHETIC: "true",
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": {CONTROLLER_MANAGED_ATTACH: "true"}},
        "spec": {"taints": list(spec.taints)},
        **node_status(spec),
    }


def node_status(spec: NodeSpec) -> Obj:
    stamp = now_rfc3339()

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }

    return {
        "status": {
            "capacity": dict(spec.capacity),
            "allocatable": dict(spec.capacity),
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID"),
                condition(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "dra-testbed fake kubelet is posting ready status",
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": spec.internal_ip()},
                {"type": "Hostname", "address": spec.name},
            ],
            "nodeInfo": {
                "kubeletVersion": f"{config.KUBERNETES_VERSION}-dra-testbed",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "dra-testbed://1",
                "kernelVersion": "",
                "osImage": "dra-testbed synthetic node",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
    }


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


TAKE_POLL_S = 1.0


class NodeAgent:
    def __init__(self, client: KubeClient, spec: NodeSpec, fence: LeaseFence | None = None):
        self.client = client
        self.spec = spec
        self.fence = fence
        self.lost = False
        """Another server took the node (with a fence): nothing is renewed any more."""
        self.uid = ""
        self.created = False
        """True if register() made a new Node (rather than adopting one)."""
        self._lease: Obj | None = None
        """The Lease as last written or read; renewals update it."""
        self._renewals = 0
        self._task: asyncio.Task[None] | None = None

    async def register(self) -> None:
        """Create the Node, Ready from the start, or adopt an existing one of the same name
        and mark it Ready (a write that waits for the Lease when fenced)."""
        path = path_for("v1", "nodes", self.spec.name)
        try:
            node = await self.client.create(path_for("v1", "nodes"), node_object(self.spec))
            self.created = True
        except ApiError as exc:
            if not exc.conflict:
                raise
            node = await self.client.get(path)
        self.uid = node["metadata"]["uid"]
        if self.fence is not None:
            await self._take_lease()  # before any write in the node's name
        if not self.created:
            await self.client.patch(
                path_for("v1", "nodes", self.spec.name, subresource="status"),
                node_status(self.spec),
                "strategic",
            )
        if self.fence is None:
            await self.renew_lease()

    def _lease_path(self) -> str:
        return path_for("coordination.k8s.io/v1", "leases", self.spec.name, namespace="kube-node-lease")

    async def _read_lease(self) -> Obj | None:
        try:
            return await self.client.get(self._lease_path())
        except ApiError as exc:
            if not exc.not_found:
                raise
            return None

    async def _take_lease(self) -> None:
        """Stamp the Lease as this server's once its previous holder's claim has lapsed."""
        assert self.fence is not None
        # A Node just created has no Lease: create it without asking.
        lease = None if self.created else await self._read_lease()
        while True:
            if lease is None:
                try:
                    self._lease = await self.client.create(self._lease_path().rpartition("/")[0], self._new_lease())
                    return
                except ApiError as exc:
                    if not exc.conflict:
                        raise
            elif (wait := self.fence.wait_s(lease)) > 0:
                await asyncio.sleep(min(wait, TAKE_POLL_S))
            else:
                try:
                    self._lease = await self.client.replace(self._lease_path(), self._stamped(lease))
                    return
                except ApiError as exc:
                    if not exc.conflict:  # 409: the holder renewed meanwhile; judge it again
                        raise
            lease = await self._read_lease()

    async def renew_lease(self) -> None:
        """As a kubelet does: PUT the Lease it last saw with a new renewTime; on a conflict
        or a missing Lease, read it again (or create it) next time round. No PATCH: an
        update of a known object is the cheapest write the API server has."""
        leases = path_for("coordination.k8s.io/v1", "leases", namespace="kube-node-lease")
        if self.lost:
            return
        if self._lease is None:
            # A Node this agent just created has no Lease yet: create it without asking.
            if not (self.created and self._renewals == 0):
                try:
                    self._lease = await self.client.get(f"{leases}/{self.spec.name}")
                except ApiError as exc:
                    if not exc.not_found:
                        raise
            if self._lease is None:
                try:
                    self._lease = await self.client.create(leases, self._new_lease())
                    self._renewals += 1
                    return
                except ApiError as exc:
                    if not exc.conflict:  # 409: a retried create that landed, or a stale Lease
                        raise
                    self._lease = await self.client.get(f"{leases}/{self.spec.name}")
            if self._taken_by_another(self._lease):
                return
        self._renewals += 1
        lease = dict(self._lease, spec=self._lease_spec())
        try:
            self._lease = await self.client.replace(f"{leases}/{self.spec.name}", lease)
        except ApiError as exc:
            self._lease = None  # read it afresh next time
            if not (exc.conflict or exc.not_found):
                raise
            if exc.conflict and self.fence is not None:  # at once: was it another server's write?
                self._lease = await self.client.get(f"{leases}/{self.spec.name}")
                self._taken_by_another(self._lease)

    def _taken_by_another(self, lease: Obj) -> bool:
        if self.fence is None:
            return False
        stamp = lease.get("metadata", {}).get("annotations", {}).get(SERVED_BY_ANNOTATION)
        if stamp == self.fence.stamp:
            return False
        self.lost = True
        self._lease = None
        self.fence.lost(stamp)
        return True

    def _stamped(self, lease: Obj) -> Obj:
        assert self.fence is not None
        meta = dict(lease["metadata"])
        meta["annotations"] = {**meta.get("annotations", {}), SERVED_BY_ANNOTATION: self.fence.stamp}
        return dict(lease, metadata=meta, spec=self._lease_spec())

    def _lease_spec(self) -> Obj:
        return {
            "holderIdentity": self.spec.name,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": now_rfc3339(micro=True),
        }

    def _new_lease(self) -> Obj:
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.spec.name, "uid": self.uid}
        meta: Obj = {"name": self.spec.name, "ownerReferences": [owner]}
        if self.fence is not None:
            meta["annotations"] = {SERVED_BY_ANNOTATION: self.fence.stamp}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": self._lease_spec()}

    def start(self, first_delay_s: float | None = None) -> None:
        """Renew every 10 s. The first renewal is spread over that interval, so a fleet's
        nodes do not all renew in the same instant."""
        if first_delay_s is None:
            first_delay_s = random.uniform(0.5, LEASE_RENEW_S)
        self._task = asyncio.create_task(self._renew_forever(first_delay_s), name=f"lease-{self.spec.name}")

    async def _renew_forever(self, delay_s: float) -> None:
        while not self.lost:
            await asyncio.sleep(delay_s)
            delay_s = LEASE_RENEW_S
            try:
                await self.renew_lease()
            except Exception as exc:  # keep trying: a kubelet never gives up on its lease
                log.warning("lease renewal for %s failed: %s", self.spec.name, exc)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def delete(self) -> None:
        await self.client.delete_if_exists(path_for("v1", "nodes", self.spec.name))
