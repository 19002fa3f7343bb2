"""The FPGA driver's opaque config: which bitstream to load, at what clock.

apiVersion: fpga.dra-testbed.io/v1alpha1
kind: FpgaConfig
bitstream: video-transcode-v2
clockMHz: 250
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.kubeletplugin.opaque_config import OpaqueConfig


class FpgaConfig(OpaqueConfig):
    api_version: Literal["fpga.dra-testbed.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["FpgaConfig"]
    bitstream: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{0,62}$", description="a bitstream name")
    clock_mhz: int = Field(default=300, alias="clockMHz", ge=50, le=800)

    def env(self) -> dict[str, str]:
        return {"FPGA_BITSTREAM": self.bitstream, "FPGA_CLOCK_MHZ": str(self.clock_mhz)}
