"""The fake kubelet's Events read as a kubelet's event recorder writes them."""

from __future__ import annotations

from testbed.kubelet.events import SPAM_BURST, EventRecorder, Write

POD = {"metadata": {"name": "web", "namespace": "ns", "uid": "u1"}}
FAILED = ("Warning", "Failed", "Error: unresolvable CDI device x")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_same_event_again_counts_up_the_event_recorded_before() -> None:
    recorder = EventRecorder("node-1", Clock())
    first = recorder.record(POD, *FAILED, "t1")
    second = recorder.record(POD, *FAILED, "t2")
    assert first is not None and first.name is None
    assert first.body["count"] == 1 and first.body["firstTimestamp"] == "t1"
    assert first.body["involvedObject"]["uid"] == "u1" and first.body["source"] == {
        "component": "kubelet",
        "host": "node-1",
    }
    assert second == Write(first.body["metadata"]["name"], {"count": 2, "lastTimestamp": "t2", "message": FAILED[2]})


def test_another_message_is_an_event_of_its_own() -> None:
    recorder = EventRecorder("node-1", Clock())
    first = recorder.record(POD, *FAILED, "t1")
    other = recorder.record(POD, "Warning", "Failed", "Error: something else", "t2")
    assert first is not None and other is not None
    assert other.name is None and other.body["count"] == 1
    assert other.body["metadata"]["name"] != first.body["metadata"]["name"]


def test_25_events_of_a_pod_go_through_then_one_every_5_minutes_still_counting() -> None:
    clock = Clock()
    recorder = EventRecorder("node-1", clock)
    written = [recorder.record(POD, *FAILED, f"t{i}") for i in range(SPAM_BURST)]
    assert all(w is not None for w in written)
    clock.now += 10
    assert recorder.record(POD, *FAILED, "held") is None
    clock.now += 290  # a token back
    after = recorder.record(POD, *FAILED, "later")
    assert after is not None and after.body["count"] == SPAM_BURST + 2  # the held one counted
    assert recorder.record(POD, *FAILED, "too soon") is None


def test_each_event_type_and_each_pod_has_its_own_allowance() -> None:
    recorder = EventRecorder("node-1", Clock())
    other_pod = {"metadata": {"name": "db", "namespace": "ns", "uid": "u2"}}
    for i in range(SPAM_BURST):
        recorder.record(POD, *FAILED, f"t{i}")
    assert recorder.record(POD, *FAILED, "held") is None
    assert recorder.record(POD, "Normal", "Pulled", "image present", "t") is not None
    assert recorder.record(other_pod, *FAILED, "t") is not None


def test_an_expired_event_is_recreated_with_the_count_so_far() -> None:
    recorder = EventRecorder("node-1", Clock())
    first = recorder.record(POD, *FAILED, "t1")
    recorder.record(POD, *FAILED, "t2")
    again = recorder.recreated(POD, *FAILED, "t3")
    assert first is not None and again.name is None
    assert again.body["count"] == 2 and again.body["firstTimestamp"] == "t1"
    assert again.body["metadata"]["name"] != first.body["metadata"]["name"]
    follow = recorder.record(POD, *FAILED, "t4")
    assert follow == Write(again.body["metadata"]["name"], {"count": 3, "lastTimestamp": "t4", "message": FAILED[2]})


def test_a_pod_forgotten_starts_afresh() -> None:
    recorder = EventRecorder("node-1", Clock())
    for i in range(SPAM_BURST):
        recorder.record(POD, *FAILED, f"t{i}")
    recorder.forget("u1")
    fresh = recorder.record(POD, *FAILED, "t")
    assert fresh is not None and fresh.name is None and fresh.body["count"] == 1
