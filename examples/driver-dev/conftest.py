"""Your driver on synthetic nodes, in your own tests: the testbed's pytest plugin.

`fleet_spec` says which nodes the `fleet` fixture starts and which driver they run:
two with the fake kubelet and, where this runs as root, one with the real kubelet v1.37
(the reference). Replace DRIVER_COMMAND with your driver's command line (and
DRIVER_NAME with the name it registers); `testbed-driver` stands in for it here.
"""

from __future__ import annotations

import sys

import pytest

from testbed.fleet.spec import FleetFile
from testbed.realnode.node import unsupported_reason

pytest_plugins = ["testbed.testing"]

DRIVER_NAME = "gpu.dra-testbed.io"
DRIVER_COMMAND = [sys.executable, "-m", "testbed.drivers.main"]
DRIVER_ENV = {
    # What testbed-driver needs besides what every driver gets (NODE_NAME, KUBECONFIG, ...).
    "DRIVERS": DRIVER_NAME,
    "HARDWARE_PROFILE": "tiny",
    "HEALTH_PORT": "$(LIVENESS_PORT)",  # the port the fleet probes it on, one per node
    "METRICS_PORT": "-1",
}


@pytest.fixture(scope="session")
def fleet_spec() -> FleetFile:
    from testbed.testing import driver_fleet  # after pytest has loaded the plugin

    # Your DaemonSet's livenessProbe (without its port): a driver failing it is restarted.
    liveness = {"grpc": {}, "initialDelaySeconds": 10}
    real = 0 if unsupported_reason() else 1  # the real kubelet needs root (namespaces, mounts)
    return driver_fleet(
        DRIVER_COMMAND, DRIVER_NAME, DRIVER_ENV, nodes=2, profile="tiny", liveness_probe=liveness, real_nodes=real
    )
