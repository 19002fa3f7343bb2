"""gRPC status codes as Go programs (the kubelet, the API server's clients) print them."""

from __future__ import annotations

import grpc


def go_status_name(code: grpc.StatusCode) -> str:
    """grpc.StatusCode.DEADLINE_EXCEEDED -> "DeadlineExceeded", as Go's codes.Code prints
    it (in metric labels and in "rpc error: code = ..." messages). Go spells CANCELLED
    "Canceled"."""
    if code is grpc.StatusCode.OK:
        return "OK"
    if code is grpc.StatusCode.CANCELLED:
        return "Canceled"
    return "".join(part.capitalize() for part in code.name.split("_"))
