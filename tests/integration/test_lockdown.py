"""What a second local user, or another machine, can reach on a running testbed: nothing of
etcd's, no key or kubeconfig of ours, no port beyond loopback."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testbed.controlplane import cluster
from testbed.controlplane.pki import ADMIN
from testbed.fleet.fleet import Fleet
from testbed.fleet.raycluster import ray_temp_dir

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
    # Its plain-HTTP port on loopback serves figures, never data (a KV range is a POST
    # to /v3/kv/range on the client port; here there is no such route).
    metrics = f"http://127.0.0.1:{control_plane.ports.etcd_metrics}"
    assert _get(f"{metrics}/metrics", None) == 200
    request = urllib.request.Request(f"{metrics}/v3/kv/range", data=b'{"key": "AA==", "range_end": "AA=="}')
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            answered: int | str = int(response.status)
    except urllib.error.HTTPError as exc:
        answered = exc.code
    assert answered == 404, "no key-value API on the metrics port"


def test_keys_and_kubeconfigs_are_readable_by_us_alone(control_plane: cluster.ClusterState) -> None:
    root = control_plane.root
    secrets = [*root.glob("pki/*.key"), *root.glob("*kubeconfig*"), *root.glob("pki/*kubeconfig*")]
    assert len(secrets) >= 6
    loose = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in secrets if stat.S_IMODE(p.stat().st_mode) & 0o077}
    assert loose == {}


RAY_DEFAULT_PORTS = {6379, 8076, 8265, 10001, 44217, 44227, 52365, 52366, 62365}
"""Ray's own defaults: GCS, object manager, dashboard, client server, the autoscaler's and
the dashboard's metrics, the dashboard agent's HTTP and gRPC, metrics export."""


def _listening(pids: set[int]) -> dict[str, set[int]]:
    """The listening TCP addresses (host:port) of these processes, from /proc."""
    inodes: dict[str, int] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    found: dict[str, set[int]] = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            raw, port = local.split(":")
            packed = bytes.fromhex(raw)
            # /proc prints each 32-bit word of the address in host (little-endian) order.
            packed = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4))
            host = socket.inet_ntop(family, packed)
            found.setdefault(f"{host}:{int(port, 16)}", set()).add(inodes[inode])
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


def test_nothing_of_the_testbed_listens_beyond_loopback(control_plane: cluster.ClusterState, fleet: Fleet) -> None:
    """The control plane, Ray's head (GCS, raylet, agents, the NodeHost workers) and this
    process, which is connected to Ray as the testbed command is."""
    ray_dir = str(ray_temp_dir(control_plane.root))
    groups = {os.getpgid(p.pid) for p in control_plane.processes if p.alive()}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if ray_dir in (proc / "cmdline").read_bytes().decode(errors="replace"):
                groups.add(os.getpgid(int(proc.name)))
        except (OSError, ProcessLookupError):
            continue
    pids = {os.getpid()}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc.name)) in groups:
                pids.add(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    listening = _listening(pids)
    assert len(listening) >= 10, listening  # the control plane's, Ray's and ours are all seen
    beyond = {address: owners for address, owners in listening.items() if not _is_loopback(address)}
    assert beyond == {}
    # No fixed port either: a second cluster on this machine would find it taken.
    fixed = {address for address in listening if int(address.rsplit(":", 1)[1]) in RAY_DEFAULT_PORTS}
    assert fixed == set(), fixed
