"""A scripted API server (an aiohttp app) on a real local socket, for the Kubernetes
client's own tests: what it does when the server answers oddly, late or not at all."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from testbed.kubeapi import Credentials, KubeClient


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """The app's address while the block runs."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def client_of(app: web.Application) -> AsyncIterator[KubeClient]:
    """A client of the app, closed (then the app) when the block ends."""
    async with serving(app) as server:
        client = KubeClient(Credentials(server, ssl.create_default_context()))
        try:
            yield client
        finally:
            await client.close()
