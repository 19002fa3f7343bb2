"""A run's report sets the fake kubelets' figures beside its real kubelets' own."""

from __future__ import annotations

from testbed.realnode.kubelet_api import reference_lines
from testbed.report.metrics import Scrape, fleet_increase
from testbed.report.reference import kubelet_reference, reference_lines_md

REAL_KUBELET = """\
# HELP dra_operations_duration_seconds [ALPHA] Latency histogram
# TYPE dra_operations_duration_seconds histogram
dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="0.1"} 2
dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="+Inf"} 2
dra_operations_duration_seconds_sum{is_error="false",operation_name="PrepareResources"} 0.06
dra_operations_duration_seconds_count{is_error="false",operation_name="PrepareResources"} 2
# HELP dra_resource_claims_in_use [ALPHA] claims
# TYPE dra_resource_claims_in_use gauge
dra_resource_claims_in_use{driver_name="<any>"} 1
kubelet_running_pods 3
"""


def fake_kubelets(count: int, total_s: float) -> str:
    labels = 'is_error="false",operation_name="PrepareResources"'
    return (
        "# TYPE dra_operations_duration_seconds histogram\n"
        f'dra_operations_duration_seconds_bucket{{{labels},le="+Inf"}} {count}\n'
        f"dra_operations_duration_seconds_sum{{{labels}}} {total_s}\n"
        f"dra_operations_duration_seconds_count{{{labels}}} {count}\n"
    )


def test_a_real_kubelets_dra_histograms_are_renamed_and_labelled_with_their_node() -> None:
    lines = reference_lines("real-0", REAL_KUBELET)
    assert len(lines) == 4, lines  # the histogram's samples; no gauge, no other family, no comments
    assert lines[0] == (
        'real_kubelet:dra_operations_duration_seconds_bucket{node="real-0",is_error="false",'
        'operation_name="PrepareResources",le="0.1"} 2'
    )
    assert reference_lines("real-0", "dra_operations_duration_seconds_count 5") == [
        'real_kubelet:dra_operations_duration_seconds_count{node="real-0"} 5'
    ]


def test_the_report_compares_fake_and_real_kubelets_by_count_and_mean_over_the_run() -> None:
    """Two real nodes and the host's fake kubelets, as a NodeHost's metrics carry them:
    what each counted during the run, never the two kinds summed."""
    start = Scrape.parse(fake_kubelets(10, 0.5))
    references = reference_lines("real-0", REAL_KUBELET) + reference_lines("real-1", REAL_KUBELET)
    end = Scrape.parse(fake_kubelets(14, 0.7) + "\n".join(references) + "\n")
    run, partial = fleet_increase([start], [end])
    assert partial == ""
    reference = kubelet_reference(run)
    assert reference is not None and reference["real_nodes"] == 2
    prepare = reference["figures"]["PrepareResources"]
    assert prepare["fake"] == {"count": 4, "mean_s": 0.05}
    assert prepare["real"] == {"count": 4, "mean_s": 0.03}
    assert "| PrepareResources | 4, 50.0 ms | 4, 30.0 ms | 1.67x |" in reference_lines_md(reference)
    assert reference["figures"]["UnprepareResources"]["real"] == {"count": 0, "mean_s": None}


def test_no_real_kubelet_no_reference() -> None:
    run, _ = fleet_increase([Scrape()], [Scrape.parse(fake_kubelets(3, 0.1))])
    assert kubelet_reference(run) is None and reference_lines_md(None) == []


def test_a_real_kubelet_restarted_during_the_run_counts_from_zero_and_the_report_says_so() -> None:
    """Its NodeHost did not restart, but the kubelet's histograms fell back to zero: what
    it counted since is the run's share (as Prometheus's increase() reads a reset), never
    a negative count, and the figures are marked partial, naming the node."""
    start = Scrape.parse(fake_kubelets(10, 0.5) + "\n".join(reference_lines("real-0", REAL_KUBELET)) + "\n")
    restarted = REAL_KUBELET.replace("} 2", "} 1").replace("0.06", "0.04")
    steady = reference_lines("real-1", REAL_KUBELET)
    end = Scrape.parse(fake_kubelets(14, 0.7) + "\n".join(reference_lines("real-0", restarted) + steady) + "\n")
    run, partial = fleet_increase([start], [end])
    reference = kubelet_reference(run)
    assert reference is not None
    assert reference["figures"]["PrepareResources"]["real"] == {"count": 3, "mean_s": round(0.1 / 3, 5)}
    assert reference["figures"]["PrepareResources"]["fake"] == {"count": 4, "mean_s": 0.05}
    assert 'real_kubelet:dra_operations_duration_seconds{node="real-0"}' in partial
    assert "real-1" not in partial
