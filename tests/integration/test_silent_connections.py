"""A watch whose server forgot its connection without a word (the server's machine
restarted, a NAT or firewall dropped the flow) must be made again, as client-go's
connection health check makes a kubelet's: every watch of the fake kubelet, its drivers
and the NodeHosts goes through ``KubeClient.watch``.

The control plane runs in one network namespace, the watching client in another, joined
by a veth pair (testbed/twohosts.py). With the link down, the API server's side of the
client's connections is destroyed (``ss -K``; the reset it sends is lost), an object is
created, and the link comes back: the client hears nothing more on its old connection,
so only its health check can tell it to watch again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import twohosts
from testbed.testing import wait_for

pytestmark = pytest.mark.controlplane

NAME = "silent"
HEALTH_ENV = {"HTTP2_READ_IDLE_TIMEOUT_SECONDS": "2", "HTTP2_PING_TIMEOUT_SECONDS": "2"}
"""Short times so that the test is quick; the defaults are client-go's 30 and 15 s."""
WATCH_AGAIN_S = 30.0
"""Far over the 2 + 2 s health check and a reconnect; far under a watch's own 5 to 10 min."""

WATCHER = """
import asyncio, sys
from pathlib import Path
from testbed.kubeapi import KubeClient, path_for

async def main():
    client = KubeClient.from_kubeconfig(Path(sys.argv[1]))
    async for kind, obj in client.watch(path_for("v1", "configmaps", namespace="default")):
        print(kind, obj["metadata"]["name"], flush=True)

asyncio.run(main())
"""

CREATE = """
import asyncio, sys
from pathlib import Path
from testbed.kubeapi import KubeClient, path_for

async def main():
    client = KubeClient.from_kubeconfig(Path(sys.argv[1]))
    await client.create(path_for("v1", "configmaps", namespace="default"), {"metadata": {"name": sys.argv[2]}})
    await client.close()

asyncio.run(main())
"""


@pytest.fixture
def link() -> Iterator[twohosts.LinkedNamespaces]:
    why = twohosts.why_not()
    if why:
        pytest.skip(f"needs two network namespaces: {why}")
    with twohosts.linked_namespaces() as made:
        yield made


def in_namespace(netns: str, *command: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", "netns", "exec", netns, *command], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def test_a_watch_whose_server_forgot_it_silently_is_made_again(link: twohosts.LinkedNamespaces, tmp_path: Path) -> None:
    state = tmp_path / "state"
    where = ("--name", NAME, "--state-dir", str(state))
    in_namespace(link.first, sys.executable, "-m", "testbed.cli", "up", *where, "--advertise-address", link.first_ip)
    kubeconfig = str(state / "kubeconfig")
    log = tmp_path / "watcher.log"
    with log.open("w") as out:
        watcher = subprocess.Popen(
            ["ip", "netns", "exec", link.second, sys.executable, "-c", WATCHER, kubeconfig],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ | HEALTH_ENV,
        )
    try:
        seen = lambda name: f"ADDED {name}" in log.read_text()  # noqa: E731
        in_namespace(link.first, sys.executable, "-c", CREATE, kubeconfig, "before")
        wait_for(lambda: seen("before"), 60, "the watcher to see the first ConfigMap")

        link.set_link(up=False)
        killed = in_namespace(link.first, "ss", "-K", "-t", "dst", link.second_ip)
        assert link.second_ip in killed.stdout, f"no connection of the watcher's was found:\n{killed.stdout}"
        in_namespace(link.first, sys.executable, "-c", CREATE, kubeconfig, "after")
        link.set_link(up=True)
        healed = time.monotonic()

        wait_for(lambda: seen("after"), WATCH_AGAIN_S, "the watcher to watch again and see the second ConfigMap")
        print(f"watching again {time.monotonic() - healed:.1f} s after the link came back")
        assert watcher.poll() is None, log.read_text()
    finally:
        watcher.kill()
        watcher.wait()
        subprocess.run(["ip", "netns", "exec", link.first, sys.executable, "-m", "testbed.cli", "down", *where])
