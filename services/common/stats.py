"""Percentiles as every egoline figure reports them (pure).

One method everywhere (the corpus page's freshness, every benchmark's p50/p99): linear
interpolation between the closest ranks, numpy's default and Postgres's `percentile_cont`, so a
p99 of 200 lookups means the same in `bench curate`, `bench used-by` and on the web page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks (numpy's
    and Postgres's `percentile_cont` method); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0-100")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def rounded_percentile(values: Sequence[float], q: float, digits: int) -> float:
    """`percentile` of at least one value, rounded (a benchmark's figure; ValueError if empty)."""
    found = percentile(values, q)
    if found is None:
        raise ValueError("no values to take a percentile of")
    return round(found, digits)
