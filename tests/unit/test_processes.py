import dataclasses
import socket
import sys
import time
from pathlib import Path

import pytest

from testbed.controlplane import processes
from testbed.errors import TestbedError


def _sleeper(tmp_path: Path, name: str = "sleeper") -> processes.ProcessRecord:
    _, record = processes.start(
        name,
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        tmp_path / f"{name}.log",
        cwd=tmp_path,
    )
    return record


def test_start_records_a_live_process_and_stop_ends_it(tmp_path: Path) -> None:
    record = _sleeper(tmp_path)
    assert record.alive()
    assert processes.stop([record], timeout_s=5) == ["sleeper"]
    assert not record.alive()


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    record = _sleeper(tmp_path)
    impostor = dataclasses.replace(record, start_ticks=record.start_ticks + 1)
    assert not impostor.alive()
    assert processes.stop([impostor], timeout_s=1) == []
    assert record.alive()
    processes.stop([record], timeout_s=5)


def test_records_survive_a_json_round_trip(tmp_path: Path) -> None:
    record = _sleeper(tmp_path)
    try:
        assert processes.ProcessRecord.from_json(record.to_json()) == record
        with_grace = dataclasses.replace(record, grace_s=45.0)
        assert processes.ProcessRecord.from_json(with_grace.to_json()) == with_grace
    finally:
        processes.stop([record], timeout_s=5)


def test_log_tail_returns_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert processes.log_tail(log, lines=2) == "line 98\nline 99"
    assert "no log" in processes.log_tail(tmp_path / "missing.log")


def test_port_helpers(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert processes.port_in_use(port)
        assert processes.accepting_connections(port)
    assert not processes.accepting_connections(port)


def test_ports_for_servers_come_from_below_the_range_outgoing_connections_take_theirs() -> None:
    """A port from the ephemeral range can be taken by any connection (Ray connects a lot
    while the control plane starts) before its server binds it: kube-apiserver then
    failed with "address already in use"."""
    low = int(processes.EPHEMERAL_RANGE.read_text().split()[0])
    ports = processes.free_ports(12)
    assert len(set(ports)) == 12
    assert all(processes.LOWEST_CHOSEN_PORT <= port < low for port in ports), ports
    for port in ports:
        assert not processes.port_in_use(port)


def test_a_port_chosen_but_not_yet_bound_is_not_chosen_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control plane's scheduler and controller-manager bind their ports seconds after
    they were chosen; the Ray head's ports are chosen in between. A CI run lost
    kube-controller-manager's port that way."""
    monkeypatch.setattr(processes.random, "sample", lambda ports, count: sorted(ports))  # the lowest free first
    monkeypatch.setattr(processes, "_handed_out", {})
    first = processes.free_ports(5)
    later = [port for _ in range(3) for port in processes.free_ports(2)]
    assert set(first).isdisjoint(later) and len(set(later)) == len(later)


def test_a_port_something_listens_on_is_never_chosen() -> None:
    with socket.socket() as taken, socket.socket() as spare:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spare.bind(("127.0.0.1", 0))
        busy, free = taken.getsockname()[1], spare.getsockname()[1]
        spare.close()
        assert processes._bound_ports(1, [busy, free]) == [free]
        with pytest.raises(TestbedError, match="found only 0 of 1 free TCP ports"):
            processes._bound_ports(1, [busy])


def test_a_process_that_keeps_dying_waits_longer_each_time_and_one_that_ran_a_while_does_not() -> None:
    backoff = processes.RestartBackoff()
    assert [backoff.after_exit(1) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.after_exit(61) == 1, "a minute's run starts the back-off over"
    assert backoff.after_exit(5) == 2


def test_an_exit_reads_as_a_container_runtime_says_it() -> None:
    assert [processes.exit_status(code) for code in (0, 3, -9, -15)] == [0, 3, 137, 143]


def _slow_to_stop(tmp_path: Path, name: str, exits_after_s: float | None) -> processes.ProcessRecord:
    """A process that, on SIGTERM, exits cleanly after ``exits_after_s`` (never if None)."""
    on_term = "signal.SIG_IGN" if exits_after_s is None else f"lambda *_: (time.sleep({exits_after_s}), done())"
    script = (
        "import signal, sys, time\n"
        "def done():\n    print('clean exit', flush=True); sys.exit(0)\n"
        f"signal.signal(signal.SIGTERM, {on_term})\n"
        "print('up', flush=True)\ntime.sleep(120)\n"
    )
    log = tmp_path / f"{name}.log"
    _, record = processes.start(name, [sys.executable, "-c", script], log, cwd=tmp_path)
    deadline = time.monotonic() + 10
    while "up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    return record


def test_each_process_gets_its_own_grace_period_when_its_record_has_one(tmp_path: Path) -> None:
    """A driver's record carries its pod's terminationGracePeriodSeconds: one that needs
    a while to clean up gets it though the stopper's own timeout is shorter, and one that
    ignores SIGTERM is killed at its own grace, not the stopper's."""
    patient = dataclasses.replace(_slow_to_stop(tmp_path, "patient", exits_after_s=1.0), grace_s=20.0)
    stubborn = dataclasses.replace(_slow_to_stop(tmp_path, "stubborn", exits_after_s=None), grace_s=0.5)
    assert sorted(processes.stop([patient, stubborn], timeout_s=0.2)) == ["patient", "stubborn"]
    assert "clean exit" in (tmp_path / "patient.log").read_text(), "killed before its grace period was over"
    assert not stubborn.alive()
    started = _slow_to_stop(tmp_path, "stubborn-again", exits_after_s=None)
    began = time.monotonic()
    processes.stop([dataclasses.replace(started, grace_s=0.5)], timeout_s=60)
    assert time.monotonic() - began < 30, "waited for the stopper's timeout, not the record's grace"
