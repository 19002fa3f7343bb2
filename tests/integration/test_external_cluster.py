"""`testbed up --kubeconfig`: the fleet joins a cluster someone else runs (how kind mode
works), and `testbed down` takes it out again, leaving that cluster running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from kubernetes import client as k8s

from testbed.controlplane.cluster import ClusterState
from testbed.fleet import guardian
from testbed.testing import wait_for
from testbed.workloads import unique

pytestmark = pytest.mark.controlplane


def _testbed(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "testbed.cli", *args, "--name", "ext", "--state-dir", str(state_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _attach(control_plane: ClusterState, where: Path, fleet_file: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`testbed up --kubeconfig` of the session's cluster with this fleet file: its state dir, and how it went."""
    state_dir, fleet = where / "state", where / "fleet.yaml"
    fleet.write_text(fleet_file)
    return state_dir, _testbed(state_dir, "up", "--kubeconfig", str(control_plane.kubeconfig), "--fleet", str(fleet))


def test_a_fleet_joins_an_existing_cluster_and_leaves_it(
    control_plane: ClusterState, kube_api: k8s.ApiClient, short_tmp_path: Path
) -> None:
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    pools = "nodesPerHost: 2\npools: [{name: ext, count: 2, profile: tiny, labels: {joined: 'yes'}}]\n"
    state_dir, up = _attach(control_plane, short_tmp_path, pools)
    try:
        assert up.returncode == 0, up.stderr
        assert "no control plane started" in up.stderr
        assert Path(up.stdout.strip().splitlines()[-1]).read_text() == control_plane.kubeconfig.read_text()
        nodes = core.list_node(label_selector="joined=yes").items
        assert sorted(n.metadata.name for n in nodes) == ["ext-000", "ext-001"]
        for node in ("ext-000", "ext-001"):
            assert resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items

        status = _testbed(state_dir, "status")
        assert status.returncode == 0 and "ray" in status.stdout, status.stdout + status.stderr
        pools, hosts = status.stdout.split("fleet pools")[1].split("NodeHosts (Ray at", 1)
        assert "ext" in pools and "2 / 2" in pools, status.stdout
        assert "2 / 2" in hosts and "no" in hosts, "one NodeHost holding both, ready, not restarted"

        scaled = _testbed(state_dir, "scale", "ext", "1")
        assert scaled.returncode == 0, scaled.stderr
        assert [n.metadata.name for n in core.list_node(label_selector="joined=yes").items] == ["ext-000"]
    finally:
        down = _testbed(state_dir, "down")
    assert down.returncode == 0, down.stderr
    assert not core.list_node(label_selector="joined=yes").items, "the synthetic nodes left the cluster"
    assert not resource.list_resource_slice(field_selector="spec.nodeName=ext-000").items
    assert core.list_namespace().items, "the cluster itself still runs"


def test_down_deletes_the_fleets_nodes_directly_when_its_nodehosts_are_gone(
    control_plane: ClusterState, kube_api: k8s.ApiClient, short_tmp_path: Path
) -> None:
    """Ray killed under an attached fleet (its NodeHosts with it): nothing can drain the
    nodes, and someone else's cluster would keep them NotReady for good."""
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    state_dir, up = _attach(control_plane, short_tmp_path, "pools: [{name: gone, count: 2, profile: tiny}]\n")
    try:
        assert up.returncode == 0, up.stderr
        state = ClusterState.load(state_dir)
        assert state is not None
        [ray] = [p for p in state.processes if p.name == "ray"]
        os.kill(ray.pid, signal.SIGKILL)  # the head; its raylet and NodeHosts follow
        wait_for(lambda: not ray.alive(), 30, "Ray's head gone")
    finally:
        down = _testbed(state_dir, "down")
    assert down.returncode == 0, down.stderr
    assert "2 synthetic Nodes, deleted from the cluster directly" in down.stderr, down.stderr
    assert not [n for n in core.list_node().items if n.metadata.name.startswith("gone-")]
    wait_for(
        lambda: not resource.list_resource_slice(field_selector="spec.nodeName=gone-000").items,
        60,
        "the node's slices garbage-collected with it",
    )


SESSION_CONFTEST = """
import pytest
from testbed.fleet.spec import single_pool

pytest_plugins = ["testbed.testing"]


@pytest.fixture(scope="session")
def fleet_spec():
    return single_pool(2, "tiny", nodes_per_host=2, prefix="{pool}")
"""

SESSION_TEST = """
import time
from pathlib import Path


def test_holds_its_fleet(fleet):
    Path("fleet-ready").write_text("")
    time.sleep(600)
"""


def test_a_test_session_killed_outright_takes_its_fleet_out_of_the_cluster_it_ran_on(
    control_plane: ClusterState, kube_api: k8s.ApiClient, short_tmp_path: Path
) -> None:
    """A driver developer's session against their own cluster (``TESTBED_TEST_KUBECONFIG``),
    killed outright by a CI timeout: its Ray head kept running and its Nodes stayed in that
    cluster, NotReady, for good. Its fleet's guardian now cleans up."""
    core = k8s.CoreV1Api(kube_api)
    pool = unique("killed")
    (short_tmp_path / "conftest.py").write_text(SESSION_CONFTEST.replace("{pool}", pool))
    (short_tmp_path / "test_session.py").write_text(SESSION_TEST)
    state = short_tmp_path / "state"  # where the guardian records what it cleaned up
    env = {**os.environ, "TESTBED_TEST_KUBECONFIG": str(control_plane.kubeconfig), "TESTBED_STATE_DIR": str(state)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_session.py"]
    log = (short_tmp_path / "session.log").open("wb")
    session = subprocess.Popen(command, cwd=short_tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (short_tmp_path / "fleet-ready").exists() or session.poll() is not None, 180, "the fleet up")
        assert session.poll() is None, (short_tmp_path / "session.log").read_text()[-3000:]
        [guard_file] = [
            path
            for path in Path(tempfile.gettempdir()).glob(f"tbf-*/{guardian.GUARD_FILE}")
            if guardian.Guard.load(path.parent).owner.pid == session.pid
        ]
        fleet_dir, guard = guard_file.parent, guardian.Guard.load(guard_file.parent)
        [ray] = [p for p in guard.processes if p.name == "ray"]
        assert ray.alive() and len(_nodes_of(core, pool)) == 2
    finally:
        session.kill()
        session.wait()
        log.close()
    wait_for(lambda: not _nodes_of(core, pool), 60, "the session's Nodes deleted from the cluster")
    wait_for(lambda: not ray.alive(), 30, "the session's Ray head stopped")
    wait_for(lambda: not fleet_dir.exists(), 30, f"{fleet_dir} removed")
    assert core.list_namespace().items, "the cluster itself still runs"
    [record] = (state / guardian.RECORD_FILE).read_text().splitlines()
    assert f"deleted Nodes {pool}-" in record and f"pid {session.pid}" in record


def _nodes_of(core: k8s.CoreV1Api, pool: str) -> list[str]:
    return [n.metadata.name for n in core.list_node().items if n.metadata.name.startswith(f"{pool}-")]
