"""The sanity suite's judgement of which claims a driver's answer names, as a kubelet's."""

import grpc
import pytest

from testbed.sanity.checks import Problem, answer_problem, whole_call_failure


def test_an_answer_naming_exactly_the_claims_asked_is_fine() -> None:
    assert answer_problem("NodePrepareResources", {"a", "b"}, {"b", "a"}) == ""


def test_an_answer_naming_a_claim_not_asked_about_is_refused_in_the_kubelets_words() -> None:
    problem = answer_problem("NodePrepareResources", {"a"}, {"a", "x"})
    assert "not asked about (x)" in problem
    assert "'NodePrepareResources returned result for unknown claim UID ...'" in problem


def test_an_answer_leaving_a_claim_out_fails_the_pod_in_the_kubelets_words() -> None:
    problem = answer_problem("NodeUnprepareResources", {"a", "b", "c"}, {"a"})
    assert "left out 2 of the claims" in problem and "'NodeUnprepareResources skipped 2 ResourceClaims'" in problem


def _ended(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_a_call_failed_as_a_whole_by_the_driver_is_an_answer() -> None:
    """As the upstream kubeletplugin helper fails NodePrepareResources for a claim it cannot
    read: the API allows it, and a kubelet fails the pod's prepare on either kind of error."""
    said = whole_call_failure(_ended(grpc.StatusCode.UNKNOWN, "get resource claims:\n claim ns/c4 not allocated"))
    assert said == "UNKNOWN: get resource claims: claim ns/c4 not allocated"


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED]
)
def test_a_call_the_driver_crashed_hung_or_dropped_is_not(code: grpc.StatusCode) -> None:
    with pytest.raises(Problem, match=f"ended {code.name} .*crashed, hung or dropped it"):
        whole_call_failure(_ended(code, "Socket closed"))


def test_a_call_failed_without_a_word_is_not() -> None:
    """The pod's Event is all a user sees of it."""
    with pytest.raises(Problem, match="said nothing about why"):
        whole_call_failure(_ended(grpc.StatusCode.INTERNAL, "  "))
