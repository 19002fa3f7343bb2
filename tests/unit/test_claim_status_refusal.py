"""A claim's status write refused for a reason the API server's words do not give is
explained in the log line, where its words ("allocation: Invalid value: null") mislead."""

from __future__ import annotations

from testbed.kubeapi import ApiError, status_refusal_cause

SPACED_PARAMETERS = (  # kube-apiserver v1.37.1, a claim made by the Python kubernetes client
    'ResourceClaim.resource.k8s.io "c-spaced" is invalid: status.allocation: Invalid value: null: '
    "field cannot be modified once set"
)


def test_the_byte_for_byte_parameters_refusal_is_explained_with_its_way_out() -> None:
    cause = status_refusal_cause(ApiError(422, "Invalid", SPACED_PARAMETERS))
    assert "sent as JSON with spaces" in cause and "compact JSON (kubectl does)" in cause


def test_other_refusals_are_left_to_the_api_servers_words() -> None:
    device_not_allocated = 'status.devices[0]: Invalid value: {"Driver":"x"}: must be an allocated device in the claim'
    assert status_refusal_cause(ApiError(422, "Invalid", device_not_allocated)) == ""
    assert status_refusal_cause(ApiError(409, "Conflict", SPACED_PARAMETERS)) == ""
    assert status_refusal_cause(ApiError(404, "NotFound", 'resourceclaims.resource.k8s.io "c" not found')) == ""
