"""SIGTERM (what `timeout` and a cancelled CI job send) must end a testbed command or
benchmark through its cleanup, as Ctrl-C does, or the control plane and Ray it started
are left running."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import sys
from pathlib import Path
from testbed.errors import run_interruptibly

def main() -> int:
    try:
        print("started", flush=True)
        sys.stdin.read()  # blocks until the test is done with us
        return 0
    finally:
        Path(sys.argv[1]).write_text("cleaned up")

raise SystemExit(run_interruptibly(main))
"""


def test_sigterm_runs_the_cleanup_of_the_interrupted_script_and_ends_it_in_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "cleanup"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(marker)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert marker.read_text() == "cleaned up"
    assert child.returncode == 130
    assert err == "interrupted\n"


COROUTINE_CHILD = """
import asyncio, os, signal, sys, threading
from testbed.errors import run_coroutine, run_interruptibly

class SignalledInADestructor:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside __del__
        sum(range(1000))

async def work():
    try:
        SignalledInADestructor()
        for _ in range(50):
            await asyncio.sleep(0.1)
        print("ran to the end", flush=True)
    finally:
        await asyncio.sleep(0)  # cleanup that awaits still runs
        print("cleaned up", flush=True)

async def swallowing():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        pass  # a careless coroutine
    print("swallowed", flush=True)

def on_a_worker_thread():
    started = threading.Event()

    async def background():
        started.set()
        await asyncio.sleep(5)

    threading.Thread(target=run_coroutine, args=(background(),), daemon=True).start()
    started.wait()
    os.kill(os.getpid(), signal.SIGTERM)  # reaches the main thread, in plain code
    for _ in range(100):
        sum(range(1000))
    print("went on", flush=True)

if "{coroutine}" == "on_a_worker_thread":
    raise SystemExit(run_interruptibly(lambda: on_a_worker_thread() or 0))
raise SystemExit(run_interruptibly(lambda: run_coroutine({coroutine}()) or 0))
"""


def _run_child(coroutine: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", COROUTINE_CHILD.format(coroutine=coroutine)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sigterm_landing_in_a_destructor_still_ends_the_coroutine() -> None:
    """A KeyboardInterrupt raised in a destructor is printed and dropped by Python; a
    `testbed sanity` signalled while a gRPC channel was freed ran its whole suite."""
    child = _run_child("work")
    assert child.returncode == 130, child
    assert child.stdout == "cleaned up\n"
    assert child.stderr == "interrupted\n"


def test_a_coroutine_that_swallows_the_cancellation_is_still_reported_interrupted() -> None:
    child = _run_child("swallowing")
    assert child.returncode == 130, child
    assert child.stdout == "swallowed\n"
    assert child.stderr == "interrupted\n"


def test_a_coroutine_on_a_worker_thread_leaves_the_signal_to_the_main_thread() -> None:
    """Signals reach the main thread only: there, the interrupt is at once."""
    child = _run_child("on_a_worker_thread")
    assert child.returncode == 130, child
    assert child.stdout == ""
    assert child.stderr == "interrupted\n"


PLAIN_CODE_CHILD = """
import os, signal, sys, time
from testbed.errors import run_interruptibly

class SignalledInADestructor:
    def __del__(self):
        os.kill(os.getpid(), signal.{signal_name})  # the interrupt is raised here, inside __del__
        sum(range(1000))

def main():
    try:
        SignalledInADestructor()
        for _ in range(100):  # a fleet waiting on Ray, say
            time.sleep(0.05)
        print("ran to the end", flush=True)
    finally:
        print("cleaned up", flush=True)
    return 0

raise SystemExit(run_interruptibly(main))
"""


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_an_interrupt_landing_in_a_destructor_outside_a_coroutine_is_not_lost(signal_name: str) -> None:
    """Starting and scaling a fleet wait on Ray in plain code, where Ray's object
    references are freed all the time: Python prints an interrupt raised in a destructor
    and goes on, and the command ran to its end."""
    child = subprocess.run(
        [sys.executable, "-c", PLAIN_CODE_CHILD.format(signal_name=signal_name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 130, child
    assert child.stdout == "cleaned up\n"
    assert child.stderr == "interrupted\n"


HUNG_UP_CHILD = """
import sys, time
from pathlib import Path
from testbed.errors import run_interruptibly

def main() -> int:
    try:
        print("started", flush=True)
        while True:  # what a run prints on: after the hang-up it must not fail the cleanup
            print("progress", flush=True)
            time.sleep(0.05)
    finally:
        print("cleaning up", flush=True)
        Path(sys.argv[1]).write_text("cleaned up")

raise SystemExit(run_interruptibly(main))
"""


def test_a_closed_terminal_ends_a_command_through_its_cleanup(tmp_path: Path) -> None:
    """SIGHUP, its terminal closed (an ssh session dropped): the cleanup runs, and what it
    prints goes nowhere rather than failing it."""
    import os
    import pty
    import time

    marker = tmp_path / "cleanup"
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a session of its own, the pty its controlling terminal
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a shell: not ignored (this test may run under nohup)
        os.execv(sys.executable, [sys.executable, "-c", HUNG_UP_CHILD, str(marker)])
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while b"started" not in seen and time.monotonic() < deadline:
            seen += os.read(terminal, 1024)
        assert b"started" in seen
        os.close(terminal)  # the terminal goes: the kernel sends its session leader SIGHUP
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert marker.read_text() == "cleaned up"
    assert os.waitstatus_to_exitcode(status) == 130
