"""What batch size does silo i get, and why: the allocation as one explicit pipeline.

:func:`allocate` runs these steps, each a named function of this module, and returns a
:class:`Decision` holding every silo's batch size and the reason it got it
(:data:`ALLOCATION_REASONS`):

1. :func:`hold` (an option): a gate held the sizes in force (the DDP coordinator's
   :class:`~fl_lbbsp.distributed.gate.HoldGate`): they are kept, reason ``held``;
2. :func:`hard_bounds`: the floor (``min_batch_size``, ``min_batch_fraction`` of B_init),
   the memory caps and ``max_batch_size``; the total X is clipped into their sums;
3. :func:`change_limits`: a silo moves at most ``max_change_ratio`` from the batch size it
   last reported (wider after a confirmed change);
4. :func:`cost_curves`: each silo's predicted curve ``t = a * max(x, k) + b`` from its
   model (:mod:`..silo.model`), or ``a = steps / v`` from its predicted speed;
5. the allocator (:class:`~.allocators.Allocator`, from one registry), which takes the
   bounds: :class:`Linear` and :class:`Proportional`, the shortest round within them and
   the noise budget (:func:`~fl_lbbsp.core.allocation.budget.budgeted_minmax`, LB-BSP's
   min-max: Alg. 1 for proportional costs), then steps 6-9; or Alg. 2's
   leader/straggler step (:class:`~.iterative.Iterative`);
6. :func:`name_bounds`: the solver's ``lower``/``upper`` named (floor, memory cap, ...);
7. :func:`order_guard`: a silo predicted faster gets no smaller batch (beyond a
   tolerance), reason ``order``;
8. :func:`equal_split_guard`: an allocation predicted no faster than FedAvg's equal split
   by a margin (the fits' noise), its prediction carrying the same expected maximum of
   the silos' errors as the equal split's, is not shipped, reason ``equal-split``;
9. :func:`restore_budget`: samples the order guard moved keep the noise budget.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Alg. 1 (batch size proportional to predicted speed), Alg. 2
(iterative), Sec. 3.3 (bounds, memory cap x_o) and Sec. 4 (the BatchSizeManager); the
linear cost model is Chen et al., SoCC 2020, Sec. 3.3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

import numpy as np

from ..silo.reports import check_positive_int
from .allocators import (
    ALLOCATORS,
    Allocator,
    Bounds,
    Decision,
    GuardTuning,
    Problem,
    register,
    split_equally,
)
from .budget import REASONS, Allocation, budgeted_minmax, enforce_budget, hinge_times, noise_budget
from .iterative import Iterative
from .rounding import round_to_total

if TYPE_CHECKING:
    from ..silo.model import SiloTable

__all__ = [
    "ALLOCATION_REASONS",
    "ALLOCATORS",
    "Allocator",
    "Bounds",
    "Decision",
    "Iterative",
    "Linear",
    "Problem",
    "Proportional",
    "allocate",
    "change_limits",
    "cost_curves",
    "equal_split_guard",
    "expected_max",
    "expected_max_bound",
    "guard_margin",
    "hard_bounds",
    "hold",
    "name_bounds",
    "order_guard",
    "per_silo",
    "restore_budget",
]

ALLOCATION_REASONS: tuple[str, ...] = (
    *(r for r in REASONS if r not in ("lower", "upper")),
    "floor",
    "memory-cap",
    "max-batch-size",
    "change-limit",
    "order",
    "equal-split",
    "no-report",
    "iterative",
    "held",
)
"""Why a silo got its batch size: the solver's reasons
(:data:`~fl_lbbsp.core.allocation.budget.REASONS`: ``round-time``, ``noise-budget``,
``noise-share``, ``knee``, ``infeasible``) with its bounds named (``floor``: ``min_batch_size`` /
``min_batch_fraction``; ``memory-cap``: the silo's reported cap; ``max-batch-size``;
``change-limit``: ``max_change_ratio``), ``order`` (moved by the order guard),
``equal-split`` (the equal-split guard shipped FedAvg's split), ``no-report`` (no silo has
reported yet), ``iterative`` (Alg. 2) and ``held`` (a gate kept the sizes in force)."""


class Knobs(Protocol):
    """The user's bounds and the guards' settings the allocation reads
    (:class:`~fl_lbbsp.core.settings.BalancingKnobs` has them; declared here so that the
    allocation does not depend on the settings)."""

    @property
    def min_batch_size(self) -> int: ...
    @property
    def max_batch_size(self) -> int | None: ...
    @property
    def tuning(self) -> GuardTuning: ...
    def floor(self, initial_batch_size: int) -> int:
        """The hard floor of every batch size."""
        ...


def allocate(
    ids: list[str],
    table: SiloTable,
    knobs: Knobs,
    allocator: Allocator,
    *,
    initial_batch_size: int,
    state: object = None,
    total: int | None = None,
    weights: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    rho: float | None = None,
    held: Mapping[str, int] | None = None,
    caps: Sequence[float] | None = None,
) -> Decision:
    """The pipeline: every silo of ``ids`` (sorted: the result does not depend on their
    order) gets its batch size and reason, from the silos' models (``table``), the
    bounds and guards (``knobs``) and the allocator with its ``state``
    (:meth:`Allocator.start`). The other keywords are
    :meth:`~fl_lbbsp.core.balancer.BatchSizeBalancer.allocate`'s, ``weights`` and ``noise``
    one per silo (:func:`per_silo`), ``rho`` the noise budget (``None``: none), ``caps``
    one per silo (``inf``: none).

    Raises
    ------
    ValueError
        If ``total`` is not a positive integer.
    """
    if not ids:
        return Decision({}, {})
    if held is not None:
        return hold(ids, held)
    table.pool()
    rows = table.gather(ids)  # a copy: the caps learned by the server join the reported
    if caps is not None:
        rows["cap"] = np.minimum(rows["cap"], np.asarray(caps, dtype=np.float64))
    tuning, b_init = knobs.tuning, initial_batch_size
    bounds = hard_bounds(rows, len(ids), total, knobs, initial_batch_size=b_init)
    bounds = change_limits(rows, bounds, tuning.max_change_ratio, initial_batch_size=b_init)
    return allocator.allocate(Problem(ids, table, rows, bounds, tuning, weights, noise, rho, state))


@register
class Linear(Allocator):
    """LB-BSP's min-max: the shortest predicted round within the bounds and the noise
    budget (:func:`~fl_lbbsp.core.allocation.budget.budgeted_minmax`) over each silo's
    fitted cost curve ``t = a * max(x, k) + b`` (:func:`cost_curves`), rounded by time;
    then the order guard, the equal-split guard and the budget restored.

    Reference: Chen et al., SoCC 2020, Sec. 3.3 (linear costs); Chen et al., IEEE TCC
    2021, Eq. 3 (the min-max).
    """

    name = "linear"
    fits_lines = True
    rounding: ClassVar[Literal["time", "remainder"]] = "time"

    def allocate(self, problem: Problem) -> Decision:
        """Steps 4-9 of the pipeline (see the module)."""
        ids, rows, bounds, tuning = problem.ids, problem.rows, problem.bounds, problem.tuning
        weights, noise, rho = problem.weights, problem.noise, problem.rho
        curves = cost_curves(ids, rows, problem.table, linear=self.fits_lines)
        if curves is None:
            return Decision.of(ids, split_equally(bounds), "no-report")
        a, b, knee = curves
        result = budgeted_minmax(
            a, b, bounds.total, knee=knee, lower=bounds.lower, upper=bounds.upper,
            weights=weights, noise=noise, rho=rho, rounding=self.rounding,
        )  # fmt: skip
        reasons = name_bounds(result, bounds, rows["cap"])
        # Under a binding budget, unequal weights order the batch sizes by weight too: the
        # order of speeds is then not the order to keep.
        weighted = result.binds and weights is not None and bool(np.ptp(weights) > 0)
        sizes = result.sizes.astype(np.int64)
        if not weighted and tuning.order_tolerance is not None and len(sizes) > 1:
            sizes = order_guard(
                sizes, a, b, tuning.order_tolerance, lower=bounds.lower, upper=bounds.upper,
                round_time=result.round_time,
            )  # fmt: skip
        if tuning.equal_split_guard:
            margin = guard_margin(rows["error"], tuning.equal_split_margin)
            sizes = equal_split_guard(sizes, a, b, knee, bounds, margin, errors=rows["error"])
            equal = split_equally(bounds)
            if np.array_equal(sizes, equal) and not np.array_equal(sizes, result.sizes):
                return Decision.of(ids, sizes, "equal-split")
        moved = sizes != result.sizes
        if moved.any():
            reasons = ["order" if m else r for m, r in zip(moved.tolist(), reasons, strict=True)]
        if rho is not None and not np.array_equal(sizes, result.sizes):
            restore_budget(sizes, bounds, weights, noise, rho)
        return Decision.of(ids, sizes, reasons)


@register
class Proportional(Linear):
    """Alg. 1: batch sizes proportional to the predicted speeds (costs ``x / v``, no
    fixed cost), rounded by largest remainder, with the same budget and guards as
    :class:`Linear`.

    Reference: Chen et al., IEEE TCC 2021, Alg. 1.
    """

    name = "proportional"
    fits_lines = False
    rounding = "remainder"


def hold(ids: Sequence[str], held: Mapping[str, int]) -> Decision:
    """The sizes in force, kept because a gate held them (reason ``held``).

    Raises
    ------
    ValueError
        If a silo of ``ids`` has no size in ``held``.
    """
    missing = [i for i in ids if i not in held]
    if missing:
        raise ValueError(f"no size held for {missing}")
    return Decision({i: int(held[i]) for i in ids}, dict.fromkeys(ids, "held"))


def hard_bounds(
    rows: np.ndarray, n: int, total: int | None, knobs: Knobs, *, initial_batch_size: int
) -> Bounds:
    """Each silo's hard bounds: the floor (yielding to its memory cap) and the smaller of
    ``max_batch_size`` and its memory cap (a cap below ``min_batch_size`` cannot be
    honoured); the total, ``n * B_init`` unless given, clipped into their sums.

    Raises
    ------
    ValueError
        If ``total`` is not a positive integer.
    """
    caps = rows["cap"]
    if knobs.max_batch_size is not None:
        caps = np.minimum(caps, knobs.max_batch_size)
    upper = np.where(np.isinf(caps), caps, np.maximum(caps, knobs.min_batch_size))
    lower = np.minimum(float(knobs.floor(initial_batch_size)), upper)
    if total is not None:
        check_positive_int("total", total)
    wanted = n * initial_batch_size if total is None else total
    clipped = int(np.clip(wanted, lower.sum(), upper.sum()))
    return Bounds(lower, upper, lower, upper, clipped)


def change_limits(
    rows: np.ndarray, bounds: Bounds, ratio: float | None, *, initial_batch_size: int
) -> Bounds:
    """Narrow the bounds to ``ratio`` (``max_change_ratio``, times ``boost``, the level ratio of a
    change confirmed by the last report) around each silo's last reported batch size
    (B_init for a silo that never reported); dropped for a round whose total they make
    unreachable.

    The first report is bounded too, around B_init: the equal split every silo ran round
    1 with is LB-BSP's prior before any speed is known (Chen et al., IEEE TCC 2021, Sec.
    3.3), so one report, true or not, moves a silo at most ``max_change_ratio`` from it (a
    silo reporting a thousandth of its time gets ``2 * B_init`` in round 2, not most of
    X). What a silo claims is bounded by the round engine's claim checks
    (:mod:`fl_lbbsp.security.claims`)."""
    if ratio is None:
        return bounds
    last = np.where(np.isnan(rows["last"]), float(initial_batch_size), rows["last"])
    ratios = ratio * rows["boost"]
    # A memory cap still wins over the change limit.
    lo = np.minimum(np.maximum(bounds.hard_lower, np.ceil(last / ratios)), bounds.hard_upper)
    hi = np.maximum(np.minimum(bounds.hard_upper, np.floor(last * ratios)), lo)
    if lo.sum() > bounds.total or hi.sum() < bounds.total:
        return bounds
    return Bounds(lo, hi, bounds.hard_lower, bounds.hard_upper, bounds.total)


def cost_curves(
    ids: Sequence[str], rows: np.ndarray, table: SiloTable, *, linear: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each silo's predicted curve ``(a, b, knee)``: with ``linear`` its fitted line (its
    smoothed ``fixed_time`` added to b), else and for a silo without one ``a = steps / v``
    from its predicted speed v (b and knee 0); ``None`` where a speed is needed and no
    silo has one (no silo reported yet)."""
    if not linear:
        speeds = table.speeds(ids)
        return None if speeds is None else (1.0 / speeds, np.zeros(len(ids)), np.zeros(len(ids)))
    a = rows["slope"].copy()
    b = rows["intercept"] + rows["fixed"]
    knee = rows["knee"].copy()
    unfitted = np.flatnonzero(np.isnan(a))
    if unfitted.size:
        steps = rows["steps"][unfitted]
        unknown = np.isnan(steps)  # silos that never reported: the mean over all
        if unknown.any():
            steps[unknown] = table.mean_steps()
        speeds = table.speeds(ids, only=unfitted.tolist())
        if speeds is None:
            return None
        a[unfitted] = steps / speeds
        knee[unfitted] = 0.0
    return a, b, knee


def name_bounds(result: Allocation, bounds: Bounds, caps: np.ndarray) -> list[str]:
    """The solver's reasons with its bounds named: ``floor`` (the hard floor),
    ``memory-cap`` (the silo's reported cap), ``max-batch-size`` or ``change-limit``."""
    named = list(result.reasons)
    if "lower" not in named and "upper" not in named:
        return named
    low = np.where(bounds.lower > bounds.hard_lower, "change-limit", "floor").tolist()
    high = np.where(
        bounds.upper < bounds.hard_upper,
        "change-limit",
        np.where(caps <= bounds.hard_upper, "memory-cap", "max-batch-size"),
    ).tolist()
    for k, why in enumerate(named):
        if why == "lower":
            named[k] = low[k]
        elif why == "upper":
            named[k] = high[k]
    return named


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


def per_silo(
    ids: Sequence[str], values: Mapping[str, float] | None, name: str
) -> np.ndarray | None:
    """One value per silo of ``ids`` from ``values`` (a silo missing: the median of the
    others'); ``None`` when ``values`` is None or holds none of them.

    Raises
    ------
    ValueError
        If a given value is not finite and positive.
    """
    if values is None:
        return None
    given = {i: float(values[i]) for i in ids if values.get(i) is not None}
    if not given:
        return None
    if not all(math.isfinite(v) and v > 0 for v in given.values()):
        raise ValueError(f"{name} must be finite and positive, got {given}")
    fill = float(np.median(list(given.values())))
    return np.array([given.get(i, fill) for i in ids], dtype=np.float64)


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
