"""A create whose answer was lost (the API server stored it, then failed to say so) and
that meets AlreadyExists on its retry is the same object, not an error: a run killed by
a 409 on its own Job after an etcd restart was the symptom."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest
from aiohttp import web

from testbed.http11 import TransportError
from testbed.kubeapi import ApiError, Credentials, KubeClient
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
