"""Scenarios run on the session's fleet, and the reports they write."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from kubernetes import client as k8s

from testbed import environment
from testbed.config import nodes_dir
from testbed.controlplane.cluster import ClusterState
from testbed.errors import TestbedError
from testbed.fleet.fleet import Fleet
from testbed.kubeapi import KubeClient
from testbed.report import report as reporting
from testbed.scenarios import runner, spec
from testbed.testing import wait_for

pytestmark = pytest.mark.controlplane


def _run(control_plane: ClusterState, fleet: Fleet, scenario: spec.Scenario, faults: bool = False) -> runner.RunData:
    """``faults``: the scenario's faults reach the fleet, as `testbed run` injects them."""
    endpoints = runner.Endpoints.local(control_plane.ports, fleet.metrics_texts)
    inject = environment.fault_injector(fleet) if faults else None

    async def go() -> runner.RunData:
        client = KubeClient.from_kubeconfig(control_plane.kubeconfig)
        try:
            return await runner.Runner(client, scenario, endpoints, injector=inject).run()
        finally:
            await client.close()

    return asyncio.run(go())


def test_smoke_passes_and_writes_a_complete_report(control_plane: ClusterState, fleet: Fleet, tmp_path: Path) -> None:
    data = _run(control_plane, fleet, spec.load("smoke"))
    leaks = runner.nodes_dir_leaks(nodes_dir(control_plane.root))
    # The NodeHosts, each reading its own nodes, say the same (as they must where the
    # nodes are on other machines).
    asked = fleet.leaks(data.namespace, set(data.claims))
    assert asked == {"checkpoint_entries": 0, "cdi_specs": 0, "unchecked": []}
    assert fleet.leaks() == {**leaks, "unchecked": []}
    report = reporting.build(data, leaks, {"nodes": 2})
    directory = reporting.write(report, data, tmp_path / "report")
    assert report["verdict"] == "PASS", report["phases"]
    assert [p["pods_running"] for p in report["phases"]] == [2, 2, 1, 2]
    assert all(p["pod_startup_s"]["p99"] < 5 for p in report["phases"])
    # Claim, scheduling, prepare: not a sub-millisecond affair (a stalled watch made every
    # pod look one). A busy machine may now and then hold one pod's events back until all
    # arrive together, so the run's median is what shows a stall, not each phase's.
    startups = sorted(p.running - p.added for p in data.pods.values() if p.running is not None)
    assert startups[len(startups) // 2] > 0.005, (startups, data.loop_holds)
    assert all(p["pods_seen_late"] == 0 for p in report["phases"]), "the watch never lost its connection"
    assert report["claim_allocation_s"]["count"] == 7, "the scheduler's claims for extended resources too"
    assert report["leaks"] == {"checkpoint_entries": 0, "cdi_specs": 0, "claims_prepared_at_end": 0, "ok": True}
    metrics = report["metrics"]
    assert metrics["kcm_resource_claim"]["adds_total"] >= 5
    assert metrics["scheduler"]["pod_scheduling_sli_duration_p99_s"] is not None
    assert (
        metrics["kubelet"]["prepare_p99_s"] is not None and metrics["plugin"]["NodePrepareResources_p99_s"] is not None
    )
    assert json.loads((directory / "report.json").read_text())["scenario"] == "smoke"
    assert "| gpus | 2 |" in (directory / "report.md").read_text()
    # Where each phase's time went, from what the components themselves counted.
    for phase in report["phases"]:
        figures = phase["breakdown"]
        assert figures["partial"] == "", figures["partial"]
        assert all(figures["cpu_seconds"][c] is not None for c in ("kube-apiserver", "etcd", "kube-scheduler"))
        assert figures["cpu_seconds"]["kube-apiserver"] > 0 and figures["machine"]["busy"] > 0
        assert figures["scheduler"]["attempts"]["scheduled"] >= phase["jobs"]
        assert figures["scheduler"]["extension_points"], "the scheduler's framework time by extension point"
        calls = {(row["resource"], row["verb"]) for row in figures["apiserver"]}
        assert ("resourceclaims", "POST") in calls and ("pods", "POST") in calls, calls
        assert phase["bottleneck"]["kind"] and "pod startup p99" in phase["bottleneck"]["text"]
    assert "### gpus: " in (directory / "report.md").read_text()
    for plot in ("latency_cdf.png", "timeline.png", "time_spent.png"):
        assert (directory / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_asking_for_more_devices_than_exist_reports_unschedulable_pods(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    greedy = spec.Scenario.model_validate(
        {"name": "greedy", "phases": [{"name": "too-many", "jobs": 7, "qps": 50, "stallSeconds": 5}]}
    )
    data = _run(control_plane, fleet, greedy)  # the fleet has 2 nodes x 2 GPUs
    [phase] = reporting.build(data, {"checkpoint_entries": 0, "cdi_specs": 0}, {})["phases"]
    assert phase["pods_running"] <= 4 and phase["unschedulable"] >= 3 and phase["stalled"]
    assert phase["pods_running"] + phase["unschedulable"] == 7
    assert not phase["slo_met"]
    assert data.ended < 60, "it reports; it does not hang"


def test_a_phase_no_published_device_can_serve_fails_the_run_before_it_creates_anything(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    fpga = {"name": "fpga", "jobs": 1, "requests": [{"name": "f", "deviceClass": "fpga.dra-testbed.io"}]}
    scenario = spec.Scenario.model_validate({"name": "wants-fpga", "phases": [{"name": "gpu", "jobs": 1}, fpga]})
    with pytest.raises(TestbedError) as caught:
        _run(control_plane, fleet, scenario)  # tiny nodes: GPUs and NICs, no FPGA
    assert "fpga.dra-testbed.io devices (phase fpga)" in caught.value.message, caught.value.message
    assert "--profile fpga4" in str(caught.value.hint)
    namespaces = k8s.CoreV1Api(kube_api).list_namespace().items
    assert not [n for n in namespaces if n.metadata.name.startswith("run-wants-fpga-")], "nothing was created"


def test_a_scenarios_faults_reach_the_fleet_at_their_time_and_the_report(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    scenario = spec.Scenario.model_validate(
        {
            "name": "faulty",
            "phases": [{"name": "one", "jobs": 1, "runSeconds": 2, "wait": "complete"}],
            "faults": [
                {"atSeconds": 0, "nodes": "tb-00*", "action": "latency", "latencyMs": 1},
                {"atSeconds": 0.5, "nodes": "tb-00*", "action": "latency", "latencyMs": 0},
                {"atSeconds": 0.5, "nodes": "tb-001", "action": "healthy", "device": "gpu-0"},
                {"atSeconds": 0.6, "nodes": "tb-000", "action": "lost", "device": "no-such-device"},
                {"atSeconds": 0.6, "nodes": "elsewhere-*", "action": "fail-prepare", "count": 1},
            ],
        }
    )

    data = _run(control_plane, fleet, scenario, faults=True)
    report = reporting.build(data, {"checkpoint_entries": 0, "cdi_specs": 0}, {})
    faults = report["faults"]
    assert [(f["action"], f["target"]) for f in faults] == [
        ("latency", "1"),
        ("latency", "0"),
        ("healthy", "gpu-0"),
        ("lost", "no-such-device"),
        ("fail-prepare", "1"),
    ]
    assert faults[0]["nodes"] == ["tb-000", "tb-001"] and faults[0]["error"] == ""
    assert faults[1]["at_s"] >= 0.5
    assert "no device 'no-such-device'" in faults[3]["error"]
    assert faults[4]["error"] == "no node matches 'elsewhere-*'"
    assert report["phases"][0]["pods_succeeded"] == 1, "the run went on"


def test_a_fault_on_a_node_the_fleet_lacks_is_refused_naming_the_nodes_it_has(fleet: Fleet) -> None:
    """`testbed fault` with a mistyped node: one line, and the nodes to pick from."""
    with pytest.raises(TestbedError) as caught:
        asyncio.run(fleet.apply_fault("tb-999", "restart-kubelet", ""))
    assert caught.value.message == "no synthetic node 'tb-999' in this fleet"
    assert caught.value.hint.startswith("its nodes: tb-000, tb-001"), caught.value.hint


def _kubelet_restarts(fleet: Fleet) -> int:
    return sum(host["kubelet_restarts"] for host in fleet.describe().values())


def _slice_uids(kube_api: k8s.ApiClient, node: str) -> set[str]:
    slices = k8s.ResourceV1Api(kube_api).list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return {s.metadata.uid for s in slices}


def test_kubelets_restarted_mid_run_leave_their_pods_running_and_the_drivers_publish_again(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """`restart-kubelet` on both nodes while the phase's GPU pods run: the new kubelets
    delete the nodes' slices as they start, the drivers publish them again, and the pods
    run on to their end, none failed nor started twice."""
    before = {node: _slice_uids(kube_api, node) for node in ("tb-000", "tb-001")}
    restarts_before = _kubelet_restarts(fleet)
    scenario = spec.Scenario.model_validate(
        {
            "name": "kubelet-restart",
            "phases": [{"name": "long", "jobs": 2, "runSeconds": 5, "wait": "complete"}],
            "faults": [{"afterRunning": "long", "atSeconds": 1, "nodes": "tb-00*", "action": "restart-kubelet"}],
        }
    )
    data = _run(control_plane, fleet, scenario, faults=True)
    report = reporting.build(data, {"checkpoint_entries": 0, "cdi_specs": 0}, {})
    (restart,) = report["faults"]
    assert (restart["action"], restart["nodes"], restart["error"]) == ("restart-kubelet", ["tb-000", "tb-001"], "")
    (phase,) = report["phases"]
    assert phase["pods_succeeded"] == phase["pods_running"] == phase["pods_expected"] == 2, phase
    assert report["faults_undone"] == [], "a restart leaves nothing to undo"
    assert _kubelet_restarts(fleet) == restarts_before + 2, "`testbed status` counts each kubelet restarted"

    def published_again() -> bool:
        now = {node: _slice_uids(kube_api, node) for node in before}
        return all(now[node] and now[node].isdisjoint(before[node]) for node in before)

    wait_for(published_again, 60, "each node's slices deleted by its new kubelet and published again")


def test_a_scenarios_device_taint_rules_keep_new_claims_off_the_devices_and_go_with_the_run(
    control_plane: ClusterState, fleet: Fleet, kube_api: k8s.ApiClient
) -> None:
    """`taint-rule` faults: an admin's DeviceTaintRules take both GPUs of tb-000 out of
    service, so the pods that come after wait for tb-001's; the run deletes its rules as it ends."""
    scenario = spec.Scenario.model_validate(
        {
            "name": "drained",
            "phases": [
                {"name": "before", "jobs": 1, "runSeconds": 1, "wait": "complete"},
                {"name": "after", "jobs": 4, "qps": 20, "runSeconds": 1, "wait": "complete"},
            ],
            "faults": [
                {"atSeconds": 0.2, "nodes": "tb-000", "action": "taint-rule", "device": gpu, "effect": "NoSchedule"}
                for gpu in ("gpu-0", "gpu-1")
            ],
        }
    )
    data = _run(control_plane, fleet, scenario)  # no fleet needed: the rules are the API's
    assert [(f["nodes"], f["outcome"], f["error"]) for f in data.faults] == [
        (["tb-000"], "1 DeviceTaintRule(s), NoSchedule", "")
    ] * 2
    # Four pods at once for the four GPUs: the two of tb-001 took them two by two.
    after = [pod.node for pod in data.pods.values() if pod.phase == "after"]
    assert after == ["tb-001"] * 4, data.pods
    assert [(f["action"], f["target"], f["nodes"], f["error"]) for f in data.faults_undone] == [
        ("deleted taint-rule", "gpu-0", ["tb-000"], ""),
        ("deleted taint-rule", "gpu-1", ["tb-000"], ""),
    ]
    rules = k8s.ResourceV1Api(kube_api).list_device_taint_rule(label_selector="dra-testbed.io/run").items
    assert rules == [], "the run took its rules with it"


def test_a_phase_whose_pods_fail_has_its_jobs_try_again_each_pod_with_a_claim_of_its_own(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    """Pods that exit non-zero fail (the kubelet's word), their claims are unprepared and
    released, and the Job controller makes their successors after its back-off, each
    with a new claim: the report counts the failures and leaves nothing on the nodes."""
    scenario = spec.Scenario.model_validate(
        {
            "name": "flaky",
            "phases": [
                {"name": "fails", "jobs": 2, "qps": 20, "runSeconds": 0.5, "exitCode": 3, "backoffLimit": 1}
                | {"wait": "complete"}
            ],
        }
    )
    data = _run(control_plane, fleet, scenario)
    leaks = runner.nodes_dir_leaks(nodes_dir(control_plane.root), data.namespace, set(data.claims))
    report = reporting.build(data, leaks, {})
    [phase] = report["phases"]
    assert (phase["pods_expected"], phase["pods_running"]) == (4, 4), phase
    assert (phase["pods_failed"], phase["pods_succeeded"], phase["stalled"]) == (4, 0, False), phase
    allocated = [uid for uid, (_, at) in data.claims.items() if at is not None]
    assert len(allocated) == 4 and report["claim_allocation_s"]["count"] == 4, "each try had a claim of its own"
    assert report["leaks"]["ok"], report["leaks"]
    assert report["verdict"] == "PASS", report
    assert "4 failed" in reporting.phase_line(phase)


def test_a_device_that_dies_mid_run_evicts_its_pod_and_the_phase_waits_for_its_successor(
    control_plane: ClusterState, fleet: Fleet
) -> None:
    """A scenario's fatal fault on every GPU 0 once its one-GPU Jobs' pods all run (however
    late a loaded machine starts them): the pods on them are evicted (their claims
    unprepared), counted as evicted, and their Jobs' successors run on the other GPUs; the
    phase ends once every Job has completed, not at the first count of finished pods. The
    run ends by making the GPUs healthy again, so that the next run finds the fleet as
    this one did."""
    scenario = spec.Scenario.model_validate(
        {
            "name": "dying",
            "phases": [{"name": "gpus", "jobs": 4, "qps": 20, "runSeconds": 4, "backoffLimit": 1, "wait": "complete"}],
            "faults": [
                {
                    **{"afterRunning": "gpus", "atSeconds": 0.5, "nodes": "tb-00*"},
                    **{"action": "unhealthy", "device": "gpu-0", "fatal": True},
                }
            ],
        }
    )
    data = _run(control_plane, fleet, scenario, faults=True)
    assert data.faults_undone == [
        {"action": "healthy", "target": "gpu-0", "nodes_pattern": "tb-00*", "nodes": ["tb-000", "tb-001"], "error": ""}
    ]
    assert not any(host.get("faults", "?") for host in fleet.describe().values()), "no fault left in force"
    leaks = runner.nodes_dir_leaks(nodes_dir(control_plane.root), data.namespace, set(data.claims))
    report = reporting.build(data, leaks, {})
    [phase] = report["phases"]
    # Two nodes of two GPUs: the 4 Jobs' first pods fill them, the two on gpu-0 are evicted.
    assert (phase["pods_failed"], phase["pods_evicted"]) == (2, 2), json.dumps([phase, report["faults"]])
    assert (phase["pods_succeeded"], phase["pods_running"], phase["stalled"]) == (4, 6, False), phase
    assert [(f.get("fatal"), f["after_running"]) for f in report["faults"]] == [(True, "gpus")]
    assert "s (gpus running) | unhealthy gpu-0 (fatal) | tb-000, tb-001 |" in reporting.markdown(report)
    assert report["leaks"]["ok"], report["leaks"]
    assert "2 failed (2 evicted)" in reporting.phase_line(phase)
    assert "Undone as the run ended, so the next run finds the fleet as this one did: healthy gpu-0 on tb-00*." in (
        reporting.markdown(report)
    )
