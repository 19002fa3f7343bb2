import dataclasses
import sys
from pathlib import Path

from testbed.controlplane import processes


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
