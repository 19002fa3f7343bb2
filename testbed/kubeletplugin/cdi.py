"""CDI spec files: one per prepared claim, naming the devices a container may use.

A container runtime (or the fake kubelet) resolves each CDI device ID
``<vendor>/<class>=<name>`` by finding the spec of that kind with a device of that name
and applying its container edits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.files import write_atomically

CDI_VERSION = "0.6.0"
CLAIM_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class CdiDevice:
    name: str
    env: Mapping[str, str]


@dataclass(frozen=True)
class ClaimSpec:
    """What one claim's spec says: edits for every container of the claim, then each
    device's. The driver's checkpoint keeps it, so a spec that was lost can be written again."""

    env: Mapping[str, str]
    devices: Sequence[CdiDevice]

    def to_json(self) -> dict[str, Any]:
        return {"env": dict(self.env), "devices": [{"name": d.name, "env": dict(d.env)} for d in self.devices]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClaimSpec:
        return cls(
            {str(k): str(v) for k, v in data["env"].items()},
            [CdiDevice(str(d["name"]), {str(k): str(v) for k, v in d["env"].items()}) for d in data["devices"]],
        )


def kind_for(driver: str) -> str:
    """``gpu.dra-testbed.io`` -> ``gpu.dra-testbed.io/gpu``."""
    return f"{driver}/{driver.split('.')[0]}"


def device_id(driver: str, name: str) -> str:
    return f"{kind_for(driver)}={name}"


def claim_device_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """A claim's own name for a device, so specs of two claims never clash; a share of a
    shareable device adds its share ID (one claim may hold two shares of a device)."""
    return f"{claim_uid}-{device}-{share_id}" if share_id else f"{claim_uid}-{device}"


def spec_path(cdi_dir: Path, driver: str, claim_uid: str) -> Path:
    return cdi_dir / f"{driver}-{claim_uid}.json"


def spec_content(driver: str, spec: ClaimSpec) -> bytes:
    """The spec file's bytes: the same spec always gives the same bytes. Compact: an
    indented dump takes json's pure-Python encoder, several times slower on every prepare."""
    document = {
        "cdiVersion": CDI_VERSION,
        "kind": kind_for(driver),
        "containerEdits": {"env": [f"{k}={v}" for k, v in sorted(spec.env.items())]},
        "devices": [
            {
                "name": d.name,
                "containerEdits": {"env": [f"{k}={v}" for k, v in sorted(d.env.items())]},
            }
            for d in spec.devices
        ],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def write_claim_spec(cdi_dir: Path, driver: str, claim_uid: str, spec: ClaimSpec, durable: bool = True) -> Path:
    path = spec_path(cdi_dir, driver, claim_uid)
    write_atomically(path, spec_content(driver, spec), durable=durable)
    return path


def restore_claim_spec(cdi_dir: Path, driver: str, claim_uid: str, spec: ClaimSpec, thorough: bool) -> bool:
    """Write the spec again if it is missing or is not what it should be; True if it was.
    ``thorough`` reads and compares it; otherwise a stat that finds the right size is
    taken as enough (the check on the prepare path, where a spec is missing after a
    reboot emptied a tmpfs CDI directory, or empty after a machine crash)."""
    path = spec_path(cdi_dir, driver, claim_uid)
    content = spec_content(driver, spec)
    try:
        if thorough:
            if path.read_bytes() == content:
                return False
        elif path.stat().st_size == len(content):
            return False
    except FileNotFoundError:
        pass
    write_atomically(path, content, durable=False)
    return True


def claim_specs(cdi_dir: Path, driver: str) -> dict[str, Path]:
    """This driver's claim specs in ``cdi_dir``, by claim UID (Kubernetes UIDs are UUIDs,
    so another driver whose name extends this one's is never mistaken for it)."""
    prefix = f"{driver}-"
    found = {}
    for path in cdi_dir.glob(f"{prefix}*.json"):
        uid = path.name[len(prefix) : -len(".json")]
        if CLAIM_UID.fullmatch(uid):
            found[uid] = path
    return found


def remove_claim_spec(cdi_dir: Path, driver: str, claim_uid: str) -> bool:
    path = spec_path(cdi_dir, driver, claim_uid)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


class CdiResolutionError(LookupError):
    pass


def resolve(cdi_dir: Path, device_ids: list[str]) -> dict[str, str]:
    """The environment a container gets for ``device_ids``, as a runtime would build it:
    spec-level edits of every spec involved, then each device's own edits."""
    specs: dict[str, list[dict[str, object]]] = {}
    for path in sorted(cdi_dir.glob("*.json")):
        try:
            spec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        specs.setdefault(str(spec.get("kind")), []).append(spec)
    env: dict[str, str] = {}
    for device_id_ in device_ids:
        kind, sep, name = device_id_.partition("=")
        if not sep:
            raise CdiResolutionError(f"malformed CDI device ID {device_id_!r} (want vendor/class=name)")
        found = None
        for spec in specs.get(kind, []):
            for device in spec.get("devices", []):  # type: ignore[attr-defined]
                if device.get("name") == name:
                    found = (spec, device)
        if found is None:
            raise CdiResolutionError(f"unresolvable CDI device {device_id_}: no spec in {cdi_dir} defines it")
        spec, device = found
        for entry in [
            *spec.get("containerEdits", {}).get("env", []),  # type: ignore[attr-defined]
            *device.get("containerEdits", {}).get("env", []),
        ]:
            key, _, value = entry.partition("=")
            env[key] = value
    return env
