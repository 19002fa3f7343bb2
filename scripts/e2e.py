"""`make e2e`: the user's path end to end, through the `testbed` command itself.

Brings up a control plane with synthetic nodes (NODES, default 4, of PROFILE, default
h100x8) plus one real-kubelet node (kubelet v1.37, where the machine allows it: root),
proves it allocates and that a pod with a GPU claim runs through the driver and the fake
kubelet, and through the driver and the real kubelet, runs the `smoke` scenario and a
short `cl2-dra` (each prints its report directory), shows its status, and always tears
it down (KEEP=1 keeps it running).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.realnode.node import unsupported_reason

NAME = os.environ.get("CLUSTER_NAME", "e2e")


def testbed(*args: str, capture: bool = False) -> str:
    print(f"+ testbed {' '.join(args)}", file=sys.stderr, flush=True)
    result = subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args, "--name", NAME],
        stdout=subprocess.PIPE if capture else None,
        text=True,
        check=True,
    )
    return result.stdout or ""


def main() -> int:
    started = time.monotonic()
    keep = os.environ.get("KEEP") == "1"
    ours = False  # a cluster of that name that was there before is the user's: never taken down
    try:
        nodes, profile = os.environ.get("NODES", "4"), os.environ.get("PROFILE", "h100x8")
        real = not unsupported_reason()
        if not real:
            print(f"e2e: no real-kubelet node: {unsupported_reason()}", file=sys.stderr)
        fleet = Path(tempfile.mkdtemp(prefix="e2e-")) / "fleet.yaml"
        pools = [f"  - {{name: node, count: {nodes}, profile: {profile}}}"]
        if real:
            pools.append("  - {name: real, count: 1, profile: tiny, kubelet: real}")
        fleet.write_text("pools:\n" + "\n".join(pools) + "\n")
        try:
            kubeconfig = testbed("up", "--fleet", str(fleet), capture=True).strip().splitlines()[-1]
        finally:
            shutil.rmtree(fleet.parent, ignore_errors=True)
        ours = True
        testbed("check", "--node", "node-000")
        if real:
            testbed("check", "--node", "real-000")
        testbed("run", "smoke")
        testbed("scale", "node", str(max(0, int(nodes) - 1)))  # drain one node, then bring it back
        testbed("scale", "node", nodes)
        testbed("run", "cl2-dra", "--set", "phases.1.runSeconds=1")
        testbed("status")
    except subprocess.CalledProcessError as exc:
        print(f"e2e FAILED: `{' '.join(exc.cmd[2:])}` exited {exc.returncode}", file=sys.stderr)
        keep = False
        return 1
    finally:
        if ours and not keep:
            testbed("down")
    print(f"e2e passed in {time.monotonic() - started:.1f}s", file=sys.stderr)
    if keep:
        print(f"cluster kept (KEEP=1): export KUBECONFIG={kubeconfig}")
        print(f"`testbed down --name {NAME}` ends it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
