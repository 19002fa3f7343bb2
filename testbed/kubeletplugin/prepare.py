"""Prepare and unprepare claims for one driver on one node: the driver's core logic.

Every claim gets its own answer: a bad claim (unallocated, for another node, a UID
that changed, a malformed config, a device fault) fails that claim alone. Work for a node
is serialized by a file lock that every driver instance on the node shares (two
instances run side by side during a rolling update), and the checkpoint is re-read
under that lock, since the other instance may have changed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import quantity
from testbed.kubeapi import ApiError, ClaimRef
from testbed.kubeletplugin import cdi, metrics
from testbed.kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointCorrupt,
    ClaimRecord,
    ClaimState,
    PreparedDeviceRecord,
    PrepareIntents,
)
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.driver import AllocatedDevice, ClaimFailed, ClaimToPrepare, Driver

log = logging.getLogger(__name__)
LOCK_POLL_S = 0.002
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
UID = re.compile(r"[A-Za-z0-9-]+")
CLAIM_FETCH_BUDGET_S = 10.0
"""How long a prepare waits for the API server to answer for its claims, all at once and
before the node lock: well within the kubelet's 45 s deadline, so an unreachable API
server fails each claim that needs it with its own error (claims the cache holds still
succeed), and unrelated unprepares do not wait behind it."""


@dataclass(frozen=True)
class PrepareResult:
    devices: list[PreparedDeviceRecord]
    error: str = ""


@dataclass(frozen=True)
class DriverPaths:
    """A node's kubelet directories as one driver instance sees them."""

    driver: str
    registry_dir: Path
    plugin_dir: Path
    cdi_dir: Path
    pod_uid: str | None = None

    @classmethod
    def for_node(
        cls,
        kubelet_dir: Path,
        driver: str,
        cdi_dir: Path,
        pod_uid: str | None = None,
        registry_dir: Path | None = None,
        plugins_dir: Path | None = None,
    ) -> DriverPaths:
        """``registry_dir``/``plugins_dir``: where the kubelet's plugins_registry and
        plugins are, when not under ``kubelet_dir``."""
        return cls(
            driver,
            registry_dir or kubelet_dir / "plugins_registry",
            (plugins_dir or kubelet_dir / "plugins") / driver,
            cdi_dir,
            pod_uid,
        )

    @property
    def registration_socket(self) -> Path:
        name = f"{self.driver}-{self.pod_uid}-reg.sock" if self.pod_uid else f"{self.driver}-reg.sock"
        return self.registry_dir / name

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / (f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock")

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def intents(self) -> Path:
        return self.plugin_dir / "prepare-intents"

    @property
    def lock(self) -> Path:
        return self.plugin_dir / "driver.lock"


class ClaimPreparer:
    def __init__(self, driver: Driver, node: str, paths: DriverPaths, claims: ClaimReader, durable: bool = True):
        self.driver = driver
        self.name = driver.name
        self.durable = durable
        self.node = node
        self.paths = paths
        self.claims = claims
        self.checkpoint = Checkpoint(paths.checkpoint, durable)
        self.intents = PrepareIntents(paths.intents)
        self._unsettled: set[str] = set()
        """Claims whose prepare this instance left by an exception other than ClaimFailed:
        the hardware may hold them, so their intents stay until a prepare or a repair
        settles them."""
        self._lock = asyncio.Lock()
        self._read = False
        """Whether this instance read the checkpoint before (its first read is its start)."""
        self.corruptions: list[str] = []
        """Checkpoint problems found (and set aside) since start, for status and tests."""

    # --- locking and checkpoint --------------------------------------------------------

    @contextlib.asynccontextmanager
    async def node_lock(self) -> AsyncIterator[None]:
        async with self._lock:
            self.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                while True:  # non-blocking attempts keep the event loop free
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        await asyncio.sleep(LOCK_POLL_S)
                before = self.checkpoint.claims
                if self._load_checkpoint() and self._read:
                    await self._follow_another_instance(before)
                self._read = True
                yield
            finally:
                os.close(fd)  # releases the flock

    def _load_checkpoint(self) -> bool:
        """Whether the checkpoint was read anew (another instance, or nobody, wrote it last)."""
        try:
            return self.checkpoint.load()
        except CheckpointCorrupt as exc:
            log.error("%s on %s: %s; starting with an empty record", self.name, self.node, exc)
            self.corruptions.append(str(exc))
            metrics.CHECKPOINT_CORRUPTIONS.labels(self.name).inc()
            return False

    async def _follow_another_instance(self, before: Mapping[str, ClaimRecord]) -> None:
        """Another instance of this driver on the node (a rolling update's old or new one)
        changed the checkpoint since this one last read or wrote it: what this one holds
        follows the record, as it would follow real devices. A claim the other unprepared
        is released here too, else this instance would refuse its devices to the next
        claim as still in use; a claim the other prepared is held here too."""
        for uid in before.keys() - self.checkpoint.claims.keys():
            await self.driver.unprepare(uid)
        for uid, record in self.checkpoint.claims.items():
            if uid not in before and record.state is ClaimState.PREPARE_COMPLETED:
                try:
                    await self.driver.prepare(ClaimToPrepare(record.ref, _held(record), record.configs, repair=True))
                except ClaimFailed as exc:
                    log.error(
                        "%s on %s: cannot hold claim %s another instance prepared: %s", self.name, self.node, uid, exc
                    )

    def _record_gauge(self) -> None:
        completed = sum(1 for c in self.checkpoint.claims.values() if c.state is ClaimState.PREPARE_COMPLETED)
        metrics.PREPARED_CLAIMS.labels(self.name).set(completed)

    async def repair(self) -> None:
        """After a crash: undo half-prepared claims; re-assert completed ones on the hardware
        (which may have restarted and forgotten them)."""
        corruptions_before = len(self.corruptions)
        async with self.node_lock():
            started = {r.uid for r in self.checkpoint.claims.values() if r.state is ClaimState.PREPARE_STARTED}
            for uid in [*self.intents.uids(), *started]:
                record = self.checkpoint.claims.get(uid)
                if record is None or record.state is ClaimState.PREPARE_STARTED:
                    log.warning("%s on %s: undoing claim %s left half-prepared", self.name, self.node, uid)
                    await self.driver.unprepare(uid)
                    cdi.remove_claim_spec(self.paths.cdi_dir, self.name, uid)
                    try:
                        self.checkpoint.remove(uid)
                    except OSError as exc:  # undone all the same; the next repair forgets it
                        log.error(
                            "%s on %s: claim %s undone, its record kept: %s",
                            self.name,
                            self.node,
                            uid,
                            storage_problem(exc),
                        )
            self.intents.reset(force=True)
            self._unsettled.clear()
            for record in list(self.checkpoint.claims.values()):
                if record.state is ClaimState.PREPARE_COMPLETED:
                    try:
                        await self.driver.prepare(
                            ClaimToPrepare(record.ref, _held(record), record.configs, repair=True)
                        )
                    except ClaimFailed as exc:
                        log.error("%s on %s: cannot re-assert claim %s: %s", self.name, self.node, record.uid, exc)
                    try:
                        self._restore_spec(record, thorough=True)
                    except OSError as exc:  # its next prepare tries again
                        log.error("%s on %s: claim %s: %s", self.name, self.node, record.uid, storage_problem(exc))
            # A spec with no record: the machine went down after the spec reached the disk
            # and before any record of its claim did (see _prepare_one), or after an
            # unprepare's record removal did and before the spec's removal. Not after a
            # damaged checkpoint was set aside: its claims' specs may be in use.
            if len(self.corruptions) == corruptions_before:
                self._remove_specs_without_record()
            self._record_gauge()

    def _restore_spec(self, record: ClaimRecord, thorough: bool) -> None:
        """A completed claim's spec, written again if it was lost: the record is the truth."""
        if record.spec is None:
            return  # recorded by an older driver, which kept no copy
        if cdi.restore_claim_spec(self.paths.cdi_dir, self.name, record.uid, record.spec, thorough):
            log.warning("%s on %s: wrote again the lost CDI spec of claim %s", self.name, self.node, record.uid)

    def _remove_specs_without_record(self) -> None:
        for uid, spec in cdi.claim_specs(self.paths.cdi_dir, self.name).items():
            if uid not in self.checkpoint.claims:
                log.warning(
                    "%s on %s: removing CDI spec %s of a claim it holds no record of", self.name, self.node, spec.name
                )
                spec.unlink(missing_ok=True)

    # --- prepare -------------------------------------------------------------------------

    async def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        if not refs:
            return results
        fetched = await self._fetch_all(refs)
        async with self.node_lock():
            for ref in refs:
                if ref.uid in results:
                    continue
                try:
                    results[ref.uid] = PrepareResult(await self._prepare_one(ref, fetched.get(ref.uid)))
                except ClaimFailed as exc:
                    metrics.CLAIM_ERRORS.labels(self.name, "prepare", exc.reason).inc()
                    results[ref.uid] = PrepareResult([], f"{self.name}: {exc}")
            try:
                self.intents.reset(keep=self._unsettled)  # every other prepare it names has ended
            except OSError as exc:
                # Harmless: the repair skips an intent whose claim completed, and undoing
                # one that was undone already does nothing.
                log.warning(
                    "%s on %s: prepare intents left as they were: %s", self.name, self.node, storage_problem(exc)
                )
            self._record_gauge()
        return results

    def _check_ref(self, ref: ClaimRef) -> None:
        """The kubelet sends what the API stored; anything else must not reach a URL."""
        missing = [f for f in ("uid", "namespace", "name") if not getattr(ref, f)]
        if missing:
            raise ClaimFailed("BadRequest", f"claim reference without {', '.join(missing)}")
        if not DNS_LABEL.fullmatch(ref.namespace):
            raise ClaimFailed("BadRequest", f"claim namespace {ref.namespace[:80]!r} is not a DNS label")
        if len(ref.name) > 253 or not DNS_SUBDOMAIN.fullmatch(ref.name):
            raise ClaimFailed("BadRequest", f"claim name {ref.name[:80]!r} is not a DNS subdomain")
        if len(ref.uid) > 128 or not UID.fullmatch(ref.uid):
            raise ClaimFailed("BadRequest", f"claim UID {ref.uid[:80]!r} is malformed")

    async def _fetch_all(self, refs: list[ClaimRef]) -> dict[str, Mapping[str, Any] | ClaimFailed]:
        """Every claim not already prepared, read at once, outside the node lock, within
        CLAIM_FETCH_BUDGET_S; a claim that could not be read maps to why."""

        async def one(ref: ClaimRef) -> Mapping[str, Any] | ClaimFailed:
            try:
                self._check_ref(ref)
                return await self._fetch(ref)
            except ClaimFailed as exc:
                return exc

        def prepared(uid: str) -> bool:
            record = self.checkpoint.claims.get(uid)
            return record is not None and record.state is ClaimState.PREPARE_COMPLETED

        wanted = {ref.uid: ref for ref in refs if not prepared(ref.uid)}
        tasks = {uid: asyncio.create_task(one(ref)) for uid, ref in wanted.items()}
        if not tasks:
            return {}
        finished, late = await asyncio.wait(tasks.values(), timeout=CLAIM_FETCH_BUDGET_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        return {
            uid: task.result()
            if task in finished
            else ClaimFailed(
                "ApiUnreachable",
                f"claim {wanted[uid].namespace}/{wanted[uid].name}: no answer from the API server "
                f"within {CLAIM_FETCH_BUDGET_S:g} s",
            )
            for uid, task in tasks.items()
        }

    async def _prepare_one(
        self, ref: ClaimRef, fetched: Mapping[str, Any] | ClaimFailed | None
    ) -> list[PreparedDeviceRecord]:
        """``fetched``: the claim as read before the lock (None: read it now)."""
        self._check_ref(ref)
        done = self.checkpoint.claims.get(ref.uid)
        if done is not None and done.state is ClaimState.PREPARE_COMPLETED:
            # A kubelet prepares again after it restarts, the node's reboot included.
            try:
                self._restore_spec(done, thorough=False)
            except OSError as exc:
                raise ClaimFailed("StorageError", f"claim {ref.namespace}/{ref.name}: {storage_problem(exc)}") from None
            return done.devices
        if isinstance(fetched, ClaimFailed):
            raise fetched
        claim = fetched if fetched is not None else await self._fetch(ref)
        results, configs = self._allocation(ref, claim)
        conditions = self._true_conditions(claim)
        allocated = [
            AllocatedDevice(
                r["request"],
                r["pool"],
                r["device"],
                r.get("shareID"),
                bool(r.get("adminAccess")),
                _consumed(ref, r),
                conditions.get((r["pool"], r["device"], r.get("shareID")), frozenset()),
            )
            for r in results
        ]
        records = [
            PreparedDeviceRecord(
                request_names=[device.request],
                pool=device.pool,
                device=device.device,
                cdi_device_ids=[
                    cdi.device_id(self.name, cdi.claim_device_name(ref.uid, device.device, device.share_id))
                ],
                share_id=device.share_id,
            )
            for device in allocated
        ]
        wanted = ClaimToPrepare(ref, allocated, configs)
        # One fsync per prepare: the completed record's. The intent needs none: a crashed
        # process leaves it in the page cache for the restarted driver's repair to find,
        # and a machine that goes down resets the devices. The spec needs none either: the
        # completed record holds what it says, and the repair writes again a spec that did
        # not reach the disk (and removes one left without its record).
        try:
            self.intents.add(ref.uid)
        except OSError as exc:  # nothing touched yet
            raise ClaimFailed("StorageError", f"claim {ref.namespace}/{ref.name}: {storage_problem(exc)}") from None
        try:
            try:
                prepared = await self.driver.prepare(wanted)
            except ClaimFailed as exc:
                await self.driver.unprepare(ref.uid)
                self.checkpoint.remove(ref.uid)  # a PrepareStarted record of an older instance
                raise ClaimFailed(exc.reason, f"claim {ref.namespace}/{ref.name}: {exc}") from None
            spec = cdi.ClaimSpec(
                {"DRA_TESTBED_CLAIM": f"{ref.namespace}/{ref.name}"},
                [cdi.CdiDevice(cdi.claim_device_name(ref.uid, p.name, p.share_id), p.env) for p in prepared],
            )
            cdi.write_claim_spec(self.paths.cdi_dir, self.name, ref.uid, spec, durable=False)
            completed = ClaimState.PREPARE_COMPLETED
            consumed = {d.share_id: dict(d.consumed) for d in allocated if d.share_id}
            record = ClaimRecord(
                ref.uid, ref.namespace, ref.name, completed, records, wanted.admin_access, spec, configs, consumed
            )
            self.checkpoint.put(record)
        except ClaimFailed:
            raise
        except OSError as exc:
            # Its spec or record could not be written (a full disk, say): undone, so that
            # nothing holds what no record names, and this claim alone fails, to be
            # asked for again at its pod's next sync.
            try:
                await self.driver.unprepare(ref.uid)
                cdi.remove_claim_spec(self.paths.cdi_dir, self.name, ref.uid)
            except BaseException:
                self._unsettled.add(ref.uid)
                raise
            raise ClaimFailed("StorageError", f"claim {ref.namespace}/{ref.name}: {storage_problem(exc)}") from None
        except BaseException:
            self._unsettled.add(ref.uid)
            raise
        self._unsettled.discard(ref.uid)
        return records

    async def _fetch(self, ref: ClaimRef) -> Mapping[str, Any]:
        try:
            claim = await self.claims.get(ref.namespace, ref.name)
        except ApiError as exc:
            if exc.not_found:
                raise ClaimFailed("NotFound", f"claim {ref.namespace}/{ref.name} does not exist") from None
            raise ClaimFailed("ApiError", f"reading claim {ref.namespace}/{ref.name}: {exc}") from None
        except (TimeoutError, OSError) as exc:  # OSError: the connection (TransportError)
            raise ClaimFailed(
                "ApiUnreachable", f"reading claim {ref.namespace}/{ref.name}: {type(exc).__name__} {exc}".strip()
            ) from None
        if claim["metadata"]["uid"] != ref.uid:
            raise ClaimFailed(
                "UIDMismatch",
                f"claim {ref.namespace}/{ref.name} has UID {claim['metadata']['uid']}, "
                f"not {ref.uid}: it was deleted and created again",
            )
        return claim

    def _allocation(self, ref: ClaimRef, claim: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimFailed("NotAllocated", f"claim {ref.namespace}/{ref.name} is not allocated")
        devices = allocation.get("devices") or {}
        results = [r for r in devices.get("results") or [] if r.get("driver") == self.name]
        if not results:
            raise ClaimFailed(
                "NoDevices",
                f"claim {ref.namespace}/{ref.name} has no devices allocated by {self.name}",
            )
        elsewhere = sorted({r["pool"] for r in results if r.get("pool") != self.node})
        if elsewhere:
            raise ClaimFailed(
                "WrongNode",
                f"claim {ref.namespace}/{ref.name} is allocated on node(s) {', '.join(elsewhere)}, not on {self.node}",
            )
        return results, list(devices.get("config") or [])

    def _true_conditions(self, claim: Mapping[str, Any]) -> dict[tuple[str, str, str | None], frozenset[str]]:
        """By (pool, device, share ID): the condition types True in the claim's status."""
        found = {}
        for entry in (claim.get("status") or {}).get("devices") or []:
            if entry.get("driver") != self.name:
                continue
            true = frozenset(str(c.get("type")) for c in entry.get("conditions") or [] if c.get("status") == "True")
            found[(str(entry.get("pool")), str(entry.get("device")), entry.get("shareID"))] = true
        return found

    # --- unprepare -----------------------------------------------------------------------

    async def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        """Release each claim; unknown claims succeed (nothing to do)."""
        errors: dict[str, str] = {}
        if not refs:
            return errors
        async with self.node_lock():
            for ref in refs:
                if not ref.uid or len(ref.uid) > 128 or not UID.fullmatch(ref.uid):
                    # never let it near a file name: it names the CDI spec to remove
                    errors[ref.uid] = f"{self.name}: claim UID {ref.uid[:80]!r} is malformed"
                    continue
                try:
                    await self.driver.unprepare(ref.uid)
                    cdi.remove_claim_spec(self.paths.cdi_dir, self.name, ref.uid)
                    self.checkpoint.remove(ref.uid)
                    errors[ref.uid] = ""
                except (ClaimFailed, OSError) as exc:
                    metrics.CLAIM_ERRORS.labels(self.name, "unprepare", type(exc).__name__).inc()
                    why = storage_problem(exc) if isinstance(exc, OSError) else str(exc)
                    errors[ref.uid] = f"{self.name}: unprepare {ref.namespace}/{ref.name}: {why}"
            self._record_gauge()
        return errors


def storage_problem(exc: OSError) -> str:
    """One line naming the file the driver could not write and the way out."""
    where = f"cannot write {exc.filename}" if exc.filename else "cannot write its records"
    fix = (
        "free space on that file system"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT)
        else "check that file system (mounted read-only? permissions?)"
    )
    return f"{where}: {exc.strerror or exc}; {fix}: the kubelet asks again"


def _consumed(ref: ClaimRef, result: Mapping[str, Any]) -> dict[str, int]:
    """What a share of a shareable device consumes, from its allocation result."""
    try:
        return {str(k): quantity.parse(str(v)) for k, v in (result.get("consumedCapacity") or {}).items()}
    except ValueError as exc:
        raise ClaimFailed(
            "InvalidAllocation", f"claim {ref.namespace}/{ref.name}: consumedCapacity of {result.get('device')}: {exc}"
        ) from None


def _held(record: ClaimRecord) -> list[AllocatedDevice]:
    """The devices a completed claim holds, as its record says (to hold them again)."""
    return [
        AllocatedDevice(
            d.request_names[0],
            d.pool,
            d.device,
            d.share_id,
            record.admin_access,
            record.consumed.get(d.share_id, {}) if d.share_id else {},
        )
        for d in record.devices
    ]
