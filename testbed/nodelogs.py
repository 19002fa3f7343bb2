"""One node's part of its NodeHost's log.

A NodeHost runs the kubelets and built-in drivers of up to thousands of nodes in one
process and one log; each line about a node names it ("node-002: ...", "gpu.dra-testbed.io
on node-002: ..."). A user debugging one node wants its lines, and the host's own (those
that name no node), not those of the others.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
"""A line that begins a record in LOG_FORMAT; the lines after it up to the next (a
traceback, a multi-line message) belong to it."""


def records(lines: Iterable[str]) -> list[list[str]]:
    """Lines grouped by record; lines before the first record are records of their own."""
    grouped: list[list[str]] = []
    for line in lines:
        if grouped and not RECORD_START.match(line) and RECORD_START.match(grouped[-1][0]):
            grouped[-1].append(line)
        else:
            grouped.append([line])
    return grouped


def lines_of_node(lines: Iterable[str], node: str, host_nodes: Collection[str]) -> list[str]:
    """The records that name ``node``, or none of the host's nodes. A name counts as a
    whole word: node-001 is not in node-0010 nor in node-001-000."""
    names = sorted({node, *host_nodes}, key=len, reverse=True)
    named = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, names)) + r")(?![\w-])")
    kept: list[str] = []
    for record in records(lines):
        found = set(named.findall("\n".join(record)))
        if node in found or not found:
            kept += record
    return kept
