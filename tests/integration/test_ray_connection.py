"""Joining and leaving the Ray head of a testbed cluster from a Python process (as the
CLI, a benchmark or a test session does), against a real head."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LEAVE_AND_REPORT = """
import json, os, sys
from pathlib import Path
from testbed.fleet import raycluster

root = Path(sys.argv[1])
watched = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"  # the user's own setting
before = {k: os.environ.get(k) for k in watched}
record, address = raycluster.start_head(root, root / "ray.log", num_cpus=1)
try:
    raycluster.connect(address, "leave", root)
    during = {k: os.environ.get(k) for k in watched}
finally:
    raycluster.disconnect()
    raycluster.stop_head(record, root)
after = {k: os.environ.get(k) for k in watched}

# Another cluster's head, joined from the same process: its own token must be offered.
import ray
second = root / "second"
second.mkdir()
record, address = raycluster.start_head(second, second / "ray.log", num_cpus=1)
try:
    raycluster.connect(address, "second", second)
    joined = ray.cluster_resources().get("CPU") == 1.0
    raycluster.connect(address, "second", second)  # again: already there
    from testbed.errors import TestbedError
    try:
        raycluster.connect("127.0.0.1:1", "third", root / "third")
        refused = ""
    except TestbedError as exc:
        refused = exc.message
    joined = joined and ray.cluster_resources().get("CPU") == 1.0  # still in the second
finally:
    raycluster.disconnect()
    raycluster.stop_head(record, second)
print(json.dumps([before, during, after, joined, refused, address]))
"""


def test_a_process_leaves_one_testbed_ray_and_joins_another(short_tmp_path: Path) -> None:
    """The token settings are taken back on leaving, and the second head gets its own
    token: Ray kept the first one it loaded, and the second head refused it
    (InvalidAuthToken), e.g. for two fleets in one test session. Joining a third while
    in the second is refused in one line."""
    # Its own process: a test session may be connected to its fleet's Ray already.
    done = subprocess.run(
        [sys.executable, "-c", LEAVE_AND_REPORT, str(short_tmp_path)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before, during, after, joined, refused, second = json.loads(done.stdout.strip().splitlines()[-1])
    assert during["RAY_AUTH_MODE"] == "token"
    assert during["RAY_AUTH_TOKEN_PATH"] == str(short_tmp_path / "ray-auth-token")
    assert during["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert after == before
    assert joined, "the second cluster's Ray answered"
    # A third cluster's Ray while in the second: refused, naming both (Ray would have kept
    # this process in the second, and the third's NodeHosts would have started there).
    assert second in refused and "127.0.0.1:1" in refused, refused
