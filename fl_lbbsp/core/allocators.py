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

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

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
        return np.asarray(np.clip((t - offset) / slope, lo, hi), dtype=np.float64)

    def total_at(k: int) -> float:
        return float(shares(float(points[k])).sum())

    points = np.concatenate([slope * lo + offset, (slope * hi + offset)[np.isfinite(hi)]])
    points = np.unique(points)
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
    if k < len(points) and total_at(k) == total:
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
    with :func:`~fl_lbbsp.core.rounding.round_to_total`, which gives each leftover unit to
    the silo it slows least; the result is the integer min-max, with the total and every
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


def fit_linear_cost(
    x: ArrayLike,
    t: ArrayLike,
    *,
    weights: ArrayLike | None = None,
    min_relative_spread: float = 0.0,
) -> tuple[float, float] | None:
    """Weighted least-squares fit of ``t = a * x + b`` with ``a > 0`` and ``b >= 0``.

    Parameters
    ----------
    x : sequence of float
        Observed batch sizes.
    t : sequence of float
        Observed times.
    weights : sequence of float | None (default: None)
        Non-negative weight of each observation; ``None`` weighs them equally.
    min_relative_spread : float (default: 0.0)
        Refuse to fit (return ``None``) unless ``(max(x) - min(x)) / mean(x)`` reaches this:
        batch sizes only a sample or two apart give a slope made of timing noise.

    Returns
    -------
    tuple of (float, float) | None
        ``(a, b)``, or ``None`` when fewer than two distinct batch sizes were seen, they
        spread too little, or the fitted slope is not positive. A negative intercept
        (noise) is refitted through the origin.

    Reference: Yang et al., BOA (profile ``t_i = A_i * b_i + c_i`` by linear regression).
    """
    xs = np.asarray(x, dtype=np.float64)
    ts = np.asarray(t, dtype=np.float64)
    w = np.ones_like(xs) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = w > 0
    xs, ts, w = xs[keep], ts[keep], w[keep]
    if np.unique(xs).size < 2 or np.ptp(xs) < min_relative_spread * float(np.mean(xs)):
        return None
    x_mean = np.average(xs, weights=w)
    t_mean = np.average(ts, weights=w)
    var = float(np.sum(w * (xs - x_mean) ** 2))
    slope = float(np.sum(w * (xs - x_mean) * (ts - t_mean)) / var)
    intercept = float(t_mean - slope * x_mean)
    if intercept < 0:
        slope = float(np.sum(w * xs * ts) / np.sum(w * xs * xs))
        intercept = 0.0
    if not np.isfinite(slope) or slope <= 0:
        return None
    return slope, intercept


MIN_SLOPE_SHARE = 0.05
"""The robust fit never puts less than this share of a silo's time at its operating
point on the per-sample part: a slope near 0 would hand the silo every sample."""


@dataclass(frozen=True)
class CostFit:
    """A silo's cost line ``t = slope * x + intercept`` from :func:`fit_robust_cost`.

    Parameters
    ----------
    slope : float
        Per-sample cost a (seconds per unit of batch size), positive.
    intercept : float
        Fixed cost b (seconds), non-negative.
    anchor : float
        The operating point: the window's last batch size.
    level : float
        Robust time at the anchor, ``slope * anchor + intercept``.
    noise : float
        Robust scale of the relative jitter: from pairs of near-replicates (batch sizes
        closer than ``min_relative_spread``), ``1.4826 * median |log(t_j / t_i) -
        log(fit_j / fit_i)| / sqrt(2)``, else (fewer than 3 such pairs) ``1.4826 * median
        |log(t / fit)|``; NaN with fewer than 4 observations.
    weight : float
        Weight in [0, 1] of the data's own slope against the prior shape (0: the line is
        the prior's shape through the robust level; 1: the Theil-Sen line).
    spread : tuple of float
        Smallest and largest batch size of the window (where the line was observed).
    """

    slope: float
    intercept: float
    anchor: float
    level: float
    noise: float
    weight: float
    spread: tuple[float, float]

    @property
    def shape(self) -> float:
        """Fixed cost in samples, ``intercept / slope`` (0: proportional)."""
        return self.intercept / self.slope

    def predict(self, x: float) -> float:
        """Predicted time at batch size ``x``."""
        return self.slope * x + self.intercept


def fit_robust_cost(
    x: ArrayLike,
    t: ArrayLike,
    *,
    prior_shape: float = 0.0,
    prior_noise: float | None = None,
    prior_known: bool = True,
    min_relative_spread: float = 0.1,
) -> CostFit:
    """Robust fit of ``t = a * x + b`` over a window, shrunk toward a prior shape.

    The fit is built so that per-round timing noise moves it little:

    1. The prior line has the shape ``t proportional to x + x0`` (``x0 = prior_shape``
       samples of fixed cost; ``x0 = 0`` is proportional allocation, Alg. 1) through the
       robust level (step 4) of the observations rescaled to the anchor (the window's
       last batch size, where the silo operates).
    2. The data's own slope is the Theil-Sen estimator, the median of the pairwise slopes,
       taken only over pairs whose batch sizes differ by at least ``min_relative_spread``
       of the anchor, so that a fixed cost is estimated only from batch sizes that really
       differ.
    3. The two slopes are blended with the positive-part James-Stein weight
       ``w = max(0, 1 - se^2 / (a_ts - a_prior)^2)``, ``se`` the standard error of the
       Theil-Sen slope from the residual scale: the larger of the median absolute
       residual (with at least 4 observations) and ``prior_noise`` times the level; with
       neither known ``w = 0``. Noise-free data give ``w = 1``.
    4. The level at the anchor is the trimmed geometric mean (20% cut at each end) of the
       observations moved along the blended slope (in step 1 too), only of those within
       ``min_relative_spread`` of the anchor when there are at least 3 or when the slope
       is a guess (weight < 0.5 and ``prior_known`` false); the slope is then
       kept within ``[MIN_SLOPE_SHARE, 1] * level / anchor`` (a non-negative fixed cost,
       a positive per-sample cost).

    Parameters
    ----------
    x : sequence of float
        Observed batch sizes (positive), at least one, oldest first.
    t : sequence of float
        Observed times (positive), one per batch size.
    prior_shape : float (default: 0.0)
        Fixed cost of the prior line in samples, ``x0 = b / a`` (>= 0).
    prior_noise : float | None (default: None)
        Relative noise of the silo's times known from earlier windows (>= 0), a lower
        bound of the residual scale; ``None``: unknown.
    prior_known : bool (default: True)
        Whether ``prior_shape`` is the silo's own (identified from its data before), not a
        guess; with a guess and no slope of its own (weight < 0.5) the level comes only
        from the observations near the anchor (the last one at least).
    min_relative_spread : float (default: 0.1)
        Smallest relative difference of two batch sizes for their pair to enter the
        Theil-Sen slope.

    Returns
    -------
    CostFit
        The line, its anchor and level, the residual noise and the blend weight.

    References
    ----------
    Yang et al., BOA (profile ``t_i = A_i * b_i + c_i`` by linear regression); Theil,
    "A rank-invariant method of linear and polynomial regression analysis" (1950) and
    Sen, "Estimates of the regression coefficient based on Kendall's tau", JASA 63 (1968);
    James and Stein (1961) / Efron and Morris, JASA 68 (1973) for the positive-part
    shrinkage.
    """
    # Plain Python on purpose: the windows are small (tens of reports) and a silo's fit is
    # made at each of its reports, where numpy's per-call overhead would dominate.
    try:
        xs = [float(v) for v in x]
        ts = [float(v) for v in t]
    except TypeError as err:
        raise ValueError(f"x and t must be 1-D sequences of numbers ({err})") from None
    n = len(xs)
    if n == 0 or n != len(ts):
        raise ValueError(f"x and t must be equal non-empty 1-D sequences, got {n} and {len(ts)}")
    if not all(math.isfinite(v) and v > 0 for v in xs) or not all(map(math.isfinite, ts)):
        raise ValueError("x must be positive and t finite")
    if any(v <= 0 for v in ts):
        raise ValueError("t must be positive")
    x0 = float(prior_shape)
    if not math.isfinite(x0) or x0 < 0:
        raise ValueError(f"prior_shape must be finite and >= 0, got {prior_shape!r}")
    if prior_noise is not None and (not math.isfinite(prior_noise) or prior_noise < 0):
        raise ValueError(f"prior_noise must be finite and >= 0 or None, got {prior_noise!r}")
    anchor = xs[-1]
    gap = min_relative_spread * anchor
    level0 = robust_level([tv * (anchor + x0) / (xv + x0) for xv, tv in zip(xs, ts, strict=True)])
    prior = level0 / (anchor + x0)
    slope, weight = prior, 0.0
    slopes: list[float] = []
    near: list[tuple[int, int]] = []
    for i in range(n):
        xi, ti = xs[i], ts[i]
        for j in range(i + 1, n):
            dx = xs[j] - xi
            if abs(dx) >= gap:
                slopes.append((ts[j] - ti) / dx)
            else:
                near.append((i, j))
    if slopes:
        own = _median(slopes)
        scale = -1.0
        if n >= 4:
            residual = [tv - own * xv for xv, tv in zip(xs, ts, strict=True)]
            middle = _median(residual)
            scale = 1.4826 * _median([abs(r - middle) for r in residual])
        if prior_noise is not None:
            scale = max(scale, prior_noise * level0)
        if own > 0 and scale >= 0:
            mean_x = math.fsum(xs) / n
            se2 = scale * scale / math.fsum((xv - mean_x) ** 2 for xv in xs)
            gap2 = (own - prior) ** 2
            weight = 1.0 if se2 == 0 else max(0.0, 1.0 - se2 / gap2) if gap2 > 0 else 0.0
            slope = weight * own + (1.0 - weight) * prior
    # The level where the silo operates: from the observations near the anchor when
    # there are enough of them (an error of the slope does not reach them), else from all
    # of them moved along the slope.
    moved = [tv - slope * (xv - anchor) for xv, tv in zip(xs, ts, strict=True)]
    local = [m for m, xv in zip(moved, xs, strict=True) if abs(xv - anchor) < gap]
    # Far observations moved along a slope that is neither the data's own nor a known
    # shape would bias the level: then only the nearby ones count.
    trusted = weight >= 0.5 or prior_known
    level = robust_level(local if len(local) >= 3 or not trusted else moved)
    if not level > 0:
        level = level0
    slope = min(max(slope, MIN_SLOPE_SHARE * level / anchor), level / anchor)
    intercept = max(level - slope * anchor, 0.0)
    noise = math.nan
    if n >= 4:
        # Scale of the jitter alone: near-replicates (batch sizes closer than the spread
        # a slope needs) differ by the noise of two rounds, whatever the line's misfit.
        logs = [math.log(tv / (slope * xv + intercept)) for xv, tv in zip(xs, ts, strict=True)]
        if len(near) >= 3:
            noise = 1.4826 * _median([abs(logs[j] - logs[i]) for i, j in near]) / math.sqrt(2)
        else:
            noise = 1.4826 * _median([abs(v) for v in logs])
    return CostFit(
        slope=slope,
        intercept=intercept,
        anchor=anchor,
        level=level,
        noise=noise,
        weight=weight,
        spread=(min(xs), max(xs)),
    )


TRIM = 0.2
"""Share of the observations cut at each end by :func:`fit_robust_cost`'s level."""


def _median(values: list[float]) -> float:
    v = sorted(values)
    k = len(v) // 2
    return v[k] if len(v) % 2 else 0.5 * (v[k - 1] + v[k])


def robust_level(values: list[float]) -> float:
    """Robust level of times: trimmed geometric mean (``TRIM`` cut at each end, in log; the
    plain geometric mean of fewer than 5 positive values, the trimmed arithmetic mean if
    any is not positive):
    nearly as efficient as the mean under log-normal jitter, robust to a spike like the
    median."""
    v = sorted(values)
    cut = int(TRIM * len(v))
    kept = v[cut : len(v) - cut]
    if kept[0] > 0:
        return math.exp(math.fsum(map(math.log, kept)) / len(kept))
    return math.fsum(kept) / len(kept)
