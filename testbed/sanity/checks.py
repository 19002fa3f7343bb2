"""`testbed sanity`: what a kubelet relies on from any DRA kubelet plugin, checked on the wire.

Each check says PASS, FAIL or WARN (allowed, but a kubelet or an upgrade will trip on it)
and why; SKIP when an earlier failure leaves nothing to check. The order matters: the
checks that restart the driver come last.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import socket
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc

from testbed import quantity
from testbed.errors import TestbedError
from testbed.grpcapi.probe import grpc_health_check
from testbed.http11 import TransportError
from testbed.kubeapi import ClaimRef
from testbed.kubelet.plugins import DRA_SERVICES, HEALTH_SERVICES, choose_service
from testbed.kubeletplugin import cdi
from testbed.kubeletplugin.slices import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
)
from testbed.sanity.harness import CALL_TIMEOUT_S, REGISTRATION_TIMEOUT_S, Claim, Harness, Registration

SLICES_WAIT_S = 60.0
SYNC_DELAY_S = 30.0
"""The upstream ResourceSlice controller's default delay before it syncs a changed pool."""
REPUBLISH_MARGIN_S = 15.0
"""Beyond what the upstream ResourceSlice controller waits, for the driver to publish."""
REPUBLISH_WAIT_S = SYNC_DELAY_S + REPUBLISH_MARGIN_S
"""A starting kubelet deletes its node's slices; the driver must notice and publish again.
Drivers on the upstream ResourceSlice controller do 30 s after the deletion by default
(its sync delay), so a margin beyond that."""
FRESH_SLICES_TRUSTED_S = 60.0
"""The upstream ResourceSlice controller trusts the slices it made to be there for a minute
(its mutation cache's TTL), deletions notwithstanding: slices deleted within that minute
come back once it is over (a re-sync at their creation + 60 s)."""
UNPREPARE_PATIENCE_S = 5.0
LIVENESS_TIMEOUT_S = 5.0
"""How long one liveness check may take to answer (a probe's timeoutSeconds)."""
LIVENESS_WAIT_S = 20.0
"""How soon the liveness endpoint must see a broken DRA socket, and a mended one."""
DEFAULT_HEALTH_TIMEOUT_S = 30
CHECK_TIMEOUT_S = 180.0
"""Each check's bound, with the default registration timeout: a check that restarts the
driver waits for it to register up to twice, so a longer registration timeout lengthens
the bound by twice the difference (``check_timeout_s``)."""


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    WARN = "WARN"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Result:
    name: str
    status: Status
    detail: str
    seconds: float = 0.0


class Problem(Exception):
    """A check's finding: FAIL (or WARN) with the reason."""

    def __init__(self, detail: str, status: Status = Status.FAIL):
        super().__init__(detail)
        self.status = status


def check_timeout_s(registration_timeout_s: float) -> float:
    return CHECK_TIMEOUT_S + 2 * max(0.0, registration_timeout_s - REGISTRATION_TIMEOUT_S)


def expect(condition: bool, detail: str, status: Status = Status.FAIL) -> None:
    if not condition:
        raise Problem(detail, status)


def answer_problem(method: str, asked: set[str], answered: set[str]) -> str:
    """What a kubelet would refuse in an answer's claim UIDs ("" if nothing): kubelet
    v1.37 refuses a whole answer that names a claim it did not ask about, and fails the
    pod when one it asked about is left out."""
    extra, missing = sorted(answered - asked), asked - answered
    if extra:
        return (
            f"{method} answered for claim UID(s) it was not asked about ({', '.join(extra)}): a kubelet refuses "
            f"the whole answer ('{method} returned result for unknown claim UID ...')"
        )
    if missing:
        return (
            f"{method} left out {len(missing)} of the claims it was asked about: a kubelet fails the pod "
            f"('{method} skipped {len(missing)} ResourceClaims')"
        )
    return ""


def _shareable(driver: str, slices: list[Any]) -> tuple[Any, str]:
    """The first device that allows multiple allocations, and a CEL selector that picks
    it out by an attribute no other device of the driver has the same value of."""
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    for device in (d for d in devices if d.get("allowMultipleAllocations")):
        for name, value in (device.get("attributes") or {}).items():
            literal = _cel_literal(value)
            same = [d for d in devices if (d.get("attributes") or {}).get(name) == value]
            if literal is not None and len(same) == 1:
                domain, _, attribute = name.rpartition("/")
                return device, f'device.attributes["{domain or driver}"].{attribute} == {literal}'
        raise Problem(f"no attribute of {device['name']} tells it apart from the driver's other devices", Status.SKIP)
    raise Problem("the driver publishes no device that allows multiple allocations", Status.SKIP)


def _cel_literal(value: Any) -> str | None:
    if "string" in value:
        return json.dumps(value["string"])
    if "int" in value:
        return str(int(value["int"]))
    if "bool" in value:
        return "true" if value["bool"] else "false"
    return None  # a version compares through semver(), not ==


def _least_shares(device: Any) -> dict[str, str]:
    """The least of each capacity its policy allows, if two of that fit the device;
    Problem (SKIP) if they do not."""
    least = {}
    for name, capacity in (device.get("capacity") or {}).items():
        policy = capacity.get("requestPolicy") or {}
        values, valid_range = policy.get("validValues") or [], policy.get("validRange") or {}
        amount = values[0] if values else valid_range.get("min") or "1"
        if 2 * quantity.parse(str(amount)) > quantity.parse(str(capacity["value"])):
            raise Problem(f"{device['name']} cannot hold two shares of {amount} {name}", Status.SKIP)
        least[name] = str(amount)
    return least


def _devices(entry: Any) -> list[tuple[list[str], str, str, list[str]]]:
    return [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in entry.devices]


CHECKS = [
    ("registration", "check_registration"),
    ("services answer", "check_services"),
    ("liveness probe", "check_liveness"),
    ("rolling-update socket names", "check_socket_names"),
    ("resource slices within API limits", "check_slices"),
    ("prepare an allocated claim", "check_prepare"),
    ("idempotent prepare", "check_idempotent"),
    ("v1 and v1beta1 agree", "check_versions_agree"),
    ("unprepare, twice and unknown", "check_unprepare"),
    ("firstAvailable: base request names", "check_first_available"),
    ("shares of one device", "check_shares"),
    ("per-claim errors", "check_per_claim_errors"),
    ("answers name the claims asked", "check_exact_answers"),
    ("health stream", "check_health"),
    ("kubelet restart: slices back", "check_slices_come_back"),
    ("kill -9 mid-prepare, restart, retry", "check_kill_mid_prepare"),
    ("API server unreachable", "check_api_unreachable"),
]
"""In the order they run: the checks that restart the driver come last."""
CHECK_NAMES = [name for name, _ in CHECKS]
_CLAIMS_FROM = CHECK_NAMES.index("prepare an allocated claim")
_ON_THE_SHARED_CLAIM = {"idempotent prepare", "v1 and v1beta1 agree", "unprepare, twice and unknown"}


def select(wanted: Collection[str]) -> list[str]:
    """The checks whose names contain one of ``wanted`` (any case), with what they stand
    on: registration always, the slices check (it makes the DeviceClass) before any claim,
    and the shared claim's prepare and unprepare around the checks that reuse it."""
    chosen: set[str] = set()
    for text in wanted:
        found = {name for name in CHECK_NAMES if text.strip().lower() in name.lower()} if text.strip() else set()
        if not found:
            raise ValueError(f"no check is named like {text!r}; the checks: {'; '.join(CHECK_NAMES)}")
        chosen |= found
    chosen.add("registration")
    if any(CHECK_NAMES.index(name) >= _CLAIMS_FROM for name in chosen):
        chosen.add("resource slices within API limits")
    if chosen & (_ON_THE_SHARED_CLAIM | {"prepare an allocated claim"}):
        chosen |= {"prepare an allocated claim", "unprepare, twice and unknown"}
    return [name for name in CHECK_NAMES if name in chosen]


class Suite:
    def __init__(
        self,
        harness: Harness,
        say: Callable[[Result], None] | None = None,
        only: Collection[str] | None = None,
        liveness: tuple[str, int] | None = None,
    ):
        """``liveness``: the address and port of the driver's gRPC liveness endpoint (what
        its DaemonSet's ``livenessProbe.grpc`` names); None: that check is skipped."""
        self.harness = harness
        self.liveness = liveness
        self.only = set(only) if only is not None else {name for name, _ in CHECKS}
        self.say = say
        self.registration: Registration | None = None
        self.results: list[Result] = []
        self._claim: Claim | None = None

    @property
    def claim(self) -> Claim:
        """The claim the prepare checks share (allocated by the first of them)."""
        if self._claim is None:
            raise Problem("no claim was prepared", Status.SKIP)
        return self._claim

    @property
    def service(self) -> str:
        assert self.registration is not None
        chosen = choose_service(self.registration.versions)
        assert chosen is not None
        return chosen

    async def prepare(self, claims: list[Claim | ClaimRef], service: str = "") -> Any:
        assert self.registration is not None
        return await self.harness.call(
            self.registration.endpoint, service or self.service, "NodePrepareResources", claims
        )

    async def unprepare(self, claims: list[Claim | ClaimRef]) -> Any:
        assert self.registration is not None
        return await self.harness.call(self.registration.endpoint, self.service, "NodeUnprepareResources", claims)

    async def _done_with(self, claim: Claim) -> None:
        """Unprepared, and its pod and claim deleted: its devices are free for the next check."""
        await self.unprepare([claim])
        await self.harness.release(claim)

    async def run(self) -> list[Result]:
        essential = {"registration", "resource slices within API limits"}
        broken = ""
        for name, method in CHECKS:
            if name not in self.only:
                continue
            check: Callable[[], Awaitable[str]] = getattr(self, method)
            started = time.monotonic()
            if broken:
                result = Result(name, Status.SKIP, f"not checked: {broken} failed")
            else:
                try:
                    async with asyncio.timeout(check_timeout_s(self.harness.registration_timeout_s)):
                        detail = await check()
                    result = Result(name, Status.PASS, detail, time.monotonic() - started)
                except Problem as problem:
                    result = Result(name, problem.status, str(problem), time.monotonic() - started)
                except TestbedError as exc:
                    last = (exc.detail or "").strip().splitlines()[-1:] or [""]
                    reason = exc.message + (f"; its log ends: {last[0][:300]}" if last[0] else "")
                    reason += f"\nhint: {exc.hint}" if exc.hint else ""
                    result = Result(name, Status.FAIL, reason, time.monotonic() - started)
                except Exception as exc:  # a check that blew up is a failure, said in one line
                    reason = said(exc)[:400]
                    result = Result(name, Status.FAIL, reason, time.monotonic() - started)
                    if isinstance(exc, TransportError):  # after retries: the cluster is gone (taken down?)
                        broken = "reaching the API server"
                if result.status is Status.FAIL and name in essential:
                    broken = name
            self.results.append(result)
            if self.say is not None:
                self.say(result)
        return self.results

    # --- registration ------------------------------------------------------------------

    async def check_registration(self) -> str:
        info = await self.harness.registered()
        expect(info.type == "DRAPlugin", f"GetInfo type {info.type!r}, not DRAPlugin")
        expected = self.harness.expected_name
        expect(not expected or info.name == expected, f"registers as {info.name!r}, not {expected!r}")
        expect(info.name != "", "GetInfo gives no driver name")
        expect(info.endpoint.startswith("/"), f"endpoint {info.endpoint!r} is not an absolute path")
        expect(Path(info.endpoint).is_socket(), f"endpoint {info.endpoint} is not a socket")
        expect(
            choose_service(info.versions) is not None,
            f"supported versions {info.versions} name no DRA service a kubelet knows ({', '.join(DRA_SERVICES)})",
        )
        self.registration = info
        return f"{info.name} at {info.endpoint}, services {', '.join(info.versions)}"

    async def check_services(self) -> str:
        assert self.registration is not None
        known = [v for v in self.registration.versions if v in DRA_SERVICES]
        for service in known:
            for method in ("NodePrepareResources", "NodeUnprepareResources"):
                response = await self.harness.call(self.registration.endpoint, service, method, [])
                expect(len(response.claims) == 0, f"{service} {method} with no claims answered claims")
        unknown = [v for v in self.registration.versions if v not in DRA_SERVICES and v not in HEALTH_SERVICES]
        expect(not unknown, f"advertises services no kubelet v1.37 knows: {', '.join(unknown)}", Status.WARN)
        return f"{', '.join(known)} answer an empty NodePrepareResources and NodeUnprepareResources"

    async def check_liveness(self) -> str:
        """The good practice: a liveness probe on the driver's gRPC health endpoint, so that
        a driver whose socket broke is restarted. Checked as a kubelet's gRPC probe asks
        (grpc.health.v1 Check, service ""): SERVING while the driver serves, not SERVING
        once its DRA socket is gone (moved aside, then put back), SERVING again after."""
        assert self.registration is not None
        liveness = self.liveness or self.harness.liveness_endpoint()
        if liveness is None:
            raise Problem(
                "no liveness endpoint given: --liveness-port PORT (the port your DaemonSet's "
                "livenessProbe.grpc checks), or the driver's port option set to $(LIVENESS_PORT), has it checked",
                Status.SKIP,
            )
        if not self.harness.restartable:
            raise Problem(
                "the driver of a running node is not the suite's to break (its DRA socket moved aside): "
                "give its command instead of --node",
                Status.SKIP,
            )
        host, port = liveness
        target = f"{host}:{port}"
        serving, now = await _liveness_until(target, lambda status: status == "SERVING")
        expect(serving, f"{target} answers {now} while the driver serves")
        dra_socket = Path(self.registration.endpoint)
        aside = dra_socket.with_name(dra_socket.name + ".sanity-aside")
        dra_socket.rename(aside)
        try:
            started = time.monotonic()
            broken, status = await _liveness_until(target, lambda status: status != "SERVING")
            noticed = time.monotonic() - started
        finally:
            aside.rename(dra_socket)
        expect(
            broken,
            f"{target} still answers SERVING {LIVENESS_WAIT_S:.0f} s after the DRA socket {dra_socket} went away: "
            "a liveness probe on it would never restart a driver whose socket broke (a check that calls the "
            "sockets over connections made once, at its start, still reaches the driver through them, where a "
            "kubelet connecting anew, after its restart, cannot: connect to the socket paths for each check)",
        )
        mended, now = await _liveness_until(target, lambda status: status == "SERVING")
        expect(mended, f"{target} answers {now} {LIVENESS_WAIT_S:.0f} s after the DRA socket was back")
        return f"{target} SERVING; {status} {noticed:.1f} s after the DRA socket went away; SERVING once it was back"

    async def check_socket_names(self) -> str:
        assert self.registration is not None
        uid = self.harness.pod_uid()
        if not uid:
            raise Problem("the node's driver pod is not known, so neither is its UID", Status.SKIP)
        named = [p for p in (self.registration.socket.name, Path(self.registration.endpoint).name) if uid in p]
        expect(
            len(named) == 2,
            f"socket names do not carry POD_UID ({self.registration.socket.name}, "
            f"{Path(self.registration.endpoint).name}): two instances cannot run side by side in a rolling update",
            Status.WARN,
        )
        return "registration and DRA sockets are named after the pod"

    # --- slices ----------------------------------------------------------------------------

    async def check_slices(self) -> str:
        deadline = time.monotonic() + SLICES_WAIT_S
        while not (slices := await self.harness.slices()):
            expect(
                time.monotonic() < deadline,
                f"no ResourceSlices for node {self.harness.node} after {SLICES_WAIT_S:.0f} s",
            )
            await asyncio.sleep(0.5)
        problems = []
        pools: dict[str, list[dict[str, Any]]] = {}
        for item in slices:
            spec, name = item["spec"], item["metadata"]["name"]
            pools.setdefault(spec["pool"]["name"], []).append(item)
            devices = spec.get("devices") or []
            limited = any(d.get("taints") or d.get("consumesCounters") for d in devices)
            most = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if limited else MAX_DEVICES
            if len(devices) > most:
                problems.append(f"{name}: {len(devices)} devices (at most {most})")
            if len(spec.get("sharedCounters") or []) > MAX_COUNTER_SETS:
                problems.append(f"{name}: more than {MAX_COUNTER_SETS} counter sets")
            for device in devices:
                fields = len(device.get("attributes") or {}) + len(device.get("capacity") or {})
                if fields > MAX_ATTRIBUTES_AND_CAPACITIES:
                    problems.append(f"{name}/{device['name']}: {fields} attributes and capacities")
        for pool, members in pools.items():
            newest = max(m["spec"]["pool"]["generation"] for m in members)
            current = [m for m in members if m["spec"]["pool"]["generation"] == newest]
            counts = {m["spec"]["pool"]["resourceSliceCount"] for m in current}
            if counts != {len(current)}:
                problems.append(f"pool {pool}: resourceSliceCount {sorted(counts)} but {len(current)} slices")
        expect(not problems, "; ".join(problems[:5]))
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        expect(devices > 0, "the slices hold no devices: nothing to allocate", Status.WARN)
        await self.harness.ensure_device_class()
        return f"{len(slices)} slices, {devices} devices, in {len(pools)} pool(s)"

    # --- prepare and unprepare -----------------------------------------------------------

    async def _prepared(self, claim: Claim, service: str = "") -> list[tuple[list[str], str, str, list[str]]]:
        response = await self.prepare([claim], service)
        expect(claim.uid in response.claims, f"no answer for claim {claim.name} (uid {claim.uid})")
        entry = response.claims[claim.uid]
        expect(not entry.error, f"claim {claim.name}: {entry.error}")
        return _devices(entry)

    async def check_prepare(self) -> str:
        self._claim = await self.harness.claim(self.harness.one_device())
        devices = await self._prepared(self.claim)
        allocated = [
            (r["request"], r["pool"], r["device"])
            for r in self.claim.allocation["devices"]["results"]
            if r["driver"] == self.harness.driver_name
        ]
        got = [(names[0] if names else "", pool, device) for names, pool, device, _ in devices]
        expect(sorted(got) == sorted(allocated), f"prepared {got}, but the scheduler allocated {allocated}")
        ids = [i for *_, d in devices for i in d]
        expect(bool(ids), "no CDI device IDs: a container would get nothing of the device", Status.WARN)
        self._resolve(ids)
        return f"{got[0][2]} of pool {got[0][1]}, CDI {', '.join(ids)} resolves"

    def _resolve(self, ids: list[str]) -> None:
        """As a container runtime would: every ID names a device in a spec file in $CDI_DIR."""
        try:
            cdi.resolve(Path(self.harness.environment["CDI_DIR"]), ids)
        except cdi.CdiResolutionError as exc:
            raise Problem(f"CDI IDs {ids} do not resolve in $CDI_DIR: {exc}") from None

    async def check_idempotent(self) -> str:
        first = await self._prepared(self.claim)
        second = await self._prepared(self.claim)
        expect(first == second, f"a second prepare of one claim answered {second}, the first {first}")
        return "the same devices and CDI IDs twice"

    async def check_versions_agree(self) -> str:
        assert self.registration is not None
        services = [v for v in self.registration.versions if v in DRA_SERVICES]
        if len(services) < 2:
            raise Problem(f"only {', '.join(services)} advertised", Status.SKIP)
        answers = {service: await self._prepared(self.claim, service) for service in services}
        expect(len({repr(a) for a in answers.values()}) == 1, f"answers differ: {answers}")
        return f"{' and '.join(services)} give the same answer"

    async def check_unprepare(self) -> str:
        for attempt in ("first", "second"):
            response = await self.unprepare([self.claim])
            error = response.claims[self.claim.uid].error if self.claim.uid in response.claims else "no answer"
            expect(not error, f"{attempt} unprepare: {error}")
        stranger = ClaimRef(self.harness.namespace, str(uuid.uuid4()), "never-prepared")
        response = await self.unprepare([stranger])
        error = response.claims[stranger.uid].error if stranger.uid in response.claims else "no answer"
        expect(not error, f"unprepare of a claim it never prepared: {error}")
        await self.harness.release(self.claim)
        return "unprepare succeeds twice, and for a claim it never saw"

    async def check_first_available(self) -> str:
        claim = await self.harness.claim(self.harness.first_available())
        try:
            names = [n for names, *_ in await self._prepared(claim) for n in names]
            expect(
                names == ["dev"],
                f"request_names {names}: a kubelet matches containers' request 'dev' exactly, so a name "
                "with a subrequest ('dev/one') leaves the container without the device",
            )
        finally:
            await self._done_with(claim)
        return "request_names ['dev'] for subrequest dev/one"

    async def check_shares(self) -> str:
        """A device that allows multiple allocations, held twice by one claim: each share is
        answered with its share ID (v1), which the kubelet keeps and names in the
        pod-resources API, and with CDI IDs of its own."""
        device, selector = _shareable(self.harness.driver_name, await self.harness.slices())
        least = _least_shares(device)
        claim = await self.harness.claim(self.harness.two_shares(selector, least))
        try:
            response = await self.prepare([claim])
            expect(claim.uid in response.claims, f"no answer for claim {claim.name}")
            entry = response.claims[claim.uid]
            expect(not entry.error, f"claim {claim.name}: {entry.error}")
            results = {r["request"]: r for r in claim.allocation["devices"]["results"]}
            expect(len(entry.devices) == 2, f"{len(entry.devices)} devices answered for two shares")
            ids = []
            for answered in entry.devices:
                [request] = list(answered.request_names) or [""]
                allocated = results.get(request, {})
                wanted = allocated.get("shareID", "")
                ids.append(tuple(answered.cdi_device_ids))
                if self.service.startswith("v1."):
                    got = answered.share_id if answered.HasField("share_id") else ""
                    expect(
                        got == wanted,
                        f"request {request!r}: share_id {got!r}, the allocation's shareID {wanted!r}: the kubelet "
                        "keeps the answer's, and a monitoring agent reading pod-resources cannot tell the shares apart",
                        Status.WARN,
                    )
            self._resolve([i for answered in ids for i in answered])
            expect(
                ids[0] != ids[1],
                f"both shares of {device['name']} got CDI IDs {list(ids[0])}: a container cannot be given one share "
                "without the other's settings",
                Status.WARN,
            )
        finally:
            await self._done_with(claim)
        taken = ", ".join(f"{k} {v}" for k, v in least.items()) or "no capacity"
        return f"two shares of {device['name']} ({taken} each): share IDs answered, CDI IDs of their own"

    async def check_per_claim_errors(self) -> str:
        good = await self.harness.claim(self.harness.one_device())
        unallocated = await self.harness.claim(self.harness.one_device(), allocate=False)
        unknown = ClaimRef(self.harness.namespace, str(uuid.uuid4()), "no-such-claim")
        mismatched = ClaimRef(good.namespace, str(uuid.uuid4()), good.name)
        try:
            try:
                response = await self.prepare([good, unallocated, unknown, mismatched])
            except grpc.aio.AioRpcError as exc:
                return _failed_as_a_whole(exc)
            for label, uid in (
                ("the allocated claim", good.uid),
                ("an unallocated claim", unallocated.uid),
                ("a claim that does not exist", unknown.uid),
                ("a claim whose UID changed", mismatched.uid),
            ):
                expect(uid in response.claims, f"no answer for {label}")
            expect(
                not response.claims[good.uid].error,
                f"the allocated claim failed beside bad ones: {response.claims[good.uid].error}",
            )
            silent = [
                label
                for label, uid in (
                    ("unallocated", unallocated.uid),
                    ("unknown", unknown.uid),
                    ("UID mismatch", mismatched.uid),
                )
                if not response.claims[uid].error
            ]
            expect(not silent, f"no error for: {', '.join(silent)}")
        finally:
            await self._done_with(good)
            await self.harness.release(unallocated)
        return "each bad claim fails alone; the good one in the same call is prepared"

    async def check_exact_answers(self) -> str:
        good = await self.harness.claim(self.harness.one_device())
        unknown = ClaimRef(self.harness.namespace, str(uuid.uuid4()), "no-such-claim")
        asked = {good.uid, unknown.uid}
        try:
            try:
                prepared = await self.prepare([good, unknown])
            except grpc.aio.AioRpcError as exc:
                prepare = f"prepare failed as a whole, an answer a kubelet reads no further ({whole_call_failure(exc)})"
            else:
                problem = answer_problem("NodePrepareResources", asked, set(prepared.claims))
                expect(not problem, problem)
                prepare = "prepare answers each claim asked about, and no other"
            unprepared = await self.unprepare([good, unknown])
            problem = answer_problem("NodeUnprepareResources", asked, set(unprepared.claims))
            expect(not problem, problem)
        finally:
            await self._done_with(good)
        return f"{prepare}; unprepare answers each claim asked about, and no other"

    # --- health --------------------------------------------------------------------------

    async def check_health(self) -> str:
        assert self.registration is not None
        service = next((h for h in HEALTH_SERVICES if h in self.registration.versions), "")
        if not service:
            raise Problem("no health service advertised (optional)", Status.SKIP)
        first = await self.harness.health_messages(self.registration.endpoint, service, 1, 10.0)
        expect(bool(first), "no first health snapshot within 10 s")
        _, message = first[0]
        reported = {(d.device.pool_name, d.device.device_name) for d in message.devices}
        published = {
            (s["spec"]["pool"]["name"], d["name"])
            for s in await self.harness.slices()
            for d in s["spec"].get("devices") or []
        }
        # The API asks for every device in each message, but a kubelet copes with less (it
        # shows the devices left out as Unknown): a WARN, with what a user would see.
        missing = sorted(published - reported)
        problems = []
        if missing:
            problems.append(
                f"the first snapshot leaves out {len(missing)} published devices, e.g. {missing[:3]}: "
                "a kubelet shows their health Unknown in the pods using them"
            )
        timeout = min(
            (d.health_check_timeout_seconds for d in message.devices if d.health_check_timeout_seconds > 0),
            default=DEFAULT_HEALTH_TIMEOUT_S,
        )
        stream = await self.harness.health_messages(self.registration.endpoint, service, 2, timeout + 2)
        if len(stream) < 2 or stream[1][0] - stream[0][0] > timeout:
            problems.append(
                f"no second snapshot within the {timeout} s timeout: a kubelet marks every device Unknown then"
            )
        expect(not problems, "; ".join(problems), Status.WARN)
        gap = stream[1][0] - stream[0][0]
        return f"{len(reported)} devices in the first snapshot, re-sent after {gap:.1f} s (timeout {timeout} s)"

    # --- restarts ------------------------------------------------------------------------

    async def check_slices_come_back(self) -> str:
        slices = await self.harness.slices()
        # A kubelet that restarts just after the driver published hits the upstream
        # controller's minute of trusting what it made: allowed for, and said.
        made = [dt.datetime.fromisoformat(s["metadata"]["creationTimestamp"]).timestamp() for s in slices]
        age = time.time() - max(made, default=time.time())
        wait = max(REPUBLISH_WAIT_S, FRESH_SLICES_TRUSTED_S - age + REPUBLISH_MARGIN_S)
        await self.harness.admin.request(
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices",
            params={"fieldSelector": f"spec.nodeName={self.harness.node},spec.driver={self.harness.driver_name}"},
        )
        started = time.monotonic()
        while len(await self.harness.slices()) < len(slices):
            expect(
                time.monotonic() - started < wait,
                f"slices deleted as a starting kubelet deletes them were not back within {wait:.0f} s: "
                "the node has no devices until the driver next publishes",
            )
            await asyncio.sleep(0.25)
        took = time.monotonic() - started
        fresh = (
            f" (deleted {age:.0f} s after they were made: the upstream ResourceSlice controller trusts "
            f"what it made for {FRESH_SLICES_TRUSTED_S:.0f} s)"
            if took > REPUBLISH_WAIT_S
            else ""
        )
        return f"{len(slices)} slices back after {took:.1f} s{fresh}"

    async def _reregistered(self, since: float) -> None:
        self.registration = await self.harness.registered(newer_than=since)

    def _needs_restarts(self) -> None:
        if not self.harness.restartable:
            raise Problem(
                "the driver of a running node is not the suite's to restart: give its command instead of --node",
                Status.SKIP,
            )

    async def check_kill_mid_prepare(self) -> str:
        self._needs_restarts()
        assert self.harness.process is not None
        claim = await self.harness.claim(self.harness.one_device())
        process = self.harness.process.process
        assert process is not None
        attempt = asyncio.create_task(self.prepare([claim]))
        await asyncio.sleep(0.005)
        killed_at = time.time()
        os.killpg(process.pid, signal.SIGKILL)
        await asyncio.gather(attempt, return_exceptions=True)
        await self._reregistered(killed_at - 1)
        try:
            devices = await self._prepared(claim)
            self._resolve([i for *_, d in devices for i in d])
        finally:
            await self._done_with(claim)
        return "the restarted driver prepared the claim the killed one was preparing"

    async def check_api_unreachable(self) -> str:
        self._needs_restarts()
        claim = await self.harness.claim(self.harness.one_device())
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        normal = dict(self.harness.environment)
        try:
            started_at = time.time()
            await self.harness.restart_with(
                {**normal, "KUBECONFIG": str(self.harness.unreachable_kubeconfig(silent.getsockname()[1]))}
            )
            await self._reregistered(started_at - 1)
            started = time.monotonic()
            preparing = asyncio.create_task(self.prepare([claim]))
            await asyncio.sleep(0.2)
            stranger = ClaimRef(claim.namespace, str(uuid.uuid4()), "unrelated")
            unprepare_started = time.monotonic()
            await self.unprepare([stranger])
            waited = time.monotonic() - unprepare_started
            try:
                response, failure = await preparing, None
            except grpc.aio.AioRpcError as exc:
                response, failure = None, exc
            took = time.monotonic() - started
            expect(waited < UNPREPARE_PATIENCE_S, f"an unrelated unprepare waited {waited:.1f} s behind the prepare")
            if failure is not None:
                expect(
                    failure.code() is not grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no answer within the kubelet's {CALL_TIMEOUT_S:.0f} s: it gives up on the call and retries",
                )
                return f"the call failed as a whole after {took:.1f} s: {whole_call_failure(failure)}"
            assert response is not None
            entry = response.claims.get(claim.uid)
            expect(entry is not None, "no answer for the claim")
            outcome = (
                f"claim error after {took:.1f} s: {entry.error[:120]}"
                if entry.error
                else f"prepared without the API in {took:.1f} s"
            )
            return outcome
        finally:
            silent.close()
            restarted_at = time.time()
            await self.harness.restart_with(normal)
            await self._reregistered(restarted_at - 1)
            await self._done_with(claim)


def junit_xml(results: list[Result], driver: str) -> str:
    suite = ET.Element("testsuite", name=f"dra-testbed.sanity.{driver}", tests=str(len(results)))
    failures = 0
    for result in results:
        case = ET.SubElement(
            suite, "testcase", classname=f"sanity.{driver}", name=result.name, time=f"{result.seconds:.2f}"
        )
        if result.status is Status.FAIL:
            failures += 1
            ET.SubElement(case, "failure", message=result.detail)
        elif result.status is Status.SKIP:
            ET.SubElement(case, "skipped", message=result.detail)
        else:
            ET.SubElement(case, "system-out").text = f"{result.status}: {result.detail}"
    suite.set("failures", str(failures))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def said(exc: BaseException) -> str:
    """An exception in one line. A failed gRPC call as its status and details: its str()
    is a multi-line dump whose first line says nothing."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"the call failed as a whole: {exc.code().name}: {' '.join((exc.details() or '').split())}"
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0]


NOT_AN_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
"""How a call ends when the driver died, hung or dropped it, rather than answered."""


def whole_call_failure(exc: grpc.aio.AioRpcError) -> str:
    """A NodePrepareResources call failed as a whole: allowed (the API says the answer is
    then ignored, and the upstream kubeletplugin helper fails the call for any claim it
    cannot read), and to a kubelet the same as a per-claim error, since it calls a
    driver once per pod and fails the pod's prepare on the first error either way. It
    must be the driver's answer, not a crash, a hang or a dropped connection, and say what
    went wrong: that is what the pod's Event shows."""
    details = " ".join((exc.details() or "").split())
    expect(
        exc.code() not in NOT_AN_ANSWER,
        f"the call ended {exc.code().name} ({details[:200]}): the driver crashed, hung or dropped it",
    )
    expect(bool(details), f"the call failed as a whole ({exc.code().name}) and said nothing about why")
    return f"{exc.code().name}: {details[:200]}"


def _failed_as_a_whole(exc: grpc.aio.AioRpcError) -> str:
    return (
        f"the call failed as a whole, naming the problem ({whole_call_failure(exc)}); per-claim errors "
        "would have prepared the good claim, which a kubelet asks for again at the pod's next sync"
    )


async def _liveness(target: str) -> str:
    """What a kubelet's gRPC liveness probe would see: the status, or why there is none."""
    result = await grpc_health_check(target, timeout_s=LIVENESS_TIMEOUT_S)
    return result.status or f"no status ({result.output.removeprefix(f'{target}: ')})"


async def _liveness_until(target: str, wanted: Callable[[str], bool]) -> tuple[bool, str]:
    """Whether a status ``wanted`` accepts came within LIVENESS_WAIT_S (asked every
    second, as by a probe with periodSeconds 1), and the last status seen."""
    deadline = time.monotonic() + LIVENESS_WAIT_S
    while True:
        status = await _liveness(target)
        if wanted(status) or time.monotonic() >= deadline:
            return wanted(status), status
        await asyncio.sleep(1.0)
