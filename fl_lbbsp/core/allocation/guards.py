"""The guards on every allocation: the order guard (a silo predicted faster never gets a
smaller batch) and the equal-split guard (an allocation is shipped only if it is predicted
faster than FedAvg's equal split, like with like), and the noise budget restored after the
order guard moved samples; steps 7-9 of :mod:`~fl_lbbsp.core.allocation.pipeline`.

Reference: Chen et al., IEEE TCC 2021, Alg. 1 (batch size proportional to predicted speed);
Ayer et al., Ann. Math. Stat. 26, 1955 (pool adjacent violators); C. E. Clark, Operations
Research 9(2), 1961, and H. A. David and H. N. Nagaraja, *Order Statistics*, Wiley 2003
(the expected maximum of normals).
"""

from __future__ import annotations

import math

import numpy as np

from .allocators import Bounds, split_equally
from .budget import enforce_budget, hinge_times, noise_budget
from .rounding import round_to_total

__all__ = [
    "MAX_GRID",
    "equal_split_guard",
    "expected_max",
    "expected_max_bound",
    "guard_margin",
    "order_guard",
    "restore_budget",
]


def guard_margin(errors: np.ndarray, largest: float) -> float:
    """The predicted gain over the equal split an allocation must show beyond the
    like-with-like comparison of :func:`equal_split_guard`: twice the largest standard
    error of a silo's fitted time (``errors``), at most ``largest``
    (``equal_split_margin``), which applies while a silo has no noise estimate yet; with
    noise-free reports the margin is 0."""
    if not errors.size or np.isnan(errors).any():
        return largest
    return min(largest, 2.0 * float(errors.max()))


def expected_max(means: np.ndarray, sds: np.ndarray) -> float:
    """E[max_i X_i] of independent normals X_i ~ N(``means_i``, ``sds_i``^2) (an sd of 0: the
    constant ``means_i``), from the maximum's distribution function
    F(y) = prod_i Phi((y - means_i) / sds_i): with c = max_i means_i and s = max_i sds_i,
    E[max] = c + s (L + int_L^R (1 - F) du) in u = (y - c) / s, where below L = -9 (or the
    largest constant) F is nil; F is taken on a fixed grid of :data:`MAX_GRID` points
    (``scipy.special.log_ndtr``, summed over the silos: one vectorised pass, no Python per
    silo), integrated by Simpson's rule (``scipy.integrate.simpson``): to many digits on the
    smooth F of comparable sds, within a grid step's share (1/14 of ``s``) where one silo's
    sd is far narrower than ``s``. n equal sds s and means 0 give s times the
    expected largest of n standard normals (1.163 for 5, 1.867 for 20, 2.249 for 50).

    Reference: C. E. Clark, "The greatest of a finite set of random variables", Operations
    Research 9(2), 1961 (moments of the maximum of normals); H. A. David and H. N. Nagaraja,
    *Order Statistics*, Wiley 2003 (the expected largest of n normals)."""
    from scipy import integrate, special  # scikit-learn's dependency; loaded on first use

    means = np.asarray(means, dtype=np.float64)
    sds = np.asarray(sds, dtype=np.float64)
    top, scale = float(means.max()), float(sds.max())
    if not scale > 0:
        return top
    noisy = sds > 0
    z, w = (means[noisy] - top) / scale, sds[noisy] / scale
    lowest = -_REACH if noisy.all() else max(-_REACH, float(means[~noisy].max() - top) / scale)
    u = np.linspace(lowest, _REACH, MAX_GRID)
    live = z + _REACH * w > lowest  # a silo whose Phi is 1 on the whole grid drops out
    f = np.exp(special.log_ndtr((u[:, None] - z[live]) / w[live]).sum(axis=1))
    return top + scale * (lowest + float(integrate.simpson(1.0 - f, x=u)))


MAX_GRID = 257
"""Points of :func:`expected_max`'s grid over [-9, 9] largest sds around the largest mean."""
_REACH = 9.0  # Phi(-9) ~ 1e-19: beyond it the maximum's distribution is 0 or 1


def expected_max_bound(means: np.ndarray, sds: np.ndarray) -> float:
    """An upper bound of :func:`expected_max` at no cost: max_i means_i + max_i sds_i
    sqrt(2 ln n) (the expected largest of n normals of sd at most s exceeds the largest
    mean by at most s sqrt(2 ln n))."""
    n = max(int(np.size(means)), 1)
    return float(np.max(means)) + float(np.max(sds)) * math.sqrt(2.0 * math.log(n))


def equal_split_guard(
    sizes: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    knee: np.ndarray,
    bounds: Bounds,
    margin: float,
    *,
    errors: np.ndarray | None = None,
) -> np.ndarray:
    """The equal split (:func:`~.allocators.equal_split` within the hard bounds) unless
    ``sizes`` is predicted faster than it by more than ``margin`` of its round time, its
    prediction taken like with like: with each silo's relative standard ``errors`` of its
    fitted time (``None`` or NaN: none known), ``sizes``' predicted round is the expected
    largest of its silos' noisy times, ``E[max_i t_i (1 + errors_i Z_i)]``
    (:func:`expected_max`, Z_i standard normal).

    The equal split's predicted round is the largest of n noisy estimates, which exceeds
    the true largest by about the expected maximum of the n errors (the winner's curse:
    the maximum of n noisy estimates is biased upwards, and more so as n grows). An
    allocation balanced on the same estimates equalises them, so its predicted round
    carries no such maximum, but its true round does: each silo's true time is its
    estimate less its error, and the round is the largest of them. Giving the
    allocation its expected maximum puts both on the same footing; among silos of equal
    capacity, whose fits differ by noise alone, that keeps the equal split, and between
    silos of unequal capacity the balanced split still wins by its real gain. A silo whose
    predicted time lies well below the round (at a bound) adds little to the maximum."""
    equal = split_equally(bounds)
    times = hinge_times(a, b, knee, sizes)
    baseline = (1.0 - margin) * float(np.max(hinge_times(a, b, knee, equal)))
    if float(np.max(times)) >= baseline:
        return equal
    if errors is not None:
        relative = np.nan_to_num(np.asarray(errors, dtype=np.float64), nan=0.0)
        spread = times * relative
        if (
            relative.any()
            and expected_max_bound(times, spread) >= baseline
            and expected_max(times, spread) >= baseline
        ):
            return equal
    return sizes


def restore_budget(
    sizes: np.ndarray,
    bounds: Bounds,
    weights: np.ndarray | None,
    noise: np.ndarray | None,
    rho: float,
) -> None:
    """Move samples (in place) until the noise budget ``rho`` holds again after the order
    guard moved some (:func:`~fl_lbbsp.core.allocation.budget.enforce_budget`)."""
    c, budget = noise_budget(len(sizes), bounds.total, weights=weights, noise=noise, rho=rho)
    enforce_budget(sizes, c, budget, lower=np.maximum(np.ceil(bounds.lower), 1), upper=bounds.upper)


def order_guard(
    sizes: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    tolerance: float,
    *,
    lower: np.ndarray,
    upper: np.ndarray,
    round_time: float | None = None,
) -> np.ndarray:
    """Repair batch sizes that invert the order of the silos' predicted speeds.

    A silo's predicted speed is what its cost line ``t = a * x + b`` lets it process in
    the allocation's common finish time T (the median predicted time of the silos no
    bound holds): ``(T - b_i) / a_i`` (for ``b = 0`` proportional to its speed
    ``1 / a_i``). Whenever silo i is predicted faster than silo j by more than
    ``tolerance`` (relative) but gets a batch size more than one sample smaller (j above
    its lower bound, i below its upper one), the sizes are pooled: the silos are grouped
    into speed classes spanning a factor ``1 + tolerance`` each, from the slowest, and
    pool-adjacent-violators along the classes (a block holding fewer samples per silo
    than a slower one is merged with it at their mean) makes the sizes non-decreasing in
    speed class; they are then rounded to the same total within each silo's bounds. At
    the min-max solution without binding bounds there is no inversion; the guard catches
    those left by the bounds (change limits, caps) and by rounding. Bounds win over the
    order.

    Parameters
    ----------
    sizes : numpy.ndarray
        Integer batch sizes.
    a, b : numpy.ndarray
        Predicted per-sample and fixed cost of each silo.
    tolerance : float
        Relative speed difference within which two silos count as equally fast.
    lower, upper : numpy.ndarray
        Per-silo bounds the repair keeps.
    round_time : float | None (default: None)
        The allocation's round time T, where known (under a noise budget the silos below
        it are not held by a bound); ``None``: the median predicted time of the silos no
        bound holds.

    Reference: the order-preservation of Chen et al., IEEE TCC 2021, Alg. 1 (batch size
    proportional to predicted speed); the levelling is a pool-adjacent-violators step
    (Ayer et al., Ann. Math. Stat. 26, 1955).
    """
    x = np.asarray(sizes, dtype=np.int64).copy()
    n = len(x)
    if round_time is None:  # all the silos' when every silo is at a bound
        times = a * x + b
        inside = (x > np.asarray(lower)) & (x < np.asarray(upper))
        round_time = float(np.median(times[inside])) if inside.any() else float(np.max(times))
    speed = np.maximum(round_time - b, 0.0) / a
    # Fast check (the usual case): along the silos sorted by speed, no silo below its
    # upper bound holds fewer samples than a slower one (beyond the tolerance) above its
    # lower bound; other inversions are the bounds' and cannot be repaired.
    by_speed = np.argsort(speed, kind="stable")
    ranked = speed[by_speed]
    cut = np.searchsorted(ranked * (1.0 + tolerance), ranked, side="left")
    xs = x[by_speed].astype(np.float64)
    donors = np.where(xs > np.asarray(lower)[by_speed], xs, -np.inf)
    most = np.maximum.accumulate(donors)
    takers = xs < np.asarray(upper)[by_speed]
    if not np.any(takers & (cut > 0) & (most[np.maximum(cut - 1, 0)] > xs + 1)):
        return x
    # Along the chain sorted by class, then by size, an inversion is between classes.
    classes = np.empty(n, dtype=np.int64)
    current, start = 0, float(speed[by_speed[0]])
    for k in by_speed:
        if speed[k] > start * (1.0 + tolerance):
            current, start = current + 1, float(speed[k])
        classes[k] = current
    order = np.lexsort((x, classes))
    xs = x[order].astype(np.float64)
    # Pool adjacent violators over blocks [sum of sizes, count].
    blocks: list[list[float]] = []
    for k in range(n):
        blocks.append([xs[k], 1.0])
        while len(blocks) > 1 and blocks[-1][0] / blocks[-1][1] < blocks[-2][0] / blocks[-2][1]:
            high = blocks.pop()
            blocks[-1] = [blocks[-1][0] + high[0], blocks[-1][1] + high[1]]
    if len(blocks) == n:
        return x
    # Each block's samples split evenly, the remainder to its fastest silos.
    parts = []
    for total, count in blocks:
        base, extra = divmod(int(round(total)), int(count))
        part = np.full(int(count), base, dtype=np.int64)
        part[int(count) - extra :] += 1
        parts.append(part)
    pooled = np.empty(n, dtype=np.int64)
    pooled[order] = np.concatenate(parts)
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if np.all(pooled >= lo) and np.all(pooled <= hi):
        return pooled
    return round_to_total(np.clip(pooled, lo, hi), int(x.sum()), lower=lo, upper=hi)
