"""Bad input is refused in one line naming the problem, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed import cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["up", "--nodes", "1000000"], "'--nodes': 1000000 is not in the range 0<=x<=100000"),
        (["up", "--nodes", "2", "--nodes-per-host", "20000"], "'--nodes-per-host': 20000 is not in the range"),
        (["up", "--port", "70000"], "'--port': 70000 is not in the range 1<=x<=65535"),
        (["up", "--port", "-1"], "'--port': -1 is not in the range"),
        (["up", "--timeout", "0"], "'--timeout': 0.0 is not in the range x>0"),
        (["up", "--timeout", "-5"], "'--timeout': -5.0 is not in the range x>0"),
        (["up", "--kcm-qps", "-5"], "'--kcm-qps': -5.0 is not in the range x>0"),
        (["up", "--scheduler-burst", "0"], "'--scheduler-burst': 0 is not in the range x>=1"),
        (["up", "--percentage-of-nodes-to-score", "101"], "'--percentage-of-nodes-to-score': 101 is not in the range"),
        (["up", "--devices-per-slice", "129"], "'--devices-per-slice': 129 is not in the range 1<=x<=128"),
        (["run", "smoke", "--set", "cluster.devicesPerSlice=0"], "cluster.devicesPerSlice: Input should be greater"),
        (["up", "--nodes", "1", "--driver-command", "/bin/drv"], "--driver-command needs --driver-name"),
        (["up", "--nodes", "1", "--driver-name", "a.example.com"], "go with --driver-command"),
        (
            ["up", "--nodes", "1", "--driver-command", "/no/such/drv -v", "--driver-name", "a.b"],
            "pool node: driver a.b's command '/no/such/drv' is not an executable file here",
        ),
        (["up", "--nodes", "1", "--driver-command", "x", "--driver-name", "A_B"], "driver name 'A_B' must be a DNS"),
        (["up", "--nodes", "1", "--driver-liveness-probe", "{grpc: {}}"], "go with --driver-command"),
        (
            ["up", "--nodes", "1", "--driver-command", "x", "--driver-name", "a.b", "--driver-liveness-probe", "grpc"],
            "--driver-liveness-probe: 'grpc' is not a mapping",
        ),
        (
            ["up", "--nodes", "1", "--driver-command", "x", "--driver-name", "a.b", "--driver-liveness-probe", "{grpc"],
            "--driver-liveness-probe: not YAML",
        ),
        (
            [
                "up",
                "--nodes",
                "1",
                "--driver-command",
                "x",
                "--driver-name",
                "a.b",
                "--driver-liveness-probe",
                "{a: 1}",
            ],
            "livenessProbe.a: Extra inputs are not permitted",
        ),
        (
            ["up", "--nodes", "1", "--driver-command", "x", "--driver-name", "a.b", "--driver-liveness-probe", "{}"],
            "livenessProbe.grpc: Field required",
        ),
        (["rollout", "a.example.com", "--max-surge", "0"], "--max-surge 0 and --max-unavailable 0: give one of them"),
        (["rollout", "a.example.com", "--max-surge", "1", "--max-unavailable", "1"], "give one of them, above 0"),
        (["rollout", "a.example.com"], "cluster 'refusals' is not running"),
        (["up", "--advertise-address", "not-an-ip"], "advertise address 'not-an-ip' is not an IP address"),
        (["up", "--advertise-address", "198.51.100.7"], "advertise address 198.51.100.7 is not an address of this"),
        (["scale", "node", "-1"], "'COUNT': -1 is not in the range 0<=x<=100000"),
        (["scale", "node", "999999999"], "'COUNT': 999999999 is not in the range 0<=x<=100000"),
        (["run", "smoke", "--set", "=5"], "--set '=5' is not KEY=VALUE"),
        (["run", "smoke", "--set", "phases..qps=1"], "--set 'phases..qps=1' is not KEY=VALUE"),
        (["run", "smoke", "--set", "phases.99.qps=1"], "'phases.99' needs an index up to 4"),
        (["run", "smoke", "--set", "phases.x.qps=1"], "'phases.x' needs an index up to 4"),
        (["run", "smoke", "--set", "phases.0.qps=[1"], "the value is not valid YAML"),
        (["run", "smoke", "--set", "faults.0.nodes=*"], "quote it for YAML: --set \"faults.0.nodes='*'\""),
        (["run", "smoke", "--set", "phases.0.qps.deeper=1"], "phases.0.qps is a value, not a mapping or list"),
        (["run", "smoke", "--set", "phases.0.qps=1"], "cluster 'refusals' is not running"),
        (["fault", "n1", "hang-attach", "x"], "hang-attach 'x': give a count of attaches, a number of at least 0"),
        (["fault", "n1", "latency", "-5"], "latency '-5': give milliseconds, a number of at least 0"),
        (["fault", "n1", "latency", "nan"], "latency 'nan': give milliseconds, a number of at least 0"),
        (["fault", "n1", "latency", "inf"], "latency 'inf': give milliseconds, a number of at least 0"),
        (["run", "smoke", "--set", "phases.0.runSeconds=.inf"], "phases[0].runSeconds: Input should be a finite"),
        (["fault", "n1", "lost", "gpu-0", "--fatal"], "--fatal is for unhealthy, not lost"),
        (["fault", "n1", "unhealthy"], "unhealthy needs a device"),
        (["fault", "n1", "latency"], "latency needs milliseconds"),
        (["fault", "n1", "clear", "gpu-0"], "clear takes no target, not 'gpu-0'"),
        (["fault", "n1", "clear"], "cluster 'refusals' is not running"),
        (["fault", "n1", "restart-kubelet", "now"], "restart-kubelet takes no target, not 'now'"),
        (["fault", "n1", "restart-kubelet"], "cluster 'refusals' is not running"),
        (["up", "--profile", "h100"], "no hardware profile named 'h100'"),
        (["up", "--log-level", "debug"], "--log-level is for synthetic nodes, and this cluster has none"),
        (["up", "--identities", "shared"], "--identities is for synthetic nodes, and this cluster has none"),
        (["run", "/nonexistent/my.yaml"], "does not exist; shipped scenarios: baseline, cl2-dra"),
        (["sanity", "--check", "helth"], "--check: no check is named like 'helth'; the checks: registration;"),
        (["sanity", "--check", "health"], "give the driver's command (after --) or --node N"),
    ],
)
def test_refused_in_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, [*args, "--name", "refusals", "--state-dir", str(tmp_path / "c")])
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "c").exists(), "nothing was started"


@pytest.mark.parametrize(
    "args",
    [["run", "smok"], ["run", "smok", "--set", "phases.0.qps=1"], ["run", "/nonexistent/my.yaml"], ["run", "./mine"]],
)
def test_a_scenario_that_is_not_there_is_hinted_at_names_and_files_not_at_fixing_it(
    args: list[str], tmp_path: Path
) -> None:
    result = CliRunner().invoke(cli.main, [*args, "--name", "refusals", "--state-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and "shipped" in result.output, result.output
    assert "hint: give a shipped scenario's name or the path of a scenario file (ending in .yaml)" in result.output
    assert "fix the file" not in result.output and "--set keys" not in result.output, result.output


def test_a_fleet_file_that_is_not_yaml_is_pointed_at_not_its_fields(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools:\n  - {name: a, count: 2}\n\t bad\n")
    result = CliRunner().invoke(cli.main, ["up", "--fleet", str(fleet), "--state-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and f"{fleet} is not valid YAML" in result.output and "line 3" in result.output
    assert "hint: fix the YAML where it points" in result.output and "field" not in result.output


def test_a_profile_file_with_a_bad_field_is_hinted_at_the_field(tmp_path: Path) -> None:
    profile = tmp_path / "mine.yaml"
    profile.write_text("name: mine\ngpus: {count: 2, memoryGiB: .nan}\n")
    result = CliRunner().invoke(cli.main, ["up", "--profile", str(profile), "--state-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and "gpus.memoryGiB: Input should be a finite number" in result.output
    assert "hint: fix the field it names; see fake_devices/profiles/" in result.output, result.output
    assert not (tmp_path / "c").exists()


def test_a_directory_is_not_a_fleet_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["up", "--fleet", str(tmp_path), "--state-dir", str(tmp_path / "c")])
    assert result.exit_code != 0 and "is a directory" in result.output


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("{'bad key': x}", "'bad key': the name must be"),
        ("{ok: 'bad value!'}", "'bad value!': a label value is at most 63"),
        ("{'Example.COM/x': y}", "the prefix before '/' must be a DNS subdomain"),
    ],
)
def test_labels_kubernetes_refuses_are_refused_up_front(labels: str, message: str, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"pools: [{{name: a, count: 1, labels: {labels}}}]\n")
    result = CliRunner().invoke(cli.main, ["up", "--fleet", str(fleet), "--state-dir", str(tmp_path / "c")])
    assert result.exit_code != 0 and message in result.output and "pools[0]" in result.output
    assert "shipped profile" not in result.output, "the hint fits the error"
    assert not (tmp_path / "c").exists()


def test_a_fleet_whose_driver_cannot_run_here_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Its own Ray head runs every NodeHost on this machine: a missing driver would fail
    its first node only after the control plane and Ray were up."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools: [{name: a, count: 1, drivers: [{name: a.example.com, command: [no-such-driver-x]}]}]\n")
    result = CliRunner().invoke(cli.main, ["up", "--fleet", str(fleet), "--state-dir", str(tmp_path / "c")])
    assert result.exit_code == 1
    assert "pool a: driver a.example.com's command 'no-such-driver-x' is not on PATH here" in result.output
    assert not (tmp_path / "c").exists()
    joined = tmp_path / "joined.yaml"  # NodeHosts of a Ray cluster the user runs may be elsewhere, where it is
    joined.write_text(fleet.read_text() + "ray: {address: '127.0.0.1:1'}\n")
    result = CliRunner().invoke(cli.main, ["up", "--fleet", str(joined), "--state-dir", str(tmp_path / "c")])
    assert "is not on PATH" not in result.output


def test_version_names_the_kubernetes_and_etcd_in_use() -> None:
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0
    assert (
        result.output.startswith("dra-testbed ")
        and "Kubernetes v1.37.1" in result.output
        and "etcd v3.6" in result.output
    )


@pytest.mark.parametrize("command", [["kubectl", "get", "nodes"], ["env"], ["kubeconfig"]])
def test_commands_on_a_cluster_that_is_not_running_say_so(command: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli.main, [command[0], "--name", "absent", "--state-dir", str(tmp_path / "c"), *command[1:]]
    )
    assert result.exit_code != 0
    assert "cluster 'absent' is not running" in result.output and "testbed list" in result.output


def test_run_help_lists_every_shipped_scenario() -> None:
    from testbed.scenarios import spec

    result = CliRunner().invoke(cli.main, ["run", "--help"])
    assert all(name in result.output for name in spec.shipped()), result.output


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (["down"], "cluster 'named': stopping"),
        (["scale", "node", "3"], "cluster 'named': scaling pool node to 3 nodes"),
        (["check"], "cluster 'named': checking"),
        (["logs", "node-000"], "cluster 'named': logs of node node-000"),
        (["fault", "node-000", "lost", "gpu-0"], "cluster 'named': lost gpu-0 on node node-000"),
    ],
)
def test_commands_that_act_on_a_cluster_name_it_first(args: list[str], first: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, [*args, "--name", "named", "--state-dir", str(tmp_path / "c")])
    assert result.output.splitlines()[0] == first, result.output


def test_sanity_names_its_cluster_and_command_first(tmp_path: Path) -> None:
    where = ["--name", "named", "--state-dir", str(tmp_path / "c")]
    result = CliRunner().invoke(cli.main, ["sanity", *where, "--", "/bin/drv", "--v=2"])
    assert result.output.splitlines()[0] == "cluster 'named': sanity of /bin/drv --v=2", result.output
    assert "cluster 'named' is not running" in result.output and result.exit_code != 0


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (["--output", "{file}"], "Directory '{file}' is a file"),
        (["-o", "{file}/report"], "--output {file}/report: {file} is a file, not a directory"),
        (["--junit", "{dir}"], "File '{dir}' is a directory"),
        (["--junit", "{file}/junit.xml"], "is a file, not a directory"),
        (["-o", "/proc/report"], "--output /proc/report: cannot write in /proc"),  # root may, /proc says no
        (["-o", "{dir}"], "--output {dir} holds report.md, which no testbed report wrote"),
    ],
)
def test_a_report_destination_that_cannot_be_written_is_refused_before_the_run(
    where: list[str], message: str, tmp_path: Path
) -> None:
    """Found only after the run, the run's figures would be lost."""
    occupied = tmp_path / "occupied"
    occupied.write_text("a user's file\n")
    (tmp_path / "report.md").write_text("a user's own report\n")
    places = {"file": str(occupied), "dir": str(tmp_path)}
    args = ["run", "smoke", *(w.format(**places) for w in where), "--name", "r", "--state-dir", str(tmp_path / "c")]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code != 0
    assert message.format(**places) in result.output, result.output
    assert "is not running" not in result.output, "refused before the cluster is looked for"
    assert occupied.read_text() == "a user's file\n"
    assert (tmp_path / "report.md").read_text() == "a user's own report\n"


def test_a_sanity_junit_file_that_cannot_be_written_is_refused_before_the_driver_runs(tmp_path: Path) -> None:
    args = ["sanity", "--name", "r", "--state-dir", str(tmp_path), "--driver-name", "d.example.com"]
    result = CliRunner().invoke(cli.main, [*args, "--junit", "/proc/sanity/junit.xml", "--", "/bin/true"])
    assert result.exit_code != 0 and "--junit /proc/sanity/junit.xml: cannot write in /proc" in result.output
    assert "is not running" not in result.output, result.output


def test_untainted_goes_with_nodes_not_a_fleet_file(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools: [{name: a, count: 1}]\n")
    result = CliRunner().invoke(
        cli.main, ["up", "--fleet", str(fleet), "--untainted", "--state-dir", str(tmp_path / "c")]
    )
    assert result.exit_code != 0 and "--untainted goes with --nodes" in result.output
    assert "taints: []" in result.output and not (tmp_path / "c").exists()
