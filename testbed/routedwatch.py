"""One watch of the objects of many nodes, each event handed to that node's observers.

A NodeHost runs hundreds of nodes. A watch per node would cost each one a connection
(and, under per-node identities, a TLS handshake of its own); a watch of every object
of the kind in the cluster would cost each host the whole fleet's changes, and the
fleet's cost would grow with its hosts. So a host watches only the objects labelled with
one of its nodes' names and routes each event by that label. A process that serves one
node watches with a field selector instead, as its real counterpart does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from testbed.kubeapi import KubeClient, Obj, WatchPosition
from testbed.tasks import cancel_and_wait


class Observer(Protocol):
    def observe(self, kind: str, obj: Obj) -> None:
        """A watch event ("ADDED", "MODIFIED", "DELETED") for one of its node's objects."""
        ...


class RoutedWatch:
    def __init__(
        self,
        client: KubeClient,
        path: str,
        node_label: str,
        params: dict[str, str] | None = None,
        metadata_only: bool = False,
    ):
        """``node_label``: the label naming an object's node. ``params``: a fixed selection
        (one node's objects); None: the objects of the nodes given to ``watch_nodes``."""
        self.client = client
        self.path = path
        self.node_label = node_label
        self.params = params
        self.metadata_only = metadata_only
        self._nodes: frozenset[str] = frozenset()
        self._observers: dict[str, list[Observer]] = {}
        self._task: asyncio.Task[None] | None = None
        self._position = WatchPosition()
        """How far the watch has got: a watch of other nodes goes on from there."""

    async def watch_nodes(self, nodes: Iterable[str]) -> None:
        """Watch the objects of exactly these nodes (a host's, before they start or after
        some left). The new watch goes on from the last version the old one saw: a change
        in between reaches it, and nothing is listed again."""
        wanted = frozenset(nodes)
        if wanted == self._nodes:
            return
        self._nodes = wanted
        if self._task is not None:
            await cancel_and_wait(self._task)
            self.start()

    def add(self, node: str, observer: Observer) -> None:
        self._observers.setdefault(node, []).append(observer)

    def remove(self, node: str, observer: Observer) -> None:
        mine = self._observers.get(node, [])
        if observer in mine:
            mine.remove(observer)
        if not mine:
            self._observers.pop(node, None)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"watch-{self.path.rpartition('/')[2]}")

    async def wait_synced(self) -> None:
        """Until the watch has listed: every change after that reaches the observers as
        an event, none only as a later list."""
        await self._position.synced.wait()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def _selection(self) -> dict[str, str] | None:
        if self.params is not None:
            return self.params
        if not self._nodes:
            return None
        return {"labelSelector": f"{self.node_label} in ({','.join(sorted(self._nodes))})"}

    async def _run(self) -> None:
        params = self._selection()
        if params is None:  # a host with no nodes yet: nothing to watch
            return
        async for kind, obj in self.client.watch(
            self.path, params, metadata_only=self.metadata_only, position=self._position
        ):
            node = obj.get("metadata", {}).get("labels", {}).get(self.node_label)
            if node:
                targets = self._observers.get(node, [])
            else:  # unlabelled, so selected by a field: every observer here is its node's
                targets = [observer for observers in self._observers.values() for observer in observers]
            for observer in targets:
                observer.observe(kind, obj)
