"""The one percentile the engine's stats, the server's metrics and the CLI report."""

from __future__ import annotations

import pytest

from mythic.observability import percentile

pytestmark = pytest.mark.unit


def test_percentile_is_the_nearest_observed_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.95) == 5.0
    assert percentile(values, 0.2) == 1.0
    assert percentile(values, 0.21) == 2.0
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 5.0
    assert percentile(iter(range(1, 101)), 0.99) == 99


def test_no_samples_have_no_percentile() -> None:
    assert percentile([], 0.5) is None


@pytest.mark.parametrize("q", [-0.1, 1.5, 95])
def test_a_quantile_outside_zero_to_one_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        percentile([1.0], q)
