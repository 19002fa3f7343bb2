"""`testbed sanity` against the built-in drivers (every check passes) and against a
plugin that gets things wrong (the checks say what)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc
from kubernetes import client as k8s

from testbed.config import ControlPlaneConfig, nodes_dir, runtime_root
from testbed.controlplane import cluster
from testbed.controlplane.binaries import Binaries, ensure_bench_binaries
from testbed.controlplane.cluster import ClusterState
from testbed.controlplane.processes import descendants, process_start_ticks
from testbed.drivers import KINDS, drivers_for, load_profile
from testbed.fleet.fleet import Fleet
from testbed.fleet.spec import FleetFile
from testbed.kube import api_client
from testbed.kubeapi import KubeClient
from testbed.sanity import checks, leftovers
from testbed.sanity.checks import Result, Status, Suite
from testbed.sanity.harness import Harness, RunningNode
from testbed.testing import wait_for
from testbed.workloads import GPU, unique
from tests.integration.subprocesses import interrupt, killed_if_left
from tests.integration.upstream_drivers import TEST_DRIVER, e2e_driver_command

pytestmark = pytest.mark.controlplane

DRIVER = [sys.executable, "-m", "testbed.drivers.main"]
HELPER = "gpu.helper.dra-testbed.io"
"""testbed-helperdriver's name here (it registers and publishes with --gpus)."""


def _sanity(
    control_plane: ClusterState,
    command: list[str],
    env: dict[str, str],
    name: str = "",
    running: RunningNode | None = None,
    only: list[str] | None = None,
    liveness_port: int | None = None,
) -> list[Result]:
    async def go() -> list[Result]:
        admin = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        harness = Harness(admin, control_plane.kubeconfig, command, env, name, running)
        liveness = None if liveness_port is None else ("127.0.0.1", liveness_port)
        try:
            await harness.setup()
            return await Suite(harness, only=only, liveness=liveness).run()
        finally:
            await harness.teardown()
            await admin.close()

    return asyncio.run(go())


@pytest.mark.parametrize("driver", list(KINDS))
def test_every_check_passes_for_the_built_in_drivers(control_plane: ClusterState, fleet: Fleet, driver: str) -> None:
    del fleet  # for its DeviceClasses and access policy
    [profile] = [p for p in ("shared-nic", "fpga4") if drivers_for(load_profile(p)).count(driver)][:1]
    # The liveness port given (as --liveness-port), or left to the suite to hand the
    # driver (as $(LIVENESS_PORT), the way a fleet's nodes have it).
    port = free_port() if driver == GPU else None
    health_port = "$(LIVENESS_PORT)" if port is None else str(port)
    env = {"DRIVERS": driver, "HARDWARE_PROFILE": profile, "HEALTH_PORT": health_port, "METRICS_PORT": "-1"}
    results = _sanity(control_plane, DRIVER, env, driver, liveness_port=port)
    assert len(results) == 17
    # The NIC's ports are shared on this profile; the other drivers' devices are not.
    unshared = {} if driver == "nic.dra-testbed.io" else {"shares of one device": Status.SKIP}
    assert {r.name: r.status for r in results if r.status is not Status.PASS} == unshared, [
        (r.name, r.detail) for r in results if r.status is not Status.PASS
    ]


def test_claims_on_devices_with_binding_conditions_are_bound_and_freed_between_checks(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    """fabric-gpu's GPUs wait for a fabric to attach them: with nothing to meet their
    binding conditions, the scheduler held each check's devices past its pod's deletion
    and the next check's claim was not allocated within a minute."""
    del fleet  # for its DeviceClasses and access policy
    env = {"DRIVERS": "gpu.dra-testbed.io", "HARDWARE_PROFILE": "fabric-gpu", "HEALTH_PORT": "-1", "METRICS_PORT": "-1"}
    chosen = checks.select(["prepare an allocated", "firstAvailable", "per-claim", "claims asked"])
    results = _sanity(control_plane, DRIVER, env, "gpu.dra-testbed.io", only=chosen)
    assert {r.name: r.detail for r in results if r.status is not Status.PASS} == {}
    assert len(results) == 7, [r.name for r in results]


def test_a_driver_on_the_upstream_kubeletplugin_helper_passes(control_plane: ClusterState, fleet: Fleet) -> None:
    """The suite grew up beside the testbed's own driver. A driver on the code driver
    developers build on (k8s.io/dynamic-resource-allocation's helper: its registrar,
    rolling-update sockets, ResourceSlice controller and claim reads) failed three checks
    for failing a whole NodePrepareResources call over a claim it could not read, which
    the API allows and a kubelet treats as it treats a per-claim error."""
    del fleet  # for its access policy
    helper = str(ensure_bench_binaries().path("testbed-helperdriver"))
    results = {r.name: r for r in _sanity(control_plane, [helper, "--driver", HELPER, "--gpus", "2"], {}, HELPER)}
    assert results.pop("health stream").status is Status.SKIP, "it serves no health stream"
    assert results.pop("liveness probe").status is Status.SKIP, "no liveness port was given"
    assert results.pop("shares of one device").status is Status.SKIP, "its devices are not shared"
    assert {name: r.detail for name, r in results.items() if r.status is not Status.PASS} == {}
    assert "the call failed as a whole, naming the problem (UNKNOWN: " in results["per-claim errors"].detail
    assert "2 devices" in results["resource slices within API limits"].detail


def test_the_kubernetes_projects_own_dra_test_driver_passes(control_plane: ClusterState, fleet: Fleet) -> None:
    """A driver neither the testbed nor the suite grew up with: the one Kubernetes' own
    DRA e2e tests run (k8s.io/kubernetes/test/e2e/dra/test-driver, unmodified). What it
    does within the API but short of its advice is a WARN, not a FAIL: its health stream
    names no device (a kubelet shows them Unknown) and its sockets carry no pod UID."""
    del fleet  # for its access policy
    results = {r.name: r for r in _sanity(control_plane, e2e_driver_command(), {}, TEST_DRIVER)}
    health = results.pop("health stream")
    assert health.status is Status.WARN and "leaves out 4 published devices" in health.detail, health
    assert results.pop("rolling-update socket names").status is Status.WARN
    assert results.pop("liveness probe").status is Status.SKIP, "no liveness port was given"
    assert results.pop("shares of one device").status is Status.SKIP, "its devices are not shared"
    assert {name: r.detail for name, r in results.items() if r.status is not Status.PASS} == {}
    assert "4 devices" in results["resource slices within API limits"].detail


def test_a_running_nodes_driver_is_checked_without_restarting_it(control_plane: ClusterState, fleet: Fleet) -> None:
    node = sorted(fleet.host_of)[0]
    running = RunningNode(node, fleet.nodes_dir / node)
    results = {r.name: r for r in _sanity(control_plane, [], {}, "gpu.dra-testbed.io", running)}
    restarts = {"kill -9 mid-prepare, restart, retry", "API server unreachable"}
    assert {results[name].status for name in restarts} == {Status.SKIP}
    # built-in drivers on synthetic nodes run in-process and never roll: their sockets need no pod UID
    assert results.pop("rolling-update socket names").status in (Status.SKIP, Status.WARN)
    assert results.pop("shares of one device").status is Status.SKIP, "a tiny node's GPUs are not shared"
    assert results.pop("liveness probe").status is Status.SKIP, "a synthetic node's drivers serve none"
    assert {name: r.detail for name, r in results.items() if r.status is not Status.PASS and name not in restarts} == {}
    assert "gpu.dra-testbed.io" in results["registration"].detail
    [ready] = [c for c in fleet_node(control_plane, node)["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "True", "the node kept serving through the suite"
    unnamed = _sanity(control_plane, [], {}, "", running)[0]
    assert unnamed.status is Status.FAIL, unnamed
    assert f"node {node} has drivers gpu.dra-testbed.io, nic.dra-testbed.io" in unnamed.detail


def test_a_running_nodes_command_line_driver_is_reached_through_its_short_socket_paths(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    """A driver run from a command names its sockets after its pod's UID, as a DaemonSet's
    does: reached under the node's own directory, the path overflows 107 bytes."""
    del fleet  # for its DeviceClasses and access policy
    env = {"DRIVERS": "gpu.dra-testbed.io", "HARDWARE_PROFILE": "tiny", "HEALTH_PORT": "-1", "METRICS_PORT": "-1"}
    own_driver = {"name": "gpu.dra-testbed.io", "command": DRIVER, "env": env}
    pool = unique("sx")
    spec = FleetFile.model_validate({"pools": [{"name": pool, "count": 1, "profile": "tiny", "drivers": [own_driver]}]})
    own = Fleet(spec, control_plane.kubeconfig, nodes_dir(control_plane.root))
    try:
        own.start()
        node = f"{pool}-000"
        running = RunningNode(node, own.nodes_dir / node)
        results = {r.name: r for r in _sanity(control_plane, [], {}, "gpu.dra-testbed.io", running)}
    finally:
        own.stop(remove_nodes=True)
    assert len(str(running.root / "kubelet" / "plugins_registry" / f"gpu.dra-testbed.io-{'u' * 36}-reg.sock")) > 107
    assert results["registration"].status is Status.PASS, results["registration"].detail
    assert results["rolling-update socket names"].status is Status.PASS, results["rolling-update socket names"].detail
    assert results["prepare an allocated claim"].status is Status.PASS, results["prepare an allocated claim"].detail


def fleet_node(control_plane: ClusterState, node: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        try:
            return await client.get(f"/api/v1/nodes/{node}")
        finally:
            await client.close()

    return asyncio.run(go())


def test_a_plugin_without_slices_or_pod_named_sockets_is_told_so(
    control_plane: ClusterState, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    del fleet
    monkeypatch.setattr(checks, "SLICES_WAIT_S", 3.0)
    plugin = Path(__file__).with_name("misbehaving_plugin.py")
    command = [
        "sh",
        "-c",
        f'exec "{sys.executable}" "{plugin}" "$KUBELET_REGISTRAR_DIRECTORY_PATH" '
        '"$KUBELET_PLUGINS_DIRECTORY_PATH/wrong.example.com" wrong.example.com',
    ]
    results = {r.name: r for r in _sanity(control_plane, command, {"PYTHONPATH": str(Path.cwd())})}
    assert results["registration"].status is Status.PASS and "v1.DRAPlugin" in results["registration"].detail
    assert results["rolling-update socket names"].status is Status.WARN
    slices = results["resource slices within API limits"]
    assert slices.status is Status.FAIL and "no ResourceSlices" in slices.detail
    assert results["prepare an allocated claim"].status is Status.SKIP
    assert results["API server unreachable"].status is Status.SKIP


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_liveness_endpoint_that_never_sees_a_broken_socket_or_answers_nothing_fails(
    control_plane: ClusterState, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the good practice guards against: a liveness probe that could not restart a
    driver whose socket broke, because its endpoint says SERVING whatever the driver's
    sockets do (here a stand-in health server beside the driver), or answers nothing."""
    del fleet
    monkeypatch.setattr(checks, "LIVENESS_WAIT_S", 5.0)
    env = {"DRIVERS": "gpu.dra-testbed.io", "HARDWARE_PROFILE": "tiny", "HEALTH_PORT": "-1", "METRICS_PORT": "-1"}
    always = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), always)  # "" is SERVING
    port = always.add_insecure_port("127.0.0.1:0")
    always.start()
    try:
        only = checks.select(["liveness"])
        [_, lying] = _sanity(control_plane, DRIVER, env, "gpu.dra-testbed.io", only=only, liveness_port=port)
    finally:
        always.stop(None)
    assert lying.status is Status.FAIL, lying
    assert f"127.0.0.1:{port} still answers SERVING" in lying.detail and "went away" in lying.detail, lying
    silent = free_port()
    [_, nothing] = _sanity(control_plane, DRIVER, env, "gpu.dra-testbed.io", only=only, liveness_port=silent)
    assert nothing.status is Status.FAIL and "answers no status (UNAVAILABLE" in nothing.detail, nothing


def test_a_driver_answering_for_a_claim_it_was_not_asked_about_is_told_so(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    del fleet
    plugin = Path(__file__).with_name("misbehaving_plugin.py")
    command = [
        "sh",
        "-c",
        f'exec "{sys.executable}" "{plugin}" "$KUBELET_REGISTRAR_DIRECTORY_PATH" '
        '"$KUBELET_PLUGINS_DIRECTORY_PATH/extra.example.com" extra.example.com unknown-claim',
    ]
    env = {"PYTHONPATH": str(Path.cwd()), "PUBLISH_SLICE": "1"}
    results = {r.name: r for r in _sanity(control_plane, command, env, only=checks.select(["claims asked"]))}
    assert list(results) == ["registration", "resource slices within API limits", "answers name the claims asked"]
    assert results["resource slices within API limits"].status is Status.PASS, results
    answers = results["answers name the claims asked"]
    assert answers.status is Status.FAIL, answers
    assert "NodePrepareResources answered for claim UID(s) it was not asked about" in answers.detail, answers


def test_a_command_that_cannot_run_is_one_clear_error(control_plane: ClusterState) -> None:
    where = ["--name", control_plane.name, "--state-dir", str(control_plane.root)]
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "sanity", *where, "--", "/no/such/driver"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "cannot run driver" in proc.stderr and "/no/such/driver" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_driver_slower_to_register_than_the_timeout_fails_registration_and_passes_with_more_time(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    """A driver that loads its hardware before it registers (here: 4 s) is failed with a
    hint at --registration-timeout when given less, and registers when given enough,
    saying meanwhile that it waits."""
    del fleet  # for its DeviceClasses and access policy
    where = ["--name", control_plane.name, "--state-dir", str(control_plane.root)]
    env = {"DRIVERS": GPU, "HARDWARE_PROFILE": "tiny", "HEALTH_PORT": "-1", "METRICS_PORT": "-1"}
    slow = ["sh", "-c", f'sleep 4; exec "{sys.executable}" -m testbed.drivers.main']

    def sanity(timeout_s: str) -> subprocess.CompletedProcess[str]:
        options = [f"--env={k}={v}" for k, v in env.items()] + ["--registration-timeout", timeout_s]
        return subprocess.run(
            [sys.executable, "-m", "testbed.cli", "sanity", *where, *options, "--check", "registration", "--", *slow],
            capture_output=True,
            text=True,
            timeout=180,
        )

    short = sanity("1.5")
    assert short.returncode == 1, short.stderr
    assert "FAIL registration: the driver created no registration socket" in short.stderr, short.stderr
    assert "within 1.5 s" in short.stderr and "--registration-timeout SECONDS" in short.stderr, short.stderr
    enough = sanity("60")
    assert enough.returncode == 0, enough.stderr
    assert "PASS registration" in enough.stderr, enough.stderr
    waiting = [
        line for line in enough.stderr.splitlines() if "waiting for the driver to create its registration" in line
    ]
    assert len(waiting) == 1 and waiting[0].endswith("s of 60"), enough.stderr  # said once, 3 s in
    assert "waiting for the driver" not in short.stderr, short.stderr  # not before 3 s


def test_sigterm_mid_suite_takes_away_the_driver_it_started_and_its_node(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """What `timeout` or a cancelled CI job sends: the driver under test, its node and its
    slices must not outlive the suite."""
    del fleet  # for its DeviceClasses and access policy
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    proc = _sanity_cli(control_plane)
    with killed_if_left(proc):
        node, started = _publishing(proc, core, resource)
        _, err = interrupt(proc, signal.SIGTERM)
    assert proc.returncode == 130, err
    assert err.rstrip().endswith("interrupted")
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in started), 10, "the driver to be gone")
    assert node not in _sanity_nodes(core)
    assert not resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items


def _sanity_cli(control_plane: ClusterState, *only: str) -> subprocess.Popen[str]:
    """`testbed sanity` of the built-in driver, as a user runs it; ``only`` these checks."""
    command = [sys.executable, "-m", "testbed.cli", "sanity", "--name", control_plane.name]
    command += [arg for name in only for arg in ("--check", name)]
    return subprocess.Popen(
        [*command, "--state-dir", str(control_plane.root), "--", *DRIVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _sanity_nodes(core: k8s.CoreV1Api) -> list[str]:
    return [n.metadata.name for n in core.list_node(label_selector=leftovers.RUN_LABEL).items]


def _publishing(proc: subprocess.Popen[str], core: k8s.CoreV1Api, resource: k8s.ResourceV1Api) -> tuple[str, set[int]]:
    """Once the run's driver publishes for its node: the node, and the driver's PIDs."""
    try:
        [node] = wait_for(lambda: _sanity_nodes(core), 120, "the run's node")
        wait_for(lambda: resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items, 60, "its slices")
    except AssertionError as exc:
        proc.kill()
        _, said = proc.communicate(timeout=10)
        raise AssertionError(f"{exc}; testbed sanity said:\n{said[-3000:]}") from None
    driver = descendants(proc.pid) - {proc.pid}
    assert driver, "the driver runs under the suite"
    return node, driver


def test_what_a_killed_run_left_is_taken_away_by_the_next_and_a_live_run_is_left_alone(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """SIGKILL (the OOM killer, a CI runner torn down) runs no teardown: the driver it ran
    goes on publishing for a node nobody serves, holding the metrics port, so every later
    run's driver failed to start. The next run must clear all that, and never what a run
    still under way holds."""
    del fleet  # for its DeviceClasses and access policy
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    proc = _sanity_cli(control_plane)

    async def sweep() -> list[leftovers.DeadRun]:
        admin = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        try:
            return await leftovers.sweep(admin, runtime_root() / "s")
        finally:
            await admin.close()

    with killed_if_left(proc):
        node, driver = _publishing(proc, core, resource)
        assert asyncio.run(sweep()) == [], "a run whose process is alive and renews its Lease"
        assert node in _sanity_nodes(core)
        proc.kill()
        proc.communicate(timeout=10)
    assert all(Path(f"/proc/{pid}").exists() for pid in driver), "SIGKILL'd, the suite left its driver running"
    run_id = node.removeprefix("sanity-")

    after = _sanity_cli(control_plane, "registration")  # its start-up sweeps; one check will do
    _, said = after.communicate(timeout=600)
    assert after.returncode == 0, said
    assert f"took away what sanity run {run_id} left when it was killed (the process that ran it here" in said
    # Stopped: at most a zombie the machine's init has not reaped yet.
    assert not any(process_start_ticks(pid) for pid in driver), "its driver is stopped"
    assert node not in _sanity_nodes(core)
    assert not resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    assert not (runtime_root() / "s" / run_id).exists()
    pods = core.list_namespaced_pod("dra-testbed", field_selector=f"spec.nodeName={node}").items
    assert not [p for p in pods if not p.metadata.deletion_timestamp]
    namespace = core.read_namespace(f"sanity-{run_id}") if _exists(core, f"sanity-{run_id}") else None
    assert namespace is None or namespace.metadata.deletion_timestamp


KILLED_MID_CHECK = """
import asyncio, sys
from pathlib import Path
from testbed.kubeapi import KubeClient
from testbed.sanity.harness import Harness, RunningNode

async def main():
    harness = Harness(KubeClient.from_kubeconfig(Path(sys.argv[1])), Path(sys.argv[1]), [], None,
                      "gpu.dra-testbed.io", RunningNode(sys.argv[2], Path(sys.argv[3])))
    await harness.setup()
    print(harness.run_id, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_a_killed_check_of_a_running_nodes_driver_leaves_nothing_after_the_next(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """Killed while checking a fleet node's driver, a run leaves its namespace and
    DeviceClass; the next run takes them away, and the fleet's node stays."""
    core = k8s.CoreV1Api(kube_api)
    node = sorted(fleet.host_of)[0]
    args = [str(control_plane.kubeconfig), node, str(fleet.nodes_dir / node)]
    killed = subprocess.Popen([sys.executable, "-c", KILLED_MID_CHECK, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout is not None
        run_id = killed.stdout.readline().strip()
        assert run_id and _exists(core, f"sanity-{run_id}")
    finally:
        killed.kill()
        killed.communicate(timeout=10)
    running = RunningNode(node, fleet.nodes_dir / node)
    results = _sanity(control_plane, [], {}, "gpu.dra-testbed.io", running, only=checks.select(["registration"]))
    assert [(r.name, r.status) for r in results] == [("registration", Status.PASS)], results
    left = core.read_namespace(f"sanity-{run_id}") if _exists(core, f"sanity-{run_id}") else None
    assert left is None or left.metadata.deletion_timestamp, "the killed run's namespace is taken away"
    classes = k8s.ResourceV1Api(kube_api).list_device_class().items
    assert f"sanity-{run_id}.dra-testbed.io" not in {c.metadata.name for c in classes}
    assert not (runtime_root() / "s" / run_id).exists()
    assert node in {n.metadata.name for n in core.list_node().items}, "the fleet's node stays"


def _exists(core: k8s.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_a_cluster_taken_down_under_the_suite_ends_it_in_plain_lines(kube_binaries: Binaries) -> None:
    """`testbed down` (a CI job's cleanup) while the suite runs: the checks that need the
    API server are skipped once it is gone, the driver and the run's files here go, and
    what could not be taken out of the cluster is said in a line, not a traceback."""
    config = ControlPlaneConfig(name="sanity-down", state_dir=Path(tempfile.mkdtemp(prefix="tbs-")) / "c")
    state = cluster.up(config, binaries=kube_binaries)
    api = api_client(state.kubeconfig)
    proc = _sanity_cli(state)
    try:
        node, driver = _publishing(proc, k8s.CoreV1Api(api), k8s.ResourceV1Api(api))
        cluster.down(config)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.down(config)
        api.close()  # type: ignore[no-untyped-call]
        shutil.rmtree(config.state_dir.parent, ignore_errors=True)
    said = out + err
    assert proc.returncode == 1, said
    assert "Traceback" not in said, said
    assert "not checked: reaching the API server failed" in said, said
    assert f"could not take node {node}, namespace" in said, said
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in driver), 10, "the driver to be gone")
    assert not (runtime_root() / "s" / node.removeprefix("sanity-")).exists()
