"""The sanity suite's judgement of which claims a driver's answer names, as a kubelet's."""

from testbed.sanity.checks import answer_problem


def test_an_answer_naming_exactly_the_claims_asked_is_fine() -> None:
    assert answer_problem("NodePrepareResources", {"a", "b"}, {"b", "a"}) == ""


def test_an_answer_naming_a_claim_not_asked_about_is_refused_in_the_kubelets_words() -> None:
    problem = answer_problem("NodePrepareResources", {"a"}, {"a", "x"})
    assert "not asked about (x)" in problem
    assert "'NodePrepareResources returned result for unknown claim UID ...'" in problem


def test_an_answer_leaving_a_claim_out_fails_the_pod_in_the_kubelets_words() -> None:
    problem = answer_problem("NodeUnprepareResources", {"a", "b", "c"}, {"a"})
    assert "left out 2 of the claims" in problem and "'NodeUnprepareResources skipped 2 ResourceClaims'" in problem
