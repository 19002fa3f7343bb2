"""Scenario files and the report's arithmetic."""

from pathlib import Path

import pytest

from testbed.report.metrics import Scrape, quantile
from testbed.scenarios import spec
from testbed.scenarios.runner import count_devices


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


def test_scrapes_of_several_hosts_add_up() -> None:
    total = Scrape.parse('c_total{x="a"} 2\n')
    total.merge(Scrape.parse('c_total{x="a"} 3\nc_total{x="b"} 1\n'))
    assert total.value("c_total", {"x": "a"}) == 5 and total.value("c_total", {}) == 6
