"""A fleet over two Ray hosts, the second one a machine of its own as far as the testbed
can tell: its own network namespace and its own mount namespace (the cluster's directory,
kubeconfig and checkpoints of the first host are not there). Its raylet is killed -9;
its nodes must be served again from the first host within 60 s, by one host each, with
their pods' claims prepared again from the API server and nothing leaked.

Both hosts are network namespaces this test creates, joined by a veth pair with addresses
inside them: Ray in cluster mode listens on every interface, so nothing of this test may
run in the machine's own namespace. The first host runs the control plane (its API
server advertised on its end of the veth), the Ray head and every `testbed` command.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.files import write_secret
from testbed.testing import wait_for

pytestmark = pytest.mark.controlplane

NAME = "twohosts"
POOL = "th"
NODES = 8
RECOVERY_S = 60.0
PROBE = Path(__file__).with_name("fleet_probe.py")
REPO = Path(__file__).resolve().parents[2]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "creating network and mount namespaces needs root"
    missing = [tool for tool in ("ip", "unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    return None


@dataclass
class TwoHosts:
    first: str
    """The first host's network namespace."""
    second: str
    first_ip: str
    second_ip: str
    ray_port: int
    state_dir: Path
    ray_token: Path

    def ray_env(self) -> dict[str, str]:
        """This Ray cluster's own token: it listens beyond loopback (in the namespaces)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.ray_token), "RAY_DISABLE_USAGE_STATS": "1"}

    def in_first(self, *command: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | self.ray_env()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return subprocess.run(
            ["ip", "netns", "exec", self.first, *command], env=env, capture_output=True, text=True, timeout=timeout_s
        )

    def testbed(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        where = ["--name", NAME, "--state-dir", str(self.state_dir)]
        done = self.in_first(sys.executable, "-m", "testbed.cli", *args, *where, timeout_s=timeout_s)
        assert done.returncode == 0, f"testbed {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return done

    def probe(self, *args: str) -> dict[str, Any]:
        done = self.in_first(sys.executable, str(PROBE), str(self.state_dir), NAME, *args, timeout_s=300)
        assert done.returncode == 0, done.stderr[-4000:]
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def second_raylet(self) -> int:
        for pid in _pids_in(self.second):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    return pid
            except OSError:
                continue
        raise AssertionError("no raylet runs in the second host's namespace")


def _pids_in(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


def _start(log: Path, *command: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _ray_listening(hosts: TwoHosts, port: int) -> bool:
    done = hosts.in_first("ss", "-ltn", f"sport = :{port}")
    return f":{port}" in done.stdout


@pytest.fixture
def two_hosts(short_tmp_path: Path) -> Iterator[TwoHosts]:
    why = _why_not()
    if why:
        pytest.skip(f"two-host fleet test: {why}")
    tag = secrets.token_hex(3)
    first, second = f"tb-{tag}-1", f"tb-{tag}-2"
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    token = short_tmp_path / "ray-token"
    write_secret(token, secrets.token_hex(32).encode())
    hosts = TwoHosts(first, second, f"{subnet}.1", f"{subnet}.2", 26379, short_tmp_path / "state", token)
    hosts.state_dir.mkdir()
    second_disk = short_tmp_path / "disk2"
    second_disk.mkdir()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    ray_env = ["env", *(f"{k}={v}" for k, v in hosts.ray_env().items())]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        try:
            _run("ip", "netns", "add", first)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"two-host fleet test: cannot create a network namespace ({exc.stderr.strip()})")
        _run("ip", "netns", "add", second)
        _run("ip", "link", "add", f"tb{tag}a", "type", "veth", "peer", "name", f"tb{tag}b")
        for end, netns, address in ((f"tb{tag}a", first, hosts.first_ip), (f"tb{tag}b", second, hosts.second_ip)):
            _run("ip", "link", "set", end, "netns", netns)
            _run("ip", "-n", netns, "addr", "add", f"{address}/30", "dev", end)
            _run("ip", "-n", netns, "link", "set", end, "up")
            _run("ip", "-n", netns, "link", "set", "lo", "up")
        processes.append(
            _start(
                short_tmp_path / "ray-first.log",
                *("ip", "netns", "exec", first, *ray_env, ray_bin, "start", "--head", "--block"),
                f"--node-ip-address={hosts.first_ip}",
                f"--port={hosts.ray_port}",
                f"--temp-dir={short_tmp_path / 'ray1'}",
                "--include-dashboard=false",
                "--num-cpus=2",
            )
        )
        wait_for(lambda: _ray_listening(hosts, hosts.ray_port), 60, "the Ray head in the first host")
        # The second host sees its own empty disk where the cluster's directory is: what it
        # needs (kubeconfig, node directories) it must get from Ray and make itself.
        join = (
            f"mount -t tmpfs tmpfs {hosts.state_dir} && mount -t tmpfs tmpfs {second_disk} && "
            f"exec {' '.join(ray_env)} {ray_bin} start --block --address={hosts.first_ip}:{hosts.ray_port} "
            f"--node-ip-address={hosts.second_ip} --temp-dir={second_disk}/ray --num-cpus=2"
        )
        processes.append(
            _start(
                short_tmp_path / "ray-second.log",
                *("ip", "netns", "exec", second, "unshare", "--mount", "--propagation", "private", "sh", "-c", join),
            )
        )
        wait_for(lambda: bool(_pids_in(second)) and _second_joined(hosts), 90, "the second host to join Ray")
        yield hosts
    finally:
        if _netns_exists(first):
            where = ("--name", NAME, "--state-dir", str(hosts.state_dir))
            hosts.in_first(sys.executable, "-m", "testbed.cli", "down", *where)
        for netns in (first, second):
            if _netns_exists(netns):
                for pid in _pids_in(netns):  # everything in these namespaces is this test's
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                wait_for(lambda n=netns: not _pids_in(n), 30, f"the processes of {netns} to exit")  # type: ignore[misc]
                subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        for process in processes:
            process.wait(timeout=30)


def _netns_exists(netns: str) -> bool:
    return Path("/run/netns", netns).exists()


def _second_joined(hosts: TwoHosts) -> bool:
    query = (
        "import ray\n"
        f"ray.init(address='{hosts.first_ip}:{hosts.ray_port}', logging_level='ERROR')\n"
        "print(sum(1 for n in ray.nodes() if n['Alive']))\n"
    )
    done = hosts.in_first(sys.executable, "-c", query, timeout_s=120)
    return done.returncode == 0 and done.stdout.strip().endswith("2")


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


def test_a_fleet_spans_two_hosts_and_survives_losing_one(two_hosts: TwoHosts, tmp_path: Path) -> None:
    hosts = two_hosts
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        f"ray: {{address: '{hosts.first_ip}:{hosts.ray_port}'}}\n"
        "nodesPerHost: 2\n"
        f"pools: [{{name: {POOL}, count: {NODES}, profile: tiny, placement: {{strategy: SPREAD}}}}]\n"
    )
    hosts.testbed("up", "--fleet", str(fleet_file), "--advertise-address", hosts.first_ip)
    nodes = [f"{POOL}-{i:03d}" for i in range(NODES)]

    state = hosts.probe("state")
    assert len(state["ray_nodes"]) == 2
    second_id = next(node_id for node_id, ip in state["ray_nodes"].items() if ip == hosts.second_ip)
    on_second = [n for host in state["hosts"].values() if host["ray_node"] == second_id for n in host["node_names"]]
    assert on_second and len(on_second) < NODES, f"Ray put the NodeHosts on one host only: {state['hosts']}"
    _check_one_server_each(state, nodes)
    status = hosts.testbed("status").stdout
    assert "fleet per Ray node" in status and hosts.first_ip in status and hosts.second_ip in status, status

    # A scenario over both hosts: its leak check and its NodeHost metrics cover both.
    report_dir = tmp_path / "smoke"
    hosts.testbed("run", "smoke", "--output", str(report_dir))
    report = json.loads((report_dir / "report.json").read_text())
    assert report["verdict"] == "PASS", report["verdict"]
    assert report["leaks"]["ok"] and not report["leaks"]["unchecked"], report["leaks"]

    # Shrink a host of the second machine by one node: when it comes back elsewhere, it
    # must serve the nodes it had then, not those it was created with.
    shrunk = max(i for i, node in enumerate(nodes) if node in on_second and i % 2 == 1)
    hosts.testbed("scale", POOL, str(shrunk))
    nodes = nodes[:shrunk]

    namespace = "twohosts"
    hosts.probe("workload", namespace, *nodes)
    before = hosts.probe("state", namespace)
    _check_claims_held_as_allocated(before)

    os.kill(hosts.second_raylet(), signal.SIGKILL)
    lost_at = time.monotonic()

    def recovered() -> dict[str, Any] | None:
        now = hosts.probe("state", namespace)
        alive = {host["ray_node"] for host in now["hosts"].values() if "error" not in host}
        if alive != set(now["ray_nodes"]) - {second_id} or sorted(_served(now)) != nodes:
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

    hosts.testbed("scale", POOL, str(NODES + 2))
    scaled = hosts.probe("state", namespace)
    _check_one_server_each(scaled, [f"{POOL}-{i:03d}" for i in range(NODES + 2)])

    hosts.probe("delete", namespace)
    final = hosts.probe("state", namespace)
    assert final["leaks"] == {"checkpoint_entries": 0, "cdi_specs": 0, "unchecked": []}, final["leaks"]
    assert all(claims == {} for claims in final["held"].values()), final["held"]

    hosts.testbed("down")
