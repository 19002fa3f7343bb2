"""Pod IPs from the node's pod CIDR, as a network plugin's host-local IPAM gives them."""

from __future__ import annotations

import pytest

from testbed.kubelet.podnetwork import AddressesExhausted, PodAddresses


def test_pods_get_distinct_addresses_after_the_gateway() -> None:
    addresses = PodAddresses()
    assert [addresses.address(uid, "100.64.3.0/24") for uid in "abc"] == ["100.64.3.2", "100.64.3.3", "100.64.3.4"]
    assert addresses.address("b", "100.64.3.0/24") == "100.64.3.3", "a pod keeps its address"


def test_a_freed_address_is_not_handed_out_again_at_once() -> None:
    """Endpoints that still name a gone pod's address must not reach the next pod."""
    addresses = PodAddresses()
    addresses.address("a", "10.1.0.0/30")  # one address for pods: .2
    addresses.release("a")
    addresses.address("b", "10.1.0.0/29")  # .2 to .6
    assert addresses.address("c", "10.1.0.0/29") == "10.1.0.3"
    addresses.release("b")
    assert [addresses.address(uid, "10.1.0.0/29") for uid in "def"] == ["10.1.0.4", "10.1.0.5", "10.1.0.6"]
    assert addresses.address("g", "10.1.0.0/29") == "10.1.0.2", "round the range, to the one freed"


def test_a_full_range_fails_the_pod_with_what_a_network_plugin_says() -> None:
    addresses = PodAddresses()
    for uid in "abcde":
        addresses.address(uid, "10.1.0.0/29")
    with pytest.raises(AddressesExhausted, match=r"no IP addresses available in range 10.1.0.0/29"):
        addresses.address("f", "10.1.0.0/29")
    addresses.release("c")
    assert addresses.address("f", "10.1.0.0/29") == "10.1.0.4"


def test_a_pod_that_kept_running_through_a_restart_keeps_its_address_and_no_other_pod_gets_it() -> None:
    addresses = PodAddresses()
    assert addresses.address("old", "100.64.3.0/24", kept="100.64.3.2") == "100.64.3.2"
    assert addresses.address("new", "100.64.3.0/24") == "100.64.3.3"


def test_after_a_restart_new_addresses_go_on_after_the_running_pods_ones() -> None:
    """Addresses below them were probably freed just before the restart (host-local IPAM
    remembers its last one on disk); endpoints may still name them."""
    addresses = PodAddresses()
    assert addresses.address("old", "100.64.3.0/24", kept="100.64.3.9") == "100.64.3.9"
    assert addresses.address("older", "100.64.3.0/24", kept="100.64.3.4") == "100.64.3.4"
    assert addresses.address("new", "100.64.3.0/24") == "100.64.3.10"


def test_a_running_pods_address_stands_even_outside_the_cidr() -> None:
    """Its status says it (the node's IP, from before pods had their own; or no CIDR then):
    a changed IP would be merged into the pod's list, which the API server refuses."""
    addresses = PodAddresses()
    assert addresses.address("hostlike", "100.64.3.0/24", kept="10.123.4.5") == "10.123.4.5"
    assert addresses.address("early", None, kept="10.123.4.5") == "10.123.4.5"
    assert addresses.address("new", "100.64.3.0/24") == "100.64.3.2"


def test_without_a_pod_cidr_there_is_no_address_to_give() -> None:
    addresses = PodAddresses()
    assert addresses.address("a", None) is None
    assert addresses.address("a", "") is None
    assert addresses.address("a", "not-a-cidr") is None


def test_ipv6_ranges_have_no_broadcast_to_skip() -> None:
    addresses = PodAddresses()
    assert addresses.address("a", "fd00:10:244:1::/126") == "fd00:10:244:1::2"
    assert addresses.address("b", "fd00:10:244:1::/126") == "fd00:10:244:1::3"
    with pytest.raises(AddressesExhausted):
        addresses.address("c", "fd00:10:244:1::/126")
