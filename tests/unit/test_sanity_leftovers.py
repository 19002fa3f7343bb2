"""Which sanity runs count as dead: a run killed outright is cleared by the next one, and
a run still under way (here or on another machine) must never be."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from testbed.sanity.leftovers import RUN_LABEL, STALE_AFTER_S, dead_here, dead_runs, record_owner

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)


def _stamp(seconds_ago: float, fraction: bool = False) -> str:
    moment = NOW - timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if fraction else "%Y-%m-%dT%H:%M:%SZ")


def _node(name: str, run_id: str | None, created_s_ago: float = 3600) -> dict[str, object]:
    labels = {RUN_LABEL: run_id} if run_id else {"kubernetes.io/hostname": name}
    return {"metadata": {"name": name, "labels": labels, "creationTimestamp": _stamp(created_s_ago)}}


def test_a_run_is_dead_once_its_lease_went_unrenewed_and_not_before() -> None:
    nodes = [_node("sanity-live", "live"), _node("sanity-dead", "dead"), _node("sanity-edge", "edge")]
    renewed = {
        "sanity-live": _stamp(5, fraction=True),  # renewed every 10 s by the run's kubelet
        "sanity-dead": _stamp(STALE_AFTER_S + 1, fraction=True),
        "sanity-edge": _stamp(STALE_AFTER_S - 1),
    }
    [dead] = dead_runs(nodes, renewed, NOW)
    assert (dead.run_id, dead.node, dead.namespace, dead.device_class) == (
        "dead",
        "sanity-dead",
        "sanity-dead",
        "sanity-dead.dra-testbed.io",
    )
    assert dead.why == f"its node's Lease unrenewed for {STALE_AFTER_S + 1:.0f} s"


def test_without_a_lease_the_nodes_age_decides() -> None:
    """Killed between registering its Node and its first Lease, or just registered."""
    nodes = [_node("sanity-old", "old", created_s_ago=600), _node("sanity-new", "new", created_s_ago=3)]
    assert [run.run_id for run in dead_runs(nodes, {}, NOW)] == ["old"]


def test_only_sanity_nodes_count() -> None:
    """A node someone else labelled (not named as a run's node is) is not the sweep's."""
    nodes = [_node("worker-1", None), _node("gpu-0", None), _node("gpu-1", "abc123")]
    assert dead_runs(nodes, {}, NOW) == []


def test_the_threshold_is_the_callers() -> None:
    nodes = [_node("sanity-a", "a")]
    renewed = {"sanity-a": _stamp(3)}
    assert dead_runs(nodes, renewed, NOW, stale_after_s=2) != []
    assert dead_runs(nodes, renewed, NOW) == []


def test_here_a_run_is_dead_once_its_process_is_gone(tmp_path: Path) -> None:
    live, gone = tmp_path / "live01", tmp_path / "gone01"
    for run_dir in (live, gone):
        run_dir.mkdir()
    record_owner(live)  # this process: alive
    script = f"import pathlib, testbed.sanity.leftovers as l; l.record_owner(pathlib.Path({str(gone)!r}))"
    subprocess.run([sys.executable, "-c", script], check=True)  # a run whose process has exited since
    [dead] = dead_here(tmp_path, time.time())
    assert dead.run_id == "gone01" and "is gone" in dead.why


def test_here_a_directory_without_an_owner_counts_only_once_it_is_old(tmp_path: Path) -> None:
    """A run writes its owner first thing; one without is older code's or killed at once."""
    fresh, old = tmp_path / "fresh1", tmp_path / "old001"
    for run_dir in (fresh, old):
        run_dir.mkdir()
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert [run.run_id for run in dead_here(tmp_path, time.time())] == ["old001"]
    assert dead_here(tmp_path / "missing", time.time()) == []
