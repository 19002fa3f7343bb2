"""SIGTERM (what `timeout` and a cancelled CI job send) must end a testbed command or
benchmark through its cleanup, as Ctrl-C does, or the control plane and Ray it started
are left running."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

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
