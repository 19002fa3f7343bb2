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

import yaml

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


SPEC_SUFFIXES = (".json", ".yaml")
"""What a runtime's CDI cache reads (``.yml`` and every other file it passes over)."""
SPEC_VERSIONS = frozenset(("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"))
_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_SPEC_FIELDS = frozenset(("cdiVersion", "kind", "annotations", "devices", "containerEdits"))
_DEVICE_FIELDS = frozenset(("name", "annotations", "containerEdits"))
_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_spec(path: Path) -> tuple[str, dict[str, Mapping[str, Any]], Mapping[str, Any]]:
    """A spec file's kind, devices by name and spec-level edits, validated as the CDI
    library validates one (strict fields, a known version, vendor/class and device
    names, at least one device, no name twice); ValueError says what is wrong."""
    text = path.read_bytes()
    try:
        spec = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_YamlLoader)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot parse it: {str(exc).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise ValueError("not a CDI spec (a mapping with cdiVersion, kind and devices)")
    unknown = sorted(set(spec) - _SPEC_FIELDS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    if str(spec.get("cdiVersion")) not in SPEC_VERSIONS:
        raise ValueError(f"invalid version {spec.get('cdiVersion')!r}")
    kind = spec.get("kind")
    vendor, _, class_ = str(kind).partition("/")
    if not isinstance(kind, str) or not _VENDOR_OR_CLASS.fullmatch(vendor) or not _VENDOR_OR_CLASS.fullmatch(class_):
        raise ValueError(f"invalid kind {kind!r} (want vendor/class)")
    devices: dict[str, Mapping[str, Any]] = {}
    for device in spec.get("devices") or []:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not _DEVICE_NAME.fullmatch(name):
            raise ValueError(f"invalid device name {name!r}")
        if set(device) - _DEVICE_FIELDS:
            raise ValueError(f"device {name!r}: unknown field {sorted(set(device) - _DEVICE_FIELDS)[0]!r}")
        if name in devices:
            raise ValueError(f"device {name!r} twice")
        devices[name] = device
    if not devices:
        raise ValueError("no devices")
    return kind, devices, spec.get("containerEdits") or {}


def resolve(cdi_dir: Path, device_ids: list[str]) -> dict[str, str]:
    """The environment a container gets for ``device_ids``, as a runtime's CDI cache
    builds it: from the ``.json`` and ``.yaml`` specs that validate, the spec-level edits
    of each spec involved, then each device's own. A device two specs define is
    unresolvable (a conflict), as is one defined only by a spec that does not validate."""
    if not device_ids:
        return {}
    found: dict[str, tuple[Path, Mapping[str, Any], Mapping[str, Any]]] = {}
    conflicts: dict[str, list[str]] = {}
    skipped: list[str] = []
    for path in sorted(p for p in cdi_dir.glob("*") if p.suffix in SPEC_SUFFIXES):
        try:
            kind, devices, spec_edits = _read_spec(path)
        except (OSError, ValueError) as exc:
            skipped.append(f"{path.name}: {exc}")
            continue
        for name, device in devices.items():
            qualified = f"{kind}={name}"
            if qualified in found:
                conflicts.setdefault(qualified, [found[qualified][0].name]).append(path.name)
            found[qualified] = (path, spec_edits, device)
    env: dict[str, str] = {}
    applied: set[Path] = set()
    for device_id_ in device_ids:
        if "=" not in device_id_:
            raise CdiResolutionError(f"malformed CDI device ID {device_id_!r} (want vendor/class=name)")
        if device_id_ in conflicts:
            raise CdiResolutionError(
                f"unresolvable CDI device {device_id_}: specs {' and '.join(conflicts[device_id_])} in "
                f"{cdi_dir} both define it (a conflicting device)"
            )
        if device_id_ not in found:
            because = f" (spec files skipped: {'; '.join(skipped)})" if skipped else ""
            raise CdiResolutionError(f"unresolvable CDI device {device_id_}: no spec in {cdi_dir} defines it{because}")
        path, spec_edits, device = found[device_id_]
        entries = list((device.get("containerEdits") or {}).get("env") or [])
        if path not in applied:
            applied.add(path)
            entries = [*(spec_edits.get("env") or []), *entries]
        for entry in entries:
            key, _, value = str(entry).partition("=")
            env[key] = value
    return env
