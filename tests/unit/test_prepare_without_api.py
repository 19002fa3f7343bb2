"""An API server that does not answer fails each claim that needs it, in time, alone.

A kubelet gives NodePrepareResources 45 s. Claims the driver's cache holds must still
prepare, claims it must read fail with their own error well within that, and an
unrelated unprepare must not wait behind the reads.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path

import pytest
from aiohttp import web

from fake_devices.hardware import NodeHardware
from testbed.drivers import KINDS, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.kubeapi import ClaimRef, Credentials, KubeClient, Obj
from testbed.kubeletplugin import prepare
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.prepare import ClaimPreparer, DriverPaths

GPU = "gpu.dra-testbed.io"
BUDGET_S = 3.0  # the claim reads' budget in these tests (a kubelet allows 45 s)


def _claim(name: str, uid: str, device: str) -> dict[str, object]:
    result = {"request": "gpu", "driver": GPU, "pool": "n", "device": device}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


@pytest.mark.parametrize("server", ["refuses", "never answers"])
def test_claims_the_api_must_answer_fail_alone_and_in_time(
    server: str, short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepare, "CLAIM_FETCH_BUDGET_S", BUDGET_S)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    if server == "never answers":
        silent.listen(16)  # connections complete in the kernel; nobody ever reads them
    port = silent.getsockname()[1]

    async def scenario() -> tuple[dict[str, prepare.PrepareResult], float, float]:
        client = KubeClient(Credentials(f"https://127.0.0.1:{port}", ssl.create_default_context()))

        class OneReadable(ClaimReader):
            """The API server answers for this one claim only (as if it had come back)."""

            async def get(self, namespace: str, name: str) -> Obj:
                if name == "cached":
                    return _claim("cached", "uid-cached", "gpu-0")
                return await super().get(namespace, name)

        cache = OneReadable(client)
        paths = DriverPaths.for_node(short_tmp_path / "kubelet", GPU, short_tmp_path / "cdi")
        driver = KINDS[GPU].make(LocalBackend(NodeHardware("n", load_profile("tiny"))), client)
        preparer = ClaimPreparer(driver, "n", paths, cache)
        await preparer.repair()
        refs = [ClaimRef("ns", "uid-cached", "cached"), ClaimRef("ns", "uid-a", "a"), ClaimRef("ns", "uid-b", "b")]
        started = time.monotonic()
        preparing = asyncio.create_task(preparer.prepare(refs))
        await asyncio.sleep(0.2)  # the reads are under way
        unprepare_started = time.monotonic()
        errors = await preparer.unprepare([ClaimRef("ns", "uid-other", "other")])
        unprepare_took = time.monotonic() - unprepare_started
        assert errors == {"uid-other": ""}
        results = await preparing
        await client.close()
        return results, time.monotonic() - started, unprepare_took

    try:
        results, took, unprepare_took = asyncio.run(scenario())
    finally:
        silent.close()
    assert results["uid-cached"].error == "" and results["uid-cached"].devices, "the cached claim prepared"
    for uid in ("uid-a", "uid-b"):
        assert results[uid].devices == []
        assert "claim ns/" in results[uid].error
        error = results[uid].error
        assert "no answer from the API server" in error or "cannot reach https://127.0.0.1" in error
    assert took < BUDGET_S + 1.5, f"each claim's error came in {took:.1f} s, within the budget"
    # The reads hold out for the whole budget; an unprepare queued behind them would
    # take most of it. Half the budget leaves a loaded machine room without blurring that.
    assert unprepare_took < BUDGET_S / 2, f"an unrelated unprepare waited {unprepare_took:.1f} s"


def test_a_claim_read_rides_out_an_api_server_restart() -> None:
    """An API server that refuses connections for a second and a half (as while the
    supervisor restarts it) and then answers: the driver's claim read waits for it,
    rather than failing the pod's prepare and leaving the pod for its kubelet's next
    sync, a minute or more later."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def claim(request: web.Request) -> web.Response:
        return web.json_response(_claim("a", "uid-a", "gpu-0"))

    async def scenario() -> Obj:
        client = KubeClient(Credentials(f"http://127.0.0.1:{port}", ssl.create_default_context()))
        reading = asyncio.create_task(ClaimReader(client).get("ns", "a"))
        await asyncio.sleep(1.5)  # the API server is down this long
        app = web.Application()
        app.router.add_get("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a", claim)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            return await asyncio.wait_for(reading, prepare.CLAIM_FETCH_BUDGET_S)
        finally:
            await client.close()
            await runner.cleanup()

    assert asyncio.run(scenario())["metadata"]["uid"] == "uid-a"
