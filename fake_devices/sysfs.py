"""The emulated hardware as files a foreign driver can discover, like /sys on a real node.

``<dir>/inventory.json`` holds everything (schema below); ``<dir>/bus/pci/devices/<BDF>/``
and ``<dir>/class/net/<ifname>/`` hold what a driver would read from sysfs. Each file is
replaced atomically, inventory.json last, so a reader that sees a new generation there
sees the tree that goes with it.

inventory.json::

    {"node": "gpu-007", "generation": 3,
     "devices": [{"name": "gpu-0", "kind": "gpu", "parent": null,
                  "attributes": {"uuid": "...", "pciBusID": "0000:20:00.0", ...},
                  "capacity": {"memory": 85899345920, ...},
                  "counterPool": "gpu-0-counters", "draws": {"memory": ..., ...},
                  "health": "HEALTHY", "healthMessage": "", "fatal": false}, ...],
     "counterPools": [{"name": "gpu-0-counters", "capacity": {...}}],
     "faults": {"failNextPrepares": 0, "latencySeconds": 0.0, "failureRate": 0.0}}
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fake_devices.atomic import replace_file
from fake_devices.hardware import Health, NodeHardware
from fake_devices.kinds import Device

MTU = 9000


def inventory(hardware: NodeHardware) -> dict[str, Any]:
    health = {h.device: h for h in hardware.health()}
    faults = hardware.faults
    return {
        "node": hardware.node,
        "generation": hardware.generation,
        "devices": [
            {
                "name": d.name,
                "kind": d.kind,
                "parent": d.parent,
                "attributes": dict(d.attributes),
                "capacity": dict(d.capacity),
                "counterPool": d.pool,
                "draws": dict(d.draws),
                "health": health[d.name].health.value if d.name in health else Health.HEALTHY.value,
                "healthMessage": health[d.name].message if d.name in health else "",
                "fatal": health[d.name].fatal if d.name in health else False,
            }
            for d in hardware.devices()
        ],
        "counterPools": [{"name": p.name, "capacity": dict(p.capacity)} for p in hardware.pools()],
        "faults": {
            "failNextPrepares": faults.fail_next_prepares,
            "latencySeconds": faults.latency_s,
            "failureRate": faults.failure_rate,
        },
    }


def tree(hardware: NodeHardware) -> dict[str, str]:
    """Relative path -> content of the sysfs-like files: a PCI entry per device that is a
    PCI function (partitions are not), a network interface per device with an ``ifName``."""
    sick = {h.device for h in hardware.health() if h.health is Health.UNHEALTHY}
    files: dict[str, str] = {}
    for device in hardware.devices():
        if device.pci_ids is None:
            continue
        address = str(device.attributes["pciBusID"])
        vendor, product, pci_class = device.pci_ids
        base = f"bus/pci/devices/{address}"
        files |= {
            f"{base}/vendor": vendor,
            f"{base}/device": product,
            f"{base}/class": pci_class,
            f"{base}/numa_node": str(device.attributes.get("numaNode", -1)),
        }
        if "ifName" in device.attributes:
            files |= _net(device, address, up=device.name not in sick)
    return {path: content + "\n" for path, content in files.items()}


def _net(device: Device, address: str, up: bool) -> dict[str, str]:
    base = f"class/net/{device.attributes['ifName']}"
    return {
        f"{base}/address": str(device.attributes.get("macAddress", "")),
        f"{base}/mtu": str(MTU),
        f"{base}/speed": str(int(device.attributes.get("linkSpeedGbps", 0)) * 1000),
        f"{base}/operstate": "up" if up else "down",
        f"{base}/device/pci_address": address,
    }


def write(hardware: NodeHardware, directory: Path) -> None:
    """Bring ``directory`` up to date: changed files replaced, files of devices that are
    gone removed, inventory.json last."""
    wanted = tree(hardware)
    for path, content in wanted.items():
        target = directory / path
        if not target.exists() or target.read_text() != content:
            replace_file(target, content)
    for top in ("bus/pci/devices", "class/net"):
        for entry in (directory / top).iterdir() if (directory / top).is_dir() else []:
            if not any(p.startswith(f"{top}/{entry.name}/") for p in wanted):
                shutil.rmtree(entry, ignore_errors=True)
    replace_file(directory / "inventory.json", json.dumps(inventory(hardware), indent=1) + "\n")
