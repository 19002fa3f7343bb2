"""The emulated FPGA card: a PCI accelerator that runs one bitstream at a time."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from fake_devices.kinds import Device, DeviceSpec, NodeSlots, SharedPool

PCI_IDS = ("0x10ee", "0x5000", "0x120000")  # vendor, device, class: a processing accelerator


class FpgaSpec(DeviceSpec):
    section: ClassVar[str] = "fpgas"
    pci_function: ClassVar[int] = 2

    model: str = Field(max_length=64)
    logic_cells: int = Field(alias="logicCells", ge=1)
    memory_gib: int = Field(alias="memoryGiB", ge=1)

    def build(self, slots: NodeSlots) -> tuple[list[Device], list[SharedPool]]:
        devices = []
        for i in range(self.count):
            uuid = slots.uuid("fpga", i)
            devices.append(
                Device(
                    name=f"fpga-{i}",
                    kind="fpga",
                    attributes={
                        "index": i,
                        "type": "fpga",
                        "model": self.model,
                        "uuid": uuid,
                        "logicCells": self.logic_cells,
                        "numaNode": slots.numa_node(i, self.count),
                        "pciBusID": slots.pci_bus_id(i, self.pci_function),
                        "pcieRoot": slots.pcie_root(i),
                    },
                    capacity={"memory": self.memory_gib << 30},
                    env={f"FPGA_{i}_UUID": uuid},
                    pci_ids=PCI_IDS,
                )
            )
        return devices, []
