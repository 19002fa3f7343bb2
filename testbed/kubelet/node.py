"""Node registration and heartbeat, as a kubelet does them.

As the kubelet registers (``initialNode``), the Node is created with its status filled
in: Ready, with capacity, addresses and node info, so the node lifecycle controller has
only to take off the not-ready taint the API server's admission puts on every new Node
(not to see it NotReady, then Ready). It carries labels and
(by default) a NoSchedule taint that keeps ordinary DaemonSets and workloads off
synthetic nodes; its Lease in ``kube-node-lease`` is renewed every 10 s so the node
lifecycle controller keeps it Ready. Every 10 s too, its status is written when the Node
as last seen differs from it (marked Unknown, say) and every 5 minutes (nodestatus.py):
the kubelet watches its own Node for that, here through a ``NodeWatcher``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from testbed import config
from testbed.keys import SYNTHETIC
from testbed.kubeapi import PATCH_TYPES, ApiError, KubeClient, Obj, now_rfc3339, path_for, until_answered
from testbed.kubelet import lease, nodestatus
from testbed.kubelet.containerevents import ImageStore
from testbed.kubelet.events import EventRecorder, write_event
from testbed.kubelet.lease import LeaseFence, NodeLease
from testbed.routedwatch import RoutedWatch
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SYNTHETIC_TAINT = {"key": SYNTHETIC, "value": "true", "effect": "NoSchedule"}
"""Every synthetic node carries its hardware profile here; real nodes do not."""
SYNTHETIC_TOLERATION = {
    "key": SYNTHETIC,
    "operator": "Exists",
    "effect": "NoSchedule",
}


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
    declared_features: list[str] = field(default_factory=list)
    """``status.declaredFeatures``, as declared.py works them out."""
    address: str | None = None
    """Its InternalIP, given by its fleet (unique within it: FleetFile.node_address);
    None: one derived from its name."""

    def internal_ip(self) -> str:
        if self.address is not None:
            return self.address
        # Outside a fleet's addresses (10.100-199): a node started on its own, or by
        # `testbed sanity`, never shares one with a fleet's node.
        digest = hashlib.sha256(self.name.encode()).digest()
        return f"10.{200 + digest[0] % 55}.{digest[1]}.{digest[2] % 250 + 2}"


HOSTNAME_LABEL = "kubernetes.io/hostname"
CONTROLLER_MANAGED_ATTACH = "volumes.kubernetes.io/controller-managed-attach-detach"
"""The kubelet's default: volumes are attached and detached by the controller manager."""


def node_object(spec: NodeSpec) -> Obj:
    """The Node as a kubelet registers it: metadata, spec and its first status."""
    labels = {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        # The kubelet still sets the deprecated labels; without them the node lifecycle
        # controller patches them in.
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        SYNTHETIC: "true",
        **spec.labels,
        HOSTNAME_LABEL: spec.name,  # a host's watch of its Nodes selects and routes by it
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": {CONTROLLER_MANAGED_ATTACH: "true"}},
        "spec": {"taints": list(spec.taints)},
        **node_status(spec),
    }


KERNEL_VERSION = os.uname().release
"""The kernel a synthetic node's pods would run on: this machine's."""


def _machine_identity(node: str) -> dict[str, str]:
    """What a real node reads from /etc/machine-id, its firmware and the running kernel:
    one per node name, the same at every start (a synthetic machine never reboots, so
    its kubelet never reports it rebooted)."""
    seed = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.nodes.dra-testbed.io")
    return {
        "machineID": seed.hex,
        "systemUUID": str(uuid.uuid5(seed, "system")).upper(),
        "bootID": str(uuid.uuid5(seed, "boot")),
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

    declared = {"declaredFeatures": list(spec.declared_features)} if spec.declared_features else {}
    return {
        "status": {
            **declared,
            "capacity": dict(spec.capacity),
            "allocatable": dict(spec.capacity),
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status",
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
                "kernelVersion": KERNEL_VERSION,
                "osImage": "dra-testbed synthetic node",
                "runningInUserNamespace": False,
                **_machine_identity(spec.name),
            },
        }
    }


def _version(obj: Obj) -> int:
    """An object's resourceVersion as a number (etcd's revision), to tell a newer state
    from an older one arriving late; -1 if it is not one."""
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return -1


class NodeWatcher(RoutedWatch):
    """The Node of one fake kubelet (as a kubelet watches its own) or of every node of a
    NodeHost (one watch, routed by the hostname label: routedwatch.py)."""

    def __init__(self, client: KubeClient, params: dict[str, str] | None):
        super().__init__(client, path_for("v1", "nodes"), HOSTNAME_LABEL, params)

    @classmethod
    def for_node(cls, client: KubeClient, node: str) -> NodeWatcher:
        return cls(client, {"fieldSelector": f"metadata.name={node}"})

    @classmethod
    def for_host(cls, client: KubeClient) -> NodeWatcher:
        return cls(client, None)


class NodeAgent:
    def __init__(self, client: KubeClient, spec: NodeSpec, fence: LeaseFence | None = None):
        self.client = client
        self.spec = spec
        self.lease = NodeLease(client, spec.name, fence)
        self.uid = ""
        self.created = False
        """True if register() made a new Node (rather than adopting one)."""
        self._task: asyncio.Task[None] | None = None
        self.observed: Obj | None = None
        """The Node as last seen: written, read, or from the watch (``observe``)."""
        self._own_status = node_status(spec)["status"]
        """What the kubelet sets in the status (its stamps are replaced on each write)."""
        self._verified: Obj | None = None
        """The Node last found to need no status change (skips working it out again)."""
        self._reports = nodestatus.ReportClock()
        self._events = EventRecorder(spec.name)
        self._unschedulable = False
        """Whether the Node was cordoned when last looked at (a kubelet starts from False)."""

    def report_images(self, images: ImageStore) -> None:
        """List the node's images in its status as the kubelet lists its runtime's: from
        the next status sync on, and again at the one after an image is added."""

        def changed() -> None:
            self._own_status["images"] = images.node_status()
            self._verified = None

        images.on_change = changed
        if images.names():
            changed()

    async def register(self) -> None:
        """Create the Node, Ready from the start, or adopt an existing one of the same name
        and mark it Ready (a write that waits for the Lease when fenced)."""
        node = await until_answered(self._create_or_adopt, f"registering node {self.spec.name}")
        self.uid = node["metadata"]["uid"]
        self.observe("ADDED", node)
        if self.created:
            self.lease.node_created(self.uid)
        if self.lease.fence is not None:  # before any write in the node's name
            await until_answered(self.lease.take, f"taking the Lease of node {self.spec.name}")
        if self.created:
            self._reports.reported(time.monotonic(), changed=True)  # the create carried the status
        else:
            await self.sync_status()  # a restarted kubelet's first sync reports
        if self.lease.fence is None:
            await self.lease.sync()

    async def _create_or_adopt(self) -> Obj:
        body = node_object(self.spec)
        if "images" in self._own_status:  # as the kubelet's first status: its setters all ran
            body["status"]["images"] = self._own_status["images"]
        try:
            node = await self.client.create(path_for("v1", "nodes"), body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            return await self.client.get(path_for("v1", "nodes", self.spec.name))
        self.created = True
        return node

    def observe(self, kind: str, node: Obj) -> None:
        """The Node as the API server has it now (a watch event or an answer)."""
        if kind == "DELETED":
            self.observed = None
        elif self.observed is None or _version(node) >= _version(self.observed):
            self.observed = node

    async def sync_status(self) -> None:
        """Write the Node's status if it differs from what the kubelet would set, or a
        periodic report is due (nodestatus.py). Up to five tries, each after the first
        reading the Node afresh, as the kubelet's ``updateNodeStatus`` does."""
        failure: Exception | None = None
        for attempt in range(nodestatus.STATUS_UPDATE_TRIES):
            if self.lost:
                return
            try:
                if attempt > 0 or self.observed is None:
                    self.observed = await self.client.request(
                        "GET",
                        path_for("v1", "nodes", self.spec.name),
                        timeout_s=lease.HEARTBEAT_TIMEOUT_S,
                        attempts=1,
                    )
                await self._report_status()
                return
            except Exception as exc:  # each try may fail its own way; the last one is raised
                failure = exc
                if attempt > 0:  # as the kubelet after a second failed heartbeat
                    self.client.close_idle_connections()
        assert failure is not None
        raise failure

    async def _report_status(self) -> None:
        node = self.observed
        assert node is not None
        now = time.monotonic()
        due = self._reports.due(now)
        if node is self._verified and not due:
            return
        status = node.get("status", {})
        desired = nodestatus.refreshed(status, self._own_status, now_rfc3339())
        changed = nodestatus.changed(status, desired)
        events = []
        if changed or due:
            answer = await self.client.request(
                "PATCH",
                path_for("v1", "nodes", self.spec.name, subresource="status"),
                nodestatus.status_patch(status, desired),
                content_type=PATCH_TYPES["strategic"],
                timeout_s=lease.HEARTBEAT_TIMEOUT_S,
                attempts=1,
            )
            self._reports.reported(now, changed)
            self.observe("MODIFIED", answer)
            events = nodestatus.transition_events(status, desired)
        unschedulable = bool(node.get("spec", {}).get("unschedulable"))
        if unschedulable != self._unschedulable:  # as the kubelet's last setter: an Event, no write
            self._unschedulable = unschedulable
            events.append("NodeNotSchedulable" if unschedulable else "NodeSchedulable")
        self._verified = self.observed
        for reason in events:
            await self._node_event(reason)

    async def _node_event(self, reason: str) -> None:
        node = {"kind": "Node", "metadata": {"name": self.spec.name, "uid": self.uid}}
        message = f"Node {self.spec.name} status is now: {reason}"
        try:
            await write_event(self.client, self._events, node, "Normal", reason, message)
        except ApiError as exc:
            log.debug("could not record event %s on node %s: %s", reason, self.spec.name, exc)

    @property
    def lost(self) -> bool:
        """Another server took the node (with a fence): nothing is renewed any more."""
        return self.lease.lost

    async def renew_lease(self) -> None:
        await self.lease.sync()

    def start(self, first_delay_s: float | None = None) -> None:
        """Renew every 10 s. The first renewal is spread over that interval, so a fleet's
        nodes do not all renew in the same instant."""
        if first_delay_s is None:
            first_delay_s = random.uniform(0.5, lease.RENEW_S)
        self._task = asyncio.create_task(self._renew_forever(first_delay_s), name=f"lease-{self.spec.name}")

    async def _renew_forever(self, delay_s: float) -> None:
        while not self.lost:
            await asyncio.sleep(delay_s)
            delay_s = lease.RENEW_S * (1 + lease.RENEW_JITTER * random.random())
            try:
                await self.lease.sync()
            except Exception as exc:  # keep trying: a kubelet never gives up on its lease
                log.warning("lease renewal for %s failed: %s", self.spec.name, exc)
            try:  # the kubelet's status sync runs every 10 s too, in a loop of its own
                await self.sync_status()
            except Exception as exc:
                log.warning("node status update for %s failed: %s", self.spec.name, exc)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def delete(self) -> None:
        await self.client.delete_if_exists(path_for("v1", "nodes", self.spec.name))
