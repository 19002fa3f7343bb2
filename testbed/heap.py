"""How the testbed's long-lived processes collect their garbage: a NodeHost, and a
scenario run (``settled``).

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

STEADY_THRESHOLD = (10_000, 10, 100)
"""Once nodes run (Python's default: 700, 10, 10). A host's objects lie scattered over
hundreds of MB, so each one the collector walks costs cache misses: on a host of 100
gpu8 nodes, a full collection of its ~50,000 unsettled objects took 50 ms idle and
100-500 ms during a cl2-dra run, which saw 4-5 of them, each stopping every node's
event loop. With the default, requests' short-lived objects are caught young and
promoted; with 10,000 allocations between young collections most are gone first, and a
full collection waits for 100 middle ones. cl2-dra, runs interleaved
(docs/performance.md): the collector's pauses 0.6-0.85 s a run instead of 2.0-2.5 s, no
full collection, the churn's startup p99 2.4-2.6 s instead of 3.2-3.6 s. What full
collections found was little (1,670 objects in 15 of them), so garbage cycles waiting
longer in the old generation cost little memory."""

_starts = 0


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
    hold is settled at the end. Starts may overlap; the steady threshold is set after the
    last."""
    global _starts
    if _starts == 0:
        settle()  # what exists already is not walked again while the nodes start
        gc.set_threshold(START_THRESHOLD, *STEADY_THRESHOLD[1:])
    _starts += 1
    try:
        yield
    finally:
        _starts -= 1
        if _starts == 0:
            gc.set_threshold(*STEADY_THRESHOLD)
            settle()


@contextlib.contextmanager
def settled() -> Iterator[None]:
    """What the process holds when it enters is settled until it leaves. A scenario run
    times each pod's start by when its watch sees it, and a full collection stops that
    watch: after the imports, Ray's client and the first scrapes, the CLI's process holds
    some 300,000 objects, and a full collection of them took 200-290 ms in the middle of
    a phase (``testbed run baseline``: one in each run, the run's longest hold of its
    event loop). Its own objects go back to the collector at the end, so a long-lived
    process that runs scenarios one after another (a test session) leaks no cycles."""
    settle()
    try:
        yield
    finally:
        gc.unfreeze()


def release() -> None:
    """After nodes were removed: what they held was settled, and its reference cycles
    would never be collected. Everything goes back to the collector once, then what is
    still held is settled again."""
    gc.unfreeze()
    settle()
