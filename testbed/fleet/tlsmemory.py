"""The memory a NodeHost's TLS connections hold.

Python's asyncio gives every TLS connection a 256 KiB read buffer, zero-filled (so
resident) when it opens. Under node identities a NodeHost holds two or more connections
per node (the kubelet's pod watch, its requests), so these buffers were about half of a
node's memory. A TLS record carries at most 16 KiB of data, so a smaller buffer still
reads whole records; reads of large answers take more, smaller steps.
"""

from __future__ import annotations

from asyncio import sslproto

TLS_READ_BUFFER = 32 * 1024


def small_tls_read_buffers() -> None:
    """For the connections this process opens from now on (asyncio's own TLS; uvloop's
    keeps its own, smaller buffers)."""
    sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
