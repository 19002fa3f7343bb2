"""Scenario files and the report's arithmetic."""

import asyncio
from collections import Counter
from pathlib import Path
from typing import cast

import pytest

from testbed.kubeapi import KubeClient
from testbed.kubelet.commands import Ending, ending
from testbed.report.metrics import Scrape, fleet_increase, quantile
from testbed.scenarios import spec
from testbed.scenarios.runner import (
    Endpoints,
    Injected,
    PhaseResult,
    PodRecord,
    Runner,
    abandoned,
    claim_template,
    count_devices,
    job_manifest,
    pod_spec,
    runner_identity,
    running_together,
    stall_window,
)


def test_every_shipped_scenario_is_valid() -> None:
    assert {"smoke", "cl2-dra", "steady-churn"} <= set(spec.shipped())
    cl2 = spec.load("cl2-dra")
    assert cl2.cluster.nodes == 100 and cl2.cluster.kcm_qps == 75 and cl2.slo_p99_seconds == 5
    assert [p.name for p in cl2.phases] == ["fill", "churn"]
    assert cl2.phases[0].fraction == 0.9 and cl2.phases[1].completions == 10


def test_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(spec.ScenarioError, match=r"phases\[0\]\.qps: Input should be greater than 0"):
        spec.load("smoke", {"phases.0.qps": 0})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nphases:\n  - name: a\n    jobs: 1\n    fraction: 0.5\n")
    with pytest.raises(spec.ScenarioError, match=r"phases\[0\]: .*exactly one of jobs, fraction or remaining"):
        spec.load(str(bad))
    bad.write_text("name: x\nphases: [{name: a, jobs: 1, qsp: 3}]\n")
    with pytest.raises(spec.ScenarioError, match=r"phases\[0\]\.qsp: Extra inputs are not permitted"):
        spec.load(str(bad))
    with pytest.raises(spec.ScenarioError, match=r"shipped: .*cl2-dra"):
        spec.load("no-such-scenario")


def test_an_override_reaches_into_what_the_file_leaves_to_its_defaults(tmp_path: Path) -> None:
    """`--set phases.0.requests.0.deviceClass=...` on a phase written without requests
    changes its default request (it said "Input should be a valid list" before)."""
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\nphases: [{name: a, jobs: 2}]\n")
    scenario = spec.load(str(bare), {"phases.0.requests.0.deviceClass": "npu.example.com", "cluster.nodes": 2})
    [request] = scenario.phases[0].requests
    assert (request.name, request.device_class) == ("gpu", "npu.example.com")
    assert scenario.cluster.nodes == 2 and scenario.cluster.profile == "gpu8", "the rest of the defaults kept"
    with pytest.raises(spec.ScenarioError, match=r"'phases\.0\.requests\.2' needs an index up to 1"):
        spec.load(str(bare), {"phases.0.requests.2.deviceClass": "npu.example.com"})


def test_an_override_one_past_a_lists_end_adds_an_entry(tmp_path: Path) -> None:
    """A fault or a phase added from the command line, as a CI job adds one to a shipped
    scenario; the entry is validated whole, so one left half written names its field."""
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\nphases: [{name: a, jobs: 2}]\n")
    added = {"faults.0.action": "latency", "faults.0.atSeconds": 5, "faults.0.latencyMs": 200}
    scenario = spec.load(str(bare), {**added, "phases.1.name": "b", "phases.1.jobs": 3})
    [fault] = scenario.faults
    assert (fault.action, fault.at_seconds, fault.latency_ms, fault.nodes) == ("latency", 5, 200, "*")
    assert [(p.name, p.jobs) for p in scenario.phases] == [("a", 2), ("b", 3)]
    with pytest.raises(spec.ScenarioError, match=r"faults\[0\]\.atSeconds: Field required"):
        spec.load(str(bare), {"faults.0.action": "latency"})
    with pytest.raises(spec.ScenarioError, match=r"'faults\.1' needs an index up to 0 .*0 adds one"):
        spec.load(str(bare), {"faults.1.action": "latency"})


def test_a_phase_may_ask_for_its_devices_as_extended_resources() -> None:
    phase = spec.Phase.model_validate(
        {
            "name": "extended",
            "jobs": 1,
            "requestAs": "extended-resource",
            "requests": [
                {"name": "a", "deviceClass": "gpu.dra-testbed.io"},
                {"name": "b", "deviceClass": "gpu.dra-testbed.io"},
                {"name": "c", "deviceClass": "nic.dra-testbed.io"},
            ],
        }
    )
    pod = pod_spec(phase, ["sleep", "1"])
    assert "resourceClaims" not in pod
    assert pod["containers"][0]["resources"] == {
        "limits": {
            "deviceclass.resource.kubernetes.io/gpu.dra-testbed.io": "2",
            "deviceclass.resource.kubernetes.io/nic.dra-testbed.io": "1",
        }
    }
    with pytest.raises(
        spec.ScenarioError, match=r"phases\[2\]: .*no selector, capacity or constraint; use requestAs: claim"
    ):
        spec.load("smoke", {"phases.2.requestAs": "extended-resource"})  # its GPU and NIC share a PCIe root


def test_a_phase_may_ask_for_part_of_a_shareable_device_in_jobs_not_fractions() -> None:
    phase = spec.Phase.model_validate(
        {
            "name": "shares",
            "jobs": 6,
            "requests": [{"name": "nic", "deviceClass": "nic.dra-testbed.io", "capacity": {"bandwidth": "40G"}}],
        }
    )
    [nic] = claim_template(phase)["spec"]["spec"]["devices"]["requests"]
    assert nic == {
        "name": "nic",
        "exactly": {"deviceClassName": "nic.dra-testbed.io", "capacity": {"requests": {"bandwidth": "40G"}}},
    }
    with pytest.raises(spec.ScenarioError, match=r"phases\[0\]\.requests\[0\]\.capacity: .*bandwidth: 'fast' is not a"):
        spec.load("steady-churn", {"phases.0.requests.0.capacity": {"bandwidth": "fast"}})
    with pytest.raises(
        spec.ScenarioError, match=r"phases\[0\]: .*a fraction of the devices says nothing .*; give jobs"
    ):
        spec.load("cl2-dra", {"phases.0.requests.0.capacity": {"memory": "1Gi"}})


def test_a_phase_whose_pods_fail_makes_each_job_try_backoff_limit_plus_one_pods() -> None:
    phase = spec.Phase.model_validate(
        {"name": "flaky", "jobs": 3, "runSeconds": 2, "exitCode": 3, "backoffLimit": 2, "wait": "complete"}
    )
    job = job_manifest("flaky-0", phase, "run1")
    assert job["spec"]["backoffLimit"] == 2
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert ending(container) == Ending(2.0, 3), "a kubelet reads the command as the phase means it"
    assert phase.pods_per_job == 3, "every try fails: the Job makes backoffLimit + 1 pods"
    assert phase.retry_back_off_s == 20.0, "the Job controller waits 10 s, then 20 s"
    assert stall_window(30.0, [], phase.retry_back_off_s) == 50.0, "no pod waits during the back-off"
    passing = spec.Phase.model_validate(
        {"name": "ok", "jobs": 3, "runSeconds": 2, "completions": 4, "wait": "complete"}
    )
    assert ending(job_manifest("ok-0", passing, "run1")["spec"]["template"]["spec"]["containers"][0]) == Ending(2.0, 0)
    assert passing.pods_per_job == 4 and passing.retry_back_off_s == 0.0
    assert stall_window(30.0, [PodRecord("ok", 1.0, bound=1.5)]) == 100.0, "bound pods: a kubelet's retry"


def test_a_failing_phase_needs_a_run_time_and_one_pod_per_job_at_a_time() -> None:
    with pytest.raises(spec.ScenarioError, match=r"phases\[1\]: .*exitCode needs runSeconds"):
        spec.load("cl2-dra", {"phases.1.exitCode": 1, "phases.1.runSeconds": None})
    with pytest.raises(spec.ScenarioError, match=r"phases\[0\]: .*set parallelism: 1"):
        spec.load("steady-churn", {"phases.0.exitCode": 1, "phases.0.parallelism": 2})
    with pytest.raises(spec.ScenarioError, match=r"phases\[0\]\.exitCode: Input should be less than or equal to 255"):
        spec.load("steady-churn", {"phases.0.exitCode": 256})


def test_overrides_reach_nested_fields() -> None:
    scenario = spec.load("cl2-dra", {"cluster.nodes": 8, "phases.1.runSeconds": 1})
    assert scenario.cluster.nodes == 8 and scenario.phases[1].run_seconds == 1


def test_devices_are_counted_by_class_and_taints_excluded() -> None:
    def device(name: str, kind: str, tainted: bool = False) -> dict:  # type: ignore[type-arg]
        entry = {"name": name, "attributes": {"type": {"string": kind}}}
        return {**entry, "taints": [{"key": "k", "effect": "NoSchedule"}]} if tainted else entry

    slices = [
        {
            "spec": {
                "driver": "gpu.dra-testbed.io",
                "devices": [device("g0", "gpu"), device("g1", "gpu", True), device("p0", "partition")],
            }
        },
        {"spec": {"driver": "nic.dra-testbed.io", "devices": [device("n0", "nic")]}},
        {"spec": {"driver": "gpu.dra-testbed.io", "sharedCounters": [{"name": "c"}]}},
    ]
    assert count_devices(slices, "gpu.dra-testbed.io") == 1
    assert count_devices(slices, "gpu-partition.dra-testbed.io") == 1
    assert count_devices(slices, "nic.dra-testbed.io") == 1
    assert count_devices(slices, "somebody-elses.example.com") == 0


def test_quantile_of_a_histogram_increase() -> None:
    before = Scrape.parse('h_bucket{le="0.1"} 5\nh_bucket{le="1"} 5\nh_bucket{le="+Inf"} 5\n')
    after = Scrape.parse('h_bucket{le="0.1"} 55\nh_bucket{le="1"} 105\nh_bucket{le="+Inf"} 105\n')
    # 100 new observations: 50 in (0, 0.1], 50 in (0.1, 1]
    assert quantile(0.5, before.buckets("h", {}), after.buckets("h", {})) == pytest.approx(0.1)
    assert quantile(0.99, before.buckets("h", {}), after.buckets("h", {})) == pytest.approx(0.982)
    assert quantile(0.99, after.buckets("h", {}), after.buckets("h", {})) is None  # nothing new


def _host(started: float, **samples: float) -> Scrape:
    lines = [f"process_start_time_seconds {started}", *(f"{name} {value}" for name, value in samples.items())]
    return Scrape.parse("\n".join(lines) + "\n")


def test_a_fleets_figures_are_what_each_host_counted_during_the_run() -> None:
    before = [_host(100, ops_total=2, prepared_claims=4), _host(200, ops_total=10, prepared_claims=1)]
    after = [_host(100, ops_total=5, prepared_claims=0), _host(200, ops_total=11, prepared_claims=2)]
    total, partial = fleet_increase(before, after)
    assert total.value("ops_total", {}) == 4, "counters: increases, summed"
    assert total.value("prepared_claims", {}) == 2, "gauges: as they are at the end"
    assert partial == ""


def test_a_host_that_restarted_counts_from_zero_and_the_figures_say_partial() -> None:
    before = [_host(100, ops_total=50), _host(200, ops_total=10)]
    after = [_host(999, ops_total=3), _host(200, ops_total=11)]  # host 0 restarted: counters reset
    total, partial = fleet_increase(before, after)
    assert total.value("ops_total", {}) == 4, "no negative increase from the reset"
    assert "NodeHost 0 restarted during the run" in partial


def test_a_host_that_cannot_be_scraped_is_named() -> None:
    total, partial = fleet_increase([_host(1, ops_total=1)], [Scrape(failed="http://127.0.0.1:9/metrics: refused")])
    assert total.value("ops_total", {}) == 0 and "NodeHost 0 not scraped (http://127.0.0.1:9" in partial


def test_a_fault_needs_what_its_action_acts_on() -> None:
    from testbed.scenarios.spec import Fault

    assert Fault.model_validate({"atSeconds": 3, "action": "fail-prepare", "count": 2}).target == "2"
    assert Fault.model_validate({"atSeconds": 3, "action": "latency", "latencyMs": 2.5}).target == "2.5"
    assert Fault.model_validate({"atSeconds": 3, "action": "hang-attach", "count": 1}).target == "1"
    assert Fault.model_validate({"atSeconds": 3, "action": "restart-kubelet"}).target == "", "it needs nothing"
    for broken, needs in (
        ({"action": "unhealthy"}, "needs device"),
        ({"action": "fail-prepare"}, "needs count"),
        ({"action": "fail-attach", "device": "gpu-0"}, "needs count"),
        ({"action": "latency", "device": "gpu-0"}, "needs latencyMs"),
        ({"action": "rollout"}, "needs driver"),
        ({"action": "rollout", "driver": "a.example.com", "nodes": "n-00*"}, "covers every node"),
        ({"action": "rollout", "driver": "a.example.com", "maxSurge": 1, "maxUnavailable": 1}, "not both"),
        ({"action": "rollout", "driver": "a.example.com", "maxSurge": 0}, "greater than or equal to 1"),
        ({"action": "healthy", "device": "gpu-0", "fatal": True}, "fatal is for action unhealthy"),
        ({"action": "taint-rule"}, "needs device"),
        ({"action": "unhealthy", "device": "gpu-0", "effect": "NoExecute"}, "effect is for action taint-rule"),
        ({"action": "taint-rule", "device": "gpu-0", "effect": "PreferNoSchedule"}, "NoSchedule' or 'NoExecute"),
    ):
        with pytest.raises(ValueError, match=needs):
            Fault.model_validate({"atSeconds": 0, **broken})


def test_a_rollout_fault_surges_one_node_at_a_time_unless_told_otherwise() -> None:
    from testbed.scenarios.spec import Fault

    def batch(**given: int) -> tuple[int, int]:
        return Fault.model_validate({"atSeconds": 0, "action": "rollout", "driver": "a", **given}).rollout_batch

    assert (batch(), batch(maxSurge=3), batch(maxUnavailable=2)) == ((1, 0), (3, 0), (0, 2))


def test_a_run_undoes_the_faults_it_left_in_force_and_no_other() -> None:
    """Each fault still in force as the run ends gets its opposite, on the same nodes; one
    a later fault undid already, a lost device, a rollout and a kubelet's restart get none; a taint-rule's
    DeviceTaintRules are the runner's to delete."""

    def fault(at: float, action: str, nodes: str = "n-*", **more: object) -> spec.Fault:
        return spec.Fault.model_validate({"atSeconds": at, "action": action, "nodes": nodes, **more})

    injected = [
        fault(0, "unhealthy", device="gpu-0", fatal=True, message="XID 79"),
        fault(1, "unhealthy", device="gpu-1"),
        fault(2, "healthy", device="gpu-1"),
        fault(2, "unhealthy", "n-000", device="gpu-1"),
        fault(3, "latency", latencyMs=250),
        fault(4, "fail-prepare", count=2),
        fault(5, "fail-prepare", count=0),
        fault(5, "hang-attach", count=1),
        fault(6, "lost", device="nic-0"),
        fault(7, "rollout", "*", driver="gpu.example.com"),
        fault(8, "taint-rule", device="gpu-2"),
        fault(9, "restart-kubelet"),
    ]
    undo = spec.faults_to_undo(injected)
    assert [(f.action, f.target, f.nodes, f.fatal, f.message) for f in undo] == [
        ("healthy", "gpu-0", "n-*", False, ""),
        ("healthy", "gpu-1", "n-000", False, ""),
        ("latency", "0", "n-*", False, ""),
        ("hang-attach", "0", "n-*", False, ""),
    ]
    assert spec.faults_to_undo(undo) == [], "nothing left to undo once undone"


def test_a_class_no_device_serves_is_named_with_the_phases_asking_and_the_profiles_that_have_it() -> None:
    from testbed.scenarios.runner import profiles_with, unserved, unserved_error

    smoke = spec.load("smoke")
    gpu8 = {"gpu.dra-testbed.io": 32, "gpu-partition.dra-testbed.io": 0, "nic.dra-testbed.io": 0}
    missing = unserved(smoke, gpu8)
    assert missing == {"gpu-partition.dra-testbed.io": ["partitions"], "nic.dra-testbed.io": ["aligned"]}
    assert not unserved(smoke, {**gpu8, "gpu-partition.dra-testbed.io": 4, "nic.dra-testbed.io": 1})
    # A phase of no Jobs asks for nothing; another driver's class is not the testbed's to judge.
    assert not unserved(spec.load("smoke", {"phases.1.jobs": 0, "phases.2.jobs": 0}), gpu8)
    elsewhere = spec.load("smoke", {"phases.1.requests.0.deviceClass": "gpu.example.com"})
    assert unserved(elsewhere, gpu8) == {"nic.dra-testbed.io": ["aligned"]}

    assert "tiny" in profiles_with(list(missing)) and "gpu8" not in profiles_with(list(missing))
    error = unserved_error(smoke, missing, Counter({"gpu8": 4}))
    assert "phase partitions" in error.message and "phase aligned" in error.message and "4 x gpu8" in error.message
    assert "--profile tiny" in error.hint and "testbed run smoke --up" in error.hint
    # The scenario's own profile lacks them too: no point suggesting its own cluster.
    fpga = spec.load("smoke", {"phases.1.requests.0.deviceClass": "fpga.dra-testbed.io"})
    hint = unserved_error(fpga, unserved(fpga, gpu8), Counter({"gpu8": 4})).hint
    assert "--profile tiny" not in hint and "--up" not in hint


def test_a_class_the_cluster_does_not_have_is_refused_with_the_phases_asking() -> None:
    """Its pods could never be scheduled: the run would wait out its stall and fail."""
    from testbed.scenarios.runner import absent_classes_error

    shipped = {"gpu.dra-testbed.io", "gpu-partition.dra-testbed.io", "nic.dra-testbed.io"}
    assert absent_classes_error(spec.load("smoke"), shipped) is None
    mistyped = spec.load("smoke", {"phases.1.requests.0.deviceClass": "gpu.exmaple.com", "phases.2.jobs": 0})
    error = absent_classes_error(mistyped, shipped)
    assert error is not None
    assert (
        error.message
        == "scenario smoke asks for DeviceClass gpu.exmaple.com (phase partitions), which this cluster does not have"
    )
    assert "its DeviceClasses: gpu-partition.dra-testbed.io, gpu.dra-testbed.io, nic.dra-testbed.io" in (
        error.hint or ""
    )
    # A phase of no Jobs asks for nothing.
    assert (
        absent_classes_error(
            spec.load("smoke", {"phases.1.requests.0.deviceClass": "x.y", "phases.1.jobs": 0}), shipped
        )
        is None
    )


def test_a_phase_can_send_its_pods_to_the_real_kubelet_nodes_only() -> None:
    """For a reference run of a driver: the scheduler would otherwise put pods on the fake
    nodes, which hold the workload image once it was pulled there (ImageLocality)."""
    from testbed.fleet.synthetic_node import SyntheticNode
    from testbed.keys import KUBELET_LABEL

    phase = spec.Phase.model_validate({"name": "ref", "jobs": 4, "nodeSelector": {KUBELET_LABEL: "real"}})
    assert pod_spec(phase, ["sleep", "1"])["nodeSelector"] == {"dra-testbed.io/kubelet": "real"}
    assert "nodeSelector" not in pod_spec(spec.Phase.model_validate({"name": "any", "jobs": 4}), ["sleep", "1"])
    real = SyntheticNode.node_spec("real-000", "tiny", {"team": "a"}, None, kubelet="real")
    fake = SyntheticNode.node_spec("node-000", "tiny", None, None)
    assert (real.labels[KUBELET_LABEL], fake.labels[KUBELET_LABEL], real.labels["team"]) == ("real", "fake", "a")


def test_a_run_is_abandoned_once_its_process_on_this_machine_is_gone() -> None:
    """Only then is its namespace deleted by the next run (a live run's, or another
    machine's, is left alone)."""
    import subprocess

    ended = subprocess.Popen(["true"])
    ended.wait()
    me = runner_identity()
    assert not abandoned(me)
    assert abandoned({**me, "pid": ended.pid})
    assert abandoned({**me, "start_ticks": int(str(me["start_ticks"])) + 1}), "its pid, since reused"
    assert not abandoned({**me, "pid": ended.pid, "host": "elsewhere"})
    assert not abandoned({"host": me["host"], "pid": "x"}), "an annotation it cannot read"


def test_a_fault_after_a_phase_names_one_and_phases_have_names_of_their_own(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nphases: [{name: a, jobs: 1}]\nfaults: [{afterRunning: b, atSeconds: 0, action: restart-kubelet}]\n"
    )
    with pytest.raises(spec.ScenarioError, match=r"faults\[0\]\.afterRunning: no phase is named 'b'; name one of a"):
        spec.load(str(bad))
    bad.write_text("name: x\nphases: [{name: a, jobs: 1}, {name: a, jobs: 2}]\n")
    with pytest.raises(spec.ScenarioError, match=r"more than one phase is named a; give each its own name"):
        spec.load(str(bad))


def test_a_fault_after_a_phase_comes_once_its_pods_all_run_or_is_reported_left_out() -> None:
    """However late the pods start, the fault meets them running; one whose phase ended
    before its pods ran together is not injected, and the report says why."""
    scenario = spec.Scenario.model_validate(
        {
            "name": "anchored",
            "phases": [{"name": "gpus", "jobs": 2, "parallelism": 2}, {"name": "later", "jobs": 1}],
            "faults": [
                {"afterRunning": "gpus", "atSeconds": 0, "nodes": "n-*", "action": "restart-kubelet"},
                {"afterRunning": "later", "atSeconds": 0, "nodes": "n-*", "action": "restart-kubelet"},
            ],
        }
    )
    injected: list[int] = []

    async def injector(fault: spec.Fault) -> Injected:
        injected.append(running_together([p for p in run.data.pods.values() if p.phase == "gpus"]))
        return Injected(["n-000"])

    async def turns() -> None:
        """Let every task that can go on do so (no time passes)."""
        for _ in range(50):
            await asyncio.sleep(0)

    async def play() -> None:
        faults = asyncio.create_task(run._inject_faults())
        run.data.phases.append(PhaseResult("gpus", 2, 4, 0.0))
        for i in range(4):
            run.data.pods[f"gpu-{i}"] = PodRecord("gpus", 0.0, running=1.0)
            run._note_change()
            await turns()  # the watch's next event comes later
            assert injected == ([4] if i == 3 else []), f"{i + 1} of 4 pods running"
        later = PhaseResult("later", 1, 1, 1.0)
        run.data.phases.append(later)
        run.data.pods["late"] = PodRecord("later", 1.0, running=2.0, finished=2.0)
        later.ended = 3.0
        run._note_change()
        await asyncio.wait_for(faults, 5)

    run = Runner(cast(KubeClient, None), scenario, Endpoints("", ""), injector=injector)
    asyncio.run(play())
    assert injected == [4]
    [gpus, later] = sorted(run.data.faults, key=lambda f: f["after_running"])
    assert (gpus["nodes"], gpus["error"]) == (["n-000"], "")
    assert later["error"] == "not injected: phase later ended before its pods all ran at once"
