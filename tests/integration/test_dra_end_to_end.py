"""Pods with DRA claims on synthetic nodes, end to end: real control plane, real Ray,
real gRPC over unix sockets between the fake kubelet and the driver."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from fake_devices.actor import hardware_host_actor
from fake_devices.hardware import HardwareError, Share
from testbed.drivers import load_profile
from testbed.drivers.backend import RayBackend
from testbed.errors import run_coroutine
from testbed.fleet.fleet import Fleet
from testbed.keys import UNHEALTHY_TAINT_KEY
from testbed.testing import wait_for
from testbed.workloads import (
    GPU,
    NIC,
    PARTITION,
    allocated_devices,
    claim_spec,
    container_env,
    create_claim,
    create_template,
    events,
    pod,
    pod_claim_name,
    request,
    unique,
    wait_gone,
    wait_running,
)

pytestmark = pytest.mark.controlplane


@pytest.fixture
def namespace(kube_api: k8s.ApiClient, fleet: Fleet) -> Iterator[str]:
    """A namespace per test, its pods unprepared and gone and its claims deleted (their
    devices free) before the next test. Its pods and claims are deleted first, not left to
    the namespace controller, which waits 5 s before it looks at a deleted namespace."""
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    name = unique("e2e")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_collection_namespaced_pod(name)
    resource.delete_collection_namespaced_resource_claim(name)
    core.delete_namespace(name)

    def emptied() -> bool:
        return not core.list_namespaced_pod(name).items and not resource.list_namespaced_resource_claim(name).items

    wait_for(emptied, 120, f"the pods and claims of namespace {name} to be deleted", interval_s=0.1)


def hardware_claims(fleet: Fleet, node: str) -> dict[str, list[str]]:
    return fleet.hardware_claims(node)


def test_gpu_claim_from_template_runs_and_is_released(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    create_template(kube_api, namespace, "one-gpu", claim_spec(request("gpu", GPU)))
    core.create_namespaced_pod(namespace, pod("worker", {"gpu": {"resourceClaimTemplateName": "one-gpu"}}))
    running = wait_running(kube_api, namespace, "worker")
    node = running.spec.node_name
    claim = pod_claim_name(running, "gpu")
    [device] = allocated_devices(kube_api, namespace, claim)
    env = container_env(running)["main"]
    assert env["DRA_TESTBED_CLAIM"] == f"{namespace}/{claim}"
    assert env[f"{device.device.upper().replace('-', '_')}_UUID"].startswith("GPU-")
    claim_uid = k8s.ResourceV1Api(kube_api).read_namespaced_resource_claim(claim, namespace).metadata.uid
    assert hardware_claims(fleet, node)[claim_uid] == [device.device]
    node_dir = fleet.node_dir(node)
    assert (node_dir / "cdi" / f"{GPU}-{claim_uid}.json").exists()

    core.delete_namespaced_pod("worker", namespace)
    wait_gone(kube_api, namespace, "worker")
    wait_for(lambda: claim_uid not in hardware_claims(fleet, node), 120, "the device to be released")
    assert not (node_dir / "cdi" / f"{GPU}-{claim_uid}.json").exists()

    def claim_deleted() -> bool:
        try:
            k8s.ResourceV1Api(kube_api).read_namespaced_resource_claim(claim, namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(claim_deleted, 120, "the generated claim to be deleted (deallocated)")


def test_claim_shared_by_two_containers_and_two_pods(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    create_claim(kube_api, namespace, "shared", claim_spec(request("gpu", GPU)))
    for name in ("a", "b"):
        core.create_namespaced_pod(
            namespace,
            pod(
                name,
                {"gpu": {"resourceClaimName": "shared"}},
                containers={"one": ["gpu"], "two": ["gpu"]},
            ),
        )
    a, b = (wait_running(kube_api, namespace, n) for n in ("a", "b"))
    assert a.spec.node_name == b.spec.node_name
    envs = [container_env(p)[c] for p in (a, b) for c in ("one", "two")]
    assert all(e == envs[0] for e in envs), envs
    claim_uid = k8s.ResourceV1Api(kube_api).read_namespaced_resource_claim("shared", namespace).metadata.uid
    node = a.spec.node_name

    core.delete_namespaced_pod("a", namespace)
    wait_gone(kube_api, namespace, "a")
    assert claim_uid in hardware_claims(fleet, node), "still used by pod b"
    core.delete_namespaced_pod("b", namespace)
    wait_gone(kube_api, namespace, "b")
    wait_for(lambda: claim_uid not in hardware_claims(fleet, node), 120, "release after the last user")


def test_partition_blocks_its_whole_gpu_until_released(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    node = "tb-001"
    on_gpu0 = f"device.attributes['{GPU}'].index == 0"
    create_template(kube_api, namespace, "slice", claim_spec(request("part", PARTITION, on_gpu0)))
    create_template(kube_api, namespace, "whole", claim_spec(request("gpu", GPU, on_gpu0)))
    core.create_namespaced_pod(namespace, pod("partition", {"p": {"resourceClaimTemplateName": "slice"}}, node=node))
    wait_running(kube_api, namespace, "partition")
    core.create_namespaced_pod(namespace, pod("whole", {"g": {"resourceClaimTemplateName": "whole"}}, node=node))
    wait_for(
        lambda: any(r == "FailedScheduling" for r, _ in events(kube_api, namespace, "whole")),
        30,
        "the scheduler to find the whole GPU unavailable",
    )
    assert core.read_namespaced_pod("whole", namespace).spec.node_name is None

    core.delete_namespaced_pod("partition", namespace)
    running = wait_running(kube_api, namespace, "whole", timeout_s=180)
    assert running.spec.node_name == node


def test_gpu_and_nic_on_the_same_pcie_root(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    create_template(
        kube_api,
        namespace,
        "aligned",
        claim_spec(
            request("gpu", GPU),
            request("nic", NIC),
            constraints=[{"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
        ),
    )
    core.create_namespaced_pod(namespace, pod("trainer", {"net": {"resourceClaimTemplateName": "aligned"}}))
    running = wait_running(kube_api, namespace, "trainer")
    claim_name = pod_claim_name(running, "net")
    devices = {r.request: r.device for r in allocated_devices(kube_api, namespace, claim_name)}
    assert devices["gpu"].split("-")[1] == devices["nic"].split("-")[1], devices  # gpu-i with nic-i
    env = container_env(running)["main"]
    assert any(k.endswith("_IFNAME") for k in env) and any(k.endswith("_UUID") for k in env)

    def network_status() -> object:
        claim = k8s.ResourceV1Api(kube_api).read_namespaced_resource_claim(claim_name, namespace)
        return claim.status.devices

    [status] = wait_for(network_status, 120, "the NIC driver to write claim status")
    assert status.driver == NIC and status.device == devices["nic"]
    assert status.network_data.interface_name.startswith("eth")
    assert status.network_data.hardware_address.count(":") == 5
    assert status.network_data.ips and status.conditions[0].type == "Ready"


def test_first_available_falls_back_to_what_fits(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "firstAvailable": [
                        {
                            "name": "eight",
                            "deviceClassName": GPU,
                            "allocationMode": "ExactCount",
                            "count": 8,
                        },
                        {"name": "partition", "deviceClassName": PARTITION},
                    ],
                }
            ]
        }
    }
    create_template(kube_api, namespace, "flexible", spec)
    core.create_namespaced_pod(namespace, pod("flex", {"gpu": {"resourceClaimTemplateName": "flexible"}}))
    running = wait_running(kube_api, namespace, "flex")
    [result] = allocated_devices(kube_api, namespace, pod_claim_name(running, "gpu"))
    assert result.request == "gpu/partition"
    assert any(k.endswith("_UUID") for k in container_env(running)["main"])


def test_admin_access_reaches_a_device_in_use(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    # A NIC, not a GPU: the 1.37 allocator still checks shared counters for admin-access
    # requests, so a partitionable GPU in use cannot be reached with admin access.
    core = k8s.CoreV1Api(kube_api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}})
    node = "tb-000"
    on_nic1 = f"device.attributes['{NIC}'].index == 1"
    create_template(kube_api, namespace, "user", claim_spec(request("nic", NIC, on_nic1)))
    create_template(kube_api, namespace, "admin", claim_spec(request("nic", NIC, on_nic1, adminAccess=True)))
    core.create_namespaced_pod(namespace, pod("user", {"nic": {"resourceClaimTemplateName": "user"}}, node=node))
    wait_running(kube_api, namespace, "user")
    core.create_namespaced_pod(namespace, pod("monitor", {"nic": {"resourceClaimTemplateName": "admin"}}, node=node))
    monitor = wait_running(kube_api, namespace, "monitor")
    [result] = allocated_devices(kube_api, namespace, pod_claim_name(monitor, "nic"))
    assert result.device == "nic-1" and result.admin_access is True
    assert "NIC_1_IFNAME" in container_env(monitor)["main"]


def test_bad_opaque_config_fails_that_claim_only(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    core = k8s.CoreV1Api(kube_api)

    def gpu_config(sharing: dict[str, object]) -> list[object]:
        params = {"apiVersion": f"{GPU}/v1alpha1", "kind": "GpuConfig", "sharing": sharing}
        return [{"requests": ["gpu"], "opaque": {"driver": GPU, "parameters": params}}]

    create_template(
        kube_api,
        namespace,
        "broken",
        claim_spec(request("gpu", PARTITION), config=gpu_config({"strategy": "Sometimes"})),
    )
    create_template(
        kube_api,
        namespace,
        "good",
        claim_spec(
            request("gpu", PARTITION),
            config=gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        ),
    )
    core.create_namespaced_pod(namespace, pod("broken", {"gpu": {"resourceClaimTemplateName": "broken"}}))
    wait_for(
        lambda: [m for r, m in events(kube_api, namespace, "broken") if r == "FailedPrepareDynamicResources"],
        60,
        "a FailedPrepareDynamicResources event",
    )
    [message] = {m for r, m in events(kube_api, namespace, "broken") if r == "FailedPrepareDynamicResources"}
    assert "invalid GpuConfig" in message and "sharing.strategy" in message
    assert core.read_namespaced_pod("broken", namespace).status.phase == "Pending"

    core.create_namespaced_pod(namespace, pod("good", {"gpu": {"resourceClaimTemplateName": "good"}}))
    env = container_env(wait_running(kube_api, namespace, "good"))["main"]
    assert env["GPU_SHARING_STRATEGY"] == "TimeSlicing" and env["GPU_TIMESLICE_INTERVAL"] == "Long"


def test_job_running_sleep_2_succeeds_and_frees_its_device(
    kube_api: k8s.ApiClient, fleet: Fleet, namespace: str
) -> None:
    create_template(kube_api, namespace, "one-gpu", claim_spec(request("gpu", GPU)))
    template = pod(
        "sleeper",
        {"gpu": {"resourceClaimTemplateName": "one-gpu"}},
        command=["sleep", "2"],
        restart_policy="Never",
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sleeper"},
        "spec": {"backoffLimit": 0, "template": {"spec": template["spec"]}},
    }
    k8s.BatchV1Api(kube_api).create_namespaced_job(namespace, job)
    done = wait_for(
        lambda: (j := k8s.BatchV1Api(kube_api).read_namespaced_job("sleeper", namespace)).status.succeeded and j,
        90,
        "the job to succeed",
    )
    assert done.status.succeeded == 1
    pods = k8s.CoreV1Api(kube_api).list_namespaced_pod(namespace, label_selector="job-name=sleeper").items
    node = pods[0].spec.node_name
    wait_for(lambda: not hardware_claims(fleet, node), 120, "the job's device to be released")


def test_nodehost_metrics_carry_the_kubelet_and_plugin_histograms(
    fleet: Fleet, kube_api: k8s.ApiClient, namespace: str
) -> None:
    core = k8s.CoreV1Api(kube_api)
    create_template(kube_api, namespace, "one-gpu", claim_spec(request("gpu", GPU)))
    core.create_namespaced_pod(namespace, pod("measured", {"gpu": {"resourceClaimTemplateName": "one-gpu"}}))
    node = wait_running(kube_api, namespace, "measured").spec.node_name
    core.delete_namespaced_pod("measured", namespace)
    wait_gone(kube_api, namespace, "measured")
    with urllib.request.urlopen(fleet.metrics_url(node), timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    kubelet = {
        (s.labels["operation_name"], s.labels["is_error"]): s.value
        for s in families["dra_operations_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert kubelet[("PrepareResources", "false")] >= 1 and kubelet[("UnprepareResources", "false")] >= 1
    plugin = {
        (s.labels["driver_name"], s.labels["method_name"], s.labels["grpc_status_code"])
        for s in families["dra_grpc_operations_duration_seconds"].samples
    }
    assert (GPU, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", "OK") in plugin
    assert (GPU, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources", "OK") in plugin


def test_hardware_in_its_own_ray_actor_backs_a_driver(fleet: Fleet) -> None:
    """The shape kind mode uses: the driver elsewhere, the emulated hardware in Ray."""
    tiny = load_profile("tiny")
    first = hardware_host_actor().remote({"hw-a": tiny}, 7)
    twin = hardware_host_actor().remote({"hw-a": tiny}, 7)
    other_seed = hardware_host_actor().remote({"hw-a": tiny}, 8)
    backend = RayBackend(first, "hw-a")

    async def scenario() -> None:
        _, devices, pools = await backend.inventory()
        assert len(devices) == 16 and len(pools) == 2
        prepared = await backend.prepare("c1", ["gpu-0-1g5gb-0"], {"gpu-0-1g5gb-0": {"MODE": "x"}}, False)
        assert prepared[0].env["MODE"] == "x"
        with pytest.raises(HardwareError, match="overlaps"):
            await backend.prepare("c2", ["gpu-0"], {}, False)
        assert await backend.claims() == {"c1": ["gpu-0-1g5gb-0"]}
        assert await backend.unprepare("c1") and await backend.claims() == {}
        shared = RayBackend(sharing, "hw-s")  # shares of a port cross to the actor and back
        [share] = await shared.prepare("c3", [], {}, False, [Share("nic-0", "s1", {"bandwidth": 60 * 10**9})])
        assert share.share_id == "s1" and share.env["NIC_0_SHARE"] == "0"
        with pytest.raises(HardwareError, match="its shares would consume"):
            await shared.prepare("c4", [], {}, False, [Share("nic-0", "s2", {"bandwidth": 50 * 10**9})])

    sharing = hardware_host_actor().remote({"hw-s": load_profile("shared-nic")}, 7)
    try:
        asyncio.run(scenario())
        uuids = [ray.get(a.inventory.remote("hw-a"))[1][0].attributes["uuid"] for a in (first, twin, other_seed)]
        assert uuids[0] == uuids[1] != uuids[2], "deterministic from the seed"
    finally:
        for actor in (first, twin, other_seed, sharing):
            ray.kill(actor)


def test_an_unresolvable_cdi_device_fails_the_pod_start(kube_api: k8s.ApiClient, fleet: Fleet, namespace: str) -> None:
    node, driver = "tb-001", "wrong-cdi.example.com"
    kubelet_dir = fleet.node_dir(node) / "kubelet"
    plugin = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("misbehaving_plugin.py")),
            str(kubelet_dir / "plugins_registry"),
            str(kubelet_dir / "plugins" / driver),
            driver,
        ]
    )
    resource = k8s.ResourceV1Api(kube_api)
    try:
        resource.create_resource_slice(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-wrong-cdi"},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "d0"}],
                },
            }
        )
        resource.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": driver},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
            }
        )
        create_template(kube_api, namespace, "wrong", claim_spec(request("dev", driver)))
        # A pod that finds its driver unregistered is tried again only at its next sync,
        # 60-90 s later, as by a real kubelet: wait for the registration first.
        registered = kubelet_dir / "plugins" / driver / "registered"
        wait_for(registered.exists, 30, "the kubelet to register the plugin")
        k8s.CoreV1Api(kube_api).create_namespaced_pod(
            namespace, pod("victim", {"dev": {"resourceClaimTemplateName": "wrong"}}, node=node)
        )
        try:
            wait_for(
                lambda: [m for r, m in events(kube_api, namespace, "victim") if "unresolvable CDI device" in m],
                60,
                "the container start to fail on the CDI device",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: events {events(kube_api, namespace, 'victim')}") from None
        assert k8s.CoreV1Api(kube_api).read_namespaced_pod("victim", namespace).status.phase == "Pending"
        # As a kubelet does, the claim it tried to prepare is unprepared before the pod
        # goes: the plugin must still be there for that.
        k8s.CoreV1Api(kube_api).delete_namespaced_pod("victim", namespace)
        wait_gone(kube_api, namespace, "victim")
    finally:
        plugin.terminate()
        plugin.wait(10)
        resource.delete_device_class(driver)
        resource.delete_resource_slice(f"{node}-wrong-cdi")


UNHEALTHY_TOLERATION = {"key": UNHEALTHY_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}


def _device_of(kube_api: k8s.ApiClient, namespace: str, name: str) -> tuple[str, str, str]:
    """(node, device, claim uid) of a running pod's one GPU."""
    running = wait_running(kube_api, namespace, name)
    claim = pod_claim_name(running, "gpu")
    [device] = allocated_devices(kube_api, namespace, claim)
    uid = k8s.ResourceV1Api(kube_api).read_namespaced_resource_claim(claim, namespace).metadata.uid
    return running.spec.node_name, device.device, uid


def _evicted(kube_api: k8s.ApiClient, namespace: str, name: str) -> bool:
    return ("DeviceTaintManagerEviction", "Marking for deletion") in events(kube_api, namespace, name)


def test_a_fatally_sick_device_evicts_the_pods_not_tolerating_it_and_takes_no_new_claim(
    kube_api: k8s.ApiClient, fleet: Fleet, namespace: str
) -> None:
    """`testbed fault NODE unhealthy DEVICE --fatal`: the driver taints the device
    NoExecute, the controller-manager evicts the pods whose claims do not tolerate that,
    their node unprepares the claims, and the scheduler gives the device to no new claim."""
    core = k8s.CoreV1Api(kube_api)
    create_template(kube_api, namespace, "one-gpu", claim_spec(request("gpu", GPU)))
    tolerant = request("gpu", GPU, tolerations=[UNHEALTHY_TOLERATION])
    create_template(kube_api, namespace, "one-gpu-come-what-may", claim_spec(tolerant))
    core.create_namespaced_pod(namespace, pod("plain", {"gpu": {"resourceClaimTemplateName": "one-gpu"}}))
    core.create_namespaced_pod(
        namespace, pod("tolerant", {"gpu": {"resourceClaimTemplateName": "one-gpu-come-what-may"}})
    )
    plain_node, plain_device, plain_claim = _device_of(kube_api, namespace, "plain")
    tolerant_node, tolerant_device, _ = _device_of(kube_api, namespace, "tolerant")
    sick = [(plain_node, plain_device), (tolerant_node, tolerant_device)]
    try:
        for node, device in sick:
            run_coroutine(fleet.apply_fault(node, "unhealthy", device, "XID 79: fallen off the bus", fatal=True))
        wait_gone(kube_api, namespace, "plain", timeout_s=60)
        assert _evicted(kube_api, namespace, "plain"), events(kube_api, namespace, "plain")
        wait_for(
            lambda: plain_claim not in hardware_claims(fleet, plain_node), 60, "the evicted pod's claim unprepared"
        )
        still = core.read_namespaced_pod("tolerant", namespace)
        assert still.status.phase == "Running" and still.metadata.deletion_timestamp is None
        assert not _evicted(kube_api, namespace, "tolerant")

        core.create_namespaced_pod(namespace, pod("next", {"gpu": {"resourceClaimTemplateName": "one-gpu"}}))
        node, device, _ = _device_of(kube_api, namespace, "next")
        assert (node, device) not in sick, "a device tainted NoExecute is given to no claim that does not tolerate it"
    finally:
        for node, device in sick:
            run_coroutine(fleet.apply_fault(node, "healthy", device))
