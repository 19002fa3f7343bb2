"""A scenario run on a testbed cluster, as `testbed run` makes it: the report's place
checked first, the fleet waited for, the control plane watched while the scenario runs
(a component gone for good ends the run with verdict ERROR, never a hang), the leaks of
what the run created looked for on every node, and the report written where it can be.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from testbed import clusterstatus, environment, files
from testbed import config as cfg
from testbed.controlplane import cluster, leftovers, processes
from testbed.errors import TestbedError, run_coroutine
from testbed.progress import ConsoleProgress

if TYPE_CHECKING:
    from testbed.scenarios.runner import FaultInjector, RunData
    from testbed.scenarios.spec import Scenario

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def check_writable(output: Path | None, junit: Path | None) -> None:
    """Where the report goes, checked before the run (and nothing made yet): found
    unwritable after it, the run's figures would be lost."""
    if output is not None:
        files.check_can_make(output, "--output", "give a writable directory (made if missing)")
        from testbed.report.report import foreign_files

        foreign = foreign_files(output) if output.is_dir() else []
        if foreign:
            raise TestbedError(
                f"--output {output} holds {', '.join(foreign)}, which no testbed report wrote: the report "
                "would replace them",
                hint="give a new or empty directory (made if missing), or one an earlier report was written to",
            )
    if junit is not None:
        files.check_can_make(junit, "--junit", "give a file in a writable directory")


FLEET_WAIT_S = 900.0
FLEET_STALL_S = 60.0
"""No node more Ready for this long, and nobody starting any: the run is refused."""


def wait_for_fleet(state: cluster.ClusterState, progress: ConsoleProgress) -> None:
    """A run on a fleet that is still starting (another `testbed up` at work) waits until
    every node it asked for is Ready, with progress; its figures would be wrong before."""
    fleet = clusterstatus.fleet_file(state)
    expected = fleet.count if fleet else 0
    if not expected:
        return
    from testbed.controlplane.selfcheck import ready_synthetic_nodes
    from testbed.kube import api_client

    api = api_client(state.kubeconfig)
    try:
        deadline = time.monotonic() + FLEET_WAIT_S
        last, moved = -1, time.monotonic()
        with progress.task(f"waiting for the fleet's {expected} nodes to be Ready"):
            while (ready := len(ready_synthetic_nodes(api))) < expected:
                now = time.monotonic()
                if ready != last:
                    last, moved = ready, now
                elif now - moved > FLEET_STALL_S and not _being_started(state.root):
                    raise TestbedError(
                        f"only {ready} of the fleet's {expected} nodes are Ready, none more for "
                        f"{FLEET_STALL_S:.0f} s, and no `testbed up` is starting it",
                        hint=f"see `testbed status --name {state.name}` (a `testbed up` killed before its fleet "
                        f"was up leaves it short); `testbed down --name {state.name}` and up again",
                    )
                if now > deadline:
                    raise TestbedError(
                        f"only {ready} of the fleet's {expected} nodes are Ready after {FLEET_WAIT_S:.0f} s",
                        hint=f"see `testbed status --name {state.name}` and the NodeHost logs",
                    )
                progress.update(f"{ready}/{expected} nodes Ready")
                time.sleep(1.0)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _being_started(root: Path) -> bool:
    """Whether a `testbed up` is at work on this cluster now."""
    state = cluster.ClusterState.load(root)
    return state is not None and state.starter is not None and state.starter.alive()


def _gone_component(root: Path) -> str:
    """The first control-plane component of this cluster that is not running now (read
    afresh: the supervisor may have restarted it), described; "" if all run."""
    state = cluster.ClusterState.load(root)
    if state is None:
        return f"the cluster is gone ({root} has no state: stopped by `testbed down`?)"
    for record in state.processes:
        if record.name in cluster.STOP_ORDER and not record.alive():
            tail = processes.log_tail(Path(record.log), 3).strip().replace("\n", " | ")
            supervised = state.supervision.get(record.name)
            restarts = f" ({supervised.restarts} restarts so far)" if supervised and supervised.restarts else ""
            return f"{record.name} (pid {record.pid}) is not running{restarts}; its log ends: {tail or '(empty)'}"
    return ""


GONE_FOR_GOOD_S = 60.0
"""How long a run waits for the supervisor to bring a component back."""


async def _watch_control_plane(root: Path, interval_s: float = 0.5, grace_s: float = GONE_FOR_GOOD_S) -> str:
    """Returns, saying why, once the control plane is gone for good: a component down
    with no supervisor to restart it, or down for longer than ``grace_s``. An attached
    cluster has no processes of ours to watch."""
    import asyncio

    down_since: float | None = None
    while True:
        gone = _gone_component(root)
        if not gone:
            down_since = None
        else:
            state = cluster.ClusterState.load(root)
            if state is None or not state.supervised:
                return f"{gone}; no supervisor runs to restart it"
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since > grace_s:
                return f"{gone}; not back within {grace_s:.0f} s"
        await asyncio.sleep(interval_s)


def _leak_check(state: cluster.ClusterState, namespace: str, claim_uids: set[str]) -> dict[str, Any]:
    """Asked of the NodeHosts, each of its own nodes (wherever they run); a fleet that
    cannot be asked is reported unchecked, not clean."""
    if state.fleet_id:
        try:
            return environment.attach_fleet(state).leaks(namespace, claim_uids)
        except TestbedError as exc:
            return {"checkpoint_entries": 0, "cdi_specs": 0, "unchecked": [f"the fleet ({exc.message})"]}
    return {"checkpoint_entries": 0, "cdi_specs": 0}  # no synthetic nodes of ours


def _fault_injector(state: cluster.ClusterState) -> FaultInjector | None:
    """What applies a scenario's faults to the cluster's fleet (None without one)."""
    return environment.fault_injector(environment.attach_fleet(state), state.root) if state.fleet_id else None


def run_and_report(
    state: cluster.ClusterState, chosen: Scenario, name: str, output: Path | None, junit: Path | None = None
) -> int:
    """Run the scenario on the cluster, write the report; the exit code it deserves."""
    import asyncio
    import datetime as dt

    import aiohttp

    from testbed.kubeapi import ApiError, KubeClient
    from testbed.report import report as reporting
    from testbed.scenarios import runner

    endpoints = runner.Endpoints.local(state.ports, environment.fleet_metrics(state))
    client = KubeClient.from_kubeconfig(state.kubeconfig)
    injector = _fault_injector(state) if chosen.faults else None
    work = runner.Runner(client, chosen, endpoints, ConsoleProgress(), injector)

    async def go() -> None:
        scenario = asyncio.create_task(work.run())
        watchdog = asyncio.create_task(_watch_control_plane(state.root))
        try:
            await asyncio.wait({scenario, watchdog}, return_when=asyncio.FIRST_COMPLETED)
            if not scenario.done():
                work.data.error = watchdog.result()
                stderr.print(f"error: {work.data.error}; ending the run", markup=False)
                scenario.cancel()
            try:
                await scenario
            except asyncio.CancelledError:
                if not work.data.error:
                    raise
            except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                work.data.error = _gone_component(state.root) or f"the run failed on an API call: {exc}"
                if work.data.phases and not work.data.phases[-1].ended:
                    work.data.phases[-1].interrupted = True
        finally:
            watchdog.cancel()
            if not scenario.done():  # interrupted: the scenario cleans up with the client still open
                scenario.cancel()
                await asyncio.gather(scenario, return_exceptions=True)
            await client.close()

    interrupted = False
    try:
        run_coroutine(go())
    except KeyboardInterrupt:
        interrupted = True
        work.data.interrupted = True
    leaks = _leak_check(state, work.data.namespace, set(work.data.claims))
    if work.data.left_behind and state.supervised:
        leftovers.remember(state.root, work.data.namespace)
        work.data.left_behind = (
            f"namespace {work.data.namespace}: the cluster's supervisor deletes it once the API server "
            f"answers again (`testbed status` lists it until then)"
        )
    fleet = state.fleet.spec if state.fleet else {}
    report = reporting.build(work.data, leaks, {"name": name, **fleet, "settings": state.settings})
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    default = cfg.state_root() / "runs" / f"{name}-{chosen.name}-{stamp}"
    directory, misplaced = write_report(report, work.data, output, default, junit)
    for line in misplaced:
        stderr.print(f"error: {line}", markup=False)
    click.echo(str(directory))
    if interrupted:
        return 130
    return 0 if report["verdict"] == "PASS" and not misplaced else 1


def write_report(
    report: dict[str, Any], data: RunData, output: Path | None, default: Path, junit: Path | None
) -> tuple[Path, list[str]]:
    """The report's directory, and what could not go where it was asked to (a full disk,
    say, found only now): written in ``default`` instead, so a long run's figures are
    never lost. The summary lines are printed in between."""
    from testbed.report import report as reporting

    misplaced = []
    try:
        directory = reporting.write(report, data, output or default)
    except OSError as exc:
        if output is None or output == default:
            raise
        misplaced.append(f"the report could not be written to {output} ({exc}); it is in {default}")
        directory = reporting.write(report, data, default)
    for line in reporting.summary_lines(report):
        stderr.print(line, markup=False)
    if junit is not None:
        from testbed.report.junit import junit_xml

        try:
            junit.parent.mkdir(parents=True, exist_ok=True)
            junit.write_text(junit_xml(report))
            stderr.print(f"JUnit XML: {junit}", markup=False)
        except OSError as exc:
            (directory / "junit.xml").write_text(junit_xml(report))
            misplaced.append(
                f"the JUnit XML could not be written to {junit} ({exc}); it is in {directory / 'junit.xml'}"
            )
    return directory, misplaced
