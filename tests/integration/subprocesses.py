"""Commands a test runs as a user would (`testbed up`, `sanity`, `scale`), and signals."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def killed_if_left(procs: subprocess.Popen[str] | list[subprocess.Popen[str]]) -> Iterator[None]:
    """However the block ends, nothing of ``procs`` (a list may grow inside the block)
    outlives it: a test that fails must not leave a command running, holding a cluster."""
    try:
        yield
    finally:
        for proc in procs if isinstance(procs, list) else [procs]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def interrupt(proc: subprocess.Popen[str], sig: signal.Signals, timeout_s: float = 60) -> tuple[str, str]:
    """Ctrl-C or SIGTERM (`timeout`, a cancelled CI job), then everything it printed."""
    proc.send_signal(sig)
    return proc.communicate(timeout=timeout_s)
