"""gRPC channels to a kubelet's or a driver's unix sockets."""

from __future__ import annotations

from pathlib import Path

import grpc


def unix_channel(socket: Path | str, *options: tuple[str, int]) -> grpc.aio.Channel:
    """A channel with a connection of its own, as each Go client has. gRPC's Python core
    otherwise shares one connection per socket path among its channels: a channel opened
    to a driver just restarted at the same path got the one to the instance before, still
    backing off from its exit, and its first call failed as Unavailable."""
    return grpc.aio.insecure_channel(f"unix://{socket}", options=[*options, ("grpc.use_local_subchannel_pool", 1)])
