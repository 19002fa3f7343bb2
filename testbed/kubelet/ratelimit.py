"""The token bucket the kubelet limits its APIs and image pulls with: ``rate`` tokens a
second, at most ``burst`` saved, full at first; a call without a token is refused at
once (no waiting)."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` 0 (or less): no limit, as the kubelet reads a zero QPS."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.stamp = clock()

    def take(self) -> bool:
        if self.rate <= 0:
            return True
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
