"""Namespaces a run left behind stay noted until an API server has taken them."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml

from testbed.controlplane import leftovers


def test_noted_namespaces_wait_while_the_api_server_does_not_answer(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {}}],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    leftovers.remember(tmp_path, "run-a")
    leftovers.remember(tmp_path, "run-b")
    leftovers.remember(tmp_path, "run-a")
    assert leftovers.pending(tmp_path) == ["run-a", "run-b"]

    assert leftovers.delete_pending(tmp_path, timeout_s=1) == []
    assert leftovers.pending(tmp_path) == ["run-a", "run-b"]  # kept for when it is back

    leftovers.forget(tmp_path, ["run-a"])
    assert leftovers.pending(tmp_path) == ["run-b"]


def test_nothing_noted_is_nothing_pending(tmp_path: Path) -> None:
    assert leftovers.pending(tmp_path) == []
    assert leftovers.delete_pending(tmp_path) == []
