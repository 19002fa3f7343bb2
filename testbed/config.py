"""Every knob of the testbed in one place: versions, paths, feature gates, defaults.

Environment variables read here (and nowhere else):

- ``TESTBED_KUBE_BIN_DIR``: a directory holding etcd, kube-apiserver,
  kube-scheduler and kube-controller-manager to use as they are.
- ``TESTBED_CACHE_DIR``: where built or downloaded binaries are kept
  (default ``$XDG_CACHE_HOME/dra-testbed`` or ``~/.cache/dra-testbed``).
- ``TESTBED_STATE_DIR``: where clusters keep PKI, logs, etcd data and PIDs
  (default ``$XDG_STATE_HOME/dra-testbed`` or ``~/.local/state/dra-testbed``).
- ``TESTBED_RUNTIME_DIR``: where synthetic nodes keep their directories and sockets
  (default ``$XDG_RUNTIME_DIR/dra-testbed`` or ``/tmp/dra-testbed-<uid>``): short,
  since a unix socket path must fit in 105 bytes (gRPC's limit).
- ``TESTBED_FEATURE_GATES``: extra gates for every component, ``A=true,B=false``.
- ``TESTBED_ALPHA``: ``1`` turns on every alpha DRA gate and alpha/beta APIs.
- ``TESTBED_PROFILING``: ``1`` serves Go's pprof on every control-plane component
  (``kubectl get --raw /debug/pprof/profile`` on the API server), to see where its CPU goes.
- ``HTTP2_READ_IDLE_TIMEOUT_SECONDS`` (default 30; 0 turns the check off) and
  ``HTTP2_PING_TIMEOUT_SECONDS`` (default 15): client-go's connection health check, which
  the testbed's API connections make with TCP keepalive (``connection_health_check``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from testbed.errors import TestbedError

KUBERNETES_VERSION = "v1.37.1"
"""Newest 1.37 patch whose source the Go module proxy serves (v1.37.2 is listed but
its archive is refused), so every path (download, cache, build) yields the same one."""

ETCD_VERSION = "v3.6.16"

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""How the testbed's own processes log (drivers, kubelets, NodeHosts, the fabric manager):
each line with its time, so a NodeHost's log lines up with its nodes' Events."""

LogLevel = Literal["debug", "info", "warning", "error"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
"""What a fleet's NodeHosts log (a fleet file's ``logLevel``, `testbed up --log-level`).
debug: each kubelet's DRA calls, as kubelet v1.37 logs them at -v=4."""


def log_to_stderr(level: str) -> None:
    """The testbed's own loggers at ``level``, every library's at WARNING (grpc, asyncio
    and Ray say much at DEBUG that no testbed user asked for), in LOG_FORMAT."""
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    for name in ("testbed", "fake_devices"):
        logging.getLogger(name).setLevel(level.upper())


CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
"""What a cluster cannot start without."""

OPTIONAL_BINARIES = ("kubectl",)
"""Built or downloaded alongside when possible; used for dry-runs and `auth can-i`."""

NODE_BINARIES = ("kubelet", "testbed-cri")
"""What a real-kubelet node runs: the kubelet and the fake CRI runtime (built from
``scripts/kube-build/cmd/testbed-cri``). Built with the control plane on a fresh
machine; added to an older cache on first use."""

BENCH_BINARIES = ("testbed-draclient", "testbed-helperdriver")
"""What `make bench` times drivers with: the kubelet's own generated DRA client, and a
driver on the upstream kubeletplugin helper as the yardstick (``scripts/kube-build/cmd``).
Built on first use."""

UPSTREAM_DRIVERS = {"dra-test-driver": "k8s.io/kubernetes/test/e2e/dra/test-driver"}
"""DRA drivers the testbed did not write, built from the Go module proxy at the pinned
Kubernetes version: the Kubernetes project's own e2e test driver (`testbed binaries
dra-test-driver`), to try a fleet with a driver written elsewhere. Built on first use."""

RELEASE_BASE_URL = "https://dl.k8s.io/release"
ETCD_RELEASE_BASE_URL = "https://github.com/etcd-io/etcd/releases/download"
DOWNLOAD_TIMEOUT_S = 10.0

# Beta DRA gates as of 1.37. Most are on by default; naming them all makes the
# intent explicit, and DRAWorkloadResourceClaims is off by default and needs
# GenericWorkload. GA gates are locked on and must not be named (a removed
# gate stops the component from starting).
BETA_DRA_GATES: dict[str, bool] = {
    "DRAConsumableCapacity": True,
    "DRADeviceBindingConditions": True,
    "DRAFractionalCapacityRange": True,
    "DRAPartitionableDevices": True,
    "DRAResourceClaimGranularStatusAuthorization": True,
    "DRASchedulerFilterTimeout": True,
    "DRAWorkloadResourceClaims": True,
    "GenericWorkload": True,
}

ALPHA_DRA_GATES: dict[str, bool] = {
    "DRADerivedAttributes": True,
    "DRADeviceCompatibilityGroups": True,
    "DRAListTypeAttributes": True,
    "DRANodeAllocatableResources": True,
    "DRAOptionalNodeOperations": True,
    "DRAPartitionableDevicesType": True,
    "DRAResourcePoolStatus": True,
}

GATE_APIS: dict[str, str] = {
    "GenericWorkload": "scheduling.k8s.io/v1beta1",
}
"""Beta gates whose API version is off by default: the scheduler waits for its
informers (PodGroup here) and never becomes ready unless the API is served."""

POD_GRACE_S = 30
"""A pod's terminationGracePeriodSeconds unless it says: a driver's time to exit after
SIGTERM (a rollout, a drain, a liveness kill, `testbed down`) before SIGKILL."""

KUBELET_SYNC_FREQUENCY_S = 60.0
"""The kubelet's default syncFrequency (KubeletConfiguration), for fake and real kubelets
alike: each pod is synced this often (jittered by up to half of it) when nothing happens
to it. That is when a running pod's device health is worked out anew and when a pod whose
claims could not be prepared is tried again. A pool's ``syncFrequencySeconds`` sets it."""

REGISTRY_PULL_QPS = 5
REGISTRY_BURST = 10
"""The kubelet's default registryPullQPS and registryBurst (KubeletConfiguration), for fake
and real kubelets alike: a node pulls this many images at once, then this many a second,
and fails the pulls beyond at once (ErrImagePull "pull QPS exceeded"). A pool's
``registryPullQPS`` (0: no limit) and ``registryBurst`` set them."""

DEFAULT_CLUSTER_NAME = "testbed"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_cluster_name(name: str) -> None:
    """A cluster name becomes a directory, a Ray namespace and label values: it must be
    a DNS-1123 label, so it can never climb out of the state directory."""
    if len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        raise TestbedError(
            f"cluster name {name!r} is not a DNS-1123 label",
            hint="use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )


def check_advertise_address(address: str) -> None:
    """An IP address of this machine that the API server can listen on."""
    import ipaddress
    import socket

    try:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    except ValueError:
        raise TestbedError(
            f"advertise address {address!r} is not an IP address", hint="give one of this machine's IP addresses"
        ) from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            raise TestbedError(
                f"advertise address {address} is not an address of this machine ({exc.strerror})",
                hint="`ip -brief address` lists them; leave the option out to stay on 127.0.0.1",
            ) from None


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / fallback


def cache_root() -> Path:
    explicit = os.environ.get("TESTBED_CACHE_DIR")
    return Path(explicit) if explicit else _xdg("XDG_CACHE_HOME", ".cache") / "dra-testbed"


def state_root() -> Path:
    explicit = os.environ.get("TESTBED_STATE_DIR")
    if explicit:
        return Path(explicit)
    return _xdg("XDG_STATE_HOME", ".local/state") / "dra-testbed"


MAX_SOCKET_PATH = 105
"""gRPC refuses longer unix socket paths (the kernel allows 107: sun_path is 108 bytes with its NUL)."""


def runtime_root() -> Path:
    explicit = os.environ.get("TESTBED_RUNTIME_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "dra-testbed" if xdg else Path(f"/tmp/dra-testbed-{os.getuid()}")


def nodes_dir(cluster_dir: Path) -> Path:
    """Where a cluster's synthetic nodes live: short and unique per cluster directory."""
    digest = hashlib.sha256(str(cluster_dir.resolve()).encode()).hexdigest()[:8]
    return runtime_root() / digest


def binaries_cache_dir() -> Path:
    return cache_root() / f"k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"


def kube_bin_dir_override() -> Path | None:
    value = os.environ.get("TESTBED_KUBE_BIN_DIR")
    return Path(value) if value else None


def parse_feature_gates(text: str, source: str) -> dict[str, bool]:
    """Parse ``A=true,B=false``; ``source`` names where the text came from in errors."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false") or not name:
            raise TestbedError(
                f"{source}: cannot read feature gate {item!r}",
                hint="write gates as Name=true or Name=false, separated by commas",
            )
        gates[name] = value.lower() == "true"
    return gates


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def _env_seconds(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise TestbedError(f"{name}={raw!r} is not a whole number of seconds", hint=f"unset it for {default}")
    return value


def connection_health_check() -> tuple[int, int] | None:
    """(idle, timeout) in seconds for every connection to the API server, or None (off).

    client-go pings an HTTP/2 connection that has been silent for 30 s and drops it when no
    answer comes within 15 s, so a kubelet's watch on a connection that died without a word
    (a peer machine gone, a partition) is made again within 45 s. The testbed's connections
    are HTTP/1.1; TCP keepalive with the same two times does the same, in the kernel."""
    idle = _env_seconds("HTTP2_READ_IDLE_TIMEOUT_SECONDS", 30)
    timeout = _env_seconds("HTTP2_PING_TIMEOUT_SECONDS", 15)
    return (idle, max(timeout, 1)) if idle > 0 else None


@dataclass
class ControlPlaneConfig:
    """How one local control plane is started."""

    name: str = DEFAULT_CLUSTER_NAME
    state_dir: Path | None = None
    apiserver_port: int | None = None
    """None picks a free port."""
    advertise_address: str = "127.0.0.1"
    """Where the API server listens and what its certificate names, for NodeHosts on other
    machines; loopback unless asked (check_advertise_address)."""
    kcm_qps: float = 75.0
    kcm_burst: int = 150
    """The cluster-admin guide found 75/150 the floor for pod startup within SLO."""
    scheduler_qps: float = 100.0
    scheduler_burst: int = 200
    percentage_of_nodes_to_score: int | None = None
    """The scheduler's percentageOfNodesToScore (None: its adaptive default)."""
    scheduler_parallelism: int | None = None
    """The scheduler's parallelism: workers filtering and scoring nodes (None: 16)."""
    binding_timeout_s: int | None = None
    """How long the scheduler waits for a device's binding conditions before it gives the
    allocation up (its DynamicResources bindingTimeout; None: its 600 s)."""
    alpha: bool = False
    """All alpha DRA gates plus alpha and beta API versions, on every component."""
    extra_feature_gates: dict[str, bool] = field(default_factory=dict)
    etcd_unsafe_no_fsync: bool = True
    """A testbed's etcd holds nothing worth an fsync; skipping it keeps slow disks from
    dominating latency figures."""
    startup_timeout_s: float = 120.0
    profiling: bool = False
    """Go's /debug/pprof on the components; off by default, as the hardening guides advise."""

    def __post_init__(self) -> None:
        check_cluster_name(self.name)

    @classmethod
    def from_env(cls, **overrides: object) -> ControlPlaneConfig:
        config = cls(**overrides)  # type: ignore[arg-type]
        if env_flag("TESTBED_ALPHA"):
            config.alpha = True
        if env_flag("TESTBED_PROFILING"):
            config.profiling = True
        env_gates = os.environ.get("TESTBED_FEATURE_GATES", "")
        if env_gates:
            merged = parse_feature_gates(env_gates, "TESTBED_FEATURE_GATES")
            merged.update(config.extra_feature_gates)
            config.extra_feature_gates = merged
        return config

    @property
    def cluster_dir(self) -> Path:
        return self.state_dir or state_root() / "clusters" / self.name

    def tunables(self) -> dict[str, float | int | None]:
        """The settings a scenario may turn, as reports record them."""
        return {
            "kcmQPS": self.kcm_qps,
            "kcmBurst": self.kcm_burst,
            "schedulerQPS": self.scheduler_qps,
            "schedulerBurst": self.scheduler_burst,
            "percentageOfNodesToScore": self.percentage_of_nodes_to_score,
            "schedulerParallelism": self.scheduler_parallelism,
            "bindingTimeoutSeconds": self.binding_timeout_s,
        }

    def feature_gates(self) -> dict[str, bool]:
        gates = dict(BETA_DRA_GATES)
        if self.alpha:
            gates.update(ALPHA_DRA_GATES)
        gates.update(self.extra_feature_gates)
        return gates

    def runtime_config(self) -> str | None:
        if self.alpha:
            return "api/alpha=true,api/beta=true"
        apis = [api for gate, api in GATE_APIS.items() if self.feature_gates().get(gate)]
        return ",".join(f"{api}=true" for api in apis) or None
