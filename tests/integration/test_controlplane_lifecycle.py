"""Start-up, teardown and every way they can go wrong, on clusters of their own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as kubernetes_config

from testbed import environment
from testbed.config import ControlPlaneConfig
from testbed.controlplane import cluster, processes
from testbed.controlplane.binaries import Binaries
from testbed.errors import TestbedError
from testbed.fleet import raycluster
from testbed.fleet.spec import FleetFile
from testbed.progress import SilentProgress
from testbed.testing import wait_for
from tests.integration.subprocesses import interrupt, killed_if_left

pytestmark = pytest.mark.controlplane


def _ports(state: cluster.ClusterState) -> list[int]:
    return list(state.ports.as_dict().values())


def _assert_nothing_left(records: list[processes.ProcessRecord], ports: list[int]) -> None:
    assert [r.name for r in records if r.alive()] == []
    assert [p for p in ports if processes.accepting_connections(p)] == []


def test_killed_run_is_cleared_and_teardown_leaves_nothing(kube_binaries: Binaries, tmp_path: Path) -> None:
    config = ControlPlaneConfig(name="lifecycle", state_dir=tmp_path / "c")
    first = cluster.up(config, binaries=kube_binaries)
    assert sorted(r.name for r in first.live_processes()) == sorted([*cluster.STOP_ORDER, cluster.SUPERVISOR])
    for record in first.processes:  # as if the machine lost the processes mid-run
        os.kill(record.pid, signal.SIGKILL)
    wait_for(lambda: not first.live_processes(), 10, "the killed processes to exit")

    second = cluster.up(config, binaries=kube_binaries)
    assert second.ready and len(second.live_processes()) == 5
    stopped = cluster.down(config)
    assert sorted(stopped) == sorted([*cluster.STOP_ORDER, cluster.SUPERVISOR])
    _assert_nothing_left(first.processes + second.processes, _ports(second))
    assert not config.cluster_dir.exists()
    assert cluster.down(config) == []  # a second down is a no-op, not an error


def test_second_up_on_a_running_cluster_is_refused(control_plane: cluster.ClusterState) -> None:
    config = ControlPlaneConfig(name=control_plane.name, state_dir=control_plane.root)
    with pytest.raises(TestbedError) as info:
        cluster.up(config, binaries=Binaries(Path("/nonexistent"), "unused"))
    assert "already running" in str(info.value) and "testbed down" in str(info.value)
    assert len(control_plane.live_processes()) == 5
    assert (
        cluster.http_status(f"{control_plane.apiserver_url}/readyz", cluster.admin_ssl_context(control_plane.layout))
        == 200
    )


def test_apiserver_port_in_use_is_refused_before_anything_starts(kube_binaries: Binaries, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = ControlPlaneConfig(name="busy", state_dir=tmp_path / "c", apiserver_port=port)
        with pytest.raises(TestbedError) as info:
            cluster.up(config, binaries=kube_binaries)
    assert f"port {port}" in str(info.value) and "--port" in str(info.value)
    assert cluster.ClusterState.load(config.cluster_dir) is None


def test_components_whose_ports_were_taken_before_they_bound_them_start_on_new_ones(
    kube_binaries: Binaries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are chosen free and bound later; another process on a busy CI machine took
    kube-controller-manager's in between once, and `testbed up` failed. Here two
    listeners stand on etcd's client port and the controller manager's when they start."""
    real_free_ports = processes.free_ports
    with socket.socket() as etcd_taken, socket.socket() as kcm_taken:
        for taken in (etcd_taken, kcm_taken):
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        squatted = [etcd_taken.getsockname()[1], kcm_taken.getsockname()[1]]
        calls = []

        def free_ports_someone_takes(count: int) -> list[int]:
            calls.append(count)
            chosen = real_free_ports(count)
            if len(calls) == 1:  # the first choice: etcd client, peer, API server, KCM, ...
                chosen[0], chosen[3] = squatted
            return chosen

        monkeypatch.setattr(processes, "free_ports", free_ports_someone_takes)
        config = ControlPlaneConfig(name="squatted", state_dir=tmp_path / "c")
        state = cluster.up(config, binaries=kube_binaries)
        try:
            assert state.ports.etcd_client not in squatted and state.ports.controller_manager not in squatted
            assert cluster.ClusterState.load(config.cluster_dir).ports == state.ports  # type: ignore[union-attr]
            _, components = cluster.status(config)
            assert {c.name: c.healthy for c in components if c.name in cluster.STOP_ORDER} == dict.fromkeys(
                cluster.STOP_ORDER, True
            )
            assert len(state.live_processes()) == 5  # the ones that lost the race are not left behind
        finally:
            cluster.down(config)


def test_component_dying_at_start_up_shows_its_log(kube_binaries: Binaries, tmp_path: Path) -> None:
    config = ControlPlaneConfig(
        name="dying", state_dir=tmp_path / "c", extra_feature_gates={"NoSuchGateAnywhere": True}
    )
    with pytest.raises(cluster.ComponentFailed) as info:
        cluster.up(config, SilentProgress(), binaries=kube_binaries)
    text = str(info.value)
    assert "kube-apiserver exited during start-up" in text
    assert "NoSuchGateAnywhere" in text  # the apiserver's own complaint, from its log
    logs = config.cluster_dir / "logs"
    assert (logs / "etcd.log").exists()
    # every process that was started is gone
    assert cluster.ClusterState.load(config.cluster_dir) is None
    for line in (logs / "etcd.log").read_text().splitlines()[:1]:
        assert line  # the log stays for the post-mortem


def test_a_control_plane_that_fails_to_start_takes_the_ray_head_launched_beside_it(
    kube_binaries: Binaries, tmp_path: Path
) -> None:
    """`testbed up` with a fleet launches its Ray head while the API server starts; when
    the API server never comes up, that head goes too, with its temp dir."""
    config = ControlPlaneConfig(
        name="dying-ray", state_dir=tmp_path / "c", extra_feature_gates={"NoSuchGateAnywhere": True}
    )
    fleet = FleetFile.model_validate({"pools": [{"name": "p", "count": 1, "profile": "tiny"}]})
    temp_dir = raycluster.ray_temp_dir(config.cluster_dir).parent

    def ray_processes() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(temp_dir).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
        return found

    with pytest.raises(cluster.ComponentFailed, match="kube-apiserver exited during start-up"):
        environment.up(config, fleet, SilentProgress(), binaries=kube_binaries)
    assert (config.cluster_dir / "logs" / "ray.log").exists(), "Ray was launched beside the control plane"
    wait_for(lambda: not ray_processes(), 30, "the Ray head and its processes to be gone")
    assert not temp_dir.exists()


def _cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def cli_env(kube_binaries: Binaries, tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        TESTBED_STATE_DIR=str(tmp_path / "state"),
        TESTBED_KUBE_BIN_DIR=str(kube_binaries.directory),
    )


def test_cli_up_prints_the_kubeconfig_last_then_status_and_down(cli_env: dict[str, str]) -> None:
    started = _cli("up", "--name", "cli", env=cli_env)
    assert started.returncode == 0, started.stderr
    kubeconfig = Path(started.stdout.strip().splitlines()[-1])
    assert kubeconfig.is_file() and "current-context: cli" in kubeconfig.read_text()
    try:
        assert _cli("kubeconfig", "--name", "cli", env=cli_env).stdout.strip() == str(kubeconfig)
        status = _cli("status", "--name", "cli", env=cli_env)
        assert status.returncode == 0, status.stdout + status.stderr
        for component in cluster.STOP_ORDER:
            assert component in status.stdout
        as_json = _cli("status", "--name", "cli", "--json", env=cli_env)
        document = json.loads(as_json.stdout)
        assert as_json.returncode == 0 and document["healthy"] and document["running"], as_json.stdout
        assert set(cluster.STOP_ORDER) <= {c["name"] for c in document["components"]}, document
        assert all(c["alive"] and c["healthy"] and c["restarts"] == 0 for c in document["components"]), document
        assert document["kubeconfig"] == str(kubeconfig) and document["fleet"] is None
        again = _cli("up", "--name", "cli", env=cli_env)
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = _cli("down", "--name", "cli", env=cli_env)
    assert stopped.returncode == 0 and "stopped" in stopped.stderr
    after = _cli("status", "--name", "cli", env=cli_env)
    assert after.returncode == 1 and "not running" in after.stdout
    after = _cli("status", "--name", "cli", "--json", env=cli_env)
    assert after.returncode == 1 and json.loads(after.stdout) == {"name": "cli", "running": False}
    assert _cli("kubeconfig", "--name", "cli", env=cli_env).returncode == 1


def _interrupt_up(
    env: dict[str, str], name: str, args: list[str], sig: signal.Signals, started: str
) -> cluster.ClusterState:
    """`testbed up --name name args`, sent ``sig`` once its state shows ``started`` (a
    component's name, or "fleet": its fleet made in Ray); it must end as interrupted, every
    process it started gone. The state as it was when the signal went."""
    state_dir = Path(env["TESTBED_STATE_DIR"]) / "clusters" / name
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "up", "--name", name, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def reached() -> cluster.ClusterState | None:
        if proc.poll() is not None:  # ended of itself: say why rather than wait out the deadline
            _, err = proc.communicate()
            raise AssertionError(f"`testbed up` ended with {proc.returncode} before {started} was started: {err}")
        s = cluster.ClusterState.load(state_dir)
        if s is None:
            return None
        done = s.fleet_id if started == "fleet" else any(p.name == started for p in s.processes)
        return s if done else None

    with killed_if_left(proc):
        try:
            state = wait_for(reached, 120, f"{started} to be started")
        except AssertionError as exc:
            if proc.poll() is None:
                proc.kill()
                _, err = proc.communicate()
                raise AssertionError(f"{exc}; `testbed up` said: {err[-4000:]}") from None
            raise
        _, err = interrupt(proc, sig)
    assert proc.returncode == 130, err
    assert "interrupted: everything this command started has been stopped" in err
    wait_for(lambda: not any(r.alive() for r in state.processes), 10, "started processes to be gone")
    return state


def test_ctrl_c_during_start_up_stops_everything(cli_env: dict[str, str]) -> None:
    _interrupt_up(cli_env, "ctrlc", [], signal.SIGINT, "kube-apiserver")


def test_sigterm_while_the_fleet_starts_stops_everything(cli_env: dict[str, str]) -> None:
    """What `timeout` or a cancelled CI job sends, once this process is in Ray (whose core
    would otherwise abort it on SIGTERM and leave the cluster running)."""
    state = _interrupt_up(cli_env, "term", ["--nodes", "400"], signal.SIGTERM, "fleet")
    assert "ray" in [r.name for r in state.processes]
    assert not state.root.exists()


def test_an_interrupted_scale_goes_on_in_the_hosts_and_is_recorded(cli_env: dict[str, str]) -> None:
    """Ctrl-C stops `testbed scale`, not the NodeHosts' calls under way: it says so, and
    the pool's recorded count is where they are taking it, so `status` compares the
    nodes with it."""
    started = _cli("up", "--name", "isc", "--nodes", "2", "--nodes-per-host", "400", env=cli_env)
    assert started.returncode == 0, started.stderr
    kubeconfig = started.stdout.strip().splitlines()[-1]
    core = k8s.CoreV1Api(kubernetes_config.new_client_from_config(config_file=kubeconfig))
    state_dir = Path(cli_env["TESTBED_STATE_DIR"]) / "clusters" / "isc"
    try:

        def scale_cli(count: int) -> subprocess.Popen[str]:
            command = [sys.executable, "-m", "testbed.cli", "scale", "--name", "isc", "node", str(count)]
            return subprocess.Popen(command, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def recorded_counts() -> list[int]:
            state = cluster.ClusterState.load(state_dir)
            assert state is not None and state.fleet is not None
            return [p["count"] for p in state.fleet.spec["pools"]]

        scale = scale_cli(150)
        with killed_if_left(scale):
            wait_for(lambda: len(core.list_node().items) > 2, 120, "the first added nodes")
            _, err = interrupt(scale, signal.SIGINT)
        assert scale.returncode == 130, err
        assert "the NodeHosts go on taking pool node to 150 nodes" in err
        assert recorded_counts() == [150]
        wait_for(lambda: len(core.list_node().items) == 150, 180, "the hosts to finish the scale")
        again = _cli("scale", "--name", "isc", "node", "150", env=cli_env)
        assert again.returncode == 0, again.stderr
        assert "node: 150 (150 nodes" in again.stderr

        # Killed outright (no Ctrl-C to handle): the count was recorded before any node came.
        killed = scale_cli(170)
        with killed_if_left(killed):
            wait_for(lambda: len(core.list_node().items) > 150, 120, "the first added nodes")
            killed.kill()
            killed.communicate(timeout=30)
        assert recorded_counts() == [170]
        wait_for(lambda: len(core.list_node().items) == 170, 180, "the hosts to finish the killed scale")

        # Two scales at once: the second waits for the first, then goes on from its nodes.
        logs = [Path(cli_env["TESTBED_STATE_DIR"]) / f"scale-{i}.log" for i in (0, 1)]

        def scale_to(count: str, log: Path) -> subprocess.Popen[str]:
            with log.open("w") as err_file:
                command = [sys.executable, "-m", "testbed.cli", "scale", "--name", "isc", "node", count]
                return subprocess.Popen(command, env=cli_env, stdout=subprocess.DEVNULL, stderr=err_file, text=True)

        scales = [scale_to("100", logs[0])]
        with killed_if_left(scales):
            wait_for(lambda: "draining" in logs[0].read_text(), 60, "the first scale to drain")
            scales.append(scale_to("130", logs[1]))
            assert [proc.wait(timeout=300) for proc in scales] == [0, 0], [log.read_text() for log in logs]
        assert f"waiting for `testbed scale node 100` (pid {scales[0].pid}) to finish" in logs[1].read_text()
        assert len(core.list_node().items) == 130
        state = cluster.ClusterState.load(state_dir)
        assert state is not None and state.fleet is not None
        assert [p["count"] for p in state.fleet.spec["pools"]] == [130]

        # `down` during a scale stops the scale first, which says so (it used to wait a
        # minute for the Ray that `down` took away, then die with Ray's own message).
        growing = scale_to("300", logs[0])
        with killed_if_left(growing):
            wait_for(lambda: "adding" in logs[0].read_text(), 60, "the scale to add nodes")
            taken = _cli("down", "--name", "isc", env=cli_env)
            assert taken.returncode == 0, taken.stderr
            assert growing.wait(timeout=30) == 130, logs[0].read_text()
        assert "stopped: `testbed down` is taking cluster 'isc' down" in logs[0].read_text()
        assert not state_dir.exists()
    finally:
        _cli("down", "--name", "isc", env=cli_env)


def test_an_advertised_address_is_where_the_api_server_listens_and_what_its_certificate_names(
    kube_binaries: Binaries, tmp_path: Path
) -> None:
    """127.0.0.2 stands in for another interface of this machine (all of 127/8 is local)."""
    import asyncio

    from testbed.kubeapi import KubeClient

    config = ControlPlaneConfig(name="advertised", state_dir=tmp_path / "c", advertise_address="127.0.0.2")
    state = cluster.up(config, binaries=kube_binaries)
    try:
        assert state.apiserver_url.startswith("https://127.0.0.2:")
        assert cluster.ClusterState.load(state.root).apiserver_url == state.apiserver_url  # type: ignore[union-attr]

        async def version() -> str:
            client = KubeClient.from_kubeconfig(state.kubeconfig)  # verifies the serving cert against the CA
            try:
                return str((await client.get("/version"))["gitVersion"])
            finally:
                await client.close()

        assert asyncio.run(version()) == "v1.37.1"
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", state.ports.apiserver)) != 0, "not on 127.0.0.1 as well"
    finally:
        cluster.down(config)
