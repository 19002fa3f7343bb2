"""The features a fake kubelet declares in its Node's status, as kubelet v1.37 declares
them from its feature gates (the scheduler filters pods and devices by them)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from testbed.kubeapi import KubeClient
from testbed.kubelet.declared import (
    SETTABLE_STAGES,
    cluster_declared_features,
    cluster_gates,
    declared_features,
    gates_in_metrics,
)
from testbed.kubelet.node import NodeSpec, node_object
from tests.unit.scripted_api import client_of

T = TypeVar("T")
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


def _asked(status: int, ask: Callable[[KubeClient], Awaitable[T]]) -> T:
    """What ``ask`` makes of an API server whose /metrics answers METRICS with ``status``."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=METRICS, status=status)

    async def served() -> T:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with client_of(app) as client:
            return await ask(client)

    return asyncio.run(served())


def test_the_api_servers_gates_are_read_and_the_defaults_taken_when_they_cannot_be() -> None:
    assert "DRAOptionalNodeOperations" in _asked(200, cluster_declared_features)
    assert _asked(403, cluster_declared_features) == DEFAULTS


def test_a_kubelet_is_told_the_api_servers_alpha_and_beta_gates_never_the_locked_ones() -> None:
    """A GA gate is locked: a kubelet told it would at best warn, so it is left out."""
    assert gates_in_metrics(METRICS, SETTABLE_STAGES) == {
        "DRAOptionalNodeOperations": True,
        "RestartAllContainersOnContainerExits": False,
    }
    assert _asked(200, cluster_gates) == {
        "DRAOptionalNodeOperations": True,
        "RestartAllContainersOnContainerExits": False,
    }
    assert _asked(403, cluster_gates) is None, "unknown: the caller keeps its defaults"


def test_a_node_registers_with_its_declared_features_and_without_the_field_when_none() -> None:
    assert node_object(NodeSpec("n", declared_features=["A", "B"]))["status"]["declaredFeatures"] == ["A", "B"]
    assert "declaredFeatures" not in node_object(NodeSpec("n"))["status"]
