"""The fake kubelet's book of claims, as kubelet v1.37's DRA manager keeps it: by
namespace and name, shared by pods, held while being unprepared, and reconciled."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from testbed.http11 import TransportError
from testbed.keys import CONTAINER_ENV_ANNOTATION
from testbed.kubeapi import ApiError, ClaimRef, KubeClient, Obj
from testbed.kubelet import dra, metrics
from testbed.kubelet.dra import (
    NO_RELATIONSHIP,
    StartFailed,
    _extended_requests,
    _not_made_for,
    _reserved_for,
    pod_claim_name,
)
from testbed.kubelet.node import NodeSpec
from testbed.kubelet.plugins import PluginCallError, PluginManager, PreparedDevice
from testbed.kubelet.pods import PodManager, _differs_beyond_status, _own_write

DRIVER = "gpu.dra-testbed.io"


class Driver:
    """What the pod manager asks of its plugin manager: one driver, whose unprepare can
    be made to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.failing = False

    def plugin_for(self, driver: str) -> object:
        return object()

    async def prepare(self, driver: str, claims: list[ClaimRef]) -> dict[str, list[PreparedDevice]]:
        self.calls.append(("prepare", [c.name for c in claims]))
        return {c.uid: [PreparedDevice(["gpu"], "node", "gpu-0", [f"{driver}/gpu=x"], driver)] for c in claims}

    async def unprepare(self, driver: str, claims: list[ClaimRef]) -> None:
        self.calls.append(("unprepare", [c.name for c in claims]))
        if self.failing:
            raise PluginCallError("NodeUnprepareResources failed for ResourceClaim x: busy")


def claim(name: str, uid: str) -> Obj:
    results = [{"driver": DRIVER, "pool": "node", "device": "gpu-0", "request": "gpu"}]
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def pod_manager(tmp_path: Path, driver: Driver, api: object = None) -> PodManager:
    return PodManager(
        cast(KubeClient, api),
        NodeSpec("node"),
        cast(PluginManager, driver),
        tmp_path / "cdi",
        checkpoint=tmp_path / "dra_manager_state.json",
    )


@pytest.fixture
def book(tmp_path: Path) -> tuple[PodManager, Driver]:
    driver = Driver()
    return pod_manager(tmp_path, driver), driver


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_shared_claim_is_prepared_once_and_unprepared_after_its_last_user(
    book: tuple[PodManager, Driver],
) -> None:
    manager, driver = book
    run(manager.dra.prepare_claims("pod-a", [claim("shared", "u1")]))
    run(manager.dra.prepare_claims("pod-b", [claim("shared", "u1")]))
    assert driver.calls == [("prepare", ["shared"])]
    assert run(manager.dra.release("pod-a"))
    assert driver.calls == [("prepare", ["shared"])], "another pod still uses it"
    assert run(manager.dra.release("pod-b"))
    assert driver.calls[-1] == ("unprepare", ["shared"])
    assert manager.dra.claims == {}


def test_a_claim_being_unprepared_is_refused_to_new_pods_until_the_driver_succeeds(
    book: tuple[PodManager, Driver],
) -> None:
    manager, driver = book
    run(manager.dra.prepare_claims("pod-a", [claim("held", "u1")]))
    driver.failing = True
    assert not run(manager.dra.release("pod-a"))
    with pytest.raises(StartFailed, match="prepare dynamic resources: ResourceClaim held is being unprepared"):
        run(manager.dra.prepare_claims("pod-b", [claim("held", "u1")]))
    with pytest.raises(
        StartFailed,
        match=r"old ResourceClaim with same name held and different UID u1 still exists \(previous pod force-deleted",
    ):
        run(manager.dra.prepare_claims("pod-c", [claim("held", "u2")]))
    calls = len(driver.calls)
    assert run(manager.dra.release("pod-b")), "a pod refused before it was recorded holds nothing"
    assert len(driver.calls) == calls
    driver.failing = False
    assert run(manager.dra.release("pod-a"))
    run(manager.dra.prepare_claims("pod-c", [claim("held", "u2")]))
    assert [c for c in driver.calls if c[0] == "prepare"] == [("prepare", ["held"])] * 2
    assert set(manager.dra.claims) == {"u2"}


def test_a_pod_refused_on_its_second_claim_keeps_its_first_to_be_unprepared(
    book: tuple[PodManager, Driver],
) -> None:
    """As the kubelet records claims one by one: those before the refused one stay."""
    manager, driver = book
    run(manager.dra.prepare_claims("pod-a", [claim("held", "u1")]))
    driver.failing = True
    run(manager.dra.release("pod-a"))
    with pytest.raises(StartFailed, match="being unprepared"):
        run(manager.dra.prepare_claims("pod-b", [claim("own", "u3"), claim("held", "u1")]))
    assert manager.dra.claims["u3"].users == {"pod-b"}
    driver.failing = False
    assert run(manager.dra.release("pod-b"))
    assert ("unprepare", ["own"]) in driver.calls
    assert "u3" not in manager.dra.claims


def test_reconcile_unprepares_claims_of_pods_that_are_gone_and_leaves_the_others(
    book: tuple[PodManager, Driver],
) -> None:
    manager, driver = book
    run(manager.dra.prepare_claims("gone", [claim("orphaned", "u1")]))
    run(manager.dra.prepare_claims("running", [claim("kept", "u2")]))
    run(manager.dra.prepare_claims("gone", [claim("shared", "u3")]))
    run(manager.dra.prepare_claims("running", [claim("shared", "u3")]))
    driver.calls.clear()
    run(manager.dra.reconcile_once({"running"}))
    assert driver.calls == [("unprepare", ["orphaned"])]
    assert set(manager.dra.claims) == {"u2", "u3"}
    assert manager.dra.claims["u3"].users == {"running"}


def restart(manager: PodManager, driver: Driver) -> PodManager:
    """Another kubelet on the same node, as it starts: with what the checkpoint holds."""
    restarted = PodManager(
        cast(KubeClient, None),
        NodeSpec("node"),
        cast(PluginManager, driver),
        manager.dra.cdi_dir,
        checkpoint=manager.dra.checkpoint,
    )
    restarted.dra.load_checkpoint()
    return restarted


def test_the_unpreparing_mark_is_not_kept_across_a_restart(book: tuple[PodManager, Driver], tmp_path: Path) -> None:
    """As the kubelet restores its claim info: the reconcile, not a mark, unprepares it."""
    manager, driver = book
    run(manager.dra.prepare_claims("pod-a", [claim("held", "u1")]))
    driver.failing = True
    run(manager.dra.release("pod-a"))
    restarted = restart(manager, driver)
    assert restarted.dra.claims["u1"].users == {"pod-a"}
    assert not restarted.dra.claims["u1"].unpreparing


def test_a_restarted_kubelet_knows_every_claim_as_it_was_but_not_yet_prepared(
    book: tuple[PodManager, Driver], tmp_path: Path
) -> None:
    manager, driver = book
    run(manager.dra.prepare_claims("pod-a", [claim("one", "u1"), claim("two", "u2")]))
    run(manager.dra.prepare_claims("pod-b", [claim("two", "u2")]))
    restarted = restart(manager, driver)
    assert restarted.dra.claims["u2"].users == {"pod-a", "pod-b"} and restarted.dra.claims["u2"].devices
    assert restarted.dra.claims == {
        uid: dataclasses.replace(c, prepared=False) for uid, c in manager.dra.claims.items()
    }


@pytest.mark.parametrize(
    ("entry", "status", "expected"),
    [
        ({"name": "c", "resourceClaimName": "mine"}, [], ("mine", False)),
        (
            {"name": "c", "resourceClaimTemplateName": "t"},
            [{"name": "c", "resourceClaimName": "pod-c-x"}],
            ("pod-c-x", True),
        ),
        ({"name": "c", "resourceClaimTemplateName": "t"}, [{"name": "c"}], (None, True)),
    ],
)
def test_pod_claim_names_resolve_as_the_kubelet_resolves_them(
    entry: Obj, status: list[Obj], expected: tuple[str | None, bool]
) -> None:
    pod = {"metadata": {"namespace": "ns", "name": "p"}, "status": {"resourceClaimStatuses": status}}
    assert pod_claim_name(pod, entry) == expected


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"name": "c", "resourceClaimTemplateName": "t"}, 'pod "ns/p": ResourceClaim not created yet'),
        ({"name": "c"}, 'pod "ns/p", spec.resourceClaim "c": none of the supported fields are set'),
    ],
)
def test_a_claim_that_cannot_be_named_fails_in_the_kubelets_words(entry: Obj, words: str) -> None:
    pod = {"metadata": {"namespace": "ns", "name": "p"}, "status": {}}
    with pytest.raises(StartFailed) as failed:
        pod_claim_name(pod, entry)
    assert str(failed.value) == f"Failed to prepare dynamic resources: prepare dynamic resources: {words}"


def test_a_container_gets_the_extended_resource_requests_mapped_to_what_it_asks_for() -> None:
    resource = "deviceclass.resource.kubernetes.io/gpu.dra-testbed.io"
    mappings = [
        {"containerName": "main", "resourceName": resource, "requestName": "container-0-request-0"},
        {"containerName": "side", "resourceName": resource, "requestName": "container-1-request-0"},
    ]
    pod = {"status": {"extendedResourceClaimStatus": {"resourceClaimName": "x", "requestMappings": mappings}}}
    assert _extended_requests(pod, {"name": "main", "resources": {"requests": {resource: "1"}}}) == [
        "container-0-request-0"
    ]
    assert _extended_requests(pod, {"name": "side", "resources": {"requests": {resource: "0"}}}) == []
    assert _extended_requests(pod, {"name": "side", "resources": {}}) == []
    assert _extended_requests({"status": {}}, {"name": "main", "resources": {"requests": {resource: "1"}}}) == []


def test_claims_in_use_are_counted_by_driver_and_once_across_drivers(book: tuple[PodManager, Driver]) -> None:
    """As the kubelet's dra_resource_claims_in_use: prepared claims only."""
    manager, _ = book

    def in_use() -> dict[str, float]:
        return {
            s.labels["driver_name"]: s.value
            for family in REGISTRY.collect()
            if family.name == "dra_resource_claims_in_use"
            for s in family.samples
        }

    metrics.CLAIMS_IN_USE.books.add(manager.dra)
    try:
        assert in_use() == {"<any>": 0}
        run(manager.dra.prepare_claims("pod-a", [claim("one", "u1")]))
        pair = claim("pair", "u2")
        pair["status"]["allocation"]["devices"]["results"].append(
            {"driver": "nic.dra-testbed.io", "pool": "node", "device": "nic-0", "request": "nic"}
        )
        run(manager.dra.prepare_claims("pod-a", [pair]))
        assert in_use() == {"<any>": 2, DRIVER: 2, "nic.dra-testbed.io": 1}
        run(manager.dra.release("pod-a"))
        assert in_use() == {"<any>": 0}
    finally:
        metrics.CLAIMS_IN_USE.books.discard(manager.dra)


@pytest.mark.parametrize("content", ["{not json", '[{"uid": "u1"}]', '[{"namespace": "ns", "devices": 3}]'])
def test_an_unreadable_checkpoint_is_set_aside_not_overwritten(tmp_path: Path, content: str) -> None:
    checkpoint = tmp_path / "dra_manager_state.json"
    checkpoint.write_text(content)
    manager = PodManager(
        cast(KubeClient, None), NodeSpec("node"), cast(PluginManager, Driver()), tmp_path, checkpoint=checkpoint
    )
    manager.dra.load_checkpoint()
    assert manager.dra.claims == {}
    [moved] = tmp_path.glob("dra_manager_state.json.corrupt-*")
    assert moved.read_text() == content and not checkpoint.exists()
    run(manager.dra.prepare_claims("pod-a", [claim("one", "u1")]))
    assert moved.read_text() == content, "the next save goes to a new file"


def test_no_claim_is_reconciled_before_the_pods_of_the_node_are_known(book: tuple[PodManager, Driver]) -> None:
    """Before its pod watch listed, every pod looks gone: unpreparing then would take the
    devices of running pods. Fed by someone else's watch, it never knows, and never does."""
    manager, _ = book
    assert not manager._pods_listed()
    manager._position.resource_version = "42"
    assert manager._pods_listed()
    manager.watch_pods = False
    assert not manager._pods_listed()


def test_only_a_change_beyond_the_status_wakes_a_pods_worker() -> None:
    """As the kubelet's pod config: spec, labels, annotations and deletion make a pod
    sync again at once; a status-only change (another component's write) does not."""
    pod: dict[str, Any] = {"metadata": {"name": "p", "labels": {"a": "1"}}, "spec": {"containers": []}, "status": {}}
    status_only = {**pod, "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled"}]}}
    assert not _differs_beyond_status(pod, status_only)
    for change in (
        {"metadata": {**pod["metadata"], "annotations": {"example.com/retry": "now"}}},
        {"metadata": {**pod["metadata"], "labels": {"a": "2"}}},
        {"metadata": {**pod["metadata"], "deletionTimestamp": "2026-11-23T00:00:00Z"}},
        {"spec": {"containers": [], "activeDeadlineSeconds": 5}},
    ):
        assert _differs_beyond_status(pod, {**pod, **change}), change


def test_the_kubelets_own_container_env_annotation_syncs_no_running_pod_again() -> None:
    """The fake kubelet writes the container-env annotation with the Running status; a
    user's annotation or label beside it, or any other change, is a change to sync for."""
    pod: dict[str, Any] = {"metadata": {"name": "p", "annotations": {"x": "1"}}, "spec": {"containers": []}}
    written = {**pod, "metadata": {"name": "p", "annotations": {"x": "1", CONTAINER_ENV_ANNOTATION: "{}"}}}
    assert _own_write(pod, written)
    assert not _own_write(written, {**written, "metadata": {**written["metadata"], "labels": {"a": "1"}}})
    both = {**pod, "metadata": {"name": "p", "annotations": {"x": "2", CONTAINER_ENV_ANNOTATION: "{}"}}}
    assert not _own_write(pod, both)
    assert not _own_write(pod, {**pod, "metadata": {"name": "p", "annotations": {"x": "2"}}})


class LaggingAuthorizer:
    """An API server whose node authorizer links the pod's claim to the node only after
    refusing ``refusals`` reads, as it does for a pod bound a moment ago."""

    def __init__(self, claim: Obj, refusals: int) -> None:
        self.claim = claim
        self.refusals = refusals
        self.reads = 0

    async def get(self, path: str, retry_unreachable: bool = True) -> Obj:
        self.reads += 1
        if self.reads <= self.refusals:
            raise ApiError(
                403, "Forbidden", f'resourceclaims "c" is forbidden: {NO_RELATIONSHIP} "node" and this object'
            )
        return self.claim


def prepare_durations() -> tuple[float, float]:
    labels = {"operation_name": "PrepareResources", "is_error": "false"}
    count = REGISTRY.get_sample_value("dra_operations_duration_seconds_count", labels) or 0.0
    return count, REGISTRY.get_sample_value("dra_operations_duration_seconds_sum", labels) or 0.0


def test_prepare_resources_is_timed_from_the_read_the_node_authorizer_allowed(
    book: tuple[PodManager, Driver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real kubelet prepares only after mounting the pod's volumes, by when the node
    authorizer has caught up: the refused reads stand in for that wait, which the
    kubelet's dra_operations_duration_seconds does not count."""
    manager, driver = book
    monkeypatch.setattr(dra, "AUTHORIZER_CATCH_UP_S", (0.4, 0.4))
    bound = claim("c", "u1")
    bound["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-a"}]
    api = LaggingAuthorizer(bound, refusals=2)
    manager.dra.client = cast(KubeClient, api)
    pod = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "pod-a"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}], "containers": []},
        "status": {},
    }
    count, total = prepare_durations()
    waits = REGISTRY.get_sample_value("dra_testbed_kubelet_claim_link_wait_seconds_sum") or 0.0
    began = time.perf_counter()
    run(manager.dra.prepare(pod))
    took = time.perf_counter() - began
    assert api.reads == 3 and driver.calls == [("prepare", ["c"])]
    new_count, new_total = prepare_durations()
    assert new_count == count + 1
    assert took >= 0.8, "the pod's start still waited for the authorizer"
    waited = (REGISTRY.get_sample_value("dra_testbed_kubelet_claim_link_wait_seconds_sum") or 0.0) - waits
    assert 0.8 <= waited <= took
    # The two spans follow each other within the call: counted in both, they would
    # exceed it by the wait. (Not a bound on the prepare itself: a loaded CI machine's
    # checkpoint write alone has taken seconds.)
    assert (new_total - total) + waited <= took + 0.05, "the refused reads are not part of PrepareResources"
    waits_counted = REGISTRY.get_sample_value("dra_testbed_kubelet_claim_link_wait_seconds_count")
    api.reads, api.refusals = 0, 0
    run(manager.dra.prepare(pod))
    assert REGISTRY.get_sample_value("dra_testbed_kubelet_claim_link_wait_seconds_count") == waits_counted, (
        "a pod read at once did not wait"
    )


def test_a_read_refused_to_the_end_fails_the_start_in_the_kubelets_words(
    book: tuple[PodManager, Driver], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, driver = book
    monkeypatch.setattr(dra, "AUTHORIZER_CATCH_UP_S", (0.0, 0.0))
    manager.dra.client = cast(KubeClient, LaggingAuthorizer(claim("c", "u1"), refusals=3))
    pod = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "pod-a"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}], "containers": []},
        "status": {},
    }
    with pytest.raises(StartFailed, match=f"fetch ResourceClaim c: .*{NO_RELATIONSHIP}"):
        run(manager.dra.prepare(pod))
    assert driver.calls == []


class GatedDriver(Driver):
    """A driver whose calls wait at a gate, counting how many are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.entered: asyncio.Queue[str] = asyncio.Queue()

    async def _through_gate(self, call: Any) -> Any:
        self.in_flight += 1
        try:
            await self.entered.put("in")
            await self.gate.wait()
            return await call
        finally:
            self.in_flight -= 1

    async def prepare(self, driver: str, claims: list[ClaimRef]) -> dict[str, list[PreparedDevice]]:
        return cast(dict[str, list[PreparedDevice]], await self._through_gate(super().prepare(driver, claims)))

    async def unprepare(self, driver: str, claims: list[ClaimRef]) -> None:
        await self._through_gate(super().unprepare(driver, claims))


class Claims:
    """An API server that lets the node read every claim, each reserved for its pod."""

    def __init__(self) -> None:
        self.by_name: dict[str, Obj] = {}

    def add(self, name: str, uid: str, pod_uid: str) -> Obj:
        bound = claim(name, uid)
        bound["status"]["reservedFor"] = [{"resource": "pods", "name": pod_uid, "uid": pod_uid}]
        self.by_name[name] = bound
        return {
            "metadata": {"namespace": "ns", "name": pod_uid, "uid": pod_uid},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}], "containers": []},
            "status": {},
        }

    async def get(self, path: str, retry_unreachable: bool = True) -> Obj:
        return self.by_name[path.rsplit("/", 1)[1]]


def gated_book(tmp_path: Path) -> tuple[PodManager, GatedDriver, Claims]:
    driver, api = GatedDriver(), Claims()
    return pod_manager(tmp_path, driver, api), driver, api


def test_a_driver_is_called_for_several_pods_at_once_as_a_real_kubelets_pod_workers_call_it(tmp_path: Path) -> None:
    """The kubelet holds its claim cache's lock for bookkeeping only, never across
    NodePrepareResources or NodeUnprepareResources: a driver must cope with concurrent
    calls, and a fake kubelet that called it one pod at a time would hide that."""
    manager, driver, api = gated_book(tmp_path)
    old, first, second = api.add("old", "u3", "pod-c"), api.add("one", "u1", "pod-a"), api.add("two", "u2", "pod-b")

    async def scenario() -> None:
        driver.gate.set()
        await manager.dra.prepare(old)
        driver.gate.clear()
        starts = [asyncio.create_task(manager.dra.prepare(first)), asyncio.create_task(manager.dra.prepare(second))]
        release = asyncio.create_task(manager.dra.release("pod-c"))
        for _ in range(3):
            await asyncio.wait_for(driver.entered.get(), 5)
        assert driver.in_flight == 3, "two prepares and an unprepare, all waiting in the driver"
        driver.gate.set()
        await asyncio.wait_for(asyncio.gather(*starts, release), 5)

    run(scenario())
    assert manager.dra.claims["u1"].prepared and manager.dra.claims["u2"].prepared and "u3" not in manager.dra.claims


def test_a_claim_whose_unprepare_is_under_way_is_refused_to_a_new_pod_meanwhile(tmp_path: Path) -> None:
    manager, driver, api = gated_book(tmp_path)
    first = api.add("held", "u1", "pod-a")

    async def scenario() -> None:
        driver.gate.set()
        await manager.dra.prepare(first)
        driver.gate.clear()
        release = asyncio.create_task(manager.dra.release("pod-a"))
        await asyncio.wait_for(driver.entered.get(), 5)
        api.by_name["held"]["status"]["reservedFor"].append({"resource": "pods", "name": "pod-b", "uid": "pod-b"})
        second = {**first, "metadata": {"namespace": "ns", "name": "pod-b", "uid": "pod-b"}}
        with pytest.raises(StartFailed, match="ResourceClaim held is being unprepared"):
            await asyncio.wait_for(manager.dra.prepare(second), 5)
        driver.gate.set()
        assert await asyncio.wait_for(release, 5)

    run(scenario())
    assert manager.dra.claims == {}


def unprepare_counts() -> tuple[float, float]:
    """UnprepareResources observations so far: (succeeded, failed)."""
    return tuple(  # type: ignore[return-value]
        REGISTRY.get_sample_value(
            "dra_operations_duration_seconds_count", {"operation_name": "UnprepareResources", "is_error": error}
        )
        or 0.0
        for error in ("false", "true")
    )


def test_unprepare_resources_is_timed_once_per_pod_termination_as_the_kubelet_times_it(
    book: tuple[PodManager, Driver],
) -> None:
    """The kubelet times UnprepareResources in every terminated-pod sync, for every pod
    (with no claim to unprepare, or a claim others still use, too) and every failed
    attempt; never for its reconcile loop; and a pod synced as terminated (it completed)
    is not synced again when it is deleted. The real kubelet's counts are what a user
    compares the fake kubelet's with."""
    manager, driver = book
    ok, failed = unprepare_counts()
    run(manager.dra.prepare_claims("pod-a", [claim("shared", "u1")]))
    run(manager.dra.prepare_claims("pod-b", [claim("shared", "u1")]))
    run(manager._release("pod-a"))
    run(manager._release("pod-none"))
    assert unprepare_counts() == (ok + 2, failed), "a pod sharing a claim and a pod without one"
    assert driver.calls == [("prepare", ["shared"])]
    driver.failing = True
    assert not run(manager.dra.release("pod-b"))
    assert unprepare_counts() == (ok + 2, failed + 1)
    driver.failing = False
    run(manager._release("pod-b"))
    run(manager._release("pod-b"))
    assert unprepare_counts() == (ok + 3, failed + 1), "its deletion after it completed is not synced again"
    assert driver.calls[-1] == ("unprepare", ["shared"])

    run(manager.dra.prepare_claims("pod-gone", [claim("orphan", "u2")]))
    run(manager.dra.reconcile_once(active=set()))
    assert driver.calls[-1] == ("unprepare", ["orphan"])
    assert unprepare_counts() == (ok + 3, failed + 1), "the reconcile loop's unprepares are not timed"


class Deletions:
    """An API server that takes the kubelet's final pod deletes and counts them."""

    def __init__(self) -> None:
        self.deletes = 0

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        self.deletes += 1
        return {}


def test_a_deleted_pods_late_events_release_nothing_again_and_leave_nothing_behind(tmp_path: Path) -> None:
    """A pod being deleted sends several events (its deletionTimestamp, the kubelet's own
    final delete, DELETED); some come in after the pod was released. The kubelet syncs a
    terminated pod once: one UnprepareResources, and no state kept once it is gone."""
    api = Deletions()
    manager = pod_manager(tmp_path, Driver(), api)
    meta = {"namespace": "ns", "name": "p", "uid": "u", "deletionTimestamp": "2026-11-24T00:00:00Z"}
    pod = {"metadata": meta, "spec": {"containers": []}, "status": {"phase": "Running"}}

    async def settled() -> None:
        while manager._workers:
            await asyncio.wait_for(asyncio.gather(*manager._workers.values()), 5)

    async def scenario() -> None:
        manager.observe("MODIFIED", pod)
        await settled()
        manager.observe("MODIFIED", {**pod, "metadata": {**meta, "deletionGracePeriodSeconds": 0}})
        await settled()
        manager.observe("DELETED", pod)
        await settled()

    ok, failed = unprepare_counts()
    run(scenario())
    assert unprepare_counts() == (ok + 1, failed)
    assert api.deletes >= 1, "the kubelet deleted the pod once it was released"
    state = (manager._pods, manager._terminated, manager._workers)
    assert not any(state), state


class Restarting:
    """An API server that refuses connections (the supervisor is restarting it)."""

    def __init__(self) -> None:
        self.reads: list[bool] = []

    async def get(self, path: str, retry_unreachable: bool = True) -> Obj:
        self.reads.append(retry_unreachable)
        error = TransportError("cannot reach https://127.0.0.1:6443: [Errno 111] Connection refused")
        error.unreachable = True
        raise error


def test_a_claim_read_the_api_server_refuses_fails_the_start_as_a_real_kubelets_does(
    book: tuple[PodManager, Driver],
) -> None:
    """client-go retries a GET whose connection was reset, never one refused: a real
    kubelet's prepare fails while the API server restarts, and the pod waits for its next
    sync. A fake kubelet that waited for the API server would hide that delay."""
    manager, driver = book
    api = Restarting()
    manager.dra.client = cast(KubeClient, api)
    pod = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "pod-a"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}], "containers": []},
        "status": {},
    }
    with pytest.raises(StartFailed, match="prepare dynamic resources: fetch ResourceClaim c: cannot reach") as raised:
        run(manager.dra.prepare(pod))
    assert raised.value.reason == "FailedPrepareDynamicResources"
    assert api.reads == [False], "one read, not retried while refused"
    assert driver.calls == []


def _grouped_pod(group: str | None) -> Obj:
    spec: Obj = {"containers": []}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"namespace": "ns", "name": "p", "uid": "pod-a"}, "spec": spec}


def _owned_by(kind: str, name: str, uid: str, api_version: str = "scheduling.k8s.io/v1beta1") -> Obj:
    made = claim("c", "u1")
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}
    ]
    return made


def test_a_claim_made_for_a_pods_group_is_the_pods_to_use_and_no_other_groups() -> None:
    """DRAWorkloadResourceClaims: a PodGroup's claim is owned by the group, which a pod
    knows by name only; the kubelet's words when it is neither the pod's nor its group's."""
    assert _not_made_for(_grouped_pod(None), _owned_by("Pod", "p", "pod-a", "v1")) is None
    assert _not_made_for(_grouped_pod("trainers"), _owned_by("PodGroup", "trainers", "g1")) is None
    assert _not_made_for(_grouped_pod("trainers"), _owned_by("PodGroup", "others", "g2")) == (
        "ResourceClaim ns/c was not created for Pod ns/p (neither Pod nor PodGroup trainers is the owner)"
    )
    assert (
        _not_made_for(_grouped_pod("trainers"), _owned_by("PodGroup", "trainers", "g1", "example.com/v1")) is not None
    )
    assert _not_made_for(_grouped_pod(None), _owned_by("PodGroup", "trainers", "g1")) == (
        "ResourceClaim ns/c was not created for Pod ns/p (Pod is not owner)"
    )


def test_a_claim_reserved_for_a_pods_group_by_name_is_reserved_for_the_pod() -> None:
    reserved = claim("c", "u1")
    group = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "trainers", "uid": "g1"}
    reserved["status"]["reservedFor"] = [group]
    assert _reserved_for(_grouped_pod("trainers"), reserved)
    assert not _reserved_for(_grouped_pod("others"), reserved)
    assert not _reserved_for(_grouped_pod(None), reserved)
    reserved["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-a"}]
    assert _reserved_for(_grouped_pod(None), reserved)
