"""The one water-filling of the allocation, and the bisection of the round time over it.

:func:`waterfill` finds the level s at which the shares ``x_i(s) = clip(s * q_i - o_i,
lo_i, hi_i)`` sum to a total. With ``o = 0`` it is the noise budget's split of least
``sum q_i^2 / x_i`` within the bounds; with ``q_i = 1 / a_i`` and ``o_i = b_i / a_i`` the
level is the common finish time T of the linear costs ``t_i = a_i * x_i + b_i``, the
exact min-max split (:func:`linear_minmax_continuous`).
:func:`least_round_time` bisects the round time T whose water-filling within the caps
``U_i(T)`` meets the budget (the solver of :mod:`.budget`). One implementation over numpy
arrays, for one silo as for a thousand.

Reference: the water-filling of the Lagrangian of ``sum_i c_i / B_i`` under
``sum_i B_i = X`` (Boyd and Vandenberghe, Convex Optimization, Sec. 5.5.3); the min-max
split of linear costs, Chen et al., SoCC 2020, Sec. 3.3.
"""

from __future__ import annotations

import math
from bisect import bisect_left

import numpy as np

from .rounding import ArrayLike, FloatArray

__all__ = [
    "TOLERANCE",
    "caps_at",
    "least_round_time",
    "linear_minmax_continuous",
    "positive_finite",
    "variance",
    "waterfill",
]

TOLERANCE = 1e-9
"""Relative tolerance of the budget and of the bisection's interval."""


def waterfill(
    q: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    total: float,
    *,
    offset: FloatArray | None = None,
) -> tuple[FloatArray, float]:
    """The shares ``x_i = clip(s * q_i - o_i, lo_i, hi_i)`` summing to ``total``, and the
    level s (``sum lo <= total <= sum hi``, ``q > 0``).

    The sum never decreases in s and is linear between the breakpoints (where a silo
    leaves a bound): a binary search over them finds the segment that reaches the total
    (O(n log n)), and s is interpolated on it. The float residue of the sum goes to the
    silos strictly between their bounds.

    Parameters
    ----------
    q : numpy.ndarray
        Each silo's rate (positive).
    lo, hi : numpy.ndarray
        Each silo's bounds (``hi`` may be ``inf``).
    total : float
        The sum to reach.
    offset : numpy.ndarray | None (default: None)
        Each silo's offset ``o_i``; ``None``: 0.
    """
    o = np.zeros_like(q) if offset is None else offset

    def shares(s: float) -> FloatArray:
        out: FloatArray = np.minimum(np.maximum(s * q - o, lo), hi)  # np.clip's floats
        return out

    finite = np.isfinite(hi)
    # Sorted breakpoints (a repeated one is harmless: its sums are equal).
    points = np.sort(np.concatenate([(lo + o) / q, ((hi + o) / q)[finite]]))
    sums: dict[int, float] = {}

    def filled(k: int) -> float:
        if k not in sums:
            sums[k] = float(shares(float(points[k])).sum())
        return sums[k]

    # The first breakpoint whose sum reaches the total.
    k = bisect_left(range(len(points)), True, key=lambda j: filled(j) >= total)
    if k == 0 or (k < len(points) and filled(k) == total):
        s = float(points[k])
    elif k == len(points):
        # Past the last breakpoint only the silos without an upper bound still grow.
        rate = float(q[~finite].sum())
        last = float(points[-1])
        s = last + (total - filled(k - 1)) / rate if rate > 0 else last
    else:
        s0, s1 = float(points[k - 1]), float(points[k])
        s = s0 + (total - filled(k - 1)) * (s1 - s0) / (filled(k) - filled(k - 1))
    x = shares(s)
    residue = total - float(x.sum())
    free = (x > lo) & (x < hi)
    if residue and free.any():
        x[free] = np.clip(x[free] + residue * q[free] / q[free].sum(), lo[free], hi[free])
    return x, s


def positive_finite(name: str, values: ArrayLike) -> FloatArray:
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
    linear in ``T``: the water-filling with rates ``1 / a_i`` and offsets ``b_i / a_i``
    (:func:`waterfill`) finds T with
    ``sum_i x_i(T) = X`` in closed form, no tolerance.

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
    slope = positive_finite("a", a)
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
    return waterfill(1.0 / slope, lo, hi, total, offset=offset / slope)


def caps_at(t: float, a: FloatArray, b: FloatArray, lo: FloatArray, hi: FloatArray) -> FloatArray:
    """Each silo's largest share within round time ``t``, ``U_i(t) = clip((t - b_i) / a_i,
    lo_i, hi_i)``."""
    return np.asarray(np.maximum(np.minimum(hi, (t - b) / a), lo), dtype=np.float64)


def variance(c: FloatArray, x: FloatArray) -> float:
    """The update's variance ``sum_i c_i / x_i`` at the shares ``x`` (inf if one is 0)."""
    return math.inf if (x <= 0).any() else float((c / x).sum())


def least_round_time(
    interval: tuple[float, float],
    *,
    q: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    a: FloatArray,
    b: FloatArray,
    c: FloatArray,
    total: float,
    budget: float,
) -> float:
    """The bisection of the round time over ``interval = (low, high)`` (the budget
    missed at low, met at high): the smallest T found, to :data:`TOLERANCE`, whose
    water-filling within the caps ``U_i(T) = clip((T - b_i) / a_i, lo_i, hi_i)`` has
    ``sum c_i / x_i <= budget`` (``q = sqrt(c)``)."""
    low, high = interval

    def meets(t: float) -> bool:
        return variance(c, waterfill(q, lo, caps_at(t, a, b, lo, hi), total)[0]) <= budget

    for _ in range(200):
        if high - low <= TOLERANCE * high:
            break
        middle = 0.5 * (low + high)
        if meets(middle):
            high = middle
        else:
            low = middle
    return high
