"""Token identities that borrow another client's connections: each request carries its
own token, and all of them ride on the lender's few connections (a fleet's drivers
would otherwise cost the API server a TLS handshake per node)."""

from __future__ import annotations

import asyncio
import ssl

from aiohttp import web

from testbed.kubeapi import Credentials, KubeClient
from tests.unit.scripted_api import serving


def test_borrowers_send_their_own_tokens_over_the_lenders_connections() -> None:
    async def scenario() -> tuple[list[tuple[str, int]], bool]:
        seen: list[tuple[str, int]] = []

        async def whoami(request: web.Request) -> web.Response:
            peer = request.transport.get_extra_info("peername") if request.transport else ("", 0)
            seen.append((request.headers.get("Authorization", ""), peer[1]))
            return web.json_response({"kind": "Status"})

        app = web.Application()
        app.router.add_get("/api/v1/namespaces", whoami)
        async with serving(app) as server:
            lender = KubeClient(Credentials(server, ssl.create_default_context()), connection_limit=1)
            borrowers = [
                KubeClient(Credentials(server, ssl.create_default_context(), token=f"t{i}"), borrow=lender)
                for i in range(3)
            ]
            borrowers[2].use_token("t2-rebound")
            try:
                for borrower in borrowers:
                    await borrower.get("/api/v1/namespaces")
                for borrower in borrowers:
                    await borrower.close()  # closes nothing of the lender's
                await borrowers[0].get("/api/v1/namespaces")
                still_open = lender._pool is not None and lender._pool.connections == 1
            finally:
                await lender.close()
        return seen, still_open

    seen, still_open = asyncio.run(scenario())
    assert [token for token, _ in seen] == ["Bearer t0", "Bearer t1", "Bearer t2-rebound", "Bearer t0"]
    assert len({port for _, port in seen}) == 1, "one connection for every identity"
    assert still_open
