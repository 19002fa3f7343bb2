"""What the fabric manager reads from a claim and writes back (no control plane)."""

from __future__ import annotations

from typing import Any

from testbed.fleet.fabric import DeviceRef, allocated_node, awaiting_attachment, outcome
from testbed.keys import FABRIC_ATTACH_FAILED, FABRIC_ATTACHED

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
