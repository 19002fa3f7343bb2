"""A node for the driver under test, with the sanity suite as its kubelet.

The driver runs from its command on a node of its own, as on any synthetic node
(external.py), or is the one already serving a running node (``RunningNode``); the
suite plays the kubelet's part on the wire (registration, DRA calls in either version,
the health stream), and the real scheduler allocates the claims it prepares: each claim
is reserved by a pod pinned to the node (on a node of its own, nothing ever runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from testbed.config import runtime_root
from testbed.errors import TestbedError
from testbed.files import private_dir, write_secret
from testbed.fleet.external import ExternalDriver, ExternalDriverSpec, ShortPaths, driver_environment
from testbed.fleet.identity import (
    DRIVER_NAMESPACE,
    DriverPod,
    NodeAuthority,
    driver_pods_selector,
    driver_token,
    install_access_policy,
)
from testbed.grpcapi import pluginregistration_pb2, pluginregistration_pb2_grpc
from testbed.grpcapi.channels import unix_channel
from testbed.keys import DRIVER_NAME_LABEL
from testbed.kubeapi import (
    ApiError,
    ClaimRef,
    KubeClient,
    Obj,
    apply_claim_status,
    claim_device_status,
    now_rfc3339,
    path_for,
)
from testbed.kubelet.node import NodeAgent, NodeSpec
from testbed.kubelet.plugins import DRA_SERVICES, HEALTH_SERVICES
from testbed.sanity import leftovers

RESOURCE = "resource.k8s.io/v1"
REGISTRATION_TIMEOUT_S = 60.0
"""How long a driver is given to create its registration socket and answer GetInfo, by
default (a kubelet waits for ever; a suite must end)."""
ALLOCATION_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 45.0
"""The kubelet's deadline for a NodePrepareResources/NodeUnprepareResources call."""
FIRST_WAITING_NOTICE_S, WAITING_NOTICE_S = 3.0, 10.0
"""When a wait for the driver's registration first says it is waiting, and how often after."""


@dataclass(frozen=True)
class Registration:
    socket: Path
    name: str
    type: str
    endpoint: str
    versions: list[str]


@dataclass(frozen=True)
class RunningNode:
    """A node whose driver is already serving it (`testbed sanity --node`): the suite
    checks that driver as it runs and never restarts it."""

    name: str
    root: Path
    """The node's directory: ``kubelet/plugins_registry`` and ``cdi/`` under it."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    allocation: Obj

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.uid, self.name)


class Harness:
    def __init__(
        self,
        admin: KubeClient,
        kubeconfig: Path,
        command: list[str],
        env: Mapping[str, str] | None = None,
        driver_name: str = "",
        running: RunningNode | None = None,
        registration_timeout_s: float = REGISTRATION_TIMEOUT_S,
    ):
        """``driver_name``: what the driver must register as ("" to take what it says).
        ``running``: check the driver of that node instead of running ``command``.
        ``registration_timeout_s``: how long the driver has to register, each time it
        starts (a driver that loads its hardware for minutes needs more)."""
        self.admin = admin
        self.registration_timeout_s = registration_timeout_s
        self.waiting: Callable[[str], None] | None = None
        """Told, after FIRST_WAITING_NOTICE_S and every WAITING_NOTICE_S, that the driver has
        not registered yet (a quiet wait of a minute looks like a hang)."""
        self.kubeconfig = kubeconfig
        self.run_id = uuid.uuid4().hex[:6]
        self.namespace = f"sanity-{self.run_id}"
        self.node = running.name if running is not None else self.namespace
        self.device_class = f"sanity-{self.run_id}.dra-testbed.io"
        self.running = running
        self.runs_dir = private_dir(runtime_root() / "s")
        self.run_dir = self.runs_dir / self.run_id
        """Marks the run as this process's (leftovers.py); the driver's root when the suite runs it."""
        self.root = running.root if running is not None else self.run_dir
        self.expected_name = driver_name
        self.driver_name = driver_name
        self.agent = NodeAgent(admin, NodeSpec(self.node, labels={leftovers.RUN_LABEL: self.run_id}))
        self.short = ShortPaths.for_node(self.root)
        self.registry = self.short.registry if running is None else self._registry_of_running_node()
        self.process = (
            None
            if running is not None
            else ExternalDriver(
                ExternalDriverSpec(driver_name or Path(command[0]).name, tuple(command), dict(env or {})),
                self.node,
                self.root,
            )
        )
        self.environment: dict[str, str] = {"CDI_DIR": str(self.root / "cdi")} if running is not None else {}
        self._pod_uids: dict[str | None, str] = {}
        """By the driver whose pod it is (None: the node's own driver pod)."""
        self._claims = 0

    def _registry_of_running_node(self) -> Path:
        """Through its short name when the node has one, as its kubelet does: a command-line
        driver's ``<driver>-<pod UID>-reg.sock`` under the node's own directory would
        overflow a socket path's 107 bytes."""
        registry = self.root / "kubelet" / "plugins_registry"
        if self.short.registry.is_symlink() and self.short.registry.resolve() == registry.resolve():
            return self.short.registry
        return registry

    @property
    def restartable(self) -> bool:
        """Whether the suite runs the driver, and so may kill and restart it."""
        return self.process is not None

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process is not None else ""

    def liveness_endpoint(self) -> tuple[str, int] | None:
        """Where the driver the suite runs serves its liveness endpoint, when its command or
        environment took the port from ``$(LIVENESS_PORT)``, as on a fleet's nodes."""
        if self.process is None or self.process.liveness_port is None:
            return None
        return "127.0.0.1", self.process.liveness_port

    # --- set-up and tear-down ------------------------------------------------------------

    async def setup(self) -> list[leftovers.DeadRun]:
        """Ready to check; what killed runs had left, taken away first."""
        self.run_dir.mkdir(exist_ok=True)
        leftovers.record_owner(self.run_dir)
        swept = await leftovers.sweep(self.admin, self.runs_dir)
        if self.running is not None:
            await self._attach()
            return swept
        assert self.process is not None
        (self.root / "kubelet").mkdir(parents=True, exist_ok=True)
        self.short.link(self.root / "kubelet")
        await self.admin.create(path_for("v1", "namespaces"), {"metadata": {"name": self.namespace}})
        await self.agent.register()
        self.agent.start()
        credentials, pod_uid = await self._credentials()
        self._pod_uids[None] = pod_uid
        pod = (DriverPod(self.node).name, pod_uid)
        self.environment = driver_environment(self.node, self.root, pod, credentials, self.short)
        await self.process.start(self.environment)
        return swept

    async def _attach(self) -> None:
        try:
            await self.admin.get(path_for("v1", "nodes", self.node))
        except ApiError as exc:
            if not exc.not_found:
                raise
            raise TestbedError(f"there is no node {self.node!r}", hint="see `testbed status` for the nodes") from None
        if not self.registry.is_dir():
            raise TestbedError(
                f"node {self.node} has no plugin registry at {self.registry}",
                hint="--node takes a synthetic node of this cluster's fleet, on this machine",
            )
        await self.admin.create(path_for("v1", "namespaces"), {"metadata": {"name": self.namespace}})
        with contextlib.suppress(ApiError):  # the pods drivers' tokens are bound to, when nodes have identities
            selector = {"labelSelector": driver_pods_selector(self.node)}
            pods = await self.admin.get(path_for("v1", "pods", namespace=DRIVER_NAMESPACE), params=selector)
            for pod in pods["items"]:
                if not pod["metadata"].get("deletionTimestamp"):
                    self._pod_uids[pod["metadata"].get("labels", {}).get(DRIVER_NAME_LABEL)] = pod["metadata"]["uid"]

    def pod_uid(self) -> str:
        """The UID of the pod the driver under test runs as ("" if not known): a
        command-line driver's own pod on a fleet node, else the node's driver pod."""
        return self._pod_uids.get(self.driver_name) or self._pod_uids.get(None, "")

    async def _credentials(self) -> tuple[Path, str]:
        """Like a fleet's nodes: a token bound to the node's driver pod where the testbed
        holds the cluster's CA; the admin's kubeconfig on a cluster of someone else's."""
        authority = NodeAuthority.for_cluster(self.kubeconfig)
        if authority is None:
            return self.kubeconfig, str(uuid.uuid4())
        await install_access_policy(self.admin, [self.driver_name] if self.driver_name else [])
        token, pod_uid = await driver_token(self.admin, DriverPod(self.node))
        path = self.root / "private" / "driver.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_secret(path, authority.kubeconfig({"token": token}))
        return path, pod_uid

    async def restart_with(self, environment: Mapping[str, str]) -> None:
        """Stop the driver and start it again with this environment."""
        assert self.process is not None, "a running node's driver is not the suite's to restart"
        await self.process.stop()
        await self.process.start(environment)

    async def teardown(self) -> None:
        """What is on this machine goes even when the cluster cannot be reached (taken
        down under the suite); what is in the cluster, the next run sweeps by its node."""
        if self.process is None:  # a running node: take away only what the suite made
            try:
                await leftovers.remove_from_cluster(self.admin, self.namespace, self.device_class, None)
            finally:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        await self.process.stop()
        await self.agent.stop()
        try:
            await leftovers.remove_from_cluster(self.admin, self.namespace, self.device_class, self.node)
        finally:
            self.short.unlink()
            shutil.rmtree(self.root, ignore_errors=True)

    # --- the kubelet's side of registration --------------------------------------------

    async def registration_socket(self, timeout_s: float, newer_than: float = 0.0) -> Path:
        """The driver's registration socket (one created after ``newer_than``, a wall time)."""
        started = time.monotonic()
        deadline, notice = started + timeout_s, started + FIRST_WAITING_NOTICE_S
        while time.monotonic() < deadline:
            found = [p for p in self.registry.iterdir() if p.is_socket() and p.lstat().st_ctime >= newer_than]
            if found and self.running is not None:
                return await self._socket_of_running_driver(found)
            if found:
                return sorted(found, key=lambda p: p.lstat().st_ctime)[-1]
            if self.process is not None and self.process.restarts >= 2 and not self.process.alive():
                raise TestbedError(
                    f"the driver exited {self.process.restarts + 1} times without creating a registration "
                    f"socket in {self.registry}",
                    detail=self.process.log_tail(),
                )
            if self.waiting is not None and time.monotonic() >= notice:
                notice += WAITING_NOTICE_S
                self.waiting(
                    f"waiting for the driver to create its registration socket in {self.registry}: "
                    f"{time.monotonic() - started:.0f} s of {timeout_s:.0f}"
                )
            await asyncio.sleep(0.1)
        raise TestbedError(
            f"the driver created no registration socket in {self.registry} within {self.registration_timeout_s:g} s",
            hint="a driver slower to start needs more: --registration-timeout SECONDS "
            "(in Python: registration_timeout_s=)",
            detail=self.log_tail(),
        )

    async def _socket_of_running_driver(self, sockets: list[Path]) -> Path:
        """Of a running node's registration sockets, the one of the driver asked for (the
        only one when none was named)."""
        names: dict[str, Path] = {}
        silent: list[str] = []
        for sock in sorted(sockets, key=lambda p: p.lstat().st_ctime):
            try:
                async with unix_channel(sock) as channel:
                    info = await pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                        pluginregistration_pb2.InfoRequest(), timeout=10.0
                    )
                    names[info.name] = sock
            except grpc.aio.AioRpcError as exc:
                silent.append(f"{sock}: GetInfo failed: {exc.code().name}: {exc.details()}")
        if self.expected_name in names:
            return names[self.expected_name]
        if not self.expected_name and len(names) == 1:
            return next(iter(names.values()))
        if not names:
            raise TestbedError(f"no driver of node {self.node} answers GetInfo: {'; '.join(silent)}")
        raise TestbedError(
            f"node {self.node} has drivers {', '.join(sorted(names))}"
            + (f", not {self.expected_name}" if self.expected_name else ""),
            hint="name the one to check with --driver-name",
        )

    async def registered(self, newer_than: float = 0.0) -> Registration:
        """The driver's registration, as the kubelet's plugin watcher makes it: one that
        fails to connect (a socket made but not yet listening, or the one a restarted
        instance is about to replace) is tried again a second later, for as long as the
        socket is waited for."""
        deadline = time.monotonic() + self.registration_timeout_s
        while True:
            socket = await self.registration_socket(max(1.0, deadline - time.monotonic()), newer_than)
            try:
                return await self.register(socket)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(1.0)

    async def register(self, socket: Path) -> Registration:
        async with unix_channel(socket) as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10.0)
            await stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=10.0
            )
        if not self.driver_name:
            self.driver_name = info.name
        return Registration(socket, info.name, info.type, info.endpoint, list(info.supported_versions))

    # --- DRA calls, as the kubelet makes them ---------------------------------------------

    async def call(self, endpoint: str, service: str, method: str, claims: list[Claim | ClaimRef]) -> Any:
        """``claims``: Claims, or references to made-up ones."""
        pb2, pb2_grpc = DRA_SERVICES[service]
        refs = [c.ref if isinstance(c, Claim) else c for c in claims]
        request = getattr(pb2, f"{method}Request")(
            claims=[pb2.Claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in refs]
        )
        async with unix_channel(endpoint) as channel:
            return await getattr(pb2_grpc.DRAPluginStub(channel), method)(request, timeout=CALL_TIMEOUT_S)

    async def health_messages(
        self, endpoint: str, service: str, count: int, timeout_s: float
    ) -> list[tuple[float, Any]]:
        """The first ``count`` messages of the health stream, each with when it came."""
        pb2, pb2_grpc = HEALTH_SERVICES[service]
        messages: list[tuple[float, Any]] = []
        async with unix_channel(endpoint) as channel:
            stream = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb2.NodeWatchResourcesRequest())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    async for message in stream:
                        messages.append((time.monotonic(), message))
                        if len(messages) >= count:
                            break
            stream.cancel()
        return messages

    # --- claims the real scheduler allocates ----------------------------------------------

    async def ensure_device_class(self) -> None:
        """A class of every device the driver publishes: the suite knows nothing else of them."""
        body = {
            "apiVersion": RESOURCE,
            "kind": "DeviceClass",
            "metadata": {"name": self.device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{self.driver_name}"'}}]},
        }
        await self.admin.create_or_replace(path_for(RESOURCE, "deviceclasses"), body)

    def one_device(self) -> list[Obj]:
        return [{"name": "dev", "exactly": {"deviceClassName": self.device_class}}]

    def two_shares(self, selector: str, least: Mapping[str, str]) -> list[Obj]:
        """Two requests for the device ``selector`` picks out, each taking ``least`` of its
        capacities: a claim that holds two shares of one device."""
        exactly: Obj = {"deviceClassName": self.device_class, "selectors": [{"cel": {"expression": selector}}]}
        if least:
            exactly["capacity"] = {"requests": dict(least)}
        return [{"name": name, "exactly": exactly} for name in ("one", "two")]

    def first_available(self) -> list[Obj]:
        """The first choice cannot be met (more devices than a node has), the second can."""
        choices = [
            {"name": "many", "deviceClassName": self.device_class, "allocationMode": "ExactCount", "count": 4096},
            {"name": "one", "deviceClassName": self.device_class},
        ]
        return [{"name": "dev", "firstAvailable": choices}]

    async def claim(self, requests: list[Obj], allocate: bool = True) -> Claim:
        """A ResourceClaim; allocated by the scheduler for a pod pinned to the node unless
        ``allocate`` is False."""
        self._claims += 1
        name = f"c{self._claims}"
        claims = path_for(RESOURCE, "resourceclaims", namespace=self.namespace)
        created = await self.admin.create(
            claims, {"metadata": {"name": name}, "spec": {"devices": {"requests": requests}}}
        )
        if not allocate:
            return Claim(self.namespace, name, created["metadata"]["uid"], {})
        await self.admin.create(path_for("v1", "pods", namespace=self.namespace), self._holder(name))
        deadline = time.monotonic() + ALLOCATION_TIMEOUT_S
        while time.monotonic() < deadline:
            current = await self.admin.get(path_for(RESOURCE, "resourceclaims", name, self.namespace))
            allocation = current.get("status", {}).get("allocation")
            if allocation:
                if await self._satisfy_binding_conditions(current):
                    await self._wait_bound(f"holder-{name}", deadline)
                return Claim(self.namespace, name, current["metadata"]["uid"], allocation)
            await asyncio.sleep(0.2)
        raise TestbedError(
            f"the scheduler did not allocate claim {name} on node {self.node} within {ALLOCATION_TIMEOUT_S:.0f} s",
            hint="does the driver publish ResourceSlices for its node with free devices?",
        )

    async def _satisfy_binding_conditions(self, claim: Obj) -> bool:
        """Devices published with binding conditions wait for a controller of the cluster
        (a fabric's, say) to set them True before the scheduler binds the pod; until then
        the scheduler holds the devices, even past the pod's deletion, for up to its 600 s
        binding timeout. The suite checks the kubelet plugin, not that controller: it plays
        the controller, so each claim's pod is bound and its devices freed when it goes.
        True if the claim had binding conditions."""
        now = now_rfc3339()
        entries = []
        for result in claim["status"]["allocation"]["devices"].get("results") or []:
            if not result.get("bindingConditions"):
                continue
            entry = {k: result[k] for k in ("driver", "pool", "device")}
            if result.get("shareID"):
                entry["shareID"] = result["shareID"]
            conditions = [
                {"type": c, "status": "True", "reason": "SanitySuite", "message": "", "lastTransitionTime": now}
                for c in result["bindingConditions"]
            ]
            entries.append(entry | {"conditions": conditions})
        if not entries:
            return False
        meta = claim["metadata"]
        ref = ClaimRef(meta["namespace"], meta["uid"], meta["name"])
        await apply_claim_status(self.admin, claim_device_status(ref, entries), "dra-testbed-sanity")
        return True

    async def _wait_bound(self, pod: str, deadline: float) -> None:
        """Until the scheduler, which looks every 5 s, has bound the pod: a pod deleted
        while it waits leaves its devices held in the scheduler, and pods after it wait
        minutes for their turn."""
        while time.monotonic() < deadline:
            current = await self.admin.get(path_for("v1", "pods", pod, self.namespace))
            if current["spec"].get("nodeName"):
                return
            await asyncio.sleep(0.2)
        raise TestbedError(
            f"the scheduler did not bind pod {pod} within {ALLOCATION_TIMEOUT_S:.0f} s of its claim's binding "
            "conditions being met",
            hint="see the pod's events (kubectl describe pod)",
        )

    def _holder(self, claim: str) -> Obj:
        return {
            "metadata": {"name": f"holder-{claim}"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": self.node},
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "c", "resourceClaimName": claim}],
                "containers": [
                    {
                        "name": "hold",
                        "image": "registry.invalid/sanity",
                        "resources": {"claims": [{"name": "c"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }

    async def release(self, claim: Claim) -> None:
        """Delete the claim's pod and the claim, so its devices are free for the next check."""
        with contextlib.suppress(ApiError):
            # Nothing runs the pod, so nothing would confirm a graceful deletion.
            await self.admin.delete_if_exists(
                path_for("v1", "pods", f"holder-{claim.name}", self.namespace), {"gracePeriodSeconds": 0}
            )
            await self.admin.delete_if_exists(path_for(RESOURCE, "resourceclaims", claim.name, self.namespace))

    async def slices(self) -> list[Obj]:
        listing = await self.admin.get(
            path_for(RESOURCE, "resourceslices"), {"fieldSelector": f"spec.nodeName={self.node}"}
        )
        return [s for s in listing["items"] if s["spec"]["driver"] == self.driver_name]

    def unreachable_kubeconfig(self, port: int) -> Path:
        """The driver's kubeconfig with an API server address nothing answers at."""
        source = Path(self.environment["KUBECONFIG"])
        document = yaml.safe_load(source.read_text())
        for entry in document["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
        path = self.root / "private" / "unreachable.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_secret(path, yaml.safe_dump(document).encode())
        return path
