"""The driver under bad input and faults, over its real unix sockets, against the real
API server. Claims are allocated by hand here, so each bad case is exactly what it says."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from fake_devices.hardware import Health, NodeHardware
from testbed.controlplane.cluster import ClusterState
from testbed.drivers import driver_on_node, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from testbed.kubeapi import KubeClient
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.prepare import DriverPaths
from testbed.workloads import allocated_claim

pytestmark = pytest.mark.controlplane
GPU = "gpu.dra-testbed.io"


@pytest.fixture
def namespace(kube_api: k8s.ApiClient) -> Any:
    name = f"drv-{uuid.uuid4().hex[:6]}"
    k8s.CoreV1Api(kube_api).create_namespace({"metadata": {"name": name}})
    yield name
    k8s.CoreV1Api(kube_api).delete_namespace(name)


class Harness:
    """One GPU driver instance for one node, in this process, with its hardware."""

    def __init__(
        self,
        kubeconfig: Path,
        root: Path,
        node: str,
        pod_uid: str | None = None,
        hardware: NodeHardware | None = None,
        liveness: bool = False,
        publish: bool = False,
    ):
        self.client = KubeClient.from_kubeconfig(kubeconfig)
        self.hardware = hardware or NodeHardware(node, load_profile("tiny"))
        self.paths = DriverPaths.for_node(root / "kubelet", GPU, root / "cdi", pod_uid)
        self.plugin = driver_on_node(
            GPU,
            node,
            self.paths,
            LocalBackend(self.hardware),
            self.client,
            ClaimReader(self.client),
            liveness_port=0 if liveness else None,
            publish_slices=publish,
        )

    async def prepare(self, *claims: tuple[str, str, str], version: str = "v1") -> Any:
        pb2, grpc_mod = (dra_v1_pb2, dra_v1_pb2_grpc) if version == "v1" else (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)
        async with grpc.aio.insecure_channel(f"unix://{self.paths.dra_socket}") as channel:
            request = pb2.NodePrepareResourcesRequest(
                claims=[pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
            )
            return await grpc_mod.DRAPluginStub(channel).NodePrepareResources(request, timeout=45)

    async def unprepare(self, *claims: tuple[str, str, str]) -> Any:
        async with grpc.aio.insecure_channel(f"unix://{self.paths.dra_socket}") as channel:
            request = dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
            )
            return await dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(request, timeout=45)


@asynccontextmanager
async def running(*args: Any, **kwargs: Any) -> AsyncIterator[Harness]:
    harness = Harness(*args, **kwargs)
    await harness.plugin.start()
    try:
        yield harness
    finally:
        await harness.plugin.stop(grace_s=0)
        await harness.client.close()


def run(coroutine: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coroutine())


def test_each_bad_claim_gets_its_own_error_and_the_good_one_prepares(
    control_plane: ClusterState, kube_api: k8s.ApiClient, namespace: str, short_tmp_path: Path
) -> None:
    node = "drv-node-a"
    good = allocated_claim(kube_api, namespace, "good", node)
    unallocated = allocated_claim(kube_api, namespace, "unallocated", None)
    elsewhere = allocated_claim(kube_api, namespace, "elsewhere", "other-node")
    allocated_claim(kube_api, namespace, "recreated", node)  # asked for below with another UID
    bad_config = allocated_claim(
        kube_api,
        namespace,
        "badconfig",
        node,
        device="gpu-1",
        config=[
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {
                    "driver": GPU,
                    "parameters": {"apiVersion": f"{GPU}/v1alpha1", "kind": "TpuConfig"},
                },
            }
        ],
    )

    async def scenario() -> None:
        async with running(control_plane.kubeconfig, short_tmp_path, node) as h:
            response = await h.prepare(
                (namespace, good, "good"),
                (namespace, unallocated, "unallocated"),
                (namespace, elsewhere, "elsewhere"),
                (namespace, str(uuid.uuid4()), "recreated"),
                (namespace, str(uuid.uuid4()), "missing"),
                (namespace, bad_config, "badconfig"),
                (namespace, "", "noid"),
            )
            errors = {uid: entry.error for uid, entry in response.claims.items()}
            assert errors[good] == "" and response.claims[good].devices[0].device_name == "gpu-0"
            assert "is not allocated" in errors[unallocated]
            assert "on node(s) other-node, not on drv-node-a" in errors[elsewhere]
            assert [e for e in errors.values() if "deleted and created again" in e]
            assert [e for e in errors.values() if "does not exist" in e]
            assert "unknown config kind 'TpuConfig'" in errors[bad_config] and "GpuConfig" in errors[bad_config]
            assert "without uid" in errors[""]
            assert h.hardware.claims() == {good: ["gpu-0"]}
            # the same request again: the same answer, from the checkpoint
            again = await h.prepare((namespace, good, "good"))
            assert again.claims[good] == response.claims[good]
            # v1beta1 serves the same claims
            beta = await h.prepare((namespace, good, "good"), version="v1beta1")
            assert beta.claims[good].devices[0].cdi_device_ids == list(response.claims[good].devices[0].cdi_device_ids)
            # unprepare of an unknown claim succeeds; of the good one releases the device
            result = await h.unprepare((namespace, str(uuid.uuid4()), "never-prepared"), (namespace, good, "good"))
            assert all(entry.error == "" for entry in result.claims.values())
            assert h.hardware.claims() == {}

    run(scenario)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "checksum"])
def test_a_damaged_checkpoint_is_set_aside_and_the_driver_keeps_serving(
    control_plane: ClusterState,
    kube_api: k8s.ApiClient,
    namespace: str,
    short_tmp_path: Path,
    damage: str,
) -> None:
    node = "drv-node-b"
    first = allocated_claim(kube_api, namespace, "first", node)
    second = allocated_claim(kube_api, namespace, "second", node, device="gpu-1")

    async def scenario() -> None:
        async with running(control_plane.kubeconfig, short_tmp_path, node) as h:
            assert (await h.prepare((namespace, first, "first"))).claims[first].error == ""
            checkpoint = h.paths.checkpoint
        text = checkpoint.read_text()
        if damage == "garbage":
            checkpoint.write_text("\x00not json")
        elif damage == "truncated":
            checkpoint.write_text(text[: len(text) // 2])
        else:
            checkpoint.write_text(text.replace('"gpu-0"', '"gpu-1"'))
        async with running(control_plane.kubeconfig, short_tmp_path, node) as h:
            assert h.plugin.preparer.corruptions, "the driver reports what it found"
            assert list(checkpoint.parent.glob("checkpoint.json.corrupt-*")), "the damaged file is kept"
            response = await h.prepare((namespace, second, "second"))
            assert response.claims[second].error == ""
            assert json.loads(checkpoint.read_text())["claims"].keys() == {second}

    run(scenario)


def test_a_crash_between_started_and_completed_is_repaired_on_restart(
    control_plane: ClusterState, kube_api: k8s.ApiClient, namespace: str, short_tmp_path: Path
) -> None:
    node = "drv-node-c"
    done = allocated_claim(kube_api, namespace, "done", node, device="gpu-0")
    interrupted = allocated_claim(kube_api, namespace, "interrupted", node, device="gpu-1")
    kept = short_tmp_path / "hardware-faults.json"
    hardware = NodeHardware(node, load_profile("tiny"), kept_in=kept)  # outlives the driver, as a Ray actor would

    async def scenario() -> None:
        async with running(control_plane.kubeconfig, short_tmp_path, node, hardware=hardware) as h:
            assert (await h.prepare((namespace, done, "done"))).claims[done].error == ""
            hardware.inject(latency_s=30)
            call = asyncio.create_task(h.prepare((namespace, interrupted, "interrupted")))
            async with asyncio.timeout(10):
                while interrupted not in hardware.claims():
                    await asyncio.sleep(0.01)
            assert interrupted not in json.loads(h.paths.checkpoint.read_text())["claims"], "not completed"
            assert interrupted in h.paths.intents.read_text().split(), "its prepare began"
        # the instance is gone mid-prepare (its server stopped with no grace)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert interrupted in hardware.claims(), "the device is held by a prepare nobody finished"
        hardware.inject(latency_s=0)
        async with running(control_plane.kubeconfig, short_tmp_path, node, hardware=hardware) as h:
            assert hardware.claims() == {done: ["gpu-0"]}, "repair released the half-prepared device"
            assert set(json.loads(h.paths.checkpoint.read_text())["claims"]) == {done}
            retry = await h.prepare((namespace, interrupted, "interrupted"))
            assert retry.claims[interrupted].error == ""
            assert hardware.claims() == {done: ["gpu-0"], interrupted: ["gpu-1"]}
        # Now the emulator dies too (a NodeHost that Ray restarts), with gpu-0 sick and a
        # prepare failure pending: its hardware is built again from the faults it kept.
        hardware.set_health("gpu-0", Health.UNHEALTHY, "too hot")
        hardware.inject(fail_next_prepares=1, message="ECC storm")
        rebuilt = NodeHardware(node, load_profile("tiny"), kept_in=kept)
        async with running(control_plane.kubeconfig, short_tmp_path, node, hardware=rebuilt) as h:
            assert rebuilt.claims() == {done: ["gpu-0"], interrupted: ["gpu-1"]}, "held again, sick gpu-0 too"
            assert rebuilt.faults_in_force() == ["gpu-0 unhealthy: too hot", "next 1 prepares fail: ECC storm"]

    run(scenario)


def test_an_unhealthy_device_is_tainted_in_its_slice_and_streamed(
    control_plane: ClusterState, kube_api: k8s.ApiClient, short_tmp_path: Path
) -> None:
    node = "drv-node-d"
    resource = k8s.ResourceV1Api(kube_api)

    def tainted() -> set[str]:
        slices = resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
        return {d.name for s in slices for d in (s.spec.devices or []) if d.taints}

    async def scenario() -> None:
        async with running(control_plane.kubeconfig, short_tmp_path, node, publish=True) as h:
            async with asyncio.timeout(30):
                await h.plugin.published.wait()
            assert await asyncio.to_thread(tainted) == set()
            streams = []
            for pb2, grpc_mod in (
                (health_v1_pb2, health_v1_pb2_grpc),
                (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
            ):
                channel = grpc.aio.insecure_channel(f"unix://{h.paths.dra_socket}")
                stream = grpc_mod.DRAResourceHealthStub(channel).NodeWatchResources(pb2.NodeWatchResourcesRequest())
                first = await stream.read()
                assert {d.health for d in first.devices} == {pb2.HEALTHY}
                streams.append((pb2, channel, stream))
            h.hardware.set_health("gpu-0", Health.UNHEALTHY, "XID 79: fell off the bus")
            for pb2, channel, stream in streams:
                update = await asyncio.wait_for(stream.read(), 10)
                sick = {d.device.device_name for d in update.devices if d.health == pb2.UNHEALTHY}
                assert sick == {
                    "gpu-0",
                    *(n for n in {d.device.device_name for d in update.devices} if n.startswith("gpu-0-")),
                }
                assert "XID 79" in next(d.message for d in update.devices if d.device.device_name == "gpu-0")
                assert update.devices[0].device.pool_name == node
                stream.cancel()
                await channel.close()
            deadline = asyncio.get_running_loop().time() + 30
            while "gpu-0" not in await asyncio.to_thread(tainted):
                assert asyncio.get_running_loop().time() < deadline, "no taint on gpu-0"
                await asyncio.sleep(0.1)
        resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")

    run(scenario)


def test_slices_deleted_or_edited_behind_the_drivers_back_are_restored_within_seconds(
    control_plane: ClusterState, kube_api: k8s.ApiClient, short_tmp_path: Path
) -> None:
    """A starting kubelet deletes its node's slices; an admin may edit one. The driver
    watches its slices and republishes at once, not at its next periodic relist (minutes)."""
    node = "drv-node-w"
    resource = k8s.ResourceV1Api(kube_api)

    def slices() -> dict[str, tuple[str, int]]:
        items = resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
        return {s.metadata.name: (s.metadata.uid, len(s.spec.devices or [])) for s in items}

    async def restored(check: Callable[[dict[str, tuple[str, int]]], bool]) -> float:
        started = asyncio.get_running_loop().time()
        while not check(await asyncio.to_thread(slices)):
            assert asyncio.get_running_loop().time() - started < 30, "not restored within 30 s"
            await asyncio.sleep(0.1)
        return asyncio.get_running_loop().time() - started

    async def scenario() -> None:
        async with running(control_plane.kubeconfig, short_tmp_path, node, publish=True) as h:
            async with asyncio.timeout(30):
                await h.plugin.published.wait()
            before = await asyncio.to_thread(slices)
            await asyncio.to_thread(resource.delete_collection_resource_slice, field_selector=f"spec.nodeName={node}")
            await restored(lambda now: set(now) == set(before) and now != before)
            name = sorted(n for n, (_, count) in before.items() if count)[0]
            edited = await asyncio.to_thread(resource.read_resource_slice, name)
            edited.spec.devices = edited.spec.devices[:1]
            await asyncio.to_thread(resource.replace_resource_slice, name, edited)
            await restored(lambda now: now.get(name, ("", 0))[1] == before[name][1])
        resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")

    run(scenario)


def test_registration_liveness_and_rolling_update_instances(
    control_plane: ClusterState, kube_api: k8s.ApiClient, namespace: str, short_tmp_path: Path
) -> None:
    node = "drv-node-e"
    claim = allocated_claim(kube_api, namespace, "rolling", node)
    hardware = NodeHardware(node, load_profile("tiny"))

    async def scenario() -> None:
        async with (
            running(
                control_plane.kubeconfig,
                short_tmp_path,
                node,
                pod_uid="old-pod",
                hardware=hardware,
                liveness=True,
            ) as old,
            running(control_plane.kubeconfig, short_tmp_path, node, pod_uid="new-pod", hardware=hardware) as new,
        ):
            assert old.paths.registration_socket.name == f"{GPU}-old-pod-reg.sock"
            assert new.paths.dra_socket.name == "dra-new-pod.sock"
            async with grpc.aio.insecure_channel(f"unix://{old.paths.registration_socket}") as channel:
                info = await pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                    pluginregistration_pb2.InfoRequest()
                )
            assert (info.type, info.name, info.endpoint) == (
                "DRAPlugin",
                GPU,
                str(old.paths.dra_socket),
            )
            assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            # the kubelet may prepare on one instance and unprepare on the other
            assert (await old.prepare((namespace, claim, "rolling"))).claims[claim].error == ""
            assert (await new.unprepare((namespace, claim, "rolling"))).claims[claim].error == ""
            assert hardware.claims() == {}
            async with grpc.aio.insecure_channel(f"127.0.0.1:{old.plugin.liveness_port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)
                ok = await health.Check(health_pb2.HealthCheckRequest())
                assert ok.status == health_pb2.HealthCheckResponse.SERVING
                old.paths.dra_socket.unlink()  # the DRA socket is gone: the probe must notice
                bad = await health.Check(health_pb2.HealthCheckRequest())
                assert bad.status == health_pb2.HealthCheckResponse.NOT_SERVING

    run(scenario)


claim_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=70)


def test_fuzzed_requests_get_per_claim_errors_and_never_crash_the_driver(
    control_plane: ClusterState, short_tmp_path: Path
) -> None:
    loop = asyncio.new_event_loop()
    harness = Harness(control_plane.kubeconfig, short_tmp_path, "drv-node-f")
    loop.run_until_complete(harness.plugin.start())
    try:

        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )
        @given(st.lists(st.tuples(claim_text, claim_text, claim_text), max_size=6), st.booleans())
        def check(claims: list[tuple[str, str, str]], unprepare: bool) -> None:
            call = harness.unprepare if unprepare else harness.prepare
            response = loop.run_until_complete(call(*claims))
            assert set(response.claims) == {uid for _, uid, _ in claims}
            if not unprepare:
                assert all(entry.error for entry in response.claims.values())
            else:  # unknown claims unprepare fine; a malformed UID (it names files) is an error
                for uid, entry in response.claims.items():
                    well_formed = re.fullmatch(r"[A-Za-z0-9-]{1,128}", uid) is not None
                    assert bool(entry.error) != well_formed, (uid, entry.error)

        check()
        assert harness.hardware.claims() == {}
        empty = loop.run_until_complete(harness.prepare())
        assert len(empty.claims) == 0, "still serving"
    finally:
        loop.run_until_complete(harness.plugin.stop(grace_s=0))
        loop.run_until_complete(harness.client.close())
        loop.close()
