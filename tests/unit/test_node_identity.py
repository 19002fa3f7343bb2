"""A node's identity is what the Node authorizer expects of a kubelet's certificate."""

from __future__ import annotations

from pathlib import Path

import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.controlplane import pki
from testbed.fleet.identity import DriverPod, NodeAuthority, is_driver_pod
from testbed.kubeapi import credentials_from_kubeconfig


def _authority(tmp_path: Path) -> NodeAuthority:
    pki.generate(tmp_path / "pki")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({"clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}]}))
    authority = NodeAuthority.for_cluster(kubeconfig)
    assert authority is not None
    return authority


def test_a_node_certificate_names_the_node_in_system_nodes_and_comes_from_the_cluster_ca(tmp_path: Path) -> None:
    authority = _authority(tmp_path)
    cert_pem, key_pem = authority.node_certificate("gpu-007")
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:gpu-007"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    ca = x509.load_pem_x509_certificate(authority.ca_cert_pem)
    cert.verify_directly_issued_by(ca)  # raises if another key signed it
    assert b"PRIVATE KEY" in key_pem


def test_a_cluster_without_its_ca_key_has_no_authority(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: []\n")
    assert NodeAuthority.for_cluster(kubeconfig) is None


def test_the_driver_pod_is_bound_to_its_node_and_recognised_as_the_driver() -> None:
    pod = DriverPod("gpu-007").manifest()
    assert pod["spec"]["nodeName"] == "gpu-007"
    assert pod["spec"]["serviceAccountName"] == "dra-testbed-driver"
    assert is_driver_pod(pod)
    workload = {"metadata": {"namespace": "team-a", "labels": pod["metadata"]["labels"]}}
    assert not is_driver_pod(workload)  # the label alone, in another namespace, is not the driver


def test_a_kubeconfig_naming_files_travels_as_content(tmp_path: Path) -> None:
    """What a NodeHost on another machine gets: the files the kubeconfig names, inlined."""
    import base64

    from testbed.kubeapi import flattened_kubeconfig

    (tmp_path / "ca.crt").write_bytes(b"CA")
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs/me.crt").write_bytes(b"CERT")
    (tmp_path / "certs/me.key").write_bytes(b"KEY")
    (tmp_path / "token").write_text("s3cret\n")
    (tmp_path / "kubeconfig").write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://x:6443", "certificate-authority": "ca.crt"}}],
                "users": [
                    {"name": "u", "user": {"client-certificate": "certs/me.crt", "client-key": "certs/me.key"}},
                    {"name": "t", "user": {"tokenFile": "token"}},
                ],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    document = yaml.safe_load(flattened_kubeconfig(tmp_path / "kubeconfig"))
    cluster = document["clusters"][0]["cluster"]
    assert "certificate-authority" not in cluster and base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    me, token = (u["user"] for u in document["users"])
    assert (
        base64.b64decode(me["client-certificate-data"]) == b"CERT" and base64.b64decode(me["client-key-data"]) == b"KEY"
    )
    assert token == {"token": "s3cret"}
    assert cluster["server"] == "https://x:6443" and document["current-context"] == "c"


def test_clients_trust_the_cluster_ca_alone(tmp_path: Path) -> None:
    """As client-go: a kubeconfig's CA (or the authority's) is the only one a client
    trusts, so no system CA store is loaded for it (that cost each NodeHost ~0.3 s)."""
    authority = _authority(tmp_path)
    ours = x509.load_pem_x509_certificate(authority.ca_cert_pem)
    kubelet = authority.kubelet_client("gpu-007")
    [trusted] = kubelet.credentials.ssl_context.get_ca_certs()
    assert int(trusted["serialNumber"], 16) == ours.serial_number
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text(authority.kubeconfig({"token": "t"}).decode())
    [trusted] = credentials_from_kubeconfig(kubeconfig).ssl_context.get_ca_certs()
    assert int(trusted["serialNumber"], 16) == ours.serial_number
    shared = authority.token_connections(4)
    borrower = authority.driver_client(shared)
    assert borrower.credentials.ssl_context is shared.credentials.ssl_context, "no context built per node"
