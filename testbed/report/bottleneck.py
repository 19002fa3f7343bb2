"""A phase's bottleneck in words, built only from the figures the report holds.

The verdict names the part whose own delay explains most of the pods' startup time
(or none); the sentences after it quote the figures that led there, so a reader can
check the reasoning and knows which knob to turn next.
"""

from __future__ import annotations

from typing import Any

from testbed.report.metrics import quantile_text

DOMINANT_SHARE = 0.5
"""A part whose own p99 is at least this share of the pods' startup p99 explains it."""
DEEP_QUEUE = 10
"""A queue this deep (items waiting) is a queue, not noise."""
LATE_LOOP_S = 0.1
"""NodeHost event-loop lag p99 beyond this delays every fake kubelet on the host."""
NOTABLE_S = 0.0001
"""Plugin times below this (0.1 ms) are not worth a word."""
SATURATED = 0.9
"""Busy share of the machine's cores beyond which every component waits for a CPU."""


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _share(part: float | None, whole: float) -> float:
    return (part or 0.0) / whole if whole > 0 else 0.0


def _verdict(phase: dict[str, Any], p99: float) -> str:
    """The part whose own delay explains the startup time, when something queued up or
    the SLO was missed; a phase that met its SLO with short queues has no bottleneck."""
    figures = phase["breakdown"]
    queues = phase["queues"]
    pending, claims = queues["scheduler_pending_max"], queues["kcm_resource_claim_max"]
    machine = figures["machine"]
    strained = (
        phase["slo_met"] is not True
        or max(pending, claims) >= DEEP_QUEUE
        or (machine is not None and machine["busy"] >= SATURATED)
    )
    if not strained:
        return "no bottleneck (SLO met, queues short)"
    api = max((row["p99_s"] or 0.0 for row in figures["apiserver"]), default=0.0)
    if _share(figures["scheduler"]["sli_duration"]["p99_s"], p99) >= DOMINANT_SHARE and pending >= claims:
        return "scheduler-bound"
    if claims >= DEEP_QUEUE and claims > pending:
        return "claim-controller-bound"
    if _share(figures["nodes"]["prepare"]["p99_s"], p99) >= DOMINANT_SHARE:
        return "node-bound"
    if (figures["nodes"]["event_loop_lag"]["p99_s"] or 0.0) >= LATE_LOOP_S:
        return "testbed-bound"
    if _share(api, p99) >= DOMINANT_SHARE:
        return "api-server-bound"
    return "no single bottleneck"


def _scheduler_sentences(figures: dict[str, Any], pending: float, nodes: int) -> list[str]:
    scheduler = figures["scheduler"]
    attempts = scheduler["attempts"]
    if not any(attempts.values()):
        return []
    text = (
        f"Scheduler: pending pods up to {pending:g}; scheduling SLI p99 {_ms(scheduler['sli_duration']['p99_s'])}; "
        f"attempts {attempts['scheduled']} scheduled, {attempts['unschedulable']} unschedulable, "
        f"{attempts['error']} error"
    )
    if scheduler["extension_points"]:
        top = scheduler["extension_points"][0]
        text += (
            f"; most of its framework time in {top['extension_point']} ({top['total_s']:g} s, "
            f"p99 {quantile_text(top, 'p99_s', _ms)})"
        )
    sentences = [text + "."]
    dra = {p["extension_point"]: p for p in scheduler["plugins"] if p["plugin"] == "DynamicResources"}
    if "Filter" in dra and dra["Filter"]["p99_s"] is not None:
        # Per node, sampled; the scheduler filters only until it has enough feasible nodes
        # (percentageOfNodesToScore), in parallel: the whole step is the framework's figure.
        text = (
            f"DynamicResources Filter p99 {_ms(dra['Filter']['p99_s'])} per node checked (timed in 1 cycle in "
            f"{100 // scheduler['plugin_sample_percent']}; {nodes} nodes in the cluster)"
        )
        whole = next((p for p in scheduler["extension_points"] if p["extension_point"] == "Filter"), None)
        if whole is not None and whole["p50_s"] is not None:
            text += (
                f"; the whole Filter step per pod p50 {quantile_text(whole, 'p50_s', _ms)}, "
                f"p99 {quantile_text(whole, 'p99_s', _ms)}"
            )
        sentences.append(text + ".")
    other = [
        f"{p['extension_point']} {quantile_text(p, 'p99_s', _ms)}"
        for name, p in sorted(dra.items())
        if name != "Filter" and (p["p99_s"] or 0.0) >= NOTABLE_S
    ]
    if other:
        sentences.append(f"DynamicResources elsewhere (p99): {', '.join(other)}.")
    waited = scheduler.get("binding_conditions", {})
    if waited.get("outcomes"):
        outcomes = ", ".join(f"{n} {outcome}" for outcome, n in waited["outcomes"].items())
        wait = waited["wait"]
        sentences.append(
            f"Devices with binding conditions: the scheduler waited in PreBind for them ({outcomes}; per "
            f"device, p50 {quantile_text(wait, 'p50_s', _ms)}, p99 {quantile_text(wait, 'p99_s', _ms)}), looking "
            "every 5 s: their pods' start-up includes it."
        )
    return sentences


def _machine_sentence(figures: dict[str, Any]) -> str:
    cpu = {name: value for name, value in figures["cpu_seconds"].items() if value is not None}
    parts = []
    machine = figures["machine"]
    if machine is not None:
        parts.append(f"the machine's {machine['cores']} cores were {machine['busy']:.0%} busy")
    if cpu:
        top = max(cpu, key=lambda name: cpu[name])
        listed = ", ".join(f"{name} {value:g}" for name, value in sorted(cpu.items(), key=lambda kv: -kv[1]))
        parts.append(f"CPU-seconds over the phase's {figures['seconds']:g} s: {listed} ({top} the most)")
    text = "; ".join(parts)
    return f"{text[0].upper()}{text[1:]}." if text else ""


def _largest_share(figures: dict[str, Any], p99: float) -> str:
    parts = {
        "scheduling (SLI p99)": figures["scheduler"]["sli_duration"]["p99_s"],
        "kubelet PrepareResources p99": figures["nodes"]["prepare"]["p99_s"],
    }
    known = {name: value for name, value in parts.items() if value}
    if not known:
        return ""
    name = max(known, key=lambda n: known[n])
    share = _share(known[name], p99)
    # Histogram quantiles interpolate within buckets that double in width: a p99 read
    # off them can exceed the startup p99 measured pod by pod.
    portion = f"{share:.0%} of the startup p99" if share < 0.95 else "about all of the startup p99"
    return f"{name} {_ms(known[name])} ({portion})"


def explain(phase: dict[str, Any], nodes: int) -> dict[str, str]:
    """``phase``: one entry of report.json's phases (startup figures, breakdown, queues)."""
    p99 = phase["pod_startup_s"]["p99"]
    if p99 is None:
        return {"kind": "not measured", "text": "No pod of this phase ran, so there is no startup time to explain."}
    figures = phase["breakdown"]
    kind = _verdict(phase, p99)
    machine = figures["machine"]
    if machine is not None and machine["busy"] >= SATURATED:
        kind += ", CPU-saturated"
    largest = _largest_share(figures, p99)
    slo = "met" if phase["slo_met"] else "missed" if phase["slo_met"] is False else "not measured"
    sentences = [
        f"{kind}: pod startup p99 {_ms(p99)} (SLO {phase['slo_p99_s']:g} s {slo}), "
        f"p50 {_ms(phase['pod_startup_s']['p50'])}, {phase['pods_per_s']:g} pods/s"
        + (f"; the largest part of it: {largest}." if largest else ".")
    ]
    queues = phase["queues"]
    sentences += _scheduler_sentences(figures, queues["scheduler_pending_max"], nodes)
    if queues["kcm_resource_claim_max"]:
        sentences.append(f"KCM resource_claim queue up to {queues['kcm_resource_claim_max']:g}.")
    if figures["apiserver"]:
        slowest = max(figures["apiserver"], key=lambda row: row["p99_s"] or 0.0)
        call = slowest["resource"] + (f"/{slowest['subresource']}" if slowest["subresource"] else "")
        sentences.append(
            f"Slowest API call of claims, slices, pods and leases: {slowest['verb']} {call} p99 "
            f"{_ms(slowest['p99_s'])} ({slowest['count']} call{'' if slowest['count'] == 1 else 's'})."
        )
    prepare, lag = figures["nodes"]["prepare"], figures["nodes"]["event_loop_lag"]
    if prepare["count"] or lag["count"]:
        link = figures["nodes"].get("link_wait")  # absent from reports written before it
        waited = (
            f"; {link['count']:g} pod starts first waited for the node authorizer to link their "
            f"claims, p99 {_ms(link['p99_s'])}"
            if link and link["count"]
            else ""
        )
        sentences.append(
            f"Nodes: kubelet PrepareResources p99 {_ms(prepare['p99_s'])}{waited}; "
            f"NodeHost event-loop lag p99 {_ms(lag['p99_s'])}."
        )
    machine_text = _machine_sentence(figures)
    if machine_text:
        sentences.append(machine_text)
    if figures["partial"]:
        sentences.append(f"Partial: {figures['partial']}.")
    return {"kind": kind, "text": " ".join(sentences)}
