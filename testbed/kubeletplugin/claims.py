"""Where the driver reads ResourceClaims: a GET per claim it prepares, as the upstream
kubelet-plugin helper does.

ResourceClaims have no field that selects a node, so a claim watch would receive every
claim of the cluster and its every change: in a fleet of hosts, or a DaemonSet of
drivers, that cost grows with the cluster times the watchers, while a GET costs one read
per prepare.
"""

from __future__ import annotations

from testbed.kubeapi import KubeClient, Obj, path_for
from testbed.kubeletplugin.metrics import CLAIM_LOOKUPS

API_VERSION = "resource.k8s.io/v1"
FETCH_ATTEMPTS = 7
"""Retried with backoff (0.2 s doubling to 5 s) while the API server is unreachable or
overloaded, about 10 s in all: long enough to ride out an API server restart, which
would otherwise fail the pod's prepare and leave the pod waiting a minute or more for
its kubelet's next sync. A prepare bounds the wait itself (CLAIM_FETCH_BUDGET_S), well
within the kubelet's 45 s."""


class ClaimReader:
    def __init__(self, client: KubeClient):
        self.client = client

    async def get(self, namespace: str, name: str) -> Obj:
        """The claim as the API server has it now. Raises ApiError (404) if it does not exist."""
        CLAIM_LOOKUPS.labels("api").inc()
        return await self.client.request(
            "GET", path_for(API_VERSION, "resourceclaims", name, namespace), attempts=FETCH_ATTEMPTS, timeout_s=4.0
        )
