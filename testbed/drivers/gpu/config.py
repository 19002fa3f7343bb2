"""The GPU driver's opaque config: how a claim's GPUs are shared.

apiVersion: gpu.dra-testbed.io/v1alpha1
kind: GpuConfig
sharing:
  strategy: TimeSlicing          # or SpacePartitioning
  timeSlicing: {interval: Short} # Default | Short | Medium | Long
  # spacePartitioning: {partitionCount: 2}
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from testbed.kubeletplugin.opaque_config import OpaqueConfig, StrictConfig


class TimeSliceInterval(StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


class TimeSlicing(StrictConfig):
    interval: TimeSliceInterval = TimeSliceInterval.DEFAULT


class SpacePartitioning(StrictConfig):
    partition_count: int = Field(alias="partitionCount", ge=1, le=8)


class Sharing(StrictConfig):
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


class GpuConfig(OpaqueConfig):
    api_version: Literal["gpu.dra-testbed.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None

    def env(self) -> dict[str, str]:
        return self.sharing.env() if self.sharing else {}
