"""The shared local control plane serves Kubernetes 1.37 with DRA, and allocates."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from testbed import config
from testbed.controlplane import selfcheck
from testbed.testing import wait_for

pytestmark = pytest.mark.controlplane


def test_version_is_the_pinned_release(kube_api: k8s.ApiClient) -> None:
    info = k8s.VersionApi(kube_api).get_code()
    assert info.git_version == config.KUBERNETES_VERSION
    assert (info.major, info.minor) == ("1", "37")


def test_resource_v1_serves_every_dra_kind(kube_api: k8s.ApiClient) -> None:
    assert k8s.ResourceV1Api(kube_api).get_api_resources().group_version == "resource.k8s.io/v1"
    assert {
        "deviceclasses",
        "resourceclaims",
        "resourceclaimtemplates",
        "resourceslices",
        "devicetaintrules",
    } <= selfcheck.served_dra_resources(kube_api)


def test_invalid_cel_selector_is_rejected_with_the_cel_error(kube_api: k8s.ApiClient) -> None:
    api = k8s.ResourceV1Api(kube_api)
    name = f"bad-cel-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ApiException) as info:
        api.create_device_class(selfcheck.device_class(name, "device.driver == "))
    assert info.value.status == 422
    assert "spec.selectors[0].cel.expression" in info.value.body
    assert "compilation failed" in info.value.body


def test_valid_cel_selector_is_accepted(kube_api: k8s.ApiClient) -> None:
    api = k8s.ResourceV1Api(kube_api)
    name = f"good-cel-{uuid.uuid4().hex[:6]}"
    created = api.create_device_class(
        selfcheck.device_class(
            name,
            "device.driver == 'gpu.example.com' && device.attributes['gpu.example.com'].model == 'x'",
        )
    )
    try:
        assert created.metadata.name == name
    finally:
        api.delete_device_class(name)


def test_allocation_path_without_a_driver(kube_api: k8s.ApiClient) -> None:
    """KCM makes the claim from the template; the scheduler allocates a device from a
    hand-written slice, reserves the claim for the pod and binds the pod."""
    result = selfcheck.run_allocation_check(kube_api)
    assert result.bound_node == result.node
    assert result.driver.startswith("check-") and result.pool == result.node
    assert result.device in {"dev-0", "dev-1"}
    assert result.reserved_for == [result.pod_uid]
    core, resource = k8s.CoreV1Api(kube_api), k8s.ResourceV1Api(kube_api)
    # the check cleans up after itself
    assert result.node not in {n.metadata.name for n in core.list_node().items}
    assert not resource.list_resource_slice(field_selector=f"spec.driver={result.driver}").items

    def namespace_gone() -> bool:  # not left Terminating for the pod garbage collector
        try:
            core.read_namespace(result.node)  # the check's namespace is named as its node
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(namespace_gone, 30, "the check's namespace to be gone")
