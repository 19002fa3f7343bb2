"""One fake kubelet: a Node, its Lease, its plugin watcher and its pods."""

from __future__ import annotations

from pathlib import Path

from testbed.kubeapi import KubeClient, path_for
from testbed.kubelet.node import NodeAgent, NodeSpec
from testbed.kubelet.plugins import SCAN_INTERVAL_S, PluginManager
from testbed.kubelet.pods import PodManager


class FakeKubelet:
    def __init__(
        self,
        client: KubeClient,
        spec: NodeSpec,
        kubelet_dir: Path,
        cdi_dir: Path,
        watch_pods: bool = True,
        scan_interval_s: float = SCAN_INTERVAL_S,
    ):
        self.client = client
        self.spec = spec
        self.kubelet_dir = kubelet_dir
        self.cdi_dir = cdi_dir
        self.node = NodeAgent(client, spec)
        self.plugins = PluginManager(
            kubelet_dir / "plugins_registry", on_driver_gone=self.wipe_slices, scan_interval_s=scan_interval_s
        )
        self.pods = PodManager(client, spec, self.plugins, cdi_dir, watch_pods=watch_pods)

    async def start(self) -> None:
        await self.node.register()
        self.node.start()
        self.plugins.start()
        self.pods.start()

    async def stop(self) -> None:
        await self.pods.stop()
        await self.plugins.stop()
        await self.node.stop()

    async def wipe_slices(self, driver: str) -> None:
        """What a kubelet does once no instance of a driver has been connected for 30 s."""
        listing = await self.client.get(
            path_for("resource.k8s.io/v1", "resourceslices"),
            {"fieldSelector": f"spec.nodeName={self.spec.name},spec.driver={driver}"},
        )
        for item in listing.get("items", []):
            await self.client.delete_if_exists(
                path_for("resource.k8s.io/v1", "resourceslices", item["metadata"]["name"])
            )
