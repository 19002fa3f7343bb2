"""The fabric manager: attaches devices behind a fabric to the node that claimed them.

A profile's devices behind a fabric (``gpus.fabric: true``) are published with a binding
condition (``keys.FABRIC_ATTACHED``) and a binding-failure condition. The scheduler
allocates such a device, reserves the claim for the pod, and then waits in PreBind,
looking every 5 s up to its binding timeout (600 s by default), until the condition is
True in the claim's ``status.devices``; a True failure condition makes it give the
allocation up and allocate again. Something cluster-wide must set them before the pod is
bound, so before any kubelet or node driver hears of the claim: on real clusters a
composable-infrastructure controller, here one manager per fleet. It watches every claim
(one watch for the cluster, not one per node), waits the attach time for each device that
awaits attachment and writes the outcome with a server-side apply of its own field
manager, beside what the node's driver writes. `testbed fault NODE fail-attach N` makes
the next N attaches to NODE fail; `hang-attach N` makes them never end, as a fabric
operation that hangs does, until the scheduler's binding timeout gives them up. It runs
as a Ray actor that Ray restarts when it dies; a restarted manager finds what still
awaits attachment in its first list.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.config import log_to_stderr
from testbed.fleet.identity import NodeAuthority
from testbed.keys import FABRIC_ATTACH_FAILED, FABRIC_ATTACHED
from testbed.kubeapi import (
    ApiError,
    ClaimRef,
    KubeClient,
    Obj,
    apply_claim_status,
    claim_device_status,
    path_for,
    status_refusal_cause,
    until_answered,
)

log = logging.getLogger(__name__)

FIELD_MANAGER = "dra-testbed-fabric-manager"
USER = "dra-testbed:fabric-manager"
"""Who the manager is to the API server (a client certificate from the cluster CA); the
access policy grants it the claims' status for the testbed's drivers on any node."""
DEFAULT_ATTACH_S = 1.0
GIVEN_UP_STATUS = (404, 409, 422)
"""A status write refused for these is out of date: the claim went, or changed under it."""


@dataclass(frozen=True)
class DeviceRef:
    """An allocated device as ``status.devices`` keys it."""

    driver: str
    pool: str
    device: str
    share_id: str = ""

    def entry(self) -> Obj:
        entry: Obj = {"driver": self.driver, "pool": self.pool, "device": self.device}
        if self.share_id:
            entry["shareID"] = self.share_id
        return entry


def _ref(item: Obj) -> DeviceRef:
    return DeviceRef(item["driver"], item["pool"], item["device"], item.get("shareID") or "")


def awaiting_attachment(claim: Obj) -> list[DeviceRef]:
    """The claim's allocated devices that wait for the fabric: their binding conditions
    name it, and the claim's status holds no outcome for them yet."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return []
    outcomes = {
        _ref(entry)
        for entry in (claim["status"].get("devices") or [])
        if any(c.get("type") in (FABRIC_ATTACHED, FABRIC_ATTACH_FAILED) for c in entry.get("conditions") or [])
    }
    refs = [
        _ref(result)
        for result in allocation["devices"].get("results") or []
        if FABRIC_ATTACHED in (result.get("bindingConditions") or [])
    ]
    return [ref for ref in dict.fromkeys(refs) if ref not in outcomes]


def allocated_node(claim: Obj) -> str:
    """The node the scheduler allocated the claim for ("" when it says none)."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return ""


def outcome(claim: Obj, refs: list[DeviceRef], attached: bool, message: str) -> Obj:
    """The server-side apply body that records the attach outcome of ``refs``."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": FABRIC_ATTACHED if attached else FABRIC_ATTACH_FAILED,
        "status": "True",
        "reason": "Attached" if attached else "AttachFailed",
        "message": message,
        "lastTransitionTime": now,
    }
    meta = claim["metadata"]
    entries = [ref.entry() | {"conditions": [condition]} for ref in refs]
    return claim_device_status(ClaimRef(meta["namespace"], meta["uid"], meta["name"]), entries)


class FabricManager:
    def __init__(
        self,
        kubeconfig: bytes | str,
        attach_s: float = DEFAULT_ATTACH_S,
        authority: NodeAuthority | None = None,
        log_level: str = "warning",
    ):
        """``kubeconfig``: the fleet's (content, or a path), used when ``authority`` is
        None (a cluster whose CA the testbed does not hold, or shared identities)."""
        log_to_stderr(log_level)
        self.attach_s = attach_s
        self._kubeconfig = kubeconfig
        self._authority = authority
        self.attached = 0
        self.failed = 0
        self.hung = 0
        self._failing: dict[str, int] = {}
        """Node -> how many of its next attaches fail."""
        self._hanging: dict[str, int] = {}
        """Node -> how many of its next attaches never end."""
        self._working: dict[tuple[str, str], asyncio.Task[None]] = {}
        """(claim UID, allocation timestamp) -> the attach under way."""
        self._done: dict[str, set[tuple[str, DeviceRef]]] = {}
        """Claim UID -> (allocation timestamp, device) of outcomes written (or hung): events
        written before an outcome may still arrive after it. Dropped with the allocation."""
        self._client: KubeClient | None = None
        self._serving = asyncio.get_running_loop().create_task(self.serve())

    def _make_client(self) -> KubeClient:
        if self._authority is not None:
            return self._authority.user_client(USER)
        if isinstance(self._kubeconfig, bytes):  # read at once: the file (0600) need not stay
            with tempfile.NamedTemporaryFile(suffix=".kubeconfig") as file:
                file.write(self._kubeconfig)
                file.flush()
                return KubeClient.from_kubeconfig(Path(file.name))
        return KubeClient.from_kubeconfig(Path(self._kubeconfig))

    async def serve(self) -> None:
        self._client = client = self._make_client()
        path = path_for("resource.k8s.io/v1", "resourceclaims")
        async for kind, claim in client.watch(path):
            uid = claim["metadata"]["uid"]
            if kind == "DELETED":
                self._forget(uid)
                continue
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                self._done.pop(uid, None)
                continue
            stamp = str(allocation.get("allocationTimestamp", ""))
            done = self._done.get(uid, set())
            refs = [r for r in awaiting_attachment(claim) if (stamp, r) not in done]
            if refs and (uid, stamp) not in self._working:
                key = (uid, stamp)
                task = asyncio.get_running_loop().create_task(self._attach(claim, stamp, refs))
                self._working[key] = task
                task.add_done_callback(functools.partial(self._finished, key))

    def _finished(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._working.get(key) is task:
            del self._working[key]

    def _forget(self, uid: str) -> None:
        for key, task in list(self._working.items()):
            if key[0] == uid:
                task.cancel()
        self._done.pop(uid, None)

    async def _attach(self, claim: Obj, stamp: str, refs: list[DeviceRef]) -> None:
        await asyncio.sleep(self.attach_s)
        node = allocated_node(claim)
        meta = claim["metadata"]
        if self._hanging.get(node, 0) > 0:  # taken, and never answered
            self._hanging[node] -= 1
            self._done.setdefault(meta["uid"], set()).update((stamp, ref) for ref in refs)
            self.hung += len(refs)
            return
        failing = self._failing.get(node, 0) > 0
        if failing:
            self._failing[node] -= 1
        names = ", ".join(r.device for r in refs)
        message = (
            f"emulated fault: attaching {names} to node {node} failed (testbed fault {node} fail-attach)"
            if failing
            else f"{names} attached to node {node}"
        )
        assert self._client is not None
        client = self._client
        body = outcome(claim, refs, not failing, message)
        what = f"recording the attach of {names} in claim {meta['namespace']}/{meta['name']}"
        delay = 1.0
        while True:
            try:
                await until_answered(lambda: apply_claim_status(client, body, FIELD_MANAGER), what)
                break
            except ApiError as exc:
                if exc.status in GIVEN_UP_STATUS:
                    # The claim went, or was allocated anew meanwhile (its devices then
                    # differ): the next event brings what awaits attachment now. Or the
                    # API server refuses every write of this claim's status: said loudly.
                    cause = status_refusal_cause(exc)
                    if cause:
                        log.warning("%s: %s (%s); its pod waits until the scheduler gives up on it", what, exc, cause)
                    else:
                        log.info("%s: %s", what, exc)
                    if failing:
                        self._failing[node] += 1
                    return
                # Refused (its access policy missing?): no event would bring the claim back
                # while the scheduler waits on it, so ask again until it goes.
                log.warning("%s: %s; again in %.0f s", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        self._done.setdefault(meta["uid"], set()).update((stamp, ref) for ref in refs)
        if failing:
            self.failed += len(refs)
        else:
            self.attached += len(refs)

    # --- what the fleet asks of it ------------------------------------------------------

    def fail_attach(self, node: str, count: int) -> None:
        self._failing[node] = count

    def hang_attach(self, node: str, count: int) -> None:
        self._hanging[node] = count

    def faults_in_force(self) -> dict[str, list[str]]:
        """By node, the attaches still to fail or hang (`testbed fault`), in words."""
        said: dict[str, list[str]] = {}
        for node, count in self._failing.items():
            if count:
                said.setdefault(node, []).append(f"next {count} attaches fail")
        for node, count in self._hanging.items():
            if count:
                said.setdefault(node, []).append(f"next {count} attaches hang")
        return said

    def figures(self) -> dict[str, Any]:
        under_way = len(self._working)
        return {"attached": self.attached, "failed": self.failed, "hung": self.hung, "under way": under_way}

    async def stop(self) -> None:
        self._serving.cancel()
        for task in list(self._working.values()):
            task.cancel()
        if self._client is not None:
            await self._client.close()
