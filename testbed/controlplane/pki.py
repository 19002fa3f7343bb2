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
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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

    def client_cert(self, who: ClientIdentity) -> Path:
        return self.directory / f"{who.file_stem}.crt"

    def client_key(self, who: ClientIdentity) -> Path:
        return self.directory / f"{who.file_stem}.key"


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys: fast to generate (RSA-2048 takes ~100 ms each on a slow core).
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


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


def generate(directory: Path) -> PKIPaths:
    """Create every key and certificate the control plane needs, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = PKIPaths(directory)

    ca_key = _new_key()
    ca_name = _name("dra-testbed-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
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
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(paths.ca_key, ca_key)
    _write_cert(paths.ca_cert, ca_cert)

    def issue(cert_path: Path, key_path: Path, subject: x509.Name, server: bool) -> None:
        key = _new_key()
        builder = _builder(subject, ca_name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.DNSName("kubernetes"),
                        x509.DNSName("kubernetes.default"),
                        x509.DNSName("kubernetes.default.svc"),
                        x509.DNSName("kubernetes.default.svc.cluster.local"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address(SERVICE_CLUSTER_IP)),
                    ]
                ),
                critical=False,
            )
        _write_key(key_path, key)
        _write_cert(cert_path, builder.sign(ca_key, hashes.SHA256()))

    issue(paths.serving_cert, paths.serving_key, _name("kube-apiserver"), server=True)
    for who in CLIENTS:
        issue(
            paths.client_cert(who),
            paths.client_key(who),
            _name(who.common_name, who.organization),
            server=False,
        )

    # Service-account tokens are signed with RSA, which every client library verifies.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(paths.sa_private, sa_key)
    paths.sa_public.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return paths
