"""The water-filling and the bisection of the round time over it: their invariants, for
one silo as for many (one implementation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lbbsp.core.allocation.waterfill import TOLERANCE, least_round_time, waterfill


def _problem(seed: int, n: int) -> dict[str, np.ndarray | float]:
    """Rates, bounds (some caps infinite, some lower bounds 0) and a total within them."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.1, 4.0, n)
    total = float(rng.integers(n, 64 * n + 1))
    lo = np.floor(rng.uniform(0, 1, n) * total / n / 2) * (rng.random(n) < 0.7)
    hi = np.ceil(np.maximum(rng.uniform(1, 4, n) * total / n, lo + 1))
    hi[rng.random(n) < 0.3] = np.inf
    hi[0] = max(hi[0], total)  # the total within the bounds
    offset = rng.uniform(0, 2.0, n) * (rng.random() < 0.5)
    return {"q": q, "lo": lo, "hi": hi, "total": total, "offset": offset}


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40))
def test_waterfill_meets_the_total_within_the_bounds_at_one_level(seed: int, n: int) -> None:
    # Prepare
    p = _problem(seed, n)
    q, lo, hi, offset = p["q"], p["lo"], p["hi"], p["offset"]
    assert isinstance(q, np.ndarray) and isinstance(lo, np.ndarray)
    assert isinstance(hi, np.ndarray) and isinstance(offset, np.ndarray)

    # Execute
    x, s = waterfill(q, lo, hi, float(p["total"]), offset=offset)

    # Assert: the total, the bounds, and every silo inside its bounds at the level s
    assert math.isclose(float(x.sum()), float(p["total"]), rel_tol=1e-9)
    assert np.all(x >= lo - 1e-9) and np.all(x <= hi + 1e-9)
    free = (x > lo + 1e-6) & (x < hi - 1e-6)
    np.testing.assert_allclose(x[free], s * q[free] - offset[free], rtol=1e-7, atol=1e-7)
    level = s * q - offset
    assert np.all(level[x <= lo + 1e-6] <= lo[x <= lo + 1e-6] + 1e-6)  # held up by lo
    assert np.all(level[x >= hi - 1e-6] >= hi[x >= hi - 1e-6] - 1e-6)  # held down by hi


@pytest.mark.parametrize(
    ("q", "lo", "hi", "total", "expected"),
    [
        ([2.0], [0.0], [np.inf], 7.0, [7.0]),  # one silo: the whole total
        ([1.0, 3.0], [0.0, 0.0], [np.inf, np.inf], 8.0, [2.0, 6.0]),  # proportional to q
        ([1.0, 3.0], [0.0, 0.0], [np.inf, 4.0], 8.0, [4.0, 4.0]),  # a cap holds silo 1
        ([1.0, 3.0], [5.0, 0.0], [np.inf, np.inf], 8.0, [5.0, 3.0]),  # a floor holds silo 0
        ([1.0, 1.0], [2.0, 2.0], [2.0, 2.0], 4.0, [2.0, 2.0]),  # every silo fixed
    ],
)
def test_waterfill_splits_known_cases(
    q: list[float], lo: list[float], hi: list[float], total: float, expected: list[float]
) -> None:
    # Execute
    x, _ = waterfill(np.array(q), np.array(lo), np.array(hi), total)

    # Assert
    np.testing.assert_allclose(x, expected, rtol=1e-12)


def test_waterfill_with_offsets_is_the_min_max_split_of_lines() -> None:
    # Prepare: t_i = a_i x_i + b_i, no bounds: every silo finishes at T*
    a, b, total = np.array([0.01, 0.02, 0.04]), np.array([0.5, 0.1, 0.0]), 300.0
    t_star = (total + np.sum(b / a)) / np.sum(1 / a)

    # Execute
    x, t = waterfill(1 / a, np.zeros(3), np.full(3, np.inf), total, offset=b / a)

    # Assert
    assert math.isclose(t, t_star, rel_tol=1e-12)
    np.testing.assert_allclose(a * x + b, t_star, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12))
def test_least_round_time_is_the_smallest_time_that_meets_the_budget(seed: int, n: int) -> None:
    # Prepare: hinge costs spread wide, a budget between the least noise and more
    rng = np.random.default_rng(seed)
    p = _problem(seed, n)
    lo, hi, total = p["lo"], p["hi"], float(p["total"])
    assert isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray)
    a = rng.uniform(0.001, 0.1, n) * rng.uniform(1, 16, n)
    b = rng.uniform(0, 0.5, n) * (rng.random() < 0.6)
    c = rng.uniform(0.1, 4.0, n) ** 2
    q = np.sqrt(c)
    least = waterfill(q, lo, hi, total)[0]
    if (least <= 0).any():
        return  # no budget can be met: nothing to bisect
    budget = float((c / least).sum()) * float(rng.uniform(1.0, 1.5))

    def variance(t: float) -> float:
        caps = np.maximum(np.minimum(hi, (t - b) / a), lo)
        x = waterfill(q, lo, caps, total)[0]
        return math.inf if (x <= 0).any() else float((c / x).sum())

    low = float(np.max(a * lo + b))
    high = float(np.max(a * np.where(np.isinf(hi), total, hi) + b)) + 1.0
    if variance(low) <= budget:
        return  # met at once: nothing to bisect

    # Execute
    t = least_round_time((low, high), q=q, lo=lo, hi=hi, a=a, b=b, c=c, total=total, budget=budget)

    # Assert: met at t, missed a little below it
    assert variance(t) <= budget
    assert variance(t - 4 * TOLERANCE * t) > budget
