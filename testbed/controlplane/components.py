"""Command lines and config files for etcd and the three Kubernetes components.

Only what a local, single-host control plane needs: everything listens on 127.0.0.1,
each client has its own certificate identity, and health and /metrics endpoints are
open to anonymous callers so the testbed can scrape them without tokens.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.config import ControlPlaneConfig
from testbed.controlplane.binaries import Binaries
from testbed.controlplane.pki import (
    ADMIN,
    CONTROLLER_MANAGER,
    FRONT_PROXY_CLIENT,
    SCHEDULER,
    ClientIdentity,
    PKIPaths,
)
from testbed.files import write_secret

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
POD_CLUSTER_CIDR = "100.64.0.0/10"
"""Each Node gets a /24 of it as its pod CIDR, as kind's controller-manager hands them out
(kind's own 10.244.0.0/16 holds 256 nodes; kind-configs/ sets this range too): room for
16,384 nodes, clear of the synthetic nodes' 10.100-199 addresses and of the Services'."""
NODE_POD_CIDR_MASK = 24
OPEN_PATHS = "/healthz,/readyz,/livez,/metrics"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    etcd_metrics: int = 0
    """etcd's plain-HTTP /metrics (and /health) on 127.0.0.1; 0 in clusters from before it."""

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Layout:
    """Where a cluster keeps its files; one directory per cluster."""

    root: Path

    @property
    def pki(self) -> PKIPaths:
        return PKIPaths(self.root / "pki")

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def kubeconfig_for(self, who: ClientIdentity) -> Path:
        if who is ADMIN:
            return self.admin_kubeconfig
        return self.root / f"{who.file_stem}.kubeconfig"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(layout: Layout, who: ClientIdentity, server: str, cluster: str) -> Path:
    """A self-contained kubeconfig (certs embedded), so it can be copied anywhere."""
    pki = layout.pki
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": who.common_name,
                "user": {
                    "client-certificate-data": _b64(pki.client_cert(who)),
                    "client-key-data": _b64(pki.client_key(who)),
                },
            }
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": who.common_name}}],
        "current-context": cluster,
    }
    path = layout.kubeconfig_for(who)
    write_secret(path, yaml.safe_dump(document, sort_keys=False).encode())
    return path


def _gates_flag(config: ControlPlaneConfig) -> str:
    gates = config.feature_gates()
    return "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))


def etcd_command(binaries: Binaries, layout: Layout, ports: Ports, config: ControlPlaneConfig) -> list[str]:
    """TLS with client certificates on both ports, from etcd's own CA: kube-apiserver is
    its only client (as kubeadm sets it up). Plain HTTP let any local user write any
    Kubernetes object."""
    client = f"https://127.0.0.1:{ports.etcd_client}"
    peer = f"https://127.0.0.1:{ports.etcd_peer}"
    pki = layout.pki
    command = [
        str(binaries.path("etcd")),
        "--name=testbed",
        f"--data-dir={layout.etcd_data}",
        "--client-cert-auth",
        f"--trusted-ca-file={pki.etcd_ca_cert}",
        f"--cert-file={pki.etcd_server_cert}",
        f"--key-file={pki.etcd_server_key}",
        "--peer-client-cert-auth",
        f"--peer-trusted-ca-file={pki.etcd_ca_cert}",
        f"--peer-cert-file={pki.etcd_server_cert}",
        f"--peer-key-file={pki.etcd_server_key}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=testbed={peer}",
        "--initial-cluster-state=new",
        # Metrics only, as kubeadm serves them: the data stays behind mutual TLS.
        *([f"--listen-metrics-urls=http://127.0.0.1:{ports.etcd_metrics}"] if ports.etcd_metrics else []),
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]
    if config.etcd_unsafe_no_fsync:
        command.append("--unsafe-no-fsync")
    return command


def apiserver_command(binaries: Binaries, layout: Layout, ports: Ports, config: ControlPlaneConfig) -> list[str]:
    pki = layout.pki
    command = [
        str(binaries.path("kube-apiserver")),
        f"--etcd-servers=https://127.0.0.1:{ports.etcd_client}",
        f"--etcd-cafile={pki.etcd_ca_cert}",
        f"--etcd-certfile={pki.etcd_client_cert}",
        f"--etcd-keyfile={pki.etcd_client_key}",
        f"--bind-address={config.advertise_address}",
        f"--advertise-address={config.advertise_address}",
        # A loopback advertise address is refused while the endpoint reconciler runs;
        # nothing on a local control plane reaches the apiserver through its Service.
        "--endpoint-reconciler-type=none",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        # Published to kube-system/extension-apiserver-authentication; without it the
        # delegated authenticators of KCM and scheduler log a complaint every second.
        f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
        f"--proxy-client-key-file={pki.front_proxy_client_key}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_public}",
        f"--service-account-signing-key-file={pki.sa_private}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--authorization-mode=Node,RBAC",
        # As kubeadm: a kubelet may change only its own Node and the pods bound to it.
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=true",
        f"--profiling={str(config.profiling).lower()}",
        "--v=1",
        _gates_flag(config),
    ]
    runtime_config = config.runtime_config()
    if runtime_config:
        command.append(f"--runtime-config={runtime_config}")
    return command


def _delegated_auth_flags(kubeconfig: Path, ports_flag: str, cert_dir: Path) -> list[str]:
    return [
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--authorization-always-allow-paths={OPEN_PATHS}",
        "--bind-address=127.0.0.1",
        ports_flag,
        f"--cert-dir={cert_dir}",
    ]


def controller_manager_command(
    binaries: Binaries, layout: Layout, ports: Ports, config: ControlPlaneConfig
) -> list[str]:
    pki = layout.pki
    return [
        str(binaries.path("kube-controller-manager")),
        f"--kubeconfig={layout.kubeconfig_for(CONTROLLER_MANAGER)}",
        *_delegated_auth_flags(
            layout.kubeconfig_for(CONTROLLER_MANAGER),
            f"--secure-port={ports.controller_manager}",
            layout.root / "controller-manager-certs",
        ),
        "--leader-elect=false",
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.sa_private}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allocate-node-cidrs=true",  # pods' IPs come from them (kubelet/podnetwork.py)
        f"--cluster-cidr={POD_CLUSTER_CIDR}",
        f"--node-cidr-mask-size={NODE_POD_CIDR_MASK}",
        f"--kube-api-qps={config.kcm_qps}",
        f"--kube-api-burst={config.kcm_burst}",
        f"--profiling={str(config.profiling).lower()}",
        "--v=1",
        _gates_flag(config),
    ]


def write_scheduler_config(layout: Layout, config: ControlPlaneConfig) -> Path:
    """Client QPS/burst live in the scheduler's config file; its flags for them are gone."""
    document: dict[str, object] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(layout.kubeconfig_for(SCHEDULER)),
            "qps": config.scheduler_qps,
            "burst": config.scheduler_burst,
        },
        "leaderElection": {"leaderElect": False},
    }
    if config.percentage_of_nodes_to_score is not None:
        document["percentageOfNodesToScore"] = config.percentage_of_nodes_to_score
    if config.scheduler_parallelism is not None:
        document["parallelism"] = config.scheduler_parallelism
    if config.binding_timeout_s is not None:
        args = {"bindingTimeout": f"{config.binding_timeout_s}s"}
        document["profiles"] = [
            {"schedulerName": "default-scheduler", "pluginConfig": [{"name": "DynamicResources", "args": args}]}
        ]
    path = layout.root / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def scheduler_command(binaries: Binaries, layout: Layout, ports: Ports, config: ControlPlaneConfig) -> list[str]:
    return [
        str(binaries.path("kube-scheduler")),
        f"--config={write_scheduler_config(layout, config)}",
        *_delegated_auth_flags(
            layout.kubeconfig_for(SCHEDULER),
            f"--secure-port={ports.scheduler}",
            layout.root / "scheduler-certs",
        ),
        f"--profiling={str(config.profiling).lower()}",
        "--v=1",
        _gates_flag(config),
    ]
