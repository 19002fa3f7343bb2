"""DRAOptionalNodeOperations (alpha in 1.37): the calls a claim's devices spare their
driver, worked out and honoured as kubelet v1.37's DRA manager does
(pkg/kubelet/cm/dra/claiminfo.go computeDriverStates, manager.go)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from testbed.kubeapi import ClaimRef, KubeClient, Obj
from testbed.kubelet.dra import DRAManager
from testbed.kubelet.plugins import PluginManager, PreparedDevice
from testbed.kubelet.skips import PREPARE, UNPREPARE, skipped_calls

GPU = "gpu.dra-testbed.io"
NIC = "nic.dra-testbed.io"


def claim(name: str, uid: str, *results: tuple[str, list[str]]) -> Obj:
    """``results``: (driver, skipNodeOperations) per allocated device."""
    devices = [
        {"driver": driver, "pool": "node", "device": f"dev-{i}", "request": "r", "skipNodeOperations": skips}
        for i, (driver, skips) in enumerate(results)
    ]
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": devices}}},
    }


@pytest.mark.parametrize(
    ("results", "skipped"),
    [
        ([(GPU, [])], {}),
        ([(GPU, ["*"]), (GPU, ["*"])], {GPU: [PREPARE, UNPREPARE]}),
        ([(GPU, ["*"]), (GPU, [PREPARE])], {GPU: [PREPARE]}),
        ([(GPU, [PREPARE]), (GPU, [])], {}),  # not every device of the driver skips it
        ([(GPU, [UNPREPARE]), (NIC, ["*"])], {GPU: [UNPREPARE], NIC: [PREPARE, UNPREPARE]}),
        ([(GPU, [PREPARE, UNPREPARE])], {GPU: [PREPARE, UNPREPARE]}),
    ],
)
def test_a_call_is_skipped_for_a_driver_only_when_every_device_of_it_skips_it(
    results: list[tuple[str, list[str]]], skipped: dict[str, list[str]]
) -> None:
    assert skipped_calls(claim("c", "u", *results)) == skipped


class Drivers:
    """The plugin manager as the pod manager sees it: GPU registered, NIC not."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []

    def plugin_for(self, driver: str) -> object | None:
        return object() if driver == GPU else None

    async def prepare(self, driver: str, claims: list[ClaimRef]) -> dict[str, list[PreparedDevice]]:
        self.calls.append(("prepare", driver, [c.name for c in claims]))
        return {c.uid: [PreparedDevice(["r"], "node", "dev-0", [f"{driver}/gpu=x"], driver)] for c in claims}

    async def unprepare(self, driver: str, claims: list[ClaimRef]) -> None:
        self.calls.append(("unprepare", driver, [c.name for c in claims]))


def manager(tmp_path: Path, drivers: Drivers) -> DRAManager:
    made = DRAManager(
        cast(KubeClient, None),
        "node",
        cast(PluginManager, drivers),
        tmp_path / "cdi",
        checkpoint=tmp_path / "dra_manager_state.json",
    )
    made.load_checkpoint()
    return made


def skips(call: str, driver: str) -> float:
    metric = "dra_node_prepare_skips_total" if call == PREPARE else "dra_node_unprepare_skips_total"
    return REGISTRY.get_sample_value(metric, {"driver_name": driver}) or 0.0


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_driver_whose_calls_are_all_skipped_is_never_called_nor_needs_to_be_registered(tmp_path: Path) -> None:
    drivers = Drivers()
    pods = manager(tmp_path, drivers)
    before = skips(PREPARE, NIC), skips(UNPREPARE, NIC)
    run(pods.prepare_claims("pod-a", [claim("both", "u1", (GPU, []), (NIC, ["*"]))]))
    assert drivers.calls == [("prepare", GPU, ["both"])]
    assert pods.claims["u1"].prepared, "prepared once the drivers that are called answered"
    assert run(pods.release("pod-a"))
    assert drivers.calls[1:] == [("unprepare", GPU, ["both"])]
    assert pods.claims == {}
    assert (skips(PREPARE, NIC), skips(UNPREPARE, NIC)) == (before[0] + 1, before[1] + 1)


def test_a_skipped_unprepare_is_remembered_across_a_kubelet_restart(tmp_path: Path) -> None:
    drivers = Drivers()
    run(manager(tmp_path, drivers).prepare_claims("pod-a", [claim("c", "u1", (GPU, [UNPREPARE]))]))
    assert drivers.calls == [("prepare", GPU, ["c"])]
    restarted = manager(tmp_path, drivers)
    assert run(restarted.release("pod-a"))
    assert drivers.calls == [("prepare", GPU, ["c"])], "the driver was asked to unprepare what it skips"
    assert restarted.claims == {}


def test_a_claim_whose_every_prepare_is_skipped_is_prepared_without_devices(tmp_path: Path) -> None:
    drivers = Drivers()
    pods = manager(tmp_path, drivers)
    run(pods.prepare_claims("pod-a", [claim("c", "u1", (GPU, [PREPARE]))]))
    assert drivers.calls == []
    assert pods.claims["u1"].prepared and pods.claims["u1"].devices == []
    assert run(pods.release("pod-a"))
    assert drivers.calls == [("unprepare", GPU, ["c"])]
