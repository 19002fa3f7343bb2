"""The run report: report.json (every figure), report.md (the summary), PNG plots."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from testbed.report import bottleneck, breakdown
from testbed.report.metrics import Scrape, quantile, quantile_text
from testbed.report.reference import DRA_V1_METHODS, kubelet_reference, reference_lines_md
from testbed.scenarios.runner import PhaseResult, PodRecord, RunData

LOOP_HELD_NOTE_S = 0.1
"""A hold of the run's event loop worth a note in report.md: pod startups are a few
hundred milliseconds, so one this long can hide a pod's whole start."""


def _held_phases(report: dict[str, Any]) -> str:
    """The phases during which the run's event loop was held long enough to matter, as
    "350.0 ms in fill, 120.0 ms in churn"; "" if none."""
    return ", ".join(
        f"{_fmt(p['runner_loop_held_max_s'])} in {p['name']}"
        for p in report["phases"]
        if p.get("runner_loop_held_max_s", 0.0) >= LOOP_HELD_NOTE_S
    )


def _percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 4)

    return {
        "count": len(values),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": round(ordered[-1], 4),
    }


def _p99(data: RunData, source: str, name: str, match: dict[str, str]) -> float | None:
    before, after = data.before.get(source, Scrape()), data.after.get(source, Scrape())
    value = quantile(0.99, before.buckets(name, match), after.buckets(name, match))
    return None if value is None else round(value, 5)


def _observed(data: RunData, source: str, name: str) -> int | None:
    """How many observations a histogram gained during the run; None if it was not scraped."""
    after = data.after.get(source, Scrape()).buckets(name, {})
    if not after:
        return None
    before = data.before.get(source, Scrape()).buckets(name, {})
    top = max(after)
    return round(after[top] - before.get(top, 0.0))


def _p99_of(p99: float | None, observed: int | None, none: str) -> str:
    """A p99, or ``none`` where the histogram was read and nothing happened (not "n/a",
    which says it could not be measured)."""
    return none if p99 is None and observed == 0 else _fmt(p99)


def slo_verdict(result: PhaseResult, p99: float | None, slo: float) -> bool | None:
    """True or False only for a phase whose every pod ran: the startup of a pod that
    never ran is not measured, so a percentile over the others proves nothing. None
    (not measured) for a phase cut short; False for a finished one that left pods behind."""
    if result.pods_running < result.pods_expected or result.stalled:
        return None if result.interrupted else False
    return p99 is not None and p99 <= slo and not result.unschedulable and not result.not_started


def slo_text(met: bool | None, phase: dict[str, Any]) -> str:
    if met is None:
        return f"not measured ({phase['pods_running']}/{phase['pods_expected']} pods ran)"
    return "met" if met else "MISSED"


def _held_during(data: RunData, result: PhaseResult, pods: list[PodRecord]) -> float:
    """The longest hold of the run's event loop while the phase's pods started: from the
    phase's start until it ended or its last pod ran, whichever is later (a phase that
    does not wait has pods starting through the next). Holds between phases, as the run
    reads every component's metrics, hide no start."""
    end = max([result.ended or data.ended, *(p.running - data.started for p in pods if p.running is not None)])
    return round(max((h for at, h in data.loop_holds if at < end and at + h > result.started), default=0.0), 4)


def _queues(data: RunData, result: PhaseResult) -> dict[str, float]:
    """The deepest each queue got while the phase ran."""
    during = [sample for sample in data.timeline if result.started <= sample[0] <= (result.ended or data.ended)]
    return {
        "scheduler_pending_max": max((q for _, _, _, q in during), default=0),
        "kcm_resource_claim_max": max((d for _, _, d, _ in during), default=0),
    }


def build(data: RunData, leaks: dict[str, int], cluster: dict[str, Any]) -> dict[str, Any]:
    phases = []
    slo = data.scenario.slo_p99_seconds
    for index, result in enumerate(data.phases):
        pods = [p for p in data.pods.values() if p.phase == result.name]
        startup = [p.running - p.added for p in pods if p.running is not None]
        duration = max(result.ended - result.started, 1e-9)
        latency = _percentiles(startup)
        phases.append(
            {
                "name": result.name,
                "jobs": result.jobs,
                "pods_expected": result.pods_expected,
                "pods_running": result.pods_running,
                "pods_succeeded": result.pods_succeeded,
                "pods_failed": result.pods_failed,
                "pods_removed": result.pods_removed,
                "pods_evicted": result.pods_evicted,
                "unschedulable": result.unschedulable,
                "pods_not_started": result.not_started,
                "stalled": result.stalled,
                "duration_s": round(duration, 2),
                "pods_per_s": round(result.pods_running / duration, 3),
                "pod_startup_s": latency,
                "pods_seen_late": sum(1 for p in pods if p.seen_late),
                "runner_loop_held_max_s": _held_during(data, result, pods),
                "slo_p99_s": slo,
                "slo_met": slo_verdict(result, latency["p99"], slo),
                "queues": _queues(data, result),
            }
        )
        if index + 1 < len(data.snapshots):
            phases[-1]["breakdown"] = breakdown.phase(data.snapshots[index], data.snapshots[index + 1])
            phases[-1]["bottleneck"] = bottleneck.explain(phases[-1], data.nodes)
    claims = [
        allocated - added
        for uid, (added, allocated) in data.claims.items()
        if allocated is not None and uid not in data.claims_untimed
    ]
    duration = max(data.ended, 1e-9)
    kcm_adds = data.after.get("kcm", Scrape()).value(
        "workqueue_adds_total", {"name": "resource_claim"}
    ) - data.before.get("kcm", Scrape()).value("workqueue_adds_total", {"name": "resource_claim"})
    fleet_after = data.after.get("fleet", Scrape())
    metrics: dict[str, Any] = {
        "kcm_resource_claim": {
            "adds_total": kcm_adds,
            "adds_per_s": round(kcm_adds / duration, 3),
            "max_depth": max((d for _, _, d, _ in data.timeline), default=0),
            "work_duration_p99_s": _p99(data, "kcm", "workqueue_work_duration_seconds", {"name": "resource_claim"}),
        },
        "scheduler": {
            "pod_scheduling_sli_duration_p99_s": _p99(
                data, "scheduler", "scheduler_pod_scheduling_sli_duration_seconds", {}
            ),
            "scheduling_algorithm_duration_p99_s": _p99(
                data, "scheduler", "scheduler_scheduling_algorithm_duration_seconds", {}
            ),
        },
        "kubelet": {
            "prepare_p99_s": _p99(
                data,
                "fleet",
                "dra_operations_duration_seconds",
                {"operation_name": "PrepareResources"},
            ),
            "unprepare_p99_s": _p99(
                data,
                "fleet",
                "dra_operations_duration_seconds",
                {"operation_name": "UnprepareResources"},
            ),
        },
        "plugin": {
            "NodePrepareResources_p99_s": _p99(
                data,
                "fleet",
                "dra_grpc_operations_duration_seconds",
                {"method_name": DRA_V1_METHODS + "NodePrepareResources"},
            ),
            "NodeUnprepareResources_p99_s": _p99(
                data,
                "fleet",
                "dra_grpc_operations_duration_seconds",
                {"method_name": DRA_V1_METHODS + "NodeUnprepareResources"},
            ),
        },
        "runner": {"event_loop_held_max_s": round(max((h for _, h in data.loop_holds), default=0.0), 4)},
        "testbed": {
            "event_loop_lag_p99_s": _p99(data, "fleet", "dra_testbed_event_loop_lag_seconds", {}),
            "gc_pause_p99_s": _p99(data, "fleet", "dra_testbed_gc_pause_seconds", {}),
            "claim_link_wait_p99_s": _p99(data, "fleet", "dra_testbed_kubelet_claim_link_wait_seconds", {}),
            "gc_pauses": _observed(data, "fleet", "dra_testbed_gc_pause_seconds"),
            "claim_link_waits": _observed(data, "fleet", "dra_testbed_kubelet_claim_link_wait_seconds"),
        },
    }
    queues = {
        "kube-controller-manager (resource_claim workqueue)": max((d for _, _, d, _ in data.timeline), default=0),
        "kube-scheduler (pending pods)": max((q for _, _, _, q in data.timeline), default=0),
    }
    metrics["deepest_queue"] = {"component": max(queues, key=lambda k: queues[k]), "max_depths": queues}
    metrics["fleet_partial"] = data.fleet_partial
    metrics["kubelet_reference"] = kubelet_reference(fleet_after)
    prepared_now = fleet_after.value("dra_testbed_prepared_claims", {})
    leak_report = {**leaks, "claims_prepared_at_end": prepared_now}
    leak_report["ok"] = not any(leak_report.get(k) for k in ("checkpoint_entries", "cdi_specs", "unchecked"))
    verdict = (
        "ERROR"
        if data.error
        else "INTERRUPTED"
        if data.interrupted
        else "PASS"
        if phases and all(p["slo_met"] is True for p in phases) and leak_report["ok"]
        else "FAIL"
    )
    return {
        "scenario": data.scenario.name,
        "description": data.scenario.description.strip(),
        "namespace": data.namespace,
        "cluster": cluster,
        "started": dt.datetime.fromtimestamp(data.started_wall, dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(data.ended, 2),
        "devices": data.devices,
        "nodes": data.nodes,
        "slices": data.slices,
        "verdict": verdict,
        "error": data.error,
        "left_behind": data.left_behind,
        "faults": data.faults,
        "faults_undone": data.faults_undone,
        "phases": phases,
        "claim_allocation_s": _percentiles(claims),
        "metrics": metrics,
        "leaks": leak_report,
        "timeline": [
            {"t": round(t, 2), "running": r, "kcm_queue_depth": d, "scheduler_pending": q}
            for t, r, d, q in data.timeline
        ],
    }


def _fmt(value: Any, unit: str = "s") -> str:
    if value is None:
        return "n/a"
    if unit == "s" and isinstance(value, (int, float)) and value < 0.0001:
        return "< 0.1 ms"  # below what a watch-observed time can tell apart
    if unit == "s" and isinstance(value, float) and value < 1:
        return f"{value * 1000:.1f} ms"
    if unit == "s" and isinstance(value, float):
        return f"{value:.2f} s"
    return f"{value:g} {unit}".strip() if isinstance(value, (int, float)) else str(value)


def _calls(row: dict[str, Any]) -> str:
    p50, p99 = quantile_text(row, "p50_s", _fmt), quantile_text(row, "p99_s", _fmt)
    calls = f"{row['count']} call{'' if row['count'] == 1 else 's'}"
    return f"{calls}, {row['total_s']:g} s, p50 {p50}, p99 {p99}"


def _call(row: dict[str, Any]) -> str:
    return f"{row['verb']} {row['resource']}" + (f"/{row['subresource']}" if row.get("subresource") else "")


def _cluster_lines(report: dict[str, Any]) -> list[str]:
    """The cluster the run ran on, as a table: its pools and the knobs it was started with."""
    cluster = report.get("cluster") or {}
    rows = [
        ("name", cluster.get("name", "")),
        ("synthetic nodes", report.get("nodes", "")),
        ("ResourceSlices", report.get("slices", "")),
    ]
    for pool in cluster.get("pools", []):
        extra = f", {pool['devicesPerSlice']} devices per slice" if pool.get("devicesPerSlice") else ""
        rows.append(
            (
                f"pool {pool['name']}",
                f"{pool['count']} x {pool['profile']} ({pool.get('kubelet', 'fake')} kubelet{extra})",
            )
        )
    if cluster.get("identities"):
        rows.append(("identities", cluster["identities"]))
    rows += [(key, value) for key, value in (cluster.get("settings") or {}).items() if value is not None]
    return ["| cluster | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]


def _queue_line(deepest: dict[str, Any]) -> str:
    depths = deepest["max_depths"]
    if not any(depths.values()):
        return "No queue built up: the KCM resource_claim workqueue and the scheduler's pending pods stayed at 0."
    listed = ", ".join(f"{k} {v:g}" for k, v in depths.items())
    return f"Deepest queue: {deepest['component']} (max depths: {listed})."


def _fault_lines(report: dict[str, Any]) -> list[str]:
    if not report.get("faults"):
        return []
    lines = ["## Faults injected", "", "| at | fault | nodes | outcome |", "|---|---|---|---|"]
    for f in report["faults"]:
        nodes = f.get("nodes") or []
        shown = ", ".join(nodes[:5]) + (f" (+{len(nodes) - 5})" if len(nodes) > 5 else "")
        outcome = f"error: {f['error']}" if f.get("error") else f.get("outcome") or ""
        fatal = " (fatal)" if f.get("fatal") else ""
        what = f"{f['action']} {f['target']}".strip()
        after = f" ({f['after_running']} running)" if f.get("after_running") else ""
        lines.append(f"| {f['at_s']} s{after} | {what}{fatal} | {shown or '-'} | {outcome} |")
    undone = [
        f"{f['action']} {f['target']} on {f['nodes_pattern']}" + (f" (error: {f['error']})" if f["error"] else "")
        for f in report.get("faults_undone") or []
    ]
    if undone:
        lines += ["", f"Undone as the run ended, so the next run finds the fleet as this one did: {'; '.join(undone)}."]
    return [*lines, ""]


def phase_section(phase: dict[str, Any]) -> list[str]:
    """Where one phase's time went: the bottleneck paragraph and a short table."""
    figures = phase.get("breakdown")
    if figures is None:
        return []
    lines = [f"### {phase['name']}: {phase['bottleneck']['kind']}", "", phase["bottleneck"]["text"], ""]
    rows = []
    cpu = ", ".join(f"{k} {v:g}" for k, v in figures["cpu_seconds"].items() if v is not None)
    if cpu:
        busy = f" (cores {figures['machine']['busy']:.0%} busy)" if figures["machine"] else ""
        rows.append(("CPU-seconds" + busy, cpu))
    scheduler = figures["scheduler"]
    for point in scheduler["extension_points"][:4]:
        rows.append((f"scheduler {point['extension_point']}", _calls(point)))
    every = 100 // scheduler["plugin_sample_percent"]
    notable = [p for p in scheduler["plugins"] if p["plugin"] == "DynamicResources" or p["total_s"] > 0]
    for plugin in notable[:4]:
        rows.append((f"plugin {plugin['plugin']} {plugin['extension_point']} (1 cycle in {every})", _calls(plugin)))
    if any(scheduler["attempts"].values()):
        rows.append(("scheduling attempts", ", ".join(f"{k} {v}" for k, v in scheduler["attempts"].items())))
    waited = scheduler.get("binding_conditions", {})  # reports before binding conditions have none
    if waited.get("outcomes"):
        outcomes = ", ".join(f"{k} {v}" for k, v in waited["outcomes"].items())
        wait = waited["wait"]
        rows.append(
            (
                "binding conditions (PreBind wait)",
                f"{outcomes}; p50 {quantile_text(wait, 'p50_s', _fmt)}, p99 {quantile_text(wait, 'p99_s', _fmt)}",
            )
        )
    if scheduler["incoming"]:
        rows.append(
            ("queue incoming (event: pods)", ", ".join(f"{k} {v}" for k, v in list(scheduler["incoming"].items())[:5]))
        )
    rows += [(f"API {_call(row)}", _calls(row)) for row in figures["apiserver"][:6]]
    rows += [(f"etcd {row['operation']} {row['resource']}", _calls(row)) for row in figures["etcd"][:3]]
    lines += ["| where | figures |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# {report['scenario']}: {report['verdict']}",
        "",
        *([report["description"], ""] if report["description"] else []),
        f"Started {report['started']}, {report['duration_s']} s, namespace `{report['namespace']}`.",
        "",
        *_cluster_lines(report),
        *([f"**Error:** {report['error']}", ""] if report.get("error") else []),
        *([f"**Left behind:** {report['left_behind']}", ""] if report.get("left_behind") else []),
        *(
            [f"**Fleet figures are partial:** {report['metrics']['fleet_partial']}", ""]
            if report["metrics"].get("fleet_partial")
            else []
        ),
        "| phase | jobs | pods expected | ran | succeeded | failed | removed | unschedulable | pods/s "
        "| startup p50 | p90 | p99 | SLO p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["phases"]:
        lat = p["pod_startup_s"]
        lines.append(
            f"| {p['name']} | {p['jobs']} | {p['pods_expected']} | {p['pods_running']} | {p['pods_succeeded']} | "
            f"{p.get('pods_failed', 0)}{_evicted(p)} | {p.get('pods_removed', 0)} | {p['unschedulable']}"
            + (f" (+{p['pods_not_started']} on a node, never started)" if p.get("pods_not_started") else "")
            + f" | {p['pods_per_s']} | {_fmt(lat['p50'])} | {_fmt(lat['p90'])} | {_fmt(lat['p99'])} | "
            f"{slo_text(p['slo_met'], p)} (<= {p['slo_p99_s']} s) |"
        )
    late = sum(p.get("pods_seen_late", 0) for p in report["phases"])
    if late:
        lines += [
            "",
            f"**Seen late:** {late} pod(s) were first seen already scheduled: the run's pod watch missed their "
            "creation (it was re-listing after a lost connection), so their startup reads shorter than it was.",
        ]
    held = _held_phases(report)
    if held:
        lines += [
            "",
            f"**Measurement:** this run's own event loop was held, at its longest, {held} (a busy "
            "machine, or this process's work): a pod created and started within such a hold reads as "
            "starting faster than it did.",
        ]
    m = report["metrics"]
    t = m["testbed"]
    claim = report["claim_allocation_s"]
    lines += [
        "",
        f"ResourceClaim allocation: p50 {_fmt(claim['p50'])}, p99 {_fmt(claim['p99'])} ({claim['count']} claims).",
        "",
        "## What the cluster-admin guide says to watch",
        "",
        "| metric | value |",
        "|---|---|",
        f"| KCM `resource_claim` workqueue adds/s | {m['kcm_resource_claim']['adds_per_s']} |",
        f"| KCM `resource_claim` max queue depth | {m['kcm_resource_claim']['max_depth']:g} |",
        f"| KCM `resource_claim` work duration p99 | {_fmt(m['kcm_resource_claim']['work_duration_p99_s'])} |",
        f"| scheduler pod scheduling SLI p99 | {_fmt(m['scheduler']['pod_scheduling_sli_duration_p99_s'])} |",
        f"| scheduler algorithm duration p99 | {_fmt(m['scheduler']['scheduling_algorithm_duration_p99_s'])} |",
        f"| kubelet `dra_operations_duration_seconds` Prepare p99 | {_fmt(m['kubelet']['prepare_p99_s'])} |",
        f"| kubelet `dra_operations_duration_seconds` Unprepare p99 | {_fmt(m['kubelet']['unprepare_p99_s'])} |",
        "| fake kubelet's wait for the node authorizer, before Prepare and not in it, p99 | "
        f"{_p99_of(t.get('claim_link_wait_p99_s'), t.get('claim_link_waits'), 'no waits')} |",
        "| kubelet `dra_grpc_operations_duration_seconds` NodePrepareResources p99 | "
        f"{_fmt(m['plugin']['NodePrepareResources_p99_s'])} |",
        "| kubelet `dra_grpc_operations_duration_seconds` NodeUnprepareResources p99 | "
        f"{_fmt(m['plugin']['NodeUnprepareResources_p99_s'])} |",
        f"| NodeHost event-loop lag p99 (the testbed's own delay) | {_fmt(m['testbed']['event_loop_lag_p99_s'])} |",
        f"| NodeHost GC pause p99 | {_p99_of(t['gc_pause_p99_s'], t.get('gc_pauses'), 'no collections')} |",
        "",
        "",
        _queue_line(m["deepest_queue"]),
        "",
        *reference_lines_md(m.get("kubelet_reference")),
        "## Where the time went, per phase",
        "",
        *[line for phase in report["phases"] for line in phase_section(phase)],
        *_fault_lines(report),
        "## Leak check",
        "",
    ]
    leaks = report["leaks"]
    lines.append(
        f"{'clean' if leaks['ok'] else 'LEAKS' if not leaks.get('unchecked') else 'NOT ALL CHECKED'}: "
        f"{leaks['checkpoint_entries']} checkpoint entries, {leaks['cdi_specs']} CDI specs, "
        f"{leaks['claims_prepared_at_end']:g} claims prepared at the end."
        + (f" Not checked: {', '.join(leaks['unchecked'])}." if leaks.get("unchecked") else "")
    )
    lines += ["", "Plots: `latency_cdf.png`, `timeline.png`, `time_spent.png`.", ""]
    return "\n".join(lines)


def plots(report: dict[str, Any], data: RunData, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for phase in report["phases"]:
        values = sorted(
            max(p.running - p.added, 1e-4)  # a log axis has no zero
            for p in data.pods.values()
            if p.phase == phase["name"] and p.running is not None
        )
        if values:  # markers too: a phase of one pod is one point, not an invisible line
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            axis.plot(values, fractions, marker="o" if len(values) < 30 else "", markersize=4, label=phase["name"])
    axis.axvline(data.scenario.slo_p99_seconds, color="red", linestyle="--", label="SLO p99")
    axis.set_xscale("log")  # 50 ms and 5 s on one readable axis
    axis.set_xlabel("pod startup (created -> Running), s (log scale)")
    axis.set_ylabel("fraction of pods")
    axis.set_ylim(0, 1.02)
    axis.grid(True, which="both", alpha=0.3)
    axis.set_title(f"{report['scenario']}: pod startup latency")
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    figure.tight_layout()
    written.append(directory / "latency_cdf.png")
    figure.savefig(written[-1], dpi=100)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(9, 4.5))
    # Counts sampled about once a second: each holds until the next sample. A line drawn
    # between two samples showed pods running before the phase that made them started.
    timeline = held_until(data.timeline, data.ended)
    times = [t for t, _, _, _ in timeline]
    axis.plot(times, [r for _, r, _, _ in timeline], label="pods running", drawstyle="steps-post")
    axis.set_xlabel("time since the run started, s")
    axis.set_ylabel("pods running")
    second = axis.twinx()
    depths = [d for _, _, d, _ in timeline]
    second.plot(times, depths, color="orange", label="KCM resource_claim queue depth", drawstyle="steps-post")
    second.plot(
        times,
        [q for _, _, _, q in timeline],
        color="green",
        label="scheduler pending pods",
        drawstyle="steps-post",
    )
    second.set_ylabel("queue depth")
    for result in data.phases:
        axis.axvline(result.started, color="grey", linestyle=":")
        axis.annotate(
            result.name,
            (result.started, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize="small",
            color="grey",
        )
    axis.set_title(f"{report['scenario']}: timeline (dotted: phase starts)")
    deepest = max((max(d, q) for _, _, d, q in data.timeline), default=0)
    second.set_ylim(0, max(deepest, 1) * 1.1)  # an empty queue is a flat line at 0, not at mid-height
    axis.set_ylim(bottom=0)
    handles = axis.get_legend_handles_labels()[0] + second.get_legend_handles_labels()[0]
    axis.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize="small")
    figure.tight_layout()
    written.append(directory / "timeline.png")
    figure.savefig(written[-1], dpi=100)
    plt.close(figure)
    written.append(_time_spent_plot(report, directory / "time_spent.png"))
    return written


Sample = tuple[float, int, float, float]


def held_until(timeline: list[Sample], ended: float) -> list[Sample]:
    """The samples, the last repeated at the run's end: drawn as steps, each sample holds
    until the next, and the last until the run ended (else it has no width at all)."""
    if timeline and ended > timeline[-1][0]:
        return [*timeline, (ended, *timeline[-1][1:])]
    return list(timeline)


def _time_spent_plot(report: dict[str, Any], path: Path) -> Path:
    """Per phase, stacked: CPU-seconds per component, and the scheduler's framework time
    per extension point."""
    import matplotlib.pyplot as plt

    phases = [p for p in report["phases"] if "breakdown" in p]
    names = [p["name"] for p in phases]
    figure, (cpu_axis, scheduler_axis) = plt.subplots(1, 2, figsize=(13, 4.5))
    for axis, title, series in (
        (cpu_axis, "CPU-seconds per component", lambda p: p["breakdown"]["cpu_seconds"]),
        (
            scheduler_axis,
            "scheduler framework time per extension point, s",
            lambda p: {e["extension_point"]: e["total_s"] for e in p["breakdown"]["scheduler"]["extension_points"]},
        ),
    ):
        keys = sorted({k for p in phases for k, v in series(p).items() if v})
        bottom = [0.0] * len(phases)
        for key in keys:
            values = [float(series(p).get(key) or 0.0) for p in phases]
            axis.bar(names, values, bottom=bottom, label=key)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        axis.set_title(title)
        if keys:
            axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.suptitle(f"{report['scenario']}: where the time went")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


REPORT_FILES = ("report.json", "report.md", "latency_cdf.png", "timeline.png", "time_spent.png")
"""What ``write`` puts in a report directory."""


def foreign_files(directory: Path) -> list[str]:
    """Files of a report's names in ``directory`` that no report wrote (its report.json
    is not one): writing the report there would replace them."""
    present = [name for name in REPORT_FILES if (directory / name).exists()]
    if not present:
        return []
    try:
        earlier = json.loads((directory / "report.json").read_text())
    except (OSError, ValueError):
        return present
    ours = isinstance(earlier, dict) and {"scenario", "verdict", "phases"} <= set(earlier)
    return [] if ours else present


def write(report: dict[str, Any], data: RunData, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(report, indent=2))
    (directory / "report.md").write_text(markdown(report))
    plots(report, data, directory)
    return directory


def _evicted(p: dict[str, Any]) -> str:
    return f" ({p['pods_evicted']} evicted)" if p.get("pods_evicted") else ""


def phase_line(p: dict[str, Any]) -> str:
    lat = p["pod_startup_s"]
    return (
        f"{p['name']}: {p['pods_running']}/{p['pods_expected']} pods ran"
        + (f" ({p['pods_removed']} removed before finishing)" if p.get("pods_removed") else "")
        + (f", {p['pods_failed']} failed" if p.get("pods_failed") else "")
        + _evicted(p)
        + f", {p['unschedulable']} unschedulable, "
        + (f"{p['pods_not_started']} on a node but never started, " if p.get("pods_not_started") else "")
        + f"startup p50 {_fmt(lat['p50'])} p99 {_fmt(lat['p99'])}, {p['pods_per_s']} pods/s, "
        f"SLO {slo_text(p['slo_met'], p)}"
    )


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"{report['scenario']}: {report['verdict']} in {report['duration_s']} s"]
    if report.get("error"):
        lines.append(f"error: {report['error']}")
    if report.get("left_behind"):
        lines.append(f"left behind: {report['left_behind']}")
    if report["metrics"].get("fleet_partial"):
        lines.append(f"fleet figures partial: {report['metrics']['fleet_partial']}")
    held = _held_phases(report)
    if held:
        lines.append(f"measurement: the run's event loop was held, at its longest, {held}; startups may read short")
    for p in report["phases"]:
        lines.append(f"  {phase_line(p)}")
        if "bottleneck" in p:
            lines.append(f"    {p['bottleneck']['kind']}")
    lines.append(f"  leaks: {'none' if report['leaks']['ok'] else report['leaks']}")
    return lines
