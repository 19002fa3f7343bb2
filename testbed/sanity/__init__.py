"""`testbed sanity`: a conformance suite for any DRA kubelet plugin (what csi-sanity is for CSI)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from testbed.errors import run_coroutine
from testbed.http11 import TransportError
from testbed.kubeapi import KubeClient
from testbed.sanity.checks import Result, Status, Suite
from testbed.sanity.harness import REGISTRATION_TIMEOUT_S, Harness, RunningNode

__all__ = ["Result", "RunningNode", "Status", "run"]


def run(
    kubeconfig: Path,
    command: list[str],
    env: Mapping[str, str] | None = None,
    driver_name: str = "",
    say: Callable[[str], None] | None = None,
    on_result: Callable[[Result], None] | None = None,
    running: RunningNode | None = None,
    only: Collection[str] | None = None,
    liveness: tuple[str, int] | None = None,
    registration_timeout_s: float = REGISTRATION_TIMEOUT_S,
) -> tuple[list[Result], str]:
    """Every check against ``command`` run as the driver of a node of its own on the
    cluster of ``kubeconfig`` (or against the driver already serving ``running``); the
    results and the name the driver registered. ``only``: the names of the checks to run
    (``checks.select`` works them out), else all of them. ``liveness``: the address and
    port of the driver's gRPC liveness endpoint, if it has one. ``registration_timeout_s``:
    how long the driver has to register each time it starts."""

    async def go() -> tuple[list[Result], str]:
        admin = KubeClient.from_kubeconfig(kubeconfig)
        harness = Harness(admin, kubeconfig, command, env, driver_name, running, registration_timeout_s)
        harness.waiting = say
        try:
            swept = await harness.setup()
            for run in swept:
                (say or print)(
                    f"took away what sanity run {run.run_id} left when it was killed ({run.why}): "
                    f"its namespace and DeviceClass, and any driver, node and slices of its own"
                )
            if say is not None and harness.process is not None:
                say(f"driver on node {harness.node}; its log: {harness.process.log_path}")
            elif say is not None:
                say(f"the running driver of node {harness.node}: checks that restart it are skipped")
            return await Suite(harness, on_result, only, liveness).run(), harness.driver_name
        finally:
            try:
                await harness.teardown()
            except (TransportError, TimeoutError) as exc:
                what = f"namespace {harness.namespace} and DeviceClass {harness.device_class}"
                if harness.process is not None:  # a node of its own, which the next run finds stale
                    what, then = f"node {harness.node}, {what}", "the next `testbed sanity` on it removes them"
                else:
                    then = f"`testbed kubectl delete namespace/{harness.namespace} deviceclass/{harness.device_class}`"
                (say or print)(f"could not take {what} out of the cluster ({exc}); if it is still there: {then}")
            await admin.close()

    return run_coroutine(go())
