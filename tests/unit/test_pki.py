from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from testbed.controlplane import pki


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_every_cert_is_signed_by_the_ca_and_names_its_identity(tmp_path: Path) -> None:
    paths = pki.generate(tmp_path)
    ca = _load(paths.ca_cert)
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    for who in pki.CLIENTS:
        cert = _load(paths.client_cert(who))
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == who.common_name
    admin = _load(paths.client_cert(pki.ADMIN))
    orgs = [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]


def test_serving_cert_covers_loopback_and_in_cluster_names(tmp_path: Path) -> None:
    paths = pki.generate(tmp_path)
    serving = _load(paths.serving_cert)
    serving.verify_directly_issued_by(_load(paths.ca_cert))
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.0.0.1"]


def test_only_the_front_proxy_ca_vouches_for_the_front_proxy(tmp_path: Path) -> None:
    """Identity headers are believed from front-proxy-client alone, checked against a CA
    of its own: no certificate of the cluster CA (a node's, an admin's) can pass as it."""
    paths = pki.generate(tmp_path)
    proxy = _load(paths.front_proxy_client_cert)
    proxy.verify_directly_issued_by(_load(paths.front_proxy_ca_cert))
    assert proxy.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == pki.FRONT_PROXY_CLIENT
    assert _load(paths.front_proxy_ca_cert).subject != _load(paths.ca_cert).subject
    for who in pki.CLIENTS:
        with pytest.raises(ValueError):
            _load(paths.client_cert(who)).verify_directly_issued_by(_load(paths.front_proxy_ca_cert))


def test_private_keys_are_not_world_readable(tmp_path: Path) -> None:
    paths = pki.generate(tmp_path)
    for key in (
        paths.ca_key,
        paths.serving_key,
        paths.sa_private,
        paths.front_proxy_ca_key,
        paths.front_proxy_client_key,
    ):
        assert key.stat().st_mode & 0o077 == 0
