"""A local Ray head for one testbed cluster, run as a managed process on 127.0.0.1.

`ray start --head --block` stays in the foreground and stops the processes it started
when it gets SIGTERM, so the cluster's Ray is stopped by its PID like every other
component, and no machine-wide `ray stop` is ever needed.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.controlplane import processes
from testbed.controlplane.processes import ProcessRecord
from testbed.errors import TestbedError
from testbed.files import private_dir, write_secret

NAMESPACE_PREFIX = "dra-testbed"


def ray_temp_dir(cluster_root: Path) -> Path:
    """Short, per cluster: Ray puts unix sockets under it (108-byte path limit). Ray makes
    its temp dir 0777, so it lives inside a 0700 directory of ours."""
    digest = hashlib.sha256(str(cluster_root).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"tbray-{digest}" / "r"


RAY_SOCKET_PATH_MAX = 107
"""What Ray checks its unix socket paths against before it starts anything."""
LONGEST_RAY_SOCKET = Path("session_2026-01-01_00-00-00_000000_4194304", "sockets", "plasma_store")
"""The longest socket path Ray makes under its temp dir (a session named after the time
and the largest pid Linux hands out)."""


def check_temp_dir(cluster_root: Path) -> None:
    """Refuse, before anything starts, a temp dir (``TMPDIR``) too long for Ray's sockets:
    the head would exit at its start, after the control plane's."""
    longest = ray_temp_dir(cluster_root) / LONGEST_RAY_SOCKET
    length = len(str(longest).encode())
    if length > RAY_SOCKET_PATH_MAX:
        over = length - RAY_SOCKET_PATH_MAX
        raise TestbedError(
            f"Ray's sockets under the temp dir {tempfile.gettempdir()} would be up to {length} bytes long, "
            f"more than the {RAY_SOCKET_PATH_MAX} a unix socket path holds: {longest}",
            hint=f"set TMPDIR to a directory at least {over} characters shorter (TMPDIR=/tmp, say)",
        )


def namespace(cluster_name: str) -> str:
    return f"{NAMESPACE_PREFIX}-{cluster_name}"


def auth_token_path(cluster_root: Path) -> Path:
    return cluster_root / "ray-auth-token"


def auth_env(cluster_root: Path) -> dict[str, str]:
    """Token authentication with this cluster's own token. Never Ray's per-user default
    (~/.ray/auth_token): whoever else runs Ray on the machine may create or replace it,
    and a head and its clients that disagree about it cannot talk."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(auth_token_path(cluster_root))}


LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""A Ray told it is a one-machine cluster keeps the 127.0.0.1 it is given as its node
address, and its GCS, raylet, agents and workers listen there. Otherwise Ray swaps
127.0.0.1 for the machine's own address, listens on it, and talks to itself through it."""


def _write_token(cluster_root: Path) -> None:
    write_secret(auth_token_path(cluster_root), secrets.token_hex(32).encode())


QUIET_ENV = {
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
    "RAY_prestart_worker_first_driver": "0",
    "RAY_num_workers_soft_limit": "0",
}
"""Ray's node agent samples every Ray process (psutil) every 5 s for a dashboard and
metrics the testbed turns off or never reads: once a minute is enough. Ray also starts a
spare worker process for the first driver and keeps one per CPU waiting: the testbed
runs NodeHost actors only, each in a worker of its own, and an idle worker costs 0.009
core (its task loop wakes 100 times a second), a third of Ray's whole idle cost."""

HEAD_LABEL = "dra-testbed.io/ray-head"
"""A Ray node label of the head the testbed starts: a pool's placement.labels can name it."""


@dataclass
class StartingHead:
    """A Ray head launched and not yet waited for: ``testbed up`` launches it beside the
    control plane, whose start takes as long as Ray's, and waits for both."""

    record: ProcessRecord
    port: int
    log_path: Path
    cluster_root: Path

    def wait(self, timeout_s: float = 60.0) -> str:
        """The head's address once its GCS listens."""
        importlib.import_module("ray")  # a second of imports `connect` needs, done while the head starts
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.record.alive():
                raise TestbedError(
                    "ray exited during start-up",
                    detail=f"last lines of {self.log_path}:\n{processes.log_tail(self.log_path)}",
                )
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return f"127.0.0.1:{self.port}"
            time.sleep(0.05)
        raise TestbedError(f"ray did not start within {timeout_s:.0f} s", detail=processes.log_tail(self.log_path))


def start_head(cluster_root: Path, log_path: Path, num_cpus: int | None = None) -> tuple[ProcessRecord, str]:
    head = launch_head(cluster_root, log_path, num_cpus)
    return head.record, head.wait()


def launch_head(cluster_root: Path, log_path: Path, num_cpus: int | None = None) -> StartingHead:
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray is None:
        raise TestbedError("the `ray` command is not installed", hint="run `make install`")
    (
        port,
        client,
        node_manager,
        object_manager,
        runtime_env,
        agent,
        agent_grpc,
        metrics,
        dashboard,
        autoscaler_metrics,
        dashboard_metrics,
    ) = processes.free_ports(11)
    temp_dir = ray_temp_dir(cluster_root)
    private_dir(temp_dir.parent)
    command = [
        ray,
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=false",
        "--include-log-monitor=false",
        "--no-monitor",  # the autoscaler's: nothing here scales Ray (0.8 CPU-s of every start)
        "--disable-usage-stats",
        f"--ray-client-server-port={client}",
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--dashboard-port={dashboard}",
        f"--labels={HEAD_LABEL}=true",
    ]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    _write_token(cluster_root)
    # Two metrics servers take their ports from the environment only (Ray's defaults are
    # fixed ports, which a second cluster on this machine would find taken).
    ports = {"AUTOSCALER_METRIC_PORT": str(autoscaler_metrics), "DASHBOARD_METRIC_PORT": str(dashboard_metrics)}
    env = {**auth_env(cluster_root), **LOOPBACK_ENV, **ports, **QUIET_ENV}
    _, record = processes.start("ray", command, log_path, cwd=cluster_root, env=env)
    return StartingHead(record, port, log_path, cluster_root)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as exc:
        raise TestbedError(
            f"the Ray cluster at {address} is not reachable ({exc})",
            hint="check ray.address in the fleet file (host:port of the Ray head's GCS), or remove it "
            "to start a local Ray on 127.0.0.1",
        ) from None


def connect(address: str, cluster_name: str, cluster_root: Path | None = None) -> None:
    """``cluster_root``: of a cluster whose Ray head the testbed started (its token is
    there); None for a Ray cluster the user runs, whose own settings then apply."""
    import ray

    if ray.is_initialized():
        joined = ray.get_runtime_context()
        if same_address(joined.gcs_address, address) and joined.namespace == namespace(cluster_name):
            return
        raise TestbedError(
            f"this process is already in the Ray cluster at {joined.gcs_address} (namespace {joined.namespace}); "
            f"it cannot join the one at {address} for cluster {cluster_name!r} too",
            hint="Ray lets a process join one cluster at a time: start the second cluster's fleet from another "
            "process (e.g. `testbed up`)",
        )
    options: dict[str, Any] = {
        "namespace": namespace(cluster_name),
        "logging_level": logging.WARNING,
        "log_to_driver": False,
    }
    if cluster_root is not None and auth_token_path(cluster_root).exists():
        _set_environment({**auth_env(cluster_root), **LOOPBACK_ENV})
        # This process joins the head as a one-machine cluster too (see LOOPBACK_ENV): its
        # own server then listens on 127.0.0.1. Ray read the setting when it was imported.
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
        _wait_for_a_raylet(address)
        with _own_handlers_kept():
            ray.init(address=address, **options)
        quiet_misleading_warnings()
        return
    # A Ray cluster the user runs: a refusal shows only as a line a second on stderr from
    # Ray's C++ core, then a bare ConnectionError; turn it into one line with the way out.
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            with _own_handlers_kept():
                ray.init(address=address, **options)
            quiet_misleading_warnings()
        except ConnectionError as exc:
            captured.seek(0)
            said = captured.read().decode(errors="replace")
            if "InvalidAuthToken" in said or "Authentication token" in said:
                raise TestbedError(
                    f"the Ray cluster at {address} refused this client: it needs its authentication token",
                    hint="set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to that cluster's token, as for `ray` itself",
                ) from None
            last = said.strip().splitlines()[-1:] or [str(exc)]
            raise TestbedError(f"could not join the Ray cluster at {address}: {last[0][:300]}") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextmanager
def _own_handlers_kept() -> Iterator[None]:
    """Ray's core, joining, puts a crash handler on SIGTERM that dumps a stack and aborts
    the process: a `testbed up` ended by `timeout` or a cancelled CI job would leave its
    control plane and Ray running. And Ray's ``sys.excepthook`` reports an uncaught
    exception to the cluster's GCS first, which blocks for ever when the cluster is gone
    (`testbed down` while `testbed up` started the fleet: the process hung at half a
    core). The handlers this process had (the CLI's, which stops what the command
    started; Python's) are put back."""
    own = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    hook = sys.excepthook
    try:
        yield
    finally:
        if callable(own):
            signal.signal(signal.SIGTERM, own)
        sys.excepthook = hook


MISLEADING_WARNINGS = ("worker processes have been started on node",)
"""What Ray's raylet tells every process in the cluster and is wrong about for a fleet:
past four times as many workers as CPUs it warns of "a large number of actors, or tasks
blocked in ray.get()", where each NodeHost is one long-lived actor in a worker of its
own (20 of them at 5,000 nodes). The raylet's log keeps the line."""


def quiet_misleading_warnings() -> None:
    """Keep ``MISLEADING_WARNINGS`` off this process's terminal; Ray's other messages pass."""
    from ray._private import worker

    printer = worker.print_to_stdstream
    if getattr(printer, "quiets_misleading_warnings", False):
        return

    def filtered(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = [line for line in data.get("lines", []) if not any(m in line for m in MISLEADING_WARNINGS)]
        if lines:
            printer({**data, "lines": lines}, ignore_prefix)

    filtered.quiets_misleading_warnings = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = filtered


def _wait_for_a_raylet(address: str, timeout_s: float = 20.0) -> None:
    """Until the head's raylet has joined its GCS (at once for a Ray that runs already).
    Ray's `init` waits for that too, but looks once a second: a second of every `up`,
    where the raylet joins a few seconds after the GCS listens. Past the timeout, `init`
    goes on waiting, and says what is wrong in its own words."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[attr-defined]

    client = GcsClient(address=address)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if client.get_all_node_info(timeout=5, state_filter=GcsNodeInfo.GcsNodeState.ALIVE):
                return
        except Exception:  # not answering yet: init says so in its words if that lasts
            pass
        time.sleep(0.05)


_replaced_environment: dict[str, str | None] = {}
"""What ``connect`` changed in this process's environment, with the values before."""


def _set_environment(values: dict[str, str]) -> None:
    for key, value in values.items():
        _replaced_environment.setdefault(key, os.environ.get(key))
        os.environ[key] = value
    _reread_ray_config()


def _reread_ray_config() -> None:
    """Ray read RAY_AUTH_MODE when it was imported, and keeps the first token it loaded
    for the life of the process: both are read again (the settings first, as Ray's own
    tests do), so a second cluster's head gets its own token, not the first one's."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def same_address(a: str, b: str) -> bool:
    """Two host:port addresses of one GCS (a host name against the address Ray reports)."""
    if a == b:
        return True
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    if port_a != port_b:
        return False
    try:
        return socket.gethostbyname(host_a) == socket.gethostbyname(host_b)
    except OSError:
        return False


def connected_to(address: str) -> bool:
    """Whether this process is in the Ray cluster at ``address``."""
    if "ray" not in sys.modules:
        return False
    import ray

    return bool(ray.is_initialized()) and same_address(ray.get_runtime_context().gcs_address, address)


def disconnect() -> None:
    """Leave the Ray cluster, and take back the token settings ``connect`` made: a Ray this
    process joins later (another cluster's, in a benchmark or a test session) would
    otherwise be offered the old cluster's token, or pointed at its file, which is gone."""
    import ray

    ray.shutdown()
    if not _replaced_environment:
        return
    for key, value in _replaced_environment.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _replaced_environment.clear()
    _reread_ray_config()


def stop_head(record: ProcessRecord, cluster_root: Path) -> None:
    processes.stop([record], timeout_s=15.0)
    remove_temp_dir(cluster_root)


def remove_temp_dir(cluster_root: Path) -> None:
    shutil.rmtree(ray_temp_dir(cluster_root).parent, ignore_errors=True)
