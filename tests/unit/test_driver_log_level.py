"""`testbed-driver`'s LOG_LEVEL as manifests and `--driver-env` write it: any case, and a
wrong one said with its fix (it was a traceback, and the driver never registered)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from testbed.drivers.main import log_level
from testbed.errors import TestbedError


@pytest.mark.parametrize(("value", "level"), [("info", logging.INFO), ("DEBUG", logging.DEBUG), (" warn ", 30)])
def test_names_in_any_case_and_numbers(value: str, level: int) -> None:
    assert log_level(value) == level
    assert log_level(str(level)) == level


def test_an_unknown_level_stops_the_driver_in_one_line() -> None:
    with pytest.raises(TestbedError, match="LOG_LEVEL='loud' is not a log level"):
        log_level("loud")
    env = {**os.environ, "LOG_LEVEL": "loud", "NODE_NAME": "n1"}
    ran = subprocess.run(
        [sys.executable, "-m", "testbed.drivers.main"], env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [
        "testbed-driver: LOG_LEVEL='loud' is not a log level",
        "hint: use debug, info, warning or error",
    ], ran.stderr
