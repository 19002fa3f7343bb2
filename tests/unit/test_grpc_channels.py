"""A channel to a driver restarted at the same socket path works from its first call."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from testbed.grpcapi.channels import unix_channel
from testbed.grpcapi.status import go_status_name


async def _serve(socket: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


async def _check(channel: grpc.aio.Channel) -> None:
    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_a_new_channel_to_a_restarted_server_does_not_inherit_the_old_ones_failure(short_tmp_path: Path) -> None:
    socket = short_tmp_path / "dra.sock"

    async def scenario() -> None:
        server = await _serve(socket)
        old = unix_channel(socket, ("grpc.max_reconnect_backoff_ms", 5000))
        await _check(old)
        await server.stop(None)  # the driver exits; the old channel fails and backs off
        socket.unlink(missing_ok=True)
        for _ in range(20):  # as the kubelet's connection watch keeps asking it to connect
            old.get_state(try_to_connect=True)
            await asyncio.sleep(0.1)
        assert old.get_state() is grpc.ChannelConnectivity.TRANSIENT_FAILURE
        await old.close()
        server = await _serve(socket)  # the new instance, same path
        new = unix_channel(socket, ("grpc.max_reconnect_backoff_ms", 5000))
        new.get_state(try_to_connect=True)
        try:
            await _check(new)  # at once, as a Go client's first call would
        finally:
            await new.close()
            await server.stop(None)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("code", "go"),
    [
        (grpc.StatusCode.OK, "OK"),
        (grpc.StatusCode.CANCELLED, "Canceled"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "DeadlineExceeded"),
        (grpc.StatusCode.UNAVAILABLE, "Unavailable"),
        (grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument"),
    ],
)
def test_status_codes_are_named_as_go_prints_them(code: grpc.StatusCode, go: str) -> None:
    """The kubelet's grpc_status_code label and its "rpc error: code = ..." messages."""
    assert go_status_name(code) == go
