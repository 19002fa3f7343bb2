"""The GPU driver: whole GPUs and their partitions, shared as a claim's config says."""

from testbed.drivers.emulated import DriverKind
from testbed.drivers.gpu.config import GpuConfig
from testbed.drivers.gpu.hardware import GpuSpec

KIND = DriverKind(
    name="gpu.dra-testbed.io",
    hardware=GpuSpec,
    classes={"gpu.dra-testbed.io": "gpu", "gpu-partition.dra-testbed.io": "partition"},
    configs={"GpuConfig": GpuConfig},
)
