"""What a second local user can reach on a running control plane: nothing of etcd's,
no key or kubeconfig of ours."""

from __future__ import annotations

import ssl
import stat
import urllib.error
import urllib.request

import pytest

from testbed.controlplane import cluster
from testbed.controlplane.pki import ADMIN

pytestmark = pytest.mark.controlplane


def _get(url: str, context: ssl.SSLContext | None) -> int | str:
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError) as exc:
        return type(getattr(exc, "reason", exc)).__name__


def test_etcd_answers_only_the_apiservers_client_certificate(control_plane: cluster.ClusterState) -> None:
    port = control_plane.ports.etcd_client
    pki = control_plane.layout.pki
    url = f"https://127.0.0.1:{port}/health"

    assert _get(f"http://127.0.0.1:{port}/health", None) != 200, "plain HTTP"
    no_cert = ssl.create_default_context(cafile=str(pki.etcd_ca_cert))
    assert _get(url, no_cert) != 200, "TLS without a client certificate"
    admin = ssl.create_default_context(cafile=str(pki.etcd_ca_cert))
    admin.load_cert_chain(str(pki.client_cert(ADMIN)), str(pki.client_key(ADMIN)))
    assert _get(url, admin) != 200, "the cluster admin's certificate (cluster CA, not etcd's)"
    assert _get(url, cluster.etcd_ssl_context(control_plane.layout)) == 200


def test_keys_and_kubeconfigs_are_readable_by_us_alone(control_plane: cluster.ClusterState) -> None:
    root = control_plane.root
    secrets = [*root.glob("pki/*.key"), *root.glob("*kubeconfig*"), *root.glob("pki/*kubeconfig*")]
    assert len(secrets) >= 6
    loose = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in secrets if stat.S_IMODE(p.stat().st_mode) & 0o077}
    assert loose == {}
