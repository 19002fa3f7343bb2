"""The NIC driver: one device per port; a prepared claim's status names its interfaces."""

from testbed.drivers.emulated import DriverKind
from testbed.drivers.nic.config import NicConfig
from testbed.drivers.nic.driver import NicDriver
from testbed.drivers.nic.hardware import NicSpec

KIND = DriverKind(
    name="nic.dra-testbed.io",
    hardware=NicSpec,
    classes={"nic.dra-testbed.io": "nic"},
    configs={"NicConfig": NicConfig},
    driver=NicDriver,
)
