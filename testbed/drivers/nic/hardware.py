"""The emulated NIC: one device per port, each on the PCIe root of the GPU of its index."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from fake_devices.kinds import Device, DeviceSpec, NodeSlots, SharedPool

PCI_IDS = ("0x15b3", "0x1021", "0x020000")  # vendor, device, class: an Ethernet controller


class NicSpec(DeviceSpec):
    section: ClassVar[str] = "nics"
    pci_function: ClassVar[int] = 1

    model: str = Field(max_length=64)
    link_speed_gbps: int = Field(alias="linkSpeedGbps", ge=1)
    rdma: bool = True
    virtual_functions: int = Field(default=0, alias="virtualFunctions", ge=0, le=256)

    def build(self, slots: NodeSlots) -> tuple[list[Device], list[SharedPool]]:
        devices = []
        for i in range(self.count):
            name, ifname = f"nic-{i}", f"eth{i + 1}"
            devices.append(
                Device(
                    name=name,
                    kind="nic",
                    attributes={
                        "index": i,
                        "type": "nic",
                        "model": self.model,
                        "ifName": ifname,
                        "macAddress": slots.mac(i),
                        "rdma": self.rdma,
                        "linkSpeedGbps": self.link_speed_gbps,
                        "numaNode": slots.numa_node(i, self.count),
                        "pciBusID": slots.pci_bus_id(i, self.pci_function),
                        "pcieRoot": slots.pcie_root(i),
                    },
                    capacity={"virtualFunctions": self.virtual_functions},
                    env={f"NIC_{i}_IFNAME": ifname},
                    pci_ids=PCI_IDS,
                )
            )
        return devices, []
