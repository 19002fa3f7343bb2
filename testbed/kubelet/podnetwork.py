"""Pod IPs, as a node's network plugin hands them out from the node's pod CIDR.

The CIDR is the Node's ``spec.podCIDR``, which the controller-manager allocates when it
runs with ``--allocate-node-cidrs`` (kind's does, and the local control plane's). Like
CNI's host-local IPAM: the subnet's first address is the gateway, each new pod gets the
next free address after the last one handed out (an address just freed is not reused at
once: endpoints that still name it would reach the wrong pod), and an address is freed
when the pod's sandbox goes. A pod with ``hostNetwork``, or on a node without a pod CIDR,
has the node's IP.
"""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AddressesExhausted(Exception):
    pass


class PodAddresses:
    """One node's pod IPs, by pod UID."""

    def __init__(self) -> None:
        self._network: Network | None = None
        self._by_pod: dict[str, str] = {}
        self._taken: set[str] = set()
        self._last = -1
        """Offset in the subnet of the address last handed out."""

    def address(self, pod_uid: str, cidr: str | None, kept: str | None = None) -> str | None:
        """The pod's IP: the one it has; else ``kept``, what the status of a pod whose
        sandbox outlived a kubelet restart says (a running pod's IP never changes, and the
        API server would merge a second one in), held if it lies in ``cidr``; else the
        next free one. None when there is no CIDR (the caller uses the node's IP)."""
        if pod_uid in self._by_pod:
            return self._by_pod[pod_uid]
        network = self._use(cidr)
        if kept:
            if network is not None and kept not in self._taken and _within(kept, network):
                self._take(pod_uid, kept)
                # host-local IPAM keeps its last address on disk across restarts; here the
                # next ones go on after the highest a running pod holds, not from the start
                # of the range, where addresses freed just before the restart are.
                self._last = max(self._last, int(ipaddress.ip_address(kept)) - int(network.network_address))
            return kept
        if network is None:
            return None
        first = 2  # after the subnet's own address and its gateway
        end = network.num_addresses - (1 if network.version == 4 else 0)  # before IPv4's broadcast
        count = end - first
        start = self._last + 1 if first <= self._last < end else first
        for step in range(max(count, 0)):
            offset = first + (start - first + step) % count
            candidate = str(network[offset])
            if candidate not in self._taken:
                self._last = offset
                return self._take(pod_uid, candidate)
        raise AddressesExhausted(f"no IP addresses available in range {network} ({len(self._taken)} pods hold them)")

    def release(self, pod_uid: str) -> None:
        address = self._by_pod.pop(pod_uid, None)
        if address is not None:
            self._taken.discard(address)

    def _use(self, cidr: str | None) -> Network | None:
        if not cidr:
            return None
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            return None
        if network != self._network:  # a Node made again with another CIDR: its pods' IPs stand
            self._network = network
            self._last = -1
        return network

    def _take(self, pod_uid: str, address: str) -> str:
        self._by_pod[pod_uid] = address
        self._taken.add(address)
        return address


def _within(address: str, network: Network) -> bool:
    try:
        return ipaddress.ip_address(address) in network
    except ValueError:
        return False
