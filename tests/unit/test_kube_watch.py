"""A watch that expires and re-lists tells its consumer about objects deleted meanwhile:
without that, a kubelet would never unprepare the claims of a pod deleted while its
watch was down (an API server restart), and the claims would leak."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from testbed.kubeapi import Obj
from tests.unit.scripted_api import client_of


def _pod(name: str, version: str) -> Obj:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version}}


def _api_server(lists: list[list[Obj]], stop: asyncio.Event) -> web.Application:
    """Answers each list with the next of ``lists``; each watch with 410 Gone, except
    after the last list, where it stays open."""
    served = {"lists": 0}

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "1":
            items = lists[min(served["lists"], len(lists) - 1)]
            served["lists"] += 1
            return web.json_response({"metadata": {"resourceVersion": str(served["lists"])}, "items": items})
        response = web.StreamResponse()
        await response.prepare(request)
        if served["lists"] < len(lists):
            gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
            await response.write(json.dumps(gone).encode() + b"\n")
            return response
        await stop.wait()  # an open watch with nothing to say, until the test ends
        return response

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    return app


def test_a_relist_yields_deleted_for_objects_gone_meanwhile() -> None:
    async def scenario() -> list[tuple[str, str]]:
        stop = asyncio.Event()
        lists = [[_pod("a", "1"), _pod("b", "1")], [_pod("b", "2"), _pod("c", "2")]]
        seen: list[tuple[str, str]] = []
        async with client_of(_api_server(lists, stop)) as client:
            try:
                async with asyncio.timeout(5):
                    async for kind, pod in client.watch("/api/v1/pods"):
                        seen.append((kind, pod["metadata"]["name"]))
                        if len(seen) == 5:
                            break
            except TimeoutError:
                pass  # judged below by what was seen
            finally:
                stop.set()
        return seen

    seen = asyncio.run(scenario())
    assert seen[:2] == [("ADDED", "a"), ("ADDED", "b")]
    # After the re-list: a is gone (told once), b and c are there.
    assert sorted(seen[2:]) == [("ADDED", "b"), ("ADDED", "c"), ("DELETED", "a")]


def test_each_watch_asks_for_five_to_ten_minutes_at_random() -> None:
    """As client-go's reflector: the watches that an API server restart began together
    must not all end together, every time, for as long as the fleet runs."""

    async def scenario() -> list[int]:
        asked: list[int] = []

        async def pods(request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") != "1":
                return web.json_response({"metadata": {"resourceVersion": "1"}, "items": []})
            asked.append(int(request.query["timeoutSeconds"]))
            response = web.StreamResponse()
            await response.prepare(request)
            return response  # the watch's time is up at once: the client watches again

        app = web.Application()
        app.router.add_get("/api/v1/pods", pods)
        async with client_of(app) as client:

            async def watch() -> None:
                async for _ in client.watch("/api/v1/pods"):
                    pass

            task = asyncio.create_task(watch())
            try:
                async with asyncio.timeout(5):
                    while len(asked) < 8:
                        await asyncio.sleep(0.01)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return asked

    asked = asyncio.run(scenario())
    assert all(300 <= seconds <= 600 for seconds in asked), asked
    assert len(set(asked)) > 1, f"every watch asked for the same time: {asked}"
