"""Hardware profiles: what one node carries, as validated YAML.

A profile has a few node-wide fields and one section per kind of device; which sections
exist is up to whoever loads profiles (``ProfileLoader``). Shipped profiles live next to
this file in ``profiles/`` (and in any other directory a loader is given); a path to any
YAML file with the same fields works too. Errors name the field, e.g.
``gpus.partitions[1].placements``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fake_devices.kinds import DeviceSpec
from fake_devices.specfiles import SpecFileError, field_path, parse_yaml, validate

PROFILE_DIR = Path(__file__).parent / "profiles"


class HardwareProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    numa_nodes: int = Field(default=1, alias="numaNodes", ge=1, le=8)
    devices: dict[str, DeviceSpec] = Field(default_factory=dict)
    """Section name -> its validated spec (a subclass of DeviceSpec)."""

    def count(self, section: str) -> int:
        spec = self.devices.get(section)
        return spec.count if spec is not None else 0


class ProfileError(SpecFileError):
    pass


class ProfileLoader:
    """Reads profiles whose device sections are the given kinds'."""

    def __init__(self, sections: Iterable[type[DeviceSpec]], directories: Iterable[Path] = ()):
        self.sections: Mapping[str, type[DeviceSpec]] = {s.section: s for s in sections}
        self.directories = [PROFILE_DIR, *directories]
        functions = [s.pci_function for s in self.sections.values()]
        if len(set(functions)) != len(functions):
            raise ValueError(f"device kinds share a PCI bus: {dict(zip(self.sections, functions, strict=True))}")

    def parse(self, text: str, source: str) -> HardwareProfile:
        try:
            data = parse_yaml(text, source)
        except SpecFileError as exc:
            raise ProfileError(str(exc)) from None
        if not isinstance(data, dict):
            raise ProfileError(f"invalid hardware profile {source}: expected a mapping, got {type(data).__name__}")
        common = {k: v for k, v in data.items() if k not in self.sections}
        unknown = sorted(set(common) - {"name", "description", "numaNodes"})
        if unknown:
            raise ProfileError(
                f"invalid hardware profile {source}:\n  {unknown[0]}: not a field of a profile; "
                f"device sections: {', '.join(self.sections)}; other fields: name, description, numaNodes"
            )
        devices: dict[str, Any] = {}
        problems: list[str] = []
        for section, model in self.sections.items():
            if section in data:
                try:
                    devices[section] = model.model_validate(data[section])
                except ValidationError as exc:
                    problems += [f"  {field_path((section, *e['loc']))}: {e['msg']}" for e in exc.errors()]
        if problems:
            raise ProfileError("\n".join([f"invalid hardware profile {source}:", *problems]))
        return validate(HardwareProfile, {**common, "devices": devices}, "hardware profile", source, ProfileError)

    def shipped(self) -> list[str]:
        return sorted({p.stem for d in self.directories for p in d.glob("*.yaml")})

    def load(self, name_or_path: str) -> HardwareProfile:
        """A shipped profile by name (``gpu8``), or any YAML file by path."""
        path = Path(name_or_path)
        if not path.suffix:
            found = [d / f"{name_or_path}.yaml" for d in self.directories if (d / f"{name_or_path}.yaml").exists()]
            if not found:
                raise ProfileError(
                    f"no hardware profile named {name_or_path!r}; shipped profiles: "
                    f"{', '.join(self.shipped())} (or give a path to a YAML file)"
                )
            path = found[0]
        elif not path.exists():
            raise ProfileError(f"hardware profile file {path} does not exist")
        return self.parse(path.read_text(), str(path))
