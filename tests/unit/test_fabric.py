"""What the fabric manager reads from a claim and writes back (no control plane)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from testbed.fleet.fabric import DeviceRef, FabricManager, allocated_node, awaiting_attachment, outcome
from testbed.keys import FABRIC_ATTACH_FAILED, FABRIC_ATTACHED
from tests.unit.scripted_api import serving

GPU = "gpu.dra-testbed.io"


def _claim(results: list[dict[str, Any]], devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}
                    ]
                },
            },
            "devices": devices or [],
        },
    }


def _result(device: str, conditions: list[str] | None = None, driver: str = GPU, **more: Any) -> dict[str, Any]:
    result = {"request": "gpu", "driver": driver, "pool": "n7", "device": device, **more}
    if conditions is not None:
        result["bindingConditions"] = conditions
    return result


def test_devices_behind_the_fabric_await_attachment_until_the_status_says_how_it_went() -> None:
    results = [_result("gpu-0", [FABRIC_ATTACHED]), _result("gpu-1"), _result("nic-0", driver="nic.dra-testbed.io")]
    assert awaiting_attachment(_claim(results)) == [DeviceRef(GPU, "n7", "gpu-0")]
    ready = {"type": "Ready", "status": "True"}
    driver_said = [{"driver": GPU, "pool": "n7", "device": "gpu-0", "conditions": [ready]}]
    assert awaiting_attachment(_claim(results, driver_said)) == [DeviceRef(GPU, "n7", "gpu-0")], (
        "a condition of the driver's own is no outcome of the fabric"
    )
    for outcome_type in (FABRIC_ATTACHED, FABRIC_ATTACH_FAILED):
        done = [{"driver": GPU, "pool": "n7", "device": "gpu-0", "conditions": [{"type": outcome_type}]}]
        assert awaiting_attachment(_claim(results, done)) == []


def test_an_unallocated_claim_or_one_of_conditions_not_the_fabrics_awaits_nothing() -> None:
    assert awaiting_attachment({"metadata": {}, "status": {}}) == []
    assert awaiting_attachment({"metadata": {}}) == []
    assert awaiting_attachment(_claim([_result("gpu-0", ["example.com/Cabled"])])) == []


def test_shares_are_told_apart_by_their_share_id() -> None:
    results = [_result("gpu-0", [FABRIC_ATTACHED], shareID="a"), _result("gpu-0", [FABRIC_ATTACHED], shareID="b")]
    done = [{"driver": GPU, "pool": "n7", "device": "gpu-0", "shareID": "a", "conditions": [{"type": FABRIC_ATTACHED}]}]
    assert awaiting_attachment(_claim(results, done)) == [DeviceRef(GPU, "n7", "gpu-0", "b")]
    assert DeviceRef(GPU, "n7", "gpu-0", "b").entry()["shareID"] == "b"
    assert "shareID" not in DeviceRef(GPU, "n7", "gpu-0").entry()


def test_the_node_comes_from_the_allocations_node_selector() -> None:
    assert allocated_node(_claim([])) == "n7"
    assert allocated_node({"status": {"allocation": {"devices": {}}}}) == ""


def test_the_outcome_is_one_true_condition_per_device_keyed_as_the_api_keys_them() -> None:
    refs = [DeviceRef(GPU, "n7", "gpu-0"), DeviceRef(GPU, "n7", "gpu-1")]
    body = outcome(_claim([]), refs, attached=False, message="link down")
    assert body["metadata"] == {"name": "c", "namespace": "ns", "uid": "u1"}
    entries = body["status"]["devices"]
    assert [(e["device"], e["conditions"][0]["type"], e["conditions"][0]["status"]) for e in entries] == [
        ("gpu-0", FABRIC_ATTACH_FAILED, "True"),
        ("gpu-1", FABRIC_ATTACH_FAILED, "True"),
    ]
    assert entries[0]["conditions"][0]["message"] == "link down"
    assert outcome(_claim([]), refs[:1], attached=True, message="")["status"]["devices"][0]["conditions"][0][
        "type"
    ] == (FABRIC_ATTACHED)


def _scripted(patches: list[int]) -> tuple[web.Application, list[dict[str, Any]]]:
    """A manager watching a scripted API server that lists one claim awaiting attachment
    and answers its status writes with ``patches`` (then 200)."""
    claim = _claim([_result("gpu-0", [FABRIC_ATTACHED])])
    claim["metadata"]["resourceVersion"] = "5"
    written: list[dict[str, Any]] = []

    async def claims(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "1":
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": [claim]})
        response = web.StreamResponse()
        await response.prepare(request)
        await asyncio.sleep(0.5)  # a watch with nothing more to say, ended soon: the server stops quickly
        return response

    async def status(request: web.Request) -> web.Response:
        written.append(await request.json())
        code = patches.pop(0) if patches else 200
        return web.json_response({"kind": "Status", "code": code, "reason": "Forbidden"}, status=code)

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceclaims", claims)
    app.router.add_patch("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status", status)
    return app, written


def _until(
    tmp_path: Path, refusals: list[int], done: Callable[[FabricManager], bool], **faults: int
) -> tuple[FabricManager, list[dict[str, Any]]]:
    """A manager against a scripted server until ``done`` holds; it and what it wrote.
    ``faults``: hang_attach or fail_attach counts for node n7, set before it attaches."""

    async def go() -> tuple[FabricManager, list[dict[str, Any]]]:
        app, written = _scripted(refusals)
        async with serving(app) as server:
            manager = FabricManager(str(_kubeconfig(tmp_path, server)), attach_s=0.0)
            for fault, count in faults.items():
                getattr(manager, fault)("n7", count)
            try:
                await wait_until(lambda: done(manager), 10)
            finally:
                await manager.stop()
        return manager, written

    return asyncio.run(go())


def test_a_refused_status_write_is_tried_again_until_it_is_written(tmp_path: Path) -> None:
    """Refused (its access policy not yet in place): no claim event would bring the claim
    back while the scheduler waits on it, so the manager asks again by itself."""
    manager, written = _until(tmp_path, [403], lambda m: m.attached == 1)
    assert len(written) == 2, "refused once, then written"
    [condition] = written[-1]["status"]["devices"][0]["conditions"]
    assert condition["type"] == FABRIC_ATTACHED and "attached to node n7" in condition["message"]
    assert manager.figures() == {"attached": 1, "failed": 0, "hung": 0, "under way": 0}


def test_a_hung_attach_writes_nothing_and_a_failing_one_says_so(tmp_path: Path) -> None:
    manager, written = _until(tmp_path, [], lambda m: m.hung == 1, hang_attach=2)
    assert written == [] and manager.figures() == {"attached": 0, "failed": 0, "hung": 1, "under way": 0}
    assert manager.faults_in_force() == {"n7": ["next 1 attaches hang"]}, "what `testbed status` lists"
    manager, written = _until(tmp_path, [], lambda m: m.failed == 1, fail_attach=1)
    [condition] = written[0]["status"]["devices"][0]["conditions"]
    assert condition["type"] == FABRIC_ATTACH_FAILED and "testbed fault n7 fail-attach" in condition["message"]
    assert manager.attached == 0 and manager.faults_in_force() == {}


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(document))
    return path


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_the_node_driver_prepares_a_device_behind_the_fabric_only_once_it_is_attached(short_tmp_path: Path) -> None:
    """With the binding-conditions gate off, the scheduler binds at once and the kubelet
    asks for a GPU the fabric never attached: the driver refuses that claim (nothing is
    on the node to prepare), naming the condition, and prepares it once it is True."""
    from fake_devices.hardware import NodeHardware
    from testbed.drivers import KINDS, load_profile
    from testbed.drivers.backend import LocalBackend
    from testbed.kubeapi import ClaimRef, Obj
    from testbed.kubeletplugin.claims import ClaimReader
    from testbed.kubeletplugin.prepare import ClaimPreparer, DriverPaths

    attached = {"type": FABRIC_ATTACHED, "status": "True", "reason": "Attached", "message": ""}
    claims = {
        "never-attached": _claim([_result("gpu-0", [FABRIC_ATTACHED])]),
        "attach-failed": _claim(
            [_result("gpu-1", [FABRIC_ATTACHED])],
            [{"driver": GPU, "pool": "n7", "device": "gpu-1", "conditions": [dict(attached, status="False")]}],
        ),
        "attached": _claim(
            [_result("gpu-1", [FABRIC_ATTACHED])],
            [{"driver": GPU, "pool": "n7", "device": "gpu-1", "conditions": [attached]}],
        ),
    }

    class Scripted(ClaimReader):
        async def get(self, namespace: str, name: str) -> Obj:
            return dict(claims[name], metadata={"namespace": namespace, "name": name, "uid": f"uid-{name}"})

    async def scenario() -> dict[str, str]:
        paths = DriverPaths.for_node(short_tmp_path / "kubelet", GPU, short_tmp_path / "cdi")
        driver = KINDS[GPU].make(LocalBackend(NodeHardware("n7", load_profile("fabric-gpu"))))
        preparer = ClaimPreparer(driver, "n7", paths, Scripted(None))  # type: ignore[arg-type]
        await preparer.repair()
        results = await preparer.prepare([ClaimRef("ns", f"uid-{name}", name) for name in claims])
        return {name: results[f"uid-{name}"].error for name in claims}

    errors = asyncio.run(scenario())
    for name in ("never-attached", "attach-failed"):
        assert "behind the fabric not attached to this node" in errors[name], errors
        assert f"no {FABRIC_ATTACHED}=True" in errors[name], errors
    assert errors["attached"] == "", errors
