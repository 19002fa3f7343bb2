"""The fake kubelets' own figures beside the real kubelets' of the same run.

A fleet with `kubelet: real` pools runs upstream kubelets next to the fake ones, under the
same scheduler, driver and workload; their NodeHosts pass on each real kubelet's DRA
histograms (renamed, see realnode/kubelet_api.py). Their buckets differ (the real
kubelet's start at 0.1 s), so the two are compared by count and mean, never summed.
"""

from __future__ import annotations

from typing import Any

from testbed.realnode.kubelet_api import REFERENCE_PREFIX
from testbed.report.metrics import Scrape

DRA_V1_METHODS = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
"""What a kubelet's gRPC metrics call the DRA v1 methods, less the method's own name."""
FIGURES = (
    ("PrepareResources", "dra_operations_duration_seconds", {"operation_name": "PrepareResources"}),
    ("UnprepareResources", "dra_operations_duration_seconds", {"operation_name": "UnprepareResources"}),
    (
        "NodePrepareResources",
        "dra_grpc_operations_duration_seconds",
        {"method_name": DRA_V1_METHODS + "NodePrepareResources"},
    ),
    (
        "NodeUnprepareResources",
        "dra_grpc_operations_duration_seconds",
        {"method_name": DRA_V1_METHODS + "NodeUnprepareResources"},
    ),
)


def _figure(scrape: Scrape, name: str, match: dict[str, str]) -> dict[str, Any]:
    count = scrape.value(f"{name}_count", match)
    total = scrape.value(f"{name}_sum", match)
    return {"count": round(count), "mean_s": round(total / count, 5) if count else None}


def kubelet_reference(fleet: Scrape) -> dict[str, Any] | None:
    """Count and mean of each kubelet-side figure over the run, fake and real; None when
    no real kubelet counted anything (no `kubelet: real` nodes, or no pod reached them)."""
    rows = {
        label: {
            "fake": _figure(fleet, name, match),
            "real": _figure(fleet, REFERENCE_PREFIX + name, match),
        }
        for label, name, match in FIGURES
    }
    if not any(row["real"]["count"] for row in rows.values()):
        return None
    real_nodes = {
        dict(labels).get("node", "")
        for labels in fleet.samples.get(f"{REFERENCE_PREFIX}dra_operations_duration_seconds_count", {})
    }
    return {"real_nodes": len(real_nodes), "figures": rows}


def reference_lines_md(reference: dict[str, Any] | None) -> list[str]:
    """report.md's table of the two side by side (nothing without a reference)."""
    if reference is None:
        return []
    lines = [
        f"## Fake kubelets beside the {reference['real_nodes']} real kubelet(s) of this run",
        "",
        "Counts and means over the run; the real kubelet's histogram buckets start at 0.1 s, so only "
        "means compare. Pods land where the scheduler puts them, a few on real nodes making a thin reference; "
        "a phase with `nodeSelector: {dra-testbed.io/kubelet: real}` sends its pods there.",
        "",
        "| kubelet-side figure | fake: count, mean | real: count, mean | fake/real |",
        "|---|---|---|---|",
    ]
    for label, row in reference["figures"].items():
        fake, real = row["fake"], row["real"]
        ratio = f"{fake['mean_s'] / real['mean_s']:.2f}x" if fake["mean_s"] and real["mean_s"] else "n/a"
        lines.append(f"| {label} | {_cell(fake)} | {_cell(real)} | {ratio} |")
    return [*lines, ""]


def _cell(figure: dict[str, Any]) -> str:
    mean = figure["mean_s"]
    return f"{figure['count']}, " + ("n/a" if mean is None else f"{mean * 1000:.1f} ms")
