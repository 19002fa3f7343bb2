"""A claim's shares of a shareable device (consumable capacity), through the driver's
prepare: each share its own CDI device, what it consumes recorded, held again on repair."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from pathlib import Path

import pytest

from fake_devices.hardware import HardwareError, NodeHardware, Share
from testbed.drivers import KINDS, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.kubeapi import ClaimRef, Credentials, KubeClient, Obj
from testbed.kubeletplugin import cdi
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.prepare import ClaimPreparer, DriverPaths

NIC = "nic.dra-testbed.io"
G = 10**9


class Claims(ClaimReader):
    """Claims allocated on node ``n``: claim UID -> its NIC allocation results."""

    def __init__(self, results: dict[str, list[Obj]]):
        super().__init__(KubeClient(Credentials("https://127.0.0.1:1", ssl.create_default_context())))
        self.results = results

    async def get(self, namespace: str, name: str) -> Obj:
        uid = name.removeprefix("claim-")
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": self.results[uid]}}},
        }


def share(request: str, device: str, share_id: str, bandwidth: str) -> Obj:
    return {
        "request": request,
        "driver": NIC,
        "pool": "n",
        "device": device,
        "shareID": share_id,
        "consumedCapacity": {"virtualFunctions": "1", "bandwidth": bandwidth},
    }


def preparer(root: Path, results: dict[str, list[Obj]], hardware: NodeHardware) -> ClaimPreparer:
    paths = DriverPaths.for_node(root / "kubelet", NIC, root / "cdi")
    driver = KINDS[NIC].make(LocalBackend(hardware))  # no API client: no network status written
    return ClaimPreparer(driver, "n", paths, Claims(results), durable=False)


def test_two_shares_of_a_port_in_one_claim_are_two_cdi_devices_and_held_again_on_repair(tmp_path: Path) -> None:
    uid, first, second = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    results = {uid: [share("a", "nic-0", first, "40G"), share("b", "nic-0", second, "35G")]}
    hardware = NodeHardware("n", load_profile("shared-nic"))
    answer = asyncio.run(preparer(tmp_path, results, hardware).prepare([ClaimRef("ns", uid, f"claim-{uid}")]))
    devices = answer[uid].devices
    assert answer[uid].error == "" and [d.share_id for d in devices] == [first, second]
    ids = [d.cdi_device_ids[0] for d in devices]
    assert ids == [f"{NIC}/nic={uid}-nic-0-{first}", f"{NIC}/nic={uid}-nic-0-{second}"]
    envs = [cdi.resolve(tmp_path / "cdi", [i]) for i in ids]
    assert {e["NIC_0_SHARE"] for e in envs} == {"0", "1"}
    assert sorted(e["NIC_0_BANDWIDTH"] for e in envs) == [str(35 * G), str(40 * G)]

    restarted = NodeHardware("n", load_profile("shared-nic"))  # the hardware forgot everything
    asyncio.run(preparer(tmp_path, results, restarted).repair())
    assert restarted.claims() == {uid: ["nic-0", "nic-0"]}
    with pytest.raises(HardwareError, match="its shares would consume 105000000000"):  # 75G held again
        asyncio.run(restarted.prepare("other", [], shares=[Share("nic-0", "x", {"bandwidth": 30 * G})]))


def test_a_share_whose_consumed_capacity_is_malformed_fails_its_claim_alone(tmp_path: Path) -> None:
    bad, good = str(uuid.uuid4()), str(uuid.uuid4())
    results = {bad: [share("a", "nic-0", str(uuid.uuid4()), "lots")], good: [share("a", "nic-1", "s", "25G")]}
    hardware = NodeHardware("n", load_profile("shared-nic"))
    refs = [ClaimRef("ns", uid, f"claim-{uid}") for uid in (bad, good)]
    answer = asyncio.run(preparer(tmp_path, results, hardware).prepare(refs))
    assert "consumedCapacity of nic-0: 'lots' is not a Kubernetes quantity" in answer[bad].error
    assert answer[good].error == ""
    assert hardware.claims() == {good: ["nic-1"]}
