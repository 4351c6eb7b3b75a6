"""The one change detector: a run of deviations to the same side confirms a change of level.

A silo's speed on a non-dedicated machine moves two ways: per-round jitter and spikes
(a garbage collection, a burst of traffic), which a predictor must ignore, and lasting
steps (a co-tenant arrives or leaves), which it must follow at once. The detector tells
them apart from the deviations of the observations from the current level: a deviation
beyond the single-observation limit is *held* (kept out of the estimate); ``confirm``
held deviations in a row, to the same side, confirm a change, and a run longer than
``confirm`` whose mean deviation (each clipped at the limit, so that one spike cannot
carry it) exceeds the limit divided by the square root of its length confirms one too (a
step hidden in the noise; a run no longer than ``confirm`` never takes this test). A
deviation to the other side ends the run. A deviation within :data:`ON_LEVEL` of zero lies
on the level, to neither side: it ends the run, and the next one starts after it. (The
median silo of a round from which the shared slowdown was taken out deviates by exactly
zero in exact arithmetic; its computed sign is the last bit of a float sum, which differs
between CPUs, and must not decide whether a run goes on.)

Every silo's run is a row of :func:`new_runs`' arrays and :func:`observe_run` judges one
deviation of many silos at once. Two users share it: the silo table
(:class:`~fl_lbbsp.core.silo.model.SiloTable`, log deviations of a report's time from the
silo's level near its batch size, the run as long as the history window) and the
change-aware EMA (:class:`~fl_lbbsp.core.silo.estimators.ChangeAwareEMA`, relative
deviations of a speed from its average, a run of ``confirm``: no CUSUM). :func:`push`
appends one report to windows of fixed length; :func:`near_levels` is the level a report
is judged against.

Reference: Page, "Continuous inspection schemes", Biometrika 41 (1954) (CUSUM), applied
to the per-worker speed prediction of LB-BSP (Chen et al., "Accelerating Distributed
Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 3.2 and 3.5).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

import numpy as np

from .costfit import masked_levels

__all__ = ["ON_LEVEL", "RUN", "near_levels", "new_runs", "observe_run", "push"]

ON_LEVEL = 1e-9
"""Deviations (log or relative) within this of zero are on the level: no side. Rounding
leaves about 1e-15; the smallest change the detector confirms is about 0.1."""

RUN = ("x", "t", "speed", "dev")
"""The float fields of a run's entries: batch size (0 where not known), time (0 where
not known), speed, deviation (its sign the side); beside them ``held`` (beyond the
single-observation limit) and each row's length ``n``."""


def new_runs(rows: int, width: int) -> dict[str, np.ndarray]:
    """Empty runs of ``rows`` silos, at most ``width`` entries each."""
    runs: dict[str, np.ndarray] = {name: np.zeros((rows, width)) for name in RUN}
    runs["held"] = np.zeros((rows, width), dtype=bool)
    runs["n"] = np.zeros(rows, dtype=np.intp)
    return runs


def push(
    windows: Sequence[np.ndarray], count: np.ndarray, rows: np.ndarray,
    values: Sequence[np.ndarray],
) -> np.ndarray:  # fmt: skip
    """Append ``values[k]`` to ``windows[k]`` (``(rows, W)`` arrays) at ``rows``, whose
    windows hold ``count`` entries (the oldest entry of a full one drops out); return
    their new counts."""
    width = windows[0].shape[1]
    full = rows[count >= width]
    if full.size:
        for window in windows:
            window[full, :-1] = window[full, 1:]
    at = np.minimum(count, width - 1)
    for window, value in zip(windows, values, strict=True):
        window[rows, at] = value
    counts: np.ndarray = np.minimum(count + 1, width)
    return counts


def observe_run(
    run: MutableMapping[str, np.ndarray],
    rows: np.ndarray,
    entry: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    held: np.ndarray,
    *,
    limit: np.ndarray | float,
    floor: float,
    confirm: int,
) -> np.ndarray:
    """Add one entry ``(x, t, speed, deviation)`` to the run of each of ``rows`` (``held``:
    beyond its ``limit``) and say where it confirms a change; the run then holds the
    entries that confirmed it (the caller empties it, ``run["n"][rows] = 0``).

    Parameters
    ----------
    run : mapping of str to ndarray
        The runs (:func:`new_runs`), changed in place.
    rows : ndarray
        The rows observed (distinct).
    entry : tuple of ndarray
        Each row's new entry, by :data:`RUN`.
    held : ndarray of bool
        Whether each entry lies beyond the single-observation limit.
    limit : ndarray or float
        The single-observation limit (the CUSUM test clips deviations at it).
    floor : float
        Smallest mean deviation the CUSUM test counts as a change.
    confirm : int
        Held deviations in a row, to the same side, that confirm a change (>= 1).

    Returns
    -------
    ndarray of bool
        Where a change is confirmed.
    """
    width, fields = run["x"].shape[1], (*RUN, "held")
    limit = np.broadcast_to(np.asarray(limit, dtype=np.float64), rows.shape)
    count = run["n"][rows]
    deviation = np.where(np.abs(entry[3]) <= ON_LEVEL, 0.0, entry[3])
    entry = (*entry[:3], deviation)
    previous = run["dev"][rows, np.maximum(count - 1, 0)]
    count = np.where((count > 0) & (np.sign(previous) != np.sign(deviation)), 0, count)
    count = push([run[name] for name in fields], count, rows, (*entry, held))
    columns = np.arange(width)
    inside = columns < count[:, None]
    last_normal = np.where(inside & ~run["held"][rows], columns, -1).max(axis=1)
    trailing = count - 1 - last_normal
    confirmed: np.ndarray = trailing >= confirm
    for k in np.flatnonzero(confirmed).tolist():  # keep only the held entries at the end
        i, drop = rows[k], int(count[k] - trailing[k])
        if drop:
            for name in fields:
                run[name][i, : trailing[k]] = run[name][i, drop : count[k]]
    count = np.where(confirmed, trailing, count)
    long = ~confirmed & (count > confirm)
    if long.any():
        clipped = np.clip(run["dev"][rows], -limit[:, None], limit[:, None])
        with np.errstate(all="ignore"):
            mean = np.abs(np.where(inside, clipped, 0.0).sum(axis=1)) / count
            confirmed |= long & (mean > np.maximum(floor, limit / np.sqrt(count)))
    run["n"][rows] = count
    return confirmed


def near_levels(
    windows: tuple[np.ndarray, np.ndarray, np.ndarray], slope: np.ndarray, rows: np.ndarray,
    size: np.ndarray, *, spread: float,
) -> np.ndarray:  # fmt: skip
    """Each silo's time at batch size ``size`` from its reports within ``spread`` of it
    (relative), moved along the fitted ``slope`` (of each of ``rows``), at least 2 of
    them, so that an error of the line's shape (a fixed cost not identified yet) does not
    count; NaN without a fit or such reports. ``windows``: the history windows ``(x, t,
    n)``, batch sizes and times by row and their lengths."""
    xs, ts, ns = windows
    n = ns[rows]
    width = int(n.max())
    x, t = xs[rows, :width], ts[rows, :width]
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
