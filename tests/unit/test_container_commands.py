"""What a container's command says it does (testbed/kubelet/commands.py): how long it runs
and how it exits, read as the reference node's runtime reads it."""

from __future__ import annotations

import pytest

from testbed.keys import RUN_SECONDS_ANNOTATION
from testbed.kubeapi import Obj
from testbed.kubelet.commands import (
    Ending,
    ending,
    endings,
    exits_at_once,
    grace_seconds,
    hook_seconds,
    init_seconds,
    may_restart_all,
    pre_stop_seconds,
    restart_seconds,
    restarts,
    restarts_all,
    run_seconds,
    should_restart,
)


def container(*command: str, name: str = "main") -> Obj:
    return {"name": name, "command": list(command)}


def pod(policy: str | None, *containers: Obj) -> Obj:
    spec: Obj = {"containers": list(containers)}
    if policy is not None:
        spec["restartPolicy"] = policy
    return {"metadata": {}, "spec": spec}


@pytest.mark.parametrize(
    ("command", "ends"),
    [
        (["sleep", "5"], Ending(5.0, 0)),
        (["/bin/sleep", "0.5"], Ending(0.5, 0)),
        (["sh", "-c", "sleep 2; exit 3"], Ending(2.0, 3)),
        (["sh", "-c", "nvidia-smi -L && sleep '1.5' && exit 1"], Ending(1.5, 1)),
        (["sh", "-c", "exit 1"], Ending(0.0, 1)),
        (["sh", "-c", "exit 256"], Ending(0.0, 0)),
        (["sleep", "infinity"], None),
        (["sh", "-c", "sleep infinity; exit 1"], None),
        (["run-until-deleted"], None),
        (["sleep", "-1"], None),
        ([], None),
    ],
)
def test_a_command_ends_after_its_sleep_with_its_exit_status_or_runs_until_stopped(
    command: list[str], ends: Ending | None
) -> None:
    assert ending(container(*command)) == ends


def test_args_are_read_with_the_command() -> None:
    assert ending({"name": "main", "command": ["sh", "-c"], "args": ["sleep 4; exit 2"]}) == Ending(4.0, 2)


def test_a_pod_ends_when_its_containers_do_unless_it_restarts_them() -> None:
    done, failing = container("sleep", "2"), container("sh", "-c", "sleep 1; exit 1", name="check")
    assert run_seconds(pod("Never", done, failing)) == 2.0, "Never: it ends, Failed"
    assert run_seconds(pod("OnFailure", done)) == 2.0
    assert run_seconds(pod("OnFailure", done, failing)) is None, "OnFailure: the failing one is started again"
    assert run_seconds(pod(None, done)) is None, "Always (the default): started again"
    assert run_seconds(pod("Never", done, container("run-until-deleted", name="server"))) is None


def test_in_a_pod_that_ends_each_container_ends_at_its_own_time_the_pod_at_the_last() -> None:
    short, failing = container("sleep", "1", name="short"), container("sh", "-c", "sleep 3; exit 2", name="check")
    long = container("sleep", "5", name="long")
    never = pod("Never", short, failing, long)
    assert run_seconds(never) == 5.0
    assert endings(never) == {"short": Ending(1.0, 0), "check": Ending(3.0, 2), "long": Ending(5.0, 0)}
    assert endings(pod(None, short, long)) == {}, "Always: restarted instead"
    annotated = {**never, "metadata": {"annotations": {RUN_SECONDS_ANNOTATION: "2"}}}
    assert run_seconds(annotated) == 2.0 and endings(annotated) == {}, "the annotation times them all"


def test_a_container_exits_at_once_when_its_command_ends_without_a_sleep() -> None:
    quick, sleeper = container("sh", "-c", "exit 1"), container("sh", "-c", "sleep 1; exit 1")
    assert exits_at_once(pod(None, quick), quick) and exits_at_once(pod("Never", quick), quick)
    assert not exits_at_once(pod(None, sleeper), sleeper)
    assert not exits_at_once(pod(None, container("run-until-deleted")), container("run-until-deleted"))
    annotated = {**pod("Never", quick), "metadata": {"annotations": {RUN_SECONDS_ANNOTATION: "3"}}}
    assert not exits_at_once(annotated, quick), "the annotation times the pod's containers"


def test_only_a_container_of_a_pod_that_does_not_end_exits_to_be_started_again_or_stay_exited() -> None:
    sleeper = container("sh", "-c", "sleep 2")
    assert restart_seconds(pod(None, sleeper), sleeper) == 2.0
    forever = container("sleep", "infinity")
    assert restart_seconds(pod(None, forever), forever) is None
    assert restart_seconds(pod("Never", sleeper), sleeper) is None, "it completes instead"
    failing = container("sh", "-c", "exit 1", name="check")
    on_failure = pod("OnFailure", sleeper, failing)
    assert restart_seconds(on_failure, sleeper) == 2.0 and restart_seconds(on_failure, failing) == 0.0
    assert restarts(on_failure, failing) and not restarts(on_failure, sleeper), "a completed one stays so"
    assert restarts(pod(None, sleeper), sleeper)
    assert not restarts(pod("Never", failing), failing)


def test_a_containers_own_policy_and_first_matching_rule_decide_over_the_pods() -> None:
    """ContainerRestartRules (beta, on in kubelet v1.37)."""
    on_42 = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
    ruled = {**container("sh", "-c", "sleep 1; exit 42"), "restartPolicy": "Never", "restartPolicyRules": on_42}
    never = pod("Never", ruled)
    assert should_restart(never, ruled, 42) and not should_restart(never, ruled, 1)
    assert restarts(never, ruled) and run_seconds(never) is None and restart_seconds(never, ruled) == 1.0
    not_in = [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 3]}}]
    guarded = {**ruled, "restartPolicyRules": not_in}
    assert [should_restart(never, guarded, code) for code in (0, 3, 7)] == [False, False, True]
    unknown_first = [{"action": "Later", "exitCodes": {"operator": "In", "values": [42]}}, *on_42]
    assert not should_restart(never, {**ruled, "restartPolicyRules": unknown_first}, 42), "the first match decides"
    without_own = {"name": "x", "restartPolicyRules": on_42}
    assert not should_restart(never, without_own, 42), "rules count only beside the container's own policy"
    once = {**container("sh", "-c", "sleep 1; exit 3", name="once"), "restartPolicy": "Never"}
    beside = pod(None, container("sleep", "infinity"), once)
    assert not restarts(beside, once) and restart_seconds(beside, once) == 1.0, "exits and stays so, the pod runs on"
    assert run_seconds(pod(None, {**container("sleep", "1"), "restartPolicy": "Never"})) == 1.0, "the pod ends"
    on_failure = {**container("sh", "-c", "exit 2"), "restartPolicy": "OnFailure"}
    assert restarts(pod("Never", on_failure), on_failure)
    open_ended = pod("Never", container("sleep", "infinity", name="server"), container("sleep", "2", name="job"))
    assert restart_seconds(open_ended, open_ended["spec"]["containers"][1]) == 2.0, "shown exited, not run on"


def test_a_restart_all_containers_rule_restarts_its_container_and_with_it_the_whole_pod() -> None:
    """RestartAllContainersOnContainerExits (beta, on in kubelet v1.37)."""
    on_42 = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
    trigger = {**container("sh", "-c", "sleep 6; exit 42"), "restartPolicy": "Never", "restartPolicyRules": on_42}
    whole = pod("Never", trigger, container("sleep", "infinity", name="other"))
    assert restarts_all(trigger, 42) and should_restart(whole, trigger, 42)
    assert not restarts_all(trigger, 1) and not should_restart(whole, trigger, 1), "its own policy decides the rest"
    assert run_seconds(whole) is None and restart_seconds(whole, trigger) == 6.0, "the pod never ends of itself"
    assert may_restart_all(whole) and not may_restart_all(pod("Never", container("sleep", "1")))
    without_own = {**trigger, "restartPolicy": None}
    assert not restarts_all(without_own, 42), "rules count only beside the container's own policy"
    in_init = pod("Never", container("sleep", "1"))
    in_init["spec"]["initContainers"] = [trigger]
    assert may_restart_all(in_init)


@pytest.mark.parametrize(
    ("command", "seconds"),
    [
        (["sleep", "5"], 5.0),
        (["sh", "-c", "nvidia-smi -L && sleep 2.5"], 2.5),
        (["sleep", "infinity"], None),
        (["nvidia-smi", "-L"], 0.0),
        ([], 0.0),
    ],
)
def test_an_init_container_runs_as_long_as_its_sleep_and_any_other_command_ends_at_once(
    command: list[str], seconds: float | None
) -> None:
    assert init_seconds({"name": "check", "command": command}) == seconds


def hooked(name: str, pre_stop: Obj | None = None, post_start: Obj | None = None) -> Obj:
    lifecycle = {k: v for k, v in (("preStop", pre_stop), ("postStart", post_start)) if v is not None}
    return {**container("sleep", "3600", name=name), "lifecycle": lifecycle}


def test_a_hooks_time_is_its_sleep_actions_and_nothing_for_what_runs_no_process() -> None:
    assert hook_seconds(hooked("a", pre_stop={"sleep": {"seconds": 6}}), "preStop") == 6
    assert hook_seconds(hooked("a", post_start={"sleep": {"seconds": 2}}), "postStart") == 2
    assert hook_seconds(hooked("a", post_start={"sleep": {"seconds": 2}}), "preStop") == 0
    assert hook_seconds(hooked("a", pre_stop={"exec": {"command": ["sleep", "9"]}}), "preStop") == 0
    assert hook_seconds(hooked("a", pre_stop={"httpGet": {"port": 80}}), "preStop") == 0
    assert hook_seconds(container("sleep", "1"), "preStop") == 0


def test_stopping_takes_the_longest_prestop_hook_cut_short_at_the_grace_period() -> None:
    running = [hooked("a", pre_stop={"sleep": {"seconds": 6}}), hooked("b", pre_stop={"sleep": {"seconds": 2}})]
    assert pre_stop_seconds(running, 30) == 6, "the hooks run at once, not one after the other"
    assert pre_stop_seconds(running, 4) == 4
    assert pre_stop_seconds(running, 0) == 0, "a forced deletion runs no hook"
    assert pre_stop_seconds([container("sleep", "9")], 30) == 0
    assert pre_stop_seconds([], 30) == 0


def test_the_grace_period_is_the_deletions_then_the_specs_then_30_s() -> None:
    spec: Obj = {"containers": []}
    assert grace_seconds({"metadata": {}, "spec": spec}) == 30
    assert grace_seconds({"metadata": {}, "spec": {**spec, "terminationGracePeriodSeconds": 5}}) == 5
    deleting = {"metadata": {"deletionGracePeriodSeconds": 0}, "spec": {**spec, "terminationGracePeriodSeconds": 5}}
    assert grace_seconds(deleting) == 0
