"""A report claims an SLO only for what it measured."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from testbed.report import report
from testbed.scenarios import runner, spec
from testbed.scenarios.runner import PhaseResult, PodRecord, RunData

LEAKS = {"checkpoint_entries": 0, "cdi_specs": 0}


def _run(expected: int, ran: int, interrupted: bool = False, startup_s: float = 0.5) -> dict[str, object]:
    scenario = spec.load("smoke")
    data = RunData(scenario, "ns", 0.0, 0.0, interrupted=interrupted, ended=10.0)
    phase = PhaseResult("fill", jobs=expected, pods_expected=expected, started=0.0, ended=10.0, pods_running=ran)
    phase.interrupted = interrupted
    data.phases.append(phase)
    for i in range(ran):
        data.pods[f"p{i}"] = PodRecord(phase="fill", added=1.0, running=1.0 + startup_s)
    return report.build(data, LEAKS, {})


def test_every_pod_ran_within_the_slo_passes() -> None:
    built = _run(expected=120, ran=120)
    assert built["phases"][0]["slo_met"] is True and built["verdict"] == "PASS"


def test_an_interrupted_phase_is_not_measured_and_never_passes() -> None:
    """Seen before: "0/120 pods ran" next to latency percentiles and "SLO met"."""
    built = _run(expected=120, ran=3, interrupted=True)
    phase = built["phases"][0]
    assert phase["slo_met"] is None and built["verdict"] == "INTERRUPTED"
    assert "not measured (3/120 pods ran)" in report.markdown(built)
    assert "SLO met" not in "\n".join(report.summary_lines(built))


def test_a_finished_phase_that_left_pods_behind_misses_the_slo() -> None:
    built = _run(expected=120, ran=100)
    assert built["phases"][0]["slo_met"] is False and built["verdict"] == "FAIL"


def test_slow_startups_miss_the_slo() -> None:
    built = _run(expected=10, ran=10, startup_s=60.0)
    assert built["phases"][0]["slo_met"] is False and built["verdict"] == "FAIL"


def test_pods_the_watch_first_saw_scheduled_are_counted_and_the_report_says_their_startup_is_understated() -> None:
    scenario = spec.load("smoke")
    data = RunData(scenario, "ns", 0.0, 0.0, ended=10.0)
    data.phases.append(PhaseResult("fill", jobs=2, pods_expected=2, started=0.0, ended=10.0, pods_running=2))
    data.pods["on-time"] = PodRecord(phase="fill", added=1.0, bound=1.1, running=1.4)
    data.pods["late"] = PodRecord(phase="fill", added=2.0, bound=2.0, running=2.001, seen_late=True)
    built = report.build(data, LEAKS, {})
    assert built["phases"][0]["pods_seen_late"] == 1
    assert "**Seen late:** 1 pod(s) were first seen already scheduled" in report.markdown(built)
    assert "Seen late" not in report.markdown(_run(expected=2, ran=2))


def test_a_run_whose_own_event_loop_was_held_says_its_startups_may_read_short() -> None:
    scenario = spec.load("smoke")
    # Held while "fill" ran, and longer between the phases (reading the components'
    # metrics), where no pod starts.
    data = RunData(scenario, "ns", 0.0, 0.0, ended=20.0, loop_holds=[(0.5, 0.2), (4.0, 0.35), (10.1, 0.6)])
    data.phases.append(PhaseResult("fill", jobs=1, pods_expected=1, started=1.0, ended=10.0, pods_running=1))
    data.phases.append(PhaseResult("rest", jobs=1, pods_expected=1, started=10.8, ended=20.0, pods_running=1))
    data.pods["p"] = PodRecord(phase="fill", added=4.1, running=4.102)
    data.pods["q"] = PodRecord(phase="rest", added=11.0, running=11.3)
    built = report.build(data, LEAKS, {})
    assert built["metrics"]["runner"]["event_loop_held_max_s"] == 0.6
    assert [p["runner_loop_held_max_s"] for p in built["phases"]] == [0.35, 0.0]
    assert "was held, at its longest, 350.0 ms in fill (a busy" in report.markdown(built)
    assert any("held, at its longest, 350.0 ms in fill;" in line for line in report.summary_lines(built))
    assert "**Measurement:**" not in report.markdown(_run(expected=2, ran=2))


def test_a_phase_that_does_not_wait_is_held_to_account_until_its_last_pod_ran() -> None:
    scenario = spec.load("smoke")
    data = RunData(scenario, "ns", 100.0, 100.0, ended=20.0, loop_holds=[(6.0, 0.4)])
    data.phases.append(PhaseResult("burst", jobs=1, pods_expected=1, started=1.0, ended=1.5, pods_running=1))
    data.phases.append(PhaseResult("after", jobs=1, pods_expected=1, started=6.5, ended=20.0, pods_running=1))
    data.pods["p"] = PodRecord(phase="burst", added=105.0, running=106.5)
    data.pods["q"] = PodRecord(phase="after", added=107.0, running=107.3)
    built = report.build(data, LEAKS, {})
    assert [p["runner_loop_held_max_s"] for p in built["phases"]] == [0.4, 0.0]


def test_pods_on_nodes_that_never_started_are_not_called_unschedulable() -> None:
    """The scheduler did its part for a bound pod: if it never ran, its kubelet did not
    start it (a prepare that met an API server restart waits for the kubelet's next
    sync), and the report says so rather than blaming capacity."""
    unbound = PodRecord(phase="fill", added=1.0)
    bound = PodRecord(phase="fill", added=1.0, bound=1.2)
    ran = PodRecord(phase="fill", added=1.0, bound=1.1, running=1.5)
    assert runner.never_ran([unbound, bound, ran]) == (1, 1)
    phase = PhaseResult("fill", jobs=3, pods_expected=3, started=0.0, ended=10.0, pods_running=1)
    phase.unschedulable, phase.not_started = runner.never_ran([unbound, bound, ran])
    data = RunData(spec.load("smoke"), "ns", 0.0, 0.0, ended=10.0)
    data.phases.append(phase)
    data.pods.update({"u": unbound, "b": bound, "r": ran})
    built = report.build(data, LEAKS, {})
    assert built["phases"][0]["pods_not_started"] == 1 and built["verdict"] == "FAIL"
    assert "1 unschedulable, 1 on a node but never started" in "\n".join(report.summary_lines(built))
    assert "| 1 (+1 on a node, never started) |" in report.markdown(built)


def test_a_phase_waiting_only_for_pods_on_nodes_gives_their_kubelets_a_sync_before_it_stalls() -> None:
    bound = PodRecord(phase="fill", added=1.0, bound=1.2)
    unbound = PodRecord(phase="fill", added=1.0)
    assert runner.stall_window(30.0, [bound]) == runner.KUBELET_RETRY_S > 90
    assert runner.stall_window(30.0, [bound, unbound]) == 30.0, "an unschedulable pod: no capacity, stop at 30 s"
    assert runner.stall_window(300.0, [bound]) == 300.0, "a longer window the scenario asked for stays"
    assert runner.stall_window(30.0, []) == 30.0


def test_the_leak_check_counts_only_what_the_run_created(tmp_path: Path) -> None:
    """A user's own pods on the fleet hold claims too: those are not the run's leaks."""
    ours, theirs, leaked = (str(uuid.uuid4()) for _ in range(3))
    plugin = tmp_path / "node-0" / "kubelet" / "plugins" / "gpu.dra-testbed.io"
    plugin.mkdir(parents=True)
    claims = {
        theirs: {"namespace": "team-a"},
        leaked: {"namespace": "run-ns"},
    }
    (plugin / "checkpoint.json").write_text(json.dumps({"claims": claims}))
    cdi = tmp_path / "node-0" / "cdi"
    cdi.mkdir()
    for uid in (ours, theirs, leaked):
        (cdi / f"gpu.dra-testbed.io-{uid}.json").write_text("{}")
    assert runner.nodes_dir_leaks(tmp_path, "run-ns", {ours}) == {"checkpoint_entries": 1, "cdi_specs": 2}
    assert runner.nodes_dir_leaks(tmp_path) == {"checkpoint_entries": 2, "cdi_specs": 3}


def test_nodes_that_could_not_be_checked_are_not_clean() -> None:
    from testbed.report import report as reporting
    from testbed.scenarios import runner, spec

    scenario = spec.Scenario.model_validate({"name": "s", "phases": [{"name": "p", "jobs": 0}]})
    data = runner.RunData(scenario, "ns", 0.0, 0.0)
    unchecked = {"checkpoint_entries": 0, "cdi_specs": 0, "unchecked": ["nodehost-x-1 (GetTimeoutError)"]}
    report = reporting.build(data, unchecked, {})
    assert report["leaks"]["ok"] is False and report["verdict"] != "PASS"
    assert "Not checked: nodehost-x-1 (GetTimeoutError)." in reporting.markdown(report)
    assert reporting.build(data, {"checkpoint_entries": 0, "cdi_specs": 0}, {})["leaks"]["ok"] is True


def test_pods_the_control_plane_evicted_are_told_apart_from_those_whose_command_failed() -> None:
    """A load test that injects a fatal device fault sees its Job pods fail: the report
    says how many of those were evicted (DisruptionTarget), not exits of their own."""
    evicted = {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByDeviceTaintManager"}]}
    assert runner.disrupted({"status": evicted}) == "DeletionByDeviceTaintManager"
    assert runner.disrupted({"status": {"conditions": [{"type": "DisruptionTarget", "status": "False"}]}}) == ""
    assert runner.disrupted({}) == ""
    phase = PhaseResult("fill", jobs=3, pods_expected=3, started=0.0, ended=10.0, pods_running=3)
    phase.pods_succeeded, phase.pods_failed, phase.pods_evicted = 1, 2, 1
    data = RunData(spec.load("smoke"), "ns", 0.0, 0.0, ended=10.0)
    data.phases.append(phase)
    built = report.build(data, LEAKS, {})
    assert ", 2 failed (1 evicted)," in "\n".join(report.summary_lines(built))
    assert "| 2 (1 evicted) | 0 |" in report.markdown(built)


def test_a_job_has_ended_once_complete_or_failed_not_while_it_may_still_make_pods() -> None:
    def job(*conditions: tuple[str, str]) -> dict[str, object]:
        return {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}

    assert runner.job_ended(job(("SuccessCriteriaMet", "True"), ("Complete", "True")))
    assert runner.job_ended(job(("FailureTarget", "True"), ("Failed", "True")))
    assert not runner.job_ended(job(("SuccessCriteriaMet", "True")))  # its pods still being stopped
    assert not runner.job_ended(job(("Suspended", "True"))) and not runner.job_ended({})
