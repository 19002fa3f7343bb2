"""The emulated GPU: whole GPUs, and MIG-style partitions that share its memory slices."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fake_devices.kinds import AttributeValue, Device, DeviceSpec, NodeSlots, SharedPool

PCI_IDS = ("0x10de", "0x2330", "0x030200")  # vendor, device, class: a 3D controller


class PartitionProfile(BaseModel):
    """A partition shape: which memory slices it covers and what it gets."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[0-9]+g\.[0-9]+gb$", description="e.g. 1g.10gb")
    memory_slices: int = Field(alias="memorySlices", ge=1)
    multiprocessors: int = Field(ge=1)
    memory_gib: int = Field(alias="memoryGiB", ge=1)
    placements: list[int] = Field(min_length=1, description="first memory slice of each placement")


class GpuSpec(DeviceSpec):
    section: ClassVar[str] = "gpus"
    pci_function: ClassVar[int] = 0

    product_name: str = Field(alias="productName", max_length=64)
    architecture: str = Field(max_length=64)
    driver_version: str = Field(alias="driverVersion", pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")
    memory_gib: int = Field(alias="memoryGiB", ge=1)
    multiprocessors: int = Field(ge=1)
    memory_slices: int = Field(default=8, alias="memorySlices", ge=1, le=16)
    partitions: list[PartitionProfile] = Field(default_factory=list)
    fabric: bool = Field(
        default=False,
        description="the GPUs sit in a chassis shared over a fabric: each is attached to the node "
        "that claims it before a pod there may bind (binding conditions)",
    )

    @model_validator(mode="after")
    def _placements_fit(self) -> GpuSpec:
        for i, partition in enumerate(self.partitions):
            for start in partition.placements:
                if start < 0 or start + partition.memory_slices > self.memory_slices:
                    raise ValueError(
                        f"partitions[{i}] ({partition.name}) placement {start} needs slices "
                        f"{start}..{start + partition.memory_slices - 1}, but the GPU has "
                        f"{self.memory_slices} (memorySlices)"
                    )
        return self

    def build(self, slots: NodeSlots) -> tuple[list[Device], list[SharedPool]]:
        devices: list[Device] = []
        pools: list[SharedPool] = []
        whole_capacity = {"memory": self.memory_gib << 30, "multiprocessors": self.multiprocessors}
        for i in range(self.count):
            common: dict[str, AttributeValue] = {
                "index": i,
                "uuid": slots.uuid("gpu", i),
                "productName": self.product_name,
                "architecture": self.architecture,
                "driverVersion": self.driver_version,
                "numaNode": slots.numa_node(i, self.count),
                "pciBusID": slots.pci_bus_id(i, self.pci_function),
                "pcieRoot": slots.pcie_root(i),
            }
            whole = f"gpu-{i}"
            pool_name: str | None = None
            pool_capacity: dict[str, int] = {}
            if self.partitions:
                pool_name = f"{whole}-counters"
                pool_capacity = dict(whole_capacity) | {f"memory-slice-{s}": 1 for s in range(self.memory_slices)}
                pools.append(SharedPool(pool_name, pool_capacity))
            key = whole.upper().replace("-", "_")
            devices.append(
                Device(
                    name=whole,
                    kind="gpu",
                    attributes={**common, "type": "gpu"},
                    capacity=whole_capacity,
                    pool=pool_name,
                    draws=dict(pool_capacity),
                    env={f"{key}_UUID": str(common["uuid"])},
                    pci_ids=PCI_IDS,
                    behind_fabric=self.fabric,
                )
            )
            for partition in self.partitions:
                devices += [
                    self._partition(slots, i, whole, pool_name, common, partition, s, self.fabric)
                    for s in partition.placements
                ]
        return devices, pools

    @staticmethod
    def _partition(
        slots: NodeSlots,
        index: int,
        whole: str,
        pool: str | None,
        common: dict[str, AttributeValue],
        partition: PartitionProfile,
        start: int,
        fabric: bool,
    ) -> Device:
        name = f"{whole}-{partition.name.replace('.', '')}-{start}"
        uuid = slots.uuid(f"mig{index}-{partition.name}", start)
        capacity = {"memory": partition.memory_gib << 30, "multiprocessors": partition.multiprocessors}
        return Device(
            name=name,
            kind="partition",
            attributes={
                **common,
                "type": "partition",
                "profile": partition.name,
                "placementStart": start,
                "placementSize": partition.memory_slices,
                "uuid": uuid,
                "parentUUID": str(common["uuid"]),
            },
            capacity=capacity,
            pool=pool,
            draws=capacity | {f"memory-slice-{s}": 1 for s in range(start, start + partition.memory_slices)},
            parent=whole,
            env={f"{name.upper().replace('-', '_')}_UUID": uuid},
            behind_fabric=fabric,
        )
