"""A pod's status writes and its final delete, as the kubelet's status manager makes them:
what the API server could not take now (it is restarting, etcd is away) is written again
every 10 s, in the order it was meant, until it lands or the pod is gone.

The client already retries each request for about 16 s. Without this, a longer outage
left a pod as its last write before it said (Pending, say) while its containers ran, or
a deleted pod Terminating for good, and its worker stopped on the error.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from testbed.kubeapi import RETRIABLE_STATUS, TRANSIENT_ERRORS, ApiError, KubeClient, Obj, path_for
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)

STATUS_SYNC_S = 10.0
"""How often the kubelet's status manager writes again what it could not (its syncPeriod)."""


@dataclass(frozen=True)
class _Write:
    pod: Obj
    body: Obj | None
    """The status patch; None for the delete that ends the pod."""


class StatusWriter:
    def __init__(self, client: KubeClient, sync_s: float = STATUS_SYNC_S):
        self.client = client
        self.sync_s = sync_s
        self._unwritten: dict[str, list[_Write]] = {}
        """By pod UID, in order: what waits for the API server."""
        self._retrying: asyncio.Task[None] | None = None
        self._sending: dict[str, asyncio.Lock] = {}
        """By pod UID: one write at a time, in the order they were made. Two requests in
        flight at once may land in either order, and a status worked out earlier (an
        older observedGeneration, say) would undo a later one."""

    async def patch(self, pod: Obj, body: Obj) -> None:
        """As the kubelet patches a pod's status (PatchPodStatus): with the pod's UID in the
        patch, so a write meant for a pod deleted meanwhile never lands on a namesake created
        since (a StatefulSet's next pod): the API server refuses to change a UID (422). To
        the pod's worker a replaced pod is a deleted one (ApiError 404, raised)."""
        await self._write(_Write(pod, body))

    async def delete(self, pod: Obj) -> None:
        """The pod's last step on the node: gone from the API at once (grace 0), provided it
        is still this pod (409 if it was replaced)."""
        await self._write(_Write(pod, None))

    def forget(self, uid: str) -> None:
        """The pod is gone from the API: nothing it waited for needs writing."""
        self._unwritten.pop(uid, None)
        self._sending.pop(uid, None)

    def waiting(self, uid: str) -> int:
        """How many writes of this pod wait for the API server."""
        return len(self._unwritten.get(uid, []))

    async def stop(self) -> None:
        await cancel_and_wait(self._retrying)

    async def _write(self, write: _Write) -> None:
        uid = write.pod["metadata"]["uid"]
        async with self._sending.setdefault(uid, asyncio.Lock()):  # its waiters wake in turn
            if uid in self._unwritten:  # after those before it
                self._unwritten[uid].append(write)
                return
            try:
                await self._send(write)
            except (ApiError, *TRANSIENT_ERRORS) as exc:
                if not _transient(exc):
                    raise
                log.warning("pod %s: status write failed, again in %gs: %s", _named(write.pod), self.sync_s, exc)
                self._unwritten[uid] = [write]
                if self._retrying is None or self._retrying.done():
                    self._retrying = asyncio.create_task(self._write_again(), name="pod-status-again")

    async def _send(self, write: _Write) -> None:
        meta = write.pod["metadata"]
        if write.body is None:
            options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
            options["preconditions"] = {"uid": meta["uid"]}
            await self.client.delete(path_for("v1", "pods", meta["name"], meta["namespace"]), options)
            return
        body = {**write.body, "metadata": {**write.body.get("metadata", {}), "uid": meta["uid"]}}
        path = path_for("v1", "pods", meta["name"], meta["namespace"], "status")
        try:
            await self.client.patch(path, body, "strategic")
        except ApiError as exc:
            if exc.status == 422 and "metadata.uid" in exc.message:
                raise ApiError(404, "NotFound", f"pod {meta['name']} was replaced: {exc.message}") from None
            raise

    async def _write_again(self) -> None:
        while self._unwritten:
            await asyncio.sleep(self.sync_s)
            for uid in list(self._unwritten):
                queue = self._unwritten.get(uid, [])
                while queue:
                    try:
                        await self._send(queue[0])
                    except (ApiError, *TRANSIENT_ERRORS) as exc:
                        if _transient(exc):
                            break  # at the next sync
                        if isinstance(exc, ApiError) and exc.not_found:
                            queue.clear()  # the pod is gone: nothing more to write
                            break
                        log.warning("pod %s: status write refused: %s", _named(queue[0].pod), exc)
                    queue.pop(0)
                if not queue:
                    self._unwritten.pop(uid, None)


def _transient(exc: BaseException) -> bool:
    """No answer, or the API server overloaded or without its storage: worth another try."""
    if isinstance(exc, ApiError):
        return exc.status in RETRIABLE_STATUS
    return isinstance(exc, TRANSIENT_ERRORS)


def _named(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
