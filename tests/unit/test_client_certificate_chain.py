"""What our clients present to the API server: their certificate alone, as Go clients do.

With the cluster CA appended (OpenSSL's default), the API server checks that copy as an
intermediate in each of its certificate authenticators, on every request.
"""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from testbed.controlplane import pki
from testbed.kubeapi import load_pem_pair


def client_hello_flight(paths: pki.PKIPaths, client: ssl.SSLContext) -> bytes:
    """Everything the client sends in a TLS 1.2 handshake (where certificates travel in
    the clear) with a server that asks for a client certificate."""
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
    assert s.getpeercert(), "the server accepted the client certificate"
    return sent


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
    sent = client_hello_flight(paths, context)
    assert leaf.public_bytes(serialization.Encoding.DER) in sent
    assert (ca in sent) is not alone
