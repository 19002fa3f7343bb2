"""What the fake kubelet's pod-resources API says of a pod, from its book of claims."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from testbed.kubeapi import KubeClient, Obj
from testbed.kubelet.claiminfo import PreparedClaim
from testbed.kubelet.node import NodeSpec
from testbed.kubelet.plugins import PluginManager, PreparedDevice
from testbed.kubelet.podresources import PodResourcesService
from testbed.kubelet.pods import PodManager
from testbed.kubelet.ratelimit import TokenBucket

GPU, NIC = "gpu.dra-testbed.io", "nic.dra-testbed.io"


def manager(tmp_path: Path, *claims: PreparedClaim) -> PodManager:
    pods = PodManager(cast(KubeClient, None), NodeSpec("node"), cast(PluginManager, None), tmp_path)
    pods.dra.claims = {c.uid: c for c in claims}
    return pods


def device(driver: str, name: str, request: str) -> PreparedDevice:
    return PreparedDevice([request], "node", name, [f"{driver}/x=u-{name}"], driver)


POD: Obj = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
    "spec": {
        "resourceClaims": [{"name": "c", "resourceClaimName": "pair"}],
        "initContainers": [
            {"name": "setup", "resources": {"claims": [{"name": "c"}]}},
            {"name": "agent", "restartPolicy": "Always", "resources": {"claims": [{"name": "c", "request": "nic"}]}},
        ],
        "containers": [{"name": "main", "resources": {"claims": [{"name": "c", "request": "gpu"}]}}, {"name": "idle"}],
    },
}


def test_each_container_gets_the_whole_claim_with_cdi_lists_growing_along_a_drivers_devices(tmp_path: Path) -> None:
    devices = [device(GPU, "gpu-0", "gpu"), device(GPU, "gpu-1", "gpu"), device(NIC, "nic-0", "nic")]
    pair = PreparedClaim("ns", "pair", "u", [GPU, NIC], devices, {"pod-uid"}, True)
    answer = PodResourcesService(manager(tmp_path, pair))._pod(POD)
    assert [c.name for c in answer.containers] == ["agent", "main", "idle"], "restartable init containers only"
    main = {c.name: c for c in answer.containers}["main"]
    [claim] = main.dynamic_resources
    assert (claim.claim_name, claim.claim_namespace) == ("pair", "ns")
    seen = [(r.driver_name, r.device_name, [d.name for d in r.cdi_devices]) for r in claim.claim_resources]
    assert seen == [
        (GPU, "gpu-0", [f"{GPU}/x=u-gpu-0"]),
        (GPU, "gpu-1", [f"{GPU}/x=u-gpu-0", f"{GPU}/x=u-gpu-1"]),
        (NIC, "nic-0", [f"{NIC}/x=u-nic-0"]),
    ]
    assert {c.name: c for c in answer.containers}["agent"].dynamic_resources == main.dynamic_resources
    assert not {c.name: c for c in answer.containers}["idle"].dynamic_resources


def test_a_claim_the_kubelet_does_not_hold_leaves_the_container_without_dynamic_resources(tmp_path: Path) -> None:
    answer = PodResourcesService(manager(tmp_path))._pod(POD)
    assert all(not c.dynamic_resources for c in answer.containers)


def test_the_rate_limit_allows_bursts_of_ten_then_a_hundred_a_second() -> None:
    now = [0.0]
    bucket = TokenBucket(100, 10, clock=lambda: now[0])
    assert [bucket.take() for _ in range(11)] == [True] * 10 + [False]
    now[0] = 0.05
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
    now[0] = 60.0
    assert sum(bucket.take() for _ in range(20)) == 10, "no more than a burst saved up"
