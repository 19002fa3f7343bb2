"""The FPGA driver: accelerator cards a claim configures with a bitstream.

Everything this kind of device is lives in this folder (its profile section, its
config, the profile it ships); one line in ``testbed/drivers/__init__.py`` adds it.
"""

from pathlib import Path

from testbed.drivers.emulated import DriverKind
from testbed.drivers.fpga.config import FpgaConfig
from testbed.drivers.fpga.hardware import FpgaSpec

KIND = DriverKind(
    name="fpga.dra-testbed.io",
    hardware=FpgaSpec,
    classes={"fpga.dra-testbed.io": "fpga"},
    configs={"FpgaConfig": FpgaConfig},
    profiles=Path(__file__).parent / "profiles",
)
