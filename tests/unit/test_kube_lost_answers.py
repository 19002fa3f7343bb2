"""A create whose answer was lost (the API server stored it, then failed to say so) and
that meets AlreadyExists on its retry is the same object, not an error: a run killed by
a 409 on its own Job after an etcd restart was the symptom."""

from __future__ import annotations

import asyncio
import ssl

from aiohttp import web

from testbed.kubeapi import ApiError, Credentials, KubeClient

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
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        client = KubeClient(Credentials(f"http://127.0.0.1:{port}", ssl.create_default_context()))
        try:
            job = await client.create("/apis/batch/v1/namespaces/ns/jobs", {"metadata": {"name": "j1"}})
            try:
                await client.create("/apis/batch/v1/namespaces/ns/jobs", {"metadata": {"name": "j1"}})
                raise AssertionError("a first-attempt 409 is a real conflict and must raise")
            except ApiError as exc:
                assert exc.conflict
        finally:
            await client.close()
            await runner.cleanup()
        return job, seen

    job, seen = asyncio.run(scenario())
    assert job["metadata"] == {"name": "j1", "uid": "u1"}  # type: ignore[comparison-overlap]
    assert seen == ["POST j1", "POST j1", "GET j1", "POST j1"]
