"""Cost curves of the silos: how a silo's round time grows with its batch size.

A silo's time is modelled as a hinge ``t(x) = a * max(x, k) + b``: flat up to the knee k
(an underused core or GPU does a small batch in the time of a larger one), linear beyond
(BOA, Yang et al.: ``t_i = A_i * b_i + c_i``; Chen et al., SoCC 2020, Sec. 3.3: linear on
``[x_s, x_o]``). Every fit is written once, in numpy over a table of windows (each silo's
window a row of two ``(N, W)`` arrays, batch sizes and times, oldest first, its ``n``
reports in the first ``n`` columns): :func:`fit_robust_costs` fits the lines robustly,
:func:`find_knees` tells where each curve is flat, :func:`fit_windows` does both. The
one-window functions (:func:`fit_robust_cost`, :func:`find_knee`) check their input and run
the same code on a table of one row. :func:`fit_linear_cost` is the plain weighted
least-squares fit of earlier versions.

Reference: Yang et al., BOA; Theil (1950) and Sen (1968) for the slope; James and Stein
(1961) for the shrinkage; Chen et al., SoCC 2020, Sec. 3.3 for the line on ``[x_s, x_o]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..allocation.rounding import ArrayLike

__all__ = [
    "CostFit",
    "CostFits",
    "find_knee",
    "find_knees",
    "fit_linear_cost",
    "fit_robust_cost",
    "fit_robust_costs",
    "fit_windows",
    "masked_levels",
    "masked_medians",
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
    """A silo's cost line ``t = slope * x + intercept`` from :func:`fit_robust_costs`.

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
        Batch size up to which the time is flat (:func:`find_knees`): the curve is
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


TRIM = 0.2
"""Share of the observations cut at each end by :func:`fit_robust_costs`'s level."""


FLAT_SHARE = 0.1
"""Largest elasticity ``d log t / d log x`` (the per-sample share of the time) at which
:func:`find_knees` calls a curve flat: between two batch sizes where the time grows by
less than a tenth of the batch size's relative growth, a smaller batch could save the
silo at most a tenth of its time, and would add noise to the update for it."""

SCATTER_REPORTS = 5
"""Reports :func:`find_knees` pools (the run, the group tested and the next groups) for a
scatter of its own: fewer scatter too little to tell a flat run from a noisy rise."""

KNEE_SIGMAS = 2.0
"""Standard errors by which the elasticity must clear :data:`FLAT_SHARE` for
:func:`find_knees` to decide (flat or rising) rather than keep the knee it had."""


_MAD = 1.4826  # the MAD's consistency factor under normal noise


def _at(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``values[r, index[r]]`` of each row r."""
    out: np.ndarray = values[np.arange(values.shape[0]), index]
    return out


def _filled(values: np.ndarray, mask: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
    """``np.where(mask, values, inf)``: a copy of ``values`` where ``counts`` (the mask's
    count of each row) say that the mask holds every position."""
    if counts is not None and values.shape[1] and int(counts.min()) >= values.shape[1]:
        return values.astype(np.result_type(values, np.inf), copy=True)
    out: np.ndarray = np.where(mask, values, np.inf)
    return out


def masked_medians(
    values: np.ndarray, mask: np.ndarray, counts: np.ndarray | None = None, *, axis: int = 1
) -> np.ndarray:
    """Median of each row's values where ``mask`` (NaN where none); ``counts``, if given,
    is ``mask``'s count of each row; ``axis=0``: values and mask laid out ``(pairs, rows)``
    (as :func:`_differences` gives them)."""
    width, rows = values.shape[axis], values.shape[1 - axis]
    if width == 0:
        return np.full(rows, np.nan)
    v = _filled(values, mask, counts) if axis == 1 else np.where(mask, values, np.inf)
    v.sort(axis=axis)
    m = np.count_nonzero(mask, axis=axis) if counts is None else counts
    k = m // 2
    index = np.arange(rows)
    high, low = np.minimum(k, width - 1), np.maximum(k - 1, 0)
    upper = v[index, high] if axis == 1 else v[high, index]
    lower = v[index, low] if axis == 1 else v[low, index]
    out = np.where(m % 2 == 1, upper, 0.5 * (lower + upper))
    return np.where(m > 0, out, np.nan)


_KEPT: dict[int, np.ndarray] = {}


def _kept(width: int) -> np.ndarray:
    """Row m: the sorted positions :func:`masked_levels` keeps of m values (the trimmed
    ends cut), for m from 0 to ``width``."""
    if width not in _KEPT:
        m = np.arange(width + 1)
        cut = (TRIM * m).astype(np.intp)
        columns = np.arange(width)
        _KEPT[width] = (columns >= cut[:, None]) & (columns < (m - cut)[:, None])
    return _KEPT[width]


def masked_levels(
    values: np.ndarray, mask: np.ndarray, counts: np.ndarray | None = None
) -> np.ndarray:
    """Robust level of each row's values where ``mask`` (NaN where none): the trimmed
    geometric mean (``TRIM`` cut at each end, in log; the plain geometric mean of fewer
    than 5 values; the trimmed arithmetic mean if any kept value is not positive), nearly
    as efficient as the mean under log-normal jitter, robust to a spike like the median.
    ``counts``, if given, is ``mask``'s count of each row."""
    rows, width = values.shape
    v = _filled(values, mask, counts)
    v.sort(axis=1)
    m = np.count_nonzero(mask, axis=1) if counts is None else counts
    cut = (TRIM * m).astype(np.intp)
    count = m - 2 * cut
    keep = _kept(width)[m]
    first = v[np.arange(rows), np.minimum(cut, width - 1)]
    with np.errstate(all="ignore"):
        kept = np.where(keep, v, 1.0)
        np.log(kept, out=kept)  # 0 where not kept
        out = np.exp(kept.sum(axis=1) / count)
        signed = np.flatnonzero(~(first > 0))  # the arithmetic mean there
        if signed.size:
            out[signed] = np.where(keep[signed], v[signed], 0.0).sum(axis=1) / count[signed]
    return np.where(m > 0, out, np.nan)


def find_knees(
    x: np.ndarray,
    t: np.ndarray,
    n: np.ndarray,
    *,
    knee: np.ndarray,
    noise: np.ndarray,
    min_relative_spread: float,
) -> np.ndarray:
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
    x, t, n : ndarray
        The windows (as :func:`fit_robust_costs`), positive batch sizes and times.
    knee : ndarray
        Each row's knee known so far (0: none).
    noise : ndarray
        Relative noise (log-sd) of one report of each row; NaN: unknown. The scatter of the run
        and the group it is tested against (with the next groups, at least
        ``SCATTER_REPORTS`` reports), replicates of one level if the curve is flat there,
        is used where it is smaller; with neither, nothing is decided.
    min_relative_spread : float
        Batch sizes closer than this (relative) are one group.

    Returns
    -------
    ndarray
        Each row's knee (0: no flat part known).
    """
    out = knee.astype(np.float64, copy=True)
    valid = np.arange(x.shape[1]) < n[:, None]
    low = np.where(valid, x, np.inf).min(axis=1)
    high = np.where(valid, x, -np.inf).max(axis=1)
    # only the rows with at least two groups of batch sizes can move their knee
    grouped = np.flatnonzero((high >= low * (1.0 + min_relative_spread)) & (high > low))
    if grouped.size:
        out[grouped] = _knees(
            x[grouped], t[grouped], n[grouped], knee[grouped], noise[grouped],
            min_relative_spread,
        )  # fmt: skip
    return out


def _grouped(
    x: np.ndarray, t: np.ndarray, order: np.ndarray, spread: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows in ``order`` (by batch size) and the group of each report, smallest
    first (a group: the sizes within ``spread`` of its smallest)."""
    flat = order + np.arange(0, order.size, x.shape[1])[:, None]  # order in the flat rows
    xs, ts = np.take(x, flat), np.take(t, flat)
    group = np.zeros(x.shape, dtype=np.intp)
    floor, g = xs[:, 0].copy(), np.zeros(x.shape[0], dtype=np.intp)
    for c in range(1, x.shape[1]):
        new = ~((xs[:, c] < floor * (1.0 + spread)) | (xs[:, c] == floor))  # equal: one group
        g = g + new
        floor = np.where(new, xs[:, c], floor)
        group[:, c] = g
    return xs, ts, group


def _knees(
    x: np.ndarray, t: np.ndarray, n: np.ndarray, knee: np.ndarray, noise: np.ndarray,
    spread: float,
) -> np.ndarray:  # fmt: skip
    """:func:`find_knees` of rows with at least two groups of batch sizes."""
    rows, width = x.shape
    columns = np.arange(width)
    valid = columns < n[:, None]
    # By batch size: where equal sizes share a group (always, unless the spread is 0 or
    # too small to part a size from itself), a report's time enters only through sets
    # of whole groups, sorted where they count, so any order of equal sizes does; else
    # equal sizes in the order of their times.
    by_size = np.where(valid, x, np.inf)
    xs, ts, group = _grouped(x, t, np.argsort(by_size, axis=1), spread)
    parted = (xs[:, 1:] == xs[:, :-1]) & (group[:, 1:] != group[:, :-1]) & valid[:, 1:]
    if parted.any():
        order = np.lexsort((np.where(valid, t, np.inf), by_size), axis=1)
        xs, ts, group = _grouped(x, t, order, spread)
    group = np.where(valid, group, width)
    groups = _at(group, n - 1) + 1
    # the end (exclusive) of the group of each report, in the sorted row
    bounds = np.full((rows, width), width, dtype=np.intp)
    bounds[:, :-1] = np.where(group[:, 1:] != group[:, :-1], columns[1:], width)
    ends = np.minimum.accumulate(bounds[:, ::-1], axis=1)[:, ::-1]
    logx = np.log(np.where(valid, xs, 1.0))
    given = np.isfinite(noise)
    active = np.ones(rows, dtype=bool)
    run_end = np.count_nonzero(group == 0, axis=1)
    run_top = _at(xs, run_end - 1)
    flat, ceiling = np.ones(rows, dtype=np.intp), np.full(rows, np.inf)
    with np.errstate(all="ignore"):
        for j in range(1, int(groups.max())):
            k = np.flatnonzero(active & (j < groups))  # the rows still in the loop
            if not k.size:
                break
            at_end, top, size = run_end[k], run_top[k], n[k]
            # the rows' reports (every row: the arrays themselves, not copies)
            sub_group, sub_t, sub_logx = (
                (group, ts, logx) if k.size == rows else (group[k], ts[k], logx[k])
            )
            members = sub_group == j
            count = np.count_nonzero(members, axis=1)
            start = np.argmax(members, axis=1)
            end = start + count
            g_low, g_high = xs[k, start], xs[k, np.maximum(end - 1, 0)]
            span = np.where(members, sub_logx, 0.0).sum(axis=1) / count - np.log(top)
            # the pooled reports: the run, the group and the next groups up to 5 reports
            at = np.minimum(np.maximum(end, SCATTER_REPORTS) - 1, width - 1)
            pooled = np.where(
                np.maximum(end, SCATTER_REPORTS) <= size,
                ends[k, at],
                size,
            )
            enough = pooled >= SCATTER_REPORTS
            prefix = columns < pooled[:, None]
            centre = np.log(masked_levels(sub_t, prefix, pooled))
            scatter = _MAD * masked_medians(np.abs(np.log(sub_t) - centre[:, None]), prefix, pooled)
            sigma = np.where(enough, scatter, np.nan)
            sub_noise = noise[k]
            sigma = np.where(
                given[k], np.where(enough, np.minimum(sigma, sub_noise), sub_noise), sigma
            )
            going = (span > 0) & np.isfinite(sigma)
            ratio = masked_levels(sub_t, members, count) / masked_levels(
                sub_t, columns < at_end[:, None], at_end
            )
            elasticity = np.maximum(np.log(ratio) / span, 0.0)
            error = KNEE_SIGMAS * sigma * np.sqrt(1 / at_end + 1 / count) / span
            flatter = going & (elasticity + error < FLAT_SHARE)
            rises = going & ~flatter & (elasticity - error > FLAT_SHARE)
            ceiling[k] = np.where(rises, g_low, ceiling[k])
            run_end[k] = np.where(flatter, end, at_end)
            run_top[k] = np.where(flatter, g_high, top)
            flat[k] += flatter
            active[:] = False
            active[k] = flatter
    top = np.maximum(knee, run_top)
    return np.where(
        flat >= 2,
        np.where(top < ceiling, top, run_top),
        np.where(knee < ceiling, knee, 0.0),
    )


class CostFits(NamedTuple):
    """:class:`CostFit` of each row, by field (``low``, ``high``: its ``spread``)."""

    slope: np.ndarray
    intercept: np.ndarray
    anchor: np.ndarray
    level: np.ndarray
    noise: np.ndarray
    weight: np.ndarray
    low: np.ndarray
    high: np.ndarray
    knee: np.ndarray

    def at(self, row: int) -> CostFit:
        """Row ``row``'s fit."""
        v = [float(field[row]) for field in self]
        return CostFit(
            slope=v[0], intercept=v[1], anchor=v[2], level=v[3], noise=v[4], weight=v[5],
            spread=(v[6], v[7]), knee=v[8],
        )  # fmt: skip


_PAIRS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _pairs(width: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(i, j)``, ``i < j``, of a window, by offset ``j - i`` (as
    :func:`_differences` lays them out)."""
    if width not in _PAIRS:
        none = np.zeros(0, dtype=np.intp)
        i = np.concatenate([none, *(np.arange(width - d) for d in range(1, width))])
        j = np.concatenate([none, *(np.arange(d, width) for d in range(1, width))])
        _PAIRS[width] = (i.astype(np.intp), j.astype(np.intp))
    return _PAIRS[width]


def _differences(values: np.ndarray) -> np.ndarray:
    """``values[:, j] - values[:, i]`` over the pairs of :func:`_pairs`, laid out
    ``(pairs, rows)``: a slice per offset on the transposed rows (contiguous across
    silos)."""
    rows, width = values.shape
    by_column = np.ascontiguousarray(values.T)
    out = np.empty((width * (width - 1) // 2, rows))
    start = 0
    for d in range(1, width):
        np.subtract(by_column[d:], by_column[: width - d], out=out[start : start + width - d])
        start += width - d
    return out


def fit_robust_costs(
    x: np.ndarray,
    t: np.ndarray,
    n: np.ndarray,
    *,
    prior_shape: np.ndarray,
    prior_noise: np.ndarray,
    prior_known: np.ndarray,
    min_relative_spread: float,
    knee: np.ndarray,
) -> CostFits:
    """Robust fit of ``t = a * x + b`` over each window, shrunk toward a prior shape.

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
    x, t, n : ndarray
        The windows: ``(N, W)`` batch sizes (positive) and times (positive), oldest first,
        row r's ``n[r] >= 1`` reports in its first ``n[r]`` columns.
    prior_shape : ndarray
        Fixed cost of each row's prior line in samples, ``x0 = b / a`` (>= 0).
    prior_noise : ndarray
        Relative noise of each silo's times known from earlier windows (>= 0), a lower
        bound of the residual scale; NaN: unknown.
    prior_known : ndarray of bool
        Whether ``prior_shape`` is the silo's own (identified from its data before), not a
        guess; with a guess and no slope of its own (weight < 0.5) the level comes only
        from the observations near the anchor (the last one at least).
    min_relative_spread : float
        Smallest relative difference of two batch sizes for their pair to enter the
        Theil-Sen slope.
    knee : ndarray
        Batch size up to which the silo's time is flat (:func:`find_knees`): observations
        below it count as made at the knee, so that the line is the part of the curve
        above it; 0: no flat part.

    Returns
    -------
    CostFits
        Each row's line, its anchor and level, the residual noise and the blend weight.

    References
    ----------
    Yang et al., BOA (profile ``t_i = A_i * b_i + c_i`` by linear regression); Theil,
    "A rank-invariant method of linear and polynomial regression analysis" (1950) and
    Sen, "Estimates of the regression coefficient based on Kendall's tau", JASA 63 (1968);
    James and Stein (1961) / Efron and Morris, JASA 68 (1973) for the positive-part
    shrinkage.
    """
    rows, width = x.shape
    columns = np.arange(width)
    valid = columns < n[:, None]
    full = width > 0 and int(n.min()) >= width  # every window full: no padding to mask
    xs = (
        np.maximum(x, knee[:, None]) if full else np.where(valid, np.maximum(x, knee[:, None]), 1.0)
    )
    ts = t if full else np.where(valid, t, 1.0)
    x0 = prior_shape
    anchor = _at(xs, n - 1)
    gap = min_relative_spread * anchor
    level0 = masked_levels(ts * (anchor + x0)[:, None] / (xs + x0[:, None]), valid, n)
    prior = level0 / (anchor + x0)
    i, j = _pairs(width)
    paired = j[:, None] < n[None, :]  # by pair, as _differences lays them out
    dx = _differences(xs)
    apart = paired & (np.abs(dx) >= gap[None, :]) & (dx != 0)  # equal sizes: replicates
    near = paired & ~apart
    apart_n = np.count_nonzero(apart, axis=0)
    near_n = n * (n - 1) // 2 - apart_n
    with np.errstate(all="ignore"):
        own = masked_medians(_differences(ts) / dx, apart, apart_n, axis=0)
        residual = ts - own[:, None] * xs
        middle = masked_medians(residual, valid, n)
        scale = np.where(
            n >= 4, _MAD * masked_medians(np.abs(residual - middle[:, None]), valid, n), -1.0
        )
        known = np.isfinite(prior_noise)
        scale = np.where(known, np.maximum(scale, prior_noise * level0), scale)
        blend = (apart_n > 0) & (own > 0) & (scale >= 0)
        mean_x = (xs if full else np.where(valid, xs, 0.0)).sum(axis=1) / n
        squares = (xs - mean_x[:, None]) ** 2
        se2 = scale * scale / (squares if full else np.where(valid, squares, 0.0)).sum(axis=1)
        gap2 = (own - prior) ** 2
        shrunk = np.where(gap2 > 0, np.maximum(0.0, 1.0 - se2 / gap2), 0.0)
        weight = np.where(blend, np.where(se2 == 0, 1.0, shrunk), 0.0)
        slope = np.where(blend, weight * own + (1.0 - weight) * prior, prior)
        moved = ts - slope[:, None] * (xs - anchor[:, None])
        # (the anchor's own batch size always counts as near it, a gap of 0 included)
        near_anchor = np.abs(xs - anchor[:, None])
        local = valid & ((near_anchor < gap[:, None]) | (near_anchor == 0))
        trusted = (weight >= 0.5) | prior_known
        local_n = np.count_nonzero(local, axis=1)
        use_local = (local_n >= 3) | ~trusted
        level = masked_levels(
            moved, np.where(use_local[:, None], local, valid), np.where(use_local, local_n, n)
        )
        level = np.where(level > 0, level, level0)
        slope = np.minimum(np.maximum(slope, MIN_SLOPE_SHARE * level / anchor), level / anchor)
        intercept = np.maximum(level - slope * anchor, 0.0)
        logs = np.log(ts / (slope[:, None] * xs + intercept[:, None]))
        pairs = np.abs(_differences(logs))
        replicates = _MAD * masked_medians(pairs, near, near_n, axis=0) / math.sqrt(2)
        overall = np.full(rows, np.nan)  # needed only where too few pairs are near
        few = np.flatnonzero((n >= 4) & (near_n < 3))
        if few.size:
            overall[few] = _MAD * masked_medians(np.abs(logs[few]), valid[few], n[few])
    noise = np.where(n >= 4, np.where(near_n >= 3, replicates, overall), np.nan)
    return CostFits(
        slope=slope,
        intercept=intercept,
        anchor=anchor,
        level=level,
        noise=noise,
        weight=weight,
        low=(xs if full else np.where(valid, xs, np.inf)).min(axis=1),
        high=(xs if full else np.where(valid, xs, -np.inf)).max(axis=1),
        knee=knee.astype(np.float64, copy=True),
    )


def fit_windows(
    x: np.ndarray,
    t: np.ndarray,
    n: np.ndarray,
    *,
    knee: np.ndarray,
    noise: np.ndarray,
    prior_shape: np.ndarray,
    prior_known: np.ndarray,
    min_relative_spread: float,
) -> CostFits:
    """The knee (:func:`find_knees`, from ``knee`` and ``noise``) and then the robust fit
    (:func:`fit_robust_costs`, ``noise`` its prior) of each row."""
    knees = find_knees(x, t, n, knee=knee, noise=noise, min_relative_spread=min_relative_spread)
    return fit_robust_costs(
        x, t, n, prior_shape=prior_shape, prior_noise=noise, prior_known=prior_known,
        min_relative_spread=min_relative_spread, knee=knees,
    )  # fmt: skip


def _window(x: ArrayLike, t: ArrayLike, knee: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One window as a table of one row ``(x, t, n)``; checks: equal non-empty 1-D
    sequences of finite positive numbers, a finite ``knee >= 0``."""
    try:
        xs = np.asarray(x, dtype=np.float64)
        ts = np.asarray(t, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"x and t must be 1-D sequences of numbers ({err})") from None
    if xs.ndim != 1 or xs.shape != ts.shape or xs.size == 0:
        raise ValueError(
            f"x and t must be equal non-empty 1-D sequences, got shapes {xs.shape} and {ts.shape}"
        )
    if not (np.isfinite(xs) & np.isfinite(ts) & (xs > 0) & (ts > 0)).all():
        raise ValueError("x and t must be finite and positive")
    if not math.isfinite(knee) or knee < 0:
        raise ValueError(f"knee must be finite and >= 0, got {knee!r}")
    return xs[None, :], ts[None, :], np.array([xs.size])


def _unknown(value: float | None) -> np.ndarray:
    return np.array([math.nan if value is None else float(value)])


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
    """:func:`fit_robust_costs` of one window, checked (``ValueError`` on a bad input).

    Parameters
    ----------
    x, t : sequence of float
        Observed batch sizes (positive) and times (positive), oldest first.
    prior_shape, prior_noise, prior_known, min_relative_spread, knee
        As :func:`fit_robust_costs` (``prior_noise`` ``None``: unknown).

    Returns
    -------
    CostFit
        The line, its anchor and level, the residual noise and the blend weight.
    """
    xs, ts, n = _window(x, t, knee)
    if not math.isfinite(prior_shape) or prior_shape < 0:
        raise ValueError(f"prior_shape must be finite and >= 0, got {prior_shape!r}")
    if prior_noise is not None and (not math.isfinite(prior_noise) or prior_noise < 0):
        raise ValueError(f"prior_noise must be finite and >= 0 or None, got {prior_noise!r}")
    fits = fit_robust_costs(
        xs, ts, n, prior_shape=np.array([float(prior_shape)]), prior_noise=_unknown(prior_noise),
        prior_known=np.array([prior_known]), min_relative_spread=min_relative_spread,
        knee=np.array([float(knee)]),
    )  # fmt: skip
    return fits.at(0)


def find_knee(
    x: ArrayLike,
    t: ArrayLike,
    *,
    knee: float = 0.0,
    noise: float | None = None,
    min_relative_spread: float = 0.1,
) -> float:
    """:func:`find_knees` of one window, checked (``ValueError`` on a bad input).

    Parameters
    ----------
    x, t : sequence of float
        Observed batch sizes and times (positive).
    knee, noise, min_relative_spread
        As :func:`find_knees` (``noise`` ``None``: unknown).

    Returns
    -------
    float
        The knee (0: no flat part known).
    """
    xs, ts, n = _window(x, t, knee)
    found = find_knees(
        xs, ts, n, knee=np.array([float(knee)]), noise=_unknown(noise),
        min_relative_spread=min_relative_spread,
    )  # fmt: skip
    return float(found[0])
