"""Fleet files: pools, defaults, and errors that name the field."""

from pathlib import Path

import pytest

from testbed.errors import TestbedError
from testbed.fleet import spec

EXAMPLE = Path(__file__).parents[2] / "examples" / "fleet.yaml"


def test_the_example_fleet_file_is_valid() -> None:
    fleet = spec.load(EXAMPLE)
    assert fleet.count == 8 and [p.profile for p in fleet.pools] == ["gpu8", "h100x8"]
    assert fleet.pools[1].node_names() == ["train-000", "train-001"]
    assert fleet.ray.address is None


def test_defaults_keep_ordinary_workloads_off_synthetic_nodes() -> None:
    fleet = spec.parse("pools: [{name: a, count: 1}]", "f.yaml")
    [taint] = fleet.pools[0].taints
    assert (taint.key, taint.effect) == ("dra-testbed.io/synthetic", "NoSchedule")
    assert fleet.nodes_per_host == spec.DEFAULT_NODES_PER_HOST and fleet.pools[0].profile == "gpu8"
    assert spec.single_pool(3, "tiny", 2).pools[0].node_names() == ["node-000", "node-001", "node-002"]


def test_untainted_nodes_carry_no_taint_in_either_pool() -> None:
    # `up --nodes 2 --real-nodes 1 --untainted`: a driver's demo manifests schedule unchanged.
    fleet = spec.single_pool(2, "tiny", 2, real=1, untainted=True)
    assert [(p.name, p.taints) for p in fleet.pools] == [("node", []), ("real", [])]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pools: []", r"pools: List should have at least 1 item"),
        ("pools: [{name: a, count: -2}]", r"pools\[0\]\.count: Input should be greater than or equal to 0"),
        ("pools: [{name: a, count: 1, profile: h200x9}]", r"pools\[0\]: .*no hardware profile named 'h200x9'"),
        ("pools: [{name: a, count: 1}, {name: a, count: 2}]", r"pool names must be unique; repeated: a"),
        ("pools: [{name: a, count: 1, taints: [{key: k, effect: Sometimes}]}]", r"pools\[0\]\.taints\[0\]\.effect"),
        ("ray: {address: somewhere}\npools: [{name: a, count: 1}]", r"ray\.address: String should match"),
        ("nodesPerHost: 0\npools: [{name: a, count: 1}]", r"nodesPerHost: Input should be greater than or equal to 1"),
        ("pools: [{name: a, count: 1, colour: red}]", r"pools\[0\]\.colour: Extra inputs are not permitted"),
        (
            "pools: [{name: a, count: 1, placement: {strategy: STRICT_SPREAD}}]",
            r"pools\[0\]\.placement\.strategy: Input should be 'DEFAULT' or 'SPREAD'",
        ),
        (
            "pools: [{name: a, count: 1, placement: {resources: {big: 0}}}]",
            r"pools\[0\]\.placement: .*resources: big must be more than 0",
        ),
        (
            "pools: [{name: a, count: 1, placement: {labels: {'bad key!': x}}}]",
            r"pools\[0\]\.placement: .*labels: 'bad key!': the name must be 1-63 letters",
        ),
        (
            "pools: [{name: a, count: 1, placement: {labels: {tier: 'no spaces'}}}]",
            r"pools\[0\]\.placement: .*labels: tier='no spaces'",
        ),
        (
            "fabric: {attachSeconds: -1}\npools: [{name: a, count: 1}]",
            r"fabric\.attachSeconds: Input should be greater than or equal to 0",
        ),
        (
            "pools: [{name: a, count: 1, syncFrequencySeconds: 0}]",
            r"pools\[0\]\.syncFrequencySeconds: Input should be greater than or equal to 1",
        ),
        (
            "pools: [{name: a, count: 1, syncFrequencySeconds: 120}]",
            r"pools\[0\]\.syncFrequencySeconds: Input should be less than or equal to 60",
        ),
        (
            "pools: [{name: a, count: 1, registryPullQPS: -1}]",
            r"pools\[0\]\.registryPullQPS: Input should be greater than or equal to 0",
        ),
        (
            "pools: [{name: a, count: 1, registryBurst: 0}]",
            r"pools\[0\]\.registryBurst: Input should be greater than or equal to 1",
        ),
    ],
)
def test_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(spec.FleetFileError, match=message):
        spec.parse(text, "fleet.yaml")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(spec.FleetFileError, match="does not exist"):
        spec.load(tmp_path / "nope.yaml")


def test_pools_name_their_drivers_built_in_or_by_command() -> None:
    fleet = spec.parse(
        "pools: [{name: a, count: 1, drivers: [gpu, {name: fpga.example.com, command: [/bin/fpga, -v], "
        "env: {X: '1'}}]}, {name: b, count: 1}]",
        "f.yaml",
    )
    mixed, default = fleet.pools
    assert mixed.built_in_drivers == ["gpu.dra-testbed.io"] and default.built_in_drivers is None
    [external] = mixed.external_drivers
    assert (external.name, external.command, external.env) == ("fpga.example.com", ["/bin/fpga", "-v"], {"X": "1"})


@pytest.mark.parametrize(
    ("drivers", "message"),
    [
        ("[tpu]", "'tpu' is not a built-in driver (gpu, nic)"),
        ("[gpu, gpu.dra-testbed.io]", "gpu.dra-testbed.io listed more than once"),
        ("[{name: Bad_Name, command: [x]}]", "driver name 'Bad_Name' must be a DNS subdomain"),
        ("[{name: a.example.com, command: []}]", "List should have at least 1 item"),
    ],
)
def test_bad_driver_lists_are_refused_naming_the_field(drivers: str, message: str) -> None:
    with pytest.raises(spec.FleetFileError, match="drivers") as caught:
        spec.parse(f"pools: [{{name: a, count: 1, drivers: {drivers}}}]", "f.yaml")
    assert message in str(caught.value)


def test_a_drivers_liveness_probe_takes_the_kubelets_defaults_and_reaches_its_nodes() -> None:
    """What the pool's probe says is what each node's prober runs with, kept across a
    NodeHost restart; what a pod spec leaves out is the kubelet's default."""
    import dataclasses
    import json

    from testbed.fleet.fleet import _recipe
    from testbed.fleet.liveness import LivenessSettings
    from testbed.fleet.membership import NodeRecipe

    fleet = spec.parse(
        "pools: [{name: a, count: 1, drivers: [{name: fpga.example.com, command: [/bin/fpga],\n"
        "  livenessProbe: {grpc: {}, periodSeconds: 5, terminationGracePeriodSeconds: 2}}]}]",
        "f.yaml",
    )
    [external] = _recipe(fleet, fleet.pools[0], 0).external
    assert external.liveness == LivenessSettings(period_s=5, grace_s=2)
    assert (external.liveness.timeout_s, external.liveness.failure_threshold, external.liveness.initial_delay_s) == (
        1,
        3,
        0,
    )
    recipe = NodeRecipe("a-000", "tiny", external=(external,))
    assert NodeRecipe.from_json(json.loads(json.dumps(dataclasses.asdict(recipe)))) == recipe


def test_a_drivers_grace_period_is_its_pods_30_s_unless_it_says_and_reaches_its_nodes() -> None:
    """SIGTERM, then SIGKILL once terminationGracePeriodSeconds is over, as the kubelet
    stops a DaemonSet pod: 30 s by default (it was 10 s, less than any pod gets)."""
    import dataclasses
    import json

    from testbed.fleet.fleet import _recipe
    from testbed.fleet.membership import NodeRecipe

    driver = "{name: fpga.example.com, command: [/bin/fpga]"
    default = spec.parse(f"pools: [{{name: a, count: 1, drivers: [{driver}}}]}}]", "f.yaml")
    [external] = _recipe(default, default.pools[0], 0).external
    assert external.grace_s == 30
    said = spec.parse(f"pools: [{{name: a, count: 1, drivers: [{driver}, terminationGracePeriodSeconds: 90}}]}}]", "f")
    [external] = _recipe(said, said.pools[0], 0).external
    assert external.grace_s == 90
    recipe = NodeRecipe("a-000", "tiny", external=(external,))
    assert NodeRecipe.from_json(json.loads(json.dumps(dataclasses.asdict(recipe)))) == recipe, "kept across a restart"
    with pytest.raises(spec.FleetFileError, match="terminationGracePeriodSeconds"):
        spec.parse(f"pools: [{{name: a, count: 1, drivers: [{driver}, terminationGracePeriodSeconds: -1}}]}}]", "f")


@pytest.mark.parametrize(
    ("probe", "message"),
    [
        ("{grpc: {port: 51515}}", r"a port of its own.*\$\(LIVENESS_PORT\)"),
        ("{periodSeconds: 5}", r"livenessProbe\.grpc: Field required"),
        ("{grpc: {}, periodSeconds: 0}", r"livenessProbe\.periodSeconds: Input should be greater than or equal to 1"),
        ("{grpc: {}, failureThreshold: 0}", r"livenessProbe\.failureThreshold: Input should be greater"),
        ("{httpGet: {path: /}}", r"livenessProbe\.httpGet: Extra inputs are not permitted"),
    ],
)
def test_bad_liveness_probes_are_refused_naming_the_field(probe: str, message: str) -> None:
    with pytest.raises(spec.FleetFileError, match=message):
        spec.parse(
            f"pools: [{{name: a, count: 1, drivers: [{{name: f.example.com, command: [f], livenessProbe: {probe}}}]}}]",
            "f.yaml",
        )


def test_node_recipes_with_external_drivers_survive_a_host_restart() -> None:
    import dataclasses
    import json

    from testbed.fleet.external import ExternalDriverSpec
    from testbed.fleet.membership import NodeRecipe

    recipe = NodeRecipe(
        "a-000",
        "tiny",
        drivers=("gpu.dra-testbed.io",),
        external=(ExternalDriverSpec("x.io", ("x",)),),
        address="10.100.0.2",
    )
    again = NodeRecipe.from_json(json.loads(json.dumps(dataclasses.asdict(recipe))))
    assert again == recipe


def test_a_pools_sync_frequency_reaches_its_kubelets_fake_and_real(tmp_path: Path) -> None:
    """What a pool sets is what its nodes' kubelets run with, kept across a NodeHost
    restart, and written into a real kubelet's configuration as a Go duration."""
    from testbed.config import KUBELET_SYNC_FREQUENCY_S
    from testbed.fleet import membership
    from testbed.fleet.fleet import _recipe
    from testbed.realnode.node import kubelet_config

    fleet = spec.parse(
        "pools: [{name: quick, count: 1, syncFrequencySeconds: 15}, {name: usual, count: 1, kubelet: real}]",
        "f.yaml",
    )
    quick, usual = (_recipe(fleet, pool, 0) for pool in fleet.pools)
    assert (quick.sync_frequency_s, usual.sync_frequency_s) == (15, KUBELET_SYNC_FREQUENCY_S)
    assert membership.decode(membership.encode([quick]))["quick-000"].sync_frequency_s == 15
    assert kubelet_config(tmp_path, [], sync_frequency_s=quick.sync_frequency_s)["syncFrequency"] == "15s"
    assert kubelet_config(tmp_path, [])["syncFrequency"] == "60s"
    assert spec.single_pool(1, "tiny", 1, sync_frequency_s=10).pools[0].sync_frequency_s == 10


def test_a_pools_image_pull_limit_reaches_its_kubelets_fake_and_real(tmp_path: Path) -> None:
    """registryPullQPS and registryBurst, as a pool sets them (the kubelet's 5 and 10
    otherwise), kept across a NodeHost restart and written into a real kubelet's
    configuration; a fake kubelet process takes them as flags."""
    from testbed.fleet import membership
    from testbed.fleet.fleet import _recipe
    from testbed.kubelet.__main__ import _arguments
    from testbed.realnode.node import kubelet_config

    fleet = spec.parse(
        "pools: [{name: eager, count: 1, registryPullQPS: 0, registryBurst: 50}, {name: usual, count: 1}]", "f.yaml"
    )
    eager, usual = (_recipe(fleet, pool, 0) for pool in fleet.pools)
    assert (eager.pull_limit, usual.pull_limit) == ((0, 50), (5, 10))
    assert membership.decode(membership.encode([eager]))["eager-000"].pull_limit == (0, 50)
    written = kubelet_config(tmp_path, [], pull_limit=eager.pull_limit)
    assert (written["registryPullQPS"], written["registryBurst"]) == (0, 50)
    assert (kubelet_config(tmp_path, [])["registryPullQPS"], kubelet_config(tmp_path, [])["registryBurst"]) == (5, 10)
    given = ["--node=n", "--kubeconfig=k", "--root-dir=r", "--cdi-dir=c"]
    flags = _arguments([*given, "--registry-pull-qps=0", "--registry-burst=50"])
    assert (flags.registry_pull_qps, flags.registry_burst) == (0, 50)
    with pytest.raises(SystemExit):
        _arguments([*given, "--registry-burst=0"])


def test_no_two_nodes_of_a_fleet_share_an_internal_ip() -> None:
    import ipaddress

    from testbed.kubelet.node import NodeSpec

    def slot(fleet: spec.FleetFile, pool: int) -> str:
        return str(fleet.node_address(fleet.pools[pool], 0)).split(".")[1]

    # Pool names whose slots (from the name) collide: the later one moves on.
    names = [f"p{i}" for i in range(30)]
    text = "pools: [" + ", ".join(f"{{name: {n}, count: 700}}" for n in names) + "]"
    fleet = spec.parse(text, "f.yaml")
    assert len({slot(spec.parse(f"pools: [{{name: {n}, count: 1}}]", "f.yaml"), 0) for n in names}) < 30
    addresses = [fleet.node_address(pool, i) for pool in fleet.pools for i in range(pool.count)]
    assert None not in addresses and len(set(addresses)) == len(addresses) == 21_000
    for address in addresses:
        octets = ipaddress.ip_address(address).packed
        assert octets[0] == 10 and 100 <= octets[1] <= 199 and 2 <= octets[3] <= 251, address
    # A pool keeps its slot in another fleet (when no earlier pool there took it).
    assert slot(spec.parse("pools: [{name: q, count: 1}, {name: p0, count: 1}]", "f.yaml"), 1) == slot(fleet, 0)
    # Past what the scheme holds, the name picks one, outside the fleets' range.
    assert fleet.node_address(fleet.pools[0], spec.FLEET_ADDRESSES_PER_POOL) is None
    own = NodeSpec("p0-64000").internal_ip()
    assert 200 <= int(own.split(".")[1]) <= 254 and own != NodeSpec("p0-64001").internal_ip()
    assert NodeSpec("a-000", address="10.100.0.2").internal_ip() == "10.100.0.2"


def test_a_pools_placement_becomes_how_ray_runs_its_hosts() -> None:
    from testbed.fleet.fleet import host_options

    fleet = spec.parse(
        "pools: [{name: a, count: 1, placement: {resources: {big-hosts: 1}, strategy: SPREAD, labels: {tier: big}}},"
        " {name: b, count: 1}]",
        "f.yaml",
    )
    spread = host_options(fleet.pools[0].placement, detached=True)
    assert spread["resources"] == {"big-hosts": 1.0} and spread["scheduling_strategy"] == "SPREAD"
    assert spread["label_selector"] == {"tier": "big"}
    assert spread["lifetime"] == "detached" and spread["num_cpus"] == 0
    assert "fallback_strategy" not in spread, "required labels have no fallback"
    plain = host_options(fleet.pools[1].placement, detached=False)
    assert "resources" not in plain and "scheduling_strategy" not in plain and "lifetime" not in plain


def test_preferred_labels_fall_back_to_the_required_ones() -> None:
    from testbed.fleet.fleet import host_options

    fleet = spec.parse(
        "pools: [{name: a, count: 1, placement: {preferLabels: {zone: b}}},"
        " {name: c, count: 1, placement: {labels: {tier: big}, preferLabels: {zone: b}}}]",
        "f.yaml",
    )
    preferred = host_options(fleet.pools[0].placement, detached=True)
    assert preferred["label_selector"] == {"zone": "b"} and preferred["fallback_strategy"] == [{"label_selector": {}}]
    both = host_options(fleet.pools[1].placement, detached=True)
    assert both["label_selector"] == {"tier": "big", "zone": "b"}
    assert both["fallback_strategy"] == [{"label_selector": {"tier": "big"}}]
    with pytest.raises(spec.FleetFileError, match="preferLabels"):
        spec.parse("pools: [{name: a, count: 1, placement: {preferLabels: {'bad key!': x}}}]", "f.yaml")


def test_a_relative_driver_executable_is_found_where_it_was_written(tmp_path: Path) -> None:
    """A driver runs in its node's work directory: `./bin/driver` there is not the user's."""
    assert spec.runnable_from(["./bin/driver", "--v=4"], tmp_path) == [str(tmp_path / "bin" / "driver"), "--v=4"]
    assert spec.runnable_from(["my-driver", "./x"], tmp_path) == ["my-driver", "./x"], "PATH lookup; args are its own"
    assert spec.runnable_from(["/opt/driver"], tmp_path) == ["/opt/driver"]
    (tmp_path / "fleets").mkdir()
    fleet_file = tmp_path / "fleets" / "fleet.yaml"
    fleet_file.write_text(
        "pools:\n  - name: mine\n    count: 1\n    profile: tiny\n"
        "    drivers: [{name: gpu.example.com, command: [../bin/driver, --v=4]}]\n"
    )
    [driver] = spec.load(fleet_file).pools[0].external_drivers
    assert driver.command == [str(tmp_path / "fleets" / ".." / "bin" / "driver"), "--v=4"]


def test_a_pool_whose_sockets_grpc_could_not_bind_is_refused_with_the_way_out() -> None:
    """Node sockets carry the node's name: a long pool name, a long runtime directory or
    a pool grown past 999 nodes can overflow a unix socket path, which a NodeHost found
    only once the control plane had started (a gRPC traceback). Built-in drivers bind
    theirs through the node's short names, so only the kubelet's pod-resources socket
    grows with the name."""
    nodes_dir = Path("/tmp/dra-testbed-0/2973d7d6")  # the default runtime directory's, for uid 0

    def pool(name: str, drivers: str = "") -> spec.Pool:
        return spec.parse(f"pools: [{{name: {name}, count: 1, profile: tiny{drivers}}}]", "f.yaml").pools[0]

    long_name = "gpu-h100-eu-west-rack-a-long-pool-n"  # 35: its registration sockets were 120 bytes
    pool(long_name).check_socket_paths(nodes_dir)
    longest = pool(long_name).longest_socket(nodes_dir)
    assert longest == nodes_dir / f"{long_name}-000" / "kubelet" / "pod-resources" / "kubelet.sock"
    assert str(pool(long_name, ", drivers: [gpu]").longest_socket(nodes_dir)).endswith("pod-resources/kubelet.sock")

    with pytest.raises(TestbedError) as refused:
        pool(long_name + "-eu1").check_socket_paths(nodes_dir)
    assert "its nodes' unix sockets would be 106 bytes long, more than the 105 gRPC binds" in refused.value.message
    assert refused.value.hint == (
        "give the pool a name 1 character shorter or set TESTBED_RUNTIME_DIR to a directory "
        "1 character shorter than /tmp/dra-testbed-0"
    )
    pool(long_name + "-eu").check_socket_paths(nodes_dir, count=1000)  # 105 bytes: as much as fits
    with pytest.raises(TestbedError):  # its 1,001st node's name is one character longer
        pool(long_name + "-eu").check_socket_paths(nodes_dir, count=1001)

    deep = Path("/home/someone/" + "x" * 70) / "2973d7d6"
    with pytest.raises(TestbedError) as refused:
        pool("gpu").check_socket_paths(deep)
    assert refused.value.hint is not None and "give the pool a name" not in refused.value.hint, "not a way out"
    assert f"shorter than {deep.parent}" in refused.value.hint
    real = spec.parse(f"pools: [{{name: {long_name}-eu1, count: 1, profile: tiny, kubelet: real}}]", "f.yaml")
    real.pools[0].check_socket_paths(nodes_dir)  # a real kubelet's sockets are in a sandbox of its own
