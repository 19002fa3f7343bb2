"""Publishing against the real API server: idempotent, generation bumps, stale slices go."""

from __future__ import annotations

import asyncio

import pytest

from fake_devices.hardware import Health, NodeHardware
from testbed.controlplane.cluster import ClusterState
from testbed.drivers import KINDS, load_profile
from testbed.kubeapi import ApiError, KubeClient, Obj
from testbed.kubeletplugin import slices
from testbed.kubeletplugin.slices import SlicePublisher, SliceSpec, SliceWatcher, desired_slices

pytestmark = pytest.mark.controlplane
GPU = "gpu.dra-testbed.io"


def _gpu_slices(hardware: NodeHardware) -> list[SliceSpec]:
    """What the GPU driver publishes for this hardware now."""
    devices, pools = KINDS[GPU].select(hardware.devices(), hardware.pools())
    return desired_slices(GPU, hardware.node, devices, pools, hardware.health())


def test_publication_is_idempotent_bumps_generation_and_removes_stale_slices(
    control_plane: ClusterState,
) -> None:
    node = "publish-node"
    hardware = NodeHardware(node, load_profile("h100x8"))

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        publisher = SlicePublisher(client, GPU, node)

        def specs() -> list[SliceSpec]:
            return _gpu_slices(hardware)

        try:
            assert await publisher.publish(specs())
            first = await publisher.existing(consistent=True)
            assert len(first) == 3  # counters + two device slices of <= 64
            assert {s["spec"]["pool"]["generation"] for s in first} == {1}
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in first} == {3}
            writes = publisher.writes
            assert not await publisher.publish(specs()), "unchanged content is not rewritten"
            assert publisher.writes == writes

            hardware.set_health("gpu-1", Health.UNHEALTHY, "overheating")
            assert await publisher.publish(specs())
            now = await publisher.existing(consistent=True)
            tainted = {d["name"] for s in now for d in s["spec"].get("devices", []) if d.get("taints")}
            assert "gpu-1" in tainted and "gpu-1-3g40gb-4" in tainted
            assert not await publisher.publish(specs()), "the API's timeAdded on taints is not a change"

            for gpu in range(1, 8):  # seven GPUs fall off the bus
                hardware.lose_device(f"gpu-{gpu}")
            assert await publisher.publish(specs())
            last = await publisher.existing(consistent=True)
            assert len(last) == 2, "the emptied device slice is deleted"
            assert {s["spec"]["pool"]["generation"] for s in last} == {3}
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in last} == {2}
            assert len([d for s in last for d in s["spec"].get("devices", [])]) == 13
        finally:
            await publisher.remove_all()
            await client.close()

    asyncio.run(scenario())


def test_the_publisher_lists_only_when_it_must_and_heals_what_others_changed(
    control_plane: ClusterState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unchanged content costs no API call; a conflict or a slice deleted behind its back
    is repaired by listing again."""
    node = "publish-node-2"
    hardware = NodeHardware(node, load_profile("tiny"))

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        publisher = SlicePublisher(client, GPU, node)

        def specs() -> list[SliceSpec]:
            return _gpu_slices(hardware)

        try:
            publisher.assume_none_exist()  # a new node: no LIST before the first write
            real_existing = publisher.existing

            async def must_not_list(consistent: bool = False) -> list[dict[str, object]]:
                raise AssertionError("listed although it knew what it had written")

            monkeypatch.setattr(publisher, "existing", must_not_list)
            assert await publisher.publish(specs())
            assert not await publisher.publish(specs())
            monkeypatch.setattr(publisher, "existing", real_existing)

            # someone else rewrites a slice: our next write conflicts, the one after lists and wins
            [victim, *_] = await publisher.existing(consistent=True)
            victim["metadata"]["labels"] = {"edited-by": "someone-else"}
            await client.replace(f"/apis/resource.k8s.io/v1/resourceslices/{victim['metadata']['name']}", victim)
            hardware.set_health("gpu-0", Health.UNHEALTHY, "xid")
            with pytest.raises(ApiError) as conflict:
                await publisher.publish(specs())
            assert conflict.value.status == 409
            async with asyncio.timeout(30):  # the watch cache catches up; retries as the driver's loop does
                while True:
                    try:
                        if await publisher.publish(specs()):
                            break
                    except ApiError:
                        await asyncio.sleep(0.2)

            # a slice deleted behind its back comes back at the next periodic look
            names = {s["metadata"]["name"] for s in await publisher.existing(consistent=True)}
            await client.delete_if_exists(f"/apis/resource.k8s.io/v1/resourceslices/{sorted(names)[0]}")
            monkeypatch.setattr(slices, "RELIST_S", 0.0)
            async with asyncio.timeout(30):
                while {s["metadata"]["name"] for s in await publisher.existing(consistent=True)} != names:
                    await publisher.publish(specs())
                    await asyncio.sleep(0.2)
        finally:
            await publisher.remove_all()
            await client.close()

    asyncio.run(scenario())


def test_a_slice_deleted_since_it_was_written_is_made_again_by_the_next_write(control_plane: ClusterState) -> None:
    """A restarting kubelet wipes its node's slices; the driver's next write meets a slice
    that is gone. It creates it there and then: before, the write failed (404), the
    driver logged a warning and the slices were back only at its next try."""
    node = "publish-node-3"
    hardware = NodeHardware(node, load_profile("tiny"))

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        publisher = SlicePublisher(client, GPU, node)

        def specs() -> list[SliceSpec]:
            return _gpu_slices(hardware)

        try:
            assert await publisher.publish(specs())
            names = {s["metadata"]["name"] for s in await publisher.existing(consistent=True)}
            for name in names:  # what a kubelet does as it restarts
                await client.delete_if_exists(f"/apis/resource.k8s.io/v1/resourceslices/{name}")
            hardware.set_health("gpu-0", Health.UNHEALTHY, "xid")
            assert await publisher.publish(specs())
            back = await publisher.existing(consistent=True)
            assert {s["metadata"]["name"] for s in back} == names
            tainted = {d["name"] for s in back for d in s["spec"].get("devices", []) if d.get("taints")}
            assert "gpu-0" in tainted
        finally:
            await publisher.remove_all()
            await client.close()

    asyncio.run(scenario())


def test_a_host_watches_the_slices_of_its_own_nodes_across_a_change_of_them(control_plane: ClusterState) -> None:
    """A NodeHost's one slice watch selects its nodes: another host's slices never reach
    it, and after it takes on a node the watch goes on where it was, so a slice deleted
    behind a publisher's back is still seen and republished."""
    first, second, elsewhere = "host-node-a", "host-node-b", "other-host-node"
    hardware = {name: NodeHardware(name, load_profile("tiny")) for name in (first, second, elsewhere)}

    def specs(node: str):  # type: ignore[no-untyped-def]
        h = hardware[node]
        return desired_slices(GPU, node, *KINDS[GPU].select(h.devices(), h.pools()), h.health())

    class Spy(SlicePublisher):
        def __init__(self, client: KubeClient, node: str) -> None:
            super().__init__(client, GPU, node)
            self.events: list[str] = []

        def observe(self, kind: str, obj: Obj) -> None:
            self.events.append(kind)
            super().observe(kind, obj)

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        watcher = SliceWatcher.for_host(client)
        publishers = {name: Spy(client, name) for name in (first, second, elsewhere)}
        try:
            await watcher.watch_nodes([first])
            watcher.start()
            for name in (first, elsewhere):
                watcher.add(name, publishers[name])  # the other host's node is known, never watched
                publishers[name].assume_none_exist()
                assert await publishers[name].publish(specs(name))
            async with asyncio.timeout(30):
                while "ADDED" not in publishers[first].events:
                    await asyncio.sleep(0.05)

            await watcher.watch_nodes([first, second])  # the host takes on a node
            watcher.add(second, publishers[second])
            publishers[second].assume_none_exist()
            assert await publishers[second].publish(specs(second))
            [victim] = [s["metadata"]["name"] for s in await publishers[first].existing(consistent=True)][:1]
            await client.delete_if_exists(f"/apis/resource.k8s.io/v1/resourceslices/{victim}")
            async with asyncio.timeout(30):  # seen by the watch, not by a periodic list (10 min away)
                while victim not in {s["metadata"]["name"] for s in await publishers[first].existing(True)}:
                    await publishers[first].publish(specs(first))
                    await asyncio.sleep(0.1)
            assert "DELETED" in publishers[first].events
            assert publishers[elsewhere].events == []
        finally:
            await watcher.stop()
            for publisher in publishers.values():
                await publisher.remove_all()
            await client.close()

    asyncio.run(scenario())


def test_a_slice_deleted_while_the_publisher_writes_or_lists_is_published_again(
    control_plane: ClusterState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starting kubelet wipes its node's slices once, at a moment of its own: the
    deletion may land while the driver is creating them, or while it lists them. The
    publisher must not go on believing in slices that are gone (a node whose driver
    never published again was how this showed, once in a CI run)."""
    node = "publish-node-race"
    hardware = NodeHardware(node, load_profile("tiny"))

    def specs():  # type: ignore[no-untyped-def]
        return desired_slices(GPU, node, *KINDS[GPU].select(hardware.devices(), hardware.pools()), hardware.health())

    class Spy(SlicePublisher):
        def __init__(self, client: KubeClient) -> None:
            super().__init__(client, GPU, node)
            self.deleted: list[str] = []

        def observe(self, kind: str, obj: Obj) -> None:
            if kind == "DELETED":
                self.deleted.append(str(obj["metadata"]["name"]))
            super().observe(kind, obj)

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        publisher = Spy(client)
        watcher = SliceWatcher.for_node(client, node, GPU)
        watcher.add(node, publisher)
        watcher.start()

        async def wipe(name: str) -> None:
            """Delete a slice as a kubelet would, and wait until the publisher has heard."""
            publisher.deleted.clear()
            await client.delete_if_exists(f"/apis/resource.k8s.io/v1/resourceslices/{name}")
            async with asyncio.timeout(30):
                while name not in publisher.deleted:
                    await asyncio.sleep(0.02)

        async def published() -> set[str]:
            return {s["metadata"]["name"] for s in await publisher.existing(consistent=True)}

        wanted = {s.name for s in specs()}
        try:
            async with asyncio.timeout(30):
                await watcher.wait_synced()

            # 1. deleted between the API server's answer to the create and its arrival
            real_create = client.create

            async def create_then_lose_it(path: str, obj: dict[str, object], **kwargs: object) -> dict[str, object]:
                written = await real_create(path, obj, **kwargs)  # type: ignore[arg-type]
                await wipe(str(written["metadata"]["name"]))  # type: ignore[index]
                return written

            monkeypatch.setattr(client, "create", create_then_lose_it)
            publisher.assume_none_exist()
            assert await publisher.publish(specs())
            monkeypatch.setattr(client, "create", real_create)
            assert publisher.disturbed.is_set(), "the loop is woken"
            assert await publisher.publish(specs()), "the lost slices are written again"
            assert await published() == wanted

            # 2. deleted after the list was answered, before the publisher read the answer
            real_existing = publisher.existing

            async def list_then_lose_one(consistent: bool = False) -> list[dict[str, object]]:
                answer = await real_existing(consistent)
                await wipe(str(answer[0]["metadata"]["name"]))
                return answer

            publisher.recheck()
            publisher.disturbed.clear()
            monkeypatch.setattr(publisher, "existing", list_then_lose_one)
            assert not await publisher.publish(specs()), "by the stale list nothing is missing"
            monkeypatch.setattr(publisher, "existing", real_existing)
            assert publisher.disturbed.is_set()
            assert await publisher.publish(specs()), "the next call lists again and writes"
            assert await published() == wanted
        finally:
            await watcher.stop()
            await publisher.remove_all()
            await client.close()

    asyncio.run(scenario())


def test_a_restarted_driver_finds_its_shared_ports_published_as_the_api_returns_them(
    control_plane: ClusterState,
) -> None:
    """A shared NIC's capacities and request policies come back from the API server in
    its canonical quantity form; a driver that published them otherwise would rewrite its
    slices at every start and every re-list."""
    nic = "nic.dra-testbed.io"
    hardware = NodeHardware("shared-nic-node", load_profile("shared-nic"))
    devices, pools = KINDS[nic].select(hardware.devices(), hardware.pools())
    specs = desired_slices(nic, hardware.node, devices, pools, hardware.health())

    async def scenario() -> None:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        first = SlicePublisher(client, nic, hardware.node)
        try:
            assert await first.publish(specs)
            [published] = await first.existing(consistent=True)
            port = published["spec"]["devices"][0]
            assert port["allowMultipleAllocations"] is True
            assert port["capacity"]["bandwidth"]["requestPolicy"]["default"] == "25G"
            restarted = SlicePublisher(client, nic, hardware.node)
            assert not await restarted.publish(specs), "what the API returned differs from what was published"
            assert restarted.writes == 0
        finally:
            await first.remove_all()
            await client.close()

    asyncio.run(scenario())
