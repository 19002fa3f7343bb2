"""A NodeHost remembers which nodes it serves in Ray's GCS, so a host Ray restarts on
any machine brings back the nodes it had after scaling, not those it was created with."""

from __future__ import annotations

from pathlib import Path

from testbed.fleet.external import ExternalDriverSpec
from testbed.fleet.membership import NodeRecipe, decode, encode
from testbed.fleet.nodehost import NodeHost


def test_recipes_survive_the_round_trip_through_the_store() -> None:
    recipes = [
        NodeRecipe("a-000", "tiny", {"pool": "a"}),
        NodeRecipe("a-001", "gpu8", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}], devices_per_slice=4),
        NodeRecipe(
            "b-000",
            "gpu8",
            drivers=("gpu.dra-testbed.io",),
            external=(ExternalDriverSpec("my.example.com", ("my-driver", "--v=2"), {"A": "1"}),),
        ),
    ]
    assert decode(encode(recipes)) == {r.name: r for r in recipes}


def test_a_host_outside_ray_keeps_no_memory(tmp_path: Path) -> None:
    host = NodeHost(str(tmp_path / "kubeconfig"), str(tmp_path), [NodeRecipe("b-000", "tiny")], name="nodehost-x-0")
    assert host.membership is None
    assert host._remembered() is None
    assert list(tmp_path.iterdir()) == []  # nothing written on this machine's disk either
