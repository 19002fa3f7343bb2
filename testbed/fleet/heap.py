"""How a NodeHost's process collects its garbage.

Nearly everything a node allocates lives as long as the node: inventories, slices, gRPC
servers, TLS contexts. Python's collector, tuned for short-lived objects, walks them
again and again while nodes start (its young generation every 700 allocations, the whole
heap whenever it grew by a quarter): a sixth of a starting NodeHost's CPU, and more under
node identities, which hold a client and a TLS context per node.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

START_THRESHOLD = 20_000
"""Allocations between collections of the young generation while nodes start (Python's
default is 700). The collector's CPU in a 100-node start fell from 0.4-0.66 s to
0.15-0.19 s; a collection now pauses for up to ~10 ms, which only a start sees."""

_starts = 0
_default_threshold = gc.get_threshold()


def settle() -> None:
    """Exempt what the process holds now from collections (Python's permanent
    generation). A full collection walks every object a host holds (55-65 ms on a host
    of 50 gpu8 nodes) and every node's NodePrepareResources waits it out; frozen objects
    are skipped, so collections during a run walk only what the run creates."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def starting_nodes() -> Iterator[None]:
    """Nodes start in here: the young generation is collected less often, and what they
    hold is settled at the end. Starts may overlap; the default returns after the last."""
    global _starts
    if _starts == 0:
        settle()  # what exists already is not walked again while the nodes start
        gc.set_threshold(START_THRESHOLD, *_default_threshold[1:])
    _starts += 1
    try:
        yield
    finally:
        _starts -= 1
        if _starts == 0:
            gc.set_threshold(*_default_threshold)
            settle()


def release() -> None:
    """After nodes were removed: what they held was settled, and its reference cycles
    would never be collected. Everything goes back to the collector once, then what is
    still held is settled again."""
    gc.unfreeze()
    settle()
