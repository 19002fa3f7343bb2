"""The NIC driver's one addition to an emulated driver: once a claim's NICs are held, it
writes their interfaces into the claim's status (``status.devices[].networkData``), as a
CNI-style driver does, so users see the addresses where Kubernetes shows them."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Mapping

from fake_devices.hardware import PreparedDevice
from testbed.drivers.emulated import EmulatedDriver
from testbed.drivers.nic.config import NicConfig
from testbed.kubeapi import ApiError, apply_claim_status, claim_device_status, status_refusal_cause
from testbed.kubeletplugin.driver import ClaimToPrepare

log = logging.getLogger(__name__)


class NicDriver(EmulatedDriver):
    async def prepare(self, claim: ClaimToPrepare) -> list[PreparedDevice]:
        prepared = await super().prepare(claim)
        if self.client is not None and not claim.repair:
            await self._publish_network_status(claim, self._configs(claim))
        return prepared

    def _configs(self, claim: ClaimToPrepare) -> Mapping[str, NicConfig]:
        """Per device, the last NicConfig that applies to it."""
        found: dict[str, NicConfig] = {}
        for device, configs in self.configs(claim).items():
            for config in configs:
                if isinstance(config, NicConfig):
                    found[device] = config
        return found

    async def _publish_network_status(self, claim: ClaimToPrepare, configs: Mapping[str, NicConfig]) -> None:
        assert self.client is not None
        ref = claim.ref
        nics = {d.name: d for d in (await self.inventory()).devices}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entries = []
        for device in claim.devices:
            nic = nics.get(device.device)
            if nic is None:
                continue
            config = configs.get(device.device)
            seed = f"{ref.uid}/{device.share_id}" if device.share_id else ref.uid
            ips = list(config.ips) if config and config.ips else [derived_ip(seed, nic.attributes["index"])]
            entry: dict[str, object] = {"driver": self.name, "pool": device.pool, "device": device.device}
            if device.share_id:  # a share's status is keyed by its share ID too
                entry["shareID"] = device.share_id
            entries.append(
                entry
                | {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "InterfaceConfigured",
                            "message": f"{nic.attributes['ifName']} up",
                            "lastTransitionTime": now,
                        }
                    ],
                    "networkData": {
                        "interfaceName": str(nic.attributes["ifName"]),
                        "ips": ips,
                        "hardwareAddress": str(nic.attributes["macAddress"]),
                    },
                }
            )
        try:
            await apply_claim_status(self.client, claim_device_status(ref, entries), self.name)
        except ApiError as exc:
            # The devices are prepared; a status write failing must not fail the pod.
            cause = status_refusal_cause(exc)
            log.warning(
                "%s on %s: could not write network status of %s/%s: %s",
                self.name,
                self.node,
                ref.namespace,
                ref.name,
                f"{exc} ({cause})" if cause else exc,
            )


def derived_ip(seed: str, index: object) -> str:
    """An address for a NIC whose claim gave none: stable per claim (and share) and port."""
    host = int(hashlib.sha256(seed.encode()).hexdigest(), 16) % 250 + 2
    return f"192.168.{int(str(index))}.{host}/24"
