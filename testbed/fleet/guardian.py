"""A guard over a test session's fleet on a cluster the testbed did not start.

On the session's own control plane, the cluster's supervisor ends everything with the
session, however the session ends. On a cluster the user brought
(``TESTBED_TEST_KUBECONFIG``: a kind cluster, a `testbed up` one) nothing did: a session
killed outright (a CI job's timeout, the OOM killer) left its Ray head running and its
synthetic Nodes NotReady in that cluster for good. This process starts with such a fleet
and waits on the session's process. Should that go before the fleet's own cleanup ran,
the guardian runs it: it stops the recorded processes (Ray's head, and with it the
NodeHosts) and the nodes' own drivers, deletes the fleet's Nodes from the cluster, and
removes the fleet's directories. It leaves quietly once the fleet's directory is gone
(the cleanup ran) or when stopped. What it cleaned up is appended to ``guardian.log`` in
the testbed's state directory: its own log goes with the fleet's directory."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.config import nodes_dir, state_root
from testbed.controlplane import processes
from testbed.controlplane.processes import ProcessRecord
from testbed.files import write_atomically

GUARD_FILE = "guard.json"
POLL_S = 0.5
RECORD_FILE = "guardian.log"
"""In the state directory: one line per fleet a guardian cleaned up after its session."""


@dataclass
class Guard:
    """What the guardian needs to clean up after ``owner``."""

    owner: ProcessRecord
    kubeconfig: Path
    pools: list[str]
    processes: list[ProcessRecord] = field(default_factory=list)

    def save(self, root: Path) -> None:
        document = {
            "owner": self.owner.to_json(),
            "kubeconfig": str(self.kubeconfig),
            "pools": self.pools,
            "processes": [p.to_json() for p in self.processes],
        }
        write_atomically(root / GUARD_FILE, json.dumps(document, indent=1).encode(), durable=False)

    @classmethod
    def load(cls, root: Path) -> Guard:
        document = json.loads((root / GUARD_FILE).read_text())
        return cls(
            owner=ProcessRecord.from_json(document["owner"]),
            kubeconfig=Path(document["kubeconfig"]),
            pools=[str(p) for p in document["pools"]],
            processes=[ProcessRecord.from_json(p) for p in document["processes"]],
        )


def start(root: Path, guard: Guard) -> ProcessRecord:
    """Start the guardian of the fleet under ``root`` (written there first)."""
    guard.save(root)
    command = [sys.executable, "-m", "testbed.fleet.guardian", str(root)]
    _, record = processes.start("guardian", command, root / "logs" / "guardian.log", cwd=root)
    return record


def record_process(root: Path, record: ProcessRecord) -> None:
    """One more process to stop should the owner go (the Ray head, once it runs)."""
    guard = Guard.load(root)
    guard.processes.insert(0, record)
    guard.save(root)


def clean_up(root: Path, guard: Guard) -> list[str]:
    """What the fleet's own cleanup would have done; returns what it did. The Ray head
    goes first: a NodeHost still running would register its Nodes again."""
    from testbed.fleet.external import stop_recorded_drivers
    from testbed.fleet.orphans import delete_pool_nodes
    from testbed.fleet.raycluster import remove_temp_dir

    nodes = nodes_dir(root)
    done = processes.stop(guard.processes, timeout_s=15.0)
    remove_temp_dir(root)
    done += stop_recorded_drivers(nodes)
    try:
        deleted = delete_pool_nodes(guard.kubeconfig, guard.pools)
        done.append(f"deleted Nodes {', '.join(deleted) or '(none left)'} from the cluster")
    except Exception as exc:  # the cluster is gone or unreachable: nothing to leave there then
        done.append(f"could not delete the fleet's Nodes ({exc})")
    shutil.rmtree(nodes, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return done


def watch(root: Path) -> str:
    """Wait for the owner to go or the fleet to be cleaned up; says which, and what it did."""
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _: stopping.append(signum))
    while not stopping:
        try:
            guard = Guard.load(root)
        except (OSError, ValueError, KeyError, TypeError):
            return f"the fleet under {root} is cleaned up"
        if not guard.owner.alive():
            why = f"{guard.owner.name} (pid {guard.owner.pid}), which the fleet was for, is gone"
            said = f"{why}: {'; '.join(clean_up(root, guard))}"
            _record(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} fleet {root}: {said}")
            return said
        time.sleep(POLL_S)
    return "stopped"


def record_path() -> Path:
    return state_root() / RECORD_FILE


def _record(line: str) -> None:
    with contextlib.suppress(OSError):  # a record lost must not stop the cleanup's report
        path = record_path()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with path.open("a") as record:
            record.write(line + "\n")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m testbed.fleet.guardian FLEET_DIR")
    print(watch(Path(args[0])), flush=True)


if __name__ == "__main__":
    main()
