"""The cluster's PKI: a CA, the API server's serving cert, client certs, SA key pair.

Each control-plane client gets its own identity (the names the RBAC bootstrap policy
grants), so authorization on the testbed behaves as on a kubeadm cluster.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.files import write_secret

VALIDITY = dt.timedelta(days=365)
SERVICE_CLUSTER_IP = "10.0.0.1"
"""First address of the service range (10.0.0.0/24), where `kubernetes.default` lives."""


@dataclass(frozen=True)
class ClientIdentity:
    file_stem: str
    common_name: str
    organization: str | None = None


ADMIN = ClientIdentity("admin", "testbed-admin", "system:masters")
CONTROLLER_MANAGER = ClientIdentity("controller-manager", "system:kube-controller-manager")
SCHEDULER = ClientIdentity("scheduler", "system:kube-scheduler")
CLIENTS = (ADMIN, CONTROLLER_MANAGER, SCHEDULER)
FRONT_PROXY_CLIENT = "front-proxy-client"
"""The one name the API server accepts identity headers from (--requestheader-allowed-names)."""


@dataclass(frozen=True)
class PKIPaths:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def sa_public(self) -> Path:
        return self.directory / "sa.pub"

    @property
    def sa_private(self) -> Path:
        return self.directory / "sa.key"

    # etcd has a CA of its own, as kubeadm sets it up: a client certificate of the
    # cluster CA (an admin's, a node's) must not open etcd.
    @property
    def etcd_ca_cert(self) -> Path:
        return self.directory / "etcd-ca.crt"

    @property
    def etcd_ca_key(self) -> Path:
        return self.directory / "etcd-ca.key"

    @property
    def etcd_server_cert(self) -> Path:
        return self.directory / "etcd-server.crt"

    @property
    def etcd_server_key(self) -> Path:
        return self.directory / "etcd-server.key"

    @property
    def etcd_client_cert(self) -> Path:
        """kube-apiserver's, the only client etcd accepts."""
        return self.directory / "apiserver-etcd-client.crt"

    @property
    def etcd_client_key(self) -> Path:
        return self.directory / "apiserver-etcd-client.key"

    # The front proxy's CA is its own too, as kubeadm's: the API server checks every
    # client certificate against it before it looks at the client CA, and with one CA
    # for both that check verified each request's signature twice (4-5% of its CPU).
    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.directory / "front-proxy-ca.crt"

    @property
    def front_proxy_ca_key(self) -> Path:
        return self.directory / "front-proxy-ca.key"

    @property
    def front_proxy_client_cert(self) -> Path:
        """What the API server presents when it proxies to an aggregated API server."""
        return self.directory / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.directory / "front-proxy-client.key"

    def client_cert(self, who: ClientIdentity) -> Path:
        return self.directory / f"{who.file_stem}.crt"

    def client_key(self, who: ClientIdentity) -> Path:
        return self.directory / f"{who.file_stem}.key"


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys: fast to generate (RSA-2048 takes ~100 ms each on a slow core).
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_secret(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: object) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def client_certificate(
    subject: x509.Name,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    encoding: serialization.Encoding = serialization.Encoding.PEM,
) -> tuple[bytes, bytes]:
    """A fresh key (PKCS#8) and a client-auth certificate for ``subject`` from this CA
    (for identities issued after the cluster started, e.g. each synthetic node's)."""
    key = _new_key()
    cert = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(encoding, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(encoding), key_bytes


def _new_ca(cert_path: Path, key_path: Path, common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Name]:
    key = _new_key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return key, name


def generate(directory: Path, advertise_address: str = "127.0.0.1") -> PKIPaths:
    """Create every key and certificate the control plane needs, in ``directory``; the
    API server's certificate also names ``advertise_address``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = PKIPaths(directory)

    ca_key, ca_name = _new_ca(paths.ca_cert, paths.ca_key, "dra-testbed-ca")
    etcd_ca_key, etcd_ca_name = _new_ca(paths.etcd_ca_cert, paths.etcd_ca_key, "dra-testbed-etcd-ca")
    front_proxy_ca = _new_ca(paths.front_proxy_ca_cert, paths.front_proxy_ca_key, "dra-testbed-front-proxy-ca")

    def issue(
        cert_path: Path,
        key_path: Path,
        subject: x509.Name,
        usages: list[x509.ObjectIdentifier],
        names: list[x509.GeneralName] | None = None,
        ca: tuple[ec.EllipticCurvePrivateKey, x509.Name] = (ca_key, ca_name),
    ) -> None:
        key = _new_key()
        builder = _builder(subject, ca[1], key.public_key()).add_extension(
            x509.ExtendedKeyUsage(usages), critical=False
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        _write_key(key_path, key)
        _write_cert(cert_path, builder.sign(ca[0], hashes.SHA256()))

    loopback: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    apiserver_names: list[x509.GeneralName] = [
        *loopback,
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address(SERVICE_CLUSTER_IP)),
        *([x509.IPAddress(ipaddress.ip_address(advertise_address))] if advertise_address != "127.0.0.1" else []),
    ]
    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    issue(paths.serving_cert, paths.serving_key, _name("kube-apiserver"), [server], apiserver_names)
    for who in CLIENTS:
        issue(paths.client_cert(who), paths.client_key(who), _name(who.common_name, who.organization), [client])
    etcd = (etcd_ca_key, etcd_ca_name)
    # Server and client usage, as kubeadm's: the same pair serves the peer port.
    issue(paths.etcd_server_cert, paths.etcd_server_key, _name("etcd"), [server, client], loopback, etcd)
    issue(paths.etcd_client_cert, paths.etcd_client_key, _name("kube-apiserver-etcd-client"), [client], ca=etcd)
    proxy_client = _name(FRONT_PROXY_CLIENT)
    issue(paths.front_proxy_client_cert, paths.front_proxy_client_key, proxy_client, [client], ca=front_proxy_ca)

    # Service-account tokens are signed with P-256 (ES256), as kubeadm signs them under
    # `encryptionAlgorithm: ECDSA-P256`: an RSA-2048 signature cost the API server 1.2 ms
    # per token, which a fleet under node identities requests once per node.
    sa_key = _new_key()
    _write_key(paths.sa_private, sa_key)
    paths.sa_public.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return paths
