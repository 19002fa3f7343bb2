"""One gRPC health check, as a kubelet's ``livenessProbe.grpc`` makes it."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass(frozen=True)
class ProbeResult:
    status: str | None
    """The serving status answered (SERVING, NOT_SERVING, ...); None: no answer."""
    output: str
    """What was seen, for an Event or a log line."""

    @property
    def passed(self) -> bool:
        return self.status == "SERVING"


async def grpc_health_check(target: str, service: str = "", timeout_s: float = 1.0) -> ProbeResult:
    """Ask ``target`` (host:port) once, on a connection of its own as each probe has: only
    SERVING within the timeout passes."""
    try:
        async with grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s, wait_for_ready=False
            )
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNIMPLEMENTED:
            why = f"{target} does not serve grpc.health.v1.Health ({exc.details()})"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            why = f"{target} did not answer within {timeout_s:g} s"
        else:
            why = f"{target}: {code.name}: {exc.details()}"
        return ProbeResult(None, why)
    status = str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
    if status == "SERVING":
        return ProbeResult(status, f"{target} is serving")
    return ProbeResult(status, f"{target} answered {status}")
