"""Fleet files: pools of synthetic nodes, as validated YAML.

nodesPerHost: 250         # synthetic nodes per NodeHost Ray actor
seed: 0                   # UUIDs, MACs and random faults derive from it
ray: {address: null}      # null: a local Ray on 127.0.0.1; or host:port of a Ray cluster to join
logLevel: warning         # what NodeHosts log: debug adds every kubelet's driver calls
pools:
  - name: gpu             # nodes gpu-000, gpu-001, ...
    count: 100
    profile: gpu8         # a shipped hardware profile or a YAML path
    labels: {pool: gpu}
    taints:               # default: dra-testbed.io/synthetic=true:NoSchedule
      - {key: dra-testbed.io/synthetic, value: "true", effect: NoSchedule}
    kubelet: fake         # fake (default) or real: kubelet v1.37 + a fake CRI + testbed-driver
                          # as processes per node (root only; ~180 MB a node: pools of ~10)
    drivers:              # default: the built-in drivers the profile's hardware needs
      - gpu               # built-ins by name (gpu, nic)
      - name: fpga.example.com        # any other driver: the name it registers,
        command: [/opt/fpga/driver, --v=2]   # the command, run once per node as a DaemonSet would,
        env: {LOG_LEVEL: debug, HEALTH_PORT: "$(LIVENESS_PORT)"}  # extra environment ($(VAR) as in a pod)
        livenessProbe:                # optional: probed as a kubelet probes the DaemonSet's container
          grpc: {}                    # grpc.health.v1 on 127.0.0.1:$LIVENESS_PORT, a port per node
          periodSeconds: 10           # (and initialDelaySeconds, timeoutSeconds, failureThreshold)
        terminationGracePeriodSeconds: 30   # SIGTERM, then SIGKILL this long after (as its pod's)
    devicesPerSlice: null # at most this many devices per ResourceSlice (null: the API's limits)
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from fake_devices.profiles import ProfileError
from fake_devices.specfiles import SpecFileError, parse_yaml, validate
from testbed.config import (
    KUBELET_SYNC_FREQUENCY_S,
    MAX_SOCKET_PATH,
    POD_GRACE_S,
    REGISTRY_BURST,
    REGISTRY_PULL_QPS,
    LogLevel,
)
from testbed.drivers import drivers_for, load_profile
from testbed.errors import TestbedError
from testbed.fleet.external import ShortPaths
from testbed.keys import SYNTHETIC
from testbed.kubeletplugin.prepare import DriverPaths
from testbed.progress import counted


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def qualified_name_problem(key: str) -> str:
    """Why Kubernetes would refuse ``key`` as a label or taint key, or ""."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"{key!r}: the prefix before '/' must be a DNS subdomain (lowercase, digits, '-', '.')"
    if len(name) > 63 or not _NAME.fullmatch(name):
        return f"{key!r}: the name must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    return ""


def label_value_problem(value: str) -> str:
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        return (
            f"{value!r}: a label value is at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
        )
    return ""


def label_problem(key: str, value: str) -> str:
    """Why Kubernetes (or Ray, whose node labels follow its rules) would refuse the
    label ``key=value``, or ""."""
    value_problem = label_value_problem(value)
    return qualified_name_problem(key) or (f"{key}={value_problem}" if value_problem else "")


class Taint(_Strict):
    key: str = Field(min_length=1, max_length=317)
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    @model_validator(mode="after")
    def _kubernetes_accepts_it(self) -> Taint:
        problem = qualified_name_problem(self.key) or label_value_problem(self.value)
        if problem:
            raise ValueError(problem)
        return self


def _default_taints() -> list[Taint]:
    return [Taint(key=SYNTHETIC, value="true", effect="NoSchedule")]


BUILT_IN_DRIVERS = {"gpu": "gpu.dra-testbed.io", "nic": "nic.dra-testbed.io"}


class GrpcProbeAction(_Strict):
    service: str = ""
    """The grpc.health.v1 service asked about ("": the server as a whole)."""
    port: int | None = None

    @model_validator(mode="after")
    def _no_fixed_port(self) -> GrpcProbeAction:
        if self.port is not None:
            raise ValueError(
                f"port {self.port}: each node's instance of the driver listens on a port of its own, on one "
                "loopback; leave port out and hand the driver $(LIVENESS_PORT), e.g. "
                'env: {HEALTH_PORT: "$(LIVENESS_PORT)"} or --healthcheck-port=$(LIVENESS_PORT)'
            )
        return self


class LivenessProbe(_Strict):
    """A container's livenessProbe (a gRPC one), with the kubelet's defaults."""

    grpc: GrpcProbeAction
    initial_delay_s: int = Field(default=0, alias="initialDelaySeconds", ge=0)
    period_s: int = Field(default=10, alias="periodSeconds", ge=1)
    timeout_s: int = Field(default=1, alias="timeoutSeconds", ge=1)
    failure_threshold: int = Field(default=3, alias="failureThreshold", ge=1)
    grace_s: int | None = Field(default=None, alias="terminationGracePeriodSeconds", ge=1)
    """How long a driver killed for failing the probe has to exit before SIGKILL (default:
    the driver's own terminationGracePeriodSeconds, as a probe's overrides its pod's)."""


class ExternalDriver(_Strict):
    """A driver the testbed did not write, run per node from a command."""

    name: str
    """The DRA driver name it registers with the kubelet and publishes slices for."""
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    liveness_probe: LivenessProbe | None = Field(default=None, alias="livenessProbe")
    """Probed as a kubelet probes the DaemonSet's container, and restarted when it fails."""
    grace_s: int = Field(default=POD_GRACE_S, alias="terminationGracePeriodSeconds", ge=0)
    """How long it has to exit after SIGTERM (a rollout, a drain, a liveness kill) before
    SIGKILL: its DaemonSet pod's terminationGracePeriodSeconds, 30 s unless it says."""
    generation: int = Field(default=0, ge=0)
    """Its driver pods' generation, which `testbed rollout` counts up before it rolls any
    node, as a DaemonSet's template changes before its pods: nodes added later start at it.
    A fleet file leaves it out."""

    @model_validator(mode="after")
    def _a_driver_name(self) -> ExternalDriver:
        if len(self.name) > 63 or not _DNS_SUBDOMAIN.fullmatch(self.name):
            raise ValueError(
                f"driver name {self.name!r} must be a DNS subdomain of at most 63 characters "
                "(lowercase letters, digits, '-' and '.'), e.g. fpga.example.com"
            )
        return self


DriverEntry = Annotated[
    Annotated[str, Tag("built-in")] | Annotated[ExternalDriver, Tag("command")],
    Discriminator(lambda value: "built-in" if isinstance(value, str) else "command"),
]
"""A built-in driver's name, or an external driver: errors then speak of the one meant."""


class Placement(_Strict):
    """Where a pool's NodeHosts run in the Ray cluster; a pool with one has hosts of its
    own, never shared with another pool's nodes."""

    resources: dict[str, float] = Field(default_factory=dict)
    """Ray resources each of the pool's NodeHosts takes, e.g. {big-hosts: 1}: custom
    resources that some Ray nodes offer (`ray start --resources`)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Ray node labels the pool's NodeHosts need, e.g. {tier: big}: they run only on Ray
    nodes started with all of them (`ray start --labels tier=big`)."""
    prefer_labels: dict[str, str] = Field(default_factory=dict, alias="preferLabels")
    """Ray node labels the pool's NodeHosts go to while a live Ray node carries them, and
    elsewhere when none does (so a host Ray restarts after those machines are lost
    still finds a place, where ``labels`` would leave it waiting)."""
    strategy: Literal["DEFAULT", "SPREAD"] = "DEFAULT"
    """SPREAD: the pool's NodeHosts over as many Ray nodes as possible; DEFAULT: as Ray
    places them (it fills a node before the next)."""

    @model_validator(mode="after")
    def _positive(self) -> Placement:
        bad = sorted(name for name, amount in self.resources.items() if amount <= 0)
        if bad:
            raise ValueError(f"resources: {', '.join(bad)} must be more than 0")
        for field_name, labels in (("labels", self.labels), ("preferLabels", self.prefer_labels)):
            for key, value in labels.items():
                problem = label_problem(key, value)
                if problem:
                    raise ValueError(f"{field_name}: {problem}")
        return self


MAX_POOL_NODES = 100_000
"""The most nodes one pool may ask for (`--nodes`, `testbed scale`, a fleet file)."""


class Pool(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    count: int = Field(ge=0, le=MAX_POOL_NODES)
    profile: str = "gpu8"
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=_default_taints)
    kubelet: Literal["fake", "real"] = "fake"
    devices_per_slice: int | None = Field(default=None, alias="devicesPerSlice", ge=1, le=128)
    """At most this many devices in one ResourceSlice (default: as many as the API allows)."""
    drivers: list[DriverEntry] | None = None
    """Built-in drivers by name and external ones by command; None: the built-ins the
    profile's hardware needs."""
    placement: Placement | None = None
    """Where its NodeHosts run (None: with the other pools', as Ray places them)."""
    sync_frequency_s: float = Field(
        default=KUBELET_SYNC_FREQUENCY_S, alias="syncFrequencySeconds", ge=1, le=KUBELET_SYNC_FREQUENCY_S
    )
    """Its kubelets' syncFrequency (KubeletConfiguration): how often each pod is synced
    when nothing happens to it, which is when a failed prepare is tried again. At most the
    kubelet's default: a scenario waits for a kubelet's retry (runner.KUBELET_RETRY_S)
    before it calls a phase stalled."""
    registry_pull_qps: int = Field(default=REGISTRY_PULL_QPS, alias="registryPullQPS", ge=0, le=10_000)
    """Its kubelets' registryPullQPS: image pulls a second beyond the burst (0: no limit)."""
    registry_burst: int = Field(default=REGISTRY_BURST, alias="registryBurst", ge=1, le=10_000)
    """Its kubelets' registryBurst: image pulls at once. A pull beyond the limit fails
    (ErrImagePull), and the pod's back-off for that image delays its start 10-20 s."""

    @model_validator(mode="after")
    def _drivers_known_and_unique(self) -> Pool:
        names = []
        for driver in self.drivers or []:
            if isinstance(driver, str):
                if driver not in BUILT_IN_DRIVERS and driver not in BUILT_IN_DRIVERS.values():
                    raise ValueError(
                        f"drivers: {driver!r} is not a built-in driver ({', '.join(BUILT_IN_DRIVERS)}); "
                        "give another driver as {name: ..., command: [...]}"
                    )
                names.append(BUILT_IN_DRIVERS.get(driver, driver))
            else:
                names.append(driver.name)
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"drivers: {', '.join(repeated)} listed more than once")
        return self

    @property
    def built_in_drivers(self) -> list[str] | None:
        """Full names of the built-in drivers asked for; None: the profile's."""
        if self.drivers is None:
            return None
        return [BUILT_IN_DRIVERS.get(d, d) for d in self.drivers if isinstance(d, str)]

    @property
    def external_drivers(self) -> list[ExternalDriver]:
        return [d for d in self.drivers or [] if isinstance(d, ExternalDriver)]

    @model_validator(mode="after")
    def _labels_kubernetes_accepts(self) -> Pool:
        for key, value in self.labels.items():
            problem = label_problem(key, value)
            if problem:
                raise ValueError(f"labels: {problem}")
        return self

    @model_validator(mode="after")
    def _profile_exists(self) -> Pool:
        try:
            load_profile(self.profile)
        except ProfileError as exc:
            raise ValueError(str(exc).replace("\n", " ")) from None
        return self

    def node_name(self, index: int) -> str:
        """Stable whatever the count: scaling a pool up never renames its nodes."""
        return f"{self.name}-{index:03d}"

    def node_names(self) -> list[str]:
        return [self.node_name(i) for i in range(self.count)]

    def longest_socket(self, nodes_dir: Path, count: int | None = None) -> Path | None:
        """The longest unix socket path of its first ``count`` nodes (default: all) under
        ``nodes_dir``: the kubelet's pod-resources socket, or a built-in driver's
        registration socket, under the node's short names where a long name needs them
        (external.ShortPaths, the runtime directory's ``a/``; a command-line driver's
        sockets are its own affair). None for real kubelets, whose sockets are in a
        directory of their own."""
        if self.kubelet == "real":
            return None
        node = nodes_dir / self.node_name(max((self.count if count is None else count) - 1, 0))
        drivers = self.built_in_drivers
        if drivers is None:
            drivers = drivers_for(load_profile(self.profile))
        registry = node / "kubelet" / "plugins_registry"
        if ShortPaths.needed_by(node / "kubelet", drivers):
            registry = ShortPaths.named(node, nodes_dir.parent / "a").registry
        sockets = [node / "kubelet" / "pod-resources" / "kubelet.sock"]
        sockets += [DriverPaths.for_node(node, d, Path(), registry_dir=registry).registration_socket for d in drivers]
        return max(sockets, key=lambda path: len(str(path).encode()))

    def check_socket_paths(self, nodes_dir: Path, count: int | None = None) -> None:
        """Refuse, before anything starts, nodes whose sockets gRPC could not bind."""
        socket = self.longest_socket(nodes_dir, count)
        length = 0 if socket is None else len(str(socket).encode())
        if length > MAX_SOCKET_PATH:
            over = length - MAX_SOCKET_PATH
            chars = counted(over, "character")
            raise TestbedError(
                f"pool {self.name!r}: its nodes' unix sockets would be {length} bytes long, "
                f"more than the {MAX_SOCKET_PATH} gRPC binds: {socket}",
                hint=" or ".join(
                    [f"give the pool a name {chars} shorter"] * (over < len(self.name))
                    + [f"set TESTBED_RUNTIME_DIR to a directory {chars} shorter than {nodes_dir.parent}"]
                ),
            )


class RaySettings(_Strict):
    address: str | None = Field(default=None, pattern=r"^[^:\s]+:[0-9]+$")


class FabricSettings(_Strict):
    """The fabric manager's, for devices behind a fabric (a profile's ``gpus.fabric``)."""

    attach_seconds: float = Field(default=1.0, alias="attachSeconds", ge=0, le=600)
    """How long attaching a device takes; the scheduler looks every 5 s."""


DEFAULT_NODES_PER_HOST = 250
"""Each NodeHost costs about 2 CPU-seconds before its first node (Python and Ray's
imports in a new process), as much as 50 gpu8 nodes cost it, and about 0.014 core idle
whatever it holds (Ray's task loop, gRPC's threads), as much as 90 idle nodes. 500 nodes
started in 47 s on 10 hosts, 35 s on 5 and 30 s on 2 (2 cores, one run each). 500 gpu8
nodes on 2 hosts (250 each) against 3 (200 each), four interleaved pairs (2026-11-26):
Ready in a median 20.9 s against 22.5 s, idle 0.111 core against 0.128."""


FLEET_ADDRESS_POOLS = 100
FLEET_ADDRESSES_PER_POOL = 256 * 250
"""A pool's nodes take 10.<100 + its place>.0-255.2-251."""


class FleetFile(_Strict):
    nodes_per_host: int = Field(default=DEFAULT_NODES_PER_HOST, alias="nodesPerHost", ge=1, le=10_000)
    seed: int = 0
    ray: RaySettings = Field(default_factory=RaySettings)
    fabric: FabricSettings = Field(default_factory=FabricSettings)
    pools: list[Pool] = Field(min_length=1)
    identities: Literal["per-node", "shared"] = "per-node"
    """per-node: each kubelet is system:node:<name> and each node's drivers use a token
    bound to a driver pod on that node (as on a real cluster). shared: every node uses
    the fleet's admin credentials (fewer API calls at start-up; no RBAC or admission)."""
    log_level: LogLevel = Field(default="warning", alias="logLevel")
    """What the NodeHosts log (`testbed logs NODE nodehost`): warning; info adds each pod
    a kubelet was told of and the drivers registered and gone; debug adds every
    NodePrepareResources and NodeUnprepareResources call with its claims and answer, and
    runs real-kubelet nodes at -v=4."""

    @model_validator(mode="after")
    def _unique_pools(self) -> FleetFile:
        names = [p.name for p in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(duplicates)}")
        return self

    @property
    def count(self) -> int:
        return sum(p.count for p in self.pools)

    def node_address(self, pool: Pool, index: int) -> str | None:
        """Node ``index`` of ``pool``'s InternalIP, 10.<100 + the pool's slot>.x.y: no two
        of the fleet's nodes share one (a hash of each name gave thousands of nodes a
        pair or two that did). A pool's slot comes from its name, so another fleet's
        pools (of other names: node names are unique) rarely share it; within the file,
        a taken slot passes to the next free one. None past 100 pools or the 64,000th
        node of a pool: the node's name picks one then."""
        slots = self._address_slots()
        slot = slots.get(pool.name)
        if slot is None or index >= FLEET_ADDRESSES_PER_POOL:
            return None
        return f"10.{100 + slot}.{index // 250}.{index % 250 + 2}"

    def _address_slots(self) -> dict[str, int]:
        slots: dict[str, int] = {}
        taken: set[int] = set()
        for pool in self.pools[:FLEET_ADDRESS_POOLS]:
            slot = int.from_bytes(hashlib.sha256(pool.name.encode()).digest()[:4], "big") % FLEET_ADDRESS_POOLS
            while slot in taken:
                slot = (slot + 1) % FLEET_ADDRESS_POOLS
            taken.add(slot)
            slots[pool.name] = slot
        return slots

    @property
    def real_kubelets(self) -> int:
        return sum(p.count for p in self.pools if p.kubelet == "real")


class FleetFileError(SpecFileError):
    pass


def parse(text: str, source: str) -> FleetFile:
    try:
        data = parse_yaml(text, source)
    except SpecFileError as exc:
        raise FleetFileError(str(exc)) from None
    return validate(FleetFile, data, "fleet file", source, FleetFileError)


def load(path: Path) -> FleetFile:
    if not path.exists():
        raise FleetFileError(f"fleet file {path} does not exist")
    fleet = parse(path.read_text(), str(path))
    for pool in fleet.pools:
        for driver in pool.external_drivers:
            driver.command = runnable_from(driver.command, path.parent)
    return fleet


def recorded(data: Any, source: str) -> FleetFile:
    """A fleet spec a cluster recorded (in its state file), checked as a fleet file is: one
    written by another version of the testbed, or by hand, may not hold."""
    return validate(FleetFile, data, "fleet recorded in", source, FleetFileError)


def runnable_from(command: list[str], directory: Path) -> list[str]:
    """``command`` with a relative executable path (``./bin/driver``) made absolute against
    the directory it was written in (the fleet file's; the shell's for the command line): a
    driver runs in its node's own work directory, where it would not be found."""
    executable = command[0]
    if "/" not in executable or Path(executable).is_absolute():
        return command  # a name looked up on PATH, or a path already
    return [str((directory / executable).absolute()), *command[1:]]


REAL_POOL = "real"
"""The pool `--real-nodes` asks for."""


def single_pool(
    count: int,
    profile: str,
    nodes_per_host: int,
    prefix: str = "node",
    devices_per_slice: int | None = None,
    drivers: list[Any] | None = None,
    sync_frequency_s: float = KUBELET_SYNC_FREQUENCY_S,
    real: int = 0,
    untainted: bool = False,
) -> FleetFile:
    """What `--nodes N --profile P` means; ``real``: `--real-nodes M`, a pool ``real`` of
    that many nodes with the real kubelet, the same profile and drivers (the reference);
    ``untainted``: `--untainted`, no taint on the nodes."""
    pool: dict[str, Any] = {
        "name": prefix,
        "count": count,
        "profile": profile,
        "devicesPerSlice": devices_per_slice,
        "drivers": drivers,
        "syncFrequencySeconds": sync_frequency_s,
    }
    if untainted:
        pool["taints"] = []
    pools = [pool] if count or not real else []
    if real:
        pools.append({**pool, "name": REAL_POOL, "count": real, "kubelet": "real"})
    return validate(
        FleetFile,
        {"nodesPerHost": nodes_per_host, "pools": pools},
        "node pool",
        "from the command line",
        FleetFileError,
    )
