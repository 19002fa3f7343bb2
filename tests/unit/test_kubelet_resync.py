"""Each running pod is synced again on its own jittered interval, as a kubelet's pod
workers requeue pods: not all of a node's pods in the same instant."""

from __future__ import annotations

import itertools

from testbed.kubelet.resync import ResyncSchedule


def test_a_pod_is_due_its_interval_plus_its_jitter_after_it_was_added() -> None:
    draws = iter([0.0, 1.0, 0.5])
    schedule = ResyncSchedule(60.0, 0.5, rand=lambda: next(draws))
    schedule.add("a", 0.0)  # due at 60
    schedule.add("b", 0.0)  # due at 90
    schedule.add("c", 10.0)  # due at 85
    assert schedule.next_at() == 60.0
    assert schedule.due(59.9) == []
    assert schedule.due(60.0) == ["a"]
    assert schedule.due(89.0) == ["c"]
    assert schedule.next_at() == 90.0 and len(schedule) == 1


def test_the_pods_of_a_node_spread_over_the_jitter() -> None:
    schedule = ResyncSchedule(60.0, 0.5)
    for i in range(200):
        schedule.add(f"p{i}", 0.0)
    dues = [len(schedule.due(t)) for t in range(60, 91, 5)]
    assert sum(dues) == 200
    assert max(dues) < 100, dues  # not all at once
    assert all(schedule.due(t) == [] for t in range(0, 60))


def test_a_pod_added_again_is_due_once_at_its_new_time() -> None:
    counter = itertools.count()
    schedule = ResyncSchedule(60.0, 0.5, rand=lambda: 0.0 if next(counter) else 1.0)
    schedule.add("a", 0.0)  # due at 90
    schedule.add("a", 10.0)  # synced meanwhile (it changed): due at 70
    assert schedule.due(80.0) == ["a"]
    assert schedule.due(100.0) == []


def test_a_pod_removed_is_never_due() -> None:
    schedule = ResyncSchedule(60.0, 0.5)
    schedule.add("a", 0.0)
    schedule.add("b", 0.0)
    schedule.remove("a")
    assert schedule.due(1000.0) == ["b"]
    assert schedule.next_at() is None and len(schedule) == 0
