from pathlib import Path

import pytest

from testbed import config
from testbed.errors import TestbedError


def test_feature_gates_parse_and_name_their_source() -> None:
    assert config.parse_feature_gates("A=true, B=False,", "x") == {"A": True, "B": False}
    with pytest.raises(TestbedError) as info:
        config.parse_feature_gates("A=yes", "--feature-gates")
    assert "--feature-gates" in str(info.value) and "'A=yes'" in str(info.value)


def test_beta_gates_always_on_and_alpha_only_when_asked() -> None:
    plain = config.ControlPlaneConfig()
    assert plain.feature_gates()["DRAPartitionableDevices"] is True
    assert "DRADeviceCompatibilityGroups" not in plain.feature_gates()
    assert plain.runtime_config() == "scheduling.k8s.io/v1beta1=true"  # for GenericWorkload
    no_workload = config.ControlPlaneConfig(extra_feature_gates={"GenericWorkload": False})
    assert no_workload.runtime_config() is None
    alpha = config.ControlPlaneConfig(alpha=True)
    assert alpha.feature_gates()["DRADeviceCompatibilityGroups"] is True
    assert alpha.runtime_config() == "api/alpha=true,api/beta=true"


def test_environment_gates_and_alpha_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_FEATURE_GATES", "DRAConsumableCapacity=false,Extra=true")
    monkeypatch.setenv("TESTBED_ALPHA", "1")
    loaded = config.ControlPlaneConfig.from_env(extra_feature_gates={"Extra": False})
    gates = loaded.feature_gates()
    assert gates["DRAConsumableCapacity"] is False
    assert gates["Extra"] is False  # the command line wins over the environment
    assert gates["DRAResourcePoolStatus"] is True


def test_paths_follow_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TESTBED_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "s"))
    assert config.binaries_cache_dir().parent == tmp_path / "c"
    assert config.ControlPlaneConfig(name="x").cluster_dir == tmp_path / "s" / "clusters" / "x"


def test_scheduler_knobs_reach_its_config_file_only_when_set(tmp_path: Path) -> None:
    import yaml

    from testbed.config import ControlPlaneConfig
    from testbed.controlplane.components import Layout, write_scheduler_config

    layout = Layout(tmp_path)
    plain = yaml.safe_load(write_scheduler_config(layout, ControlPlaneConfig()).read_text())
    assert "percentageOfNodesToScore" not in plain and "parallelism" not in plain, "the scheduler's defaults stay"
    tuned = ControlPlaneConfig(percentage_of_nodes_to_score=10, scheduler_parallelism=4)
    document = yaml.safe_load(write_scheduler_config(layout, tuned).read_text())
    assert document["percentageOfNodesToScore"] == 10 and document["parallelism"] == 4
    assert tuned.tunables()["percentageOfNodesToScore"] == 10
    assert "profiles" not in plain
    waiting = yaml.safe_load(write_scheduler_config(layout, ControlPlaneConfig(binding_timeout_s=30)).read_text())
    [profile] = waiting["profiles"]
    assert profile["schedulerName"] == "default-scheduler"
    assert profile["pluginConfig"] == [{"name": "DynamicResources", "args": {"bindingTimeout": "30s"}}]


def test_connection_health_check_follows_client_gos_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", raising=False)
    monkeypatch.delenv("HTTP2_PING_TIMEOUT_SECONDS", raising=False)
    assert config.connection_health_check() == (30, 15)
    monkeypatch.setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "4")
    monkeypatch.setenv("HTTP2_PING_TIMEOUT_SECONDS", "2")
    assert config.connection_health_check() == (4, 2)
    monkeypatch.setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "0")
    assert config.connection_health_check() is None, "0 turns the check off, as in client-go"
    monkeypatch.setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "soon")
    with pytest.raises(TestbedError, match="HTTP2_READ_IDLE_TIMEOUT_SECONDS='soon'"):
        config.connection_health_check()
