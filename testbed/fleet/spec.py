"""Fleet files: pools of synthetic nodes, as validated YAML.

nodesPerHost: 50          # synthetic nodes per NodeHost Ray actor
seed: 0                   # UUIDs, MACs and random faults derive from it
ray: {address: null}      # null: a local Ray on 127.0.0.1; or host:port of a Ray cluster to join
pools:
  - name: gpu             # nodes gpu-000, gpu-001, ...
    count: 100
    profile: gpu8         # a shipped hardware profile or a YAML path
    labels: {pool: gpu}
    taints:               # default: dra-testbed.io/synthetic=true:NoSchedule
      - {key: dra-testbed.io/synthetic, value: "true", effect: NoSchedule}
    kubelet: fake         # fake (default) or real: kubelet v1.37 + a fake CRI + testbed-driver
                          # as processes per node (root only; ~180 MB a node: pools of ~10)
    devicesPerSlice: null # at most this many devices per ResourceSlice (null: the API's limits)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fake_devices.profiles import ProfileError, load_profile
from fake_devices.specfiles import SpecFileError, parse_yaml, validate


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def qualified_name_problem(key: str) -> str:
    """Why Kubernetes would refuse ``key`` as a label or taint key, or ""."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"{key!r}: the prefix before '/' must be a DNS subdomain (lowercase, digits, '-', '.')"
    if len(name) > 63 or not _NAME.fullmatch(name):
        return f"{key!r}: the name must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    return ""


def label_value_problem(value: str) -> str:
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        return (
            f"{value!r}: a label value is at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
        )
    return ""


class Taint(_Strict):
    key: str = Field(min_length=1, max_length=317)
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    @model_validator(mode="after")
    def _kubernetes_accepts_it(self) -> Taint:
        problem = qualified_name_problem(self.key) or label_value_problem(self.value)
        if problem:
            raise ValueError(problem)
        return self


def _default_taints() -> list[Taint]:
    return [Taint(key="dra-testbed.io/synthetic", value="true", effect="NoSchedule")]


class Pool(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    count: int = Field(ge=0, le=100_000)
    profile: str = "gpu8"
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=_default_taints)
    kubelet: Literal["fake", "real"] = "fake"
    devices_per_slice: int | None = Field(default=None, alias="devicesPerSlice", ge=1, le=128)
    """At most this many devices in one ResourceSlice (default: as many as the API allows)."""

    @model_validator(mode="after")
    def _labels_kubernetes_accepts(self) -> Pool:
        for key, value in self.labels.items():
            problem = qualified_name_problem(key) or label_value_problem(value)
            if problem:
                raise ValueError(f"labels: {problem}")
        return self

    @model_validator(mode="after")
    def _profile_exists(self) -> Pool:
        try:
            load_profile(self.profile)
        except ProfileError as exc:
            raise ValueError(str(exc).replace("\n", " ")) from None
        return self

    def node_name(self, index: int) -> str:
        """Stable whatever the count: scaling a pool up never renames its nodes."""
        return f"{self.name}-{index:03d}"

    def node_names(self) -> list[str]:
        return [self.node_name(i) for i in range(self.count)]


class RaySettings(_Strict):
    address: str | None = Field(default=None, pattern=r"^[^:\s]+:[0-9]+$")


class FleetFile(_Strict):
    nodes_per_host: int = Field(default=50, alias="nodesPerHost", ge=1, le=10_000)
    seed: int = 0
    ray: RaySettings = Field(default_factory=RaySettings)
    pools: list[Pool] = Field(min_length=1)
    identities: Literal["per-node", "shared"] = "per-node"
    """per-node: each kubelet is system:node:<name> and each node's drivers use a token
    bound to a driver pod on that node (as on a real cluster). shared: every node uses
    the fleet's admin credentials (fewer API calls at start-up; no RBAC or admission)."""

    @model_validator(mode="after")
    def _unique_pools(self) -> FleetFile:
        names = [p.name for p in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(duplicates)}")
        return self

    @property
    def count(self) -> int:
        return sum(p.count for p in self.pools)

    @property
    def real_kubelets(self) -> int:
        return sum(p.count for p in self.pools if p.kubelet == "real")


class FleetFileError(SpecFileError):
    pass


def parse(text: str, source: str) -> FleetFile:
    try:
        data = parse_yaml(text, source)
    except SpecFileError as exc:
        raise FleetFileError(str(exc)) from None
    return validate(FleetFile, data, "fleet file", source, FleetFileError)


def load(path: Path) -> FleetFile:
    if not path.exists():
        raise FleetFileError(f"fleet file {path} does not exist")
    return parse(path.read_text(), str(path))


def single_pool(
    count: int, profile: str, nodes_per_host: int, prefix: str = "node", devices_per_slice: int | None = None
) -> FleetFile:
    """What `--nodes N --profile P` means."""
    pool = {"name": prefix, "count": count, "profile": profile, "devicesPerSlice": devices_per_slice}
    return FleetFile.model_validate({"nodesPerHost": nodes_per_host, "pools": [pool]})
