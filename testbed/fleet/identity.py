"""Synthetic nodes under the identities real nodes have.

Each fake kubelet authenticates as ``system:node:<name>`` (group ``system:nodes``, a
client certificate from the cluster CA), so the Node authorizer and the NodeRestriction
admission plugin judge what it does as they judge a real kubelet. Each node's drivers use
the driver ServiceAccount with a token bound to a driver pod on that node (the pod a
DaemonSet would run there), so deploy/'s RBAC and its own-node admission policy apply to
every fleet as they do on a real cluster.

Each kubelet watches its own pods as itself; the drivers read the claims they prepare
with their token. The NodeHost's slice watch and its drains stay on the cluster-admin
credentials: one slice watch per host instead of one per node is how a fleet of thousands
stays cheap, and no single node may list what all of them need.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from testbed import openssl
from testbed.controlplane.pki import client_certificate
from testbed.errors import TestbedError
from testbed.fleet.spec import BUILT_IN_DRIVERS
from testbed.keys import DRIVER_NAME_LABEL, DRIVER_POD_LABEL
from testbed.kubeapi import ApiError, Credentials, KubeClient, Obj, load_pem_pair, path_for, until_answered

DRIVER_NAMESPACE = "dra-testbed"
DRIVER_SERVICE_ACCOUNT = "dra-testbed-driver"
ACCESS_MANIFESTS = Path(__file__).with_name("access")
"""deploy/'s namespace, RBAC and admission policy (linked, so the two never differ)."""
TOKEN_SECONDS = 3607
"""What a kubelet asks for: the API server extends a pod-bound token of exactly this
lifetime to a year (and warns when it is used past an hour), so runs need no refresh."""
NODE_CONNECTIONS = 3
"""Requests at once per kubelet, each on a connection of its own (drivers' tokens share
their host's connections); its pod watch holds one more. A real kubelet multiplexes one
HTTP/2 connection; one connection for requests measured no faster than two."""


@dataclass(frozen=True)
class NodeAuthority:
    """What issues node identities: the API server's address and the cluster CA (as
    content, so a NodeHost on any machine can use it). Whoever holds it holds cluster
    admin anyway: NodeHosts already run with the admin's credentials."""

    server: str
    ca_cert_pem: bytes
    ca_key_pem: bytes

    @classmethod
    def for_cluster(cls, kubeconfig: Path) -> NodeAuthority | None:
        """The authority of a cluster the testbed started (its CA next to its kubeconfig);
        None for another cluster, whose CA key the testbed does not have."""
        pki = kubeconfig.parent / "pki"
        if not (pki / "ca.key").exists():
            return None
        document = yaml.safe_load(kubeconfig.read_text())
        server = str(document["clusters"][0]["cluster"]["server"])
        return cls(server, (pki / "ca.crt").read_bytes(), (pki / "ca.key").read_bytes())

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # not the system CAs: ours alone
        if not openssl.share_trust_store(context, self._trust):
            context.load_verify_locations(cadata=self._ca_der)
        return context

    @cached_property
    def _ca_der(self) -> bytes:
        return self._ca[0].public_bytes(serialization.Encoding.DER)

    @cached_property
    def _trust(self) -> ssl.SSLContext:
        """The CA, parsed once: every node's context shares its trust store."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cadata=self._ca_der)
        return context

    def __getstate__(self) -> dict[str, object]:
        """Only the content travels (to NodeHosts); the parsed CA is rebuilt there."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_ca", "_ca_der", "_trust")}

    @cached_property
    def _ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        ca_key = serialization.load_pem_private_key(self.ca_key_pem, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(self.ca_cert_pem), ca_key

    def node_certificate(
        self, node: str, encoding: serialization.Encoding = serialization.Encoding.PEM
    ) -> tuple[bytes, bytes]:
        """A client certificate and key for system:node:<node> (P-256: well under 1 ms)."""
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
            ]
        )
        return client_certificate(subject, *self._ca, encoding=encoding)

    def user_client(self, user: str) -> KubeClient:
        """A client that is ``user`` (no groups), as the API server sees it."""
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)])
        context = self._context()
        load_pem_pair(context, *client_certificate(subject, *self._ca))
        return KubeClient(Credentials(self.server, context))

    def kubelet_client(self, node: str) -> KubeClient:
        """A client that is this node's kubelet, as the API server sees it."""
        context = self._context()
        if not openssl.use_der_key_pair(context, *self.node_certificate(node, serialization.Encoding.DER)):
            load_pem_pair(context, *self.node_certificate(node))
        return KubeClient(Credentials(self.server, context), connection_limit=NODE_CONNECTIONS)

    def kubeconfig(self, user: dict[str, str]) -> bytes:
        """A kubeconfig for a process (a real kubelet, a standalone driver) with this user."""
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "testbed",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(self.ca_cert_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "node", "user": user}],
            "contexts": [{"name": "node", "context": {"cluster": "testbed", "user": "node"}}],
            "current-context": "node",
        }
        return yaml.safe_dump(document).encode()

    def kubelet_kubeconfig(self, node: str) -> bytes:
        cert, key = self.node_certificate(node)
        encoded = {"client-certificate-data": cert, "client-key-data": key}
        return self.kubeconfig({k: base64.b64encode(v).decode() for k, v in encoded.items()})

    def token_connections(self, limit: int) -> KubeClient:
        """Connections without a client certificate, for ``driver_client``s to share."""
        return KubeClient(Credentials(self.server, self._context()), connection_limit=limit)

    def driver_client(self, connections: KubeClient | None = None) -> KubeClient:
        """A client for a node's drivers; it gets its token from `bind_driver_token`.
        ``connections``: send over those (``token_connections``) instead of its own."""
        # Borrowed connections carry their own TLS context: none to build per node then.
        context = self._context() if connections is None else connections.credentials.ssl_context
        return KubeClient(Credentials(self.server, context), connection_limit=NODE_CONNECTIONS, borrow=connections)


DRIVER_CONTAINER = "driver"
"""The one container of a driver pod."""
DRIVER_IMAGE = "registry.invalid/dra-testbed-driver:v1"
"""Tagged, as a DaemonSet's image is, and on synthetic nodes from the start, as in a GPU
node image with its driver baked in: the driver pod's start pulls nothing."""


def is_driver_pod(pod: Obj) -> bool:
    meta = pod["metadata"]
    return bool(meta.get("namespace") == DRIVER_NAMESPACE and DRIVER_POD_LABEL in (meta.get("labels") or {}))


@dataclass(frozen=True)
class DriverPod:
    """A pod a driver DaemonSet would run on ``node``; a token bound to it is what the
    driver authenticates with. The testbed's built-in drivers share one per node (one
    DaemonSet runs them all); each command-line driver has its own, as each driver a
    cluster runs has a DaemonSet of its own."""

    node: str
    driver: str | None = None
    """The command-line driver whose pod it is; None: the built-in drivers'."""
    generation: int = 0
    """A later one is the pod of a driver rolled out again (a DaemonSet's new pod beside
    or after the old one)."""
    liveness_probe: Obj | None = field(default=None, compare=False)
    """The container's livenessProbe, as the DaemonSet's pod template would carry it."""

    @property
    def name(self) -> str:
        suffix = f"-{self.generation}" if self.generation else ""
        stem = f"dra-testbed-driver-{self.node}" if self.driver is None else f"{self.driver}-{self.node}"
        return stem[: 253 - len(suffix)] + suffix

    def manifest(self) -> Obj:
        container: Obj = {"name": DRIVER_CONTAINER, "image": DRIVER_IMAGE, "command": ["run-until-deleted"]}
        if self.liveness_probe is not None:
            container["livenessProbe"] = self.liveness_probe
        labels = {DRIVER_POD_LABEL: self.node[:63], "app.kubernetes.io/part-of": "dra-testbed"}
        if self.driver is not None:
            labels[DRIVER_NAME_LABEL] = self.driver
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": DRIVER_NAMESPACE, "labels": labels},
            "spec": {
                "nodeName": self.node,
                "serviceAccountName": DRIVER_SERVICE_ACCOUNT,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"operator": "Exists"}],
                "containers": [container],
            },
        }


def driver_pods_selector(node: str) -> str:
    """Every driver pod of the node, of every driver and generation."""
    return f"{DRIVER_POD_LABEL}={node[:63]}"


async def bind_driver_token(admin: KubeClient, drivers: KubeClient, node: str) -> None:
    """Create (or find) the node's driver pod and give ``drivers`` a token bound to it.
    The API server writes the pod's node into the token, which the own-node policy reads."""
    token, _ = await driver_token(admin, DriverPod(node))
    drivers.use_token(token)


async def driver_token(admin: KubeClient, pod: DriverPod) -> tuple[str, str]:
    """A token bound to the driver pod (created if need be), and the pod's UID. The Node
    need not exist yet: the token names the pod's node either way. Asked for until
    answered, as a DaemonSet's pod and a kubelet's token are."""
    return await until_answered(lambda: _driver_token(admin, pod), f"binding the drivers' token of node {pod.node}")


async def _driver_token(admin: KubeClient, driver_pod: DriverPod) -> tuple[str, str]:
    pods = path_for("v1", "pods", namespace=DRIVER_NAMESPACE)
    try:
        pod = await admin.create(pods, driver_pod.manifest())
    except ApiError as exc:
        if not exc.conflict:
            raise
        pod = await admin.get(path_for("v1", "pods", driver_pod.name, DRIVER_NAMESPACE))
    request: dict[str, Any] = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": TOKEN_SECONDS,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", **{k: pod["metadata"][k] for k in ("name", "uid")}},
        },
    }
    path = path_for("v1", "serviceaccounts", DRIVER_SERVICE_ACCOUNT, DRIVER_NAMESPACE, "token")
    answer = await admin.create(path, request)
    return str(answer["status"]["token"]), str(pod["metadata"]["uid"])


def status_grant(driver: str) -> list[Obj]:
    """What a driver's own chart grants it beyond the role every driver shares: writing
    the device status of claims allocated on its node (``status.devices``: a NIC's address,
    say), under its own DRA name only, as the API server asks since 1.36. deploy/'s role
    names the built-in drivers; a command-line driver gets one of these for its name."""
    name = f"{DRIVER_SERVICE_ACCOUNT}:{driver}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "resourceNames": [driver],
                "verbs": ["associated-node:update", "associated-node:patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": DRIVER_SERVICE_ACCOUNT, "namespace": DRIVER_NAMESPACE}],
    }
    return [role, binding]


async def install_access_policy(
    admin: KubeClient, drivers: Collection[str] = (), timeout_s: float = 120.0
) -> list[str]:
    """deploy/'s namespace, driver ServiceAccount, roles and own-node admission policy,
    and a status grant for each of ``drivers`` (command-line drivers, by DRA name). A
    driver namespace still being deleted (deploy/ just removed) is waited out first: no
    pod can be created in it."""
    namespace_path = path_for("v1", "namespaces", DRIVER_NAMESPACE)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            current = await admin.get(namespace_path)
        except ApiError as exc:
            if exc.not_found:
                break
            raise
        if not current["metadata"].get("deletionTimestamp"):
            break
        if asyncio.get_running_loop().time() > deadline:
            raise TestbedError(
                f"namespace {DRIVER_NAMESPACE} has been terminating for {timeout_s:.0f} s",
                hint=f"see what holds it: kubectl get all -n {DRIVER_NAMESPACE}; or use --identities shared",
            )
        await asyncio.sleep(0.5)
    docs = [
        doc
        for manifest in ("namespace.yaml", "rbac.yaml", "admission-policy.yaml")
        for doc in yaml.safe_load_all((ACCESS_MANIFESTS / manifest).read_text())
        if doc
    ]
    built_in = set(BUILT_IN_DRIVERS.values())  # deploy/'s role names them
    docs += [doc for driver in sorted(set(drivers) - built_in) for doc in status_grant(driver)]
    applied = []
    for doc in docs:
        api_version, plural, namespaced = _PLURALS[doc["kind"]]
        namespace = doc["metadata"].get("namespace") if namespaced else None
        await admin.create_or_replace(path_for(api_version, plural, namespace=namespace), doc)
        applied.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return applied


_PLURALS = {
    "Namespace": ("v1", "namespaces", False),
    "ResourceQuota": ("v1", "resourcequotas", True),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
}
