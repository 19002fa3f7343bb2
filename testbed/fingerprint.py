"""Which code this process runs: a digest of the testbed's own source files.

Every Ray host must run the same testbed as the machine that starts the fleet (a
NodeHost speaks the fake kubelet's and the driver's protocols, and reads the recipes the
fleet sends it). The package version alone would not tell two checkouts apart.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from collections.abc import Iterable
from pathlib import Path

SOURCE_SUFFIXES = (".py", ".proto", ".yaml")
PACKAGES = ("testbed", "fake_devices")


def digest(roots: Iterable[Path]) -> str:
    """Of every source file under these package roots: path (relative) and content."""
    hasher = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
            hasher.update(f"{root.name}/{path.relative_to(root)}\0".encode())
            hasher.update(path.read_bytes())
            hasher.update(b"\0")
    return hasher.hexdigest()[:12]


@functools.cache
def code_version() -> str:
    """This process's testbed: the source digest and the Python it runs on."""
    here = Path(__file__).resolve().parent.parent
    python = ".".join(platform.python_version_tuple()[:2])
    return f"{digest(here / name for name in PACKAGES)} (Python {python})"


def strangers(mine: str, theirs: dict[str, str]) -> list[str]:
    """The hosts (by where they run) whose code differs from ``mine``, each with theirs."""
    return [f"{where}: {version}" for where, version in sorted(theirs.items()) if version != mine]
