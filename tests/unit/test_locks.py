"""One process at a time: the next waits, is told who holds the lock, and a killed holder
leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from testbed import locks

HOLDER = """
import sys
from pathlib import Path
from testbed import locks
with locks.held(Path(sys.argv[1]), holder="the other one"):
    print("holding", flush=True)
    sys.stdin.readline()
"""


def _holding(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
    return proc


def test_the_second_waits_for_the_first_and_is_told_who_it_is(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    other = _holding(lock)
    told: list[str] = []

    def waiting(who: str) -> None:
        told.append(who)
        assert other.stdin is not None
        other.stdin.write("done\n")  # the holder lets go only now that we wait
        other.stdin.flush()

    def stuck(*_: object) -> None:
        raise TimeoutError("still waiting after 30 s: the holder was never told to let go")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(30)
    try:
        with locks.held(lock, holder="me", waiting=waiting):
            assert other.wait(timeout=30) == 0, "held only once the other let go"
            assert locks.holder(lock) == os.getpid()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if other.poll() is None:
            other.kill()
    assert told == [f"the other one (pid {other.pid})"]


def test_a_killed_holder_leaves_no_lock(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    other = _holding(lock)
    assert locks.holder(lock) == other.pid
    assert not locks.wait_free(lock, 0.2)
    other.send_signal(signal.SIGKILL)
    other.wait(timeout=30)
    assert locks.holder(lock) is None and locks.wait_free(lock, 0)
    told: list[str] = []
    with locks.held(lock, waiting=told.append):
        pass
    assert told == []
