"""Kubelet-side metrics, named and labelled as the real kubelet's."""

from __future__ import annotations

import weakref
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from testbed.kubeletplugin.metrics import DURATION_BUCKETS

OPERATIONS = Histogram(
    "dra_operations_duration_seconds",
    "Duration in seconds of handling all ResourceClaims of a pod when it starts (PrepareResources) "
    "or stops (UnprepareResources)",
    ["operation_name", "is_error"],
    buckets=DURATION_BUCKETS,
)
CLAIM_READ_RETRIES = Counter(
    "dra_testbed_kubelet_claim_read_retries_total",
    "Claim reads the fake kubelet made again because the node authorizer had not yet linked a "
    "newly bound pod's claims to the node (a real kubelet reads later, after mounting volumes)",
)
GRPC_OPERATIONS = Histogram(
    "dra_grpc_operations_duration_seconds",
    "Duration in seconds of each DRA gRPC call the kubelet made to a driver, by its full method name "
    "and the status it ended with",
    ["driver_name", "method_name", "grpc_status_code"],
    buckets=DURATION_BUCKETS,
)
LINK_WAITS = Histogram(
    "dra_testbed_kubelet_claim_link_wait_seconds",
    "How long a pod start waited, before PrepareResources, for the node authorizer to link its "
    "claims to the node (pods that waited only; it stands in for the kubelet's volume mount)",
    buckets=DURATION_BUCKETS,
)
PREPARE_SKIPS = Counter(
    "dra_node_prepare_skips_total",
    "NodePrepareResources calls not made: every device of the driver in the claim skips them (skipNodeOperations)",
    ["driver_name"],
)
UNPREPARE_SKIPS = Counter(
    "dra_node_unprepare_skips_total",
    "NodeUnprepareResources calls not made: every device of the driver in the claim skips them (skipNodeOperations)",
    ["driver_name"],
)
ADMISSION_REJECTIONS = Counter(
    "kubelet_admission_rejections_total",
    "Cumulative number pod admission rejections by the Kubelet.",
    ["reason"],
)
STARTED_CONTAINER_ERRORS = Counter(
    "kubelet_started_containers_errors_total",
    "Cumulative number of errors when starting containers",
    ["container_type", "code"],
)
"""Counted for the starts the fake kubelet fails: images not pulled (ErrImagePull,
ImagePullBackOff), by container type (container, init_container)."""
ANY_DRIVER = "<any>"
"""The kubelet's driver_name for claims counted once, whatever drivers they use."""


class ClaimBook(Protocol):
    def prepared_drivers(self) -> Iterable[list[str]]:
        """For each prepared claim, the drivers it uses."""
        ...


class ClaimsInUse(Collector):
    """``dra_resource_claims_in_use{driver_name}``, counted when scraped as the kubelet
    counts it: prepared claims by driver, and every prepared claim once under ``<any>``.
    Summed over the kubelets of this process (a NodeHost's are one fleet's share)."""

    def __init__(self) -> None:
        self.books: weakref.WeakSet[ClaimBook] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts: Tally[str] = Tally()
        for book in list(self.books):
            for drivers in book.prepared_drivers():
                counts[ANY_DRIVER] += 1
                counts.update(drivers)
        family = GaugeMetricFamily(
            "dra_resource_claims_in_use",
            f"The number of ResourceClaims in use on the node by driver, and across all drivers ({ANY_DRIVER})",
            labels=["driver_name"],
        )
        counts.setdefault(ANY_DRIVER, 0)
        for driver, count in sorted(counts.items()):
            family.add_metric([driver], count)
        yield family


CLAIMS_IN_USE = ClaimsInUse()
REGISTRY.register(CLAIMS_IN_USE)
