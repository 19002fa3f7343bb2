"""The features a kubelet v1.37 declares in its Node's ``status.declaredFeatures``
(NodeDeclaredFeatures, GA and always on in 1.37).

The scheduler places a pod that needs one of them only on a node that declares it, and
allocates a device of a ResourceSlice with ``skipNodeOperations`` only on a node that
declares DRAOptionalNodeOperations. A kubelet declares each feature its own feature gate
turns on (component-helpers' nodedeclaredfeatures registry, v0.37.1), sorted, as the
API server's validation wants them. A fake kubelet takes its gates from the cluster's
API server, as a kubelet is configured with the same gates as its control plane.
"""

from __future__ import annotations

import logging
import re

from testbed.kubeapi import KubeClient

log = logging.getLogger(__name__)

BY_GATE: dict[str, bool] = {
    "DRANodeAllocatableResources": False,
    "DRAOptionalNodeOperations": False,
    "ExtendWebSocketsToKubelet": True,
    "InPlacePodLevelResourcesVerticalScaling": True,
    "InPlacePodVerticalScalingInitContainers": True,
    "InPlacePodVerticalScalingMemoryBackedVolumes": False,
    "RestartAllContainersOnContainerExits": True,
}
"""Each feature declared when the gate of its name is on; Kubernetes 1.37's defaults.
UserNamespacesHostNetworkSupport and VolumeBindMountOptions are declared only when the
container runtime supports them too: a fake kubelet runs no containers."""

_GATE_SAMPLE = re.compile(r"^kubernetes_feature_enabled\{([^}]*)\} ([0-9.e+-]+)$", re.M)
_LABEL = re.compile(r'\b(name|stage)="([^"]*)"')
SETTABLE_STAGES = ("ALPHA", "BETA")
"""Stages whose gates a component may be told; GA and deprecated ones are locked."""


def declared_features(gates: dict[str, bool]) -> list[str]:
    """What a kubelet with these gates (the rest at their defaults) declares."""
    return sorted(feature for feature, default in BY_GATE.items() if gates.get(feature, default))


def gates_in_metrics(text: str, stages: tuple[str, ...] | None = None) -> dict[str, bool]:
    """The gates a component's /metrics reports (``kubernetes_feature_enabled``); only
    those of these ``stages`` if given."""
    gates = {}
    for labels, value in _GATE_SAMPLE.findall(text):
        named = dict(_LABEL.findall(labels))
        if "name" in named and (stages is None or named.get("stage") in stages):
            gates[named["name"]] = float(value) == 1.0
    return gates


async def cluster_gates(client: KubeClient) -> dict[str, bool] | None:
    """The alpha and beta gates as the API server runs them, for a kubelet to be started
    with, as a cluster's kubelets are configured with their control plane's gates (kind
    passes its config's to every component). None when its /metrics cannot be read."""
    try:
        return gates_in_metrics(await client.get_text("/metrics"), SETTABLE_STAGES)
    except Exception as exc:  # any failure: the caller keeps its defaults
        log.info("cannot read the API server's feature gates (%s)", exc)
        return None


async def cluster_declared_features(client: KubeClient) -> list[str]:
    """What a kubelet with the API server's gates declares; with Kubernetes' defaults
    when the API server's /metrics cannot be read (the credentials may not allow it)."""
    try:
        gates = gates_in_metrics(await client.get_text("/metrics"))
    except Exception as exc:  # any failure: the defaults are what an unconfigured kubelet has
        log.info("cannot read the API server's feature gates (%s); declaring the defaults' features", exc)
        gates = {}
    return declared_features(gates)
