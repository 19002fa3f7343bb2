"""The NIC driver's opaque config: addresses and MTU of a claim's interfaces.

apiVersion: nic.dra-testbed.io/v1alpha1
kind: NicConfig
ips: ["10.10.0.5/24"]
mtu: 9000
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator

from testbed.kubeletplugin.opaque_config import OpaqueConfig


class NicConfig(OpaqueConfig):
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
