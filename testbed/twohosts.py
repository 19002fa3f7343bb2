"""Two Ray hosts on one machine, each as separate from the other as a second machine would
be: its own network namespace and, for the second, its own mount namespace. For the tests
and benchmarks of fleets that span machines (needs root).

The two namespaces are joined by a veth pair whose addresses exist only inside them: Ray
in cluster mode listens on every interface, so nothing of this runs in the machine's own
network namespace. The first host runs the Ray head and, through ``in_first``, the
control plane (its API server advertised on the first host's end of the veth) and every
``testbed`` command. The second host joins with a raylet and sees an empty disk where
the cluster's directory is: what it needs it must get through Ray and make itself.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError
from testbed.files import write_secret

RAY_PORT = 26379
"""Inside the first host's namespace: nothing else listens there."""
HOST_LABEL = "dra-testbed.io/host"
"""A Ray node label of each host, "first" or "second": a pool's placement can name one."""


def why_not() -> str | None:
    """Why two namespaced hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "creating network and mount namespaces needs root"
    missing = [tool for tool in ("ip", "unshare", "mount") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


@dataclass
class TwoHosts:
    first: str
    """The first host's network namespace; ``second``: the second's."""
    second: str
    first_ip: str
    second_ip: str
    state_dir: Path
    """The cluster's directory: the second host sees an empty one of its own there."""
    ray_token: Path

    @property
    def ray_address(self) -> str:
        return f"{self.first_ip}:{RAY_PORT}"

    def ray_env(self) -> dict[str, str]:
        """This Ray cluster's own token: it listens beyond loopback (in the namespaces)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.ray_token), "RAY_DISABLE_USAGE_STATS": "1"}

    def env(self) -> dict[str, str]:
        """This process's environment with this Ray's settings for its own: a process that
        used a one-machine Ray before (raycluster.LOOPBACK_ENV) would refuse to join."""
        return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | self.ray_env()

    def in_first(self, *command: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        env = self.env()
        return subprocess.run(
            ["ip", "netns", "exec", self.first, *command], env=env, capture_output=True, text=True, timeout=timeout_s
        )

    def testbed(self, cluster: str, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        """A `testbed` command in the first host, on cluster ``cluster`` in ``state_dir``."""
        where = ["--name", cluster, "--state-dir", str(self.state_dir)]
        done = self.in_first(sys.executable, "-m", "testbed.cli", *args, *where, timeout_s=timeout_s)
        if done.returncode != 0:
            raise TestbedError(
                f"testbed {' '.join(args)} failed in the first host",
                detail=f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}",
            )
        return done

    def pids(self, which: str) -> list[int]:
        """The processes in one host's network namespace ("first" or "second")."""
        netns = self.first if which == "first" else self.second
        return pids_in(netns)

    def second_raylet(self) -> int:
        for pid in self.pids("second"):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    return pid
        raise TestbedError("no raylet runs in the second host's namespace")


def pids_in(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def _run(*command: str) -> None:
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise TestbedError(f"`{' '.join(command)}` failed: {exc.stderr.strip()}") from None


def _start(log: Path, env: dict[str, str], *command: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _poll(condition: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise TestbedError(f"{what}: not within {timeout_s:.0f} s", detail=tail)


def _netns_exists(netns: str) -> bool:
    return Path("/run/netns", netns).exists()


@dataclass(frozen=True)
class LinkedNamespaces:
    """Two network namespaces joined by a veth pair, each end with an address of its own."""

    first: str
    second: str
    first_ip: str
    second_ip: str
    first_end: str
    """The first namespace's end of the link: down, the second namespace hears nothing
    from it, nor it from the second, and neither is told."""

    def set_link(self, up: bool) -> None:
        _run("ip", "-n", self.first, "link", "set", self.first_end, "up" if up else "down")


@contextlib.contextmanager
def linked_namespaces() -> Iterator[LinkedNamespaces]:
    """On exit every process in them is killed and they go."""
    tag = secrets.token_hex(3)
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    made = LinkedNamespaces(f"tb-{tag}-1", f"tb-{tag}-2", f"{subnet}.1", f"{subnet}.2", f"tb{tag}a")
    try:
        _run("ip", "netns", "add", made.first)
        _run("ip", "netns", "add", made.second)
        _run("ip", "link", "add", made.first_end, "type", "veth", "peer", "name", f"tb{tag}b")
        ends = ((made.first_end, made.first, made.first_ip), (f"tb{tag}b", made.second, made.second_ip))
        for end, netns, address in ends:
            _run("ip", "link", "set", end, "netns", netns)
            _run("ip", "-n", netns, "addr", "add", f"{address}/30", "dev", end)
            _run("ip", "-n", netns, "link", "set", end, "up")
            _run("ip", "-n", netns, "link", "set", "lo", "up")
        yield made
    finally:
        for netns in (made.first, made.second):
            if _netns_exists(netns):
                _empty(netns)
                subprocess.run(["ip", "netns", "del", netns], capture_output=True)


@contextlib.contextmanager
def two_hosts(scratch: Path, cpus_each: int = 2) -> Iterator[TwoHosts]:
    """Both hosts up and joined; on exit every process in them is killed and they go.
    ``scratch``: a short directory (Ray's unix sockets go under it), removed by the caller."""
    token = scratch / "ray-token"
    write_secret(token, secrets.token_hex(32).encode())
    state_dir = scratch / "state"
    state_dir.mkdir()
    second_disk = scratch / "disk2"
    second_disk.mkdir()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    with linked_namespaces() as link:
        hosts = TwoHosts(link.first, link.second, link.first_ip, link.second_ip, state_dir, token)
        head_log = scratch / "ray-first.log"
        _start(
            head_log,
            hosts.env(),
            *("ip", "netns", "exec", hosts.first, ray_bin, "start", "--head", "--block"),
            f"--node-ip-address={hosts.first_ip}",
            f"--port={RAY_PORT}",
            f"--temp-dir={scratch / 'ray1'}",
            "--include-dashboard=false",
            f"--num-cpus={cpus_each}",
            f"--labels={HOST_LABEL}=first",
        )
        listening = lambda: f":{RAY_PORT}" in hosts.in_first("ss", "-ltn").stdout  # noqa: E731
        _poll(listening, 60, "the Ray head in the first host", head_log)
        join = (
            f"mount -t tmpfs tmpfs {hosts.state_dir} && mount -t tmpfs tmpfs {second_disk} && "
            f"exec {ray_bin} start --block --address={hosts.ray_address} "
            f"--node-ip-address={hosts.second_ip} --temp-dir={second_disk}/ray --num-cpus={cpus_each} "
            f"--labels={HOST_LABEL}=second"
        )
        second_log = scratch / "ray-second.log"
        _start(
            second_log,
            hosts.env(),
            *("ip", "netns", "exec", hosts.second, "unshare", "--mount", "--propagation", "private", "sh", "-c", join),
        )
        _poll(lambda: _alive_ray_nodes(hosts) == 2, 120, "the second host to join Ray", second_log)
        yield hosts


def _empty(netns: str) -> None:
    """Kill every process in the namespace: all of them are this module's."""
    deadline = time.monotonic() + 30
    while (pids := pids_in(netns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _alive_ray_nodes(hosts: TwoHosts) -> int:
    query = (
        "import ray\n"
        f"ray.init(address='{hosts.ray_address}', logging_level='ERROR')\n"
        "print(sum(1 for n in ray.nodes() if n['Alive']))\n"
    )
    done = hosts.in_first(sys.executable, "-c", query, timeout_s=120)
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0
