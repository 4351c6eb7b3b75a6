"""Cost curves of the silos: how a silo's round time grows with its batch size.

A silo's time is modelled as a hinge ``t(x) = a * max(x, k) + b``: flat up to the knee k
(an underused core or GPU does a small batch in the time of a larger one), linear beyond
(BOA, Yang et al.: ``t_i = A_i * b_i + c_i``; Chen et al., SoCC 2020, Sec. 3.3: linear on
``[x_s, x_o]``). :func:`fit_robust_cost` fits the line robustly from a window of reports,
:func:`find_knee` tells from the same window where the curve is flat, and
:func:`fit_linear_cost` is the plain weighted least-squares fit of earlier versions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..allocation.rounding import ArrayLike

__all__ = [
    "FLAT_SHARE",
    "MIN_SLOPE_SHARE",
    "CostFit",
    "find_knee",
    "fit_linear_cost",
    "fit_robust_cost",
    "robust_level",
]


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
    knee : float (default: 0.0)
        Batch size up to which the time is flat (:func:`find_knee`): the curve is
        ``slope * max(x, knee) + intercept``; 0: a line.
    """

    slope: float
    intercept: float
    anchor: float
    level: float
    noise: float
    weight: float
    spread: tuple[float, float]
    knee: float = 0.0

    @property
    def shape(self) -> float:
        """Fixed cost in samples, ``intercept / slope`` (0: proportional)."""
        return self.intercept / self.slope

    def predict(self, x: float) -> float:
        """Predicted time at batch size ``x`` (flat below the knee)."""
        return self.slope * max(x, self.knee) + self.intercept


def fit_robust_cost(
    x: ArrayLike,
    t: ArrayLike,
    *,
    prior_shape: float = 0.0,
    prior_noise: float | None = None,
    prior_known: bool = True,
    min_relative_spread: float = 0.1,
    knee: float = 0.0,
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
    knee : float (default: 0.0)
        Batch size up to which the silo's time is flat (:func:`find_knee`): observations
        below it count as made at the knee, so that the line is the part of the curve
        above it; 0: no flat part.

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
    if not math.isfinite(knee) or knee < 0:
        raise ValueError(f"knee must be finite and >= 0, got {knee!r}")
    if knee > 0:
        xs = [max(v, knee) for v in xs]
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
            if abs(dx) >= gap and dx != 0:  # equal batch sizes are replicates, gap 0 too
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
    # (the anchor's own batch size always counts as near it, a gap of 0 included)
    local = [m for m, xv in zip(moved, xs, strict=True) if abs(xv - anchor) < gap or xv == anchor]
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
        knee=float(knee),
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


FLAT_SHARE = 0.1
"""Largest elasticity ``d log t / d log x`` (the per-sample share of the time) at which
:func:`find_knee` calls a curve flat: between two batch sizes where the time grows by
less than a tenth of the batch size's relative growth, a smaller batch could save the
silo at most a tenth of its time, and would add noise to the update for it."""

SCATTER_REPORTS = 5
"""Reports :func:`find_knee` pools (the run, the group tested and the next groups) for a
scatter of its own: fewer scatter too little to tell a flat run from a noisy rise."""

KNEE_SIGMAS = 2.0
"""Standard errors by which the elasticity must clear :data:`FLAT_SHARE` for
:func:`find_knee` to decide (flat or rising) rather than keep the knee it had."""


def _groups(
    xs: list[float], ts: list[float], spread: float
) -> list[tuple[float, float, list[float]]]:
    """Observations grouped by batch size (a group spans less than ``spread``, relative, of
    its smallest; equal sizes always share one): (smallest x, largest x, times), smallest
    batch sizes first."""
    groups: list[tuple[float, float, list[float]]] = []
    for x, t in sorted(zip(xs, ts, strict=True)):
        if groups and (x < groups[-1][0] * (1.0 + spread) or x == groups[-1][0]):
            low, _, times = groups[-1]
            groups[-1] = (low, x, [*times, t])
        else:
            groups.append((x, x, [t]))
    return groups


def _within_noise(groups: list[tuple[float, float, list[float]]]) -> float | None:
    """Robust log-sd of the times within the groups of at least 2; ``None``: no such
    group."""
    deviations: list[float] = []
    for _, _, times in groups:
        if len(times) >= 2:
            centre = math.log(robust_level(times))
            deviations.extend(abs(math.log(t) - centre) for t in times)
    return 1.4826 * _median(deviations) if deviations else None


def find_knee(
    x: ArrayLike,
    t: ArrayLike,
    *,
    knee: float = 0.0,
    noise: float | None = None,
    min_relative_spread: float = 0.1,
) -> float:
    """Batch size up to which a silo's time is flat, from a window of its reports.

    The reports are grouped by batch size (within ``min_relative_spread``); from the
    smallest group up, a group joins the flat run while the elasticity of the time from
    the run's largest batch size to it, ``log(L_j / L_run) / log(x_j / x_top)`` (robust
    levels L, the group's geometric-mean batch size x_j), is below :data:`FLAT_SHARE` by
    :data:`KNEE_SIGMAS` standard errors (``noise * sqrt(1/n_run + 1/n_j)`` over the log
    ratio). A run of at least two groups puts the knee at its largest batch size; a group
    the time clearly rises to (the elasticity above :data:`FLAT_SHARE` by as much) bounds
    the knee below it (a knee at or above it is dropped). Anything else leaves ``knee`` as
    it was: a silo operating at one batch size says nothing about its knee, so the knee
    found earlier is kept.

    Parameters
    ----------
    x : sequence of float
        Observed batch sizes (positive).
    t : sequence of float
        Observed times (positive), one per batch size.
    knee : float (default: 0.0)
        The knee known so far (0: none).
    noise : float | None (default: None)
        Relative noise (log-sd) of one report; ``None``: unknown. The scatter of the run
        and the group it is tested against (with the next groups, at least
        ``SCATTER_REPORTS`` reports), replicates of one level if the curve is flat there,
        is used where it is smaller; with neither, nothing is decided.
    min_relative_spread : float (default: 0.1)
        Batch sizes closer than this (relative) are one group.

    Returns
    -------
    float
        The knee (0: no flat part known).

    Raises
    ------
    ValueError
        If the inputs are not positive and finite, or ``knee`` is negative.
    """
    xs = [float(v) for v in x]
    ts = [float(v) for v in t]
    if len(xs) != len(ts) or not all(math.isfinite(v) and v > 0 for v in xs + ts):
        raise ValueError("x and t must be equal sequences of finite positive numbers")
    if not math.isfinite(knee) or knee < 0:
        raise ValueError(f"knee must be finite and >= 0, got {knee!r}")
    groups = _groups(xs, ts, min_relative_spread)
    if len(groups) < 2:
        return knee
    given = noise if noise is not None and math.isfinite(noise) else None
    run_times = list(groups[0][2])
    run_top, flat, ceiling = groups[0][1], 1, math.inf
    for j, (low, high, times) in enumerate(groups[1:], start=1):
        logx = [math.log(v) for v in xs if low <= v <= high]
        # Flat up to the run's top: a group above it is compared with the run's level there.
        span = math.fsum(logx) / len(logx) - math.log(run_top)
        if span <= 0:
            break
        # Flat, the run and the group are replicates of one level: their scatter (with the
        # next groups' while they hold fewer than SCATTER_REPORTS reports) is the noise,
        # which a line's misfit elsewhere does not inflate and a rise does.
        pooled = [*run_times, *times]
        for _, _, more in groups[j + 1 :]:
            if len(pooled) >= SCATTER_REPORTS:
                break
            pooled.extend(more)
        enough = len(pooled) >= SCATTER_REPORTS
        sigma = _within_noise([(low, high, pooled)]) if enough else None
        if given is not None:
            sigma = given if sigma is None else min(sigma, given)
        if sigma is None:
            break
        # A time that falls as the batch grows is noise, not evidence of a flat curve.
        elasticity = max(math.log(robust_level(times) / robust_level(run_times)) / span, 0.0)
        error = KNEE_SIGMAS * sigma * math.sqrt(1 / len(run_times) + 1 / len(times)) / span
        if elasticity + error < FLAT_SHARE:
            run_times.extend(times)
            run_top, flat = high, flat + 1
            continue
        if elasticity - error > FLAT_SHARE:
            ceiling = low  # the time rises by this group: the knee is below it
        break
    if flat >= 2:
        top = max(knee, run_top)
        return top if top < ceiling else run_top
    return knee if knee < ceiling else 0.0
