"""Kubernetes quantities ("25G", "1Gi", "500m") as the integers the emulated hardware counts.

The API server returns every quantity in its canonical form, so a driver that compares
what it published with what it reads back must publish that form too (``canonical``).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal | int] = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)")
_DECIMAL_SI = ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"))


def parse(text: str) -> int:
    """The quantity as a whole number, rounded up as the API server rounds a quantity it
    must hold in an integer ("1500m" -> 2). Raises ValueError naming the text."""
    return math.ceil(_exact(text))


def parse_milli(text: str) -> int:
    """The quantity in thousandths, rounded up: how the scheduler and the kubelet count CPU
    ("1" -> 1000, "250m" -> 250)."""
    return math.ceil(_exact(text) * 1000)


def _exact(text: str) -> Decimal:
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (like 25G, 1Gi or 500m)")
    number, exponent, suffix = match.groups()
    try:
        return Decimal(number) * (Decimal(10) ** int(exponent[1:]) if exponent else _SUFFIXES[suffix or ""])
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (like 25G, 1Gi or 500m)") from None


def canonical(value: int) -> str:
    """A whole number in the API server's canonical decimal form: 25000000000 -> "25G"."""
    if value:
        for exponent, suffix in _DECIMAL_SI:
            if value % 10**exponent == 0:
                return f"{value // 10**exponent}{suffix}"
    return str(value)
