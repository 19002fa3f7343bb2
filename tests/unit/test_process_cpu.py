"""What the processes beside a NodeHost cost is counted: a run with a command-line driver
shows the driver's CPU beside the control plane's, its children's included, and keeps
what a process used after it ended."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field

from testbed.controlplane import processes
from testbed.fleet.processcpu import ProcessCpu
from testbed.report.breakdown import NODE_PROCESSES_CPU

BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"
"""A process that uses this much CPU, then ends."""


@dataclass(eq=False)  # watched in a WeakSet, as drivers and nodes are: by identity
class Owner:
    running: list[tuple[str, int]] = field(default_factory=list)

    def cpu_processes(self) -> list[tuple[str, int]]:
        return self.running


def counted(collector: ProcessCpu) -> dict[str, float]:
    [family] = collector.collect()
    assert family.name == NODE_PROCESSES_CPU.removesuffix("_total"), "the name the reports read"
    return {sample.labels["process"]: sample.value for sample in family.samples}


def test_a_driver_and_the_child_it_waits_for_are_counted_and_kept_once_they_end() -> None:
    # The driver's command: a shell that runs a child burning 0.3 s of CPU and waits on stdin.
    script = f"{sys.executable} -c '{BURN.format(seconds=0.3)}'; read line"
    driver = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE)
    owner, collector = Owner([("driver a.example.com", driver.pid)]), ProcessCpu()
    collector.watch(owner)
    try:
        deadline = time.monotonic() + 30
        while counted(collector).get("driver a.example.com", 0.0) < 0.25:  # the child's, once reaped
            assert time.monotonic() < deadline, counted(collector)
            time.sleep(0.05)
        assert processes.tree_cpu_seconds([driver.pid])[driver.pid] >= 0.25
    finally:
        driver.communicate(b"\n", timeout=30)
    seen = counted(collector)["driver a.example.com"]
    owner.running = []  # ended: what it was last read at stays counted
    assert counted(collector) == {"driver a.example.com": seen}


def test_processes_are_summed_by_what_they_are() -> None:
    collector = ProcessCpu()
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        nodes = [
            Owner([("real kubelet", sleepers[0].pid), ("testbed-cri", sleepers[1].pid)]),
            Owner([("real kubelet", sleepers[2].pid), ("gone", 2**22 + 1)]),
        ]
        for node in nodes:
            collector.watch(node)
        assert set(counted(collector)) == {"real kubelet", "testbed-cri"}, "a process that is gone is left out"
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
