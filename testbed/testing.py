"""pytest fixtures: one real local control plane per test session, a fleet of synthetic
nodes (running your driver if you say so), and clients for them.

Use from any project with ``pytest_plugins = ["testbed.testing"]``. Set
``TESTBED_TEST_KUBECONFIG`` to run the same tests against a cluster you already have
(a kind cluster, a `testbed up` one) instead of starting one: ``fleet``, ``kube_api``
and ``kubeconfig_path`` then use it. Pods, claims and waits: ``testbed.workloads``;
the conformance checks: ``testbed.sanity.run``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s

from testbed.config import KUBELET_SYNC_FREQUENCY_S, ControlPlaneConfig, nodes_dir
from testbed.controlplane import cluster, processes
from testbed.controlplane.binaries import Binaries, ensure_binaries
from testbed.environment import install_device_classes
from testbed.fleet import guardian, raycluster
from testbed.fleet.fleet import Fleet
from testbed.fleet.spec import FleetFile, single_pool
from testbed.kube import api_client
from testbed.progress import PrintProgress

T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.1) -> T:
    """Poll until ``condition`` returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A short temporary directory: unix socket paths must stay within 105 bytes (gRPC's limit)."""
    path = Path(tempfile.mkdtemp(prefix="tb-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_binaries() -> Binaries:
    """The control-plane binaries; built or downloaded on first use, then cached."""
    return ensure_binaries(PrintProgress())


@pytest.fixture(scope="session")
def control_plane(kube_binaries: Binaries) -> Iterator[cluster.ClusterState]:
    """A running control plane shared by the whole session, stopped at its end: a session
    killed outright (a CI job's timeout) leaves it to its supervisor, which stops it all
    once the session's process is gone."""
    # Short on purpose: synthetic nodes put unix sockets under it (105-byte limit).
    state_dir = Path(tempfile.mkdtemp(prefix="tbc-"))
    config = ControlPlaneConfig(name="pytest", state_dir=state_dir)
    owner = processes.this_process("the pytest session")
    state = cluster.up(config, PrintProgress(), binaries=kube_binaries, owner=owner)
    try:
        yield state
    finally:
        cluster.down(config)
        with contextlib.suppress(OSError):
            state_dir.rmdir()  # emptied by down (one left behind per session before)


def driver_fleet(
    command: list[str],
    driver_name: str,
    env: dict[str, str] | None = None,
    nodes: int = 2,
    profile: str = "tiny",
    built_in: tuple[str, ...] = (),
    prefix: str = "dev",
    sync_frequency_s: float = KUBELET_SYNC_FREQUENCY_S,
    liveness_probe: dict[str, Any] | None = None,
    real_nodes: int = 0,
) -> FleetFile:
    """A fleet whose nodes (dev-000, ...) run your driver (``command``, once per node, as
    a DaemonSet would) next to the ``built_in`` drivers named (gpu, nic). For ``fleet_spec``.
    ``sync_frequency_s``: the kubelets' syncFrequency, how soon a prepare your driver
    failed is tried again (60-90 s by default, as on a real node; 10 makes it 10-15 s).
    ``liveness_probe``: your DaemonSet's livenessProbe (``{"grpc": {}}`` and its timings,
    no port: your driver listens on ``$(LIVENESS_PORT)``, a port per node).
    ``real_nodes``: that many more (real-000, ...) with the real kubelet v1.37 calling your
    driver, the reference (root only: see ``testbed.realnode.node.unsupported_reason``)."""
    driver: dict[str, Any] = {"name": driver_name, "command": command, "env": env or {}}
    if liveness_probe is not None:
        driver["livenessProbe"] = liveness_probe
    drivers: list[Any] = [*built_in, driver]
    return single_pool(
        nodes,
        profile,
        nodes_per_host=max(1, nodes + real_nodes),
        prefix=prefix,
        drivers=drivers,
        sync_frequency_s=sync_frequency_s,
        real=real_nodes,
    )


@pytest.fixture(scope="session")
def fleet_spec() -> FleetFile:
    """What the ``fleet`` fixture starts: two ``tiny`` nodes (tb-000, tb-001) with the
    built-in drivers. Override it in your conftest.py, e.g. to run your driver::

        @pytest.fixture(scope="session")
        def fleet_spec():
            return testbed.testing.driver_fleet(["/path/to/driver"], "gpu.example.com")
    """
    return single_pool(2, "tiny", nodes_per_host=2, prefix="tb")


@pytest.fixture(scope="session")
def fleet(fleet_spec: FleetFile, kubeconfig_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """The ``fleet_spec`` nodes on NodeHost actors in a real local Ray, with the testbed's
    DeviceClasses installed; on the session's control plane, or on the cluster that
    ``TESTBED_TEST_KUBECONFIG`` names (which it leaves as it found it)."""
    external = bool(os.environ.get("TESTBED_TEST_KUBECONFIG"))
    guard = None
    if external:
        root, name = Path(tempfile.mkdtemp(prefix="tbf-")), "pytest-fleet"
        # Nothing else would take the fleet out of that cluster should this session be killed.
        owner = processes.this_process("the pytest session")
        guard = guardian.start(root, guardian.Guard(owner, kubeconfig_path, [p.name for p in fleet_spec.pools]))
    else:
        state: cluster.ClusterState = request.getfixturevalue("control_plane")
        root, name = state.root, state.name
    install_device_classes(kubeconfig_path)
    head = raycluster.launch_head(root, root / "logs" / "ray.log")
    record = head.record
    if external:
        guardian.record_process(root, record)
    else:  # so that the control plane's supervisor stops it too, should the session be killed
        cluster.record_process(root, record)
    running = None
    try:
        raycluster.connect(head.wait(), name, root)
        running = Fleet(fleet_spec, kubeconfig_path, nodes_dir(root))
        running.start(PrintProgress())
        yield running
    finally:
        if running is not None:
            with contextlib.suppress(Exception):
                running.stop(remove_nodes=external)
        raycluster.disconnect()  # before the head goes, or Ray's client ends this process
        raycluster.stop_head(record, root)
        shutil.rmtree(nodes_dir(root), ignore_errors=True)
        if guard is not None:
            processes.stop([guard], timeout_s=5.0)
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def kubeconfig_path(request: pytest.FixtureRequest) -> Path:
    external = os.environ.get("TESTBED_TEST_KUBECONFIG")
    if external:
        return Path(external)
    state: cluster.ClusterState = request.getfixturevalue("control_plane")
    return state.kubeconfig


@pytest.fixture(scope="session")
def kube_api(kubeconfig_path: Path) -> Iterator[k8s.ApiClient]:
    api = api_client(kubeconfig_path)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]
