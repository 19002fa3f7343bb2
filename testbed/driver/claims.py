"""Where the driver reads ResourceClaims: a GET per claim it prepares, as the upstream
kubelet-plugin helper does, or optionally a watch-fed cache falling back to GETs.

ResourceClaims have no field that selects a node, so a claim watch receives every claim
of the cluster and its every change: in a fleet of hosts, or a DaemonSet of drivers, that
cost grows with the cluster times the watchers, while a GET costs one read per prepare.
The watch suits one driver that must not wait on the API server (a benchmark of prepare).
"""

from __future__ import annotations

import asyncio

from testbed.driver.metrics import CLAIM_LOOKUPS
from testbed.kubeapi import KubeClient, Obj, path_for
from testbed.tasks import cancel_and_wait

API_VERSION = "resource.k8s.io/v1"
FETCH_ATTEMPTS = 3
"""A prepare waits on these reads: a few quick retries, not a client's minutes of backoff."""


class ClaimCache:
    def __init__(self, client: KubeClient, watch: bool = False):
        self.client = client
        self._claims: dict[tuple[str, str], Obj] = {}
        self._task: asyncio.Task[None] | None = None
        self._watch = watch
        self.hits = 0
        self.misses = 0

    def start(self) -> None:
        if self._watch and self._task is None:
            self._task = asyncio.create_task(self._run(), name="claim-cache")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        async for kind, claim in self.client.watch(path_for(API_VERSION, "resourceclaims")):
            key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
            if kind == "DELETED":
                self._claims.pop(key, None)
            else:
                self._claims[key] = claim

    async def get(self, namespace: str, name: str, uid: str) -> Obj:
        """The claim, if the cached copy is this UID and allocated; otherwise from the API.
        Raises ApiError (404) if it does not exist."""
        cached = self._claims.get((namespace, name))
        if cached is not None and cached["metadata"]["uid"] == uid and cached.get("status", {}).get("allocation"):
            self.hits += 1
            CLAIM_LOOKUPS.labels("cache").inc()
            return cached
        self.misses += 1
        CLAIM_LOOKUPS.labels("api").inc()
        claim = await self.client.request(
            "GET", path_for(API_VERSION, "resourceclaims", name, namespace), attempts=FETCH_ATTEMPTS, timeout_s=4.0
        )
        if self._watch:  # without the watch nothing would ever evict it
            self._claims[(namespace, name)] = claim
        return claim
