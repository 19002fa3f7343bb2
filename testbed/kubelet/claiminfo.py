"""The claims a kubelet has prepared, and its checkpoint of them: what the kubelet's DRA
manager keeps in its claim info cache (pkg/kubelet/cm/dra/claiminfo.go) and writes to
``dra_manager_state.json`` (its state/checkpoint.go), so that a restarted kubelet knows
which claims its pods hold and which drivers to ask to unprepare them."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.files import write_atomically
from testbed.kubeapi import ClaimRef
from testbed.kubelet.plugins import PreparedDevice

log = logging.getLogger(__name__)


@dataclass
class PreparedClaim:
    namespace: str
    name: str
    uid: str
    drivers: list[str]
    devices: list[PreparedDevice] = field(default_factory=list)
    users: set[str] = field(default_factory=set)
    prepared: bool = False
    """False while (or after) a prepare failed: it is unprepared all the same."""
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """By driver, the calls its devices spare it (skips.py); kept, as the kubelet keeps
    them in its checkpoint, for the unprepare."""
    unpreparing: bool = False
    """Its last user is gone and its unprepare began: no new pod may use it until the
    unprepare succeeds and it is forgotten (kept in memory only, as the kubelet keeps it)."""

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.uid, self.name)

    def checkpointed(self) -> dict[str, object]:
        """What the checkpoint keeps (not ``unpreparing``). By hand: dataclasses' asdict
        deep-copies every field, and was a tenth of a GPU pod's CPU on its node."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "drivers": self.drivers,
            "devices": [vars(d) for d in self.devices],
            "users": sorted(self.users),
            "prepared": self.prepared,
            "skipped": self.skipped,
        }

    def calls(self, driver: str, call: str) -> bool:
        """Whether ``driver`` is asked to prepare or unprepare (``call``) this claim."""
        return call not in self.skipped.get(driver, ())


def read_checkpoint(path: Path, node: str) -> dict[str, PreparedClaim]:
    """The claims the checkpoint holds, by UID (none if there is no checkpoint). One that
    cannot be read is set aside, never overwritten: the kubelet refuses to start on it;
    this one starts without it and says where it went, so what it held can still be
    looked at."""
    if not path.exists():
        return {}
    claims: dict[str, PreparedClaim] = {}
    try:
        for entry in json.loads(path.read_text()):
            devices = [PreparedDevice(**d) for d in entry.pop("devices")]
            claim = PreparedClaim(**entry, devices=devices)
            claim.users = set(claim.users)
            claims[claim.uid] = claim
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        moved = path.with_name(f"{path.name}.corrupt-{int(time.time() * 1000)}")
        with contextlib.suppress(OSError):
            path.replace(moved)
        log.error(
            "%s: claim checkpoint %s unreadable (%s); moved it to %s and starting without it: claims it "
            "held are not unprepared by this kubelet",
            node,
            path,
            exc,
            moved,
        )
        return {}
    return claims


def write_checkpoint(path: Path, claims: dict[str, PreparedClaim], durable: bool) -> None:
    """``durable``: fsynced, as the kubelet writes it on a real node."""
    write_atomically(path, json.dumps([c.checkpointed() for c in claims.values()]).encode(), durable=durable)
