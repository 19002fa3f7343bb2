"""When may a NodeHost take a node another server stamped? Never while that server may
still be serving it."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from testbed.fleet.fencing import CLOCK_SKEW_S, Server, parse_time, process_alive, seconds_until_free
from testbed.keys import SERVED_BY_ANNOTATION
from testbed.kubeapi import now_rfc3339

ME = Server("nodehost-f-1", "new", "ray-node-a", 4242)
OLD_ELSEWHERE = Server("nodehost-f-1", "old", "ray-node-b", 1717)
OLD_HERE = Server("nodehost-f-1", "old", "ray-node-a", 1717)


def lease(stamp: str | None, renewed_s_ago: float, now: float, duration: int = 40) -> dict[str, object]:
    renew = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - renewed_s_ago)) + ".000000Z"
    meta = {"name": "n-000", "annotations": {SERVED_BY_ANNOTATION: stamp} if stamp is not None else {}}
    return {"metadata": meta, "spec": {"holderIdentity": "n-000", "leaseDurationSeconds": duration, "renewTime": renew}}


def never_alive(pid: int) -> bool:
    return False


def always_alive(pid: int) -> bool:
    return True


def test_a_node_stamped_by_this_server_is_its_own() -> None:
    now = time.time()
    assert seconds_until_free(lease(ME.stamp(), 1, now), ME, now) == (0.0, None)


def test_another_machines_server_holds_the_node_until_its_lease_lapses() -> None:
    now = float(int(time.time()))
    wait, holder = seconds_until_free(lease(OLD_ELSEWHERE.stamp(), 5, now), ME, now, never_alive)
    assert holder == OLD_ELSEWHERE
    assert wait == pytest.approx(40 - 5 + CLOCK_SKEW_S)
    assert seconds_until_free(lease(OLD_ELSEWHERE.stamp(), 45, now), ME, now, never_alive)[0] == 0.0


def test_a_server_on_this_ray_node_whose_process_exited_lets_go_at_once() -> None:
    now = time.time()
    assert seconds_until_free(lease(OLD_HERE.stamp(), 1, now), ME, now, never_alive)[0] == 0.0
    assert seconds_until_free(lease(OLD_HERE.stamp(), 1, now), ME, now, always_alive)[0] > 30


@pytest.mark.parametrize("stamp", [None, "", "not json", '{"host": "x"}'])
def test_a_lease_without_a_readable_stamp_is_held_until_it_lapses(stamp: str | None) -> None:
    now = time.time()
    wait, holder = seconds_until_free(lease(stamp, 2, now), ME, now, never_alive)
    assert holder is None
    assert wait > 30


def test_lease_times_read_as_written() -> None:
    before = time.time()
    assert before - 1 <= parse_time(now_rfc3339(micro=True)) <= time.time()
    assert parse_time("2026-01-02T03:04:05Z") == parse_time("2026-01-02T03:04:05.000000Z")


def test_an_exited_process_is_not_alive_even_unreaped() -> None:
    assert process_alive(os.getpid())
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while process_alive(child.pid) and time.monotonic() < deadline:  # a zombie until reaped
        time.sleep(0.01)
    assert not process_alive(child.pid)
    child.wait()
    assert not process_alive(child.pid)
