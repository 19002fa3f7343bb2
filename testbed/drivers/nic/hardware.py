"""The emulated NIC: one device per port, each on the PCIe root of the GPU of its index.

A profile may make the ports shared (``shared: true``): each port can then be allocated to
several claims at once (consumable capacity), each share taking one of its virtual
functions and part of its link's bandwidth, as SR-IOV virtual functions with a rate limit.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from fake_devices.kinds import Device, DeviceSpec, NodeSlots, SharedPool, SharePolicy

PCI_IDS = ("0x15b3", "0x1021", "0x020000")  # vendor, device, class: an Ethernet controller
GBPS = 10**9


class NicSpec(DeviceSpec):
    section: ClassVar[str] = "nics"
    pci_function: ClassVar[int] = 1

    model: str = Field(max_length=64)
    link_speed_gbps: int = Field(alias="linkSpeedGbps", ge=1)
    rdma: bool = True
    virtual_functions: int = Field(default=0, alias="virtualFunctions", ge=0, le=256)
    shared: bool = False
    """Each port may be allocated to several claims at once: a share takes one virtual
    function and, unless its request asks for more or less, an equal part of the link."""

    @model_validator(mode="after")
    def _shares_need_virtual_functions(self) -> NicSpec:
        if self.shared and self.virtual_functions < 1:
            raise ValueError("shared: true needs virtualFunctions >= 1 (each share of a port takes one)")
        return self

    def _capacity(self) -> tuple[dict[str, int], dict[str, SharePolicy]]:
        """A port's capacity, and how a share consumes it (nothing when not shared)."""
        if not self.shared:
            return {"virtualFunctions": self.virtual_functions}, {}
        equal_part = max(1, self.link_speed_gbps // self.virtual_functions) * GBPS
        return {"virtualFunctions": self.virtual_functions, "bandwidth": self.link_speed_gbps * GBPS}, {
            "virtualFunctions": SharePolicy(default=1, minimum=1, maximum=1),
            "bandwidth": SharePolicy(default=equal_part, minimum=GBPS, step=GBPS),
        }

    def build(self, slots: NodeSlots) -> tuple[list[Device], list[SharedPool]]:
        devices = []
        capacity, policies = self._capacity()
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
                    env={f"NIC_{i}_IFNAME": ifname},
                    pci_ids=PCI_IDS,
                    capacity=capacity,
                    shareable=self.shared,
                    share_policies=policies,
                    share_env_prefix=f"NIC_{i}",
                )
            )
        return devices, []
