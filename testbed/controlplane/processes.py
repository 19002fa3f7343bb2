"""Start, find and stop the processes a cluster owns, by PID and nothing else.

Each process is recorded with its kernel start time, so a PID reused by an unrelated
process after a reboot or a crash is never signalled.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.errors import TestbedError


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    log: str
    command: list[str]
    grace_s: float | None = None
    """Its time to exit after SIGTERM, when it has one of its own (a driver's pod's
    terminationGracePeriodSeconds); else the stopper's."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcessRecord:
        grace = data.get("grace_s")
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),  # type: ignore[call-overload]
            start_ticks=int(data["start_ticks"]),  # type: ignore[call-overload]
            log=str(data["log"]),
            command=[str(part) for part in data["command"]],  # type: ignore[attr-defined]
            grace_s=None if grace is None else float(grace),  # type: ignore[arg-type]
        )

    def alive(self) -> bool:
        return process_start_ticks(self.pid) == self.start_ticks


def this_process(name: str) -> ProcessRecord:
    """This very process, recorded as others are (its pid and start, to tell it from a
    later process given the same pid)."""
    pid = os.getpid()
    return ProcessRecord(name, pid, process_start_ticks(pid) or 0, "", sys.argv)


def started_at(record: ProcessRecord) -> float:
    """Wall-clock start of a recorded process (boot time + its start ticks)."""
    boot = next(
        (float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")),
        0.0,
    )
    return boot + record.start_ticks / os.sysconf("SC_CLK_TCK")


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat; None if there is no such (living) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # a zombie has exited; only its parent's wait() is missing
        return None
    return int(fields[19])


def descendants(root: int) -> set[int]:
    """``root``, the processes it started, theirs, and so on."""
    children = {parent: [pid for pid, _ in kids] for parent, kids in _process_table().items()}
    return _tree(root, children)


def tree_cpu_seconds(roots: list[int]) -> dict[int, float]:
    """CPU-seconds each root and the processes under it have used, from one pass over
    /proc: every living process's own time and that of the children it reaped (so a
    child that ended counts once, in its parent's). Roots that are gone are left out."""
    table = _process_table()
    children = {parent: [pid for pid, _ in kids] for parent, kids in table.items()}
    used = {pid: seconds for kids in table.values() for pid, seconds in kids}
    return {root: sum(used.get(pid, 0.0) for pid in _tree(root, children)) for root in roots if root in used}


def _process_table() -> dict[int, list[tuple[int, float]]]:
    """Each parent PID's children with their CPU-seconds (utime, stime, cutime, cstime)."""
    table: dict[int, list[tuple[int, float]]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parent, seconds = int(fields[1]), sum(int(f) for f in fields[11:15]) / tick
            except (OSError, IndexError, ValueError):
                continue
            table.setdefault(parent, []).append((int(entry.name), seconds))
    return table


def using(paths: Collection[Path]) -> list[tuple[int, str]]:
    """This user's living processes (this one and its ancestors apart) with one of
    ``paths``, or a path under it, among their arguments: PID and command line. How a
    cluster whose record of its processes is lost can still tell whether anything runs."""
    if not paths:
        return []
    alternatives = "|".join(re.escape(str(path)) for path in paths)
    pattern = re.compile(rf"(?:^|[=:,\s])(?:{alternatives})(?:$|[/,:\s])")
    ours, uid, found = _ancestors(os.getpid()), os.getuid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            arguments = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(pattern.search(argument) for argument in arguments):
            found.append((int(entry.name), " ".join([Path(arguments[0]).name, *arguments[1:]]).strip()))
    return sorted(found)


def _ancestors(pid: int) -> set[int]:
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def _tree(root: int, children: dict[int, list[int]]) -> set[int]:
    found, pending = set(), [root]
    while pending:
        pid = pending.pop()
        found.add(pid)
        pending += children.get(pid, [])
    return found


def start(
    name: str, command: list[str], log_path: Path, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start detached: its own session, so Ctrl-C in the terminal does not reach it and
    it outlives the `testbed up` that started it. ``env``: added to this process's."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **env} if env else None,
            start_new_session=True,
        )
    ticks = process_start_ticks(proc.pid)
    return proc, ProcessRecord(name, proc.pid, ticks or -1, str(log_path), command)


def stop(records: list[ProcessRecord], timeout_s: float = 10.0) -> list[str]:
    """SIGTERM each live process, wait, SIGKILL whatever is left once its time is over
    (its record's ``grace_s``, else ``timeout_s``). Returns names stopped."""
    live = [r for r in records if r.alive()]
    for record in live:
        _signal(record.pid, signal.SIGTERM)
    began = time.monotonic()
    deadlines = {id(r): began + (timeout_s if r.grace_s is None else r.grace_s) for r in live}
    waiting = list(live)
    while waiting:
        _reap(live)
        now = time.monotonic()
        for record in [r for r in waiting if not r.alive() or now >= deadlines[id(r)]]:
            waiting.remove(record)
            if record.alive():
                _signal(record.pid, signal.SIGKILL)
        if waiting:
            time.sleep(0.05)
    kill_deadline = time.monotonic() + 5.0
    while time.monotonic() < kill_deadline and any(r.alive() for r in live):
        _reap(live)
        time.sleep(0.05)
    _stop_leftover_group_members(live)
    still = [r.name for r in live if r.alive()]
    if still:
        raise TestbedError(
            f"could not stop {', '.join(still)}",
            hint="look up the PIDs with `testbed status` and stop them by hand",
        )
    return [r.name for r in live]


def group_members(pgid: int) -> list[int]:
    """Living processes in process group ``pgid`` (each started process leads its own)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _stop_leftover_group_members(records: list[ProcessRecord]) -> None:
    """Children that outlived their leader (Ray's agents do) are still ours: same group."""
    for record in records:
        leftovers = group_members(record.pid)
        for pid in leftovers:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.05)
            leftovers = group_members(record.pid)
        for pid in leftovers:
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(records: list[ProcessRecord]) -> None:
    """Collect exited children of this process, so they do not linger as zombies."""
    for record in records:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(record.pid, os.WNOHANG)


def log_tail(path: Path | str, lines: int = 25) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16384))
            text = handle.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class RestartBackoff:
    """How long to wait before starting again a process that exited: ``first_s``, doubling
    to ``most_s`` while it keeps dying within ``reset_after_s`` of its start, ``first_s``
    again once it ran longer (the shape of a kubelet's back-off for a crashing container)."""

    first_s: float = 1.0
    most_s: float = 30.0
    reset_after_s: float = 60.0
    _next_s: float = 0.0

    def after_exit(self, ran_for_s: float) -> float:
        """The wait before this restart."""
        if not self._next_s or ran_for_s > self.reset_after_s:
            self._next_s = self.first_s
        wait, self._next_s = self._next_s, min(self._next_s * 2, self.most_s)
        return wait


def exit_status(returncode: int) -> int:
    """An exit as a shell and container runtimes say it: 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def free_port() -> int:
    return free_ports(1)[0]


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_CHOSEN_PORT = 20000  # above Ray's worker ports (10002-19999 by default)


HANDED_OUT_FOR_S = 600.0
"""How long a port this process chose stays its own: no later choice gives it again."""
_handed_out: dict[int, float] = {}


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now, for servers about to start.

    Chosen below the kernel's ephemeral range where it leaves room: every bind to port 0
    and every outgoing connection on this machine takes its port from that range, so a
    port chosen there can be taken (Ray starts beside the control plane, and connects a
    lot) before its server binds it, which then fails with "address already in use".
    Nor is a port given twice by this process within ``HANDED_OUT_FOR_S``: the Ray head's
    ports are chosen while the scheduler's and controller-manager's, chosen before,
    are not bound yet (they start once the API server is up)."""
    now = time.monotonic()
    for port, at in list(_handed_out.items()):
        if now - at > HANDED_OUT_FOR_S:
            del _handed_out[port]
    below = [p for p in _below_ephemeral_range() if p not in _handed_out]
    if len(below) < 100 * count:
        chosen = _bound_ports(count, [0] * count)
    else:
        chosen = _bound_ports(count, random.sample(below, len(below)))
    _handed_out.update(dict.fromkeys(chosen, now))
    return chosen


def _below_ephemeral_range() -> range:
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST_CHOSEN_PORT, low)


def _bound_ports(count: int, candidates: list[int]) -> list[int]:
    """The first ``count`` of ``candidates`` that can be bound (0: any the kernel gives).
    All stay bound until every port is chosen, so none is chosen twice."""
    sockets: list[socket.socket] = []
    try:
        for candidate in candidates:
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE:
                    continue
                raise
            sockets.append(sock)
        if len(sockets) < count:
            raise TestbedError(
                f"found only {len(sockets)} of {count} free TCP ports on 127.0.0.1",
                hint="stop clusters or other servers this machine no longer needs (`testbed list`)",
            )
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def accepting_connections(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0
