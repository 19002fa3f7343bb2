"""The driver's record of prepared claims, on disk, so a restart knows what it did.

A claim's UID is appended to the prepare intents before the hardware is touched, and the
claim is written to the checkpoint as PrepareCompleted after the CDI spec exists, with what
that spec says and the claim's configs; a restart undoes the claims whose prepare began and
never completed, re-asserts completed ones and writes again any of their specs that was lost
(a machine crash, or a reboot that emptied a CDI directory on tmpfs, as /var/run/cdi is).
The checkpoint carries a checksum: a corrupt or truncated file is set aside (never silently
trusted or deleted) and the driver starts with an empty record.

Drivers before 2026-11-24 wrote a PrepareStarted record into the checkpoint instead of an
intent; both are read, so instances of either kind can share a node during a rolling update.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from testbed.files import write_atomically
from testbed.kubeapi import ClaimRef
from testbed.kubeletplugin.cdi import ClaimSpec

VERSION = 1


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class PreparedDeviceRecord:
    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    share_id: str | None = None


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: list[PreparedDeviceRecord] = field(default_factory=list)
    admin_access: bool = False
    spec: ClaimSpec | None = None
    """What the claim's CDI spec says (None in records of drivers before 2026-11-23)."""
    configs: list[dict[str, Any]] = field(default_factory=list)
    """The allocation's config entries, for re-asserting the claim as it was prepared."""
    consumed: dict[str, dict[str, int]] = field(default_factory=dict)
    """Share ID -> what that share of a shareable device consumes, to re-assert it."""

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.uid, self.name)

    def to_json(self) -> dict[str, object]:
        """New fields are left out when empty and sit beside the old ones, never inside a
        device: an older driver instance (a rolling update goes both ways) reads the file."""
        data: dict[str, object] = {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state.value,
            "devices": [asdict(d) for d in self.devices],
            "admin_access": self.admin_access,
        }
        if self.spec is not None:
            data["cdi_spec"] = self.spec.to_json()
        if self.configs:
            data["configs"] = self.configs
        if self.consumed:
            data["consumed"] = self.consumed
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClaimRecord:
        spec = data.get("cdi_spec")
        return cls(
            uid=str(data["uid"]),
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            state=ClaimState(str(data["state"])),
            devices=[PreparedDeviceRecord(**d) for d in data.get("devices", [])],
            admin_access=bool(data.get("admin_access", False)),
            spec=ClaimSpec.from_json(spec) if spec is not None else None,
            configs=list(data.get("configs", [])),
            consumed={
                str(share): {str(k): int(v) for k, v in amounts.items()}
                for share, amounts in data.get("consumed", {}).items()
            },
        )


class CheckpointCorrupt(Exception):
    def __init__(self, path: Path, moved_to: Path, reason: str):
        super().__init__(f"checkpoint {path} is unreadable ({reason}); moved it to {moved_to}")
        self.moved_to = moved_to


def _checksum(claims: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    def __init__(self, path: Path, durable: bool = True):
        self.path = path
        self.durable = durable
        self.claims: dict[str, ClaimRecord] = {}
        self._as_seen: tuple[int, int, int] | None = None
        """(inode, mtime, size) of the file as this object last read or wrote it."""
        self._json: dict[str, tuple[ClaimRecord, dict[str, object]]] = {}
        """Each record as last written or read: a save serializes only what changed."""

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self) -> bool:
        """Read the file; raise CheckpointCorrupt (after setting it aside) if it is bad.
        A file that is still the one this object last read or wrote is not read again:
        every write replaces it (a new inode), so another instance's write shows. Whether
        the claims were read anew."""
        identity = self._identity()
        if identity is not None and identity == self._as_seen:
            return False
        self.claims = {}
        self._as_seen = None
        if identity is None:
            return True
        raw = self.path.read_bytes()
        try:
            document = json.loads(raw)
            claims = document["claims"]
            if document.get("version") != VERSION:
                raise ValueError(f"version {document.get('version')!r}, expected {VERSION}")
            if document.get("checksum") != _checksum(claims):
                raise ValueError("checksum mismatch")
            self.claims = {uid: ClaimRecord.from_json(c) for uid, c in claims.items()}
            self._json = {uid: (self.claims[uid], c) for uid, c in claims.items()}
            self._as_seen = identity
            return True
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            moved = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
            self.path.replace(moved)
            raise CheckpointCorrupt(self.path, moved, str(exc)) from exc

    def save(self) -> None:
        claims = {uid: self._record_json(uid, record) for uid, record in sorted(self.claims.items())}
        document = {"version": VERSION, "checksum": _checksum(claims), "claims": claims}  # type: ignore[arg-type]
        data = json.dumps(document, separators=(",", ":")).encode()  # compact: json's C encoder
        write_atomically(self.path, data, mode=0o600, durable=self.durable)
        self._as_seen = self._identity()

    def _record_json(self, uid: str, record: ClaimRecord) -> dict[str, object]:
        cached = self._json.get(uid)
        if cached is not None and cached[0] is record:
            return cached[1]
        data = record.to_json()
        self._json[uid] = (record, data)
        return data

    def put(self, record: ClaimRecord) -> None:
        """Record it, or (the file not written: a full disk, say) raise with the record
        as it was: what this object holds is always what the file says."""
        before = self.claims.get(record.uid)
        self.claims[record.uid] = record
        try:
            self.save()
        except OSError:
            if before is None:
                del self.claims[record.uid]
            else:
                self.claims[record.uid] = before
            raise

    def remove(self, uid: str) -> None:
        """Forget it, or (the file not written) raise still holding it: an unprepare
        that could not be recorded is asked for again, never taken as done."""
        record = self.claims.pop(uid, None)
        if record is None:
            return
        try:
            self.save()
        except OSError:
            self.claims[uid] = record
            raise
        self._json.pop(uid, None)


class PrepareIntents:
    """Claims whose prepare began: a line per claim UID, appended before the hardware is
    touched, so that a restarted driver undoes a prepare a crash cut short.

    An append costs a hundredth of the checkpoint write it replaces (a rename over a file
    makes ext4 flush it). No fsync either: a crashed process leaves the line in the page
    cache, and a machine that goes down resets the devices. The file is emptied once every
    prepare it names has ended, so a repair reads a handful of lines."""

    def __init__(self, path: Path):
        self.path = path
        self._added = False

    def add(self, uid: str) -> None:
        self._added = True
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{uid}\n".encode())  # one small O_APPEND write: whole or absent
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        finally:
            os.close(fd)

    def uids(self) -> list[str]:
        """Complete lines only: a line cut short by a crash names no claim."""
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return list(dict.fromkeys(line for line in text.split("\n")[:-1] if line))

    def reset(self, keep: Collection[str] = (), force: bool = False) -> None:
        """Forget every intent but ``keep``'s: the prepares they name have ended. Without
        ``force``, only when this instance added any since its last reset."""
        if not (self._added or force):
            return
        self._added = False
        if keep:
            write_atomically(self.path, "".join(f"{uid}\n" for uid in sorted(keep)).encode(), mode=0o600, durable=False)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # a truncate makes ext4 write the old lines out first
