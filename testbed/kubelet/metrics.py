"""Kubelet-side metrics, named and labelled as the real kubelet's."""

from __future__ import annotations

from prometheus_client import Histogram

from testbed.kubeletplugin.metrics import DURATION_BUCKETS

OPERATIONS = Histogram(
    "dra_operations_duration_seconds",
    "Duration in seconds of handling all ResourceClaims of a pod when it starts (PrepareResources) "
    "or stops (UnprepareResources)",
    ["operation_name", "is_error"],
    buckets=DURATION_BUCKETS,
)
