"""Control-plane components that die are started again; a scenario rides it out, and
ends with verdict ERROR, a report and a bounded wait when the control plane is gone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.config import ControlPlaneConfig, nodes_dir
from testbed.controlplane import cluster, processes, supervisor
from testbed.controlplane.binaries import Binaries
from testbed.fleet import raycluster
from testbed.testing import wait_for

pytestmark = pytest.mark.controlplane


def _pid(config: ControlPlaneConfig, name: str) -> int:
    state = cluster.ClusterState.load(config.cluster_dir)
    assert state is not None
    return next(p.pid for p in state.processes if p.name == name)


def _healthy(config: ControlPlaneConfig) -> bool:
    _, components = cluster.status(config)
    return bool(components) and all(c.healthy for c in components)


def test_each_component_killed_comes_back_and_down_stops_what_runs_now(
    kube_binaries: Binaries, short_tmp_path: Path
) -> None:
    config = ControlPlaneConfig(name="supervised", state_dir=short_tmp_path / "c")
    cluster.up(config, binaries=kube_binaries)
    try:
        first = {name: _pid(config, name) for name in cluster.STOP_ORDER}
        for name in cluster.STOP_ORDER:
            os.kill(first[name], signal.SIGKILL)
            wait_for(lambda n=name: _pid(config, n) != first[n] and _healthy(config), 60, f"{name} back and healthy")
        state = cluster.ClusterState.load(config.cluster_dir)
        assert state is not None
        supervised = state.supervision
        # At least once each: kube-controller-manager also exits by itself (exit 1) when it
        # loses its leader lease while the API server is down, and is restarted again.
        assert all(supervised[n].restarts >= 1 for n in cluster.STOP_ORDER), supervised

        # Now the supervisor's own child: its exit is known.
        second = _pid(config, "kube-apiserver")
        os.kill(second, signal.SIGKILL)
        wait_for(lambda: _pid(config, "kube-apiserver") != second and _healthy(config), 60, "apiserver back again")
        again = cluster.ClusterState.load(config.cluster_dir)
        assert again is not None
        assert again.supervision["kube-apiserver"].restarts == 2
        assert again.supervision["kube-apiserver"].last_exit == "killed by SIGKILL"
        running = [p for p in again.processes if p.alive()]
    finally:
        cluster.down(config)
    assert [p.name for p in running if p.alive()] == [], "down stopped the restarted processes"


def _testbed(verb: str, config: ControlPlaneConfig, *args: str) -> None:
    """`testbed up`/`down` as a user runs them: a process of its own, which joins the
    cluster's own Ray (this one may be in the session fleet's already)."""
    command = [sys.executable, "-m", "testbed.cli", verb, "--name", config.name, "--state-dir", str(config.cluster_dir)]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _up_with_two_nodes(config: ControlPlaneConfig) -> None:
    """Two tiny synthetic nodes whose kubelets sync each pod every 10 s, not 60: a pod
    whose start met a component's death is tried again 10-15 s later, not 60-90 s."""
    fleet = config.state_dir.parent / "fleet.yaml"
    fleet.write_text("nodesPerHost: 2\npools:\n- {name: node, count: 2, profile: tiny, syncFrequencySeconds: 10}\n")
    _testbed("up", config, "--fleet", str(fleet))


@pytest.fixture(scope="module")
def small_cluster(kube_binaries: Binaries) -> Iterator[ControlPlaneConfig]:
    """A cluster of its own (components get killed) with two tiny synthetic nodes."""
    import tempfile

    config = ControlPlaneConfig(name="riding", state_dir=Path(tempfile.mkdtemp(prefix="tbs-")) / "c")
    _up_with_two_nodes(config)
    try:
        yield config
    finally:
        _testbed("down", config)
        shutil.rmtree(config.state_dir.parent, ignore_errors=True)  # the temporary made above


def _run(config: ControlPlaneConfig, output: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "testbed.cli", "run", "smoke", "--name", config.name]
    command += ["--state-dir", str(config.cluster_dir), "--output", str(output), *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("component", cluster.STOP_ORDER)
def test_a_scenario_rides_out_a_component_killed_mid_run(
    small_cluster: ControlPlaneConfig, component: str, tmp_path: Path
) -> None:
    # Longer pods, so the kill lands while they run. A pod whose claims the kubelet
    # could not read while the API server was down is tried again at the kubelet's next
    # sync, as a real kubelet does (10-15 s here, 60-90 s by default): the runner waits
    # that long for pods already on nodes (runner.KUBELET_RETRY_S) before it calls a
    # phase stalled.
    proc = _run(small_cluster, tmp_path / "report", "--set", "phases.0.runSeconds=8")
    wait_for(lambda: _running_pods(small_cluster), 120, "the run's first pods to run")
    os.kill(_pid(small_cluster, component), signal.SIGKILL)  # while they run
    _, stderr = proc.communicate(timeout=300)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["verdict"] != "ERROR", (report.get("error"), stderr[-2000:])
    # Every Job completed. A pod more may have run: when the API server dies with a pod
    # create in flight, the Job controller creates again and deletes the surplus pod;
    # the report counts such a pod as removed.
    assert all(p["pods_succeeded"] == p["pods_expected"] for p in report["phases"]), report["phases"]
    assert all(p["pods_running"] <= p["pods_expected"] + p["pods_removed"] for p in report["phases"])
    assert report["left_behind"] == ""
    wait_for(lambda: _healthy(small_cluster), 60, "the cluster healthy again")


def _running_pods(config: ControlPlaneConfig) -> int:
    from kubernetes import client as k8s

    from testbed.kube import api_client

    api = api_client(config.cluster_dir / "kubeconfig")
    try:
        pods = k8s.CoreV1Api(api).list_pod_for_all_namespaces(field_selector="status.phase=Running").items
        return len([p for p in pods if p.metadata.namespace.startswith("run-smoke-")])
    except Exception:
        return 0
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_down_during_a_run_ends_it_with_error_and_a_report(kube_binaries: Binaries, tmp_path: Path) -> None:
    import tempfile

    config = ControlPlaneConfig(name="downed", state_dir=Path(tempfile.mkdtemp(prefix="tbd-")) / "c")
    _up_with_two_nodes(config)
    nodes = nodes_dir(config.cluster_dir)
    try:
        proc = _run(config, tmp_path / "report", "--set", "phases.0.runSeconds=30")
        wait_for(lambda: _running_pods(config), 120, "the run's pods to run")
    finally:
        _testbed("down", config)
    stopped = time.monotonic()
    _, stderr = proc.communicate(timeout=180)
    took = time.monotonic() - stopped
    shutil.rmtree(config.state_dir.parent, ignore_errors=True)  # the temporary made above
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert proc.returncode == 1
    assert report["verdict"] == "ERROR", (report.get("error"), stderr[-2000:])
    assert "no supervisor runs to restart it" in report["error"] or "the cluster is gone" in report["error"]
    for phase in report["phases"]:  # a startup SLO only where every pod started
        assert phase["slo_met"] is None or phase["pods_running"] == phase["pods_expected"], phase
    assert took < 90, f"the run took {took:.0f} s to give up"
    assert not nodes.exists(), "the synthetic nodes' directories went with the cluster"


def test_the_supervisor_deletes_a_namespace_a_run_left_behind(control_plane: cluster.ClusterState) -> None:
    """What `testbed run` notes when the API server was gone as it ended."""
    from kubernetes import client as k8s

    from testbed.controlplane import leftovers
    from testbed.kube import api_client

    name = f"left-behind-{os.getpid()}"
    api = api_client(control_plane.kubeconfig)
    core = k8s.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": name}})
        leftovers.remember(control_plane.root, name)

        def taken() -> bool:
            if leftovers.pending(control_plane.root):
                return False
            try:
                return core.read_namespace(name).metadata.deletion_timestamp is not None
            except k8s.ApiException as exc:
                return exc.status == 404

        wait_for(taken, 60, "the supervisor to delete the namespace and forget it")
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_a_cluster_whose_directory_is_removed_is_stopped_by_its_supervisor(kube_binaries: Binaries) -> None:
    """A CI job that cleans its workspace without `testbed down` removes the cluster
    directory under a running cluster: nothing could find its processes any more, so its
    supervisor stops them, the Ray head and the NodeHosts too, rather than leave them
    running for good."""
    import tempfile

    config = ControlPlaneConfig(name="orphaned", state_dir=Path(tempfile.mkdtemp(prefix="tbo-")) / "c")
    _up_with_two_nodes(config)
    state = cluster.ClusterState.load(config.cluster_dir)
    assert state is not None
    recorded = list(state.processes)
    assert {"ray", cluster.SUPERVISOR, *cluster.STOP_ORDER} <= {r.name for r in recorded}
    ray_dir = str(raycluster.ray_temp_dir(config.cluster_dir)).encode()

    def ray_processes() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and ray_dir in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
        return found

    assert ray_processes(), "the fleet's Ray runs"
    outside = [nodes_dir(config.cluster_dir), raycluster.ray_temp_dir(config.cluster_dir).parent]
    assert all(d.is_dir() for d in outside), outside
    try:
        shutil.rmtree(config.state_dir.parent)
        wait_for(lambda: not any(r.alive() for r in recorded), 60, "every process of the removed cluster stopped")
        wait_for(lambda: not ray_processes(), 30, "Ray's processes (raylet, NodeHosts) gone with its head")
        assert not config.state_dir.parent.exists(), "a restarted component made the cluster directory again"
        # The nodes' directory holds the NodeHosts' kubeconfigs: nothing of it may stay behind.
        wait_for(lambda: not any(d.exists() for d in outside), 30, f"{outside} removed with the cluster")
    finally:
        processes.stop([r for r in recorded if r.alive()])
        raycluster.remove_temp_dir(config.cluster_dir)


def test_a_cluster_whose_owner_is_killed_is_stopped_by_its_supervisor(kube_binaries: Binaries) -> None:
    """A pytest session killed outright (a CI job's timeout) cannot stop the control plane
    its fixture started, nor the Ray head it started later: the supervisor, seeing the
    session's process gone, stops them all and removes the cluster directory."""
    import tempfile

    owner = subprocess.Popen(["sleep", "600"])  # stands for the session
    config = ControlPlaneConfig(name="owned", state_dir=Path(tempfile.mkdtemp(prefix="tbw-")) / "c")
    try:
        record = processes.ProcessRecord("a session", owner.pid, processes.process_start_ticks(owner.pid) or 0, "", [])
        state = cluster.up(config, binaries=kube_binaries, owner=record)
        head, _ = raycluster.start_head(state.root, state.layout.log("ray"))
        cluster.record_process(state.root, head)
        recorded = [head, *state.processes]
        assert {cluster.SUPERVISOR, *cluster.STOP_ORDER} <= {r.name for r in recorded}
        time.sleep(3 * supervisor.POLL_S)  # three of its looks: nothing is stopped while the owner lives
        assert all(r.alive() for r in recorded) and config.cluster_dir.is_dir()

        owner.kill()
        owner.wait()
        wait_for(lambda: not any(r.alive() for r in recorded), 60, "every process of the cluster stopped")
        wait_for(lambda: not config.cluster_dir.exists(), 30, "the cluster directory removed")
        assert not raycluster.ray_temp_dir(config.cluster_dir).parent.exists()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        cluster.down(config)
        raycluster.remove_temp_dir(config.cluster_dir)
        shutil.rmtree(config.state_dir.parent, ignore_errors=True)
