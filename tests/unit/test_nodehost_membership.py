"""A NodeHost remembers which nodes it runs, so a restarted host brings back the right ones."""

from __future__ import annotations

from pathlib import Path

from testbed.fleet.nodehost import MEMBERSHIP_DIR, NodeHost, NodeRecipe


def test_membership_written_on_creation_and_read_back(tmp_path: Path) -> None:
    recipes = [
        NodeRecipe("a-000", "tiny", {"pool": "a"}),
        NodeRecipe("a-001", "gpu8", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]),
    ]
    host = NodeHost(str(tmp_path / "kubeconfig"), str(tmp_path), recipes, name="nodehost-x-0")
    assert (tmp_path / MEMBERSHIP_DIR / "nodehost-x-0.json").exists()
    assert host._remembered() == {r.name: r for r in recipes}

    host.recipes.pop("a-000")  # as remove_nodes does
    host._remember()
    assert list(host._remembered() or {}) == ["a-001"]


def test_an_unnamed_host_keeps_nothing_on_disk(tmp_path: Path) -> None:
    NodeHost(str(tmp_path / "kubeconfig"), str(tmp_path), [NodeRecipe("b-000", "tiny")])
    assert not (tmp_path / MEMBERSHIP_DIR).exists()
