"""Tests for fl_lbbsp.core.allocation.allocators and fl_lbbsp.core.allocation.rounding."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fl_lbbsp.core import (
    fit_linear_cost,
    ideal_round_time,
    idle_fraction,
    integer_bounds,
    linear_minmax,
    linear_minmax_continuous,
    proportional,
    round_to_total,
)

positive = st.floats(min_value=0.01, max_value=100.0, allow_nan=False, allow_infinity=False)


@st.composite
def bounded_problem(draw: st.DrawFn, max_silos: int = 6) -> dict[str, object]:
    """Shares/speeds with integer bounds and a total inside the feasible range."""
    n = draw(st.integers(min_value=1, max_value=max_silos))
    lower = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    width = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    unbounded = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    upper = [
        math.inf if free else lo + w for lo, w, free in zip(lower, width, unbounded, strict=True)
    ]
    high = sum(lower) + 200 if any(unbounded) else int(sum(upper))
    total = draw(st.integers(min_value=sum(lower), max_value=high))
    return {"n": n, "lower": lower, "upper": upper, "total": total}


# ----------------------------------------------------------------------------- proportional
def test_proportional_paper_example() -> None:
    # Prepare
    speeds = [16, 8, 8, 4, 4]

    # Execute
    sizes = proportional(speeds, 160)

    # Assert
    assert sizes.tolist() == [64, 32, 32, 16, 16]
    assert sizes.dtype == np.int64


def test_proportional_sums_exactly_when_shares_are_fractional() -> None:
    # Prepare
    speeds = [1.0, 1.0, 1.0]

    # Execute
    sizes = proportional(speeds, 100)

    # Assert: 33.33.. each; the spare unit goes to the lowest index (deterministic ties)
    assert sizes.sum() == 100
    assert sorted(sizes.tolist()) == [33, 33, 34]
    assert sizes.tolist() == proportional(speeds, 100).tolist()


def test_proportional_respects_memory_cap_and_redistributes() -> None:
    # Prepare: the fastest silo can hold only 40 samples
    speeds = [16, 8, 8, 4, 4]
    upper = [40, math.inf, math.inf, math.inf, math.inf]

    # Execute
    sizes = proportional(speeds, 160, upper=upper)

    # Assert: capped silo at its cap, the other 120 split 8:8:4:4
    assert sizes.tolist() == [40, 40, 40, 20, 20]


def test_proportional_respects_lower_bound() -> None:
    # Prepare: a very slow silo would get 0 without a minimum
    speeds = [1000.0, 1.0]

    # Execute
    sizes = proportional(speeds, 64, lower=[1, 8])

    # Assert
    assert sizes.tolist() == [56, 8]


@pytest.mark.parametrize(
    "speeds",
    [[], [1.0, 0.0], [1.0, -2.0], [1.0, math.nan], [1.0, math.inf]],
    ids=["empty", "zero", "negative", "nan", "inf"],
)
def test_proportional_rejects_bad_speeds(speeds: list[float]) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="speeds"):
        proportional(speeds, 10)


@pytest.mark.parametrize(
    ("total", "lower", "upper"),
    [(10, [6, 6], None), (10, None, [4, 5]), (-1, None, None)],
    ids=["below-lower", "above-upper", "negative"],
)
def test_proportional_rejects_infeasible_total(
    total: int, lower: list[float] | None, upper: list[float] | None
) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError):
        proportional([1.0, 2.0], total, lower=lower, upper=upper)


@settings(max_examples=150, deadline=None)
@given(problem=bounded_problem(), data=st.data())
def test_proportional_invariants(problem: dict[str, object], data: st.DataObject) -> None:
    # Prepare
    n = problem["n"]
    speeds = data.draw(st.lists(positive, min_size=n, max_size=n))
    lower, upper, total = problem["lower"], problem["upper"], problem["total"]

    # Execute
    sizes = proportional(speeds, total, lower=lower, upper=upper)

    # Assert
    assert sizes.sum() == total
    assert np.all(sizes >= np.asarray(lower))
    assert np.all(sizes <= np.asarray(upper))


@settings(max_examples=100, deadline=None)
@given(
    speeds=st.lists(st.integers(1, 50), min_size=1, max_size=6),
    per_unit=st.integers(1, 10),
)
def test_proportional_is_exact_when_shares_are_integers(speeds: list[int], per_unit: int) -> None:
    # Prepare
    total = sum(speeds) * per_unit

    # Execute
    sizes = proportional(speeds, total)

    # Assert
    assert sizes.tolist() == [v * per_unit for v in speeds]


@settings(max_examples=100, deadline=None)
@given(speeds=st.lists(positive, min_size=1, max_size=8), total=st.integers(0, 2000))
def test_proportional_unbounded_is_within_one_of_exact_share(
    speeds: list[float], total: int
) -> None:
    # Prepare
    shares = np.asarray(speeds) / np.sum(speeds) * total

    # Execute
    sizes = proportional(speeds, total)

    # Assert
    assert sizes.sum() == total
    assert np.all(np.abs(sizes - shares) < 1.0 + 1e-9)


# ----------------------------------------------------------------------------- round_to_total
@settings(max_examples=200, deadline=None)
@given(problem=bounded_problem(), data=st.data())
def test_round_to_total_invariants_with_bounds(
    problem: dict[str, object], data: st.DataObject
) -> None:
    # Prepare
    n = problem["n"]
    shares = data.draw(st.lists(st.floats(-50, 300), min_size=n, max_size=n))
    lower, upper, total = problem["lower"], problem["upper"], problem["total"]

    # Execute
    result = round_to_total(shares, total, lower=lower, upper=upper)

    # Assert
    assert result.dtype == np.int64
    assert result.sum() == total
    assert np.all(result >= np.asarray(lower))
    assert np.all(result <= np.asarray(upper))


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=10),
    total=st.integers(0, 5000),
)
def test_round_to_total_without_bounds_stays_within_one(weights: list[float], total: int) -> None:
    # Prepare: non-negative shares whose sum is the total
    assume(sum(weights) > 0)
    shares = np.asarray(weights) / np.sum(weights) * total

    # Execute
    result = round_to_total(shares, total)

    # Assert: every entry is the floor or the ceiling of its share
    assert result.sum() == total
    assert np.all(np.abs(result - shares) < 1.0 + 1e-9)
    assert np.all((result == np.floor(shares)) | (result == np.ceil(shares)))


@settings(max_examples=100, deadline=None)
@given(
    lower=st.lists(st.integers(0, 10), min_size=2, max_size=6),
    data=st.data(),
)
def test_round_to_total_keeps_clipped_shares_already_summing_to_total(
    lower: list[int], data: st.DataObject
) -> None:
    # Prepare: shares inside [lower, lower + width] that sum to an integer total
    n = len(lower)
    width = data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    upper = [lo + w for lo, w in zip(lower, width, strict=True)]
    position = data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    shares = np.asarray(lower) + np.asarray(position) * np.asarray(width)
    total = int(np.floor(shares.sum()))
    shares[int(np.argmax(shares - lower))] -= shares.sum() - total
    assume(np.all(shares >= np.asarray(lower)))

    # Execute
    result = round_to_total(shares, total, lower=lower, upper=upper)

    # Assert
    assert result.sum() == total
    assert np.all(np.abs(result - shares) < 1.0 + 1e-9)


def _greedy_reference(
    shares: list[float],
    total: int,
    lower: list[int],
    upper: list[float],
    a: list[float] | None,
    b: list[float],
) -> list[int]:
    """One unit at a time: by time (cheapest next unit, ties to the lower index) when
    ``a`` is given, else by largest fractional part in passes; the definition the
    vectorised rounding must match."""
    x = [min(max(v, lo), hi) for v, lo, hi in zip(shares, lower, upper, strict=True)]
    result = [min(max(math.floor(v), lo), hi) for v, lo, hi in zip(x, lower, upper, strict=True)]
    missing = total - sum(result)
    if a is None:
        order = sorted(range(len(x)), key=lambda i: (-(x[i] - result[i]), i))
        while missing > 0:
            for i in order:
                if missing and result[i] < upper[i]:
                    result[i] += 1
                    missing -= 1
        return [int(r) for r in result]
    while missing > 0:
        i = min(
            (k for k in range(len(x)) if result[k] < upper[k]),
            key=lambda k: (a[k] * (result[k] + 1) + b[k], k),
        )
        result[i] += 1
        missing -= 1
    return [int(r) for r in result]


@settings(max_examples=150, deadline=None)
@given(
    problem=bounded_problem(max_silos=8),
    data=st.data(),
    integer_costs=st.booleans(),
    by_time=st.booleans(),
)
def test_round_to_total_matches_one_unit_at_a_time_greedy(
    problem: dict[str, Any], data: st.DataObject, integer_costs: bool, by_time: bool
) -> None:
    # Prepare: shares anywhere (so many units may be missing), costs with ties or not
    n, lower, upper, total = problem["n"], problem["lower"], problem["upper"], problem["total"]
    shares = data.draw(st.lists(st.floats(0, 30), min_size=n, max_size=n))
    costs = st.integers(1, 3).map(float) if integer_costs else positive
    a = data.draw(st.lists(costs, min_size=n, max_size=n)) if by_time else None
    b = data.draw(st.lists(st.integers(0, 2).map(float), min_size=n, max_size=n))
    floors = [
        min(max(math.floor(v), lo), hi) for v, lo, hi in zip(shares, lower, upper, strict=True)
    ]
    assume(sum(floors) <= total)  # units to add, not to take away

    # Execute
    result = round_to_total(shares, total, lower=lower, upper=upper, slope=a, intercept=b)

    # Assert
    assert result.tolist() == _greedy_reference(shares, total, lower, upper, a, b)


def test_round_to_total_is_deterministic_on_ties() -> None:
    # Prepare
    shares = [0.5, 0.5, 0.5, 0.5]

    # Execute
    result = round_to_total(shares, 2)

    # Assert: ties go to the lower index
    assert result.tolist() == [1, 1, 0, 0]


def test_round_to_total_rounds_bounds_inwards() -> None:
    # Prepare / Execute
    lo, hi = integer_bounds(2, lower=[0.2, 1.0], upper=[3.7, math.inf])

    # Assert
    assert lo.tolist() == [1, 1]
    assert hi[0] == 3
    assert hi[1] > 10**12


@pytest.mark.parametrize(
    ("shares", "total", "lower", "upper"),
    [
        ([1.0, 1.0], 10, None, [4, 5]),
        ([1.0, 1.0], 3, [2, 2], None),
        ([1.0, 1.0], 5, None, [2.9, 2.9]),
        ([1.0, 1.0], 1, [0.1, 0.1], None),
        ([1.0], -2, None, None),
        ([], 1, None, None),
    ],
    ids=["above-upper", "below-lower", "upper-floored", "lower-ceiled", "negative", "no-silos"],
)
def test_round_to_total_rejects_infeasible_total(
    shares: list[float], total: int, lower: list[float] | None, upper: list[float] | None
) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError):
        round_to_total(shares, total, lower=lower, upper=upper)


@pytest.mark.parametrize(
    ("shares", "total", "kwargs"),
    [
        ([1.0, math.nan], 2, {}),
        ([1.0, math.inf], 2, {}),
        ([[1.0, 1.0]], 2, {}),
        ([1.0, 1.0], 2.5, {}),
        ([1.0, 1.0], True, {}),
        ([1.0, 1.0], 2, {"lower": [0, 0, 0]}),
        ([1.0, 1.0], 2, {"upper": [math.nan, 3]}),
        ([1.0, 1.0], 2, {"lower": [3, 0], "upper": [2, 5]}),
    ],
    ids=["nan", "inf", "2d", "float-total", "bool-total", "bad-length", "nan-bound", "lo>hi"],
)
def test_round_to_total_rejects_bad_input(
    shares: list[float], total: float, kwargs: dict[str, list[float]]
) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError):
        round_to_total(shares, total, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- linear min-max
def _brute_force_minmax(
    a: np.ndarray, b: np.ndarray, total: int, lower: list[int], upper: list[int]
) -> float:
    best = math.inf
    for alloc in itertools.product(
        *[range(lo, hi + 1) for lo, hi in zip(lower, upper, strict=True)]
    ):
        if sum(alloc) == total:
            best = min(best, float(np.max(a * np.asarray(alloc) + b)))
    return best


@st.composite
def small_linear_problem(draw: st.DrawFn) -> dict[str, object]:
    n = draw(st.integers(min_value=2, max_value=4))
    a = draw(st.lists(st.floats(0.05, 5.0), min_size=n, max_size=n))
    b = draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
    lower = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    upper = [lo + draw(st.integers(0, 25)) for lo in lower]
    assume(sum(lower) <= 40)
    total = draw(st.integers(sum(lower), min(sum(upper), 40)))
    return {"a": np.asarray(a), "b": np.asarray(b), "lower": lower, "upper": upper, "total": total}


@settings(max_examples=150, deadline=None)
@given(problem=small_linear_problem())
def test_linear_minmax_matches_brute_force(problem: dict[str, object]) -> None:
    # Prepare
    a, b, lower, upper, total = (problem[k] for k in ("a", "b", "lower", "upper", "total"))
    optimum = _brute_force_minmax(a, b, total, lower, upper)

    # Execute
    shares, t_star = linear_minmax_continuous(
        a, b, float(total), lower=lower, upper=[float(u) for u in upper]
    )
    sizes = linear_minmax(a, b, total, lower=lower, upper=upper)

    # Assert: continuous optimum is a lower bound on every integer allocation
    assert shares.sum() == pytest.approx(total, abs=1e-9)
    assert np.all(shares >= np.asarray(lower) - 1e-9)
    assert np.all(shares <= np.asarray(upper) + 1e-9)
    assert float(np.max(a * shares + b)) <= optimum + 1e-9
    assert t_star <= optimum + 1e-9
    # ... and time-aware rounding reaches the integer optimum exactly
    assert sizes.sum() == total
    assert np.all((sizes >= np.asarray(lower)) & (sizes <= np.asarray(upper)))
    assert float(np.max(a * sizes + b)) == pytest.approx(optimum, rel=1e-12, abs=1e-12)
    # ... while largest-remainder rounding may cost up to one sample of the slowest cost
    by_remainder = linear_minmax(a, b, total, lower=lower, upper=upper, rounding="remainder")
    assert by_remainder.sum() == total
    assert float(np.max(a * by_remainder + b)) <= optimum + float(np.max(a)) + 1e-9


def test_time_rounding_gives_leftover_units_to_the_silo_they_slow_least() -> None:
    # Prepare: shares 0.375, 0.75, 4.875 of 6; the fast silo absorbs a unit at 1/13 s
    speeds = np.array([1.0, 2.0, 13.0])

    # Execute
    by_time = linear_minmax(1.0 / speeds, np.zeros(3), 6)
    by_remainder = linear_minmax(1.0 / speeds, np.zeros(3), 6, rounding="remainder")

    # Assert: 6/13 s beats the largest-remainder split's 1/2 s
    assert by_time.tolist() == [0, 0, 6]
    assert by_remainder.tolist() == [0, 1, 5]


def test_linear_minmax_rejects_unknown_rounding() -> None:
    with pytest.raises(ValueError, match="rounding"):
        linear_minmax([1.0, 1.0], [0.0, 0.0], 4, rounding="nearest")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(problem=bounded_problem(), data=st.data())
def test_linear_minmax_invariants(problem: dict[str, object], data: st.DataObject) -> None:
    # Prepare
    n = problem["n"]
    a = data.draw(st.lists(positive, min_size=n, max_size=n))
    b = data.draw(st.lists(st.floats(-5.0, 50.0), min_size=n, max_size=n))
    lower, upper, total = problem["lower"], problem["upper"], problem["total"]

    # Execute
    sizes = linear_minmax(a, b, total, lower=lower, upper=upper)

    # Assert
    assert sizes.sum() == total
    assert np.all(sizes >= np.asarray(lower))
    assert np.all(sizes <= np.asarray(upper))


def test_linear_minmax_equalises_finish_times() -> None:
    # Prepare: t = a x + b; the slow silo has a large fixed cost
    a = [0.1, 0.1]
    b = [0.0, 2.0]

    # Execute
    shares, t_star = linear_minmax_continuous(a, b, 100.0, upper=[100.0, 100.0])
    sizes = linear_minmax(a, b, 100)

    # Assert: 0.1 x0 = 0.1 x1 + 2 and x0 + x1 = 100
    assert shares.tolist() == pytest.approx([60.0, 40.0])
    assert t_star == pytest.approx(6.0)
    assert sizes.tolist() == [60, 40]


def test_linear_minmax_continuous_holds_capped_silo_at_its_bound() -> None:
    # Prepare
    a = [1.0, 1.0, 1.0]
    b = [0.0, 0.0, 0.0]

    # Execute
    shares, t_star = linear_minmax_continuous(a, b, 30.0, upper=[4.0, 100.0, 100.0])

    # Assert
    assert shares.tolist() == pytest.approx([4.0, 13.0, 13.0])
    assert t_star == pytest.approx(13.0)


@pytest.mark.parametrize(
    ("a", "b", "kwargs"),
    [
        ([0.0, 1.0], [0.0, 0.0], {}),
        ([1.0, 1.0], [0.0, math.nan], {}),
        ([1.0, 1.0], [0.0], {}),
        ([1.0, 1.0], [0.0, 0.0], {"upper": [1.0, 1.0]}),
        ([1.0, 1.0], [0.0, 0.0], {"lower": [5.0, 1.0], "upper": [4.0, 20.0]}),
    ],
    ids=["zero-slope", "nan-offset", "short-offset", "infeasible", "lower>upper"],
)
def test_linear_minmax_continuous_rejects_bad_input(
    a: list[float], b: list[float], kwargs: dict[str, list[float]]
) -> None:
    # Prepare
    kwargs = {"upper": [100.0, 100.0], **kwargs}

    # Execute / Assert
    with pytest.raises(ValueError):
        linear_minmax_continuous(a, b, 10.0, **kwargs)


@pytest.mark.parametrize(
    "upper", [None, [10.0, 12.0, math.inf]], ids=["default-unbounded", "mixed-inf"]
)
def test_linear_minmax_continuous_accepts_infinite_upper_bounds(
    upper: list[float] | None,
) -> None:
    # Prepare
    a = [1.0, 2.0, 4.0]
    b = [0.0, 0.0, 0.0]

    # Execute
    shares, t_star = linear_minmax_continuous(a, b, 14.0, upper=upper)

    # Assert: T = 14 / (1 + 1/2 + 1/4) = 8 -> shares 8, 4, 2
    assert shares.tolist() == pytest.approx([8.0, 4.0, 2.0])
    assert t_star == pytest.approx(8.0)


def test_linear_minmax_continuous_finite_time_when_every_silo_is_at_its_cap() -> None:
    # Prepare: (1.088 * 7 + 2 - 2) / 1.088 < 7 in floating point
    a, b = [1.088], [2.0]

    # Execute
    shares, t_star = linear_minmax_continuous(a, b, 7.0, lower=[1.0], upper=[7.0])

    # Assert
    assert shares.tolist() == [7.0]
    assert math.isfinite(t_star)


# ----------------------------------------------------------------------------- ideal round time
@settings(max_examples=100, deadline=None)
@given(
    a=st.lists(st.floats(0.01, 5.0), min_size=1, max_size=6),
    data=st.data(),
    total=st.integers(1, 1000),
)
def test_ideal_round_time_is_unbounded_minmax_time(
    a: list[float], data: st.DataObject, total: int
) -> None:
    # Prepare: fixed costs small enough that every silo gets a positive share
    n = len(a)
    b = data.draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
    ideal = ideal_round_time(a, b, total)
    assume(ideal > max(b))

    # Execute
    shares, t_star = linear_minmax_continuous(a, b, float(total))

    # Assert
    assert t_star == pytest.approx(ideal, rel=1e-9)
    assert np.asarray(a) * shares + np.asarray(b) == pytest.approx(np.full(n, ideal), rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(speeds=st.lists(positive, min_size=1, max_size=6), total=st.integers(1, 1000))
def test_ideal_round_time_without_fixed_cost_is_total_over_speed(
    speeds: list[float], total: int
) -> None:
    # Prepare
    a = 1.0 / np.asarray(speeds)

    # Execute
    ideal = ideal_round_time(a, np.zeros(len(speeds)), total)

    # Assert
    assert ideal == pytest.approx(total / sum(speeds), rel=1e-12)


def test_ideal_round_time_paper_example() -> None:
    # Prepare / Execute
    ideal = ideal_round_time([1 / 16, 1 / 8, 1 / 8, 1 / 4, 1 / 4], [0.0] * 5, 160)

    # Assert: 160 samples at 40 samples per second
    assert ideal == pytest.approx(4.0)


# ----------------------------------------------------------------------------- idle fraction
@pytest.mark.parametrize(
    ("times", "expected"),
    [([1.0, 1.0, 1.0], 0.0), ([1.0, 2.0], 0.25), ([5.0], 0.0), ([1.0, 1.0, 4.0], 0.5)],
)
def test_idle_fraction(times: list[float], expected: float) -> None:
    # Prepare / Execute
    idle = idle_fraction(times)

    # Assert
    assert idle == pytest.approx(expected)


@pytest.mark.parametrize(
    "times", [[], [1.0, 0.0], [1.0, -1.0], [1.0, math.nan]], ids=["empty", "zero", "neg", "nan"]
)
def test_idle_fraction_rejects_bad_times(times: list[float]) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="times"):
        idle_fraction(times)


# ----------------------------------------------------------------------------- fit_linear_cost
@settings(max_examples=100, deadline=None)
@given(
    a=st.floats(0.001, 10.0),
    b=st.floats(0.0, 100.0),
    xs=st.lists(st.integers(1, 512), min_size=2, max_size=10, unique=True),
)
def test_fit_linear_cost_recovers_noiseless_line(a: float, b: float, xs: list[int]) -> None:
    # Prepare
    ts = [a * x + b for x in xs]

    # Execute
    fit = fit_linear_cost(xs, ts)

    # Assert
    assert fit is not None
    assert fit[0] == pytest.approx(a, rel=1e-6)
    assert fit[1] == pytest.approx(b, rel=1e-6, abs=1e-6 * a * max(xs))


def test_fit_linear_cost_exact_example_with_weights() -> None:
    # Prepare
    xs, ts = [16, 32, 64], [3.0, 5.0, 9.0]

    # Execute
    fit = fit_linear_cost(xs, ts, weights=[1.0, 0.5, 0.25])

    # Assert
    assert fit == pytest.approx((0.125, 1.0))


@pytest.mark.parametrize(
    ("xs", "ts", "kwargs"),
    [
        ([32], [1.0], {}),
        ([32, 32, 32], [1.0, 1.1, 0.9], {}),
        ([32, 33], [1.0, 1.03], {"min_relative_spread": 0.1}),
        ([16, 32], [2.0, 1.0], {}),
        ([16, 32], [1.0, 2.0], {"weights": [1.0, 0.0]}),
        ([], [], {}),
    ],
    ids=["one-point", "one-distinct-x", "small-spread", "negative-slope", "weight-zero", "empty"],
)
def test_fit_linear_cost_returns_none_when_unidentifiable(
    xs: list[float], ts: list[float], kwargs: dict[str, object]
) -> None:
    # Prepare / Execute
    fit = fit_linear_cost(xs, ts, **kwargs)  # type: ignore[arg-type]

    # Assert
    assert fit is None


def test_fit_linear_cost_spread_threshold_is_relative_to_mean() -> None:
    # Prepare: spread 4 over mean 34 = 0.118
    xs, ts = [32, 36], [1.0 + 0.1 * 32, 1.0 + 0.1 * 36]

    # Execute
    accepted = fit_linear_cost(xs, ts, min_relative_spread=0.1)
    refused = fit_linear_cost(xs, ts, min_relative_spread=0.2)

    # Assert
    assert accepted == pytest.approx((0.1, 1.0))
    assert refused is None


def test_fit_linear_cost_refits_through_origin_when_intercept_negative() -> None:
    # Prepare: t = 0.1 x - 1 would need a negative fixed cost
    xs, ts = [20, 40], [1.0, 3.0]

    # Execute
    fit = fit_linear_cost(xs, ts)

    # Assert: least squares through the origin, b clamped to 0
    assert fit is not None
    assert fit[1] == 0.0
    assert fit[0] == pytest.approx((20 * 1.0 + 40 * 3.0) / (20**2 + 40**2))


@pytest.mark.parametrize(("a", "b", "lower"), [(1 / 34, 1.0, 16.0), (0.1, 0.3, 7.0)])
def test_a_total_every_silo_meets_at_its_lower_bound_is_solved(
    a: float, b: float, lower: float
) -> None:
    # Prepare: one silo whose lower bound is the total (its first breakpoint's share can
    # land a float error above it)
    from fl_lbbsp.core.allocation.allocators import linear_minmax_continuous

    # Execute
    shares, _ = linear_minmax_continuous([a], [b], lower, lower=[lower])

    # Assert
    assert shares.tolist() == pytest.approx([lower])


def test_proportional_splits_the_rest_by_speed_when_a_lower_bound_holds_a_silo() -> None:
    # Prepare: silo 1 is held at its floor 12, above its share: the other 18 go 4:1
    speeds, lower = [4.0, 1.0, 1.0], [0.0, 12.0, 0.0]

    # Execute
    sizes = proportional(speeds, 30, lower=lower)

    # Assert: 14.4 and 3.6 by largest remainder (not the least-noise split of the rest)
    assert sizes.tolist() == [14, 12, 4]
