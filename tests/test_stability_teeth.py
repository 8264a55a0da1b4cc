"""``simulations.stability.median_interval``: the order-statistic indices, exactly (issue 66:
the seeded coverage test of test_stability.py decides an index only on the third decimal of
a coverage estimate)."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from simulations.stability import MEDIAN_LEVEL, median_interval


def _j(N: int, level: float) -> int:
    """docs: the largest j with P(Binomial(N, 1/2) < j) <= (1 - level) / 2, at least 1."""
    alpha, best, below = (1 - level) / 2, 1, 0
    for j in range(1, N + 1):
        below += comb(N, j - 1)  # 2^N P(Binomial(N, 1/2) < j)
        if below <= alpha * 2**N:
            best = j
    return best


@pytest.mark.parametrize("level", [MEDIAN_LEVEL, 0.9, 0.99, 0.6])
def test_interval_ends_are_the_documented_order_statistics(level):
    rng = np.random.default_rng(0)
    for N in range(1, 90):
        values = rng.permutation(N).astype(float) * 1.5  # x_(k) = 1.5 (k - 1)
        med, lo, hi = median_interval(values, level)
        j = _j(N, level)
        assert (lo, hi) == (1.5 * (j - 1), 1.5 * (N - j)), N
        assert med == 1.5 * (N - 1) / 2


def test_default_level_and_known_indices():
    """N = 100 at 95%: j = 40 (P(B < 40) = 0.0176, P(B < 41) = 0.0284), the 40th and 61st."""
    assert MEDIAN_LEVEL == 0.95
    assert _j(100, 0.95) == 40
    assert median_interval(np.arange(100.0)) == (49.5, 39.0, 60.0)
    assert median_interval(np.arange(5.0)) == (2.0, 0.0, 4.0)  # j = 1 at least
    assert median_interval([3.0]) == (3.0, 3.0, 3.0)
