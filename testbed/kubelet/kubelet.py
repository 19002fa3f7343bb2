"""One fake kubelet: a Node, its Lease, its plugin watcher, its pods and the pod-resources
API that monitoring agents ask."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import grpc

from testbed.config import KUBELET_SYNC_FREQUENCY_S, REGISTRY_BURST, REGISTRY_PULL_QPS
from testbed.grpcapi import podresources_v1_pb2_grpc
from testbed.kubeapi import ApiError, KubeClient, path_for
from testbed.kubelet import podresources
from testbed.kubelet.containerevents import ImageStore
from testbed.kubelet.lease import LeaseFence
from testbed.kubelet.node import NodeAgent, NodeSpec, NodeWatcher
from testbed.kubelet.plugins import SCAN_INTERVAL_S, PluginManager
from testbed.kubelet.pods import PodManager
from testbed.kubelet.ratelimit import TokenBucket
from testbed.tasks import cancel_and_wait

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "dra_manager_state.json"
IMAGES_FILE = "runtime-images.json"
"""The images the node's pods pulled: a container runtime's state, kept beside the
kubelet's so a restarted kubelet finds them (containerevents.ImageStore)."""


class FakeKubelet:
    def __init__(
        self,
        client: KubeClient,
        spec: NodeSpec,
        kubelet_dir: Path,
        cdi_dir: Path,
        watch_pods: bool = True,
        scan_interval_s: float = SCAN_INTERVAL_S,
        registry_dir: Path | None = None,
        watch_client: KubeClient | None = None,
        fence: LeaseFence | None = None,
        durable: bool = True,
        node_watcher: NodeWatcher | None = None,
        preloaded_images: Sequence[str] = (),
        sync_frequency_s: float = KUBELET_SYNC_FREQUENCY_S,
        pull_limit: tuple[int, int] = (REGISTRY_PULL_QPS, REGISTRY_BURST),
    ):
        """``registry_dir``: where plugins register (default ``kubelet_dir/plugins_registry``).
        ``watch_client``: what the pod watch holds its connection on (default ``client``).
        ``fence``: for a node another server may take over (see NodeAgent).
        ``durable``: fsync its claim checkpoint, as a kubelet does (False: synthetic nodes).
        ``node_watcher``: a NodeHost's watch of its nodes (default: one of this Node alone).
        ``preloaded_images``: on the node from the start, as in a node image.
        ``sync_frequency_s``: the KubeletConfiguration's syncFrequency (pods.py).
        ``pull_limit``: its registryPullQPS and registryBurst (containerevents.py)."""
        self.client = client
        self.spec = spec
        self.kubelet_dir = kubelet_dir
        self.cdi_dir = cdi_dir
        self.node = NodeAgent(client, spec, fence)
        self._own_node_watcher = node_watcher is None
        self.node_watcher = node_watcher or NodeWatcher.for_node(watch_client or client, spec.name)
        self.plugins = PluginManager(
            registry_dir or kubelet_dir / "plugins_registry",
            on_driver_gone=self.wipe_slices,
            scan_interval_s=scan_interval_s,
            on_health_change=lambda driver, devices: self.pods.health_changed(driver, devices),
            node=spec.name,
        )
        images = ImageStore(kubelet_dir / IMAGES_FILE, preloaded_images, TokenBucket(*pull_limit))
        self.node.report_images(images)
        self.pods = PodManager(
            client,
            spec,
            self.plugins,
            cdi_dir,
            watch_pods=watch_pods,
            checkpoint=kubelet_dir / CHECKPOINT_FILE,
            images=images,
            watch_client=watch_client,
            durable=durable,
            pod_cidr=lambda: (self.node.observed or {}).get("spec", {}).get("podCIDR"),
            sync_frequency_s=sync_frequency_s,
            node_seen=lambda: self.node.observed,
        )
        self._startup_wipe: asyncio.Task[None] | None = None
        self._pod_resources: grpc.aio.Server | None = None

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / podresources.SOCKET

    async def start(self) -> None:
        self.node_watcher.add(self.spec.name, self.node)
        if self._own_node_watcher:
            self.node_watcher.start()
        await self.node.register()
        if not self.node.created:
            # As a starting kubelet does, in the background: no driver is registered yet,
            # so none of the node's slices can be trusted. A Node just created owns no
            # slices (those of an earlier Node of that name belong to its old UID and the
            # garbage collector removes them), so a fleet's first start skips the call.
            self._startup_wipe = asyncio.create_task(self.wipe_slices(None), name=f"wipe-{self.spec.name}")
        self.node.start()
        self.plugins.start()
        self.pods.start()
        await self._serve_pod_resources()

    async def _serve_pod_resources(self) -> None:
        socket = self.pod_resources_socket
        socket.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)  # a previous run's
        server = grpc.aio.server()
        podresources_v1_pb2_grpc.add_PodResourcesListerServicer_to_server(
            podresources.PodResourcesService(self.pods), server
        )
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        self._pod_resources = server

    async def stop(self) -> None:
        await cancel_and_wait(self._startup_wipe)
        if self._pod_resources is not None:
            await self._pod_resources.stop(None)
        await self.pods.stop()
        await self.plugins.stop()
        await self.node.stop()
        self.node_watcher.remove(self.spec.name, self.node)
        if self._own_node_watcher:
            await self.node_watcher.stop()

    async def wipe_slices(self, driver: str | None) -> None:
        """Delete this node's ResourceSlices (of one driver, or all): at start-up, and once
        no instance of a driver has been connected for 30 s. One DeleteCollection, as the
        kubelet sends it."""
        selector = f"spec.nodeName={self.spec.name}" + (f",spec.driver={driver}" if driver else "")
        try:
            await self.client.request(
                "DELETE", path_for("resource.k8s.io/v1", "resourceslices"), params={"fieldSelector": selector}
            )
        except ApiError as exc:
            log.warning("%s: deleting ResourceSlices (%s) failed: %s", self.spec.name, selector, exc)
