"""Order statistics over recent samples."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank q-quantile of `values` (an observed value, never interpolated).

    Args:
        values: The samples, in any order.
        q: The quantile, from 0 to 1 (0.95 for p95).

    Returns:
        The smallest sample with at least `q` of all samples at or below it, or None when
        there are no samples.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
