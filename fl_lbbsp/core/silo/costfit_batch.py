"""The cost fits of many silos at once: :mod:`.costfit` over a table of windows.

Each silo's window is a row of two ``(N, W)`` arrays (batch sizes and times, oldest
first, its ``n`` reports in the first ``n`` columns); every function here does for all
rows at once, in numpy, what its namesake in :mod:`.costfit` does for one window, step for
step, so that a round of reports costs a few array operations rather than a Python fit
per silo. Sums are numpy's rather than ``math.fsum``'s (they may differ in the last bit).

Reference: as :mod:`.costfit` (Theil-Sen, James-Stein, trimmed geometric mean).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .costfit import (
    FLAT_SHARE,
    KNEE_SIGMAS,
    MIN_SLOPE_SHARE,
    SCATTER_REPORTS,
    TRIM,
    find_knee,
    fit_robust_cost,
)

__all__ = [
    "SCALAR_ROWS",
    "CostFits",
    "find_knees",
    "fit_robust_costs",
    "fit_windows",
    "masked_levels",
    "masked_medians",
]

SCALAR_ROWS = 12
"""Up to this many windows :func:`fit_windows` fits one at a time (:mod:`.costfit`): a
few array operations on a handful of rows cost more than plain Python."""

_MAD = 1.4826  # the MAD's consistency factor under normal noise


def _at(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``values[r, index[r]]`` of each row r."""
    out: np.ndarray = values[np.arange(values.shape[0]), index]
    return out


def _rows(values: np.ndarray) -> np.ndarray:
    return np.arange(values.shape[0])[:, None]


def _filled(values: np.ndarray, mask: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
    """``np.where(mask, values, inf)``: a copy of ``values`` where ``counts`` (the mask's
    count of each row) say that the mask holds every position."""
    if counts is not None and values.shape[1] and int(counts.min()) >= values.shape[1]:
        return values.astype(np.result_type(values, np.inf), copy=True)
    out: np.ndarray = np.where(mask, values, np.inf)
    return out


def masked_medians(
    values: np.ndarray, mask: np.ndarray, counts: np.ndarray | None = None
) -> np.ndarray:
    """Median of each row's values where ``mask`` (NaN where none); ``counts``, if given,
    is ``mask``'s count of each row."""
    rows, width = values.shape
    if width == 0:
        return np.full(rows, np.nan)
    v = _filled(values, mask, counts)
    v.sort(axis=1)
    m = np.count_nonzero(mask, axis=1) if counts is None else counts
    k = m // 2
    index = np.arange(rows)
    upper = v[index, np.minimum(k, width - 1)]
    lower = v[index, np.maximum(k - 1, 0)]
    out = np.where(m % 2 == 1, upper, 0.5 * (lower + upper))
    return np.where(m > 0, out, np.nan)


def _pair_medians(by_pair: np.ndarray, mask: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`masked_medians` of values and mask laid out ``(pairs, rows)`` (as
    :func:`_differences` gives them), ``counts`` the mask's count of each row."""
    width, rows = by_pair.shape
    if width == 0:
        return np.full(rows, np.nan)
    v = np.where(mask, by_pair, np.inf)
    v.sort(axis=0)
    k = counts // 2
    index = np.arange(rows)
    upper = v[np.minimum(k, width - 1), index]
    lower = v[np.maximum(k - 1, 0), index]
    out = np.where(counts % 2 == 1, upper, 0.5 * (lower + upper))
    return np.where(counts > 0, out, np.nan)


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
    """:func:`~.costfit.robust_level` of each row's values where ``mask`` (NaN where
    none); ``counts``, if given, is ``mask``'s count of each row."""
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
    """:func:`~.costfit.find_knee` of each row (``noise`` NaN: unknown)."""
    out = knee.astype(np.float64, copy=True)
    columns = np.arange(x.shape[1])
    valid = columns < n[:, None]
    low = np.where(valid, x, np.inf).min(axis=1)
    high = np.where(valid, x, -np.inf).max(axis=1)
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
    """:class:`~.costfit.CostFit` of each row, by field."""

    slope: np.ndarray
    intercept: np.ndarray
    anchor: np.ndarray
    level: np.ndarray
    noise: np.ndarray
    weight: np.ndarray
    low: np.ndarray
    high: np.ndarray
    knee: np.ndarray


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
    """:func:`~.costfit.fit_robust_cost` of each row (``prior_noise`` NaN: unknown);
    every row has at least one report, positive batch sizes and times."""
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
        own = _pair_medians(_differences(ts) / dx, apart, apart_n)
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
        replicates = _MAD * _pair_medians(np.abs(_differences(logs)), near, near_n) / math.sqrt(2)
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
    scalar_rows: int | None = None,
) -> CostFits:
    """The knee (:func:`find_knees`, from ``knee`` and ``noise``) and then the robust fit
    (:func:`fit_robust_costs`, ``noise`` its prior) of each row; up to ``scalar_rows``
    rows (``None``: :data:`SCALAR_ROWS`) one at a time with :mod:`.costfit`."""
    limit = SCALAR_ROWS if scalar_rows is None else scalar_rows
    if len(n) > limit:
        knees = find_knees(x, t, n, knee=knee, noise=noise, min_relative_spread=min_relative_spread)
        return fit_robust_costs(
            x, t, n, prior_shape=prior_shape, prior_noise=noise, prior_known=prior_known,
            min_relative_spread=min_relative_spread, knee=knees,
        )  # fmt: skip
    out = np.empty((len(CostFits._fields), len(n)))
    for k, size in enumerate(n.tolist()):
        xs, ts = x[k, :size].tolist(), t[k, :size].tolist()
        given = None if math.isnan(noise[k]) else float(noise[k])
        found = find_knee(
            xs, ts, knee=float(knee[k]), noise=given, min_relative_spread=min_relative_spread
        )
        fit = fit_robust_cost(
            xs, ts, prior_shape=float(prior_shape[k]), prior_noise=given,
            prior_known=bool(prior_known[k]), min_relative_spread=min_relative_spread,
            knee=found,
        )  # fmt: skip
        out[:, k] = (fit.slope, fit.intercept, fit.anchor, fit.level, fit.noise, fit.weight,
                     *fit.spread, fit.knee)  # fmt: skip
    return CostFits(*out)
