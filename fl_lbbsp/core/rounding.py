"""Integer batch sizes that keep the total exactly and respect every bound.

Reference: Chen et al., IEEE TCC 2021, Alg. 1 line 6 ("round x_i to integers with
sum x_i = X").
"""

from __future__ import annotations

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
) -> IntArray:
    """Round real shares to integers summing exactly to ``total`` within the bounds.

    Largest-remainder rounding: every share is clipped to its bounds and floored, then
    the missing units go to the silos with the largest fractional parts (or, when
    clipping left too many, are taken from those with the smallest), never crossing a
    bound. Ties go to the lower index, so the result is deterministic.

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
    fraction = clipped - result
    missing = total - int(result.sum())
    if missing > 0:
        order = np.argsort(-fraction, kind="stable")
        while missing > 0:
            for i in order:
                if missing == 0:
                    break
                if result[i] < hi[i]:
                    result[i] += 1
                    missing -= 1
    elif missing < 0:
        order = np.argsort(fraction, kind="stable")
        while missing < 0:
            for i in order:
                if missing == 0:
                    break
                if result[i] > lo[i]:
                    result[i] -= 1
                    missing += 1
    return result
