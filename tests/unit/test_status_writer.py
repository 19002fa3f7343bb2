"""The fake kubelet's pod status writes through an API server outage, as the kubelet's
status manager makes them: written again later, in order, until they land or the pod is
gone; a pod's worker goes on meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from testbed.kubeapi import ApiError, KubeClient, Obj
from testbed.kubelet.node import NodeSpec
from testbed.kubelet.plugins import PluginManager
from testbed.kubelet.pods import PodManager
from testbed.kubelet.statuswriter import StatusWriter
from testbed.tasks import cancel_and_wait

POD = {"metadata": {"namespace": "ns", "name": "p", "uid": "u1", "generation": 1}}


class Outage:
    """An API server that answers 503 to the first ``failures`` writes, then takes them."""

    def __init__(self, failures: int, gone_after: int | None = None):
        self.failures, self.gone_after = failures, gone_after
        self.written: list[tuple[str, Obj | None]] = []
        self.events: list[Obj] = []
        self.tries = 0

    def _answer(self) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise ApiError(503, "ServiceUnavailable", "etcdserver: leader changed")
        if self.gone_after is not None and len(self.written) >= self.gone_after:
            raise ApiError(404, "NotFound", 'pods "p" not found')

    async def patch(self, path: str, body: Obj, kind: str) -> Obj:
        self._answer()
        self.written.append(("patch", body["status"]))
        return {}

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        self._answer()
        self.written.append(("delete", None))
        return {}

    async def create(self, path: str, body: Obj) -> Obj:
        self.events.append(body)
        return body


async def _until(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_writes_the_api_server_could_not_take_land_later_in_the_order_meant() -> None:
    api = Outage(failures=2)
    writer = StatusWriter(cast(KubeClient, api), sync_s=0.05)

    async def scenario() -> None:
        await writer.patch(POD, {"status": {"phase": "Pending"}})  # 503: kept
        await writer.patch(POD, {"status": {"phase": "Running"}})  # behind it, not sent first
        await writer.delete(POD)
        assert writer.waiting("u1") == 3 and api.written == []
        await _until(lambda: not writer.waiting("u1"))
        await writer.stop()

    asyncio.run(scenario())
    assert api.written == [("patch", {"phase": "Pending"}), ("patch", {"phase": "Running"}), ("delete", None)]


class SlowFirst(Outage):
    """An API server whose first answer takes a while: a request sent after it would land first."""

    async def patch(self, path: str, body: Obj, kind: str) -> Obj:
        if not self.tries:
            self.tries += 1
            await asyncio.sleep(0.05)
        self.written.append(("patch", body["status"]))
        return {}


def test_writes_made_at_once_for_one_pod_land_one_after_the_other_in_the_order_made() -> None:
    """The pod's worker and its spec-change sync write beside each other: the generation
    observed later must not be undone by one observed before it that landed after."""
    api = SlowFirst(failures=0)
    writer = StatusWriter(cast(KubeClient, api), sync_s=0.05)
    other = {"metadata": {**POD["metadata"], "uid": "u2", "name": "q"}}

    async def scenario() -> None:
        await asyncio.gather(
            writer.patch(POD, {"status": {"observedGeneration": 2}}),
            writer.patch(POD, {"status": {"observedGeneration": 3}}),
            writer.patch(other, {"status": {"observedGeneration": 1}}),
        )

    asyncio.run(scenario())
    assert api.written == [
        ("patch", {"observedGeneration": 1}),  # another pod's write does not wait
        ("patch", {"observedGeneration": 2}),
        ("patch", {"observedGeneration": 3}),
    ]


def test_a_pod_gone_is_told_at_once_and_what_waited_for_it_is_dropped() -> None:
    async def gone_now() -> None:
        writer = StatusWriter(cast(KubeClient, Outage(failures=0, gone_after=0)), sync_s=0.05)
        with pytest.raises(ApiError) as raised:
            await writer.patch(POD, {"status": {"phase": "Running"}})
        assert raised.value.not_found and not writer.waiting("u1")

    asyncio.run(gone_now())

    api = Outage(failures=1, gone_after=1)
    writer = StatusWriter(cast(KubeClient, api), sync_s=0.05)

    async def gone_meanwhile() -> None:
        for phase in ("Pending", "Running", "Succeeded"):
            await writer.patch(POD, {"status": {"phase": phase}})
        await _until(lambda: not writer.waiting("u1"))
        await writer.stop()

    asyncio.run(gone_meanwhile())
    assert api.written == [("patch", {"phase": "Pending"})]


def test_a_pod_whose_running_status_met_an_outage_is_shown_running_once_the_api_server_is_back(
    tmp_path: Path,
) -> None:
    """Its worker stopped on the error before: the pod stayed Pending in the API while the
    node ran it, until something changed its spec."""
    api = Outage(failures=3)
    manager = PodManager(cast(KubeClient, api), NodeSpec("node"), cast(PluginManager, None), tmp_path / "cdi")
    manager._statuses.sync_s = 0.05
    main = {"name": "main", "image": "registry.invalid/work:v1", "command": ["sleep", "3600"]}
    pod = {"metadata": POD["metadata"], "spec": {"containers": [main]}, "status": {"phase": "Pending"}}

    async def scenario() -> None:
        manager.observe("ADDED", pod)
        await _until(lambda: any(s.get("phase") == "Running" for _, s in api.written if s))
        assert "u1" in manager._workers, "its worker goes on"
        await cancel_and_wait(*manager._workers.values())
        await manager.stop()

    asyncio.run(scenario())
    assert [s["phase"] for _, s in api.written if s] == ["Running"]
