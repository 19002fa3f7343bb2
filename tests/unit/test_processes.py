import dataclasses
import socket
import sys
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
