"""Driver-side metrics. The kubelet's own DRA metrics (named and labelled as the real
kubelet's, so the cluster-admin guide's PromQL works unchanged) are in
testbed/kubelet/metrics.py; these say what the driver itself saw."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Finer than the kubelet's 0.1..40 s range so millisecond targets (10 ms, 20 ms) can be
# read off them; same names.
DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    20,
    40,
)

GRPC_SERVED = Histogram(
    "dra_testbed_driver_grpc_duration_seconds",
    "Duration in seconds of the DRA gRPC calls as the driver served them (the kubelet's "
    "dra_grpc_operations_duration_seconds times them as it made them, transport included)",
    ["driver_name", "method_name", "grpc_status_code"],
    buckets=DURATION_BUCKETS,
)
PREPARED_CLAIMS = Gauge("dra_testbed_prepared_claims", "Claims currently prepared, per driver", ["driver_name"])
CLAIM_ERRORS = Counter(
    "dra_testbed_claim_errors_total",
    "Claims that failed to prepare or unprepare, by reason",
    ["driver_name", "operation", "reason"],
)
CHECKPOINT_CORRUPTIONS = Counter(
    "dra_testbed_checkpoint_corruptions_total",
    "Checkpoint files found unreadable and set aside",
    ["driver_name"],
)
SLICE_WRITES = Counter(
    "dra_testbed_resourceslice_writes_total",
    "ResourceSlice create/update/delete calls",
    ["driver_name"],
)
CLAIM_LOOKUPS = Counter(
    "dra_testbed_claim_lookups_total",
    "ResourceClaims NodePrepareResources read (source: api, one GET per claim)",
    ["source"],
)
