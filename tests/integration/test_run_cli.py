"""`testbed run` as a user runs it: the report directory last on stdout, Ctrl-C handled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client as k8s

from testbed.controlplane.cluster import ClusterState
from testbed.fleet.fleet import Fleet
from testbed.testing import wait_for

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


def test_ctrl_c_mid_run_writes_a_partial_report_and_cleans_up(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient, tmp_path: Path
) -> None:
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

    def running_pods() -> int:
        namespaces = [
            n.metadata.name
            for n in core.list_namespace().items
            if n.metadata.name.startswith("run-steady-churn-") and not n.metadata.deletion_timestamp
        ]
        return sum(1 for ns in namespaces for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running")

    try:
        # three at once (pods start every 0.5 s and run 2 s): the runner's own watch has
        # then long seen the first one Running
        wait_for(lambda: running_pods() >= 3, 180, "the run's pods to be running")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    directory = Path(out.strip().splitlines()[-1])
    report = json.loads((directory / "report.json").read_text())
    assert report["verdict"] == "INTERRUPTED"
    [phase] = report["phases"]
    assert phase["name"] == "churn" and phase["pods_running"] >= 1 and phase["jobs"] == 500
    assert not [n for n in core.list_namespace().items if n.metadata.name.startswith("run-steady-churn")]


def test_a_scenario_error_names_the_field(control_plane: ClusterState) -> None:
    proc = _run(control_plane, "smoke", "--set", "phases.0.qps=-3")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "phases[0].qps" in err and "greater than 0" in err


def test_run_with_up_starts_the_scenarios_cluster_and_stops_it(short_tmp_path: Path) -> None:
    """`--up`: no cluster yet; the scenario's `cluster:` section (smoke: 2 tiny nodes) is
    started, the run reports, and nothing is left running."""
    state_dir = short_tmp_path / "state"
    base = [sys.executable, "-m", "testbed.cli"]
    where = ["--name", "runup", "--state-dir", str(state_dir)]
    proc = subprocess.run([*base, "run", "smoke", "--up", *where], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((Path(proc.stdout.strip().splitlines()[-1]) / "report.json").read_text())
    assert report["verdict"] == "PASS"
    assert [p["pods_running"] for p in report["phases"]] == [2, 2, 1]
    assert "stopping cluster 'runup' (started by --up)" in proc.stderr
    status = subprocess.run([*base, "status", *where], capture_output=True, text=True, timeout=60)
    assert status.returncode == 1 and "not running" in status.stdout
