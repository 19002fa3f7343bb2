"""Which Nodes a fleet's cleanup may delete from a cluster that is not the testbed's."""

from __future__ import annotations

import pytest

from testbed.fleet.orphans import of_pools


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("gpu-000", True),
        ("gpu-1234", True),  # scaled beyond the padding
        ("gpu-big-000", False),  # another pool's node, whose name starts like one of ours
        ("gpux-000", False),
        ("gpu-abc", False),
        ("gpu", False),
        ("control-plane", False),
    ],
)
def test_only_nodes_named_for_one_of_the_fleets_pools_are_its_own(name: str, ours: bool) -> None:
    assert of_pools(name, ["gpu", "real"]) is ours
