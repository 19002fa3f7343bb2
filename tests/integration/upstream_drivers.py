"""Drivers written elsewhere, unmodified, as the tests run them on synthetic nodes."""

from __future__ import annotations

from testbed.controlplane.binaries import ensure_named

TEST_DRIVER = "test-driver.cdi.k8s.io"
"""The driver name of Kubernetes' own DRA e2e test driver (k8s.io/kubernetes/test/e2e/dra/test-driver)."""


def e2e_driver_command() -> list[str]:
    """That driver as its DaemonSet would run it (built from the Go module proxy, cached)."""
    return [
        str(ensure_named(("dra-test-driver",)).path("dra-test-driver")),
        "kubelet-plugin",
        "--node-name=$(NODE_NAME)",
        "--plugin-registration-path=$(KUBELET_REGISTRAR_DIRECTORY_PATH)",
        "--datadir=$(KUBELET_PLUGINS_DIRECTORY_PATH)",
        "--cdi-dir=$(CDI_DIR)",
    ]
