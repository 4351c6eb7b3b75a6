"""The noise budget's water-filling, and the bisection of the round time over it.

:func:`waterfill` splits a total as ``x_i = clip(s * q_i, lo_i, hi_i)``, the split of
least ``sum q_i^2 / x_i`` within the bounds; :func:`least_round_time` bisects the round
time T whose water-filling within the caps ``U_i(T)`` meets the budget (the solver of
:mod:`.budget`). For a few silos (up to :data:`SCALAR_SILOS`) the bisection's steps run
on Python floats rather than numpy arrays: the same operations on the same numbers in the
same order (numpy adds fewer than 8 numbers left to right, as :func:`_sum` does), so every
step compares the same floats and the round time found is the same, without numpy's cost
per call, which a handful of silos cannot amortise.

Reference: the water-filling of the Lagrangian of ``sum_i c_i / B_i`` under
``sum_i B_i = X`` (Boyd and Vandenberghe, Convex Optimization, Sec. 5.5.3).
"""

from __future__ import annotations

import math
from functools import reduce
from operator import add

import numpy as np

from .rounding import FloatArray

__all__ = ["ALL_POINTS", "SCALAR_SILOS", "TOLERANCE", "least_round_time", "waterfill"]

TOLERANCE = 1e-9
"""Relative tolerance of the budget and of the bisection's interval."""

ALL_POINTS = 32
"""Up to this many silos :func:`waterfill` sums the shares at every breakpoint at once."""

SCALAR_SILOS = 7
"""Up to this many silos :func:`least_round_time` bisects on Python floats (numpy's sums
of up to 7 numbers add them left to right)."""


def waterfill(
    q: FloatArray, lo: FloatArray, hi: FloatArray, total: float
) -> tuple[FloatArray, float]:
    """``x_i = clip(s * q_i, lo_i, hi_i)`` summing to ``total`` (the least
    ``sum q_i^2 / x_i``), and the level s; ``sum lo <= total <= sum hi``."""
    finite = np.isfinite(hi)
    points = np.sort(np.concatenate([lo / q, (hi / q)[finite]]))
    points = points[np.concatenate([[True], points[1:] != points[:-1]])]  # np.unique's

    def filled(k: int) -> float:
        return float(np.minimum(np.maximum(float(points[k]) * q, lo), hi).sum())

    # First breakpoint whose sum reaches the total (sums never decrease in s): every
    # breakpoint's sum at once for a few silos (each row summed as one silo vector is),
    # else a binary search.
    k, end = 0, len(points)
    if len(q) <= ALL_POINTS:
        sums = np.minimum(np.maximum(points[:, None] * q[None, :], lo), hi).sum(axis=1)
        reach = sums >= total
        k = end = int(np.argmax(reach)) if reach[-1] else end
        filled = sums.tolist().__getitem__
    while k < end:
        middle = (k + end) // 2
        if filled(middle) >= total:
            end = middle
        else:
            k = middle + 1
    if k < len(points) and (k == 0 or filled(k) == total):
        s = float(points[k])
    else:
        low = float(points[k - 1])
        # The silos strictly between their bounds inside the segment (its midpoint).
        inside = 0.5 * (low + float(points[k])) if k < len(points) else 2.0 * low + 1.0
        free = (inside * q > lo) & (inside * q < hi)
        if not free.any():
            return np.minimum(np.maximum(low * q, lo), hi), low
        fixed = float(np.minimum(np.maximum(inside * q, lo), hi)[~free].sum())
        s = (total - fixed) / float(q[free].sum())
    x = np.minimum(np.maximum(s * q, lo), hi)  # np.clip's floats, without its overhead
    # Float error: put the residue on the free silos, within their bounds.
    residue = total - float(x.sum())
    free = (x > lo) & (x < hi)
    if residue and free.any():
        x[free] = np.clip(x[free] + residue * q[free] / q[free].sum(), lo[free], hi[free])
    return x, s


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
    if len(q) <= SCALAR_SILOS:
        meets = _Scalar(q, lo, hi, a, b, c, total).meets
    else:

        def meets(t: float, budget: float) -> bool:
            caps = np.asarray(np.maximum(np.minimum(hi, (t - b) / a), lo), dtype=np.float64)
            x = waterfill(q, lo, caps, total)[0]
            variance = math.inf if (x <= 0).any() else float((c / x).sum())
            return variance <= budget

    for _ in range(200):
        if high - low <= TOLERANCE * high:
            break
        middle = 0.5 * (low + high)
        if meets(middle, budget):
            high = middle
        else:
            low = middle
    return high


def _sum(values: list[float]) -> float:
    """Left to right, as numpy sums fewer than 8 numbers (0.0 for none)."""
    return reduce(add, values) if values else 0.0


class _Scalar:
    """The bisection's step on Python floats: :func:`waterfill` within the caps at T and
    the budget's test, each operation as numpy does it on the arrays."""

    def __init__(
        self, q: FloatArray, lo: FloatArray, hi: FloatArray, a: FloatArray, b: FloatArray,
        c: FloatArray, total: float,
    ) -> None:  # fmt: skip
        self.q, self.lo, self.hi = q.tolist(), lo.tolist(), hi.tolist()
        self.a, self.b, self.c, self.total = a.tolist(), b.tolist(), c.tolist(), total
        self.low_points = [v / w for v, w in zip(self.lo, self.q, strict=True)]
        self.terms = list(zip(self.b, self.a, self.lo, self.hi, strict=True))
        self.guess = 0
        """Where the last water-filling's level lay among its breakpoints."""

    def meets(self, t: float, budget: float) -> bool:
        """Whether the water-filling within the caps at ``t`` meets ``budget``."""
        lo, caps = self.lo, []
        for o, s, v, h in self.terms:  # U_i(t) = max(min(hi_i, (t - b_i) / a_i), lo_i)
            y = (t - o) / s
            if h < y:
                y = h
            if v > y:
                y = v
            caps.append(y)
        if not all(map(math.isfinite, caps)):  # numpy's path says what inf - inf gives
            arrays = np.array(self.q), np.array(lo), np.array(caps)
            x = waterfill(*arrays, self.total)[0].tolist()
        else:
            x = self.fill(caps)
        if any(v <= 0 for v in x):
            variance = math.inf
        else:
            variance = _sum([w / v for w, v in zip(self.c, x, strict=True)])
        return variance <= budget

    def fill(self, hi: list[float]) -> list[float]:
        """:func:`waterfill`'s ``x`` within the (finite) caps ``hi``."""
        q, total = self.q, self.total
        # The breakpoints, not deduplicated: equal points have equal sums, so the first
        # point whose sum reaches the total and the point before it are the ones of the
        # deduplicated points.
        points = sorted(self.low_points + [h / w for h, w in zip(hi, q, strict=True)])
        bounds = list(zip(q, self.lo, hi, strict=True))
        # The first point whose sum reaches the total: the sums never decrease along the
        # points (each share and each float addition is monotone), so the point found
        # last time is checked first (it and the one before it), else a binary search
        # finds the one numpy's scan of every sum finds.
        k, end, sums = 0, len(points), {}
        guess = self.guess
        if 0 < guess < end:
            sums[guess] = _sum(_shares(points[guess], bounds))
            if sums[guess] >= total:
                sums[guess - 1] = _sum(_shares(points[guess - 1], bounds))
                if sums[guess - 1] < total:
                    k = end = guess
        while k < end:
            middle = (k + end) // 2
            if middle not in sums:
                sums[middle] = _sum(_shares(points[middle], bounds))
            if sums[middle] >= total:
                end = middle
            else:
                k = middle + 1
        self.guess = k
        if k < len(points) and (k == 0 or sums[k] == total):
            s = points[k]
        else:
            low = points[k - 1]
            inside = 0.5 * (low + points[k]) if k < len(points) else 2.0 * low + 1.0
            free = [v < inside * w < h for w, v, h in bounds]
            if not any(free):
                return _shares(low, bounds)
            shares = _shares(inside, bounds)
            fixed = _sum([x for x, f in zip(shares, free, strict=True) if not f])
            s = (total - fixed) / _sum([w for w, f in zip(q, free, strict=True) if f])
        x = _shares(s, bounds)
        residue = total - _sum(x)
        free = [v < xi < h for xi, (_, v, h) in zip(x, bounds, strict=True)]
        if residue and any(free):
            spread = _sum([w for w, f in zip(q, free, strict=True) if f])
            x = [
                min(max(xi + residue * w / spread, v), h) if f else xi
                for xi, f, (w, v, h) in zip(x, free, bounds, strict=True)
            ]
        return x


def _shares(s: float, bounds: list[tuple[float, float, float]]) -> list[float]:
    """``min(max(s * q_i, lo_i), hi_i)`` of each silo ``(q_i, lo_i, hi_i)``: the floats
    ``np.minimum(np.maximum(s * q, lo), hi)`` gives."""
    out = []
    for w, v, h in bounds:
        y = s * w
        if v > y:
            y = v
        if h < y:
            y = h
        out.append(y)
    return out
