"""The supervisor's restart rules, on real processes (no control plane needed)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from testbed.controlplane import processes, supervisor
from testbed.testing import wait_for


def test_backoff_doubles_to_a_ceiling() -> None:
    assert [supervisor.backoff_s(n) for n in (1, 2, 3, 4, 5, 6, 7, 20)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_exits_are_described() -> None:
    assert supervisor.describe_exit(-9) == "killed by SIGKILL"
    assert supervisor.describe_exit(1) == "exit code 1"
    assert supervisor.describe_exit(None) == "exited (status unknown)"


def test_a_dead_component_is_restarted_after_its_backoff_and_recorded(tmp_path: Path) -> None:
    _, record = processes.start("sleeper", ["sleep", "600"], tmp_path / "sleeper.log", cwd=tmp_path)
    keeper = supervisor.Supervisor(tmp_path, [record])
    started: list[processes.ProcessRecord] = []
    try:
        assert keeper.step(1000.0) == [], "alive: nothing to do"
        os.kill(record.pid, signal.SIGKILL)
        wait_for(lambda: not record.alive(), 10, "the kill")
        assert keeper.step(1000.0) == [] and keeper.components["sleeper"].next_start_at == 1001.0
        assert keeper.step(1000.5) == [], "still backing off"
        assert keeper.step(1001.0) == ["sleeper"]
        fresh = keeper.components["sleeper"].process
        started.append(fresh)
        assert fresh.pid != record.pid and fresh.alive() and keeper.components["sleeper"].restarts == 1

        os.kill(fresh.pid, signal.SIGKILL)  # its own child now: the exit is known
        wait_for(lambda: not fresh.alive(), 10, "the second kill")
        keeper.step(1002.0)
        component = keeper.components["sleeper"]
        assert component.last_exit == "killed by SIGKILL" and component.next_start_at == 1004.0, "2 s: twice in a row"
        assert supervisor.read(tmp_path)["sleeper"].restarts == 1, "what others read"
    finally:
        processes.stop([record, *started, *[c.process for c in keeper.components.values()]])
