"""/metrics over HTTP on the event loop that does the work (no exporter thread)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


class MetricsServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, path: Path | None = None):
        """``path``: serve on this unix socket (0600) instead of a TCP port."""
        self.host = host
        self.port = port
        self.path = path
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", _metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        if self.path is not None:
            self.path.unlink(missing_ok=True)  # a socket left by an earlier run of this process
            await web.UnixSite(self._runner, str(self.path)).start()
            self.path.chmod(0o600)  # metrics are no secret; the owner's alone all the same
            return 0
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
