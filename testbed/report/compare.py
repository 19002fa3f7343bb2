"""Two runs side by side, phase by phase, and the regressions a CI job fails on.

A run is a report directory (or its report.json). Phases are matched by name. Each
figure knows which way is worse, so one threshold reads the same for every figure: a
ratio of 1.2 fails when B is more than 20% worse than A.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError


@dataclass(frozen=True)
class Figure:
    read: Callable[[dict[str, Any]], float | None]
    unit: str
    higher_is_worse: bool = True


def _at(*keys: str) -> Callable[[dict[str, Any]], float | None]:
    def read(phase: dict[str, Any]) -> float | None:
        value: Any = phase
        for key in keys:
            if not isinstance(value, dict) or value.get(key) is None:
                return None
            value = value[key]
        return float(value)

    return read


def _cpu_total(phase: dict[str, Any]) -> float | None:
    cpu = phase.get("breakdown", {}).get("cpu_seconds", {})
    values = [v for v in cpu.values() if v is not None]
    return sum(values) if values else None


FIGURES: dict[str, Figure] = {
    "startup_p50": Figure(_at("pod_startup_s", "p50"), "s"),
    "startup_p99": Figure(_at("pod_startup_s", "p99"), "s"),
    "pods_per_s": Figure(_at("pods_per_s"), "pods/s", higher_is_worse=False),
    "unschedulable": Figure(_at("unschedulable"), "pods"),
    "scheduling_sli_p99": Figure(_at("breakdown", "scheduler", "sli_duration", "p99_s"), "s"),
    "scheduling_attempt_p99": Figure(_at("breakdown", "scheduler", "attempt_duration", "p99_s"), "s"),
    "scheduler_pending_max": Figure(_at("queues", "scheduler_pending_max"), "pods"),
    "kcm_queue_max": Figure(_at("queues", "kcm_resource_claim_max"), "claims"),
    "prepare_p99": Figure(_at("breakdown", "nodes", "prepare", "p99_s"), "s"),
    "cpu_seconds": Figure(_cpu_total, "CPU-s"),
    **{
        f"cpu_{component}": Figure(_at("breakdown", "cpu_seconds", component), "CPU-s")
        for component in ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "nodehosts")
    },
}


def load(path: Path) -> dict[str, Any]:
    file = path / "report.json" if path.is_dir() else path
    if not file.exists():
        raise TestbedError(f"no report at {file}", hint="give a directory `testbed run` printed, or its report.json")
    try:
        report: dict[str, Any] = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise TestbedError(f"{file} is not a readable report ({exc})") from None
    if not isinstance(report, dict) or "phases" not in report:
        raise TestbedError(f"{file} has no phases: not a report of `testbed run`")
    missing = [key for key in REPORT_KEYS if key not in report]
    phases = report["phases"]
    if not isinstance(phases, list) or not all(isinstance(p, dict) and "name" in p for p in phases):
        missing.append("phases[].name")
    if missing:
        raise TestbedError(
            f"{file} lacks {', '.join(missing)}: not a report of `testbed run`",
            hint="give a directory `testbed run` printed, or its report.json",
        )
    return report


REPORT_KEYS = ("scenario", "verdict", "started")
"""What the comparison reads of a report besides its phases."""


def parse_thresholds(items: tuple[str, ...]) -> dict[str, float]:
    """``startup_p99=1.2`` -> {"startup_p99": 1.2}; names and ratios checked."""
    thresholds = {}
    for item in items:
        name, sep, value = item.partition("=")
        if name not in FIGURES:
            raise TestbedError(f"--fail-if {item!r}: no figure named {name!r}", hint=f"use one of {', '.join(FIGURES)}")
        try:
            ratio = float(value) if sep else float("nan")
        except ValueError:
            ratio = float("nan")
        if not ratio >= 1.0:
            raise TestbedError(
                f"--fail-if {item!r}: the ratio must be a number of at least 1",
                hint="e.g. --fail-if startup_p99=1.2 fails when B's p99 is more than 20% above A's",
            )
        thresholds[name] = ratio
    return thresholds


def worse_by(figure: Figure, a: float | None, b: float | None) -> float | None:
    """How many times worse B is than A (1.0 the same, below 1 better); None if unknown."""
    if a is None or b is None:
        return None
    worse, better = (b, a) if figure.higher_is_worse else (a, b)
    if better == 0:
        return 1.0 if worse == 0 else float("inf")
    return worse / better


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, list) and value:
        flat = {}
        for i, item in enumerate(value):  # a pool's count, not the whole pool, when that is what differs
            flat.update(_flatten(item, f"{prefix}[{i}]" if prefix else str(i)))
        return flat
    return {prefix: value}


def setting_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs in how the two runs were set up: scenario, cluster, fleet, settings."""
    lines = []
    if a["scenario"] != b["scenario"]:
        lines.append(f"scenario: {a['scenario']} -> {b['scenario']}")
    first, second = _flatten(a.get("cluster", {}), "cluster"), _flatten(b.get("cluster", {}), "cluster")
    for key in sorted(set(first) | set(second)):
        if key != "cluster.name" and first.get(key) != second.get(key):
            lines.append(f"{key}: {first.get(key)} -> {second.get(key)}")
    for key in ("nodes", "slices"):
        if a.get(key) != b.get(key):
            lines.append(f"{key}: {a.get(key)} -> {b.get(key)}")
    return lines


@dataclass
class Comparison:
    lines: list[str]
    regressions: list[str]


def _format(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def compare(a: dict[str, Any], b: dict[str, Any], thresholds: dict[str, float]) -> Comparison:
    lines = [
        f"A: {a['scenario']} {a['verdict']} ({a['started']})",
        f"B: {b['scenario']} {b['verdict']} ({b['started']})",
    ]
    differences = setting_differences(a, b)
    lines += ["settings that differ:", *(f"  {d}" for d in differences)] if differences else ["same settings"]
    regressions = []
    phases_b = {p["name"]: p for p in b["phases"]}
    for phase_a in a["phases"]:
        phase_b = phases_b.get(phase_a["name"])
        if phase_b is None:
            lines.append(f"phase {phase_a['name']}: only in A")
            continue
        lines += [f"phase {phase_a['name']}:", f"  {'figure':<30}{'unit':<8}{'A':>12}{'B':>12}{'worse by':>10}"]
        for name, figure in FIGURES.items():
            first, second = figure.read(phase_a), figure.read(phase_b)
            if first is None and second is None:
                continue
            ratio = worse_by(figure, first, second)
            flag = ""
            if name in thresholds and ratio is not None and ratio > thresholds[name]:
                flag = "  REGRESSION"
                regressions.append(
                    f"{phase_a['name']}: {name} {_format(first)} -> {_format(second)} "
                    f"({ratio:.2f}x worse, allowed {thresholds[name]:g}x)"
                )
            shown = "" if ratio is None else f"{ratio:.2f}x"
            lines.append(f"  {name:<30}{figure.unit:<8}{_format(first):>12}{_format(second):>12}{shown:>10}{flag}")
        if "bottleneck" in phase_a or "bottleneck" in phase_b:
            kinds = [p.get("bottleneck", {}).get("kind", "n/a") for p in (phase_a, phase_b)]
            lines.append(f"  bottleneck: {kinds[0]} -> {kinds[1]}")
    lines += [f"phase {name}: only in B" for name in phases_b if name not in {p["name"] for p in a["phases"]}]
    return Comparison(lines, regressions)
