"""Integer batch sizes that keep the total exactly and respect every bound.

Reference: Chen et al., IEEE TCC 2021, Alg. 1 line 6 ("round x_i to integers with
sum x_i = X").
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ArrayLike", "integer_bounds", "round_to_total"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ArrayLike = Sequence[float] | npt.NDArray[Any]


def integer_bounds(
    n: int,
    *,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
) -> tuple[IntArray, IntArray]:
    """Integer per-silo bounds: ``ceil(lower)`` and ``floor(upper)``.

    Parameters
    ----------
    n : int
        Number of silos.
    lower : sequence of float | None (default: None)
        Lower bounds; ``None`` means 0 for every silo.
    upper : sequence of float | None (default: None)
        Upper bounds (``inf`` allowed); ``None`` means unbounded.
    """
    lo = np.zeros(n) if lower is None else np.asarray(lower, dtype=np.float64)
    hi = np.full(n, np.inf) if upper is None else np.asarray(upper, dtype=np.float64)
    if lo.shape != (n,) or hi.shape != (n,):
        raise ValueError(f"bounds must have length {n}, got {lo.shape} and {hi.shape}")
    if np.any(np.isnan(lo)) or np.any(np.isnan(hi)):
        raise ValueError("bounds must not be NaN")
    lo_int = np.ceil(lo).astype(np.int64)
    hi_int = np.where(np.isinf(hi), np.iinfo(np.int64).max // (4 * max(n, 1)), np.floor(hi))
    hi_int = hi_int.astype(np.int64)
    if np.any(lo_int > hi_int):
        bad = int(np.argmax(lo_int > hi_int))
        raise ValueError(f"silo {bad}: lower bound {lo[bad]} exceeds upper bound {hi[bad]}")
    return lo_int, hi_int


def round_to_total(
    x: ArrayLike,
    total: int,
    *,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    slope: ArrayLike | None = None,
    intercept: ArrayLike | None = None,
) -> IntArray:
    """Round real shares to integers summing exactly to ``total`` within the bounds.

    Every share is clipped to its bounds and floored; the missing units then go, one at
    a time, to the silos with the largest fractional parts (largest-remainder rounding),
    or, when ``slope`` is given, to the silo whose time ``slope_i * (r_i + 1) +
    intercept_i`` after taking the unit is smallest, so that a unit costs the slowest
    silo as little time as possible. When clipping left too many units they are taken
    from the smallest fractional parts (largest times). No bound is ever crossed; ties
    go to the lower index, so the result is deterministic.

    Time-aware rounding of the continuous min-max optimum is the exact integer min-max:
    every unit below the floor of the optimum costs at most its round time, every other
    unit more, so greedily adding the cheapest units picks the cheapest set.

    Parameters
    ----------
    x : sequence of float
        Real-valued shares (finite).
    total : int
        Exact integer sum of the result.
    lower : sequence of float | None (default: None)
        Per-silo lower bounds (rounded up); ``None`` means 0.
    upper : sequence of float | None (default: None)
        Per-silo upper bounds (rounded down); ``None`` means unbounded.
    slope : sequence of float | None (default: None)
        Per-unit time ``a_i`` of each silo: round by time instead of by remainder.
    intercept : sequence of float | None (default: None)
        Fixed time ``b_i`` of each silo (0 when ``None``); used only with ``slope``.

    Returns
    -------
    numpy.ndarray of int64
        Integers ``r`` with ``r.sum() == total`` and ``lower <= r <= upper``.

    Raises
    ------
    ValueError
        If a share is not finite, or no integers within the bounds reach ``total``.
    """
    values = np.asarray(x, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"shares must be one-dimensional, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"shares must be finite, got {values.tolist()}")
    if isinstance(total, bool) or int(total) != total:
        raise ValueError(f"total must be an integer, got {total!r}")
    total = int(total)
    n = values.shape[0]
    lo, hi = integer_bounds(n, lower=lower, upper=upper)
    if n == 0:
        if total != 0:
            raise ValueError(f"cannot split total {total} over no silos")
        return np.zeros(0, dtype=np.int64)
    if lo.sum() > total or hi.sum() < total:
        raise ValueError(
            f"total {total} is outside the feasible range [{int(lo.sum())}, {int(hi.sum())}] "
            "given the per-silo bounds"
        )
    clipped = np.clip(values, lo, hi)
    result = np.clip(np.floor(clipped), lo, hi).astype(np.int64)
    missing = total - int(result.sum())
    if slope is None:
        fraction = clipped - result
        _move_units(result, missing, key=-fraction, lo=lo, hi=hi)
        return result
    a = np.asarray(slope, dtype=np.float64)
    b = np.zeros(n) if intercept is None else np.asarray(intercept, dtype=np.float64)
    if a.shape != (n,) or b.shape != (n,) or not np.all(np.isfinite(a) & np.isfinite(b)):
        raise ValueError(f"slope and intercept must be {n} finite values")
    # Adding, the cheapest next unit first (the heap holds each silo's time after one more
    # unit); removing, from the slowest silo first (its time, negated).
    step, after, bound = (1, 1, hi) if missing > 0 else (-1, 0, lo)

    def key(i: int) -> float:
        return float(step * (a[i] * (result[i] + after) + b[i]))

    heap = [(key(i), i) for i in range(n) if result[i] != bound[i]] if missing else []
    heapq.heapify(heap)
    for _ in range(abs(missing)):
        _, i = heapq.heappop(heap)
        result[i] += step
        if result[i] != bound[i]:
            heapq.heappush(heap, (key(i), i))
    return result


def _move_units(
    result: IntArray, missing: int, *, key: FloatArray, lo: IntArray, hi: IntArray
) -> None:
    """Add ``missing`` units (or remove ``-missing``) in ``key`` order, within bounds."""
    if missing == 0:
        return
    step = 1 if missing > 0 else -1
    order = np.argsort(key if step > 0 else -key, kind="stable")
    # Passes over the silos in ``order``, one unit to each silo that can take it.
    while missing != 0:
        room = (hi - result) if step > 0 else (result - lo)
        open_ = order[room[order] > 0]
        if open_.size == 0:
            return
        chosen = open_[: abs(missing)]
        result[chosen] += step
        missing -= step * chosen.size
