"""A node whose parts run as processes: a kubelet and ``testbed-driver`` (as its
DaemonSet pod would run it).

The kubelet is either the REAL one, v1.37 upstream and unmodified, with the fake CRI
runtime ``testbed-cri`` (the reference), or the fake kubelet as its own process
(``python -m testbed.kubelet``), so the two can be compared on the same driver, call for
call. Laid out as a real node, under ``<root>``: ``kubelet/`` (the kubelet's root dir:
plugins_registry, plugins/<driver>, checkpoints), ``cdi/``, ``logs/`` (one file per
process), ``driver-calls.jsonl`` (every DRA call the driver received), ``faults.json``
(device health the driver follows) and, with the real kubelet, ``cri.sock`` and
``containers.jsonl`` (what the runtime gave each container).

The kubelet runs in a network and mount namespace of its own (see ``sandbox.py``): its
node IP exists only there, it listens only on that namespace's loopback, and reaches
the API server through a relay this object runs on the host's loopback. Nothing on the
host changes: no sysctl, no cgroup, no file outside ``<root>``. That needs root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.config import BETA_DRA_GATES, KUBELET_SYNC_FREQUENCY_S, REGISTRY_BURST, REGISTRY_PULL_QPS
from testbed.controlplane import processes
from testbed.controlplane.binaries import Binaries
from testbed.errors import TestbedError
from testbed.files import write_atomically
from testbed.kubeapi import KubeClient, Obj, cluster_ca, default_credentials, path_for
from testbed.kubelet.declared import cluster_gates
from testbed.kubelet.node import NodeSpec, node_object
from testbed.realnode import kubelet_api, sandbox
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
NODE_STATUS_UPDATE_S = 10
"""How often the kubelet works out its node status (its default); a Lease every 10 s too."""
NODE_STATUS_REPORT_S = 300
"""How often it writes an unchanged one (its default; left unset, it would follow the
update frequency above and write every 10 s)."""


def unsupported_reason() -> str:
    """Why real-kubelet nodes cannot run here, or "" if they can."""
    if os.geteuid() != 0:
        return "real-kubelet nodes need root (network and mount namespaces, bind mounts)"
    missing = [tool for tool in ("unshare", "nsenter", "ip", "mount") if shutil.which(tool) is None]
    if missing:
        return f"real-kubelet nodes need {', '.join(missing)} on PATH (util-linux, iproute2)"
    return ""


def check_supported() -> None:
    reason = unsupported_reason()
    if reason:
        raise TestbedError(reason, hint="run as root on Linux, or use `kubelet: fake` pools")


KUBELET_BACK_OFF_MAX_S = 330.0
"""The longest a kubelet waits to start a crashing container again (5 min), and a margin."""


@dataclass(frozen=True)
class ContainerRef:
    """A pod's container, as the runtime's exit and start files name it."""

    namespace: str
    pod: str
    container: str

    @property
    def key(self) -> str:
        return f"{self.namespace}_{self.pod}_{self.container}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod} container {self.container}"


def kubelet_config(
    root: Path,
    taints: list[Obj],
    client_ca: Path | None = None,
    sync_frequency_s: float = KUBELET_SYNC_FREQUENCY_S,
    gates: Mapping[str, bool] | None = None,
    pull_limit: tuple[int, int] = (REGISTRY_PULL_QPS, REGISTRY_BURST),
) -> Obj:
    """A KubeletConfiguration that creates no host cgroups and listens on loopback only
    (of its namespace). Its API is guarded as kubeadm guards it: client certificates
    from ``client_ca`` (the cluster's) or tokens the API server vouches for, each request
    authorized by the API server; nobody anonymous. ``gates``: the cluster's alpha and
    beta gates (the testbed's default DRA gates when unknown)."""
    x509 = {"x509": {"clientCAFile": str(client_ca)}} if client_ca else {}
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}, **x509},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failCgroupV1": False,
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        "containerRuntimeEndpoint": f"unix://{root / 'cri.sock'}",
        "imageServiceEndpoint": f"unix://{root / 'cri.sock'}",
        "podLogsDir": str(root / "pod-logs"),
        "resolvConf": "",
        "staticPodPath": "",
        "registerWithTaints": taints,
        "syncFrequency": f"{sync_frequency_s:g}s",
        "registryPullQPS": pull_limit[0],
        "registryBurst": pull_limit[1],
        "nodeStatusUpdateFrequency": f"{NODE_STATUS_UPDATE_S}s",
        "nodeStatusReportFrequency": f"{NODE_STATUS_REPORT_S}s",
        "evictionHard": {"memory.available": "1Ki", "nodefs.available": "0%", "imagefs.available": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # The cluster's gates, as kind sets them for every component: without its DRA gates
        # the kubelet refuses a PodGroup's claim the control plane made and reserved for
        # it, and calls a driver for a device that needs no node operations.
        "featureGates": dict(BETA_DRA_GATES if gates is None else gates),
    }


KUBELET_KINDS = ("fake", "real")
_CONNECTION_CHANGED = re.compile(
    r'"Connection changed" .*?driverName="([^"]+)" endpoint="([^"]*)" connected=(true|false)'
)
_STARTUP_WIPE = re.compile(r'"Deleted ResourceSlices" logger="DRA registration handler\.startup"')
"""The kubelet's word (dra_plugin_manager.go, at -v=3) that it deleted the node's slices at
its start: it does so once it finds its Node, retrying every 1, 2, 4... s until then, so it
may come after a driver first published, which then publishes again."""
RECORDS_FILE = "processes.json"


class ProcessNode:
    def __init__(
        self,
        spec: NodeSpec,
        profile: str,
        drivers: list[str],
        root: Path,
        kubeconfig: Path,
        binaries: Binaries | None = None,
        kubelet: str = "real",
    ):
        """``binaries``: where kubelet and testbed-cri are (needed for ``kubelet="real"``)."""
        if kubelet not in KUBELET_KINDS:
            raise TestbedError(f"kubelet {kubelet!r} is neither real nor fake")
        if kubelet == "real" and binaries is None:
            raise TestbedError("a real-kubelet node needs the node binaries (kubelet, testbed-cri)")
        self.kind = kubelet
        self.spec = spec
        self.name = spec.name
        self.profile = profile
        self.drivers = drivers
        self.root = root
        self.kubeconfig = kubeconfig
        self.kubelet_kubeconfig = kubeconfig
        """The kubelet's credentials: a node identity's kubeconfig when the fleet issues one."""
        self.driver_kubeconfig = kubeconfig
        self.verbose = False
        """The kubelet at -v=4: its DRA calls logged (a fleet's ``logLevel: debug``)."""
        self._gates: dict[str, bool] | None = None
        """The alpha and beta gates the kubelet runs with: the API server's, read once."""
        """The driver's credentials: a kubeconfig with a token bound to the node's driver pod."""
        self.driver_env: dict[str, str] = {}
        """More of the built-in driver's settings, as its pod gives them (POD_UID, the
        kubelet's directories by short names): set by the fleet that made the pod."""
        self.binaries = binaries
        self.devices_per_slice: int | None = None
        self.sync_frequency_s = KUBELET_SYNC_FREQUENCY_S
        """Its kubelet's syncFrequency (either kind)."""
        self.pull_limit = (REGISTRY_PULL_QPS, REGISTRY_BURST)
        """Its kubelet's registryPullQPS and registryBurst (either kind)."""
        self.node_ip = spec.internal_ip()
        self.api_port = urllib.parse.urlsplit(default_credentials(kubeconfig).server).port or 443
        self.foreign_drivers: list[str] = []
        """Drivers that run beside the node from a command (the NodeHost runs them):
        ``wait_ready`` waits until the kubelet connected to each."""
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self._kubelet_log_start = 0
        self._relay: asyncio.Server | None = None
        self._driver_started = 0.0
        self._relayed: set[asyncio.Task[None]] = set()
        self._driver_keeper: asyncio.Task[None] | None = None
        self.driver_restarts = 0
        """How often the built-in driver was started again after it exited (keep_driver_running)."""

    # --- layout ------------------------------------------------------------------------

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def call_log(self) -> Path:
        return self.root / "driver-calls.jsonl"

    @property
    def containers_log(self) -> Path:
        return self.root / "containers.jsonl"

    @property
    def faults_file(self) -> Path:
        return self.root / "faults.json"

    def set_faults(
        self,
        unhealthy: Mapping[str, str] | None = None,
        fatal: Collection[str] = (),
        busy: Mapping[str, str] | None = None,
        latency_ms: float = 0.0,
        lost: Collection[str] = (),
        fail_next_prepares: int | None = None,
        failure_rate: float = 0.0,
        fail_message: str = "",
    ) -> None:
        """These devices unhealthy, of which ``fatal`` past serving the work they have, and
        these busy (device -> message); all others fine;
        every prepare and unprepare ``latency_ms`` slower; ``lost`` devices gone;
        ``fail_next_prepares``: that many next prepares fail (None: as many as before);
        each prepare fails with probability ``failure_rate``."""
        document: dict[str, object] = {
            "unhealthy": dict(unhealthy or {}),
            "fatal": sorted(fatal),
            "busy": dict(busy or {}),
            "latencyMs": latency_ms,
            "lost": sorted(lost),
            "failureRate": failure_rate,
            **({"failMessage": fail_message} if fail_message else {}),
            **({"failNextPrepares": fail_next_prepares} if fail_next_prepares is not None else {}),
        }
        temporary = self.faults_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(document))
        temporary.replace(self.faults_file)

    @property
    def exits_dir(self) -> Path:
        """Exit files the runtime (testbed-cri --exits) reads: see end_container."""
        return self.root / "exits"

    @property
    def starts_dir(self) -> Path:
        """Where the runtime (testbed-cri --starts) tells of each container it starts."""
        return self.root / "starts"

    def end_container(self, container: ContainerRef, exit_code: int) -> None:
        """A process run for this container (a driver the testbed starts beside the real
        kubelet) exited: the runtime ends the container with ``exit_code``, so the kubelet
        starts it again (see started_again) and counts it in the pod's status, as for a
        driver in a real pod. Nothing to do under the fake kubelet (a fake-kind node)."""
        if self.kind != "real":
            return
        (self.starts_dir / container.key).unlink(missing_ok=True)  # a start from now on is a new one
        self.exits_dir.mkdir(exist_ok=True)
        write_atomically(self.exits_dir / container.key, f"{exit_code}\n".encode(), durable=False)

    async def started_again(self, container: ContainerRef, timeout_s: float = KUBELET_BACK_OFF_MAX_S) -> None:
        """Until the kubelet started the container again after end_container (its
        back-off: at once, then 10 s, doubling to 5 min), or ``timeout_s`` passed (a
        kubelet that is down, say: the process comes back anyway)."""
        deadline = time.monotonic() + timeout_s
        while not (self.starts_dir / container.key).exists():
            if time.monotonic() > deadline:
                log.warning(
                    "node %s: the kubelet did not start %s again within %.0f s", self.name, container, timeout_s
                )
                return
            await asyncio.sleep(0.1)

    def log(self, process: str) -> Path:
        return self.root / "logs" / f"{process}.log"

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def records_file(self) -> Path:
        return self.root / RECORDS_FILE

    def _reap_leftovers(self) -> None:
        """Stop what an earlier owner of this node left running (a NodeHost that was
        killed): two kubelets must never serve one node."""
        if not self.records_file.exists():
            return
        try:
            records = [processes.ProcessRecord.from_json(r) for r in json.loads(self.records_file.read_text())]
        except (OSError, ValueError, KeyError, TypeError):
            records = []
        stopped = processes.stop(records)
        if stopped:
            log.warning("node %s: stopped %s left running by an earlier host", self.name, ", ".join(stopped))
        self.records_file.unlink(missing_ok=True)

    def _remember(self, name: str, pid: int, command: list[str]) -> None:
        records = []
        if self.records_file.exists():
            records = [r for r in json.loads(self.records_file.read_text()) if r["name"] != name]
        ticks = processes.process_start_ticks(pid) or 0
        record = processes.ProcessRecord(name, pid, ticks, str(self.log(name)), command).to_json()
        records.append({**record, "restarts": self.driver_restarts} if name == "driver" else record)
        write_atomically(self.records_file, json.dumps(records).encode(), durable=False)  # never half-written

    async def start(self) -> None:
        if self.kind == "real":
            check_supported()
        for sub in ("kubelet", "cdi", "logs", "pod-logs", "work", "private"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._reap_leftovers()
        if self.kind == "real":
            await self.start_runtime()
        if self.drivers:
            await self.start_driver()
        await self.start_kubelet()

    def keep_driver_running(self, container: ContainerRef | None = None) -> None:
        """Start the built-in driver again whenever it exits, as its DaemonSet's pod is,
        until stopped. ``container``: its pod's, which the real kubelet runs: ended at each
        exit, and the driver started again when the kubelet starts it again (the kubelet's
        back-off); without it, after processes.RestartBackoff's wait."""
        self._driver_keeper = asyncio.create_task(self._keep_driver_running(container), name=f"driver-{self.name}")

    async def _keep_driver_running(self, container: ContainerRef | None) -> None:
        backoff = processes.RestartBackoff()
        while True:
            process, started = self.processes["driver"], time.monotonic()
            status = processes.exit_status(await process.wait())
            if self.processes.get("driver") is not process:
                return  # stopped on purpose (stop_process)
            if container is not None and self.kind == "real":
                self.end_container(container, status)
                log.warning("node %s: driver exited with %d; starting it again with its container", self.name, status)
                await self.started_again(container)
            else:
                delay = backoff.after_exit(time.monotonic() - started)
                log.warning("node %s: driver exited with %d; starting it again in %.0f s", self.name, status, delay)
                await asyncio.sleep(delay)
            if self.processes.get("driver") is not process:
                return
            self.driver_restarts += 1
            await self.start_driver()

    def cpu_processes(self) -> list[tuple[str, int]]:
        """What it runs, by what each is (for the fleet's CPU accounting, processcpu.py)."""
        running = [(name, p.pid) for name, p in self.processes.items() if p.returncode is None]
        what = {"kubelet": f"{self.kind} kubelet", "cri": "testbed-cri"}
        return [(what.get(name, "testbed-driver"), pid) for name, pid in running]

    async def stop(self) -> None:
        await cancel_and_wait(self._driver_keeper)
        drivers = [name for name in self.processes if name.startswith("driver")]
        for name in ("kubelet", *drivers, "cri"):
            await self.stop_process(name)
        if self._relay is not None:
            self._relay.close()
            for task in list(self._relayed):
                task.cancel()
            await asyncio.gather(*self._relayed, return_exceptions=True)
            self._relay = None

    async def wait_ready(self, timeout_s: float, client: KubeClient) -> None:
        """Every driver registered with the kubelet (since it last started), the Node
        Ready, and every driver's slices published."""
        deadline = time.monotonic() + timeout_s
        while True:
            problem = await self._not_ready(client)
            if not problem:
                return
            for name, process in self.processes.items():
                if process.returncode is not None:
                    raise TestbedError(
                        f"node {self.name}: {name} exited with {process.returncode} while starting",
                        detail=self.log_tail(name),
                        hint=f"its log is {self.log(name)}",
                    )
            if time.monotonic() > deadline:
                drivers = sorted(name for name in self.processes if name.startswith("driver"))
                raise TestbedError(
                    f"node {self.name} not ready within {timeout_s:.0f}s: {problem}",
                    detail="\n".join(f"--- {name}:\n{self.log_tail(name)}" for name in ("kubelet", *drivers)),
                    hint=f"the logs are in {self.root / 'logs'}",
                )
            await asyncio.sleep(0.5)

    async def _not_ready(self, client: KubeClient) -> str:
        registered = {c["driver"] for c in self.calls() if c.get("registered") and c["time"] >= self._driver_started}
        unregistered = sorted(set(self.drivers) - registered)
        unregistered += sorted(set(self.foreign_drivers) - self.connected_drivers())
        if unregistered:
            return f"the kubelet has not registered {', '.join(unregistered)}"
        try:
            node = await client.get(path_for("v1", "nodes", self.name))
        except Exception as exc:  # not registered yet, or the API server is busy
            return f"Node not readable ({exc})"
        ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        if not ready or ready[0]["status"] != "True":
            return "Node not Ready"
        if self.kind == "real" and not _STARTUP_WIPE.search(self._kubelet_log()):
            # Slices seen before it are about to go: a driver stopped then would leave none.
            return "the kubelet has not deleted the node's ResourceSlices at its start yet"
        slices = await client.get(
            path_for("resource.k8s.io/v1", "resourceslices"), {"fieldSelector": f"spec.nodeName={self.name}"}
        )
        published = {s["spec"]["driver"] for s in slices.get("items", [])}
        missing = sorted(set(self.drivers) - published)
        return f"no ResourceSlices yet from {', '.join(missing)}" if missing else ""

    def connected_drivers(self, since: int | None = None) -> set[str]:
        """Drivers the kubelet registered and holds a connection to (to one of their
        instances), from its log: it says so at -v=2 (dra_plugin_manager.go "Connection
        changed"). ``since``: a ``kubelet_log_size()``, connections made after it only;
        default: since the kubelet last started."""
        return {driver for (driver, _), now in self.connections(since).items() if now}

    def connections(self, since: int | None = None) -> dict[tuple[str, str], bool]:
        """(driver, endpoint) -> whether the kubelet's last word on that connection, after
        ``since`` (as connected_drivers), was that it is up."""
        connected: dict[tuple[str, str], bool] = {}
        for match in _CONNECTION_CHANGED.finditer(self._kubelet_log(since)):
            connected[match.group(1), match.group(2)] = match.group(3) == "true"
        return connected

    def _kubelet_log(self, since: int | None = None) -> str:
        """What the kubelet logged after ``since`` (a ``kubelet_log_size()``; default:
        since it last started)."""
        try:
            with open(self.log("kubelet"), "rb") as handle:
                handle.seek(self._kubelet_log_start if since is None else since)
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def kubelet_log_size(self) -> int:
        try:
            return self.log("kubelet").stat().st_size
        except OSError:
            return 0

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            return "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- the three processes -----------------------------------------------------------

    async def _spawn(
        self, name: str, command: list[str], env: Mapping[str, str] | None = None, **kwargs: object
    ) -> None:
        handle = open(self.log(name), "ab")  # noqa: SIM115 - the child keeps writing to it
        try:
            self.processes[name] = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
                cwd=self.root / "work",
                env=dict(os.environ, **(env or {})),
                start_new_session=True,
                **kwargs,  # type: ignore[arg-type]
            )
            self._remember(name, self.processes[name].pid, command)
        finally:
            handle.close()

    async def stop_process(self, name: str, sig: int = signal.SIGTERM) -> int | None:
        """Signal one of the node's processes and wait for it (SIGKILL after a timeout);
        the built-in driver stays stopped (start_driver starts it again)."""
        if name == "driver":
            await cancel_and_wait(self._driver_keeper)
            self._driver_keeper = None
        process = self.processes.pop(name, None)
        if process is None or process.returncode is not None:
            return None if process is None else process.returncode
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            return await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            return await process.wait()

    async def start_runtime(self) -> None:
        assert self.binaries is not None
        sock = self.root / "cri.sock"
        await self._spawn(
            "cri",
            [
                str(self.binaries.path("testbed-cri")),
                "--listen",
                str(sock),
                "--cdi-dirs",
                str(self.cdi_dir),
                "--exits",
                str(self.exits_dir),
                "--starts",
                str(self.starts_dir),
                "--record",
                str(self.containers_log),
                "--kubeconfig",  # to tell init containers, as the fake kubelet does
                str(self.kubelet_kubeconfig),
            ],
        )
        deadline = time.monotonic() + 30
        while not sock.is_socket():
            if self.processes["cri"].returncode is not None or time.monotonic() > deadline:
                raise TestbedError(f"node {self.name}: the CRI runtime did not start", detail=self.log_tail("cri"))
            await asyncio.sleep(0.05)

    async def start_driver(
        self, name: str = "driver", pod_uid: str | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        """``testbed-driver`` for this node's drivers, configured as the DaemonSet does.
        ``name``/``pod_uid``: one more instance beside it, as a DaemonSet with maxSurge
        starts during a rolling update (its sockets named by its pod's UID). ``env``: more
        of its settings (``KUBELET_REGISTRAR_DIRECTORY_PATH``, say)."""
        extra = dict(env or {})
        env = {
            "NODE_NAME": self.name,
            "DRIVERS": ",".join(self.drivers),
            "KUBELET_DIR": str(self.kubelet_dir),
            "CDI_DIR": str(self.cdi_dir),
            "HARDWARE_PROFILE": self.profile,
            "HEALTH_PORT": "-1",
            "METRICS_PORT": "-1",
            "KUBECONFIG": str(self.driver_kubeconfig),
            "CALL_LOG": str(self.call_log),
            "FAULTS_FILE": str(self.faults_file),
            "DEVICES_PER_SLICE": str(self.devices_per_slice or 0),
            **(self.driver_env if name == "driver" else {}),
            **({"POD_UID": pod_uid} if pod_uid else {}),
            **extra,
        }
        if name == "driver":
            self._driver_started = time.time()
        await self._spawn(name, [sys.executable, "-m", "testbed.drivers.main"], env)

    async def start_kubelet(self) -> None:
        self._kubelet_log_start = self.kubelet_log_size()
        if self.kind == "fake":
            labels = [f"--label={k}={v}" for k, v in self.spec.labels.items()]
            command = [
                sys.executable,
                "-m",
                "testbed.kubelet",
                f"--node={self.name}",
                f"--kubeconfig={self.kubelet_kubeconfig}",
            ]
            command += [f"--root-dir={self.kubelet_dir}", f"--cdi-dir={self.cdi_dir}", *labels]
            command.append(f"--sync-frequency={self.sync_frequency_s:g}")
            command += [f"--registry-pull-qps={self.pull_limit[0]}", f"--registry-burst={self.pull_limit[1]}"]
            command.append(f"--metrics-socket={self.root / kubelet_api.FAKE_METRICS_SOCKET}")
            await self._spawn("kubelet", command)
            return
        assert self.binaries is not None
        config = self.root / "kubelet-config.yaml"
        client_ca = None
        if (ca := cluster_ca(self.kubeconfig)) is not None:
            client_ca = self.root / "private" / "client-ca.crt"
            client_ca.write_bytes(ca)
        if self._gates is None:
            client = KubeClient.from_kubeconfig(self.kubeconfig)
            try:
                self._gates = await cluster_gates(client) or dict(BETA_DRA_GATES)
            finally:
                await client.close()
        settings = kubelet_config(
            self.root, list(self.spec.taints), client_ca, self.sync_frequency_s, self._gates, self.pull_limit
        )
        config.write_text(yaml.safe_dump(settings))
        labels = node_object(self.spec)["metadata"]["labels"]
        # Where a real node has it, as its sandbox mounts the node's kubelet directory: the
        # socket names drivers make from their pod's UID fit a unix socket path there, and
        # would not under the node's own directory. Not when what the kubelet reads lives
        # under /var/lib, which the sandbox's mount would hide.
        read = [self.binaries.path("kubelet"), self.root, self.kubelet_kubeconfig, self.kubeconfig.parent]
        mounted = not any(path.resolve().is_relative_to(sandbox.KUBELET_ROOT.parent) for path in read)
        root_dir = sandbox.KUBELET_ROOT if mounted else self.kubelet_dir
        kubelet = [
            str(self.binaries.path("kubelet")),
            f"--config={config}",
            f"--kubeconfig={self.kubelet_kubeconfig}",
            f"--root-dir={root_dir}",
            f"--cert-dir={self.root / 'private' / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            # The kubelet sets its own kubernetes.io/ and beta.kubernetes.io/ labels.
            "--node-labels="
            + ",".join(
                f"{k}={v}" for k, v in labels.items() if not k.startswith(("kubernetes.io/", "beta.kubernetes.io/"))
            ),
            *(["--v=4"] if self.verbose else ["--v=2", "--vmodule=dra_plugin_manager=3"]),  # 3: its slice wipe
        ]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with ours, theirs:
            await self._spawn(
                "kubelet",
                [
                    "unshare",
                    "--net",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    sys.executable,
                    "-m",
                    "testbed.realnode.sandbox",
                    f"--node-ip={self.node_ip}",
                    f"--api-port={self.api_port}",
                    f"--socket-fd={theirs.fileno()}",
                    f"--private-dir={self.root / 'private'}",
                    *([f"--kubelet-dir={self.kubelet_dir}"] if mounted else []),
                    "--",
                    *kubelet,
                ],
                pass_fds=(theirs.fileno(),),
            )
            theirs.close()
            listener = await self._receive_listener(ours)
        self._relay = await asyncio.start_server(self._relay_one, sock=listener)

    async def _receive_listener(self, channel: socket.socket) -> socket.socket:
        """The API server socket the sandbox bound inside the kubelet's namespace."""
        loop = asyncio.get_running_loop()
        channel.setblocking(False)
        readable: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(channel.fileno(), ready)
        try:
            async with asyncio.timeout(30):
                await readable
        except TimeoutError:
            raise TestbedError(
                f"node {self.name}: the kubelet's sandbox did not start", detail=self.log_tail("kubelet")
            ) from None
        finally:
            loop.remove_reader(channel.fileno())
        _, fds, _, _ = socket.recv_fds(channel, 64, 1)
        if not fds:
            raise TestbedError(f"node {self.name}: the kubelet's sandbox failed", detail=self.log_tail("kubelet"))
        return socket.socket(fileno=fds[0])

    async def _relay_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relayed.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.api_port)
        except OSError:
            writer.close()
            self._relayed.discard(task)
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    sink.close()

        try:
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        finally:
            self._relayed.discard(task)

    # --- inspection ----------------------------------------------------------------------

    async def kubelet_metrics(self) -> str:
        """What the node's kubelet serves on /metrics, read with the node's host's
        credentials (see kubelet_api.py)."""
        kubelet = self.processes.get("kubelet")
        running = kubelet is not None and kubelet.returncode is None
        pid = kubelet.pid if kubelet is not None and running and self.kind == "real" else None
        return await kubelet_api.kubelet_metrics(self.root, self.name, self.kubeconfig, pid)

    def memory_bytes(self) -> dict[str, int]:
        """Resident memory of each of the node's processes (the kubelet without its sandbox)."""
        sizes = {}
        for name, process in self.processes.items():
            pids = [process.pid, *_children(process.pid)]
            sizes[name] = sum(_rss(pid) for pid in pids)
        return sizes

    def calls(self) -> list[Obj]:
        if not self.call_log.exists():
            return []
        return [json.loads(line) for line in self.call_log.read_text().splitlines() if line]

    def containers(self) -> list[Obj]:
        if not self.containers_log.exists():
            return []
        return [json.loads(line) for line in self.containers_log.read_text().splitlines() if line]

    def prepared_claims(self) -> list[str]:
        """The claims (namespace/name) its real kubelet holds prepared, from the kubelet's
        own checkpoint: what a drain waits for (a driver's leftover CDI spec is the driver's)."""
        return kubelet_checkpoint_claims(self.kubelet_dir / KUBELET_CHECKPOINT)


KUBELET_CHECKPOINT = "dra_manager_state"
"""The real kubelet's DRA checkpoint (pkg/kubelet/cm/dra/state), written whole by a rename."""


def kubelet_checkpoint_claims(path: Path) -> list[str]:
    """namespace/name of each claim in a kubelet's DRA checkpoint (none before it wrote one)."""
    if not path.exists():
        return []
    data = json.loads(json.loads(path.read_text())["Data"])
    return sorted(f"{c['Namespace']}/{c['ClaimName']}" for c in data.get("ClaimInfoStateList") or [])


def recorded_kubelet_pid(root: Path) -> int | None:
    """The real kubelet the node under ``root`` runs, if it is alive (from its records)."""
    for record in recorded_processes(root.parent).get(root.name, []):
        if record.name == "kubelet" and record.alive() and record.command[:1] == ["unshare"]:
            return record.pid
    return None


def recorded_processes(nodes_dir: Path) -> dict[str, list[processes.ProcessRecord]]:
    """Process nodes under a fleet's nodes dir and the processes each last started (for
    `testbed status`, without asking the NodeHosts)."""
    found = {}
    for records in sorted(nodes_dir.glob(f"*/{RECORDS_FILE}")):
        try:
            found[records.parent.name] = [processes.ProcessRecord.from_json(r) for r in json.loads(records.read_text())]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def recorded_driver_restarts(nodes_dir: Path) -> dict[str, int]:
    """How often each process node's built-in driver was started again after it exited."""
    found = {}
    for records in sorted(nodes_dir.glob(f"*/{RECORDS_FILE}")):
        try:
            entries = json.loads(records.read_text())
            found[records.parent.name] = sum(int(r.get("restarts", 0)) for r in entries if r["name"] == "driver")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        direct = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [*direct, *(c for child in direct for c in _children(child))]
