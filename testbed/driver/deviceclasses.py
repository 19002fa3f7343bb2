"""The testbed's DeviceClasses (from deviceclasses.yaml), and installing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.kubeapi import KubeClient, path_for

MANIFEST = Path(__file__).with_name("deviceclasses.yaml")


def device_classes() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


async def install(client: KubeClient) -> list[str]:
    """Create or update every class; returns their names."""
    names = []
    for doc in device_classes():
        name = doc["metadata"]["name"]
        await client.create_or_replace(path_for("resource.k8s.io/v1", "deviceclasses"), doc)
        names.append(name)
    return names
