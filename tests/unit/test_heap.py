"""What a NodeHost's process does with its collector while nodes start and go."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from testbed import heap


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Held:
    """Something a node holds, in a reference cycle as node objects are."""

    def __init__(self) -> None:
        self.me = self


def test_starts_collect_the_young_generation_less_often_until_the_last_one_ends() -> None:
    first, second = heap.starting_nodes(), heap.starting_nodes()
    first.__enter__()
    assert gc.get_threshold()[0] == heap.START_THRESHOLD
    second.__enter__()
    first.__exit__(None, None, None)  # overlapping starts: the other is still going
    assert gc.get_threshold()[0] == heap.START_THRESHOLD
    second.__exit__(None, None, None)
    assert gc.get_threshold() == heap.STEADY_THRESHOLD


def test_what_started_nodes_hold_is_settled_and_a_failed_start_ends_the_start_settings() -> None:
    with pytest.raises(RuntimeError), heap.starting_nodes():
        held = Held()  # what the nodes that did start hold
        raise RuntimeError("a node failed to start")
    assert gc.get_threshold() == heap.STEADY_THRESHOLD
    assert not _collectable(held), "what started nodes hold is not walked again"


def _collectable(obj: object) -> bool:
    """In a generation the collector walks (frozen objects are in none of them)."""
    return any(o is obj for o in gc.get_objects())


def test_what_removed_nodes_held_is_collected_after_release() -> None:
    with heap.starting_nodes():
        held = Held()
    gone = weakref.ref(held)
    assert not _collectable(held)
    del held  # the node is removed: only its own cycle keeps it
    gc.collect()
    assert gone() is not None, "settled objects are never collected by themselves"
    heap.release()
    assert gone() is None


def test_a_scenario_run_settles_what_its_process_held_and_gives_it_back_at_the_end() -> None:
    before = Held()
    with heap.settled():
        assert not _collectable(before), "a full collection mid-run does not walk what was there"
        during = Held()
        assert _collectable(during), "what the run makes is collected as usual"
    assert _collectable(before), "a test session running scenarios one after another leaks no cycles"
    gone = weakref.ref(before)
    del before
    gc.collect()
    assert gone() is None
