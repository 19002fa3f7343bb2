"""`testbed-driver`'s ports: every driver binds the same defaults, so a second one started
by hand on a machine meets a taken port. That is a setting to change, said in one line,
and the driver must not have shown the kubelet a registration socket before it gives up."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from testbed.drivers.main import Settings, serve
from testbed.errors import TestbedError

UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@pytest.mark.parametrize("variable", ["METRICS_PORT", "HEALTH_PORT"])
@pytest.mark.parametrize("value", ["65536", "-2"])
def test_a_port_out_of_range_is_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(TestbedError, match=f"{variable}={value} is not a port") as caught:
        Settings.from_env({"NODE_NAME": "n1", variable: value})
    assert caught.value.hint is not None and "-1 for none" in caught.value.hint


@pytest.mark.parametrize("variable", ["METRICS_PORT", "HEALTH_PORT"])
def test_a_taken_port_stops_the_driver_with_the_fix_before_it_registers(variable: str, tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    other = "HEALTH_PORT" if variable == "METRICS_PORT" else "METRICS_PORT"
    settings = Settings.from_env(
        {
            "NODE_NAME": "n1",
            "KUBELET_DIR": str(tmp_path / "kubelet"),
            "CDI_DIR": str(tmp_path / "cdi"),
            "KUBECONFIG": str(kubeconfig),
            variable: str(taken),
            other: "0",
        }
    )
    try:
        with pytest.raises(TestbedError, match=f"127.0.0.1:{taken} \\({variable}\\)") as caught:
            asyncio.run(asyncio.wait_for(serve(settings, asyncio.Event()), 30))
    finally:
        holder.close()
    assert caught.value.hint is not None and f"set {variable} to a free port" in caught.value.hint
    registry = tmp_path / "kubelet" / "plugins_registry"
    assert not (registry.exists() and any(registry.iterdir())), "a registration socket was shown to the kubelet"
