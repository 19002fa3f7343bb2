"""DRA path figures on a fresh local control plane.

    python benchmarks/bench_dra.py [--rpc-rounds N] [--pods N]

1. NodePrepareResources / NodeUnprepareResources for a 1-claim request through the real
   unix socket, the driver reading the claim from the API server: p50/p99 (target p99 <= 10 ms),
   with the driver in this process (without and with fsync), then the standalone
   `testbed-driver` as a process of its own, as on a real node (targets: prepare p50 <= 4 ms
   and p99 <= 10 ms, unprepare p50 <= 1.5 ms). The claim read is a GET the API server
   answers from etcd: on a loaded machine it alone can take most of the 4 ms.
2. A pod with a GPU claim template, from creation to Running as a watch sees it, on an
   idle 4-node fleet (real Ray, real fake kubelets): p50/p99 (target p50 <= 1.5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import ray
from kubernetes import client as k8s
from kubernetes import watch

from fake_devices.hardware import NodeHardware
from testbed.config import ControlPlaneConfig
from testbed.controlplane import cluster
from testbed.drivers import driver_on_node, load_profile
from testbed.drivers.backend import LocalBackend
from testbed.environment import install_device_classes
from testbed.fleet import raycluster
from testbed.fleet.fleet import Fleet
from testbed.fleet.spec import single_pool
from testbed.grpcapi import dra_v1_pb2, dra_v1_pb2_grpc
from testbed.kube import api_client
from testbed.kubeapi import KubeClient
from testbed.kubelet.node import SYNTHETIC_TOLERATION
from testbed.kubeletplugin.claims import ClaimReader
from testbed.kubeletplugin.prepare import DriverPaths

GPU = "gpu.dra-testbed.io"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


NODE = "bench-node"


@contextlib.contextmanager
def bench_claim(state: cluster.ClusterState) -> Iterator[str]:
    """A claim allocated gpu-0 of NODE, as the scheduler would leave it; yields its UID."""
    api = api_client(state.kubeconfig)
    resource = k8s.ResourceV1Api(api)
    claim = resource.create_namespaced_resource_claim(
        "default",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "bench"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}},
        },
    )
    resource.patch_namespaced_resource_claim_status(
        "bench",
        "default",
        {
            "status": {
                "allocation": {
                    "devices": {"results": [{"request": "gpu", "driver": GPU, "pool": NODE, "device": "gpu-0"}]}
                }
            }
        },
    )
    try:
        yield claim.metadata.uid
    finally:
        resource.delete_namespaced_resource_claim("bench", "default")
        api.close()


async def rounds_through(socket: Path, uid: str, rounds: int) -> tuple[list[float], list[float]]:
    """Prepare then unprepare the claim ``rounds`` times, as a kubelet calls: the first 10
    warm up caches and the channel and are not counted."""
    prepares, unprepares = [], []
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        ref = [dra_v1_pb2.Claim(namespace="default", uid=uid, name="bench")]
        for _ in range(rounds + 10):
            started = time.perf_counter()
            answer = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=ref))
            prepares.append(time.perf_counter() - started)
            assert not answer.claims[uid].error, answer.claims[uid].error
            started = time.perf_counter()
            await stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=ref))
            unprepares.append(time.perf_counter() - started)
    return prepares[10:], unprepares[10:]


def rpc_latency(
    state: cluster.ClusterState, rounds: int, scratch: Path, durable: bool
) -> tuple[list[float], list[float]]:
    """The driver in this process, sharing its event loop with the client."""

    async def run(uid: str) -> tuple[list[float], list[float]]:
        client = KubeClient.from_kubeconfig(state.kubeconfig)
        claims = ClaimReader(client)
        plugin = driver_on_node(
            GPU,
            NODE,
            DriverPaths.for_node(scratch / "kubelet", GPU, scratch / "cdi"),
            LocalBackend(NodeHardware(NODE, load_profile("gpu8"))),
            client,
            claims,
            publish_slices=False,
            durable=durable,
        )
        await plugin.start()
        try:
            return await rounds_through(plugin.paths.dra_socket, uid, rounds)
        finally:
            await plugin.stop(grace_s=0)
            await client.close()

    with bench_claim(state) as uid:
        return asyncio.run(run(uid))


def standalone_latency(state: cluster.ClusterState, rounds: int, scratch: Path) -> tuple[list[float], list[float]]:
    """`testbed-driver` as its own process, as on a real node (fsync on), and the client
    here: what a kubelet sees of it through the socket."""
    kubelet_dir = scratch / "kubelet"
    env = {
        **os.environ,
        "NODE_NAME": NODE,
        "DRIVERS": GPU,
        "KUBELET_DIR": str(kubelet_dir),
        "CDI_DIR": str(scratch / "cdi"),
        "KUBECONFIG": str(state.kubeconfig),
        "HEALTH_PORT": "-1",
        "METRICS_PORT": "-1",
    }
    scratch.mkdir(parents=True, exist_ok=True)
    socket = DriverPaths.for_node(kubelet_dir, GPU, scratch / "cdi").dra_socket
    log = open(scratch / "driver.log", "wb")  # noqa: SIM115 - the child writes to it until stopped
    driver = subprocess.Popen([sys.executable, "-m", "testbed.drivers.main"], env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while not socket.exists():
            if driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"testbed-driver did not serve {socket}: see {scratch / 'driver.log'}")
            time.sleep(0.05)
        with bench_claim(state) as uid:
            return asyncio.run(rounds_through(socket, uid, rounds))
    finally:
        driver.terminate()
        driver.wait(timeout=30)
        log.close()


def pod_startup(state: cluster.ClusterState, pods: int) -> list[float]:
    install_device_classes(state.kubeconfig)
    record, address = raycluster.start_head(state.root, state.layout.log("ray"))
    fleet = None
    api = api_client(state.kubeconfig)
    core = k8s.CoreV1Api(api)
    try:
        raycluster.connect(address, state.name, state.root)
        fleet = Fleet(
            single_pool(4, "gpu8", nodes_per_host=4, prefix="bench"),
            state.kubeconfig,
            state.root,
        )
        fleet.start()
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        k8s.ResourceV1Api(api).create_namespaced_resource_claim_template(
            namespace,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpu"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}}},
            },
        )
        latencies = []
        for i in range(pods):
            name = f"p{i}"
            created = time.monotonic()
            core.create_namespaced_pod(
                namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                        "tolerations": [SYNTHETIC_TOLERATION],
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                    },
                },
            )
            stream = watch.Watch()
            for event in stream.stream(
                core.list_namespaced_pod,
                namespace,
                field_selector=f"metadata.name={name}",
                timeout_seconds=60,
            ):
                if event["object"].status.phase == "Running":
                    latencies.append(time.monotonic() - created)
                    stream.stop()
            core.delete_namespaced_pod(name, namespace)  # keep the fleet idle for the next one
        return latencies
    finally:
        if fleet is not None:
            fleet.stop()
        ray.shutdown()
        raycluster.stop_head(record, state.root)
        api.close()


def report(label: str, values: list[float], target: str, met: bool) -> None:
    ms = [v * 1000 for v in values]
    print(
        f"  {label}: p50 {statistics.median(ms):.2f} ms, p99 {percentile(ms, 0.99):.2f} ms "
        f"(n={len(ms)}, max {max(ms):.2f} ms); target {target}: {'met' if met else 'MISSED'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpc-rounds", type=int, default=300)
    parser.add_argument("--pods", type=int, default=30)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tbb-"))
    config = ControlPlaneConfig(name="bench-dra", state_dir=scratch / "c")
    state = cluster.up(config)
    try:
        prepares, unprepares = rpc_latency(state, args.rpc_rounds, scratch / "n", durable=False)
        durable_prepares, durable_unprepares = rpc_latency(state, args.rpc_rounds, scratch / "d", durable=True)
        own_prepares, own_unprepares = standalone_latency(state, args.rpc_rounds, scratch / "s")
        startups = pod_startup(state, args.pods)
    finally:
        cluster.down(config)
        shutil.rmtree(scratch, ignore_errors=True)
    print("\nDRA path benchmark")
    report(
        "NodePrepareResources (1 claim, read from the API), synthetic node",
        prepares,
        "p99 <= 10 ms",
        percentile(prepares, 0.99) <= 0.010,
    )
    report(
        "NodeUnprepareResources (1 claim), synthetic node",
        unprepares,
        "p99 <= 10 ms",
        percentile(unprepares, 0.99) <= 0.010,
    )
    print("  with fsync (durable, as the standalone driver on a real node writes):")
    report(
        "  NodePrepareResources",
        durable_prepares,
        "p99 <= 10 ms",
        percentile(durable_prepares, 0.99) <= 0.010,
    )
    report(
        "  NodeUnprepareResources",
        durable_unprepares,
        "p99 <= 10 ms",
        percentile(durable_unprepares, 0.99) <= 0.010,
    )
    print("  the standalone testbed-driver, a process of its own (fsync), this process the client:")
    report(
        "  NodePrepareResources",
        own_prepares,
        "p50 <= 4 ms, p99 <= 10 ms",
        statistics.median(own_prepares) <= 0.004 and percentile(own_prepares, 0.99) <= 0.010,
    )
    report(
        "  NodeUnprepareResources",
        own_unprepares,
        "p50 <= 1.5 ms",
        statistics.median(own_unprepares) <= 0.0015,
    )
    report(
        "pod with GPU claim, created -> Running (idle 4-node fleet)",
        startups,
        "p50 <= 1.5 s",
        statistics.median(startups) <= 1.5,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
