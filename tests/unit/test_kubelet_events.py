"""The fake kubelet's Events read as a kubelet's event recorder writes them."""

from __future__ import annotations

from testbed.kubelet.events import SIMILAR_WINDOW_S, SPAM_BURST, EventRecorder, Write

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


def test_an_expired_event_is_recreated_under_its_name_with_the_count_so_far() -> None:
    recorder = EventRecorder("node-1", Clock())
    first = recorder.record(POD, *FAILED, "t1")
    patch = recorder.record(POD, *FAILED, "t2")
    assert first is not None and patch is not None
    again = recorder.recreated(POD, patch, "t2")
    assert again is not None and again.name is None and again.body["metadata"]["name"] == first.body["metadata"]["name"]
    assert again.body["count"] == 2 and again.body["firstTimestamp"] == "t1" and again.body["lastTimestamp"] == "t2"
    follow = recorder.record(POD, *FAILED, "t4")
    assert follow == Write(first.body["metadata"]["name"], {"count": 3, "lastTimestamp": "t4", "message": FAILED[2]})


def failed_with(recorder: EventRecorder, attempts: range, pod: dict[str, dict[str, str]] = POD) -> list[Write | None]:
    return [recorder.record(pod, "Warning", "Failed", f"Error: attempt {i}", f"t{i}") for i in attempts]


def test_the_tenth_different_message_of_a_reason_is_folded_into_one_combined_event() -> None:
    recorder = EventRecorder("node-1", Clock())
    own = failed_with(recorder, range(1, 10))
    assert [w.body["message"] for w in own if w is not None and w.name is None] == [
        f"Error: attempt {i}" for i in range(1, 10)
    ]
    assert len({w.body["metadata"]["name"] for w in own if w is not None}) == 9
    tenth, eleventh = failed_with(recorder, range(10, 12))
    assert tenth is not None and tenth.name is None
    assert tenth.body["message"] == "(combined from similar events): Error: attempt 10" and tenth.body["count"] == 1
    assert eleventh == Write(
        tenth.body["metadata"]["name"],
        {"count": 2, "lastTimestamp": "t11", "message": "(combined from similar events): Error: attempt 11"},
    )
    other_reason = recorder.record(POD, "Warning", "FailedPrepareDynamicResources", "Error: attempt 12", "t12")
    assert other_reason is not None and other_reason.name is None and other_reason.body["count"] == 1
    assert other_reason.body["message"] == "Error: attempt 12"


def test_similar_messages_are_counted_afresh_after_10_quiet_minutes() -> None:
    clock = Clock()
    recorder = EventRecorder("node-1", clock)
    failed_with(recorder, range(1, 10))
    clock.now += SIMILAR_WINDOW_S + 1
    later = failed_with(recorder, range(10, 19))
    assert all(w is not None and not w.body["message"].startswith("(combined") for w in later)


def test_a_pod_forgotten_starts_afresh() -> None:
    recorder = EventRecorder("node-1", Clock())
    for i in range(SPAM_BURST):
        recorder.record(POD, *FAILED, f"t{i}")
    recorder.forget("u1")
    fresh = recorder.record(POD, *FAILED, "t")
    assert fresh is not None and fresh.name is None and fresh.body["count"] == 1


def test_an_expired_event_of_a_pod_forgotten_meanwhile_is_not_recreated() -> None:
    recorder = EventRecorder("node-1", Clock())
    recorder.record(POD, *FAILED, "t1")
    patch = recorder.record(POD, *FAILED, "t2")
    assert patch is not None
    recorder.forget("u1")  # the pod went while the patch was on its way
    assert recorder.recreated(POD, patch, "t3") is None
