"""Which sanity checks `--check` runs: what was asked for and what it stands on."""

from __future__ import annotations

import pytest

from testbed.sanity.checks import CHECK_NAMES, select


def test_a_check_of_its_own_runs_with_registration_and_the_slices_that_make_its_class() -> None:
    assert select(["per-claim"]) == ["registration", "resource slices within API limits", "per-claim errors"]


def test_checks_before_any_claim_need_no_slices() -> None:
    assert select(["SOCKET names"]) == ["registration", "rolling-update socket names"]


def test_a_check_on_the_shared_claim_brings_its_prepare_and_unprepare() -> None:
    assert select(["idempotent"]) == [
        "registration",
        "resource slices within API limits",
        "prepare an allocated claim",
        "idempotent prepare",
        "unprepare, twice and unknown",
    ]


def test_several_texts_keep_the_suites_order() -> None:
    chosen = select(["API server", "health", "registration"])
    assert chosen == ["registration", "resource slices within API limits", "health stream", "API server unreachable"]
    assert chosen == [name for name in CHECK_NAMES if name in chosen]


@pytest.mark.parametrize("text", ["no such check", "", "  "])
def test_a_text_naming_no_check_is_refused_with_the_names(text: str) -> None:
    with pytest.raises(ValueError, match="no check is named like") as refused:
        select([text])
    assert "kill -9 mid-prepare, restart, retry" in str(refused.value)
