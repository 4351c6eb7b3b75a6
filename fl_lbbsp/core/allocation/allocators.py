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

from typing import Literal

import numpy as np

# The cost fits moved to :mod:`.costfit`; importable from here as before.
from ..silo.costfit import CostFit, fit_linear_cost, fit_robust_cost, robust_level
from .rounding import ArrayLike, IntArray, integer_bounds, round_to_total
from .waterfill import linear_minmax_continuous, positive_finite

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
    with :func:`~fl_lbbsp.core.allocation.rounding.round_to_total`, which gives each leftover
    unit to the silo it slows least; the result is the integer min-max, with the total and every
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
    lo, hi = integer_bounds(len(np.asarray(a)), lower=lower, upper=upper)
    x, _ = linear_minmax_continuous(a, b, float(total), lower=lo, upper=hi.astype(np.float64))
    if rounding not in ("time", "remainder"):
        raise ValueError(f"unknown rounding {rounding!r}; expected 'time' or 'remainder'")
    if rounding == "remainder":
        return round_to_total(x, total, lower=lo, upper=hi)
    offset = np.asarray(b, dtype=np.float64)
    return round_to_total(x, total, lower=lo, upper=hi, slope=a, intercept=offset)


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
    v = positive_finite("speeds", speeds)
    return linear_minmax(
        1.0 / v, np.zeros_like(v), total, lower=lower, upper=upper, rounding="remainder"
    )


def ideal_round_time(a: ArrayLike, b: ArrayLike, total: float) -> float:
    """The ideal round time ``T* = (X + sum_i b_i / a_i) / sum_i (1 / a_i)``.

    The best achievable round time for linear costs ``t_i = a_i * x_i + b_i`` with the
    total X fixed (shared/DESIGN.md); with ``b_i = 0`` it is ``X / sum_i v_i``.
    """
    slope = positive_finite("a", a)
    offset = np.asarray(b, dtype=np.float64)
    return float((total + np.sum(offset / slope)) / np.sum(1.0 / slope))


def idle_fraction(times: ArrayLike) -> float:
    """Barrier waste ``1 - mean_i(t_i) / max_i(t_i)``: 0 when all silos finish together."""
    t = positive_finite("times", times)
    return float(1.0 - t.mean() / t.max())
