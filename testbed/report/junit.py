"""JUnit XML for CI systems: one test case per phase (its SLO verdict), one for leaks."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from testbed.report.report import phase_line


def _phase_problem(phase: dict[str, Any]) -> str:
    """Why a phase fails, or "" when its SLO was met."""
    if phase["slo_met"] is True:
        return ""
    if phase["slo_met"] is None:
        return f"not measured: {phase['pods_running']}/{phase['pods_expected']} pods ran before the run ended"
    if phase["pods_running"] < phase["pods_expected"] or phase["unschedulable"]:
        not_started = phase.get("pods_not_started", 0)
        return (
            f"{phase['pods_expected'] - phase['pods_running']} of {phase['pods_expected']} pods never ran "
            f"({phase['unschedulable']} unschedulable"
            + (f", {not_started} on a node but never started)" if not_started else ")")
        )
    return f"pod startup p99 {phase['pod_startup_s']['p99']} s exceeds the SLO of {phase['slo_p99_s']} s"


def junit_xml(report: dict[str, Any]) -> str:
    scenario = f"dra-testbed.{report['scenario']}"
    suite = ET.Element("testsuite", name=scenario, timestamp=report["started"], time=f"{report['duration_s']:.2f}")
    failures = 0
    for phase in report["phases"]:
        case = ET.SubElement(suite, "testcase", classname=scenario, name=phase["name"], time=f"{phase['duration_s']}")
        problem = _phase_problem(phase)
        if problem:
            failures += 1
            ET.SubElement(case, "failure", message=problem, type="slo").text = report.get("error") or phase.get(
                "bottleneck", {}
            ).get("text", "")
        out = [phase_line(phase), phase.get("bottleneck", {}).get("text", "")]
        ET.SubElement(case, "system-out").text = "\n".join(filter(None, out))
    leaks = report["leaks"]
    case = ET.SubElement(suite, "testcase", classname=scenario, name="leak-check", time="0")
    if not leaks["ok"]:
        failures += 1
        ET.SubElement(
            case, "failure", message="the run left prepared state behind", type="leak"
        ).text = f"{leaks['checkpoint_entries']} checkpoint entries, {leaks['cdi_specs']} CDI specs"
    suite.set("tests", str(len(report["phases"]) + 1))
    suite.set("failures", str(failures))
    suite.set("errors", "1" if report.get("error") else "0")
    if report.get("error"):
        ET.SubElement(suite, "system-err").text = report["error"]
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
