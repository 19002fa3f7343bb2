"""Real-kubelet pools: how they are asked for, refused, and configured to stay off the host."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from fake_devices.hardware import NodeHardware
from testbed import cli
from testbed.drivers import load_profile
from testbed.drivers.main import _Applied, _apply_faults
from testbed.errors import TestbedError
from testbed.fleet import spec
from testbed.fleet.external import ExternalDriverSpec
from testbed.fleet.membership import NodeRecipe
from testbed.fleet.nodehost import NodeHost
from testbed.metrics_server import MetricsServer
from testbed.realnode import kubelet_api
from testbed.realnode import node as realnode


def test_pools_default_to_the_fake_kubelet_and_take_real() -> None:
    fleet = spec.parse("pools: [{name: a, count: 2}, {name: r, count: 3, profile: tiny, kubelet: real}]", "f.yaml")
    assert [p.kubelet for p in fleet.pools] == ["fake", "real"]
    assert fleet.real_kubelets == 3


def test_an_unknown_kubelet_kind_names_the_field() -> None:
    with pytest.raises(spec.FleetFileError) as info:
        spec.parse("pools: [{name: a, count: 1, kubelet: kwok}]", "f.yaml")
    assert "pools[0].kubelet" in str(info.value)


def test_without_root_a_real_pool_is_refused_in_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools: [{name: ref, count: 1, profile: tiny, kubelet: real}]\n")
    state = tmp_path / "state"
    result = CliRunner().invoke(cli.main, ["up", "--name", "refused", "--state-dir", str(state), "--fleet", str(fleet)])
    assert result.exit_code != 0
    assert "pool ref: real-kubelet nodes need root" in result.output and "Traceback" not in result.output
    assert not state.exists(), "nothing was started"


def test_the_kubelet_listens_on_loopback_and_makes_no_host_cgroups(tmp_path: Path) -> None:
    config = realnode.kubelet_config(tmp_path, [])
    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1"
    assert config["readOnlyPort"] == 0 and config["authentication"]["anonymous"]["enabled"] is False
    assert config["cgroupsPerQOS"] is False and config["enforceNodeAllocatable"] == []
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'cri.sock'}"


def test_the_kubelets_api_is_guarded_as_kubeadm_guards_it(tmp_path: Path) -> None:
    """Certificates from the cluster CA or tokens the API server vouches for, each request
    authorized by the API server: so the admin can read /metrics and nobody anonymous can."""
    config = realnode.kubelet_config(tmp_path, [], client_ca=tmp_path / "ca.crt")
    assert config["authentication"] == {
        "anonymous": {"enabled": False},
        "webhook": {"enabled": True},
        "x509": {"clientCAFile": str(tmp_path / "ca.crt")},
    }
    assert config["authorization"] == {"mode": "Webhook"}


def test_a_fake_kubelet_process_serves_its_metrics_on_a_private_socket(short_tmp_path: Path) -> None:
    """What `testbed metrics` and the real-vs-fake comparison read off a fake kubelet run
    as a process; a node with no kubelet of its own is refused in one line."""
    import testbed.kubelet.metrics  # noqa: F401 - registers the kubelet's families

    socket_path = short_tmp_path / kubelet_api.FAKE_METRICS_SOCKET

    async def scenario() -> tuple[str, int]:
        server = MetricsServer(path=socket_path)
        await server.start()
        try:
            mode = socket_path.stat().st_mode & 0o777
            return await kubelet_api.kubelet_metrics(short_tmp_path, "n", short_tmp_path / "unused", None), mode
        finally:
            await server.stop()

    text, mode = asyncio.run(scenario())
    assert "# TYPE dra_operations_duration_seconds histogram" in text and mode == 0o600
    bare = short_tmp_path / "synthetic"
    bare.mkdir()
    with pytest.raises(TestbedError, match="node n: no kubelet running"):
        asyncio.run(kubelet_api.kubelet_metrics(bare, "n", short_tmp_path / "unused", None))


KUBELET_LOG = """\
I1129 08:54:18.453869   32708 reconciler.go:161] "OperationExecutor.RegisterPlugin started" plugin={"SocketPath":"x"}
I1129 08:54:18.457367   32708 dra_plugin_manager.go:140] "Connection changed" logger="DRA registration handler" \
driverName="gpu.example.com" endpoint="/p/gpu.example.com/dra-1.sock" connected=true
I1129 08:54:18.457400   32708 dra_plugin_manager.go:140] "Connection changed" logger="DRA registration handler" \
driverName="nic.example.com" endpoint="/p/nic.example.com/dra.sock" connected=false
"""
ROLLED_OUT = """\
I1129 08:55:00.000001   32708 dra_plugin_manager.go:140] "Connection changed" logger="DRA registration handler" \
driverName="gpu.example.com" endpoint="/p/gpu.example.com/dra-2.sock" connected=true
I1129 08:55:00.500000   32708 dra_plugin_manager.go:140] "Connection changed" logger="DRA registration handler" \
driverName="gpu.example.com" endpoint="/p/gpu.example.com/dra-1.sock" connected=false
"""


def test_which_drivers_the_real_kubelet_is_connected_to_is_read_from_its_log(tmp_path: Path) -> None:
    """What `testbed up` and a rollout wait for on a real-kubelet node with a driver of the
    user's (it tells nobody else): per instance, so a rollout's old one going does not
    hide the new one."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    node = realnode.ProcessNode(realnode.NodeSpec("n"), "tiny", [], tmp_path, kubeconfig, kubelet="fake")
    (tmp_path / "logs").mkdir()
    assert node.connected_drivers() == set() and node.kubelet_log_size() == 0
    node.log("kubelet").write_text(KUBELET_LOG)
    assert node.connected_drivers() == {"gpu.example.com"}  # the NIC driver's connection went
    since = node.kubelet_log_size()
    assert node.connected_drivers(since) == set()
    with open(node.log("kubelet"), "a") as log:
        log.write(ROLLED_OUT)
    assert node.connected_drivers(since) == {"gpu.example.com"}, "the new instance, though the old one went"
    assert node.connected_drivers() == {"gpu.example.com"}


def test_real_nodes_from_the_command_line_are_a_pool_beside_the_fake_ones_with_the_same_drivers() -> None:
    driver = {"name": "gpu.example.com", "command": ["/bin/drv"]}
    fleet = spec.single_pool(3, "tiny", 10, drivers=[driver], real=1)
    fake, real = fleet.pools
    assert (fake.name, fake.kubelet, real.name, real.kubelet) == ("node", "fake", "real", "real")
    assert real.node_names() == ["real-000"] and real.external_drivers == fake.external_drivers
    [only] = spec.single_pool(0, "tiny", 10, real=2).pools
    assert (only.name, only.count) == ("real", 2)


def test_real_nodes_from_the_command_line_need_root_and_no_fleet_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    state = tmp_path / "state"
    where = ["--name", "refused", "--state-dir", str(state)]
    result = CliRunner().invoke(cli.main, ["up", *where, "--nodes", "2", "--real-nodes", "1"])
    assert result.exit_code != 0 and "pool real: real-kubelet nodes need root" in result.output
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools: [{name: a, count: 1}]\n")
    result = CliRunner().invoke(cli.main, ["up", *where, "--fleet", str(fleet), "--real-nodes", "1"])
    assert result.exit_code != 0 and "give --fleet or --nodes/--real-nodes, not both" in result.output
    assert not state.exists(), "nothing was started"


def _real_node_on_a_host(tmp_path: Path, built_in: list[str], external: bool) -> NodeHost:
    """A NodeHost holding one real-kubelet node (not started: its faults only)."""
    tmp_path.mkdir()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    drivers = (ExternalDriverSpec("gpu.example.com", ("/bin/drv",)),) if external else ()
    recipe = NodeRecipe("r-000", "tiny", kubelet="real", external=drivers)
    host = NodeHost(str(kubeconfig), str(tmp_path), [recipe])
    root = tmp_path / "r-000"
    (root / "hardware").mkdir(parents=True)
    node = realnode.ProcessNode(realnode.NodeSpec("r-000"), "tiny", built_in, root, kubeconfig, kubelet="fake")
    host.process_nodes["r-000"] = node  # the kubelet kind matters not to faults
    host.process_hardware["r-000"] = NodeHardware("r-000", load_profile("tiny"))
    return host


def test_faults_reach_a_real_kubelet_nodes_drivers_as_they_follow_them(tmp_path: Path) -> None:
    """`testbed fault` on a real-kubelet node: its built-in testbed-driver follows a faults
    file, a command-line driver $HARDWARE_DIR; the driver's own hardware, following the
    file, ends up as the host's model says, and failed prepares are asked for once."""
    host = _real_node_on_a_host(tmp_path / "a", ["gpu.dra-testbed.io"], external=False)
    faults_file = tmp_path / "a" / "r-000" / "faults.json"
    driver_side = NodeHardware("r-000", load_profile("tiny"))
    applied = _Applied({"unhealthy": {}, "busy": {}})

    def follow() -> dict[str, object]:
        nonlocal applied
        document = json.loads(faults_file.read_text())
        applied = _apply_faults(document, driver_side, applied)
        return document

    asyncio.run(host.set_health("r-000", "gpu-1", healthy=False, message="XID 79"))
    asyncio.run(host.inject("r-000", latency_s=0.25))
    faults = follow()
    assert faults["unhealthy"] == {"gpu-1": "XID 79"} and faults["latencyMs"] == 250
    assert faults["fatal"] == [] and not any(h.fatal for h in driver_side.health())
    asyncio.run(host.set_health("r-000", "gpu-1", healthy=False, message="XID 79", fatal=True))
    assert follow()["fatal"] == ["gpu-1"], "a GPU named alone, not its partitions"
    partitions = {d.name for d in driver_side.devices() if d.parent == "gpu-1"}
    assert partitions and {h.device for h in driver_side.health() if h.fatal} == {"gpu-1", *partitions}
    assert "failNextPrepares" not in faults, "nothing asked of the prepare count"
    asyncio.run(host.inject("r-000", fail_next_prepares=2, message="ECC error"))
    follow()
    assert driver_side.faults.fail_next_prepares == 2 and driver_side.faults.fail_message == "ECC error"
    driver_side.faults.fail_next_prepares = 1  # the driver failed one prepare meanwhile
    asyncio.run(host.lose_device("r-000", "gpu-0"))
    faults = follow()
    assert faults["lost"] == ["gpu-0"] and "failNextPrepares" not in faults
    assert driver_side.faults.fail_next_prepares == 1, "a later change does not ask for them again"
    assert "gpu-0" not in {d.name for d in driver_side.devices()}

    def sick(hardware: NodeHardware) -> dict[str, str]:
        return {h.device: h.message for h in hardware.health() if h.message}

    assert sick(driver_side) == sick(host.process_hardware["r-000"]) and "gpu-1" in sick(driver_side)
    assert driver_side.faults.latency_s == 0.25

    host = _real_node_on_a_host(tmp_path / "b", [], external=True)
    asyncio.run(host.set_health("r-000", "gpu-1", healthy=False, message="XID 79"))
    asyncio.run(host.inject("r-000", fail_next_prepares=2))
    inventory = json.loads((tmp_path / "b" / "r-000" / "hardware" / "inventory.json").read_text())
    health = {d["name"]: (d["health"], d["fatal"]) for d in inventory["devices"]}
    assert health["gpu-1"] == ("UNHEALTHY", False) and health["gpu-0"] == ("HEALTHY", False)
    asyncio.run(host.set_health("r-000", "gpu-1", healthy=False, message="XID 79", fatal=True))
    inventory = json.loads((tmp_path / "b" / "r-000" / "hardware" / "inventory.json").read_text())
    assert {d["name"]: d["fatal"] for d in inventory["devices"]}["gpu-1"] is True
    assert inventory["faults"]["failNextPrepares"] == 2


def test_what_a_real_kubelet_holds_prepared_is_read_from_its_own_checkpoint(tmp_path: Path) -> None:
    """A drain waits for the kubelet's unprepares, not for the driver's CDI specs: a driver
    that forgot a claim (its state in memory, restarted) leaves its spec behind, and a
    node drained by the specs waited for 300 s and failed."""
    path = tmp_path / realnode.KUBELET_CHECKPOINT
    assert realnode.kubelet_checkpoint_claims(path) == [], "none written yet: nothing prepared"
    claim = {  # as kubelet v1.37 wrote it, one pod's claim prepared by the e2e test driver
        "ClaimUID": "d2b48fc0-9ddf-4383-9bdb-c3697ba1532b",
        "ClaimName": "inline-real-000-resource-ml27g",
        "Namespace": "default",
        "PodUIDs": {"03c9e711-471f-4566-b66a-b73dd4e5fa34": {}},
        "DriverState": {"test-driver.cdi.k8s.io": {"Devices": [{"PoolName": "real-000", "DeviceName": "device-00"}]}},
    }
    kind = {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1"}
    path.write_text(json.dumps({"Data": json.dumps({**kind, "ClaimInfoStateList": [claim]}), "Checksum": 1}))
    assert realnode.kubelet_checkpoint_claims(path) == ["default/inline-real-000-resource-ml27g"]
    path.write_text(json.dumps({"Data": json.dumps({**kind, "ClaimInfoStateList": []}), "Checksum": 2}))
    assert realnode.kubelet_checkpoint_claims(path) == []
