"""A small asyncio client for the Kubernetes REST API.

The driver and the fake kubelet are asyncio programs that must stay light (thousands
of them share a process), so they speak plain JSON over keep-alive connections (http11.py,
watches too) instead of the synchronous, model-heavy `kubernetes` client.
Objects are dicts, as on the wire; orjson reads and writes them (a pod event decodes
2.5 times faster than with the standard library, and decoding the kubelets' watch events
was a NodeHost's largest single cost under a workload).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
import yaml

from testbed.config import connection_health_check
from testbed.http11 import ConnectionPool, TransportError
from testbed.openssl import send_certificate_alone

Obj = dict[str, Any]
T = TypeVar("T")
log = logging.getLogger(__name__)

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

RETRIABLE_STATUS = {429, 500, 502, 503, 504}
TRANSIENT_ERRORS = (TimeoutError, TransportError, aiohttp.ClientConnectionError)
"""No answer, for now: what a request retries and `until_answered` waits out."""
RETRY_ATTEMPTS = 8
RETRY_FIRST_DELAY_S = 0.2
RETRY_MAX_DELAY_S = 5.0
UNTIL_ANSWERED_FIRST_DELAY_S = 0.1
UNTIL_ANSWERED_MAX_DELAY_S = 7.0
KEEPALIVE_S = 60.0
WATCH_MIN_S = 300
"""client-go's shortest watch; each asks for a time between this and twice this."""

WATCH_LINE_LIMIT = 4 * 1024 * 1024
"""A watch event is one line, and a ResourceSlice with 128 devices, or a pod with a large
annotation, is more than 128 KiB; a longer line than this ends the watch, which starts again."""

METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_ONLY_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[type[ApiError], tuple[int, str, str]]:
        """Whole across processes: a NodeHost's failure reaches `testbed up` through Ray."""
        return type(self), (self.status, self.reason, self.message)

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


@dataclass(frozen=True)
class Credentials:
    server: str
    ssl_context: ssl.SSLContext
    token: str | None = None


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as a kubelet names it to a driver: what every DRA call carries."""

    namespace: str
    uid: str
    name: str


def load_pem_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads key pairs only from a path: give it an anonymous in-memory file, which no
    other process can open and which is gone once closed (no key on disk, even briefly;
    a temp dir per node cost a starting NodeHost a tenth of its CPU)."""
    fd = os.memfd_create("testbed-kube-pair", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert + b"\n" + key)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    send_certificate_alone(context)


def _field(entry: Mapping[str, Any], name: str, base: Path) -> bytes | None:
    if f"{name}-data" in entry:
        return base64.b64decode(str(entry[f"{name}-data"]))
    if name in entry:
        return (base / str(entry[name])).read_bytes()
    return None


def flattened_kubeconfig(path: Path) -> bytes:
    """The kubeconfig with every file it names inlined (as `kubectl config view --flatten`
    does): content that works on any machine, for processes that may run elsewhere."""
    document = yaml.safe_load(path.read_text())
    base = path.parent
    for section, key, fields in (
        ("clusters", "cluster", ("certificate-authority",)),
        ("users", "user", ("client-certificate", "client-key")),
    ):
        for entry in document.get(section) or []:
            body = entry.get(key) or {}
            for name in fields:
                if name in body and f"{name}-data" not in body:
                    body[f"{name}-data"] = base64.b64encode((base / str(body.pop(name))).read_bytes()).decode()
            if section == "users" and "tokenFile" in body and "token" not in body:
                body["token"] = (base / str(body.pop("tokenFile"))).read_text().strip()
    return yaml.safe_dump(document, sort_keys=False).encode()


def _current(path: Path, context_name: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A kubeconfig's cluster and user entries for a context (by default the current one)."""
    document = yaml.safe_load(path.read_text())
    context_name = context_name or document["current-context"]
    context = next(c["context"] for c in document["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in document["clusters"] if c["name"] == context["cluster"])
    users = document.get("users") or []
    user: dict[str, Any] = next((u["user"] for u in users if u["name"] == context.get("user")), {})
    return cluster, user


def credentials_from_kubeconfig(path: Path, context_name: str | None = None, trust: bytes | None = None) -> Credentials:
    """``trust``: a CA (PEM) to check the server against instead of the cluster's (a
    kubelet's self-signed serving certificate, say); the user's credentials are the same."""
    cluster, user = _current(path, context_name)
    base = path.parent
    ca = trust or _field(cluster, "certificate-authority", base)
    if ca is not None:
        # That CA alone, as client-go trusts it: loading the system's store as well cost
        # each NodeHost a third of a second at start, for certificates never used.
        ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ssl_context.load_verify_locations(cadata=ca.decode())
    else:
        ssl_context = ssl.create_default_context()
    cert = _field(user, "client-certificate", base)
    key = _field(user, "client-key", base)
    if cert is not None and key is not None:
        load_pem_pair(ssl_context, cert, key)
    return Credentials(cluster["server"], ssl_context, user.get("token"))


def cluster_ca(path: Path) -> bytes | None:
    """The CA (PEM) a kubeconfig's current cluster is checked against; None when it
    relies on the system's store."""
    cluster, _ = _current(path)
    return _field(cluster, "certificate-authority", path.parent)


def in_cluster_credentials() -> Credentials:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    ssl_context = ssl.create_default_context(cafile=str(IN_CLUSTER_DIR / "ca.crt"))
    token = (IN_CLUSTER_DIR / "token").read_text().strip()
    return Credentials(f"https://{host}:{port}", ssl_context, token)


def default_credentials(kubeconfig: Path | None = None) -> Credentials:
    """Explicit kubeconfig, then $KUBECONFIG, then the in-cluster service account."""
    if kubeconfig is None and os.environ.get("KUBECONFIG"):
        kubeconfig = Path(os.environ["KUBECONFIG"])
    if kubeconfig is not None:
        return credentials_from_kubeconfig(kubeconfig)
    return in_cluster_credentials()


def path_for(
    api_version: str,
    plural: str,
    name: str | None = None,
    namespace: str | None = None,
    subresource: str | None = None,
) -> str:
    """REST path, e.g. ("resource.k8s.io/v1", "resourceclaims", "c", "ns") ->
    /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [prefix]
    if namespace is not None:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name is not None:
        parts.append(name)
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


def parse_rfc3339(stamp: str) -> float:
    """Seconds since the epoch of an API timestamp (``2026-11-29T23:24:06Z``, fractions or not)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def now_rfc3339(micro: bool = False) -> str:
    """UTC now, as the API wants it. Formatted by hand: every lease renewal asks, and
    datetime.strftime showed up in a NodeHost's profile."""
    return rfc3339(time.time(), micro)


def rfc3339(at: float, micro: bool = False) -> str:
    """Seconds since the epoch as an API timestamp (``parse_rfc3339``'s inverse)."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
    return f"{seconds}.{int(at % 1 * 1_000_000):06d}Z" if micro else f"{seconds}Z"


@dataclass
class WatchPosition:
    """How far a watch has got: the resourceVersion of its last list, event or bookmark."""

    resource_version: str = ""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the watch has listed (or went on from a version it was given): every
    change after that reaches its consumer as an event, none only as a later list."""


class KubeClient:
    """One client's connections; share it among everything in a process or actor."""

    def __init__(self, credentials: Credentials, connection_limit: int = 64, borrow: KubeClient | None = None):
        """``borrow``: send requests over that client's connections (it must present no
        client certificate), each with this client's own bearer token: many token
        identities in one process then cost no TLS connections of their own."""
        self.credentials = credentials
        headers = {"Accept": "application/json", "User-Agent": "dra-testbed"}
        if credentials.token:
            headers["Authorization"] = f"Bearer {credentials.token}"
        self._headers = headers
        self._limit = connection_limit
        self._pool: ConnectionPool | None = None
        self._lender = borrow
        self._health_check = connection_health_check()

    @classmethod
    def from_kubeconfig(cls, path: Path | None = None, connection_limit: int = 64) -> KubeClient:
        return cls(default_credentials(path), connection_limit)

    def _connections(self) -> ConnectionPool:
        """Where requests go, and watches stream (http11.py)."""
        if self._lender is not None:
            return self._lender._connections()
        if self._pool is None or self._pool.closed:
            ssl_context = self.credentials.ssl_context
            self._pool = ConnectionPool(
                self.credentials.server, ssl_context, self._limit, KEEPALIVE_S, self._health_check
            )
        return self._pool

    def close_idle_connections(self) -> None:
        """What a kubelet does after a second failed heartbeat in a row: the next requests
        connect afresh, in case the kept-alive ones died without a word."""
        if self._lender is not None:
            self._lender.close_idle_connections()
        elif self._pool is not None:
            self._pool.close_idle()

    def use_token(self, token: str) -> None:
        """Authenticate with this bearer token from now on (e.g. a freshly bound one)."""
        self._headers["Authorization"] = f"Bearer {token}"

    async def close(self) -> None:
        # A borrower has neither: the lender closes its connections.
        if self._pool is not None:
            self._pool.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
        attempts: int = RETRY_ATTEMPTS,
        metadata_only: bool = False,
        retry_unreachable: bool = True,
    ) -> Obj:
        """One call, retried with backoff while the server is overloaded (429, 5xx, timeouts),
        as client-go does. A create whose earlier attempt went unanswered and that then meets
        409 AlreadyExists made the object itself (the answer was lost, e.g. etcd restarting):
        it returns that object rather than failing. ``retry_unreachable=False``: a server
        that refuses the connection fails the call at once, as client-go's requests do
        (they retry a GET whose connection was reset, never one that was refused)."""
        delay = RETRY_FIRST_DELAY_S
        for attempt in range(1, attempts + 1):
            try:
                return await self._request_once(method, path, body, params, content_type, timeout_s, metadata_only)
            except ApiError as exc:
                name = body.get("metadata", {}).get("name") if isinstance(body, dict) else None
                if exc.conflict and method == "POST" and attempt > 1 and name:
                    return await self.request("GET", f"{path}/{name}", timeout_s=timeout_s)
                if exc.status not in RETRIABLE_STATUS or attempt == attempts:
                    raise
            except TRANSIENT_ERRORS as exc:
                if attempt == attempts or (not retry_unreachable and getattr(exc, "unreachable", False)):
                    raise
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, RETRY_MAX_DELAY_S)
        raise AssertionError("unreachable")

    async def _request_once(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None,
        params: Mapping[str, str] | None,
        content_type: str,
        timeout_s: float,
        metadata_only: bool = False,
        accept: str = "",
    ) -> Obj:
        data = None if body is None else orjson.dumps(body)
        headers = {**self._headers, "Content-Type": content_type} if body is not None else dict(self._headers)
        if metadata_only or accept:
            headers["Accept"] = accept or METADATA_ONLY
        response = await self._connections().request(method, path, headers, data, params, timeout_s)
        if response.status >= 400:
            raise _api_error(response.status, response.body.decode(errors="replace"))
        return orjson.loads(response.body) if response.body else {}

    async def get(self, path: str, params: Mapping[str, str] | None = None, retry_unreachable: bool = True) -> Obj:
        return await self.request("GET", path, params=params, retry_unreachable=retry_unreachable)

    async def get_text(self, path: str, timeout_s: float = 10.0) -> str:
        """A plain-text endpoint such as /metrics; one attempt, errors as ApiError."""
        headers = {**self._headers, "Accept": "text/plain"}
        response = await self._connections().request("GET", path, headers, timeout_s=timeout_s)
        text = response.body.decode(errors="replace")
        if response.status >= 400:
            raise _api_error(response.status, text)
        return text

    async def create(self, path: str, body: Obj, metadata_only: bool = False) -> Obj:
        """``metadata_only``: the answer is the object's metadata alone (a
        PartialObjectMetadata), which spares both sides the encoding of a large object."""
        return await self.request("POST", path, body, metadata_only=metadata_only)

    async def replace(self, path: str, body: Obj, metadata_only: bool = False) -> Obj:
        return await self.request("PUT", path, body, metadata_only=metadata_only)

    async def create_or_replace(self, collection: str, doc: Obj) -> Obj:
        """Create ``doc`` in ``collection``, or replace the object of that name with it
        (as `kubectl apply` does for a manifest the testbed owns)."""
        try:
            return await self.create(collection, doc)
        except ApiError as exc:
            if not exc.conflict:
                raise
        path = f"{collection}/{doc['metadata']['name']}"
        current = await self.get(path)
        version = {"resourceVersion": current["metadata"]["resourceVersion"]}
        return await self.replace(path, {**doc, "metadata": {**doc["metadata"], **version}})

    async def patch(self, path: str, body: Obj | list[Obj], patch_type: str = "merge") -> Obj:
        return await self.request("PATCH", path, body, content_type=PATCH_TYPES[patch_type])

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        return await self.request("DELETE", path, body)

    async def delete_if_exists(self, path: str, body: Obj | None = None) -> bool:
        try:
            await self.delete(path, body)
            return True
        except ApiError as exc:
            if exc.not_found:
                return False
            raise

    async def watch(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        timeout_s: int | None = None,
        metadata_only: bool = False,
        position: WatchPosition | None = None,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """List then watch, yielding ("ADDED"|"MODIFIED"|"DELETED", obj) forever,
        re-listing when the watch expires (410) and reconnecting after errors.
        An object deleted while the watch was down is yielded as DELETED (its last state
        seen) after the re-list, so no consumer keeps serving something that is gone.
        ``timeout_s``: how long each watch asks for (default: 5 to 10 minutes at random).
        ``metadata_only``: objects arrive as their metadata alone (PartialObjectMetadata).
        ``position``: where the watch has got to, kept up to date (lists, events and
        bookmarks); a watch given a position that is set starts there, without a list
        (it lists only if that version has expired)."""
        base = dict(params or {})
        # The first list at "any" version, as client-go's reflector asks: the API server
        # answers from its watch cache without a read from etcd, and the watch that follows
        # from that version brings anything newer.
        listing_params = {"resourceVersion": "0", **base}
        position = position if position is not None else WatchPosition()
        resource_version = position.resource_version
        if resource_version:
            position.synced.set()
        known: dict[str, Obj] = {}  # by UID: what a consumer has been told exists
        watch_headers = {"Accept": METADATA_ONLY} if metadata_only else {}
        while True:
            try:
                if not resource_version:
                    if metadata_only:
                        listing = await self._request_once(
                            "GET", path, None, listing_params, "application/json", 30.0, accept=METADATA_ONLY_LIST
                        )
                    else:
                        listing = await self.get(path, listing_params)
                    items = listing.get("items") or []  # a metadata-only list may say null
                    listed = {item["metadata"]["uid"]: item for item in items}
                    for uid in [u for u in known if u not in listed]:
                        yield "DELETED", known.pop(uid)
                    for uid, item in listed.items():
                        known[uid] = item
                        yield "ADDED", item
                    resource_version = position.resource_version = listing["metadata"]["resourceVersion"]
                    position.synced.set()
                # As client-go's reflector, each watch asks for 5 to 10 minutes at random: the
                # watches a restart of the API server began together do not all end together.
                seconds = timeout_s or random.randint(WATCH_MIN_S, 2 * WATCH_MIN_S)
                query = dict(
                    base,
                    watch="1",
                    resourceVersion=resource_version,
                    allowWatchBookmarks="true",
                    timeoutSeconds=str(seconds),
                )
                async with self._connections().stream(
                    path, {**self._headers, **watch_headers}, query, seconds + 30, WATCH_LINE_LIMIT
                ) as (head, lines):
                    if lines is None:
                        raise _api_error(head.status, head.body.decode(errors="replace"))
                    async for line in lines:
                        event = orjson.loads(line)
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            if obj.get("code") == 410:
                                resource_version = position.resource_version = ""
                            break
                        resource_version = position.resource_version = obj["metadata"]["resourceVersion"]
                        if kind == "BOOKMARK":
                            continue
                        if kind == "DELETED":
                            known.pop(obj["metadata"]["uid"], None)
                        else:
                            known[obj["metadata"]["uid"]] = obj
                        yield kind, obj
            except ApiError as exc:
                if exc.status == 410:
                    resource_version = position.resource_version = ""
                    continue
                await asyncio.sleep(1.0)
            except (TimeoutError, OSError, ValueError):  # OSError: TransportError, ssl's; ValueError: bad JSON
                await asyncio.sleep(1.0)


def claim_device_status(claim: ClaimRef, entries: list[Obj]) -> Obj:
    """An apply configuration of these ``status.devices`` entries of a claim; its UID is a
    precondition, so a claim made anew under the same name is left alone."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": entries},
    }


async def apply_claim_status(client: KubeClient, body: Obj, field_manager: str) -> Obj:
    """Server-side apply of ``claim_device_status``: each writer (a node's driver, the
    fabric manager) owns its own entries and conditions, and leaves the others'."""
    meta = body["metadata"]
    return await client.request(
        "PATCH",
        path_for("resource.k8s.io/v1", "resourceclaims", meta["name"], meta["namespace"], "status"),
        body,
        params={"fieldManager": field_manager, "force": "true"},
        content_type="application/apply-patch+yaml",
    )


def status_refusal_cause(exc: ApiError) -> str:
    """What the API server's words do not say when it refuses a claim's status write as
    "status.allocation: Invalid value: null: field cannot be modified once set" ("" for
    any other refusal). Found with claims made by the Python kubernetes client: v1.37
    keeps opaque config parameters as the bytes sent and compares them byte for byte, so
    to a JSON client (this one, a driver's SSA or merge patch) every status write of such
    a claim reads as a change of its allocation; protobuf clients send the bytes back."""
    if exc.status == 422 and "status.allocation" in exc.message and "cannot be modified once set" in exc.message:
        return (
            "the claim's opaque config parameters were sent as JSON with spaces (as the Python kubernetes "
            "client writes them), which the API server keeps byte for byte: a status write from a JSON client "
            "then reads to it as changing the allocation. Create such claims with compact JSON (kubectl does)"
        )
    return ""


async def until_answered(call: Callable[[], Awaitable[T]], what: str) -> T:
    """``call`` again, with the kubelet's backoff (0.1 s doubling to 7 s), for as long
    as it fails for a transient reason: the API server overloaded (429 beyond the
    retries of one request) or restarting. So the kubelet registers its node, and
    controllers requeue: forever, the caller's own deadline bounding it. Any other
    error is raised at once."""
    delay = UNTIL_ANSWERED_FIRST_DELAY_S
    while True:
        try:
            return await call()
        except Exception as exc:
            if not transient(exc):
                raise
            log.info("%s failed (%s); again in %.1f s", what, str(exc) or type(exc).__name__, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, UNTIL_ANSWERED_MAX_DELAY_S)


def transient(exc: BaseException) -> bool:
    """A failure that asking again may cure: overload, a server restarting, a lost answer."""
    if isinstance(exc, ApiError):
        return exc.status in RETRIABLE_STATUS
    return isinstance(exc, TRANSIENT_ERRORS)


def _api_error(status: int, text: str) -> ApiError:
    try:
        status_obj = json.loads(text)
        return ApiError(status, status_obj.get("reason", ""), status_obj.get("message", text))
    except json.JSONDecodeError:
        return ApiError(status, "", text[:500])
