"""Hardware profiles: what one node carries, as validated YAML.

Shipped profiles live next to this file in ``profiles/``; a path to any YAML file with
the same fields works too. Errors name the field, e.g. ``gpus.partitions[1].placements``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fake_devices.specfiles import SpecFileError, parse_yaml, validate

PROFILE_DIR = Path(__file__).parent / "profiles"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PartitionProfile(Strict):
    """A MIG-style partition shape: which memory slices it covers and what it gets."""

    name: str = Field(pattern=r"^[0-9]+g\.[0-9]+gb$", description="e.g. 1g.10gb")
    memory_slices: int = Field(alias="memorySlices", ge=1)
    multiprocessors: int = Field(ge=1)
    memory_gib: int = Field(alias="memoryGiB", ge=1)
    placements: list[int] = Field(min_length=1, description="first memory slice of each placement")


class GpuSpec(Strict):
    count: int = Field(ge=0, le=16)
    product_name: str = Field(alias="productName", max_length=64)
    architecture: str = Field(max_length=64)
    driver_version: str = Field(alias="driverVersion", pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")
    memory_gib: int = Field(alias="memoryGiB", ge=1)
    multiprocessors: int = Field(ge=1)
    memory_slices: int = Field(default=8, alias="memorySlices", ge=1, le=16)
    partitions: list[PartitionProfile] = Field(default_factory=list)

    @model_validator(mode="after")
    def _placements_fit(self) -> GpuSpec:
        for i, partition in enumerate(self.partitions):
            for start in partition.placements:
                if start < 0 or start + partition.memory_slices > self.memory_slices:
                    raise ValueError(
                        f"partitions[{i}] ({partition.name}) placement {start} needs slices "
                        f"{start}..{start + partition.memory_slices - 1}, but the GPU has "
                        f"{self.memory_slices} (memorySlices)"
                    )
        return self


class NicSpec(Strict):
    count: int = Field(ge=0, le=16)
    model: str = Field(max_length=64)
    link_speed_gbps: int = Field(alias="linkSpeedGbps", ge=1)
    rdma: bool = True
    virtual_functions: int = Field(default=0, alias="virtualFunctions", ge=0, le=256)


class HardwareProfile(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    numa_nodes: int = Field(default=1, alias="numaNodes", ge=1, le=8)
    gpus: GpuSpec | None = None
    nics: NicSpec | None = None

    @property
    def gpu_count(self) -> int:
        return self.gpus.count if self.gpus else 0

    @property
    def nic_count(self) -> int:
        return self.nics.count if self.nics else 0


class ProfileError(SpecFileError):
    pass


def parse_profile(text: str, source: str) -> HardwareProfile:
    try:
        data = parse_yaml(text, source)
    except SpecFileError as exc:
        raise ProfileError(str(exc)) from None
    return validate(HardwareProfile, data, "hardware profile", source, ProfileError)


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> HardwareProfile:
    """A shipped profile by name (``gpu8``), or any YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ProfileError(
                f"no hardware profile named {name_or_path!r}; shipped profiles: "
                f"{', '.join(shipped_profiles())} (or give a path to a YAML file)"
            )
    elif not path.exists():
        raise ProfileError(f"hardware profile file {path} does not exist")
    return parse_profile(path.read_text(), str(path))
