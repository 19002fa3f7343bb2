"""Keeps a local control plane's components running, as a kubelet keeps its static pods.

`testbed up` starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler and,
once all are healthy, this supervisor (``python -m testbed.controlplane.supervisor DIR``).
Twice a second it looks at each component; one that has exited is started again with
the same command after a back-off (1 s, doubling up to 30 s, and back to 1 s once it has
run for a minute). It alone writes ``DIR/supervision.json``: every component's current
process, its restarts, its last exit and when. ``ClusterState.load`` takes the current
processes from there, so `down`, `status` and a running scenario see what runs now.
It also deletes the namespaces scenario runs had to leave behind while the API server
was gone (``leftovers.py``), once every component runs again. SIGTERM ends the supervisor
and leaves the components to whoever stops the cluster. If the cluster directory itself
goes (a CI job that cleans its workspace without `testbed down`, an `rm -rf`), nothing
could reach the cluster's processes any more: the supervisor stops them all, Ray's head
and the synthetic nodes' command-line drivers too, and ends. It does the same, and
removes the cluster directory, when the process the cluster lives for (its owner: a
pytest session) is gone without taking it down: killed outright, it could not.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.controlplane import leftovers, processes
from testbed.controlplane.processes import ProcessRecord
from testbed.files import write_atomically

SUPERVISION_FILE = "supervision.json"
POLL_S = 0.5
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 60.0
"""A component that ran this long before exiting starts its back-off from the beginning."""
CLEANUP_EVERY_S = 5.0
"""How often namespaces that runs left behind (see leftovers.py) are looked at."""


def _identity(directory: Path) -> tuple[int, int] | None:
    """Which directory is at this path (device and inode); None if none is."""
    try:
        found = directory.stat()
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def backoff_s(failures_in_a_row: int) -> float:
    """The wait before the next start, after this many exits in a row (1, 2, 4 ... 30 s)."""
    return float(min(BACKOFF_FIRST_S * 2 ** max(failures_in_a_row - 1, 0), BACKOFF_MAX_S))


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exited (status unknown)"  # `testbed up` started it: not the supervisor's child
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


@dataclass
class Component:
    """What the supervisor knows of one component; the JSON form is what others read."""

    process: ProcessRecord
    restarts: int = 0
    failures_in_a_row: int = 0
    started_at: float = field(default_factory=time.time)
    last_exit: str = ""
    last_exit_at: float | None = None
    next_start_at: float | None = None
    """Set while it is down and waiting out its back-off."""

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["process"] = self.process.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Component:
        fields = dict(data)
        fields["process"] = ProcessRecord.from_json(data["process"])  # type: ignore[arg-type]
        return cls(**fields)  # type: ignore[arg-type]


def read(root: Path) -> dict[str, Component]:
    """The supervisor's view, or {} if none ran (or its file cannot be read)."""
    try:
        data = json.loads((root / SUPERVISION_FILE).read_text())
        return {name: Component.from_json(entry) for name, entry in data.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


class Supervisor:
    def __init__(
        self,
        root: Path,
        records: list[ProcessRecord],
        others: list[ProcessRecord] | None = None,
        outside: list[Path] | None = None,
        owner: ProcessRecord | None = None,
        beyond: Callable[[], list[str]] | None = None,
    ):
        """``records``: the components to keep running, in the order to stop them;
        ``others``: the cluster's other processes (Ray's head), stopped if the cluster
        directory goes; ``outside``: its directories elsewhere (the synthetic nodes',
        which hold their hosts' credentials, and Ray's temp dir), removed then too;
        ``owner``: the process whose end ends the cluster; ``beyond``: stops what the
        cluster started since (a Ray head recorded later, the nodes' drivers), saying what."""
        self.root = root
        self.components = {r.name: Component(r, started_at=processes.started_at(r)) for r in records}
        self.others = list(others or [])
        self.outside = list(outside or [])
        self.owner = owner
        self.beyond = beyond
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self._directory = _identity(root)

    def cluster_gone(self) -> bool:
        """The cluster directory was removed, or another took its path: no `testbed down`
        can find this cluster's processes any more."""
        return _identity(self.root) != self._directory

    def owner_gone(self) -> bool:
        return self.owner is not None and not self.owner.alive()

    def stop_everything(self) -> list[str]:
        """Ray's head first (and what ``beyond`` knows of), then the components in their
        stop order."""
        stopped = processes.stop(self.others, timeout_s=2.0)
        if self.beyond is not None:
            stopped += self.beyond()
        for component in self.components.values():  # clients first, etcd last
            stopped += processes.stop([component.process])
        for child in self.children.values():
            child.poll()
        return stopped

    def end(self, why: str, remove: list[Path]) -> None:
        """Stop all of the cluster and remove its directories: nobody else can now."""
        self.stopping = True
        stopped = self.stop_everything()
        print(f"{why}: stopped {', '.join(stopped) or 'nothing'}", flush=True)
        for directory in remove:
            shutil.rmtree(directory, ignore_errors=True)
            print(f"removed {directory}", flush=True)

    def step(self, now: float) -> list[str]:
        """Notice exits, start what is due; returns what it started."""
        started = []
        for name, component in self.components.items():
            if component.next_start_at is None:
                if component.process.alive():
                    continue
                child = self.children.pop(name, None)
                component.last_exit = describe_exit(child.wait() if child is not None else None)
                component.last_exit_at = now
                ran_s = now - component.started_at
                component.failures_in_a_row = 1 if ran_s >= STABLE_S else component.failures_in_a_row + 1
                component.next_start_at = now + backoff_s(component.failures_in_a_row)
                print(
                    f"{name} {component.last_exit} after {ran_s:.0f} s; restarting in "
                    f"{component.next_start_at - now:.0f} s",
                    flush=True,
                )
            if component.next_start_at is not None and now >= component.next_start_at and not self.stopping:
                # SIGTERM waits until the new process is recorded: none may go unrecorded.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                try:
                    record = component.process
                    child, fresh = processes.start(name, record.command, Path(record.log), cwd=self.root)
                    self.children[name] = child
                    component.process, component.started_at = fresh, now
                    component.restarts += 1
                    component.next_start_at = None
                    self.save()
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                started.append(name)
        return started

    def save(self) -> None:
        document = {name: c.to_json() for name, c in self.components.items()}
        write_atomically(self.root / SUPERVISION_FILE, json.dumps(document, indent=1).encode(), durable=False)

    def run(self) -> None:
        def stop(*_: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.save()
        before = ""
        next_cleanup = 0.0
        while not self.stopping:
            if self.cluster_gone():  # before restarting anything, which would recreate its log directory
                self.end(f"the cluster directory {self.root} is gone", self.outside)
                return
            if self.owner_gone():
                assert self.owner is not None
                why = f"{self.owner.name} (pid {self.owner.pid}), which the cluster was for, is gone"
                self.end(why, [*self.outside, self.root])
                return
            self.step(time.time())
            now = json.dumps({n: c.next_start_at for n, c in self.components.items()})
            if now != before:  # a component went down or came back
                self.save()
                before = now
            if time.monotonic() >= next_cleanup:
                next_cleanup = time.monotonic() + CLEANUP_EVERY_S
                self.clean_up_after_runs()
            time.sleep(POLL_S)

    def clean_up_after_runs(self) -> None:
        """Delete the namespaces runs left behind while the API server was gone."""
        if any(c.next_start_at is not None for c in self.components.values()):
            return  # not all back yet
        for name in leftovers.delete_pending(self.root):
            print(f"deleted namespace {name}, left behind by a run while the API server was gone", flush=True)


def main(argv: list[str] | None = None) -> None:
    from testbed.config import nodes_dir
    from testbed.controlplane.cluster import STOP_ORDER, SUPERVISOR, ClusterState

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m testbed.controlplane.supervisor CLUSTER_DIR")
    root = Path(args[0])
    state = ClusterState.load(root)
    if state is None:
        sys.exit(f"supervisor: no cluster in {root}")
    by_name = {p.name: p for p in state.processes}
    records = [by_name[name] for name in STOP_ORDER if name in by_name]
    others = [p for p in state.processes if p.name not in STOP_ORDER and p.name != SUPERVISOR]
    nodes = nodes_dir(root)  # computed now: the path derives from the directory while it exists
    from testbed.fleet.raycluster import ray_temp_dir  # the entry point's looks beyond the control plane

    outside = [nodes, ray_temp_dir(root).parent]
    known = {(p.pid, p.start_ticks) for p in state.processes}

    def beyond() -> list[str]:
        """Processes recorded after this supervisor started (a test fleet's Ray head), and
        the nodes' command-line drivers, which outlive their NodeHosts."""
        from testbed.fleet.external import stop_recorded_drivers

        now = ClusterState.load(root) if root.is_dir() else None
        later = [
            p
            for p in (now.processes if now is not None else [])
            if p.name not in STOP_ORDER and p.name != SUPERVISOR and (p.pid, p.start_ticks) not in known
        ]
        return processes.stop(later, timeout_s=2.0) + stop_recorded_drivers(nodes)

    print(f"supervising {', '.join(r.name for r in records)}", flush=True)
    Supervisor(root, records, others, outside, state.owner, beyond).run()


if __name__ == "__main__":
    main()
