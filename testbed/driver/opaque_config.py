"""Opaque device configuration that claims and classes pass to the drivers.

Strictly validated: an unknown field, kind or value fails the claim with a message that
names the field and says what is accepted, and never the driver.

    apiVersion: gpu.dra-testbed.io/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: TimeSlicing          # or SpacePartitioning
      timeSlicing: {interval: Short} # Default | Short | Medium | Long
      # spacePartitioning: {partitionCount: 2}

    apiVersion: nic.dra-testbed.io/v1alpha1
    kind: NicConfig
    ips: ["10.10.0.5/24"]
    mtu: 9000
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

GPU_DRIVER = "gpu.dra-testbed.io"
NIC_DRIVER = "nic.dra-testbed.io"
MAX_OPAQUE_BYTES = 10 * 1024


class ConfigError(ValueError):
    """The claim's configuration is unusable; the message is for the claim's owner."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TimeSliceInterval(StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


class TimeSlicing(_Strict):
    interval: TimeSliceInterval = TimeSliceInterval.DEFAULT


class SpacePartitioning(_Strict):
    partition_count: int = Field(alias="partitionCount", ge=1, le=8)


class Sharing(_Strict):
    strategy: Literal["TimeSlicing", "SpacePartitioning"]
    time_slicing: TimeSlicing | None = Field(default=None, alias="timeSlicing")
    space_partitioning: SpacePartitioning | None = Field(default=None, alias="spacePartitioning")

    @model_validator(mode="after")
    def _settings_match_strategy(self) -> Sharing:
        if self.strategy == "TimeSlicing" and self.space_partitioning is not None:
            raise ValueError("spacePartitioning is set but strategy is TimeSlicing")
        if self.strategy == "SpacePartitioning" and self.space_partitioning is None:
            raise ValueError("strategy SpacePartitioning needs spacePartitioning.partitionCount")
        if self.strategy == "SpacePartitioning" and self.time_slicing is not None:
            raise ValueError("timeSlicing is set but strategy is SpacePartitioning")
        return self

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {"GPU_SHARING_STRATEGY": self.strategy}
        if self.strategy == "TimeSlicing":
            env["GPU_TIMESLICE_INTERVAL"] = (self.time_slicing or TimeSlicing()).interval.value
        elif self.space_partitioning is not None:
            env["GPU_PARTITION_COUNT"] = str(self.space_partitioning.partition_count)
        return env


class GpuConfig(_Strict):
    api_version: Literal["gpu.dra-testbed.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None

    def env(self) -> dict[str, str]:
        return self.sharing.env() if self.sharing else {}


class NicConfig(_Strict):
    api_version: Literal["nic.dra-testbed.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["NicConfig"]
    ips: list[str] = Field(default_factory=list, max_length=16)
    mtu: int = Field(default=1500, ge=576, le=9216)

    @field_validator("ips")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                ipaddress.ip_interface(value)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not an address in CIDR form like 10.0.0.5/24") from exc
        return values

    def env(self) -> dict[str, str]:
        return {"NIC_MTU": str(self.mtu)}


CONFIG_KINDS: dict[str, dict[str, type[GpuConfig] | type[NicConfig]]] = {
    GPU_DRIVER: {"GpuConfig": GpuConfig},
    NIC_DRIVER: {"NicConfig": NicConfig},
}


def _explain(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        location = ".".join(str(p) for p in error["loc"] if not str(p).startswith("function-"))
        parts.append(f"{location or 'parameters'}: {error['msg']}")
    return "; ".join(parts)


def parse_config(driver: str, parameters: Any) -> GpuConfig | NicConfig:
    """Parse the ``opaque.parameters`` of one config entry for ``driver``."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"opaque parameters for {driver} must be an object, got {type(parameters).__name__}")
    kinds = CONFIG_KINDS.get(driver, {})
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


def configs_for_request(driver: str, entries: Sequence[Mapping[str, Any]], request: str) -> list[GpuConfig | NicConfig]:
    """Configs from an allocation result that apply to ``request``, class entries first
    (they come first in the allocation), later entries overriding earlier ones."""
    applied: list[GpuConfig | NicConfig] = []
    for entry in entries:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        requests = entry.get("requests") or []
        # "req/sub" names a subrequest of a prioritized list: it belongs to "req" too.
        if requests and request not in requests and request.split("/")[0] not in requests:
            continue
        applied.append(parse_config(driver, opaque.get("parameters")))
    return applied
