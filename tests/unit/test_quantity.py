"""Kubernetes quantities, read and written as the API server does."""

import pytest

from testbed import quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [("25G", 25 * 10**9), ("1Gi", 2**30), ("4", 4), ("1500m", 2), ("1e3", 1000), ("0.5k", 500), ("100M", 10**8)],
)
def test_a_quantity_reads_as_the_whole_number_it_stands_for(text: str, value: int) -> None:
    assert quantity.parse(text) == value


@pytest.mark.parametrize(("text", "milli"), [("1", 1000), ("250m", 250), ("0.1", 100), ("1.5", 1500), ("1n", 1)])
def test_a_cpu_quantity_reads_in_millicores_rounded_up_as_the_scheduler_counts_it(text: str, milli: int) -> None:
    assert quantity.parse_milli(text) == milli


def test_a_malformed_quantity_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'25 Gbps' is not a Kubernetes quantity"):
        quantity.parse("25 Gbps")


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (4, "4"), (1000, "1k"), (1500, "1500"), (25 * 10**9, "25G"), (2**30, "1073741824"), (10**18, "1E")],
)
def test_a_whole_number_is_written_in_the_canonical_form_the_api_server_returns(value: int, text: str) -> None:
    assert quantity.canonical(value) == text
    assert quantity.parse(text) == value
