"""Min-max batch sizes under a noise budget, for cost curves that bend.

LB-BSP keeps tau, eta and the aggregation weights w_i (dataset sizes) and gives silo i
the batch size B_i: the aggregated update keeps FedAvg's expectation, and its variance
from minibatch sampling is ``sum_i w_i^2 sigma_i^2 / B_i`` (sigma_i^2 the per-sample
gradient variance of silo i). Its ratio to the equal split's (``X / n`` each, FedAvg's),

    noise ratio = sum_i c_i / B_i  /  sum_i c_i / (X / n),   c_i = w_i^2 sigma_i^2,

is the factor by which the update is noisier than FedAvg's; by the gradient-noise-scale
model of McCandlish et al. (2018, "An Empirical Model of Large-Batch Training") it acts
as a smaller effective batch ``X / ratio``. :func:`budgeted_minmax` solves

    min_B  max_i t_i(B_i)   s.t.  sum_i B_i = X,  lo_i <= B_i <= hi_i,  ratio(B) <= rho

for hinge costs ``t_i(x) = a_i * max(x, k_i) + b_i`` (flat up to the knee k_i). The
problem is convex; for a round time T each silo can take at most
``U_i(T) = min(hi_i, (T - b_i) / a_i)``, and the least noisy split within those caps is
the water-filling ``B_i = clip(s * sqrt(c_i), lo_i, U_i(T))`` (the Lagrangian of
``sum c_i / B_i`` under ``sum B_i = X``), whose noise falls as T grows. The optimum is
the smallest T whose water-filling meets the budget, found by bisection: silos held at
``U_i(T)`` finish at T (``round-time``); the others stay below it with the budget's
share (``noise-budget``), so that the slow silos keep the batch sizes the budget asks.
No silo is moved below its knee for time it cannot gain: the knees are lower bounds
unless X is too small for them or the budget, met only with a silo below its knee,
makes the round shorter that way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from .rounding import ArrayLike, FloatArray, IntArray, integer_bounds, round_to_total
from .waterfill import TOLERANCE as _TOL
from .waterfill import caps_at, least_round_time, variance
from .waterfill import waterfill as _waterfill

__all__ = [
    "REASONS",
    "Allocation",
    "BudgetProblem",
    "Reason",
    "budgeted_ideal_time",
    "budgeted_minmax",
    "budgeted_minmax_continuous",
    "enforce_budget",
    "hinge_times",
    "noise_budget",
    "noise_costs",
    "noise_ratio",
]

Reason = Literal[
    "round-time", "noise-budget", "noise-share", "knee", "lower", "upper", "infeasible"
]
REASONS: tuple[str, ...] = get_args(Reason)
"""Why a silo got its batch size, from the continuous solution:

* ``round-time``: as large as the round time allows (it finishes last);
* ``noise-budget``: below what the round time allows, so that the slower silos' batches
  keep the update within the noise budget;
* ``noise-share``: below what the round time allows, at its least-noise share (the round
  time is set by a bound or a flat cost, not by this silo);
* ``knee``: held at its knee, below which a smaller batch buys no time;
* ``lower`` / ``upper``: at a lower or upper bound the caller set (memory floor, change
  limit, memory cap, max batch size);
* ``infeasible``: the budget cannot be met within the bounds; the least noisy split."""


@dataclass(frozen=True)
class Allocation:
    """An integer allocation and why each silo got its batch size.

    Parameters
    ----------
    sizes : numpy.ndarray of int64
        Batch sizes, summing to the total.
    reasons : tuple of str
        One of :data:`REASONS` per silo.
    round_time : float
        Predicted round time ``max_i t_i(B_i)`` of ``sizes``.
    noise_ratio : float
        Variance of the update at ``sizes`` over the equal split's (:func:`noise_ratio`).
    binds : bool
        Whether the budget made the round longer than it would be without it.
    feasible : bool
        Whether the budget is met.
    """

    sizes: IntArray
    reasons: tuple[str, ...]
    round_time: float
    noise_ratio: float
    binds: bool
    feasible: bool


def hinge_times(a: ArrayLike, b: ArrayLike, knee: ArrayLike | None, x: ArrayLike) -> FloatArray:
    """Predicted times ``a_i * max(x_i, k_i) + b_i`` (``knee`` None: lines)."""
    xs = np.asarray(x, dtype=np.float64)
    if knee is not None:
        xs = np.maximum(xs, np.asarray(knee, dtype=np.float64))
    return np.asarray(np.asarray(a) * xs + np.asarray(b), dtype=np.float64)


def noise_costs(n: int, weights: ArrayLike | None, noise: ArrayLike | None) -> FloatArray:
    """Each silo's share of the update's variance per unit of 1 / B:
    ``c_i = w_i^2 sigma_i^2`` with the weights normalised (equal when not given).

    Raises
    ------
    ValueError
        On a weight or noise that is not finite and positive, or of the wrong length.
    """
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    s2 = np.ones(n) if noise is None else np.asarray(noise, dtype=np.float64)
    if w.shape != (n,) or s2.shape != (n,):
        raise ValueError(f"weights and noise must have one entry per silo ({n})")
    if not (np.all(np.isfinite(w)) and np.all(w > 0)):
        raise ValueError(f"weights must be finite and positive, got {w.tolist()}")
    if not (np.all(np.isfinite(s2)) and np.all(s2 > 0)):
        raise ValueError(f"noise must be finite and positive, got {s2.tolist()}")
    w = w / w.sum()
    return np.asarray(w * w * s2, dtype=np.float64)


def noise_ratio(
    sizes: ArrayLike, *, weights: ArrayLike | None = None, noise: ArrayLike | None = None
) -> float:
    """Variance of the aggregated update at ``sizes`` over the equal split's of the same
    total: ``sum_i c_i / B_i / (sum_i c_i / (X / n))``, ``c_i = w_i^2 sigma_i^2``.

    Parameters
    ----------
    sizes : sequence of float
        Batch sizes (positive).
    weights : sequence of float | None (default: None)
        Aggregation weights (normalised here); ``None``: equal.
    noise : sequence of float | None (default: None)
        Per-silo gradient-noise variances sigma_i^2; ``None``: equal.
    """
    x = np.asarray(sizes, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(x > 0):
        raise ValueError(f"sizes must be a non-empty sequence of positive numbers, got {x}")
    return _ratio(noise_costs(x.size, weights, noise), x)


def _ratio(c: FloatArray, x: FloatArray) -> float:
    """The noise ratio of positive sizes ``x`` for the noise costs ``c``."""
    return float(np.sum(c / x) / (np.sum(c) * x.size / x.sum()))


@dataclass(frozen=True)
class _Solution:
    x: FloatArray
    round_time: float
    level: float
    cap: FloatArray
    lower: FloatArray
    binds: bool
    feasible: bool


def _solve(
    a: FloatArray,
    b: FloatArray,
    k: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    total: float,
    c: FloatArray,
    budget: float,
) -> _Solution:
    """The continuous optimum with lower bounds ``lo`` (the knees among them or not)."""
    q = np.sqrt(c)
    floor_time = float(np.max(a * np.maximum(lo, k) + b))
    _, t_star = _waterfill(1.0 / a, lo, hi, total, offset=b / a)  # the min-max of the lines
    t0 = max(t_star, floor_time)
    x, s = _waterfill(q, lo, caps_at(t0, a, b, lo, hi), total)
    if variance(c, x) <= budget * (1 + _TOL):
        return _Solution(x, t0, s, caps_at(t0, a, b, lo, hi), lo, False, True)
    least, s = _waterfill(q, lo, hi, total)
    t1 = float(np.max(hinge_times(a, b, k, least)))
    if variance(c, least) > budget * (1 + _TOL):
        return _Solution(least, t1, s, caps_at(t1, a, b, lo, hi), lo, True, False)
    high = least_round_time(
        (t0, max(t1, t0)), q=q, lo=lo, hi=hi, a=a, b=b, c=c, total=total, budget=budget
    )
    x, s = _waterfill(q, lo, caps_at(high, a, b, lo, hi), total)
    return _Solution(x, high, s, caps_at(high, a, b, lo, hi), lo, True, True)


@dataclass(frozen=True, kw_only=True)
class BudgetProblem:
    """One min-max problem under the noise budget (see the module).

    Parameters
    ----------
    a, b : sequence of float
        Per-sample cost (positive) and fixed cost of each silo.
    total : float
        The total X.
    knee : sequence of float | None (default: None)
        Batch size up to which each silo's time is flat (0 or ``None``: a line).
    lower, upper : sequence of float | None (default: None)
        Per-silo bounds (``None``: 0 and unbounded).
    weights : sequence of float | None (default: None)
        Aggregation weights; ``None``: equal.
    noise : sequence of float | None (default: None)
        Per-silo gradient-noise variances; ``None``: equal.
    rho : float | None (default: None)
        The budget: noise ratio at most rho; ``None``: no budget.
    """

    a: ArrayLike
    b: ArrayLike
    total: float
    knee: ArrayLike | None = None
    lower: ArrayLike | None = None
    upper: ArrayLike | None = None
    weights: ArrayLike | None = None
    noise: ArrayLike | None = None
    rho: float | None = None


def _inputs(
    problem: BudgetProblem,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """The problem's costs, knees and bounds as arrays, checked."""
    p, total = problem, problem.total
    slope = np.asarray(p.a, dtype=np.float64)
    n = slope.shape[0] if slope.ndim == 1 else 0
    if n == 0 or not (np.all(np.isfinite(slope)) and np.all(slope > 0)):
        raise ValueError(f"a must be a non-empty sequence of positive numbers, got {p.a!r}")
    offset = np.asarray(p.b, dtype=np.float64)
    k = np.zeros(n) if p.knee is None else np.asarray(p.knee, dtype=np.float64)
    lo = np.zeros(n) if p.lower is None else np.asarray(p.lower, dtype=np.float64)
    hi = np.full(n, np.inf) if p.upper is None else np.asarray(p.upper, dtype=np.float64)
    for name, arr in (("b", offset), ("knee", k), ("lower", lo)):
        if arr.shape != (n,) or not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be {n} finite numbers, got {arr.tolist()}")
    if np.any(k < 0) or np.any(lo < 0):
        raise ValueError("knee and lower must be >= 0")
    if hi.shape != (n,) or np.any(np.isnan(hi)) or np.any(lo > hi):
        raise ValueError("bounds must have one entry per silo with lower <= upper")
    if not lo.sum() <= total <= hi.sum():
        raise ValueError(f"total {total} is outside the feasible range [{lo.sum()}, {hi.sum()}]")
    return slope, offset, k, lo, hi


def noise_budget(
    n: int,
    total: float,
    *,
    weights: ArrayLike | None = None,
    noise: ArrayLike | None = None,
    rho: float | None = None,
) -> tuple[FloatArray, float]:
    """Each silo's noise cost c_i (:func:`noise_costs`) and the budget on
    ``sum_i c_i / B_i``: rho times the equal split's of ``total`` (infinite without rho).

    Raises
    ------
    ValueError
        On a rho that is not finite and positive, or bad weights or noise.
    """
    if rho is not None and not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be finite and positive or None, got {rho!r}")
    c = noise_costs(n, weights, noise)
    return c, math.inf if rho is None else rho * float(np.sum(c)) * n / total


def budgeted_minmax_continuous(
    problem: BudgetProblem,
) -> tuple[FloatArray, float, tuple[str, ...], bool, bool, tuple[FloatArray, float]]:
    """Real-valued min-max shares under the noise budget (see the module).

    Parameters
    ----------
    problem : BudgetProblem
        The costs, the total, the bounds and the budget.

    Returns
    -------
    tuple
        The shares, the round time, the reason of each silo (:data:`REASONS`), whether
        the budget binds, whether it is met, and the silos' noise costs c_i with the
        budget on ``sum_i c_i / B_i`` (:func:`noise_budget`).

    Raises
    ------
    ValueError
        On inputs of the wrong shape or sign, a total outside the bounds, or rho <= 0.
    """
    slope, offset, k, lo, hi = _inputs(problem)
    p, total = problem, problem.total
    c, budget = noise_budget(len(slope), total, weights=p.weights, noise=p.noise, rho=p.rho)
    floors = np.maximum(lo, np.minimum(k, hi))
    if np.any(floors > lo) and floors.sum() <= total:
        with_knees = _solve(slope, offset, k, floors, hi, total, c, budget)
        best = with_knees
        if with_knees.binds or not with_knees.feasible:
            free = _solve(slope, offset, k, lo, hi, total, c, budget)
            slower = with_knees.round_time > free.round_time * (1 + _TOL)
            if not with_knees.feasible or (free.feasible and slower):
                best = free
    else:
        best = _solve(slope, offset, k, lo, hi, total, c, budget)
    reasons = _reasons(best, k, lo, hi)
    return best.x, best.round_time, reasons, best.binds, best.feasible, (c, budget)


_BOUND_BY = np.array(["upper", "knee", "lower", "round-time", "noise-budget"], dtype=object)
_SHARE_BY = np.array(["upper", "knee", "lower", "round-time", "noise-share"], dtype=object)
"""The reasons by code, where the budget binds and where it does not."""


def _reasons(sol: _Solution, k: FloatArray, lo: FloatArray, hi: FloatArray) -> tuple[str, ...]:
    """Each silo's reason (:data:`REASONS`), all silos at once."""
    x = sol.x
    if not sol.feasible:
        return ("infeasible",) * len(x)
    near = _TOL * np.maximum(1.0, np.abs(x)) * 1e3
    at_lower = x <= sol.lower + near
    knee = at_lower & (sol.lower > lo) & (x <= k + near)
    # the first that holds (np.select's order): upper, knee, lower, round time, else
    codes = np.where(
        x >= hi - near,
        0,
        np.where(knee, 1, np.where(at_lower, 2, np.where(x >= sol.cap - near, 3, 4))),
    )
    names = _BOUND_BY if sol.binds else _SHARE_BY
    return tuple(names[codes].tolist())


def budgeted_minmax(
    a: ArrayLike,
    b: ArrayLike,
    total: int,
    *,
    knee: ArrayLike | None = None,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    noise: ArrayLike | None = None,
    rho: float | None = None,
    rounding: Literal["time", "remainder"] = "time",
) -> Allocation:
    """Integer batch sizes minimising the round time under the noise budget.

    The real-valued optimum (:func:`budgeted_minmax_continuous`) is rounded by time
    (:func:`~fl_lbbsp.core.allocation.rounding.round_to_total`, each leftover unit to the silo it
    slows least); where rounding left the noise above the budget, units move one at a time
    from the silo whose loss adds least noise to the one whose gain removes most, until
    the budget holds (or no move reduces the noise). The total and every bound are kept.

    Parameters are the fields of :class:`BudgetProblem` (``total`` an integer), and
    ``rounding``: ``"remainder"`` rounds by largest remainder instead of by time
    (proportional allocation, Alg. 1 line 6).

    Returns
    -------
    Allocation
        The sizes, a reason per silo, the predicted round time and noise ratio.

    Raises
    ------
    ValueError
        As :func:`budgeted_minmax_continuous`, or when no integers within the bounds sum
        to ``total``.
    """
    if rounding not in ("time", "remainder"):
        raise ValueError(f"unknown rounding {rounding!r}; expected 'time' or 'remainder'")
    problem = BudgetProblem(
        a=a, b=b, total=float(total), knee=knee, lower=lower, upper=upper,
        weights=weights, noise=noise, rho=rho,
    )  # fmt: skip
    x, _, reasons, binds, _, (c, budget) = budgeted_minmax_continuous(problem)
    n = len(x)
    floors = np.asarray(lower if lower is not None else np.zeros(n), dtype=np.float64)
    if knee is not None:
        # Silos the solution kept at their knee keep it through the rounding.
        held = np.fromiter(map("knee".__eq__, reasons), bool, count=n)
        floors = np.where(held, np.maximum(floors, np.asarray(knee, dtype=np.float64)), floors)
    lo, hi = integer_bounds(n, lower=np.minimum(floors, x), upper=upper)
    by_time = a if rounding == "time" else None
    sizes = round_to_total(x, total, lower=lo, upper=hi, slope=by_time, intercept=b)
    feasible = True
    if rho is not None:
        lo_hard, _ = integer_bounds(n, lower=lower, upper=upper)
        feasible = enforce_budget(sizes, c, budget, lower=np.maximum(lo_hard, 1), upper=hi)
    times = hinge_times(a, b, knee, sizes)
    ratio = math.inf if np.any(sizes <= 0) else _ratio(c, np.asarray(sizes, dtype=np.float64))
    return Allocation(
        sizes=sizes,
        reasons=reasons,
        round_time=float(np.max(times)),
        noise_ratio=ratio,
        binds=binds,
        feasible=feasible,
    )


def enforce_budget(
    sizes: IntArray, c: FloatArray, budget: float, *, lower: IntArray, upper: IntArray
) -> bool:
    """Move units (in place) until ``sum c_i / sizes_i <= budget``: each from the silo
    whose loss adds least variance to the one whose gain removes most, within the
    bounds, while a move reduces the variance. Returns whether the budget holds."""
    x = sizes.astype(np.float64)
    if np.any(x < 1):
        return False
    while float((c / x).sum()) > budget * (1 + _TOL):
        take = np.full(len(x), np.inf)
        can = x > np.maximum(lower, 1)
        take[can] = c[can] / (x[can] - 1.0) - c[can] / x[can]
        give = np.where(x < upper, c / x - c / (x + 1.0), -np.inf)
        donor, taker = int(np.argmin(take)), int(np.argmax(give))
        if donor == taker or not give[taker] > take[donor]:
            return False
        x[donor] -= 1.0
        x[taker] += 1.0
        sizes[donor] -= 1
        sizes[taker] += 1
    return True


def budgeted_ideal_time(
    a: ArrayLike,
    b: ArrayLike,
    total: float,
    *,
    knee: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    noise: ArrayLike | None = None,
    rho: float | None = None,
) -> float:
    """The ideal round time T* under the noise budget: the real-valued min-max of the
    hinge costs with the total X fixed and no other bound (shared/DESIGN.md, "The ideal
    to measure against"); for lines without a budget it is
    ``(X + sum_i b_i / a_i) / sum_i (1 / a_i)``."""
    problem = BudgetProblem(a=a, b=b, total=total, knee=knee, weights=weights, noise=noise, rho=rho)
    return budgeted_minmax_continuous(problem)[1]
