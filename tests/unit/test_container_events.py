"""What the fake kubelet tells of a container's start and stop, and how its Events name
what they are about: the words users read in `kubectl describe pod`."""

from __future__ import annotations

from pathlib import Path

from testbed.config import REGISTRY_BURST, REGISTRY_PULL_QPS
from testbed.kubelet.containerevents import (
    IMAGE_SIZE_BYTES,
    ImageStore,
    PullBackOff,
    field_path,
    go_milliseconds,
    pulled_name,
    stopping,
)
from testbed.kubelet.events import EventRecorder
from testbed.kubelet.ratelimit import TokenBucket


def reasons(images: ImageStore, container: dict[str, str]) -> list[str]:
    return [told.reason for told in images.ensure(container)]


def test_an_image_is_pulled_once_unless_its_policy_says_always(tmp_path: Path) -> None:
    images = ImageStore(tmp_path / "images.json")
    tagged = {"name": "main", "image": "registry.invalid/work:v1", "imagePullPolicy": "IfNotPresent"}
    assert reasons(images, tagged) == ["Pulling", "Pulled"]
    [present] = images.ensure(tagged)
    assert present.message == (
        'Container image "registry.invalid/work:v1" already present on machine and can be accessed by the pod'
    )
    latest = {"name": "main", "image": "registry.invalid/work", "imagePullPolicy": "Always"}
    for _ in range(2):
        pulling, pulled = images.ensure(latest)
        assert pulling.message == 'Pulling image "registry.invalid/work"'
        assert pulled.message == (
            'Successfully pulled image "registry.invalid/work" in 0s (0s including waiting).'
            " Image size: 67108864 bytes."
        )
    never = {"name": "main", "image": "registry.invalid/preloaded:v1", "imagePullPolicy": "Never"}
    assert reasons(images, never) == ["Pulled"], "taken to be preloaded"
    assert "registry.invalid/preloaded:v1" not in images


class Clock:
    """Time as the test sets it."""

    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_node_pulls_ten_images_at_once_then_five_a_second() -> None:
    clock = Clock()
    limit = TokenBucket(REGISTRY_PULL_QPS, REGISTRY_BURST, clock=clock)
    assert [limit.take() for _ in range(11)] == [True] * 10 + [False]
    clock.now += 0.5
    assert [limit.take() for _ in range(3)] == [True, True, False], "5 a second: 2.5 tokens in 0.5 s"
    clock.now += 60
    assert sum(limit.take() for _ in range(20)) == 10, "never more than the burst"
    assert all(TokenBucket(0, REGISTRY_BURST).take() for _ in range(100)), "registryPullQPS 0: no limit"


def test_a_failed_pull_backs_off_per_pod_and_image_doubling_to_five_minutes() -> None:
    clock = Clock()
    back_off = PullBackOff(clock)
    assert back_off.blocked("pod", "img") is None
    waits = []
    for _ in range(7):
        back_off.failed("pod", "img", "ErrImagePull: pull QPS exceeded")
        start = clock.now
        while back_off.blocked("pod", "img") is not None:
            clock.now += 1
        waits.append(clock.now - start)
    assert waits == [10, 20, 40, 80, 160, 300, 300]
    assert back_off.blocked("other-pod", "img") is None, "each pod backs off on its own"
    back_off.failed("pod", "img", "why")
    clock.now += 901
    back_off.failed("pod", "img", "why")
    clock.now += 10
    assert back_off.blocked("pod", "img") is None, "a failure 600 s after the back-off ended starts at 10 s again"
    back_off.failed("pod", "img", "why")
    back_off.forget("pod")
    assert back_off.blocked("pod", "img") is None


def test_a_pull_over_the_limit_fails_then_backs_off_with_the_kubelets_words() -> None:
    clock = Clock()
    images = ImageStore(limit=TokenBucket(5, 1, clock=clock))
    images.back_off = PullBackOff(clock)
    first = {"name": "a", "image": "registry.invalid/a", "imagePullPolicy": "Always"}
    second = {"name": "b", "image": "registry.invalid/b", "imagePullPolicy": "Always"}
    assert images.pull(first, "uid").failed is None
    failed = images.pull(second, "uid")
    assert failed.failed == ("ErrImagePull", "pull QPS exceeded")
    assert [(t.kind, t.reason, t.message) for t in failed.told] == [
        ("Normal", "Pulling", 'Pulling image "registry.invalid/b"'),
        ("Warning", "Failed", 'Failed to pull image "registry.invalid/b": pull QPS exceeded'),
        ("Warning", "Failed", "Error: ErrImagePull"),
    ]
    clock.now += 5  # tokens again, but the back-off holds
    backing_off = images.pull(second, "uid")
    assert backing_off.failed == (
        "ImagePullBackOff",
        'Back-off pulling image "registry.invalid/b": ErrImagePull: pull QPS exceeded',
    )
    assert [(t.kind, t.reason, t.message) for t in backing_off.told] == [
        ("Normal", "BackOff", 'Back-off pulling image "registry.invalid/b"'),
        ("Warning", "Failed", "Error: ImagePullBackOff"),
    ]
    assert images.pull(second, "other-uid").failed is None, "another pod's pull is not backed off"
    clock.now += 5
    assert [t.reason for t in images.pull(second, "uid").told] == ["Pulling", "Pulled"]
    present = {"name": "c", "image": "registry.invalid/c:v1"}
    clock.now += 0.2
    assert images.pull(present, "uid").failed is None
    assert [t.reason for t in images.pull(present, "uid").told] == ["Pulled"], "present: no token taken"
    assert images.ensure(first) and images.ensure(first), "a start that may not fail pulls beyond the limit"


def test_a_restarted_kubelet_finds_the_images_its_pods_pulled(tmp_path: Path) -> None:
    path = tmp_path / "images.json"
    ImageStore(path).ensure({"image": "registry.invalid/work:v1"})
    assert ImageStore(path).names() == ["registry.invalid/work:v1"]
    path.write_text("{not json")
    assert ImageStore(path).names() == [], "an unreadable list is started afresh, not fatal"


def test_the_node_lists_each_image_by_the_name_it_was_pulled_under() -> None:
    images, heard = ImageStore(), []
    images.on_change = lambda: heard.append(images.names())
    for image in ("registry.invalid/work", "registry.invalid/work:v1", "registry.invalid/work:v1"):
        images.ensure({"image": image, "imagePullPolicy": "IfNotPresent"})
    assert heard == [["registry.invalid/work:latest"], ["registry.invalid/work:latest", "registry.invalid/work:v1"]]
    assert "registry.invalid/work:latest" in images and "registry.invalid/work" in images, "the same image"
    assert images.node_status() == [
        {"names": ["registry.invalid/work:latest"], "sizeBytes": IMAGE_SIZE_BYTES},
        {"names": ["registry.invalid/work:v1"], "sizeBytes": IMAGE_SIZE_BYTES},
    ]
    assert pulled_name("localhost:5000/work") == "localhost:5000/work:latest", "a port is no tag"
    assert pulled_name("registry.invalid/work@sha256:ab12") == "registry.invalid/work@sha256:ab12"


def test_an_image_the_node_was_built_with_is_found_not_pulled(tmp_path: Path) -> None:
    path = tmp_path / "images.json"
    ImageStore(path).ensure({"image": "registry.invalid/work:v1"})
    images = ImageStore(path, preloaded=["registry.invalid/driver:v1"])
    assert images.names() == ["registry.invalid/driver:v1", "registry.invalid/work:v1"]
    assert reasons(images, {"name": "driver", "image": "registry.invalid/driver:v1"}) == ["Pulled"]


def test_a_container_is_named_by_where_it_is_in_the_spec() -> None:
    pod = {"spec": {"initContainers": [{"name": "setup"}], "containers": [{"name": "main"}]}}
    assert field_path(pod, "main") == "spec.containers{main}"
    assert field_path(pod, "setup") == "spec.initContainers{setup}"
    assert stopping({"name": "main"}).message == "Stopping container main"


def test_durations_print_as_go_prints_them() -> None:
    assert [go_milliseconds(s) for s in (0, 0.0034, 1.5, 123.0045, 120)] == ["0s", "3ms", "1.5s", "2m3.004s", "2m0s"]


POD = {"metadata": {"name": "web", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}}


def test_the_same_words_about_two_containers_are_two_events_and_refer_to_each() -> None:
    recorder = EventRecorder("node-1")
    first = recorder.record(POD, "Normal", "Started", "Container started", "t0", "spec.containers{a}")
    second = recorder.record(POD, "Normal", "Started", "Container started", "t0", "spec.containers{b}")
    again = recorder.record(POD, "Normal", "Started", "Container started", "t1", "spec.containers{a}")
    assert first is not None and second is not None and again is not None
    assert first.name is None and second.name is None, "both created"
    assert first.body["metadata"]["name"] != second.body["metadata"]["name"]
    assert again.name == first.body["metadata"]["name"] and again.body["count"] == 2
    assert first.body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "web",
        "namespace": "ns",
        "uid": "u1",
        "resourceVersion": "7",
        "fieldPath": "spec.containers{a}",
    }
    names = [first.body["metadata"]["name"], second.body["metadata"]["name"]]
    assert names == sorted(names) and all(n.startswith("web.") for n in names), "as client-go: <name>.<hex time>"


def test_an_event_on_the_node_refers_to_it_by_name_and_uid() -> None:
    node = {"kind": "Node", "metadata": {"name": "node-1", "uid": "n1"}}
    write = EventRecorder("node-1").record(node, "Normal", "NodeReady", "Node node-1 status is now: NodeReady", "t")
    assert write is not None
    assert write.body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "n1"}
    assert write.body["metadata"]["namespace"] == "default"
