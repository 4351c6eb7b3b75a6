"""The change detector and the history window over the silo table's columns.

:func:`observe_run` is :meth:`~fl_lbbsp.core.silo.change.ChangeDetector.observe` (with its
CUSUM test) for many silos at once, each silo's run a row of the
:class:`~fl_lbbsp.core.silo.columns.SiloColumns`, against the level
:func:`near_levels` finds; :func:`take_changes` restarts a silo's
estimator and window from the reports that confirmed a change; :func:`push` appends one
report to windows of fixed length.

Reference: Page, "Continuous inspection schemes", Biometrika 41 (1954) (CUSUM), applied
to the per-worker speed prediction of LB-BSP (Chen et al., IEEE TCC 2021, Sec. 3.2).
"""

from __future__ import annotations

import math

import numpy as np

from .columns import SiloColumns
from .costfit import masked_levels

__all__ = ["near_levels", "observe_run", "push", "take_changes"]

_RUN = ("x", "t", "speed", "dev")


def push(
    xs: np.ndarray, ts: np.ndarray, n: np.ndarray, rows: np.ndarray, x: np.ndarray, t: np.ndarray
) -> None:
    """Append ``(x, t)`` to the windows at ``rows`` (the oldest entry of a full one drops
    out)."""
    if not rows.size:
        return
    width = xs.shape[1]
    count = n[rows]
    full = rows[count >= width]
    if full.size:
        xs[full, :-1], ts[full, :-1] = xs[full, 1:], ts[full, 1:]
    at = np.minimum(count, width - 1)
    xs[rows, at], ts[rows, at] = x, t
    n[rows] = np.minimum(count + 1, width)


def observe_run(
    f: SiloColumns,
    rows: np.ndarray,
    entry: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    held: np.ndarray,
    *,
    limit: np.ndarray,
    floor: float,
    confirm: int,
) -> np.ndarray:
    """Add one deviation to the run of each of ``rows`` and say where it confirms a
    change (the run then holds the reports that confirmed it)."""
    width, run = f.width, f.run
    count = f.run_n[rows]
    deviation = entry[3]
    previous = run["dev"][rows, np.maximum(count - 1, 0)]
    count = np.where((count > 0) & ((previous > 0) != (deviation > 0)), 0, count)
    full = rows[count >= width]
    if full.size:
        for name in _RUN:
            run[name][full, :-1] = run[name][full, 1:]
        f.run_held[full, :-1] = f.run_held[full, 1:]
    at = np.minimum(count, width - 1)
    for name, values in zip(_RUN, entry, strict=True):
        run[name][rows, at] = values
    f.run_held[rows, at] = held
    count = np.minimum(count + 1, width)
    columns = np.arange(width)
    inside = columns < count[:, None]
    last_normal = np.where(inside & ~f.run_held[rows], columns, -1).max(axis=1)
    trailing = count - 1 - last_normal
    confirmed: np.ndarray = trailing >= confirm
    for k in np.flatnonzero(confirmed).tolist():  # keep only the held reports at the end
        i, drop = rows[k], int(count[k] - trailing[k])
        if drop:
            for name in _RUN:
                run[name][i, : trailing[k]] = run[name][i, drop : count[k]]
            f.run_held[i, : trailing[k]] = f.run_held[i, drop : count[k]]
    count = np.where(confirmed, trailing, count)
    long = ~confirmed & (count > confirm)
    if long.any():
        clipped = np.clip(run["dev"][rows], -limit[:, None], limit[:, None])
        with np.errstate(all="ignore"):
            mean = np.abs(np.where(inside, clipped, 0.0).sum(axis=1)) / count
            confirmed |= long & (mean > np.maximum(floor, limit / np.sqrt(count)))
    f.run_n[rows] = count
    return confirmed


def take_changes(f: SiloColumns, rows: np.ndarray, max_boost: float) -> None:
    """Restart the estimator and the window of each of ``rows`` from the reports that
    confirmed its change, widen its change limit by the change's size, empty its run."""
    run = f.run
    for i in rows.tolist():
        n = int(f.run_n[i])
        speeds = run["speed"][i, :n]
        one = np.array([i])
        f.restart_estimators(one)
        for speed in speeds.tolist():
            f.update_estimators(one, np.array([speed]))
        f.hist_x[i, :n], f.hist_t[i, :n] = run["x"][i, :n], run["t"][i, :n]
        f.hist_n[i] = n
        level_ratio = math.exp(abs(math.fsum(run["dev"][i, :n].tolist()) / n))
        f["boost"][i] = min(level_ratio, max_boost)
        f.run_n[i] = 0


def near_levels(
    f: SiloColumns, rows: np.ndarray, size: np.ndarray, *, spread: float
) -> np.ndarray:
    """Each silo's time at batch size ``size`` from its reports within ``spread`` of it
    (relative), moved along the fitted slope, at least 2 of them, so that an error of the
    line's shape (a fixed cost not identified yet) does not count; NaN without a fit or
    such reports."""
    slope, n = f["fit_slope"][rows], f.hist_n[rows]
    width = int(n.max())
    x, t = f.hist_x[rows, :width], f.hist_t[rows, :width]
    valid = np.arange(width) < n[:, None]
    near = valid & (np.abs(x - size[:, None]) < (spread * size)[:, None])
    count = np.count_nonzero(near, axis=1)
    judged = (count >= 2) & ~np.isnan(slope) & (n >= 2)
    out = np.full(len(rows), np.nan)
    if judged.any():
        level = masked_levels(
            t + slope[:, None] * (size[:, None] - x), near & judged[:, None],
            np.where(judged, count, 0),
        )  # fmt: skip
        # moved along a steep slope, reports far below x can land at or under zero: no
        # level to judge a time by (the change detection and the common factor take logs)
        out = np.where(judged & np.isfinite(level) & (level > 0), level, np.nan)
    return out

