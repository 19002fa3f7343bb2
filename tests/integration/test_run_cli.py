"""`testbed run` as a user runs it: the report directory last on stdout, Ctrl-C handled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kubernetes import client as k8s

from fake_devices.hardware import build_inventory
from testbed.controlplane.cluster import ClusterState
from testbed.drivers import KINDS, drivers_for, load_profile
from testbed.fleet.fleet import Fleet
from testbed.keys import RUN_LABEL
from testbed.kubeletplugin.slices import desired_slices
from testbed.scenarios.spec import SHIPPED_DIR
from testbed.testing import wait_for
from tests.integration.subprocesses import interrupt, killed_if_left

pytestmark = pytest.mark.controlplane


def _run(control_plane: ClusterState, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            "--name",
            control_plane.name,
            "--state-dir",
            str(control_plane.root),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


@pytest.mark.parametrize("signal_sent", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_writes_a_partial_report_and_cleans_up(
    signal_sent: signal.Signals, control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient, tmp_path: Path
) -> None:
    """Ctrl-C, or SIGTERM from `timeout` or a cancelled CI job."""
    proc = _run(
        control_plane,
        "steady-churn",
        "--set",
        "phases.0.jobs=500",
        "--set",
        "phases.0.qps=2",
        "--output",
        str(tmp_path / "report"),
    )
    core = k8s.CoreV1Api(kube_api)
    with killed_if_left(proc):
        # three at once (pods start every 0.5 s and run 2 s): the runner's own watch has
        # then long seen the first one Running
        wait_for(lambda: _running_pods(core) >= 3, 180, "the run's pods to be running")
        out, err = interrupt(proc, signal_sent, timeout_s=180)
    assert proc.returncode == 130, err
    directory = Path(out.strip().splitlines()[-1])
    report = json.loads((directory / "report.json").read_text())
    assert report["verdict"] == "INTERRUPTED"
    [phase] = report["phases"]
    assert phase["name"] == "churn" and phase["pods_running"] >= 1 and phase["jobs"] == 500
    assert not [n for n in core.list_namespace().items if n.metadata.name.startswith("run-steady-churn")]


def _churn_namespaces(core: k8s.CoreV1Api) -> list[str]:
    return [
        n.metadata.name
        for n in core.list_namespace().items
        if n.metadata.name.startswith("run-steady-churn-") and not n.metadata.deletion_timestamp
    ]


def _running_pods(core: k8s.CoreV1Api) -> int:
    namespaces = _churn_namespaces(core)
    return sum(1 for ns in namespaces for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running")


def test_a_run_killed_outright_leaves_its_namespace_to_the_next_run_which_deletes_it(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient, tmp_path: Path
) -> None:
    """kill -9 (an OOM kill, a CI runner gone): no clean-up, its pods hold devices on, and
    the DeviceTaintRule of its `taint-rule` fault stays."""
    scenario = tmp_path / "churn-drained.yaml"
    scenario.write_text(
        (SHIPPED_DIR / "steady-churn.yaml").read_text()
        + "faults: [{atSeconds: 0, nodes: tb-001, action: taint-rule, device: gpu-1, effect: NoSchedule}]\n"
    )
    killed = _run(control_plane, str(scenario), "--set", "phases.0.jobs=500", "--set", "phases.0.qps=2")
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)

    def rules() -> list[str]:
        return [r.metadata.name for r in resource.list_device_taint_rule(label_selector=RUN_LABEL).items]

    with killed_if_left(killed):
        wait_for(lambda: _running_pods(core) >= 1 and rules(), 180, "the run's pods to be running, its rule made")
        killed.kill()
        killed.communicate(timeout=30)
    [left] = _churn_namespaces(core)
    [rule] = rules()
    then = _run(control_plane, "steady-churn", "--set", "phases.0.jobs=2", "--output", str(tmp_path / "next"))
    with killed_if_left(then):
        _, err = then.communicate(timeout=300)
    assert f"deleting namespace {left}, left by a run that was killed (pid {killed.pid})" in err, err
    assert f"deleting DeviceTaintRule {rule}, left by a run that was killed" in err, err
    assert then.returncode == 0, err
    assert _churn_namespaces(core) == [] and rules() == []


def test_a_scenario_error_names_the_field(control_plane: ClusterState) -> None:
    proc = _run(control_plane, "smoke", "--set", "phases.0.qps=-3")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "phases[0].qps" in err and "greater than 0" in err


def test_a_device_class_the_cluster_lacks_is_refused_before_the_first_phase(control_plane: ClusterState) -> None:
    proc = _run(control_plane, "smoke", "--set", "phases.0.requests.0.deviceClass=gpu.exmaple.com")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    # The session's control plane has the testbed's classes once a fleet test installed
    # them, and none before: the mistyped one is named either way.
    assert "scenario smoke asks for DeviceClass gpu.exmaple.com (phase gpus)" in err, err
    assert "which this cluster does not have" in err and "hint: its DeviceClasses: " in err, err
    assert "phase gpus:" not in err, "refused before the first phase"


def test_run_with_up_starts_the_scenarios_cluster_and_stops_it(short_tmp_path: Path) -> None:
    """`--up`: no cluster yet; the scenario's `cluster:` section (smoke: 2 tiny nodes),
    with two knobs turned, is started, the run reports (JUnit too), and nothing is left
    running. `testbed compare` then reads the report against a worse copy of itself."""
    state_dir = short_tmp_path / "state"
    base = [sys.executable, "-m", "testbed.cli"]
    where = ["--name", "runup", "--state-dir", str(state_dir)]
    knobs = ["--set", "cluster.percentageOfNodesToScore=50", "--set", "cluster.devicesPerSlice=1"]
    junit, out = short_tmp_path / "junit.xml", ["--output", str(short_tmp_path / "report")]  # not in $HOME
    proc = subprocess.run(
        [*base, "run", "smoke", "--up", *where, *knobs, *out, "--junit", str(junit)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    directory = Path(proc.stdout.strip().splitlines()[-1])
    report = json.loads((directory / "report.json").read_text())
    assert report["verdict"] == "PASS"
    assert [p["pods_running"] for p in report["phases"]] == [2, 2, 1, 2]
    assert "stopping cluster 'runup' (started by --up)" in proc.stderr
    # The knobs reached the cluster: the scheduler's setting is recorded, and one device per slice.
    assert report["cluster"]["settings"]["percentageOfNodesToScore"] == 50
    profile = load_profile("tiny")
    inventory = build_inventory(profile, "n", seed=0)
    drivers = drivers_for(profile)
    per_node = sum(len(desired_slices(d, "n", *KINDS[d].select(*inventory), [], devices_per_slice=1)) for d in drivers)
    assert report["slices"] == 2 * per_node > 2 * len(drivers)
    suite = ET.parse(junit).getroot()
    assert [case.get("name") for case in suite.iter("testcase")] == [
        "gpus",
        "partitions",
        "aligned",
        "extended",
        "leak-check",
    ]
    assert suite.get("failures") == "0"

    worse = json.loads(json.dumps(report))
    for phase in worse["phases"]:
        phase["pod_startup_s"]["p99"] *= 2
    (short_tmp_path / "worse.json").write_text(json.dumps(worse))
    same = subprocess.run(
        [*base, "compare", str(directory), str(directory), "--fail-if", "startup_p99=1.2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert same.returncode == 0 and "same settings" in same.stdout, same.stderr
    regressed = subprocess.run(
        [*base, "compare", str(directory), str(short_tmp_path / "worse.json"), "--fail-if", "startup_p99=1.2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert regressed.returncode == 1 and f"{len(report['phases'])} regression(s)" in regressed.stderr, regressed.stderr
    status = subprocess.run([*base, "status", *where], capture_output=True, text=True, timeout=60)
    assert status.returncode == 1 and "not running" in status.stdout
