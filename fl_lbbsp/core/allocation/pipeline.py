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
7. :func:`~.guards.order_guard`: a silo predicted faster gets no smaller batch (beyond a
   tolerance), reason ``order``;
8. :func:`~.guards.equal_split_guard`: an allocation predicted no faster than FedAvg's equal split
   by a margin (the fits' noise), its prediction carrying the same expected maximum of
   the silos' errors as the equal split's, is not shipped, reason ``equal-split``;
9. :func:`~.guards.restore_budget`: samples the order guard moved keep the noise budget.

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
from .budget import REASONS, Allocation, budgeted_minmax
from .guards import equal_split_guard, guard_margin, order_guard, restore_budget
from .iterative import Iterative

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
    "hard_bounds",
    "hold",
    "name_bounds",
    "per_silo",
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
