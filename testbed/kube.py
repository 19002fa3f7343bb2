"""Small typed helpers over the kubernetes client (its models are pydantic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def api_client(kubeconfig: Path) -> k8s.ApiClient:
    client: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return client


def build(model: type[M], manifest: dict[str, Any]) -> M:
    """A manifest (camelCase, as in YAML) as a typed model; unknown fields are errors."""
    return model.model_validate(manifest)


def present(value: T | None, what: str) -> T:
    """An optional API field that the API guarantees at this point."""
    if value is None:
        raise ValueError(f"{what} is missing")
    return value
