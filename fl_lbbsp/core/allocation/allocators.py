"""Batch-size allocation: split a fixed total X over silos so they finish together.

The problem (Chen et al., IEEE TCC 2021, Eq. 3): minimise ``max_i t_i(x_i)`` subject to
``sum_i x_i = X`` and ``x_min_i <= x_i <= x_max_i``.

* :func:`proportional` is Alg. 1 (line 5): ``x_i = v_i / sum_j v_j * X``.
* :func:`linear_minmax` solves the problem exactly for linear costs
  ``t_i = a_i * x_i + b_i`` with bounds (SoCC 2020 Sec. 3.3; BOA, Yang et al.).

Proportional allocation is the linear case with ``a_i = 1 / v_i`` and ``b_i = 0``, so
both go through the same solver and the same rounding.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

# The cost fits moved to :mod:`.costfit`; importable from here as before.
from ..silo.costfit import CostFit, fit_linear_cost, fit_robust_cost, robust_level
from .rounding import ArrayLike, FloatArray, IntArray, integer_bounds, round_to_total

Rounding = Literal["time", "remainder"]

__all__ = [
    "CostFit",
    "fit_linear_cost",
    "fit_robust_cost",
    "ideal_round_time",
    "idle_fraction",
    "linear_minmax",
    "linear_minmax_continuous",
    "proportional",
    "robust_level",
]


def _positive_finite(name: str, values: ArrayLike) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be finite and positive, got {arr.tolist()}")
    return arr


def linear_minmax_continuous(
    a: ArrayLike,
    b: ArrayLike,
    total: float,
    *,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
) -> tuple[FloatArray, float]:
    """Exact real-valued min-max allocation for linear costs within bounds.

    Each silo's share at a common finish time ``T`` is
    ``x_i(T) = clip((T - b_i) / a_i, lower_i, upper_i)``, non-decreasing and piecewise
    linear in ``T``. The function finds the segment between breakpoints where
    ``sum_i x_i(T) = X`` by binary search (O(n log n)) and solves it in closed form: no
    tolerance.

    Parameters
    ----------
    a : sequence of float
        Per-sample cost of each silo (seconds per unit of batch size), positive.
    b : sequence of float
        Fixed cost of each silo (seconds), finite.
    total : float
        The total X to split.
    lower : sequence of float | None (default: None)
        Per-silo minimum share; ``None`` means 0.
    upper : sequence of float | None (default: None)
        Per-silo maximum share (``inf`` allowed); ``None`` means unbounded.

    Returns
    -------
    tuple of (numpy.ndarray, float)
        The shares and the common finish time ``T`` of the silos not held at a bound.
    """
    slope = _positive_finite("a", a)
    n = slope.shape[0]
    offset = np.asarray(b, dtype=np.float64)
    if offset.shape != (n,) or not np.all(np.isfinite(offset)):
        raise ValueError(f"b must be {n} finite numbers, got {np.asarray(b).tolist()}")
    lo = np.zeros(n) if lower is None else np.asarray(lower, dtype=np.float64)
    hi = np.full(n, np.inf) if upper is None else np.asarray(upper, dtype=np.float64)
    if lo.shape != (n,) or hi.shape != (n,) or np.any(lo > hi):
        raise ValueError("bounds must have one entry per silo with lower <= upper")
    if not lo.sum() <= total <= hi.sum():
        raise ValueError(f"total {total} is outside the feasible range [{lo.sum()}, {hi.sum()}]")

    def shares(t: float) -> FloatArray:
        out: FloatArray = np.minimum(np.maximum((t - offset) / slope, lo), hi)  # np.clip's
        return out

    def total_at(k: int) -> float:
        return float(shares(float(points[k])).sum())

    points = np.concatenate([slope * lo + offset, (slope * hi + offset)[np.isfinite(hi)]])
    points = np.sort(points)
    points = points[np.concatenate([[True], points[1:] != points[:-1]])]  # np.unique's
    # First breakpoint whose sum reaches the total (the sums never decrease, so a binary
    # search over O(log n) of them finds it); T lies on the segment just before it. The
    # search starts at the breakpoint of T without bounds, usually the one it ends at.
    k, end = 0, len(points)
    guess = int(np.searchsorted(points, (total + np.sum(offset / slope)) / np.sum(1 / slope)))
    if guess < end:
        if total_at(guess) >= total:
            end = guess
            if guess == 0 or total_at(guess - 1) < total:
                k = guess
        else:
            k = guess + 1
    while k < end:
        middle = (k + end) // 2
        if total_at(middle) >= total:
            end = middle
        else:
            k = middle + 1
    if k < len(points) and (k == 0 or total_at(k) == total):
        # (k == 0: every silo at its lower bound, the sum above the total by float error)
        t_star = float(points[k])
    elif k == len(points) and not np.any(np.isinf(hi)):
        # Every silo at its cap: the total is the sum of the caps (up to float error).
        return hi.copy(), float(np.max(slope * hi + offset))
    elif k == len(points):
        # Past the last breakpoint only the silos without an upper bound still grow.
        rate = float(np.sum(1.0 / slope[np.isinf(hi)]))
        t_star = float(points[-1] + (total - total_at(k - 1)) / rate)
    else:
        t0, s0, t1, s1 = float(points[k - 1]), total_at(k - 1), float(points[k]), total_at(k)
        t_star = t0 + (total - s0) * (t1 - t0) / (s1 - s0)
    x = shares(t_star)
    return x, t_star


def linear_minmax(
    a: ArrayLike,
    b: ArrayLike,
    total: int,
    *,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    rounding: Rounding = "time",
) -> IntArray:
    """Integer batch sizes minimising the slowest silo's time for linear costs.

    Solves ``min max_i (a_i * x_i + b_i)`` s.t. ``sum x_i = total`` and the bounds
    exactly: over the reals (:func:`linear_minmax_continuous`), then rounded by time
    with :func:`~fl_lbbsp.core.allocation.rounding.round_to_total`, which gives each leftover
    unit to the silo it slows least; the result is the integer min-max, with the total and every
    bound kept. ``rounding="remainder"`` rounds by largest remainder instead, which keeps
    every silo within one sample of its real share at a slightly longer round.

    Parameters
    ----------
    a : sequence of float
        Per-sample cost of each silo, positive.
    b : sequence of float
        Fixed cost of each silo.
    total : int
        Total batch size X.
    lower : sequence of float | None (default: None)
        Per-silo minimum batch size (rounded up); ``None`` means 0.
    upper : sequence of float | None (default: None)
        Per-silo maximum batch size (rounded down); ``None`` means unbounded.
    rounding : {"time", "remainder"} (default: "time")
        How the real solution is made integer (see above).

    Reference: Chen et al., SoCC 2020, Sec. 3.3; Yang et al., BOA.
    """
    n = len(np.asarray(a))
    lo, hi = integer_bounds(n, lower=lower, upper=upper)
    x, _ = linear_minmax_continuous(a, b, float(total), lower=lo, upper=hi.astype(np.float64))
    if rounding == "remainder":
        return round_to_total(x, total, lower=lo, upper=hi)
    if rounding != "time":
        raise ValueError(f"unknown rounding {rounding!r}; expected 'time' or 'remainder'")
    return round_to_total(
        x, total, lower=lo, upper=hi, slope=a, intercept=np.asarray(b, dtype=np.float64)
    )


def proportional(
    speeds: ArrayLike,
    total: int,
    *,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
) -> IntArray:
    """Batch sizes proportional to predicted speed: ``x_i = v_i / sum_j v_j * X``.

    With bounds, silos held at a bound keep it and the rest is split proportionally,
    which is the min-max solution for costs ``x_i / v_i``; the shares are rounded by
    largest remainder (Alg. 1 line 6), so each is within one sample of ``v_i / sum v * X``.

    Parameters
    ----------
    speeds : sequence of float
        Predicted sample-processing speed of each silo, positive.
    total : int
        Total batch size X.
    lower : sequence of float | None (default: None)
        Per-silo minimum batch size; ``None`` means 0.
    upper : sequence of float | None (default: None)
        Per-silo maximum batch size (memory cap x_o); ``None`` means unbounded.

    Reference: Chen et al., IEEE TCC 2021, Alg. 1.
    """
    v = _positive_finite("speeds", speeds)
    return linear_minmax(
        1.0 / v, np.zeros_like(v), total, lower=lower, upper=upper, rounding="remainder"
    )


def ideal_round_time(a: ArrayLike, b: ArrayLike, total: float) -> float:
    """The ideal round time ``T* = (X + sum_i b_i / a_i) / sum_i (1 / a_i)``.

    The best achievable round time for linear costs ``t_i = a_i * x_i + b_i`` with the
    total X fixed (shared/DESIGN.md); with ``b_i = 0`` it is ``X / sum_i v_i``.
    """
    slope = _positive_finite("a", a)
    offset = np.asarray(b, dtype=np.float64)
    return float((total + np.sum(offset / slope)) / np.sum(1.0 / slope))


def idle_fraction(times: ArrayLike) -> float:
    """Barrier waste ``1 - mean_i(t_i) / max_i(t_i)``: 0 when all silos finish together."""
    t = _positive_finite("times", times)
    return float(1.0 - t.mean() / t.max())
