"""The testbed deletes only directories it marked as its own, and names stay inside the state dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed import cli, environment
from testbed.config import ControlPlaneConfig
from testbed.controlplane import cluster, processes
from testbed.errors import TestbedError
from testbed.progress import SilentProgress


def _users_directory(tmp_path: Path) -> tuple[Path, set[Path]]:
    """A directory of the user's own that happens to hold the names a cluster dir holds."""
    root = tmp_path / "mine"
    for sub in ("logs", "pki"):
        (root / sub).mkdir(parents=True)
        (root / sub / "notes.txt").write_text("precious\n")
    (root / "state.json").write_text('{"name": "x"}')
    return root, set(root.rglob("*"))


@pytest.mark.parametrize("command", ["down", "up"])
def test_a_foreign_state_dir_is_refused_and_left_intact(tmp_path: Path, command: str) -> None:
    root, before = _users_directory(tmp_path)
    result = CliRunner().invoke(cli.main, [command, "--state-dir", str(root)])
    assert result.exit_code != 0
    assert "is not a testbed cluster directory" in result.output
    assert set(root.rglob("*")) == before
    assert (root / "logs" / "notes.txt").read_text() == "precious\n"


def test_an_empty_user_directory_is_used_and_kept_on_down(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    config = ControlPlaneConfig(name="c1", state_dir=root)
    prepared = cluster._prepare_directory(config, SilentProgress())
    (prepared / "logs").mkdir()
    assert cluster.owned(root)
    assert cluster.down(config) == []
    assert root.is_dir() and list(root.iterdir()) == []


def test_a_directory_the_testbed_made_is_removed_on_down(tmp_path: Path) -> None:
    config = ControlPlaneConfig(name="c2", state_dir=tmp_path / "made")
    cluster._prepare_directory(config, SilentProgress())
    cluster.down(config)
    assert not (tmp_path / "made").exists()


@pytest.mark.parametrize("name", ["x/../other", "a b/../c", "Upper", "-lead", "trail-", "", "a" * 64, "a.b"])
def test_cluster_names_must_be_dns_labels(name: str) -> None:
    with pytest.raises(TestbedError) as info:
        ControlPlaneConfig(name=name)
    assert "DNS-1123 label" in str(info.value)


@pytest.mark.parametrize("command", ["up", "down", "status"])
def test_a_bad_name_on_the_command_line_is_one_line(command: str) -> None:
    result = CliRunner().invoke(cli.main, [command, "--name", "x/../other"])
    assert result.exit_code != 0
    assert "is not a DNS-1123 label" in result.output and "Traceback" not in result.output
    assert "x/../other':" not in result.output  # refused before it is announced


def test_a_cluster_another_up_is_still_starting_is_named_as_such(tmp_path: Path) -> None:
    """Two `testbed up` of one name at once: the second says the first is starting it,
    where it said "partly running" and suggested `down`, which would stop the first."""
    config = ControlPlaneConfig(name="st", state_dir=tmp_path / "c")
    root = cluster._prepare_directory(config, SilentProgress())
    etcd = subprocess.Popen(["sleep", "60"])
    try:
        running = processes.ProcessRecord("etcd", etcd.pid, processes.process_start_ticks(etcd.pid) or 0, "", [])
        state = cluster.ClusterState("st", root, cluster.Ports(1, 2, 3, 4, 5, 6), "", [running])
        state.starter = processes.this_process("testbed up")
        state.save()
        with pytest.raises(TestbedError, match=rf"being started by another `testbed up` \(pid {os.getpid()}\)"):
            cluster._prepare_directory(config, SilentProgress())

        state.ready = True  # the control plane is up; the first `up` starts the fleet
        state.save()
        with pytest.raises(TestbedError, match=r"being started by .*; its control plane is up, its nodes are still"):
            cluster._prepare_directory(config, SilentProgress())

        state.starter = processes.ProcessRecord("testbed up", etcd.pid, 1, "", [])  # its pid, since reused
        state.save()
        with pytest.raises(TestbedError, match="is already running"):
            cluster._prepare_directory(config, SilentProgress())
        state.ready = False
        state.save()
        with pytest.raises(TestbedError, match="is partly running: etcd"):
            cluster._prepare_directory(config, SilentProgress())
    finally:
        etcd.kill()
        etcd.wait()


def test_list_names_each_cluster_or_says_there_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli.main, ["list"])
    assert result.exit_code == 0
    assert f"no clusters in {tmp_path / 'clusters'}: start one with `testbed up`" in result.output

    config = ControlPlaneConfig(name="left")
    root = cluster._prepare_directory(config, SilentProgress())
    cluster.ClusterState("left", root, cluster.Ports(1, 2, 3, 4, 5, 6), "").save()
    result = CliRunner().invoke(cli.main, ["list"])
    assert result.exit_code == 0
    assert "left" in result.output and "stopped" in result.output and "no clusters" not in result.output
    as_json = CliRunner().invoke(cli.main, ["list", "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output) == [
        {"name": "left", "state": "stopped", "synthetic_nodes": 0, "kubeconfig": str(root / "kubeconfig")}
    ]


def test_a_cluster_whose_up_was_killed_before_its_control_plane_was_up_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its terminal closed during `testbed up`: what it started runs on, not ready."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")
    config = ControlPlaneConfig(name="cut")
    root = cluster._prepare_directory(config, SilentProgress())
    etcd, starter = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["true"])
    starter.wait()
    try:
        running = processes.ProcessRecord("etcd", etcd.pid, processes.process_start_ticks(etcd.pid) or 0, "", [])
        state = cluster.ClusterState("cut", root, cluster.Ports(1, 2, 3, 4, 5, 6), "", [running])
        state.starter = processes.ProcessRecord("testbed up", starter.pid, 1, "", [])  # gone
        state.save()
        assert state.cut_short() == "control plane"
        listed = CliRunner().invoke(cli.main, ["list"])
        assert "start cut short" in listed.output, listed.output
        [as_json] = json.loads(CliRunner().invoke(cli.main, ["list", "--json"]).output)
        assert as_json["state"] == "start cut short", as_json
        told = CliRunner().invoke(cli.main, ["status", "--name", "cut"])
        assert told.exit_code == 1
        assert f"the `testbed up` that started it (pid {starter.pid}) ended before its control plane was up" in (
            " ".join(told.output.split())
        ), told.output
        told = CliRunner().invoke(cli.main, ["status", "--name", "cut", "--json"])
        document = json.loads(told.output)
        assert told.exit_code == 1 and not document["healthy"], told.output
        assert document["cut_short"] == "control plane" and document["starter_pid"] == starter.pid, document
        state.ready, state.starter = True, processes.this_process("testbed up")
        assert state.cut_short() == "", "an `up` at work on its fleet"
    finally:
        etcd.kill()
        etcd.wait()


def test_a_fleet_record_that_does_not_hold_is_named_and_hides_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state file whose fleet no longer validates (written by hand, or by a testbed that
    let `scale` record any count): every command names the file and the field in one
    line, `list` still shows the cluster, and `status` still shows its control plane."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")
    root = cluster._prepare_directory(ControlPlaneConfig(name="odd"), SilentProgress())
    state = cluster.ClusterState("odd", root, cluster.Ports(1, 2, 3, 4, 5, 6), "", ready=True)
    state.fleet = cluster.FleetRecord(
        {"pools": [{"name": "node", "count": 999_999_999}]}, "127.0.0.1:1", str(root / "nodes"), "f1"
    )
    state.save()
    with pytest.raises(TestbedError) as told:
        environment.recorded_fleet(state)
    assert f"invalid fleet recorded in {root / 'state.json'}" in told.value.message
    assert "pools[0].count: Input should be less than or equal to 100000" in told.value.message
    assert "`testbed down --name odd`" in (told.value.hint or "")

    listed = CliRunner().invoke(cli.main, ["list"])
    assert listed.exit_code == 0 and "its fleet record unreadable" in listed.output, listed.output
    status = CliRunner().invoke(cli.main, ["status", "--name", "odd"])
    assert "Traceback" not in status.output and "pools[0].count" in status.output, status.output
    assert f"kubeconfig: {root / 'kubeconfig'}" in status.output, "the control plane is still shown"
    for command in (["scale", "node", "3"], ["run", "smoke"]):
        said = CliRunner().invoke(cli.main, [*command, "--name", "odd"])
        assert said.exit_code == 1 and "Traceback" not in said.output, said.output


def test_a_state_dir_that_cannot_be_made_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("mine\n")
    monkeypatch.setenv("TESTBED_STATE_DIR", str(a_file))
    result = CliRunner().invoke(cli.main, ["up"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"cluster directory {a_file}/clusters/testbed: {a_file} is a file, not a directory" in result.output
    assert "hint: set TESTBED_STATE_DIR to a directory you can write in" in result.output
    result = CliRunner().invoke(cli.main, ["up", "--state-dir", str(a_file / "c")])
    assert result.exit_code == 1 and f"--state-dir {a_file}/c: {a_file} is a file" in result.output
    assert a_file.read_text() == "mine\n"


def test_list_shows_the_other_clusters_when_one_state_file_is_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    for name in ("good", "torn"):
        root = cluster._prepare_directory(ControlPlaneConfig(name=name), SilentProgress())
        cluster.ClusterState(name, root, cluster.Ports(1, 2, 3, 4, 5, 6), "").save()
    (tmp_path / "clusters" / "torn" / "state.json").write_text('{"name": "torn", "ro')
    listed = CliRunner().invoke(cli.main, ["list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [(c["name"], c["state"]) for c in json.loads(listed.output)] == [
        ("good", "stopped"),
        ("torn", "state unreadable (see `testbed status`)"),
    ]
    told = CliRunner().invoke(cli.main, ["status", "--name", "torn"])
    assert told.exit_code == 1 and "cannot read" in told.output and "state.json" in told.output


def test_a_cluster_whose_state_is_unreadable_is_removed_by_down_only_once_nothing_uses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its record of its processes lost, `down` cannot tell which are its own: it names
    those that still use the directory and deletes nothing, then removes it once they are
    gone. A process using a directory whose name only begins alike is not one of them."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    root = cluster._prepare_directory(ControlPlaneConfig(name="torn"), SilentProgress())
    (root / "logs").mkdir()
    (root / "state.json").write_text('{"name": "torn", "ro')
    neighbour = tmp_path / "clusters" / "torn2"
    waits = [sys.executable, "-c", "import time; time.sleep(60)"]
    user = subprocess.Popen([*waits, f"--log={root}/logs/etcd.log"])
    bystander = subprocess.Popen([*waits, str(neighbour)])
    try:
        refused = CliRunner().invoke(cli.main, ["down", "--name", "torn"])
        assert refused.exit_code == 1
        assert f"1 process still uses {root}: {user.pid} python" in refused.output
        assert f"hint: stop them (`kill {user.pid}`) and run `testbed down` again" in refused.output
        assert str(bystander.pid) not in refused.output
        assert (root / "state.json").exists() and (root / "logs").is_dir()
        told = CliRunner().invoke(cli.main, ["status", "--name", "torn"])
        assert f"`testbed down --state-dir {root}` removes it once no process uses it" in told.output
    finally:
        user.kill()
        user.wait()
    try:
        removed = CliRunner().invoke(cli.main, ["down", "--name", "torn"])
        assert removed.exit_code == 0, removed.output
        assert not root.exists()
        assert f"removed {root}: its state could not be read, and no process used it" in caplog.text
        assert bystander.poll() is None, "a process of another directory was stopped"
    finally:
        bystander.kill()
        bystander.wait()


def test_the_directory_a_failed_start_left_for_its_logs_is_removed_by_down_without_a_word_of_unreadable_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A start that failed stops its processes and keeps its logs, its state removed: that
    is not a state that could not be read."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    root = cluster._prepare_directory(ControlPlaneConfig(name="failed"), SilentProgress())
    (root / "logs").mkdir()
    (root / "logs" / "ray.log").write_text("why it failed\n")
    removed = CliRunner().invoke(cli.main, ["down", "--name", "failed"])
    assert removed.exit_code == 0, removed.output
    assert not root.exists()
    assert "could not be read" not in caplog.text + removed.output


@pytest.mark.parametrize("too_long", ["pool", "TMPDIR"])
def test_up_refuses_sockets_too_long_to_bind_before_anything_starts(
    too_long: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's sockets or Ray's, too long for a unix socket path: refused with the way
    out before the control plane starts (it started, then a NodeHost or the Ray head
    died with a traceback)."""
    import tempfile

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TESTBED_RUNTIME_DIR", "/tmp/dra-testbed-0")
    fleet = tmp_path / "fleet.yaml"
    pool = "p" * 39 if too_long == "pool" else "gpu"
    fleet.write_text(f"pools: [{{name: {pool}, count: 1, profile: tiny}}]\n")
    if too_long == "TMPDIR":
        monkeypatch.setattr(tempfile, "tempdir", "/tmp/" + "y" * 40)
    refused = CliRunner().invoke(cli.main, ["up", "--fleet", str(fleet)])
    assert refused.exit_code == 1, refused.output
    if too_long == "pool":
        assert f"pool '{pool}': its nodes' unix sockets would be 106 bytes long" in refused.output
        assert "hint: give the pool a name 1 character shorter or set TESTBED_RUNTIME_DIR" in refused.output
    else:
        assert "Ray's sockets under the temp dir /tmp/yyyy" in refused.output
        assert "hint: set TMPDIR to a directory at least 21 characters shorter" in refused.output
    assert not (tmp_path / "state" / "clusters" / "testbed").exists(), "something started"
