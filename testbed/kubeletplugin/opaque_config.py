"""Opaque device configuration that claims and classes pass to a driver.

Strictly validated: an unknown field, kind or value fails the claim with a message that
names the field and says what is accepted, and never the driver. A driver names the
kinds it accepts (``OpaqueConfig`` models keyed by their ``kind``); each turns into
environment for the devices it applies to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """The claim's configuration is unusable; the message is for the claim's owner."""


class StrictConfig(BaseModel):
    """A part of an opaque config: an unknown field is an error, not ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class OpaqueConfig(StrictConfig):
    """One kind of a driver's opaque config; subclasses fix ``apiVersion`` and ``kind``."""

    def env(self) -> dict[str, str]:
        return {}


ConfigKinds = Mapping[str, type[OpaqueConfig]]
"""kind -> model, the opaque configs one driver accepts."""


def _explain(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        location = ".".join(str(p) for p in error["loc"] if not str(p).startswith("function-"))
        parts.append(f"{location or 'parameters'}: {error['msg']}")
    return "; ".join(parts)


def parse_config(driver: str, parameters: Any, kinds: ConfigKinds) -> OpaqueConfig:
    """Parse the ``opaque.parameters`` of one config entry for ``driver``."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"opaque parameters for {driver} must be an object, got {type(parameters).__name__}")
    kind = parameters.get("kind")
    model = kinds.get(str(kind))
    if model is None:
        raise ConfigError(
            f"unknown config kind {kind!r} for driver {driver}; this driver accepts "
            f"{', '.join(kinds) or 'no opaque config'} with apiVersion {driver}/v1alpha1"
        )
    try:
        return model.model_validate(dict(parameters))
    except ValidationError as exc:
        raise ConfigError(f"invalid {kind} for {driver}: {_explain(exc)}") from None


def configs_for_request(
    driver: str, entries: Sequence[Mapping[str, Any]], request: str, kinds: ConfigKinds
) -> list[OpaqueConfig]:
    """Configs from an allocation result that apply to ``request``, class entries first
    (they come first in the allocation), later entries overriding earlier ones."""
    applied: list[OpaqueConfig] = []
    for entry in entries:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        requests = entry.get("requests") or []
        # "req/sub" names a subrequest of a prioritized list: it belongs to "req" too.
        if requests and request not in requests and request.split("/")[0] not in requests:
            continue
        applied.append(parse_config(driver, opaque.get("parameters"), kinds))
    return applied
