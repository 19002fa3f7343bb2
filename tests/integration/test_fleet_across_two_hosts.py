"""A fleet over two Ray hosts, the second one a machine of its own as far as the testbed
can tell: its own network namespace and its own mount namespace (the cluster's directory,
kubeconfig and checkpoints of the first host are not there). Its raylet is killed -9;
its nodes must be served again from the first host within 60 s, by one host each, with
their pods' claims prepared again from the API server and nothing leaked.

Both hosts are namespaces the test creates (testbed/twohosts.py); the first runs the
control plane, its API server advertised on the first host's end of their veth pair.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import twohosts
from testbed.testing import wait_for
from testbed.twohosts import TwoHosts

pytestmark = pytest.mark.controlplane

NAME = "twohosts"
PER_POOL = 4
RECOVERY_S = 60.0
PROBE = Path(__file__).with_name("fleet_probe.py")


@pytest.fixture
def hosts(short_tmp_path: Path) -> Iterator[TwoHosts]:
    why = twohosts.why_not()
    if why:
        pytest.skip(f"two-host fleet test: {why}")
    with twohosts.two_hosts(short_tmp_path) as made:
        try:
            yield made
        finally:
            where = ("--name", NAME, "--state-dir", str(made.state_dir))
            made.in_first(sys.executable, "-m", "testbed.cli", "down", *where)


def _probe_run(hosts: TwoHosts, *args: str) -> subprocess.CompletedProcess[str]:
    return hosts.in_first(sys.executable, str(PROBE), str(hosts.state_dir), NAME, *args, timeout_s=300)


def _answer(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def probe(hosts: TwoHosts, *args: str) -> dict[str, Any]:
    return _answer(_probe_run(hosts, *args))


def probe_while_moving(hosts: TwoHosts, *args: str) -> dict[str, Any] | None:
    """None when the probe met a NodeHost between two lives (Ray is moving it)."""
    done = _probe_run(hosts, *args)
    if done.returncode != 0 and "ActorUnavailableError" in done.stderr:
        return None
    return _answer(done)


def _served(state: dict[str, Any]) -> dict[str, list[str]]:
    """Node -> the NodeHosts that say they serve it."""
    served: dict[str, list[str]] = {}
    for host, about in state["hosts"].items():
        for node in about.get("node_names", []):
            served.setdefault(node, []).append(host)
    return served


def _check_one_server_each(state: dict[str, Any], nodes: list[str]) -> None:
    served = _served(state)
    assert sorted(served) == sorted(nodes), served
    twice = {node: hosts for node, hosts in served.items() if len(hosts) > 1}
    assert not twice, f"nodes served by two NodeHosts: {twice}"
    for node, (host,) in served.items():
        lease = state["leases"][node]
        assert lease["host"] == host and lease["incarnation"] == state["hosts"][host]["incarnation"], (node, lease)


def _check_claims_held_as_allocated(state: dict[str, Any]) -> None:
    """Every claim's devices are held, on its node's emulated hardware, for that claim
    alone; no device is allocated twice."""
    allocated = state["claims"]
    devices = [tuple(result) for results in allocated.values() for result in results]
    assert len(devices) == len(set(devices)), f"a device allocated twice: {Counter(devices).most_common(3)}"
    held = {(uid, node): sorted(names) for node, claims in state["held"].items() for uid, names in claims.items()}
    wanted = {
        (uid, pool): sorted(d for _, p, d in results if p == pool)
        for uid, results in allocated.items()
        for _, pool, _ in results
    }
    assert held == wanted, (held, wanted)


def test_a_fleet_spans_two_hosts_and_survives_losing_one(hosts: TwoHosts, tmp_path: Path) -> None:
    fleet_file = tmp_path / "fleet.yaml"
    # Each pool prefers one host; both may run anywhere when their host is gone.
    fleet_file.write_text(
        f"ray: {{address: '{hosts.ray_address}'}}\n"
        "nodesPerHost: 2\n"
        "pools:\n"
        + "".join(
            f"- {{name: {pool}, count: {PER_POOL}, profile: tiny, placement: {{preferLabels: {{{key}: {host}}}}}}}\n"
            for pool, host, key in (("one", "first", twohosts.HOST_LABEL), ("two", "second", twohosts.HOST_LABEL))
        )
    )
    hosts.testbed(NAME, "up", "--fleet", str(fleet_file), "--advertise-address", hosts.first_ip)
    nodes = [f"{pool}-{i:03d}" for pool in ("one", "two") for i in range(PER_POOL)]

    state = probe(hosts, "state")
    assert len(state["ray_nodes"]) == 2
    second_id = next(node_id for node_id, ip in state["ray_nodes"].items() if ip == hosts.second_ip)
    on_second = sorted(
        n for host in state["hosts"].values() if host["ray_node"] == second_id for n in host["node_names"]
    )
    assert on_second == [n for n in nodes if n.startswith("two-")], f"pool two is not on its host: {state['hosts']}"
    _check_one_server_each(state, nodes)
    status = hosts.testbed(NAME, "status").stdout
    assert "fleet per Ray node" in status and hosts.first_ip in status and hosts.second_ip in status, status

    # A scenario over both hosts: its leak check and its NodeHost metrics cover both.
    report_dir = tmp_path / "smoke"
    hosts.testbed(NAME, "run", "smoke", "--output", str(report_dir))
    report = json.loads((report_dir / "report.json").read_text())
    assert report["verdict"] == "PASS", report["verdict"]
    assert report["leaks"]["ok"] and not report["leaks"]["unchecked"], report["leaks"]

    # Shrink a host of the second machine by one node: when it comes back elsewhere, it
    # must serve the nodes it had then, not those it was created with.
    hosts.testbed(NAME, "scale", "two", str(PER_POOL - 1))
    nodes.remove(f"two-{PER_POOL - 1:03d}")

    namespace = "twohosts"
    probe(hosts, "workload", namespace, *nodes)
    before = probe(hosts, "state", namespace)
    _check_claims_held_as_allocated(before)

    os.kill(hosts.second_raylet(), signal.SIGKILL)
    lost_at = time.monotonic()

    def recovered() -> dict[str, Any] | None:
        now = probe_while_moving(hosts, "state", namespace)
        if now is None:
            return None
        alive = {host["ray_node"] for host in now["hosts"].values() if "error" not in host}
        if alive != set(now["ray_nodes"]) - {second_id} or sorted(_served(now)) != sorted(nodes):
            return None
        fresh = all(lease["renewed_s_ago"] < 15 for node, lease in now["leases"].items() if node in nodes)
        return now if fresh and set(nodes) <= set(now["ready"]) else None

    after = wait_for(recovered, 180, "the lost host's nodes to be served from the first host")
    took = time.monotonic() - lost_at
    moved = [node for node in on_second if node in nodes]
    print(f"the lost host's {len(moved)} nodes were served again after {took:.1f} s")
    assert took <= RECOVERY_S, f"the lost host's nodes were served again only after {took:.0f} s"
    _check_one_server_each(after, nodes)
    assert {p["phase"] for p in after["pods"].values()} == {"Running"}, after["pods"]
    _check_claims_held_as_allocated(after)  # prepared again on the new host, from the API server

    hosts.testbed(NAME, "scale", "two", str(PER_POOL + 1))
    scaled = probe(hosts, "state", namespace)
    _check_one_server_each(scaled, sorted([*nodes, f"two-{PER_POOL - 1:03d}", f"two-{PER_POOL:03d}"]))

    probe(hosts, "delete", namespace)
    final = probe(hosts, "state", namespace)
    assert final["leaks"] == {"checkpoint_entries": 0, "cdi_specs": 0, "unchecked": []}, final["leaks"]
    assert all(claims == {} for claims in final["held"].values()), final["held"]

    hosts.testbed(NAME, "down")
