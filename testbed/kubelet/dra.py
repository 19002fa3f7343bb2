"""The fake kubelet's DRA manager, as kubelet v1.37's (pkg/kubelet/cm/dra): which
ResourceClaims a pod uses, their NodePrepareResources and NodeUnprepareResources calls
(through the drivers' gRPC sockets only: plugins.py), the claim info it keeps and
checkpoints (claiminfo.py), the CDI devices each container gets, and the health of
those devices in the pod's status. The pod workers (pods.py) call it as the kubelet's
call its manager: before a pod's containers start, and once they stopped.

As the kubelet's:
- a claim is known by namespace and name and shared by the pods that use it: prepared
  once, for its first user, and unprepared when its last user is gone. While one is
  being unprepared, no new pod gets it, nor a new claim made under its name;
- a claim is recorded (and checkpointed) with its pod BEFORE its drivers are asked, so
  one whose prepare failed is still unprepared when the pod goes; a failed unprepare is
  made again until it succeeds;
- the checkpoint (``<kubelet dir>/dra_manager_state.json``) lets a restarted kubelet know
  which claims its running pods hold, without preparing them again;
- every 60 s (``reconcile_once``), claims held only by pods that are gone (force-deleted,
  or deleted while this kubelet was down) are unprepared;
- extended resources backed by DRA: the claim the scheduler made for them
  (``status.extendedResourceClaimStatus``) is prepared with the pod's own claims, and
  each container gets the devices of the requests mapped to the resources it asks for;
- a container gets the CDI devices of the claim requests it names, matched EXACTLY
  against the ``request_names`` the driver returned (a device with none goes to all).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.http11 import TransportError
from testbed.kubeapi import ApiError, ClaimRef, KubeClient, Obj, path_for
from testbed.kubelet import claiminfo, metrics, skips
from testbed.kubelet.claiminfo import PreparedClaim
from testbed.kubelet.plugins import PluginCallError, PluginManager, PreparedDevice
from testbed.kubeletplugin import cdi

log = logging.getLogger(__name__)

PREPARE_FAILED = "FailedPrepareDynamicResources"
PREPARE_FAILED_MESSAGE = "Failed to prepare dynamic resources: prepare dynamic resources"
"""The event's words and the kubelet's own wrapping of every PrepareResources error."""
NO_RELATIONSHIP = "no relationship found between node"
"""The node authorizer's refusal of an object it does not (yet) link to the node."""
AUTHORIZER_CATCH_UP_S = (0.005, 0.01, 0.02, 0.04, 0.08)
POD_GROUP_API = "scheduling.k8s.io"
EXTENDED_RESOURCES = ":extended-resources"
"""Stands for the pod's extended-resource claim among its claim names (no pod claim can be
named so: those are DNS labels)."""


@dataclass
class LinkWait:
    """How long a pod start waited for the node authorizer to link its claims to the node."""

    seconds: float = 0.0


class StartFailed(Exception):
    """A pod's start failed, in the kubelet's words: its claims' (here), its sandbox's or
    the runtime's (pods.py)."""

    def __init__(self, reason: str, message: str, created: tuple[str, str] | None = None):
        """``created``: the runtime made the sandbox, and this container (its name) it
        refused, in these words (the runtime's); the Event is then about that container."""
        super().__init__(message)
        self.reason = reason
        self.created = created
        self.container = created[0] if created else ""


class DRAManager:
    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        plugins: PluginManager,
        cdi_dir: Path,
        checkpoint: Path | None = None,
        durable: bool = True,
    ):
        """``checkpoint``: where the claim info is kept (None: nowhere). ``durable``:
        fsync it, as the kubelet does (a real node); synthetic nodes, whose state is
        throw-away, skip it."""
        self.client = client
        self.node_name = node_name
        self.plugins = plugins
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint
        self.durable = durable
        self.claims: dict[str, PreparedClaim] = {}
        """The claim info cache, by claim UID."""
        self._checkpoint_behind = False
        """The last checkpoint write failed: the claims in memory are the truth until one succeeds."""
        self._claim_uids: dict[str, dict[str, str]] = {}
        """By pod UID: the pod's claim name -> ResourceClaim UID, for the pods started here."""
        self._started_before_restart: set[str] = set()
        """Pods whose claims were prepared when the checkpoint was written: their sandbox,
        if they had one, outlived this kubelet's restart (``prepared_before_restart``)."""
        self._restarted_node = False
        """Whether this kubelet's state (its checkpoint) was there when it started: then
        the sandboxes of its pods without claims outlived its restart too, as a runtime
        keeps them."""

    def load_checkpoint(self) -> None:
        """At the kubelet's start: the claim info its last run kept."""
        if self.checkpoint is None:
            return
        self._restarted_node = self.checkpoint.exists()
        if not self._restarted_node:
            # As the kubelet's DRA manager does at its first start: an empty checkpoint,
            # whose presence tells a restart from a first start.
            with contextlib.suppress(OSError):
                claiminfo.write_checkpoint(self.checkpoint, {}, durable=self.durable)
        claims = claiminfo.read_checkpoint(self.checkpoint, self.node_name)
        for claim in claims.values():
            if claim.prepared:
                self._started_before_restart |= claim.users
            # As the kubelet restores its claim info: not prepared until a driver says so
            # again, so a pod that starts now (one more user of a shared claim, or a pod
            # made again after a reboot) asks the driver once more.
            claim.prepared = False
        self.claims = claims

    def _save_checkpoint(self) -> None:
        """Raises OSError (a full disk, say). As the kubelet's claim info cache, what is
        in memory stays the truth and the next write that succeeds records all of it."""
        if self.checkpoint is None:
            return
        try:
            claiminfo.write_checkpoint(self.checkpoint, self.claims, durable=self.durable)
        except OSError:
            self._checkpoint_behind = True
            raise
        self._checkpoint_behind = False

    def _checkpoint_for_start(self, what: str) -> None:
        """A failed write fails the pod's start in the kubelet's words (its next sync tries again)."""
        try:
            self._save_checkpoint()
        except OSError as exc:
            raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: {what}: {go_path_error(exc)}") from None

    async def pod_claims(self, pod: Obj, link_wait: LinkWait | None = None) -> list[Obj]:
        """The pod's ResourceClaims, each allocated and reserved for it (and, made from a
        template, owned by it). Failures read as the kubelet's (FailedPrepareDynamicResources)."""
        link_wait = link_wait or LinkWait()
        meta = pod["metadata"]
        claims = []
        entries = list(pod["spec"].get("resourceClaims", []))
        extended = pod.get("status", {}).get("extendedResourceClaimStatus")
        if extended:  # the claim the scheduler made for the pod's extended resources
            entries.append({"name": EXTENDED_RESOURCES, "resourceClaimName": extended["resourceClaimName"]})
        for entry in entries:
            name, generated = pod_claim_name(pod, entry)
            if name is None:
                continue  # no claim was needed: the entry is ignored
            try:
                claim = await self._read_claim(
                    path_for("resource.k8s.io/v1", "resourceclaims", name, meta["namespace"]), link_wait
                )
            except ApiError as exc:
                raise StartFailed(
                    PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: fetch ResourceClaim {name}: {exc.message}"
                ) from None
            except (TransportError, TimeoutError) as exc:
                raise StartFailed(
                    PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: fetch ResourceClaim {name}: {exc or 'timed out'}"
                ) from None
            if generated and (not_ours := _not_made_for(pod, claim)):
                raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: {not_ours}")
            status = claim.get("status", {})
            if not _reserved_for(pod, claim):
                raise StartFailed(
                    PREPARE_FAILED,
                    f"{PREPARE_FAILED_MESSAGE}: pod {meta['name']} ({meta['uid']}) is not allowed to use "
                    f"ResourceClaim {name} ({claim['metadata']['uid']})",
                )
            if not status.get("allocation"):
                raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: ResourceClaim {name}: not allocated")
            claims.append(dict(claim, _pod_claim_name=entry["name"]))
        return claims

    async def _read_claim(self, path: str, link_wait: LinkWait) -> Obj:
        """The kubelet reads a claim only after it mounted the pod's volumes (at least its
        service-account token, by a reconciler that runs every 100 ms); by then the API
        server's node authorizer has linked the newly bound pod's claims to the node. This
        kubelet mounts nothing and asks at once, and so can ask before that link exists:
        it then asks again, for up to ~0.15 s, rather than fail a start the real kubelet
        would not have failed (its next attempt comes at the pod's next sync, 60-90 s
        later). The time refused is added to ``link_wait``: it stands in for the mount."""
        first_asked = asked = time.perf_counter()
        try:
            for delay in (*AUTHORIZER_CATCH_UP_S, None):
                try:
                    # As the kubelet's client-go: an API server that refuses the
                    # connection (restarting, say) fails the read, and so the start.
                    return await self.client.get(path, retry_unreachable=False)
                except ApiError as exc:
                    if delay is None or not (exc.status == 403 and NO_RELATIONSHIP in exc.message):
                        raise
                    metrics.CLAIM_READ_RETRIES.inc()
                await asyncio.sleep(delay)
                asked = time.perf_counter()
        finally:
            link_wait.seconds += asked - first_asked
        raise AssertionError("unreachable")

    def prepared_before_restart(self, pod: Obj) -> bool:
        """Whether the pod's claims were prepared here before this kubelet restarted (the
        checkpoint says so), or it has none and this kubelet's state was there: its
        sandbox, if its status shows one, outlived the restart."""
        status = pod.get("status", {})
        claimless = not pod["spec"].get("resourceClaims") and not status.get("extendedResourceClaimStatus")
        return pod["metadata"]["uid"] in self._started_before_restart or (self._restarted_node and claimless)

    async def adopt(self, pod: Obj) -> dict[str, dict[str, str]]:
        """A pod whose containers outlived this kubelet's restart: the kubelet prepares
        resources only for a pod sandbox it creates, so no driver is asked; the
        containers' devices are those the checkpoint recorded."""
        claims = await self.pod_claims(pod)
        return self._container_env(pod, claims) if claims else {}

    async def prepare(self, pod: Obj) -> dict[str, dict[str, str]]:
        """The timed part is what a kubelet times as PrepareResources: reading the pod's
        claims from the API server and the NodePrepareResources calls, for every pod
        start (claim-less pods too). Not timed: resolving CDI IDs (the runtime's work),
        and the reads the node authorizer refused while it caught up (they stand in for
        the volume mount a kubelet waits for before it prepares anything)."""
        uid = pod["metadata"]["uid"]
        started = time.perf_counter()
        link_wait = LinkWait()
        failed = True
        try:
            claims = await self.pod_claims(pod, link_wait)
            if claims:
                await self.prepare_claims(uid, claims)
            failed = False
        finally:
            metrics.OPERATIONS.labels("PrepareResources", str(failed).lower()).observe(
                time.perf_counter() - started - link_wait.seconds
            )
            if link_wait.seconds:
                metrics.LINK_WAITS.observe(link_wait.seconds)
        return self._container_env(pod, claims) if claims else {}

    async def prepare_claims(self, pod_uid: str, claims: list[Obj]) -> None:
        """As the kubelet does, a claim is recorded (and checkpointed) with its pod BEFORE
        the driver is asked: a claim whose prepare failed is still unprepared when the
        pod goes. A claim counts as prepared once every driver it uses prepared it; the
        others are asked again on the next attempt (prepare is idempotent).

        As in the kubelet, only the bookkeeping is one step (here: no await within it);
        the drivers are called while other pods' claims are prepared and unprepared, so a
        driver gets concurrent calls, as from a real kubelet's parallel pod workers."""
        by_driver: dict[str, list[Obj]] = {}
        for claim in claims:
            spared = skips.skipped_calls(claim)
            for driver in _drivers(claim):
                # Before any claim is recorded, as the kubelet checks: a pod that never
                # reached a driver leaves nothing to unprepare. A driver it does not call
                # need not be there.
                if skips.PREPARE not in spared.get(driver, ()) and self.plugins.plugin_for(driver) is None:
                    raise StartFailed(
                        PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: DRA driver {driver} is not registered"
                    )
        try:
            for claim in claims:
                known = self._record_user(pod_uid, claim)
                if not known.prepared:
                    for driver in known.drivers:
                        if known.calls(driver, skips.PREPARE):
                            by_driver.setdefault(driver, []).append(claim)
                        else:
                            metrics.PREPARE_SKIPS.labels(driver).inc()
        except BaseException:
            with contextlib.suppress(OSError):  # the claims recorded before the refused one
                self._save_checkpoint()
            raise
        self._checkpoint_for_start("checkpoint ResourceClaim cache")
        answered: dict[str, set[str]] = {}
        devices: dict[str, list[PreparedDevice]] = {}
        for driver, driver_claims in by_driver.items():
            refs = [
                ClaimRef(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in driver_claims
            ]
            try:
                results = await self.plugins.prepare(driver, refs)
            except PluginCallError as exc:
                # As the kubelet: the first failure ends the attempt; drivers that did
                # prepare are asked again next time (prepare is idempotent). Nothing to
                # save: the claims were checkpointed with their pod above.
                raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: {exc}") from None
            for claim_uid, prepared in results.items():
                answered.setdefault(claim_uid, set()).add(driver)
                devices.setdefault(claim_uid, []).extend(prepared)
        for claim in claims:
            held = self.claims.get(claim["metadata"]["uid"])
            if held is None:  # as the kubelet words it; the pod's user record prevents it
                meta = claim["metadata"]
                raise StartFailed(
                    PREPARE_FAILED,
                    f"{PREPARE_FAILED_MESSAGE}: internal error: unable to get claim info for ResourceClaim "
                    f"{meta['name']} in namespace {meta['namespace']}",
                )
            called = {d for d in held.drivers if held.calls(d, skips.PREPARE)}
            if not held.prepared and answered.get(held.uid, set()) == called:
                held.devices, held.prepared = devices.get(held.uid, []), True
        self._checkpoint_for_start("checkpoint ResourceClaim state")

    def _record_user(self, pod_uid: str, claim: Obj) -> PreparedClaim:
        """The claim, known from now on to be used by this pod. As the kubelet keeps its
        claim info by namespace and name: a claim that a pod force-deleted earlier still
        holds under the same name, or whose unprepare has begun, is not for a new pod
        until its unprepare succeeded (the claims before it stay recorded, as there)."""
        meta = claim["metadata"]
        name, uid = meta["name"], meta["uid"]
        known = self.claim_named(meta["namespace"], name)
        if known is None:
            known = self.claims[uid] = PreparedClaim(
                meta["namespace"], name, uid, _drivers(claim), skipped=skips.skipped_calls(claim)
            )
        elif known.uid != uid:
            raise StartFailed(
                PREPARE_FAILED,
                f"{PREPARE_FAILED_MESSAGE}: old ResourceClaim with same name {name} and different UID "
                f"{known.uid} still exists (previous pod force-deleted?!)",
            )
        elif known.unpreparing:
            raise StartFailed(PREPARE_FAILED, f"{PREPARE_FAILED_MESSAGE}: ResourceClaim {name} is being unprepared")
        known.users.add(pod_uid)
        return known

    def _container_env(self, pod: Obj, claims: list[Obj]) -> dict[str, dict[str, str]]:
        self._claim_uids[pod["metadata"]["uid"]] = {c["_pod_claim_name"]: c["metadata"]["uid"] for c in claims}
        by_pod_name = {c["_pod_claim_name"]: self.claims[c["metadata"]["uid"]] for c in claims}
        env: dict[str, dict[str, str]] = {}
        spec = pod["spec"]
        # Init containers too: the runtime gives each its devices when it starts.
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            wanted = [(ref["name"], ref.get("request")) for ref in container.get("resources", {}).get("claims", [])]
            wanted += [(EXTENDED_RESOURCES, request) for request in _extended_requests(pod, container)]
            ids: list[str] = []
            for claim_name, request in wanted:
                prepared = by_pod_name.get(claim_name)
                if prepared is None:
                    continue
                for device in prepared.devices:
                    # Exactly as the kubelet matches (ClaimInfo.cdiDevicesAsList): a driver
                    # that returns "req/sub" instead of "req" leaves the container without it.
                    if not request or not device.request_names or request in device.request_names:
                        ids.extend(device.cdi_device_ids)
            try:
                env[container["name"]] = cdi.resolve(self.cdi_dir, ids)
            except cdi.CdiResolutionError as exc:
                refused = (container["name"], f"failed to inject CDI devices: {exc}")
                raise StartFailed("Failed", f"Error: {refused[1]}", refused) from None
        return env

    async def release(self, pod_uid: str) -> bool:
        """True once nothing is left to unprepare for this pod. As the kubelet: a claim
        other pods still use only loses this user; a claim this pod was the last user of
        keeps it as its user until every driver unprepared it, and is then forgotten.
        Every attempt is timed as the kubelet's UnprepareResources, for every pod (those
        without claims, or sharing them, too)."""
        started = time.perf_counter()
        done = False
        try:
            last: list[PreparedClaim] = []
            changed = False
            for claim in self.claims.values():
                if pod_uid in claim.users:
                    changed = True
                    if len(claim.users) > 1:
                        claim.users.discard(pod_uid)
                    else:
                        last.append(claim)
            done = await self._unprepare(last)
            if changed or self._checkpoint_behind:
                try:
                    self._save_checkpoint()
                except OSError as exc:  # as the kubelet: this attempt failed, the next writes it
                    log.warning("unprepare on %s: checkpoint ResourceClaim state: %s", self.node_name, exc)
                    done = False
        finally:
            metrics.OPERATIONS.labels("UnprepareResources", str(not done).lower()).observe(
                time.perf_counter() - started
            )
        return done

    async def _unprepare(self, claims: list[PreparedClaim]) -> bool:
        """Ask each driver to unprepare these claims; False if one failed: the attempt ends
        there, as in the kubelet, and is made again later. They are marked as being
        unprepared before the first call, so no new pod may use them until then."""
        if not claims:
            return True
        failed = False
        for claim in claims:
            claim.unpreparing = True
            for driver in [d for d in claim.drivers if not claim.calls(d, skips.UNPREPARE)]:
                metrics.UNPREPARE_SKIPS.labels(driver).inc()
                claim.drivers.remove(driver)
        for driver in sorted({d for c in claims for d in c.drivers}):
            mine = [c for c in claims if driver in c.drivers]
            try:
                await self.plugins.unprepare(driver, [c.ref for c in mine])
            except PluginCallError as exc:
                failed = True
                log.warning("unprepare on %s failed, will retry: %s", self.node_name, exc)
                break
            for claim in mine:
                claim.drivers = [d for d in claim.drivers if d != driver]
        for claim in claims:
            if not claim.drivers:
                self.claims.pop(claim.uid, None)
        return not failed

    def forget(self, pod_uid: str) -> None:
        """The pod is done with its claims (``release`` succeeded): its devices are no
        longer shown."""
        self._claim_uids.pop(pod_uid, None)

    def has_claims(self, pod_uid: str) -> bool:
        """Whether the pod started here with claims (its status shows their devices' health)."""
        return bool(self._claim_uids.get(pod_uid))

    def uses_devices(self, pod_uid: str, driver: str, devices: set[tuple[str, str]]) -> bool:
        """Whether the pod's claims hold one of these (pool, device) of ``driver``."""
        return any(
            d.driver == driver and (d.pool, d.device) in devices
            for claim_uid in self._claim_uids.get(pod_uid, {}).values()
            if (claim := self.claims.get(claim_uid)) is not None
            for d in claim.devices
        )

    def prepared_drivers(self) -> list[list[str]]:
        """For each claim prepared here, the drivers it uses (for dra_resource_claims_in_use)."""
        return [c.drivers for c in self.claims.values() if c.prepared]

    def claim_named(self, namespace: str, name: str) -> PreparedClaim | None:
        """The claim this kubelet holds under that name (as the kubelet keys them)."""
        return next((c for c in self.claims.values() if c.name == name and c.namespace == namespace), None)

    async def reconcile_once(self, active: set[str]) -> None:
        """As the kubelet's DRA manager every 60 s, once its pod source synced: claims held
        only by pods that are gone (deleted while this kubelet was down, say, or
        force-deleted) are unprepared, and such pods stop counting as users of claims
        that live pods still use. ``active``: the pods still running or stopping here."""
        # (no users at all: a claim recorded so by a fake kubelet before 2026-11-23)
        stale = [c for c in self.claims.values() if c.users - active or not c.users]
        for claim in stale:
            if claim.users & active:
                claim.users &= active
        if stale or self._checkpoint_behind:
            await self._unprepare([c for c in stale if not c.users & active])
            try:
                self._save_checkpoint()
            except OSError as exc:  # the next reconcile writes it
                log.warning("reconcile on %s: checkpoint ResourceClaim state: %s", self.node_name, exc)

    def allocated_resources_status(self, pod_uid: str, container: Obj) -> list[Obj]:
        """As the kubelet builds it (dra Manager.UpdateAllocatedResourcesStatus): one entry
        per claim reference of the container, named ``claim:<name>[/<request>]``, with the
        health of each device of that request, identified by its first CDI ID."""
        claim_uids = self._claim_uids.get(pod_uid, {})
        now = time.monotonic()
        result = []
        for ref in container.get("resources", {}).get("claims", []):
            prepared = self.claims.get(claim_uids.get(ref["name"], ""))
            if prepared is None:
                continue
            request = ref.get("request") or ""
            base = request.split("/", 1)[0]
            resources: list[Obj] = []
            seen = set()
            for device in prepared.devices:
                if request and device.request_names and base not in device.request_names:
                    continue
                resource_id = (
                    device.cdi_device_ids[0]
                    if device.cdi_device_ids
                    else f"{device.driver}/{device.pool}/{device.device}"
                )
                if resource_id in seen:
                    continue
                seen.add(resource_id)
                health, message = self.plugins.health.get(device.driver, device.pool, device.device, now)
                entry: Obj = {"resourceID": resource_id, "health": health.value}
                if message:
                    entry["message"] = message
                resources.append(entry)
            if resources:
                name = f"claim:{ref['name']}" + (f"/{request}" if request else "")
                result.append({"name": name, "resources": resources})
        return result


def _extended_requests(pod: Obj, container: Obj) -> list[str]:
    """The requests of the pod's extended-resource claim that this container gets: those
    the scheduler mapped to an extended resource the container asks for (not zero)."""
    extended = pod.get("status", {}).get("extendedResourceClaimStatus")
    if not extended:
        return []
    requests = container.get("resources", {}).get("requests", {})
    asked = {name for name, quantity in requests.items() if _nonzero(quantity)}
    return [
        m["requestName"]
        for m in extended.get("requestMappings", [])
        if m.get("containerName") == container["name"] and m.get("resourceName") in asked
    ]


def _nonzero(quantity: object) -> bool:
    number = re.match(r"[+-]?(\d+\.?\d*|\.\d+)", str(quantity))
    return number is None or float(number.group()) != 0


def go_path_error(exc: OSError) -> str:
    """An OSError as Go prints the same failure (``write /path: no space left on device``)."""
    why = exc.strerror or str(exc)
    why = why[:1].lower() + why[1:]
    return f"write {exc.filename}: {why}" if exc.filename else why


def pod_claim_name(pod: Obj, entry: Obj) -> tuple[str | None, bool]:
    """The name of the ResourceClaim a pod's claim entry stands for, and whether it was
    made from a template (its owner must then be the pod); None: no claim was needed."""
    meta = pod["metadata"]
    if entry.get("resourceClaimName"):
        return entry["resourceClaimName"], False
    if entry.get("resourceClaimTemplateName"):
        for status in pod.get("status", {}).get("resourceClaimStatuses", []):
            if status.get("name") == entry["name"]:
                return status.get("resourceClaimName"), True
        raise StartFailed(
            PREPARE_FAILED,
            f'{PREPARE_FAILED_MESSAGE}: pod "{meta["namespace"]}/{meta["name"]}": ResourceClaim not created yet',
        )
    raise StartFailed(
        PREPARE_FAILED,
        f'{PREPARE_FAILED_MESSAGE}: pod "{meta["namespace"]}/{meta["name"]}", spec.resourceClaim '
        f'"{entry.get("name")}": none of the supported fields are set',
    )


def _controlled_by(obj: Obj, owner_uid: str) -> bool:
    return any(r.get("controller") and r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences", []))


def _pod_group(pod: Obj) -> str | None:
    return (pod["spec"].get("schedulingGroup") or {}).get("podGroupName")


def _not_made_for(pod: Obj, claim: Obj) -> str | None:
    """Why a claim made from a template is not the pod's to use (None: it is): made for
    another pod, or, for a pod of a PodGroup, neither for it nor for its group
    (DRAWorkloadResourceClaims, which the testbed's clusters enable, kubelets included:
    a PodGroup's claim is the group's, owned by the PodGroup, which the pod knows by name
    only)."""
    meta = pod["metadata"]
    if _controlled_by(claim, meta["uid"]):
        return None
    namespace = meta["namespace"]
    about = f"ResourceClaim {namespace}/{claim['metadata']['name']} was not created for Pod {namespace}/{meta['name']}"
    group = _pod_group(pod)
    if group is None:
        return f"{about} (Pod is not owner)"
    controller: Obj = next((r for r in claim["metadata"].get("ownerReferences", []) if r.get("controller")), {})
    if (
        controller.get("kind") == "PodGroup"
        and controller.get("name") == group
        and str(controller.get("apiVersion", "")).startswith(f"{POD_GROUP_API}/")
    ):
        return None
    return f"{about} (neither Pod nor PodGroup {group} is the owner)"


def _reserved_for(pod: Obj, claim: Obj) -> bool:
    """The claim is reserved for the pod, or for its PodGroup (known by name: a pod does
    not know its group's UID)."""
    group = _pod_group(pod)
    for consumer in claim.get("status", {}).get("reservedFor", []):
        if consumer.get("uid") == pod["metadata"]["uid"]:
            return True
        if (
            group is not None
            and consumer.get("apiGroup") == POD_GROUP_API
            and consumer.get("resource") == "podgroups"
            and consumer.get("name") == group
        ):
            return True
    return False


def _drivers(claim: Obj) -> list[str]:
    return sorted({r["driver"] for r in claim["status"]["allocation"]["devices"]["results"]})
