"""A create whose answer was lost (the API server stored it, then failed to say so) and
that meets AlreadyExists on its retry is the same object, not an error: a run killed by
a 409 on its own Job after an etcd restart was the symptom."""

from __future__ import annotations

import asyncio
import pickle
import socket
import ssl

import pytest
from aiohttp import web

from testbed.fleet.identity import DriverPod, driver_token
from testbed.http11 import TransportError
from testbed.kubeapi import RETRY_ATTEMPTS, ApiError, Credentials, KubeClient, until_answered
from testbed.kubelet.node import NodeAgent, NodeSpec
from tests.unit.scripted_api import client_of

STATUS_409 = {"kind": "Status", "code": 409, "reason": "AlreadyExists", "message": "already exists"}


def test_a_retried_create_that_meets_already_exists_returns_the_object() -> None:
    async def scenario() -> tuple[dict[str, object], list[str]]:
        stored: dict[str, dict[str, object]] = {}
        seen: list[str] = []

        async def create(request: web.Request) -> web.Response:
            body = await request.json()
            name = body["metadata"]["name"]
            seen.append(f"POST {name}")
            if name in stored:
                return web.json_response(STATUS_409, status=409)
            stored[name] = {**body, "metadata": {**body["metadata"], "uid": "u1"}}
            return web.json_response({"kind": "Status", "code": 503}, status=503)  # stored, answer lost

        async def read(request: web.Request) -> web.Response:
            seen.append(f"GET {request.match_info['name']}")
            return web.json_response(stored[request.match_info["name"]])

        app = web.Application()
        app.router.add_post("/apis/batch/v1/namespaces/ns/jobs", create)
        app.router.add_get("/apis/batch/v1/namespaces/ns/jobs/{name}", read)
        async with client_of(app) as client:
            job = await client.create("/apis/batch/v1/namespaces/ns/jobs", {"metadata": {"name": "j1"}})
            try:
                await client.create("/apis/batch/v1/namespaces/ns/jobs", {"metadata": {"name": "j1"}})
                raise AssertionError("a first-attempt 409 is a real conflict and must raise")
            except ApiError as exc:
                assert exc.conflict
        return job, seen

    job, seen = asyncio.run(scenario())
    assert job["metadata"] == {"name": "j1", "uid": "u1"}  # type: ignore[comparison-overlap]
    assert seen == ["POST j1", "POST j1", "GET j1", "POST j1"]


def test_a_refused_connection_fails_at_once_when_asked_to_and_is_retried_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a fake kubelet's claim read needs to fail as client-go's does (see pods.py),
    while the testbed's own calls keep riding out an API server restart."""
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = refusing.getsockname()[1]
        pauses: list[float] = []

        async def no_pause(seconds: float) -> None:
            pauses.append(seconds)

        async def read(retry_unreachable: bool) -> TransportError:
            client = KubeClient(Credentials(f"http://127.0.0.1:{port}", ssl.create_default_context()))
            try:
                with pytest.raises(TransportError) as raised:
                    await client.request("GET", "/api/v1/nodes", attempts=4, retry_unreachable=retry_unreachable)
                return raised.value
            finally:
                await client.close()

        monkeypatch.setattr(asyncio, "sleep", no_pause)
        error = asyncio.run(read(retry_unreachable=False))
        assert error.unreachable and pauses == []
        asyncio.run(read(retry_unreachable=True))
        assert len(pauses) == 3, "the default rides it out: four attempts"


STATUS_429 = {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "Too many requests"}


def _no_pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    pauses: list[float] = []

    async def no_pause(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", no_pause)
    return pauses


def test_the_read_after_a_lost_create_rides_out_an_overloaded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 5,000 nodes the read that follows a lost create met 429 and failed a NodeHost."""
    _no_pauses(monkeypatch)

    async def scenario() -> dict[str, object]:
        stored: dict[str, object] = {}
        answers = iter([503, 409])
        reads = iter([429, 429, 200])

        async def create(request: web.Request) -> web.Response:
            stored.update(await request.json(), uid="u1")
            status = next(answers)
            return web.json_response(STATUS_409 if status == 409 else {"kind": "Status"}, status=status)

        async def read(request: web.Request) -> web.Response:
            status = next(reads)
            return web.json_response(stored if status == 200 else STATUS_429, status=status)

        app = web.Application()
        app.router.add_post("/api/v1/nodes", create)
        app.router.add_get("/api/v1/nodes/{name}", read)
        async with client_of(app) as client:
            return await client.create("/api/v1/nodes", {"metadata": {"name": "n1"}})

    assert asyncio.run(scenario())["uid"] == "u1"


class ThisHostsFence:
    """A fleet's fencing as one NodeHost sees it, with no other host about."""

    stamp = "host-a"

    def wait_s(self, lease: dict[str, object]) -> float:
        return 0.0

    def lost(self, stamp: str | None) -> None:
        raise AssertionError("no other host takes the node here")


@pytest.mark.parametrize("fenced", [False, True], ids=["one server", "fenced"])
def test_a_kubelet_registers_through_an_overload_longer_than_one_requests_retries(
    monkeypatch: pytest.MonkeyPatch, fenced: bool
) -> None:
    """As the kubelet's registration loop does: it asks until the server answers (the
    NodeHost's start deadline bounds it), where a fleet start used to fail: at 5,000
    nodes on the Node's create, then on a fenced node's first Lease."""
    _no_pauses(monkeypatch)
    refusals = RETRY_ATTEMPTS * 2

    async def scenario() -> tuple[NodeAgent, dict[str, list[int]]]:
        posts: dict[str, list[int]] = {"nodes": [], "leases": []}

        def refused(kind: str) -> bool:
            posts[kind].append(1)
            return len(posts[kind]) <= refusals

        stored: dict[str, dict[str, object]] = {}

        async def create(request: web.Request) -> web.Response:
            kind = request.path.rsplit("/", 1)[1]
            if refused(kind):
                return web.json_response(STATUS_429, status=429)
            body = await request.json()
            stored[kind] = {**body, "metadata": {**body["metadata"], "uid": f"{kind}-uid"}}
            return web.json_response(stored[kind], status=201)

        async def read(request: web.Request) -> web.Response:
            kind = request.path.rsplit("/", 2)[1]
            if kind not in stored:
                return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
            return web.json_response(stored[kind])

        app = web.Application()
        for path in ("/api/v1/nodes", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"):
            app.router.add_post(path, create)
            app.router.add_get(path + "/{name}", read)
        async with client_of(app) as client:
            agent = NodeAgent(client, NodeSpec("n1"), fence=ThisHostsFence() if fenced else None)
            await agent.register()
            return agent, posts

    agent, posts = asyncio.run(scenario())
    assert agent.uid == "nodes-uid" and agent.created
    assert len(posts["leases"]) == refusals + 1 and agent.lease.latest is not None


def test_asking_until_answered_backs_off_as_the_kubelets_registration_does(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses = _no_pauses(monkeypatch)
    failures = iter([ApiError(429, "TooManyRequests", "")] * 5 + [TimeoutError()] * 3)

    async def overloaded() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "answered"

    assert asyncio.run(until_answered(overloaded, "registering")) == "answered"
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 7.0]


def test_asking_until_answered_gives_up_at_once_on_an_error_asking_again_cannot_cure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses = _no_pauses(monkeypatch)
    calls: list[int] = []

    async def forbidden() -> None:
        calls.append(1)
        raise ApiError(403, "Forbidden", "nodes is forbidden")

    with pytest.raises(ApiError) as raised:
        asyncio.run(until_answered(forbidden, "registering"))
    assert raised.value.status == 403 and len(calls) == 1 and pauses == []


def test_an_api_error_crosses_processes_whole() -> None:
    """A NodeHost's failure reaches `testbed up` through Ray, which pickles it; Ray had
    reported "Failed to deserialize exception" instead of the API server's answer."""
    error = pickle.loads(pickle.dumps(ApiError(429, "TooManyRequests", "Too many requests")))
    assert (error.status, error.reason, error.message) == (429, "TooManyRequests", "Too many requests")
    assert str(error) == "429 TooManyRequests: Too many requests"


def test_a_nodes_driver_token_is_asked_for_until_the_overloaded_server_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As a DaemonSet controller creates its pod and a kubelet asks for its token again."""
    _no_pauses(monkeypatch)

    async def scenario() -> tuple[str, str]:
        refused = iter(range(RETRY_ATTEMPTS + 2))

        async def create_pod(request: web.Request) -> web.Response:
            if next(refused, None) is not None:
                return web.json_response(STATUS_429, status=429)
            body = await request.json()
            return web.json_response({**body, "metadata": {**body["metadata"], "uid": "pod-uid"}}, status=201)

        async def token(request: web.Request) -> web.Response:
            bound = (await request.json())["spec"]["boundObjectRef"]
            return web.json_response({"status": {"token": f"token-for-{bound['uid']}"}}, status=201)

        app = web.Application()
        app.router.add_post("/api/v1/namespaces/dra-testbed/pods", create_pod)
        app.router.add_post("/api/v1/namespaces/dra-testbed/serviceaccounts/dra-testbed-driver/token", token)
        async with client_of(app) as client:
            return await driver_token(client, DriverPod("n1"))

    assert asyncio.run(scenario()) == ("token-for-pod-uid", "pod-uid")
