"""Control-plane figures: cold build (recorded or re-run), warm `up` to healthy, `down`.

    python benchmarks/bench_controlplane.py [--runs N] [--cold] [--json FILE]

Medians over N runs, since these machines are noisy; targets from the foundation
issue are printed next to the figures, and the verdict is informational.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from testbed import config
from testbed.config import ControlPlaneConfig
from testbed.controlplane import binaries, cluster
from testbed.errors import run_interruptibly
from testbed.progress import ConsoleProgress, SilentProgress

UP_TARGET_S = 15.0
DOWN_TARGET_S = 5.0


def cold_build_seconds(rerun: bool) -> tuple[float | None, str]:
    if rerun:
        # Empty Go build and module caches too: the figure a brand-new machine sees.
        with tempfile.TemporaryDirectory(prefix="bench-cold-") as scratch:
            saved = dict(os.environ)
            os.environ.update(
                TESTBED_CACHE_DIR=f"{scratch}/cache",
                GOCACHE=f"{scratch}/gocache",
                GOMODCACHE=f"{scratch}/gomod",
            )
            os.environ.pop("TESTBED_KUBE_BIN_DIR", None)
            try:
                started = time.monotonic()
                binaries.ensure_binaries(ConsoleProgress(), allow_download=False)
                seconds = time.monotonic() - started
            finally:
                os.environ.clear()
                os.environ.update(saved)
                subprocess.run(["chmod", "-R", "u+w", scratch], check=False)  # Go makes modules read-only
        return seconds, "measured now, with empty Go build and module caches"
    info = config.binaries_cache_dir() / binaries.BUILD_INFO_FILE
    if info.exists():
        data = json.loads(info.read_text())
        return float(data["seconds"]), f"recorded when the cache was built on {data['date']}"
    return None, "not recorded (binaries came from a download or TESTBED_KUBE_BIN_DIR)"


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="re-run a cold build in a temporary cache")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    build_s, build_note = cold_build_seconds(args.cold)
    found = binaries.ensure_binaries(ConsoleProgress())
    ups: list[float] = []
    downs: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-state-") as state_dir:
        for run in range(args.runs):
            cfg = ControlPlaneConfig(name=f"bench{run}", state_dir=Path(state_dir) / str(run))
            started = time.monotonic()
            cluster.up(cfg, SilentProgress(), binaries=found)
            ups.append(time.monotonic() - started)
            started = time.monotonic()
            cluster.down(cfg)
            downs.append(time.monotonic() - started)
            print(f"run {run + 1}/{args.runs}: up {ups[-1]:.2f}s, down {downs[-1]:.2f}s", flush=True)

    figures = {
        "cold_build_s": build_s,
        "cold_build_note": build_note,
        "warm_up_s": summarize(ups),
        "down_s": summarize(downs),
        "runs": args.runs,
        "cpus": os.cpu_count(),
    }
    up_median, down_median = figures["warm_up_s"]["median"], figures["down_s"]["median"]  # type: ignore[index]
    print()
    print("control plane benchmark")
    build_text = f"{build_s / 60:.1f} min" if build_s else "n/a"
    print(f"  cold build of binaries : {build_text} ({build_note})")
    print(
        f"  warm up to all healthy : median {up_median:.2f}s over {args.runs} runs "
        f"(min {min(ups):.2f}, max {max(ups):.2f}); target <= {UP_TARGET_S:.0f}s: "
        f"{'met' if up_median <= UP_TARGET_S else 'MISSED'}"
    )
    print(
        f"  down                   : median {down_median:.2f}s "
        f"(min {min(downs):.2f}, max {max(downs):.2f}); target <= {DOWN_TARGET_S:.0f}s: "
        f"{'met' if down_median <= DOWN_TARGET_S else 'MISSED'}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_interruptibly(main))
