"""Which nodes each NodeHost serves, kept in Ray's GCS rather than on a host's disk.

Ray restarts a lost NodeHost wherever there is room, possibly on another machine, and
replays the arguments it was first created with. The nodes it serves NOW (after the fleet
was scaled) must therefore come from a place that outlives any one machine: the GCS's
key-value store, which every Ray host reaches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.config import KUBELET_SYNC_FREQUENCY_S, REGISTRY_BURST, REGISTRY_PULL_QPS
from testbed.fleet.external import ExternalDriverSpec

KV_NAMESPACE = "dra-testbed-fleet"


@dataclass(frozen=True)
class NodeRecipe:
    """What a NodeHost needs to (re)start one node."""

    name: str
    profile: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] | None = None
    """None: the default synthetic-node taint."""
    kubelet: str = "fake"
    """fake: a synthetic node in this process; real: kubelet + CRI + driver processes."""
    devices_per_slice: int | None = None
    drivers: tuple[str, ...] | None = None
    """Built-in drivers to run (full names); None: those the profile's hardware needs."""
    external: tuple[ExternalDriverSpec, ...] = ()
    """Drivers run from a command, one process per node."""
    address: str | None = None
    """Its InternalIP (FleetFile.node_address); None: derived from its name."""
    sync_frequency_s: float = KUBELET_SYNC_FREQUENCY_S
    """Its kubelet's syncFrequency."""
    pull_limit: tuple[int, int] = (REGISTRY_PULL_QPS, REGISTRY_BURST)
    """Its kubelet's registryPullQPS and registryBurst."""

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> NodeRecipe:
        entry = dict(entry)
        drivers = entry.pop("drivers", None)
        external = tuple(ExternalDriverSpec.from_json(e) for e in entry.pop("external", []))
        qps, burst = entry.pop("pull_limit", (REGISTRY_PULL_QPS, REGISTRY_BURST))
        drivers = None if drivers is None else tuple(drivers)
        return cls(**entry, drivers=drivers, external=external, pull_limit=(qps, burst))


def encode(recipes: Iterable[NodeRecipe]) -> bytes:
    return json.dumps([asdict(r) for r in recipes], separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, NodeRecipe]:
    recipes = [NodeRecipe.from_json(entry) for entry in json.loads(data)]
    return {recipe.name: recipe for recipe in recipes}


def in_ray() -> bool:
    """Whether this runs as a Ray actor, which Ray restarts after a crash: only then is
    there a later life to remember nodes for (a process merely joined to Ray, such as a
    test session, has none)."""
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized()) and ray.get_runtime_context().get_actor_id() is not None


class Membership:
    """One NodeHost's nodes under its actor name (unique per fleet: it carries the fleet id)."""

    def __init__(self, host: str):
        self.key = f"membership/{host}".encode()

    def save(self, recipes: Iterable[NodeRecipe]) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(self.key, encode(recipes), overwrite=True, namespace=KV_NAMESPACE)

    def load(self) -> dict[str, NodeRecipe] | None:
        from ray.experimental import internal_kv

        data = internal_kv._internal_kv_get(self.key, namespace=KV_NAMESPACE)
        return None if data is None else decode(data)

    def forget(self) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(self.key, namespace=KV_NAMESPACE)
