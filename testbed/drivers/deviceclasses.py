"""The testbed's DeviceClasses, and installing them.

Each driver declares its classes; ``deploy/deviceclasses.yaml`` is this module's
``render()`` (`python -m testbed.drivers.deviceclasses > deploy/deviceclasses.yaml`),
and a unit test keeps the two equal.
"""

from __future__ import annotations

import yaml

from testbed.drivers import device_classes
from testbed.kubeapi import KubeClient, path_for

HEADER = """\
# DeviceClasses for the testbed's drivers. Installed by `testbed up`; the kind
# deployment applies this file. Generated: python -m testbed.drivers.deviceclasses
"""


def render() -> str:
    return HEADER + yaml.safe_dump_all(device_classes(), sort_keys=False, explicit_start=True, width=1000)


async def install(client: KubeClient) -> list[str]:
    """Create or update every class; returns their names."""
    names = []
    for doc in device_classes():
        await client.create_or_replace(path_for("resource.k8s.io/v1", "deviceclasses"), doc)
        names.append(doc["metadata"]["name"])
    return names


if __name__ == "__main__":
    print(render(), end="")
