"""The features a fake kubelet declares in its Node's status, as kubelet v1.37 declares
them from its feature gates (the scheduler filters pods and devices by them)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from testbed.kubelet.declared import cluster_declared_features, declared_features, gates_in_metrics
from testbed.kubelet.node import NodeSpec, node_object
from tests.unit.scripted_api import client_of

DEFAULTS = [
    "ExtendWebSocketsToKubelet",
    "InPlacePodLevelResourcesVerticalScaling",
    "InPlacePodVerticalScalingInitContainers",
    "RestartAllContainersOnContainerExits",
]

METRICS = """# HELP kubernetes_feature_enabled [BETA] ...
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="DRAOptionalNodeOperations",stage="ALPHA"} 1
kubernetes_feature_enabled{stage="BETA",name="RestartAllContainersOnContainerExits"} 0
kubernetes_feature_enabled{name="SomethingElse",stage="GA"} 1
apiserver_request_total{code="200",name="x"} 5
"""


def test_declared_features_follow_the_gates_sorted_and_the_rest_at_their_defaults() -> None:
    assert declared_features({}) == DEFAULTS
    gates = gates_in_metrics(METRICS)
    assert gates == {
        "DRAOptionalNodeOperations": True,
        "RestartAllContainersOnContainerExits": False,
        "SomethingElse": True,
    }
    declared = declared_features(gates)
    assert declared == sorted(declared)
    assert "DRAOptionalNodeOperations" in declared and "RestartAllContainersOnContainerExits" not in declared
    assert "SomethingElse" not in declared, "only features of the kubelet's registry are declared"


def test_the_api_servers_gates_are_read_and_the_defaults_taken_when_they_cannot_be() -> None:
    async def declared(status: int) -> list[str]:
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=METRICS, status=status)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with client_of(app) as client:
            return await cluster_declared_features(client)

    assert "DRAOptionalNodeOperations" in asyncio.run(declared(200))
    assert asyncio.run(declared(403)) == DEFAULTS


def test_a_node_registers_with_its_declared_features_and_without_the_field_when_none() -> None:
    assert node_object(NodeSpec("n", declared_features=["A", "B"]))["status"]["declaredFeatures"] == ["A", "B"]
    assert "declaredFeatures" not in node_object(NodeSpec("n"))["status"]
