"""What our clients present to the API server: their certificate alone, as Go clients do.

With the cluster CA appended (OpenSSL's default), the API server checks that copy as an
intermediate in each of its certificate authenticators, on every request. And the
shortcuts a node's TLS context takes past the ssl module (testbed/openssl.py) give the
same context as the ssl module's own calls.
"""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from testbed import openssl
from testbed.controlplane import pki
from testbed.fleet.identity import NodeAuthority
from testbed.kubeapi import load_pem_pair


def client_hello_flight(paths: pki.PKIPaths, client: ssl.SSLContext) -> tuple[bytes, dict[str, Any]]:
    """Everything the client sends in a TLS 1.2 handshake (where certificates travel in
    the clear) with a server that asks for a client certificate, and the certificate the
    server accepted."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(paths.serving_cert, paths.serving_key)
    server.load_verify_locations(paths.ca_cert)
    server.verify_mode = ssl.CERT_REQUIRED
    server.maximum_version = ssl.TLSVersion.TLSv1_2
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    c = client.wrap_bio(pipes[0], pipes[1], server_hostname="localhost")
    s = server.wrap_bio(pipes[2], pipes[3], server_side=True)
    sent = b""
    for _ in range(10):
        for end in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):  # waits for the other side
                end.do_handshake()
        flight = pipes[1].read()
        sent += flight
        pipes[2].write(flight)
        pipes[0].write(pipes[3].read())
    peer = s.getpeercert()
    assert peer, "the server accepted the client certificate"
    return sent, peer


@pytest.mark.parametrize("alone", [True, False])
def test_a_client_certificate_travels_without_the_cluster_ca(tmp_path: Path, alone: bool) -> None:
    paths = pki.generate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(paths.ca_cert)
    if alone:
        load_pem_pair(context, paths.client_cert(pki.ADMIN).read_bytes(), paths.client_key(pki.ADMIN).read_bytes())
    else:  # what ssl does by itself: the reason for the above
        context.load_cert_chain(paths.client_cert(pki.ADMIN), paths.client_key(pki.ADMIN))
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    leaf = x509.load_pem_x509_certificate(paths.client_cert(pki.ADMIN).read_bytes())
    sent, _ = client_hello_flight(paths, context)
    assert leaf.public_bytes(serialization.Encoding.DER) in sent
    assert (ca in sent) is not alone


def _authority(tmp_path: Path) -> tuple[pki.PKIPaths, NodeAuthority]:
    paths = pki.generate(tmp_path / "pki")
    (tmp_path / "kubeconfig").write_text("clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n")
    authority = NodeAuthority.for_cluster(tmp_path / "kubeconfig")
    assert authority is not None
    return paths, authority


def _common_name(peer: dict[str, Any]) -> str:
    return next(value for rdn in peer["subject"] for key, value in rdn if key == "commonName")


def test_a_kubelets_context_presents_its_node_certificate_alone_and_trusts_the_cluster_ca(tmp_path: Path) -> None:
    paths, authority = _authority(tmp_path)
    context = authority.kubelet_client("gpu-007").credentials.ssl_context
    sent, peer = client_hello_flight(paths, context)  # the client verified the server too
    assert _common_name(peer) == "system:node:gpu-007"
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    assert ca not in sent


def test_a_shared_trust_store_outlives_the_context_it_came_from(tmp_path: Path) -> None:
    paths, authority = _authority(tmp_path)
    cert, key = authority.node_certificate("gpu-007", serialization.Encoding.DER)
    source = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    source.load_verify_locations(paths.ca_cert)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    assert openssl.share_trust_store(context, source)
    assert openssl.use_der_key_pair(context, cert, key)
    del source
    _, peer = client_hello_flight(paths, context)
    assert _common_name(peer) == "system:node:gpu-007"
    untrusting = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    assert openssl.use_der_key_pair(untrusting, cert, key)
    with pytest.raises(ssl.SSLCertVerificationError):  # the store is what made the server trusted
        client_hello_flight(paths, untrusting)


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path: Path) -> None:
    _, authority = _authority(tmp_path)
    cert, _ = authority.node_certificate("gpu-007", serialization.Encoding.DER)
    _, other_key = authority.node_certificate("gpu-008", serialization.Encoding.DER)
    with pytest.raises(ssl.SSLError, match="refused the client certificate"):
        openssl.use_der_key_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, other_key)
