"""How the fake kubelet's runtime resolves CDI device IDs: as a runtime's CDI cache does
(the library containerd and CRI-O use), so a driver whose specs a real node takes is not
refused on a fake one, nor the other way round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.kubeletplugin import cdi

COMMON_YAML = """---
cdiVersion: 0.3.0
kind: k8s.gpu.example.com/gpu
devices:
    - name: common
      containerEdits:
        env:
            - KUBERNETES_NODE_NAME=node-002
"""


def spec(kind: str, devices: dict[str, list[str]], env: list[str] | None = None, version: str = "0.6.0") -> str:
    return json.dumps(
        {
            "cdiVersion": version,
            "kind": kind,
            "containerEdits": {"env": env or []},
            "devices": [{"name": name, "containerEdits": {"env": e}} for name, e in devices.items()],
        }
    )


def test_yaml_specs_resolve_beside_json_ones(tmp_path: Path) -> None:
    # dra-example-driver writes a YAML spec with a "common" device every container of its
    # claims names, beside one spec per claim.
    (tmp_path / "k8s.gpu.example.com-gpu_common.yaml").write_text(COMMON_YAML)
    (tmp_path / "claim.json").write_text(spec("k8s.gpu.example.com/gpu", {"c1-gpu-0": ["GPU=gpu-0"]}, ["CLAIM=c1"]))
    env = cdi.resolve(tmp_path, ["k8s.gpu.example.com/gpu=common", "k8s.gpu.example.com/gpu=c1-gpu-0"])
    assert env == {"KUBERNETES_NODE_NAME": "node-002", "CLAIM": "c1", "GPU": "gpu-0"}


def test_files_that_are_neither_json_nor_yaml_are_not_specs(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text(COMMON_YAML)
    (tmp_path / "a.json.bak").write_text(spec("k8s.gpu.example.com/gpu", {"common": []}))
    with pytest.raises(cdi.CdiResolutionError, match=r"no spec in .* defines it"):
        cdi.resolve(tmp_path, ["k8s.gpu.example.com/gpu=common"])


def test_a_device_two_specs_define_is_a_conflict(tmp_path: Path) -> None:
    for name in ("one.json", "two.yaml"):
        (tmp_path / name).write_text(spec("a.example.com/dev", {"d0": ["X=1"]}))
    with pytest.raises(cdi.CdiResolutionError, match=r"one\.json and two\.yaml .* both define it"):
        cdi.resolve(tmp_path, ["a.example.com/dev=d0"])


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (spec("no-class", {"d0": []}), "invalid kind"),
        (spec("a.example.com/dev", {"d0": []}, version="9.9.9"), "invalid version"),
        (spec("a.example.com/dev", {}), "no devices"),
        (spec("a.example.com/dev", {"-d0": []}), "invalid device name"),
        (
            '{"cdiVersion": "0.6.0", "kind": "a.example.com/dev", "devices": [{"name": "d0"}], "extra": 1}',
            "unknown field",
        ),
        ("{not json", "cannot parse"),
    ],
)
def test_a_spec_that_does_not_validate_is_skipped_and_named(tmp_path: Path, content: str, why: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    (tmp_path / "good.json").write_text(spec("b.example.com/dev", {"d1": ["Y=2"]}))
    assert cdi.resolve(tmp_path, ["b.example.com/dev=d1"]) == {"Y": "2"}
    with pytest.raises(cdi.CdiResolutionError, match=f"spec files skipped: bad.json: {why}"):
        cdi.resolve(tmp_path, ["a.example.com/dev=d0"])


def test_spec_edits_come_once_before_each_devices_own(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(spec("a.example.com/dev", {"d0": ["A=d0"], "d1": ["B=d1"]}, ["A=spec", "B=spec"]))
    # Applied once, before the first device: d1's own B stands, and so does d0's A.
    assert cdi.resolve(tmp_path, ["a.example.com/dev=d0", "a.example.com/dev=d1"]) == {"A": "d0", "B": "d1"}


def test_the_testbeds_own_specs_validate(tmp_path: Path) -> None:
    claim = "0f6a3c1e-9a51-4f7e-8d6b-0c1a2b3c4d5e"
    device = cdi.claim_device_name(claim, "gpu-0", "share-1")
    cdi.write_claim_spec(
        tmp_path, "gpu.dra-testbed.io", claim, cdi.ClaimSpec({"C": "1"}, [cdi.CdiDevice(device, {"G": "0"})])
    )
    assert cdi.resolve(tmp_path, [cdi.device_id("gpu.dra-testbed.io", device)]) == {"C": "1", "G": "0"}
