"""A fleet's Nodes left in a cluster the testbed did not start, with no NodeHost to drain
them (Ray gone, or the process that ran the fleet killed outright): they would stay
NotReady there for good, so they are deleted directly. Their Leases and ResourceSlices
go with them (the Node owns them), their pods with the pod garbage collector."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from testbed.errors import run_coroutine
from testbed.keys import SYNTHETIC
from testbed.kubeapi import KubeClient, path_for


def of_pools(name: str, pools: Iterable[str]) -> bool:
    """Whether ``name`` is a node of one of ``pools`` (``<pool>-<index>``, however scaled)."""
    pool, _, index = name.rpartition("-")
    return pool in set(pools) and index.isdigit()


def delete_pool_nodes(kubeconfig: Path, pools: Iterable[str]) -> list[str]:
    """Delete the synthetic Nodes of ``pools``; returns their names. Nodes that are not
    the testbed's (no synthetic label) are never touched, whatever their names."""
    wanted = set(pools)

    async def delete() -> list[str]:
        client = KubeClient.from_kubeconfig(kubeconfig)
        try:
            listed = await client.get(path_for("v1", "nodes"), {"labelSelector": f"{SYNTHETIC}=true"})
            names = [n["metadata"]["name"] for n in listed.get("items", [])]
            names = [name for name in names if of_pools(name, wanted)]
            for name in names:
                await client.delete_if_exists(path_for("v1", "nodes", name))
            return names
        finally:
            await client.close()

    return run_coroutine(delete())
