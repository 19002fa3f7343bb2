"""Where a phase's time went, its bottleneck in words, JUnit XML and run comparison:
pure logic over scrapes and report dicts, no control plane."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import TestbedError
from testbed.report import bottleneck, breakdown, compare
from testbed.report import report as rendering
from testbed.report.junit import junit_xml
from testbed.report.metrics import Scrape

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0, float("inf"))


def _histogram(scrape: Scrape, name: str, labels: dict[str, str], observations: list[float]) -> None:
    """Add a histogram's cumulative series, as a component would expose them."""
    key = frozenset(labels.items())
    for le in BUCKETS:
        bucket = frozenset({**labels, "le": "+Inf" if le == float("inf") else str(le)}.items())
        scrape.samples.setdefault(f"{name}_bucket", {})[bucket] = float(sum(1 for o in observations if o <= le))
    scrape.samples.setdefault(f"{name}_count", {})[key] = float(len(observations))
    scrape.samples.setdefault(f"{name}_sum", {})[key] = float(sum(observations))


def _counter(scrape: Scrape, name: str, labels: dict[str, str], value: float) -> None:
    scrape.samples.setdefault(name, {})[frozenset(labels.items())] = value


def _process(cpu: float, started: float = 1000.0) -> Scrape:
    scrape = Scrape()
    _counter(scrape, "process_cpu_seconds_total", {}, cpu)
    _counter(scrape, "process_start_time_seconds", {}, started)
    return scrape


def _scheduler(cpu: float, filters: list[float], scheduled: float, prebinds: list[float]) -> Scrape:
    scrape = _process(cpu)
    _counter(scrape, "scheduler_schedule_attempts_total", {"result": "scheduled", "profile": "default"}, scheduled)
    _counter(scrape, "scheduler_schedule_attempts_total", {"result": "unschedulable", "profile": "default"}, 1)
    _histogram(
        scrape,
        "scheduler_plugin_execution_duration_seconds",
        {"plugin": "DynamicResources", "extension_point": "Filter", "status": "Success"},
        filters,
    )
    _histogram(
        scrape,
        "scheduler_plugin_execution_duration_seconds",
        {"plugin": "NodeAffinity", "extension_point": "Filter", "status": "Success"},
        [0.5] * len(filters),  # more time than DynamicResources: still listed after it
    )
    _histogram(
        scrape,
        "scheduler_framework_extension_point_duration_seconds",
        {"extension_point": "PreBind", "status": "Success", "profile": "default"},
        prebinds,
    )
    _histogram(
        scrape,
        "scheduler_framework_extension_point_duration_seconds",
        {"extension_point": "Bind", "status": "Success", "profile": "default"},
        [0.002] * len(prebinds),
    )
    return scrape


def _apiserver(cpu: float, claim_creates: list[float], config_maps: list[float]) -> Scrape:
    scrape = _process(cpu)
    name = "apiserver_request_duration_seconds"
    labels = {"group": "resource.k8s.io", "version": "v1", "scope": "resource", "component": "apiserver"}
    _histogram(scrape, name, {**labels, "resource": "resourceclaims", "subresource": "", "verb": "POST"}, claim_creates)
    _histogram(scrape, name, {**labels, "resource": "configmaps", "subresource": "", "verb": "GET"}, config_maps)
    return scrape


def _snapshot(t: float, machine: tuple[float, float], **parts: Any) -> breakdown.Snapshot:
    components = {
        "kube-apiserver": parts["apiserver"],
        "etcd": parts.get("etcd", _process(1.0)),
        "kube-controller-manager": _process(parts.get("kcm", 2.0)),
        "kube-scheduler": parts["scheduler"],
    }
    return breakdown.Snapshot(t, components, [_process(parts.get("host", 5.0))], machine, cores=2)


def _phase_figures() -> dict[str, Any]:
    start = _snapshot(10.0, (100.0, 400.0), apiserver=_apiserver(3.0, [], []), scheduler=_scheduler(1.0, [], 0, []))
    end = _snapshot(
        40.0,
        (580.0, 1000.0),
        apiserver=_apiserver(33.0, [0.005] * 50, [0.2] * 9),
        scheduler=_scheduler(21.0, [0.04] * 100, 50, [0.02] * 50),
        kcm=6.0,
        host=8.5,
    )
    return breakdown.phase(start, end)


def test_a_phase_breakdown_is_what_each_component_did_between_its_snapshots() -> None:
    figures = _phase_figures()
    assert figures["seconds"] == 30.0
    assert figures["cpu_seconds"] == {
        "kube-apiserver": 30.0,
        "etcd": 0.0,
        "kube-controller-manager": 4.0,
        "kube-scheduler": 20.0,
        "nodehosts": 3.5,
    }
    assert figures["machine"] == {"busy": 0.8, "cores": 2}  # 480 of 600 ticks busy
    scheduler = figures["scheduler"]
    assert scheduler["attempts"] == {"scheduled": 50, "unschedulable": 0, "error": 0}
    assert [p["extension_point"] for p in scheduler["extension_points"]] == ["PreBind", "Bind"]
    assert scheduler["extension_points"][0]["count"] == 50 and scheduler["extension_points"][0]["total_s"] == 1.0
    assert [(p["plugin"], p["extension_point"]) for p in scheduler["plugins"]] == [
        ("DynamicResources", "Filter"),
        ("NodeAffinity", "Filter"),
    ], "the DRA plugin first, whatever the others took"
    assert 0.01 < scheduler["plugins"][0]["p99_s"] <= 0.1
    # Only the calls DRA cares about: configmaps are not listed.
    assert [(r["resource"], r["verb"], r["count"]) for r in figures["apiserver"]] == [("resourceclaims", "POST", 50)]
    assert figures["partial"] == ""


def test_a_component_that_restarted_or_was_not_scraped_makes_the_phase_partial() -> None:
    start = _snapshot(0.0, (0.0, 1.0), apiserver=_apiserver(3.0, [], []), scheduler=_scheduler(1.0, [], 0, []))
    restarted = _scheduler(0.5, [0.01], 1, [0.01])
    restarted.samples["process_start_time_seconds"] = {frozenset(): 2000.0}
    end = _snapshot(5.0, (1.0, 2.0), apiserver=Scrape(failed="connection refused"), scheduler=restarted)
    figures = breakdown.phase(start, end)
    assert "kube-scheduler restarted" in figures["partial"] and "kube-apiserver not scraped" in figures["partial"]
    assert figures["cpu_seconds"]["kube-scheduler"] == 0.5, "counted since its restart, not a negative increase"
    assert figures["cpu_seconds"]["kube-apiserver"] is None
    assert figures["scheduler"]["attempts"]["scheduled"] == 1


def test_machine_cpu_reads_busy_and_total_ticks(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 20 800 50 3 2 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert breakdown.machine_cpu(stat) == (130.0, 980.0)  # idle 800 and iowait 50 are not busy
    assert breakdown.machine_cpu(tmp_path / "missing") is None


def _phase(figures: dict[str, Any], **changes: Any) -> dict[str, Any]:
    phase = {
        "name": "fill",
        "pods_expected": 100,
        "pods_running": 100,
        "unschedulable": 0,
        "duration_s": 30.0,
        "pods_per_s": 3.3,
        "pod_startup_s": {"p50": 4.0, "p99": 9.0},
        "slo_p99_s": 5.0,
        "slo_met": False,
        "queues": {"scheduler_pending_max": 60, "kcm_resource_claim_max": 2},
        "breakdown": figures,
    }
    phase.update(changes)
    return phase


def test_a_scheduler_bound_phase_is_named_with_the_figures_behind_it() -> None:
    figures = _phase_figures()
    figures["scheduler"]["sli_duration"] = {"count": 100, "total_s": 400.0, "p50_s": 3.5, "p99_s": 8.0}
    result = bottleneck.explain(_phase(figures), nodes=200)
    assert result["kind"] == "scheduler-bound"
    text = result["text"]
    assert "pending pods up to 60" in text and "scheduling SLI p99 8.00 s" in text
    assert "DynamicResources Filter p99" in text and "per node checked" in text and "200 nodes in the cluster" in text
    assert "2 cores were 80% busy" in text and "kube-apiserver 30" in text


def test_a_deep_claim_queue_names_the_claim_controller() -> None:
    figures = _phase_figures()
    phase = _phase(figures, queues={"scheduler_pending_max": 3, "kcm_resource_claim_max": 40})
    result = bottleneck.explain(phase, nodes=10)
    assert result["kind"] == "claim-controller-bound"
    assert "KCM resource_claim queue up to 40" in result["text"]


def test_a_phase_that_met_its_slo_with_short_queues_has_no_bottleneck() -> None:
    phase = _phase(
        _phase_figures(),
        slo_met=True,
        pod_startup_s={"p50": 0.05, "p99": 0.2},
        queues={"scheduler_pending_max": 1, "kcm_resource_claim_max": 0},
    )
    assert bottleneck.explain(phase, nodes=10)["kind"] == "no bottleneck (SLO met, queues short)"
    figures = _phase_figures()
    figures["machine"] = {"busy": 0.97, "cores": 2}
    busy = bottleneck.explain(_phase(figures, slo_met=True), nodes=10)
    assert busy["kind"].endswith("CPU-saturated"), "a saturated machine is a strain even when the SLO holds"


def test_a_phase_where_no_pod_ran_is_not_explained() -> None:
    phase = _phase(_phase_figures(), pods_running=0, pod_startup_s={"p50": None, "p99": None}, slo_met=None)
    assert bottleneck.explain(phase, nodes=10)["kind"] == "not measured"


def _report(phases: list[dict[str, Any]], leaks_ok: bool = True, **changes: Any) -> dict[str, Any]:
    report = {
        "scenario": "cl2-dra",
        "verdict": "FAIL",
        "started": "2026-11-22T10:00:00+00:00",
        "duration_s": 60.0,
        "error": "",
        "cluster": {"name": "a", "settings": {"percentageOfNodesToScore": None}, "pools": [{"count": 100}]},
        "nodes": 100,
        "slices": 100,
        "phases": phases,
        "leaks": {"checkpoint_entries": 0 if leaks_ok else 3, "cdi_specs": 0, "ok": leaks_ok},
    }
    report.update(changes)
    return report


def test_junit_has_a_case_per_phase_and_fails_what_missed_its_slo() -> None:
    missed = _phase(_phase_figures(), name="fill")
    missed["bottleneck"] = bottleneck.explain(missed, 100)
    met = _phase(_phase_figures(), name="churn", slo_met=True, pod_startup_s={"p50": 0.1, "p99": 0.3})
    cut = _phase(_phase_figures(), name="late", slo_met=None, pods_running=7)
    suite = ET.fromstring(junit_xml(_report([missed, met, cut], leaks_ok=False)))
    assert suite.get("tests") == "4" and suite.get("failures") == "3"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert list(cases) == ["fill", "churn", "late", "leak-check"]
    fill = cases["fill"].find("failure")
    assert fill is not None and "exceeds the SLO of 5.0 s" in fill.get("message", "")
    assert "scheduler" in (fill.text or "") or "bound" in (fill.text or "")
    assert cases["churn"].find("failure") is None
    late = cases["late"].find("failure")
    assert late is not None and "not measured: 7/100 pods ran" in late.get("message", "")
    assert cases["leak-check"].find("failure") is not None


def test_compare_flags_only_regressions_beyond_the_ratio_in_the_worse_direction(tmp_path: Path) -> None:
    a = _report([_phase(_phase_figures())])
    b = copy.deepcopy(a)
    b["cluster"]["settings"]["percentageOfNodesToScore"] = 10
    b["phases"][0]["pod_startup_s"]["p99"] = 12.0  # 1.33x worse
    b["phases"][0]["pods_per_s"] = 3.0  # 1.1x worse (lower is worse)
    b["phases"][0]["pod_startup_s"]["p50"] = 1.0  # better
    for directory, report in (("a", a), ("b", b)):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "report.json").write_text(json.dumps(report))
    first, second = compare.load(tmp_path / "a"), compare.load(tmp_path / "b" / "report.json")

    result = compare.compare(first, second, compare.parse_thresholds(("startup_p99=1.2", "pods_per_s=1.2")))
    assert result.regressions == ["fill: startup_p99 9 -> 12 (1.33x worse, allowed 1.2x)"]
    assert "  cluster.settings.percentageOfNodesToScore: None -> 10" in result.lines
    assert compare.compare(first, second, compare.parse_thresholds(("pods_per_s=1.05",))).regressions == [
        "fill: pods_per_s 3.3 -> 3 (1.10x worse, allowed 1.05x)"
    ]
    assert compare.compare(first, second, compare.parse_thresholds(("startup_p50=1.0",))).regressions == []


def test_compare_refuses_unknown_figures_bad_ratios_and_missing_reports(tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match="no figure named 'p99'"):
        compare.parse_thresholds(("p99=1.2",))
    for bad in ("startup_p99=0.5", "startup_p99=fast", "startup_p99"):
        with pytest.raises(TestbedError, match="at least 1"):
            compare.parse_thresholds((bad,))
    with pytest.raises(TestbedError, match="no report at"):
        compare.load(tmp_path)
    report = tmp_path / "report.json"
    for text, said in (
        ("[1]", "has no phases"),
        ('{"phases": [1]}', "lacks scenario, verdict, started, phases\\[\\].name: not a report"),
        ('{"phases": [{"name": "a"}], "scenario": "s", "verdict": "PASS"}', "lacks started: not a report"),
    ):
        report.write_text(text)
        with pytest.raises(TestbedError, match=said):
            compare.load(tmp_path)


def test_report_md_reads_well_cluster_table_quiet_queues_and_no_zero_artefacts() -> None:
    from testbed.report.report import _fmt, _queue_line, markdown

    assert _fmt(0.0) == "< 0.1 ms" and _fmt(0.00004) == "< 0.1 ms" and _fmt(0.0123) == "12.3 ms"
    assert _fmt(23.38614) == "23.39 s" and _fmt(None) == "n/a"
    quiet = {"component": "x", "max_depths": {"KCM": 0, "scheduler": 0}}
    assert _queue_line(quiet).startswith("No queue built up")
    busy = {"component": "kube-scheduler (pending pods)", "max_depths": {"KCM": 2, "kube-scheduler (pending pods)": 40}}
    assert _queue_line(busy).startswith("Deepest queue: kube-scheduler (pending pods)")

    phase = _phase(
        _phase_figures(),
        slo_met=True,
        pod_startup_s={"p50": 0.05, "p90": 0.1, "p99": 0.2},
        queues={"scheduler_pending_max": 1, "kcm_resource_claim_max": 0},
    )
    phase.update(jobs=100, pods_succeeded=100, pods_removed=0, stalled=False)
    phase["bottleneck"] = bottleneck.explain(phase, 100)
    report = _report([phase], verdict="PASS", description="", namespace="ns", duration_s=30.0)
    report["cluster"]["pools"] = [{"name": "gpu", "count": 100, "profile": "gpu8", "kubelet": "fake"}]
    report["claim_allocation_s"] = {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    report["leaks"]["claims_prepared_at_end"] = 0
    report["metrics"] = {
        "kcm_resource_claim": {"adds_per_s": 0, "max_depth": 0, "work_duration_p99_s": None},
        "scheduler": {"pod_scheduling_sli_duration_p99_s": None, "scheduling_algorithm_duration_p99_s": None},
        "kubelet": {"prepare_p99_s": None, "unprepare_p99_s": None},
        "plugin": {"NodePrepareResources_p99_s": None, "NodeUnprepareResources_p99_s": None},
        "testbed": {"event_loop_lag_p99_s": None, "gc_pause_p99_s": None, "claim_link_wait_p99_s": 0.0371},
        "deepest_queue": quiet,
    }
    text = markdown(report)
    assert "| fake kubelet's wait for the node authorizer, before Prepare and not in it, p99 | 37.1 ms |" in text
    assert "| pool gpu | 100 x gpu8 (fake kubelet) |" in text and "{'name'" not in text, "a table, not a dict"
    assert "No queue built up" in text and "Deepest queue" not in text
    assert "### fill: no bottleneck" in text


def test_the_nodes_sentence_names_the_wait_for_the_node_authorizer_apart_from_prepare() -> None:
    """The fake kubelet's wait for the authorizer is part of a pod's start but not of
    its PrepareResources time: the report says both."""

    def host(prepares: list[float], waits: list[float]) -> Scrape:
        scrape = _process(5.0)
        labels = {"operation_name": "PrepareResources", "is_error": "false"}
        _histogram(scrape, "dra_operations_duration_seconds", labels, prepares)
        _histogram(scrape, "dra_testbed_kubelet_claim_link_wait_seconds", {}, waits)
        return scrape

    parts = {"apiserver": _apiserver(3.0, [], []), "scheduler": _scheduler(1.0, [], 0, [])}
    start = _snapshot(0.0, (0.0, 10.0), **parts)
    end = _snapshot(10.0, (5.0, 20.0), **parts)
    start.nodehosts, end.nodehosts = [host([], [])], [host([0.005] * 20, [0.05] * 7)]
    figures = breakdown.phase(start, end)
    assert figures["nodes"]["link_wait"]["count"] == 7
    text = bottleneck.explain(_phase(figures), nodes=10)["text"]
    assert "kubelet PrepareResources p99 9.9 ms; 7 pod starts first waited for the node authorizer" in text
    assert "link their claims, p99 99.1 ms" in text
    del figures["nodes"]["link_wait"]
    assert "authorizer" not in bottleneck.explain(_phase(figures), nodes=10)["text"], "an older report reads as before"


def test_the_scheduler_waiting_on_binding_conditions_is_counted_and_said() -> None:
    def scheduler(waits: list[float], failures: float) -> Scrape:
        scrape = _scheduler(1.0, [], len(waits), [])
        labels = {"profile": "default-scheduler", "driver": "gpu.dra-testbed.io"}
        name = "scheduler_dra_bindingconditions_"
        _histogram(scrape, f"{name}wait_duration_seconds", {**labels, "status": "success"}, waits)
        _counter(scrape, f"{name}allocations_total", {**labels, "status": "success"}, len(waits))
        _counter(scrape, f"{name}allocations_total", {**labels, "status": "failure"}, failures)
        return scrape

    start = _snapshot(0.0, (0.0, 10.0), apiserver=_apiserver(1.0, [], []), scheduler=scheduler([], 0))
    end = _snapshot(30.0, (5.0, 20.0), apiserver=_apiserver(2.0, [], []), scheduler=scheduler([5.0] * 9, 1))
    figures = breakdown.phase(start, end)
    waited = figures["scheduler"]["binding_conditions"]
    assert waited["outcomes"] == {"failure": 1, "success": 9}
    assert waited["wait"]["count"] == 9 and 1.0 < waited["wait"]["p50_s"] <= 10.0
    text = bottleneck.explain(_phase(figures), nodes=2)["text"]
    assert "Devices with binding conditions: the scheduler waited in PreBind for them (1 failure, 9 success" in text
    table = "\n".join(rendering.phase_section(_phase(figures, bottleneck=bottleneck.explain(_phase(figures), nodes=2))))
    assert "| binding conditions (PreBind wait) | failure 1, success 9; p50 " in table
    quiet = _phase_figures()["scheduler"]["binding_conditions"]
    assert quiet["outcomes"] == {} and "binding conditions" not in "\n".join(
        rendering.phase_section(_phase(_phase_figures(), bottleneck={"kind": "x", "text": ""}))
    )


def test_a_quantile_past_the_last_bucket_reads_as_at_least_that_bucket() -> None:
    """The scheduler's extension-point buckets end well below a PreBind that waited for
    binding conditions: its p50 is then only known to be at least the last bound."""
    start = _snapshot(0.0, (0.0, 10.0), apiserver=_apiserver(1.0, [], []), scheduler=_scheduler(1.0, [], 0, []))
    end = _snapshot(
        30.0,
        (5.0, 20.0),
        apiserver=_apiserver(2.0, [], []),
        scheduler=_scheduler(2.0, [], 4, [20.0, 20.0, 0.05, 0.05, 30.0]),
    )
    figures = breakdown.phase(start, end)
    table = "\n".join(rendering.phase_section(_phase(figures, bottleneck=bottleneck.explain(_phase(figures), nodes=2))))
    assert "| scheduler PreBind | 5 calls, 70.1 s, p50 >= 10.00 s, p99 >= 10.00 s |" in table
    assert "| scheduler Bind | 5 calls, 0.01 s, p50 5.5 ms, p99 9.9 ms |" in table, "within the buckets: as measured"
    assert (
        "most of its framework time in PreBind (70.1 s, p99 >= 10.00 s)"
        in bottleneck.explain(_phase(figures), 2)["text"]
    )


def test_the_processes_beside_the_hosts_count_by_what_they_are() -> None:
    """A command-line driver's CPU (and a real-kubelet node's processes') is not in the
    NodeHosts' own: it is listed beside it, as much as each used in the phase."""

    def host(cpu: float, driver: float, kubelet: float | None) -> Scrape:
        scrape = _process(cpu)
        _counter(scrape, breakdown.NODE_PROCESSES_CPU, {"process": "driver gpu.example.com"}, driver)
        if kubelet is not None:
            _counter(scrape, breakdown.NODE_PROCESSES_CPU, {"process": "real kubelet"}, kubelet)
        return scrape

    start = _snapshot(10.0, (100.0, 400.0), apiserver=_apiserver(3.0, [], []), scheduler=_scheduler(1.0, [], 0, []))
    end = _snapshot(40.0, (580.0, 1000.0), apiserver=_apiserver(33.0, [], []), scheduler=_scheduler(21.0, [], 0, []))
    start.nodehosts, end.nodehosts = [host(5.0, 1.0, None)], [host(8.5, 3.5, 0.75)]
    cpu = breakdown.phase(start, end)["cpu_seconds"]
    assert (cpu["nodehosts"], cpu["driver gpu.example.com"], cpu["real kubelet"]) == (3.5, 2.5, 0.75)


def test_compare_names_the_one_setting_of_a_pool_that_differs() -> None:
    pool = {"name": "node", "count": 2, "profile": "tiny", "taints": [{"key": "k", "effect": "NoSchedule"}]}
    a = {"scenario": "smoke", "cluster": {"name": "a", "pools": [pool]}, "nodes": 2}
    b = {"scenario": "smoke", "cluster": {"name": "b", "pools": [{**pool, "count": 3}]}, "nodes": 3}
    assert compare.setting_differences(a, b) == ["cluster.pools[0].count: 2 -> 3", "nodes: 2 -> 3"]
