"""A command-line driver with a livenessProbe is probed as a kubelet probes its DaemonSet's
container, on a loopback port of its own, and killed and started again once it fails the
probe failureThreshold times in a row: the good practice's probe, exercised on a fleet's
nodes. Real processes and real gRPC; no control plane."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from testbed.controlplane.processes import ProcessRecord, process_start_ticks
from testbed.fleet.external import (
    LIVENESS_PORT,
    ExternalDriver,
    ExternalDriverSpec,
    Restarts,
    container_environment,
    expand,
    recorded_restarts,
)
from testbed.fleet.liveness import LivenessSettings, until_unhealthy
from testbed.grpcapi.probe import ProbeResult, grpc_health_check

Told = tuple[str, str, str]


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("--port=$(PORT)", "--port=5000"),
        ("$(PORT)$(NODE)", "5000n1"),
        ("$(UNKNOWN)", "$(UNKNOWN)"),
        ("$$(PORT)", "$(PORT)"),
        ("$$$(PORT)", "$5000"),
        ("cost: $5", "cost: $5"),
        ("ends with $", "ends with $"),
        ("$(PORT", "$(PORT"),
        ("$(PORT $(NODE)", "$(PORT $(NODE)"),
        ("echo $(date)", "echo $(date)"),
    ],
)
def test_references_expand_as_in_a_pod_spec(text: str, expanded: str) -> None:
    assert expand(text, {"PORT": "5000", "NODE": "n1"}) == expanded


def test_a_driver_variable_may_name_the_ones_given_and_those_before_it() -> None:
    environment = container_environment(
        {"LIVENESS_PORT": "7001", "NODE_NAME": "n1"},
        {"HEALTH_PORT": "$(LIVENESS_PORT)", "ADDRESS": "127.0.0.1:$(HEALTH_PORT)", "LATER": "$(AFTER)", "AFTER": "x"},
    )
    assert environment["HEALTH_PORT"] == "7001"
    assert environment["ADDRESS"] == "127.0.0.1:7001"
    assert environment["LATER"] == "$(AFTER)"  # not yet defined where it is used


class Health:
    """A grpc.health.v1 server on a free loopback port whose status the test sets."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()
        self.server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def set(self, status: str) -> None:
        await self.servicer.set("", health_pb2.HealthCheckResponse.ServingStatus.Value(status))


def test_one_probe_passes_only_on_serving_and_says_what_it_saw() -> None:
    async def scenario() -> list[ProbeResult]:
        served = Health()
        await served.server.start()
        target = f"127.0.0.1:{served.port}"
        try:
            await served.set("SERVING")
            serving = await grpc_health_check(target)
            await served.set("NOT_SERVING")
            not_serving = await grpc_health_check(target)
        finally:
            await served.server.stop(None)
        gone = await grpc_health_check(target, timeout_s=0.5)
        return [serving, not_serving, gone]

    serving, not_serving, gone = asyncio.run(scenario())
    assert serving.passed and serving.status == "SERVING"
    assert not not_serving.passed and "NOT_SERVING" in not_serving.output
    assert not gone.passed and gone.status is None and "127.0.0.1" in gone.output


def test_a_failure_run_must_reach_the_threshold_and_a_pass_breaks_it() -> None:
    """Fail, fail, pass, fail, fail, fail (threshold 3): one Unhealthy Event per failure,
    and unhealthy only at the sixth probe."""
    answers = iter([False, False, True, False, False, False, True])
    asked: list[int] = []
    told: list[Told] = []

    async def probe() -> ProbeResult:
        asked.append(1)
        return ProbeResult("SERVING", "fine") if next(answers) else ProbeResult("NOT_SERVING", f"bad #{len(asked)}")

    settings = LivenessSettings(period_s=0.01, failure_threshold=3)
    last = asyncio.run(until_unhealthy(settings, probe, lambda *event: told.append(event)))
    assert last == "bad #6" and len(asked) == 6
    assert told == [("Warning", "Unhealthy", f"Liveness probe failed: bad #{n}") for n in (1, 2, 4, 5, 6)]


def test_nothing_is_probed_within_the_initial_delay() -> None:
    async def scenario() -> int:
        asked: list[int] = []

        async def probe() -> ProbeResult:
            asked.append(1)
            return ProbeResult(None, "down")

        settings = LivenessSettings(initial_delay_s=30, period_s=1, failure_threshold=1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(until_unhealthy(settings, probe, lambda *event: None), 0.5)
        return len(asked)

    assert asyncio.run(scenario()) == 0


# A driver stand-in: serves grpc.health.v1 on the port in its first argument, SERVING
# until the file in its second argument exists, then NOT_SERVING (its "socket broke").
PROGRAM = textwrap.dedent(
    """
    import asyncio, os, sys
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    async def main():
        servicer = health.aio.HealthServicer()
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        server.add_insecure_port("127.0.0.1:" + sys.argv[1])
        await server.start()
        print("health on", sys.argv[1], "env", os.environ["HEALTH_PORT"], flush=True)
        while True:
            broken = os.path.exists(sys.argv[2])
            status = "NOT_SERVING" if broken else "SERVING"
            await servicer.set("", health_pb2.HealthCheckResponse.ServingStatus.Value(status))
            await asyncio.sleep(0.05)

    asyncio.run(main())
    """
)


def test_a_driver_failing_its_probe_is_killed_and_started_again_at_once(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    told: list[Told] = []
    spec = ExternalDriverSpec(
        "gpu.example.com",
        (sys.executable, "-c", PROGRAM, "$(LIVENESS_PORT)", str(broken)),
        {"HEALTH_PORT": f"$({LIVENESS_PORT})"},
        # Long enough for Python and gRPC to start serving on a loaded CI machine: a start
        # slower than the delay is killed as a kubelet kills it, and again, in a loop.
        LivenessSettings(initial_delay_s=8.0, period_s=0.2, timeout_s=1, failure_threshold=3, grace_s=5),
    )
    external = ExternalDriver(spec, "node-0", tmp_path / "node", lambda *event: told.append(event))

    async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await asyncio.sleep(0.05)

    async def scenario() -> tuple[int, int]:
        await external.start({"NODE_NAME": "node-0"})
        try:
            assert external.process is not None and external.liveness_port is not None
            first = external.process.pid
            port = external.liveness_port
            await until(lambda: f"health on {port}" in external.log_tail())  # not the command's echo
            assert (await grpc_health_check(f"127.0.0.1:{port}")).passed
            broken.touch()
            await until(lambda: external.liveness_kills == 1)
            broken.unlink()
            await until(lambda: external.restarts == 1 and external.alive())
            assert external.process is not None
            second = external.process.pid
            assert external.liveness_port == port  # the same port across its restarts
            served = f"health on {port} env {port}"  # the port in its command and its environment
            await until(lambda: external.log_path.read_text().count(served) == 2)
            # What `testbed status` reads: the counts beside the process record.
            assert recorded_restarts(tmp_path) == {"gpu.example.com": Restarts(restarts=1, liveness_kills=1)}
            return first, second
        finally:
            await external.stop()

    first, second = asyncio.run(scenario())
    assert first != second
    unhealthy = [t for t in told if t[1] == "Unhealthy"]
    # The three in a row that killed it; a slow start may have failed a probe before.
    assert len(unhealthy) >= 3 and all("NOT_SERVING" in message for _, _, message in unhealthy[-3:])
    assert told[-1] == ("Normal", "Killing", "Container driver failed liveness probe, will be restarted")
    assert external.restarts == 1 and external.liveness_kills == 1


def test_a_driver_naming_the_port_without_a_probe_gets_one_and_is_not_probed(tmp_path: Path) -> None:
    """What `testbed sanity` relies on to find the endpoint of a driver told $(LIVENESS_PORT);
    a driver that names neither gets no port."""
    program = "import sys, time; print('listening on', sys.argv[1], flush=True); time.sleep(60)"

    async def started(command: tuple[str, ...], name: str) -> tuple[int | None, str]:
        external = ExternalDriver(ExternalDriverSpec("x.example.com", command), "node-0", tmp_path / name)
        await external.start({})
        try:
            port = external.liveness_port
            async with asyncio.timeout(30):
                while f"listening on {port}" not in external.log_tail().splitlines()[-1]:
                    await asyncio.sleep(0.05)
            return port, external.log_tail()
        finally:
            await external.stop()

    port, _ = asyncio.run(started((sys.executable, "-c", program, "$(LIVENESS_PORT)"), "named"))
    assert port is not None and port > 0
    none, _ = asyncio.run(started((sys.executable, "-c", program, "None"), "unnamed"))
    assert none is None


def test_a_driver_whose_port_another_process_took_comes_back_on_a_new_one(tmp_path: Path) -> None:
    """Ports are chosen free, not reserved: a restart on a port another process now
    listens on would fail its probes for ever."""
    quit_file = tmp_path / "quit"
    program = (
        "import os, sys, time\n"
        "print('port', sys.argv[1], flush=True)\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.05)\n"
        "os.remove(sys.argv[2]); sys.exit(1)\n"
    )
    spec = ExternalDriverSpec("x.example.com", (sys.executable, "-c", program, "$(LIVENESS_PORT)", str(quit_file)))
    external = ExternalDriver(spec, "node-0", tmp_path / "node")

    async def scenario() -> tuple[int, int]:
        await external.start({})
        try:
            assert external.liveness_port is not None
            first = external.liveness_port
            with socket.socket() as squatter:
                squatter.bind(("127.0.0.1", first))
                squatter.listen()
                quit_file.touch()
                async with asyncio.timeout(30):
                    while external.restarts < 1 or not external.log_tail().splitlines()[-1].startswith("port "):
                        await asyncio.sleep(0.05)
                assert external.liveness_port is not None
                return first, external.liveness_port
        finally:
            await external.stop()

    first, second = asyncio.run(scenario())
    assert second != first
    assert external.log_tail().splitlines()[-1] == f"port {second}", "its command names the new port"


def test_a_host_taking_a_node_over_counts_on_from_the_restarts_recorded_before(tmp_path: Path) -> None:
    """`testbed status` reads the counts beside the process record; a NodeHost that Ray
    started again stops the driver its predecessor left and starts it anew: one restart
    more, not a count back at zero."""
    spec = ExternalDriverSpec("x.example.com", (sys.executable, "-c", "import time; time.sleep(60)"))
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        earlier = ExternalDriver(spec, "node-0", tmp_path / "node")
        earlier.records.parent.mkdir(parents=True)
        record = ProcessRecord("x.example.com", left.pid, process_start_ticks(left.pid) or 0, "log", ["sleep"])
        earlier.records.write_text(json.dumps({**record.to_json(), "restarts": 4, "livenessKills": 2}))
        again = ExternalDriver(spec, "node-0", tmp_path / "node")

        async def take_over() -> None:
            await again.start({})
            await again.stop()

        asyncio.run(take_over())
        assert left.wait(timeout=10) is not None, "the earlier host's instance is stopped"
        assert (again.restarts, again.liveness_kills) == (5, 2)
    finally:
        left.kill()
        left.wait()
