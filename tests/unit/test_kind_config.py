"""The kind config and the deployment files agree with what the testbed runs locally."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from testbed.config import BETA_DRA_GATES, GATE_APIS
from testbed.controlplane.components import POD_CLUSTER_CIDR
from testbed.drivers import deviceclasses

ROOT = Path(__file__).resolve().parents[2]
KIND_CONFIG = ROOT / "kind-configs" / "dra-testbed.yaml"
NODE_IMAGE = re.compile(r"^kindest/node:v1\.37\.\d+@sha256:[0-9a-f]{64}$")


def test_kind_config_parses_and_pins_a_1_37_node_image_by_digest() -> None:
    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker"]
    for node in config["nodes"]:
        assert NODE_IMAGE.match(node["image"]), node["image"]


def test_kind_config_turns_on_the_same_dra_gates_and_apis_as_the_local_control_plane() -> None:
    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert {gate for gate, on in config["featureGates"].items() if on} >= set(BETA_DRA_GATES)
    assert {api for api, on in config["runtimeConfig"].items() if on == "true"} >= set(GATE_APIS.values())


def test_kind_config_enables_cdi_and_sets_the_controller_manager_qps_floor() -> None:
    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert any("enable_cdi = true" in patch for patch in config["containerdConfigPatches"])
    [control_plane] = [n for n in config["nodes"] if n["role"] == "control-plane"]
    patches = [yaml.safe_load(p) for p in control_plane["kubeadmConfigPatches"]]
    [cluster] = [p for p in patches if p["kind"] == "ClusterConfiguration"]
    kcm = cluster["controllerManager"]["extraArgs"]
    assert float(kcm["kube-api-qps"]) >= 75 and int(kcm["kube-api-burst"]) >= 150


def test_kind_gives_nodes_pod_cidrs_from_the_local_control_planes_range() -> None:
    """A /24 per Node, from room for thousands of synthetic nodes, not kind's 256."""
    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert config["networking"]["podSubnet"] == POD_CLUSTER_CIDR


def test_deployed_device_classes_are_the_ones_testbed_up_installs() -> None:
    assert (ROOT / "deploy" / "deviceclasses.yaml").read_text() == deviceclasses.render(), (
        "regenerate it: python -m testbed.drivers.deviceclasses > deploy/deviceclasses.yaml"
    )


def test_driver_image_requirements_match_the_project_pins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = (ROOT / "deploy" / "driver-requirements.txt").read_text().splitlines()
    wanted = [line for line in lines if line and not line.startswith("#")]
    assert wanted and set(wanted) <= set(project)


def _name(requirement: str) -> str:
    return re.split(r"[<>=~!\[ ;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def _with_dependencies(names: set[str]) -> set[str]:
    """The distributions pip installs for ``names`` (their non-optional requirements too)."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        try:
            requirements = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement for other Pythons or platforms
        found.add(name)
        for requirement in requirements:
            if "extra ==" not in requirement:
                todo.append(_name(requirement))
    return found


IMAGE_PROBE = """
import importlib.metadata, json, sys
installed = set(json.loads(sys.argv[1]))
owners = importlib.metadata.packages_distributions()
norm = lambda d: d.lower().replace("_", "-").replace(".", "-")
class NotInTheImage:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        dists = owners.get(top)
        if top in ("testbed", "fake_devices") or not dists or any(norm(d) in installed for d in dists):
            return None
        raise ModuleNotFoundError(f"{top} (from {dists}) is not installed in the driver image", name=top)
sys.meta_path.insert(0, NotInTheImage())
import testbed.drivers.main
"""


def test_the_driver_imports_nothing_its_image_does_not_install() -> None:
    """Import the driver as if only what the image installs were there (the package
    itself with --no-deps, plus driver-requirements.txt and their dependencies)."""
    lines = (ROOT / "deploy" / "driver-requirements.txt").read_text().splitlines()
    installed = _with_dependencies({_name(line) for line in lines if line and not line.startswith("#")})
    probe = subprocess.run(
        [sys.executable, "-c", IMAGE_PROBE, json.dumps(sorted(installed))], capture_output=True, text=True, cwd=ROOT
    )
    assert probe.returncode == 0, probe.stderr[-2000:]


def test_the_image_runs_the_console_script_the_daemonset_names() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    daemonset = next(
        d for d in yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text()) if d["kind"] == "DaemonSet"
    )
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert container["command"] == ["testbed-driver"] and scripts["testbed-driver"] == "testbed.drivers.main:main"
    assert 'ENTRYPOINT ["testbed-driver"]' in dockerfile
    assert re.search(r"^ARG BASE=python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}$", dockerfile, re.M)
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert container["livenessProbe"]["grpc"]["port"] == 51515
    assert daemonset["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"


def test_e2e_on_kind_says_what_is_missing_when_docker_and_kind_are_not_there(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "e2e_kind.py")],
        env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "docker and kind not found on PATH" in result.stderr and "plain `make e2e` needs neither" in result.stderr
