"""Every label, annotation and taint key the testbed puts on Kubernetes objects, once."""

SYNTHETIC = "dra-testbed.io/synthetic"
"""Label (value "true") and NoSchedule taint key of every synthetic node."""
PROFILE_LABEL = "dra-testbed.io/profile"
"""On a synthetic node: its hardware profile."""
KUBELET_LABEL = "dra-testbed.io/kubelet"
"""On a synthetic node: which kubelet serves it, ``fake`` or ``real`` (a scenario phase's
nodeSelector can send its pods to the real ones, the reference)."""
SLICE_NODE_LABEL = "dra-testbed.io/node"
"""On every ResourceSlice the testbed's drivers publish: one watch can serve a host's nodes."""
UNHEALTHY_TAINT_KEY = "dra-testbed.io/unhealthy"
"""Device taint of an unhealthy device in a ResourceSlice."""
DRIVER_POD_LABEL = "dra-testbed.io/synthetic-node-driver"
"""Marks a synthetic node's driver pod (value: the node). Not deploy/'s DaemonSet selector:
that DaemonSet would adopt such pods, and delete them from the synthetic nodes it keeps off."""
DRIVER_NAME_LABEL = "dra-testbed.io/driver"
"""On a command-line driver's pod: the DRA driver it runs (each has a pod of its own)."""
CONTAINER_ENV_ANNOTATION = "dra-testbed.io/container-env"
"""On a pod: the environment its containers got from their CDI devices (the runtime's report)."""
RUN_SECONDS_ANNOTATION = "dra-testbed.io/run-seconds"
"""On a pod: how long its containers run before they succeed."""
RUN_LABEL = "dra-testbed.io/run"
PHASE_LABEL = "dra-testbed.io/phase"
"""On a scenario's Jobs and pods: the run and the phase they belong to (the run's also on
its namespace)."""
RUNNER_ANNOTATION = "dra-testbed.io/runner"
"""On a scenario run's namespace (and DeviceTaintRules): the `testbed run` process (host,
pid, start ticks), so a later run can tell what a killed run left from what a run uses."""
MAINTENANCE_TAINT = "dra-testbed.io/maintenance"
"""The key of the device taint a scenario's ``taint-rule`` fault puts on (value: the run)."""
SERVED_BY_ANNOTATION = "dra-testbed.io/served-by"
"""On a synthetic node's Lease: the NodeHost run that serves the node (see fleet/fencing.py)."""
FABRIC_ATTACHED = "dra-testbed.io/FabricAttached"
FABRIC_ATTACH_FAILED = "dra-testbed.io/FabricAttachFailed"
"""The binding condition and binding-failure condition of a device behind a fabric: the
fabric manager sets one of them True in the claim's status, and the scheduler binds the
pod only after the first (and gives the allocation up on the second)."""
