"""A driver rolled out anew runs as a new generation beside (or after) the old one: its own
driver pod, its own process record, remembered across a NodeHost restart, and summed up
in one line for the user."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from testbed.clusterstatus import generations_cell
from testbed.errors import TestbedError
from testbed.fleet.external import (
    ExternalDriver,
    ExternalDriverSpec,
    _records_of,
    log_of_running_instance,
    recorded_generations,
    running_generations,
)
from testbed.fleet.fleet import Fleet, RolloutFailure, _recipe, rollout_stopped, rollout_summary
from testbed.fleet.identity import DriverPod, driver_pods_selector
from testbed.fleet.instances import RolledOut, replace_instance
from testbed.fleet.liveness import LivenessSettings
from testbed.fleet.membership import NodeRecipe
from testbed.fleet.spec import FleetFile
from testbed.keys import DRIVER_NAME_LABEL


def test_each_generation_has_a_driver_pod_of_its_own_on_the_same_node() -> None:
    assert DriverPod("gpu-007").name == "dra-testbed-driver-gpu-007"
    assert DriverPod("gpu-007", generation=2).name == "dra-testbed-driver-gpu-007-2"
    long = DriverPod("n" * 300, generation=12).name
    assert len(long) == 253 and long.endswith("-12")
    first, later = DriverPod("gpu-007").manifest(), DriverPod("gpu-007", generation=2).manifest()
    assert first["metadata"]["labels"] == later["metadata"]["labels"]  # drained alike
    assert later["spec"]["nodeName"] == "gpu-007"
    key, value = driver_pods_selector("gpu-007").split("=")
    assert later["metadata"]["labels"][key] == value


def test_each_command_line_driver_has_a_pod_of_its_own_carrying_its_liveness_probe() -> None:
    """As each driver a cluster runs has a DaemonSet of its own: a node's GPU and NIC
    drivers are two pods (two UIDs, two tokens), neither the built-in drivers' pod."""
    probe = LivenessSettings(period_s=5, failure_threshold=2, grace_s=3).as_probe(51234)
    gpu = DriverPod("n-1", "gpu.example.com", liveness_probe=probe)
    nic, built_in = DriverPod("n-1", "nic.example.com"), DriverPod("n-1")
    assert len({gpu.name, nic.name, built_in.name}) == 3
    assert DriverPod("n-1", "gpu.example.com", 1).name == "gpu.example.com-n-1-1"
    manifest = gpu.manifest()
    assert manifest["metadata"]["labels"][DRIVER_NAME_LABEL] == "gpu.example.com"
    assert DRIVER_NAME_LABEL not in built_in.manifest()["metadata"]["labels"]
    key, value = driver_pods_selector("n-1").split("=")
    assert manifest["metadata"]["labels"][key] == value  # drained with the node's other driver pods
    (container,) = manifest["spec"]["containers"]
    assert container["livenessProbe"] == {
        "grpc": {"port": 51234},
        "initialDelaySeconds": 0,
        "periodSeconds": 5,
        "timeoutSeconds": 1,
        "failureThreshold": 2,
        "terminationGracePeriodSeconds": 3,
    }
    assert "livenessProbe" not in nic.manifest()["spec"]["containers"][0]


def test_process_records_and_logs_are_per_generation_and_found_for_their_driver_only(tmp_path: Path) -> None:
    drivers = [
        ExternalDriver(ExternalDriverSpec("a.example.com", ("x",), generation=g), "n", tmp_path) for g in (0, 1, 12)
    ]
    # two generations run side by side in a surge: their output must not interleave
    assert [d.log_path.name for d in drivers] == ["a.example.com.log", "a.example.com_1.log", "a.example.com_12.log"]
    records = [d.records for d in drivers]
    assert [r.name for r in records] == [
        "driver-a.example.com.process.json",
        "driver-a.example.com_1.process.json",
        "driver-a.example.com_12.process.json",
    ]
    others = ["driver-a.example.com2.process.json", "driver-a.example.co.process.json", "driver-a.example.com_x.json"]
    for path in [*records, *(tmp_path / name for name in others)]:
        path.touch()
    assert sorted(_records_of(tmp_path, "a.example.com")) == sorted(records)


def test_a_rolled_out_generation_survives_a_host_restart() -> None:
    spec = ExternalDriverSpec("a.example.com", ("new-driver",), {"A": "1"}, generation=3)
    recipe = NodeRecipe("n-000", "tiny", external=(spec,))
    again = NodeRecipe.from_json(json.loads(json.dumps(dataclasses.asdict(recipe))))
    assert again.external[0].generation == 3 and again == recipe


def test_the_summary_says_how_long_kubelets_had_no_instance_to_call() -> None:
    rolled = [
        {"node": "n-000", "generation": 1, "seconds": 1.0, "unavailable_s": 0.0},
        {"node": "n-001", "generation": 1, "seconds": 3.0, "unavailable_s": 0.0},
        {"node": "n-002", "generation": 2, "seconds": 2.0, "unavailable_s": 0.9},
    ]
    assert rollout_summary("a.example.com", rolled) == (
        "a.example.com rolled out on 3 nodes (driver pod generation 1-2): per node p50 2.0 s, max 3.0 s; "
        "kubelets without an instance to call: p50 0.00 s, max 0.90 s"
    )
    assert rollout_summary("a.example.com", []) == "a.example.com: no node to roll out on"


def test_a_batch_with_failed_nodes_counts_the_ones_that_rolled_out_and_names_the_rest() -> None:
    failed = [
        RolloutFailure(
            "n-003", "node n-003: driver a.example.com did not register with the kubelet (it exited 3 times)"
        ),
        RolloutFailure("n-004", "not rolled out within 300 s"),
    ]
    error = rollout_stopped("a.example.com", rolled=3, total=10, failed=failed, surge=True, untouched=5)
    assert error.message == (
        "rollout of a.example.com stopped after 3 of 10 nodes: node n-003: driver a.example.com did not "
        "register with the kubelet (it exited 3 times) (and 1 more: n-004)"
    )
    assert "node n-004: not rolled out within 300 s" in error.detail
    assert "old instance serves on" in error.hint and "5 nodes were not touched" in error.hint
    alone = rollout_stopped("a.example.com", 0, 1, failed[1:], surge=False, untouched=0)
    assert alone.message.endswith("nodes: node n-004: not rolled out within 300 s")
    assert "keeps being restarted" in alone.hint and "0 nodes were" in alone.hint
    taken = RolloutFailure("n-000", "node n-000: the old instance ... removed the sockets", hint="roll it out with X")
    own_way_out = rollout_stopped("a.example.com", 0, 2, [taken], surge=True, untouched=1).hint
    assert own_way_out == "roll it out with X; 1 node was not touched", "not 'the old instance serves on'"


def test_a_drivers_log_is_its_running_instances(tmp_path: Path) -> None:
    """`testbed logs NODE DRIVER` after rollouts: the instance running now, not the first,
    nor a newer one whose surge failed."""
    stems = ["a.example.com", "a.example.com_2", "a.example.com_10", "a.example.com2", "b.example.com", "kubelet"]
    assert log_of_running_instance(stems, "a.example.com") == "a.example.com_10"
    assert log_of_running_instance(stems, "a.example.com", running=[2]) == "a.example.com_2"
    assert log_of_running_instance(stems, "a.example.com", running=[11]) == "a.example.com_10", "no log of it yet"
    assert log_of_running_instance(stems, "a.example.com_2") == "a.example.com_2", "one generation, by name"
    assert log_of_running_instance(stems, "b.example.com", running=[0]) == "b.example.com"
    assert log_of_running_instance(stems, "kubelet") == "kubelet"
    assert log_of_running_instance(stems, "c.example.com") is None
    assert log_of_running_instance(stems, "a.example") is None
    for generation in (0, 3):
        ExternalDriver(
            ExternalDriverSpec("a.example.com", ("x",), generation=generation), "n", tmp_path
        ).records.touch()
    assert sorted(running_generations(tmp_path, "a.example.com")) == [0, 3]
    assert running_generations(tmp_path, "b.example.com") == []


def test_status_shows_which_generation_the_nodes_run(tmp_path: Path) -> None:
    """After a rollout that stopped half-way the user must see which nodes still run the old one."""
    for node, generation in [("n-000", 2), ("n-001", 2), ("n-002", 1)]:
        spec = ExternalDriverSpec("a.example.com", ("x",), generation=generation)
        record = ExternalDriver(spec, node, tmp_path / node).records
        record.parent.mkdir(parents=True)
        record.touch()
    (tmp_path / "n-000" / "driver-b.example.com_2.process.json").touch()
    generations = recorded_generations(tmp_path)
    assert generations == {"a.example.com": Counter({2: 2, 1: 1}), "b.example.com": Counter({2: 1})}
    assert generations_cell(generations["a.example.com"]) == "1 (1 node), 2 (2 nodes)"
    assert generations_cell(generations["b.example.com"]) == "2"
    assert generations_cell(Counter()) == "-"


def _kubeconfig(tmp_path: Path) -> Path:
    """Of an API server nobody answers at: these fleets never reach one."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return kubeconfig


def test_rolling_out_a_built_in_driver_says_it_cannot_and_what_can(tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path)
    built_in = FleetFile.model_validate({"pools": [{"name": "n", "count": 1, "profile": "tiny"}]})
    with pytest.raises(TestbedError) as info:
        Fleet(built_in, kubeconfig, tmp_path / "nodes").rollout("gpu.dra-testbed.io")
    assert "built into its NodeHosts" in info.value.message and "testbed-driver" in str(info.value.hint)
    mixed = FleetFile.model_validate(
        {
            "pools": [
                {"name": "n", "count": 1, "profile": "tiny", "drivers": [{"name": "a.example.com", "command": ["x"]}]}
            ]
        }
    )
    with pytest.raises(TestbedError) as info:
        Fleet(mixed, kubeconfig, tmp_path / "nodes").rollout("b.example.com")
    assert info.value.message == "no pool runs a command-line driver 'b.example.com'"
    assert info.value.hint == "the fleet's command-line drivers: a.example.com"


# The SIGTERM handler is in place before the socket is: a test that stops the instance as
# soon as its socket shows would otherwise, on a loaded machine, kill it before it could
# remove the socket, and find it left behind.
SOCKET_SERVER = """
import os, signal, socket, sys
path = sys.argv[1]
def leave(*_):
    try:
        os.unlink(path)  # as drivers remove their sockets on SIGTERM
    except FileNotFoundError:
        pass
    raise SystemExit(0)
signal.signal(signal.SIGTERM, leave)
server = socket.socket(socket.AF_UNIX)
try:
    os.unlink(path)  # as a driver takes over a socket path another left
except FileNotFoundError:
    pass
server.bind(path)
server.listen()
signal.pause()
"""


def _socket_driver(root: Path, socket_name: str, generation: int) -> ExternalDriver:
    registry = root / "kubelet" / "plugins_registry"
    command = (sys.executable, "-c", SOCKET_SERVER, str(registry / socket_name))
    return ExternalDriver(ExternalDriverSpec("gpu.example.com", command, generation=generation), "node-000", root)


@pytest.mark.parametrize("names_by_pod", [True, False])
def test_a_surge_whose_old_instance_removes_the_new_ones_sockets_is_a_failure_not_a_rollout(
    short_tmp_path: Path, names_by_pod: bool
) -> None:
    """Two instances of a driver whose socket names do not carry its pod's UID share the
    paths: the old one, stopping, takes the new one's socket with it and the kubelet is
    left with none, which a surge must say rather than count as rolled out."""

    async def surge() -> RolledOut:
        old = _socket_driver(short_tmp_path, "gpu-0-reg.sock" if names_by_pod else "gpu-reg.sock", 0)
        new = _socket_driver(short_tmp_path, "gpu-1-reg.sock" if names_by_pod else "gpu-reg.sock", 1)
        registry = short_tmp_path / "kubelet" / "plugins_registry"

        async def registered(name: str) -> None:
            async with asyncio.timeout(30):
                while not (registry / name).is_socket():
                    await asyncio.sleep(0.02)

        await old.start({})
        await registered(old.spec.command[-1].rsplit("/", 1)[-1])
        instances = [old]
        made = registry / new.spec.command[-1].rsplit("/", 1)[-1]
        inode = made.stat().st_ino if made.exists() else None

        async def new_registered() -> None:
            async with asyncio.timeout(30):
                while not made.is_socket() or made.stat().st_ino == inode:
                    await asyncio.sleep(0.02)

        try:
            return await replace_instance(instances, new, {}, True, new_registered, time.monotonic())
        finally:
            await new.stop()
            await old.stop()

    if names_by_pod:
        rolled = asyncio.run(surge())
        assert (rolled.generation, rolled.unavailable_s) == (1, 0.0)
        return
    with pytest.raises(
        TestbedError, match=r"removed the sockets the new one had made at the same paths \(gpu-reg.sock\)"
    ) as caught:
        asyncio.run(surge())
    assert "--max-unavailable 1" in (caught.value.hint or "")


def test_a_rollout_sets_the_pools_generation_and_command_before_any_node_rolls(tmp_path: Path) -> None:
    """As a DaemonSet's template changes first: a rollout cut short (its command killed,
    a node failing) leaves nodes added later on the new version, not the old one."""
    kubeconfig = _kubeconfig(tmp_path)
    driver = {"name": "a.example.com", "command": ["v1"]}
    fleet = Fleet(
        FleetFile.model_validate({"pools": [{"name": "n", "count": 0, "profile": "tiny", "drivers": [driver]}]}),
        kubeconfig,
        tmp_path / "nodes",
    )
    kept: list[dict[str, object]] = []
    fleet.rollout("a.example.com", ["v2"], recorded=lambda spec: kept.append(spec.model_dump(by_alias=True)))
    fleet.rollout("a.example.com", recorded=lambda spec: kept.append(spec.model_dump(by_alias=True)))
    drivers = [entry["pools"][0]["drivers"][0] for entry in kept]  # type: ignore[index]
    assert [(d["command"], d["generation"]) for d in drivers] == [(["v2"], 1), (["v2"], 2)]
    [added] = _recipe(fleet.spec, fleet.spec.pools[0], 5).external
    assert (added.command, added.generation) == (("v2",), 2)
    assert FleetFile.model_validate(kept[-1]).pools[0].external_drivers[0].generation == 2, "read back from the state"


def test_without_surge_the_new_instance_is_told_from_what_is_left_once_the_old_one_stopped(
    short_tmp_path: Path,
) -> None:
    """maxUnavailable: what tells the new instance apart (the kubelet's log offset, the
    sockets and plugin objects there are) is taken after the old one stopped, since its
    socket's inode and its plugin object's id() are then free for the new one's to take:
    taken before, the new instance could look like the old one and never be seen."""
    registry = short_tmp_path / "kubelet" / "plugins_registry"
    socket = registry / "gpu-reg.sock"
    seen: list[tuple[bool, bool]] = []

    async def roll() -> RolledOut:
        old, new = _socket_driver(short_tmp_path, "gpu-reg.sock", 0), _socket_driver(short_tmp_path, "gpu-reg.sock", 1)
        await old.start({})
        async with asyncio.timeout(30):
            while not socket.is_socket():
                await asyncio.sleep(0.02)

        def before_start() -> None:
            seen.append((socket.exists(), old.process is not None and old.process.returncode is None))

        async def registered() -> None:
            async with asyncio.timeout(30):
                while not socket.is_socket():
                    await asyncio.sleep(0.02)

        try:
            return await replace_instance([old], new, {}, False, registered, time.monotonic(), before_start)
        finally:
            await new.stop()
            await old.stop()

    rolled = asyncio.run(roll())
    assert seen == [(False, False)], "taken once the old instance and its socket were gone, before the new one's"
    assert rolled.generation == 1 and rolled.unavailable_s > 0
