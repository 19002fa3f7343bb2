"""The kubelet's pod-resources API (v1) on ``<kubelet dir>/pod-resources/kubelet.sock``.

Monitoring agents (a GPU exporter, say) ask it which devices each container holds, to
label their figures by pod. Answered as kubelet v1.37 answers (pkg/kubelet/apis/
podresources/server_v1.go and the container manager's GetDynamicResources):
- ``List``: the active pods; ``Get``: any pod the kubelet knows, by namespace and name;
- per container (restartable init containers first, then containers): the claims it
  names in ``resources.claims`` (the whole claim, whatever request it names) and the
  pod's extended-resource claim if a request of it is mapped to the container; a claim
  the kubelet does not hold leaves that container with no DRA resources at all;
- per claim, one entry per prepared device, each with the CDI IDs of that device AND of
  the devices of the same driver listed before it: the real kubelet builds the list so
  (it grows one slice across a driver's devices), and consumers see it so;
- no device-plugin devices, exclusive CPUs or memory blocks (a testbed node has none);
- at most 100 calls a second, bursts of 10, beyond which a call is refused with
  RESOURCE_EXHAUSTED "rejected by rate limit".
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc

from testbed.grpcapi import podresources_v1_pb2 as pb2
from testbed.grpcapi import podresources_v1_pb2_grpc as pb2_grpc
from testbed.kubeapi import Obj
from testbed.kubelet.claiminfo import PreparedClaim
from testbed.kubelet.dra import StartFailed, pod_claim_name
from testbed.kubelet.pods import PodManager
from testbed.kubelet.ratelimit import TokenBucket

log = logging.getLogger(__name__)
SOCKET = Path("pod-resources") / "kubelet.sock"
"""Under the kubelet's root directory, where the kubelet serves it."""
QPS, BURST = 100.0, 10


class PodResourcesService(pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: PodManager, limit: TokenBucket | None = None):
        self.pods = pods
        self.limit = limit or TokenBucket(QPS, BURST)

    async def _admit(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if not self.limit.take():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    async def List(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await self._admit(context)
        return pb2.ListPodResourcesResponse(pod_resources=[self._pod(pod) for pod in self.pods.active_pods()])

    async def Get(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await self._admit(context)
        pod = self.pods.known_pod(request.pod_namespace, request.pod_name)
        if pod is None:  # abort raises: the return below is for the type checker
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
            )
            return pb2.GetPodResourcesResponse()
        return pb2.GetPodResourcesResponse(pod_resources=self._pod(pod))

    async def GetAllocatableResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await self._admit(context)
        return pb2.AllocatableResourcesResponse()

    def _pod(self, pod: Obj) -> Any:
        spec = pod["spec"]
        sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
        containers = [self._container(pod, c) for c in [*sidecars, *spec.get("containers", [])]]
        meta = pod["metadata"]
        return pb2.PodResources(name=meta["name"], namespace=meta["namespace"], containers=containers)

    def _container(self, pod: Obj, container: Obj) -> Any:
        return pb2.ContainerResources(name=container["name"], dynamic_resources=self._dynamic(pod, container))

    def _dynamic(self, pod: Obj, container: Obj) -> list[Any]:
        claims = self._container_claims(pod, container)
        if claims is None:
            return []
        result = []
        for claim in claims:
            resources = []
            for driver in sorted({d.driver for d in claim.devices}):
                cdi_devices: list[Any] = []
                for device in (d for d in claim.devices if d.driver == driver):
                    cdi_devices += [pb2.CDIDevice(name=i) for i in device.cdi_device_ids]
                    resources.append(
                        pb2.ClaimResource(
                            cdi_devices=list(cdi_devices),
                            driver_name=driver,
                            pool_name=device.pool,
                            device_name=device.device,
                            share_id=device.share_id,
                        )
                    )
            result.append(
                pb2.DynamicResource(claim_name=claim.name, claim_namespace=claim.namespace, claim_resources=resources)
            )
        return result

    def _container_claims(self, pod: Obj, container: Obj) -> list[PreparedClaim] | None:
        """The claims the container uses, in the pod's order; None if one is not held here
        (the kubelet then reports none for the container)."""
        meta = pod["metadata"]
        used = {ref["name"] for ref in container.get("resources", {}).get("claims", [])}
        names: list[str] = []
        try:
            for entry in pod["spec"].get("resourceClaims", []):
                if entry["name"] in used:
                    name, _ = pod_claim_name(pod, entry)
                    if name is not None:
                        names.append(name)
        except StartFailed as exc:
            log.warning("pod-resources: %s", exc)
            return None
        extended = pod.get("status", {}).get("extendedResourceClaimStatus")
        if extended and any(m.get("containerName") == container["name"] for m in extended.get("requestMappings", [])):
            names.append(extended["resourceClaimName"])
        claims = []
        for name in names:
            claim = self.pods.dra.claim_named(meta["namespace"], name)
            if claim is None:
                log.debug("pod-resources: no information for ResourceClaim %s/%s", meta["namespace"], name)
                return None
            claims.append(claim)
        return claims
