"""The balancer: LB-BSP's BatchSizeManager, keyed by a stable silo id.

Each round the strategy passes every silo's report (batch size used, compute time,
samples processed, CPU and memory, memory cap) to :meth:`BatchSizeBalancer.report` and
asks :meth:`BatchSizeBalancer.allocate` for the next batch sizes. The total
``X = n * B_init`` is kept every round, so the global batch (and with it convergence)
matches plain BSP / FedAvg.

The defaults (:data:`BALANCER_DEFAULTS`, also the strategies') are built for timings of
a non-dedicated machine: a robust cost fit per silo that does not chase per-round jitter,
change detection that follows a real change of speed within 2 rounds and ignores a
one-round spike, a change limit that bounds what one report can do (the first one
included), a batch size floor tied to B_init, and two guards on every allocation: the
order of the silos' predicted speeds is kept, and an allocation predicted no faster than
the equal split is not shipped.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 4 (BatchSizeManager, Alg. 3), Alg. 1, Sec. 3.5.
"""

from __future__ import annotations

import inspect
import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import repeat
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from .allocators import proportional
from .budget import REASONS, Allocation, budgeted_minmax, enforce_budget, hinge_times, noise_costs
from .costfit import CostFit, find_knee, fit_linear_cost, fit_robust_cost, robust_level
from .estimators import SpeedEstimator, estimator_from_state, make_estimator
from .iterative import IterativeAllocator
from .rounding import round_to_total

__all__ = [
    "BALANCER_DEFAULTS",
    "ALLOCATION_REASONS",
    "NOISE_BUDGET",
    "Allocation",
    "BatchSizeBalancer",
    "InvalidReportError",
    "SiloReport",
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
)
"""Why a silo got its batch size (:attr:`BatchSizeBalancer.last_allocation`): the
solver's reasons (:data:`~fl_lbbsp.core.budget.REASONS`: ``round-time``,
``noise-budget``, ``noise-share``, ``knee``, ``infeasible``) with its bounds named
(``floor``: ``min_batch_size`` / ``min_batch_fraction``; ``memory-cap``: the silo's
reported cap; ``max-batch-size``; ``change-limit``: ``max_change_ratio``), ``order``
(moved by the order guard), ``equal-split`` (the equal-split guard shipped FedAvg's
split), ``no-report`` (no silo has reported yet) and ``iterative`` (Alg. 2)."""

MAX_NOISE_BUDGET = 1e6
"""Largest noise budget accepted (a finite stand-in for no budget: ``None``)."""
NOISE_BUDGET = math.sqrt(2.0)
"""The default noise budget rho (docs/balancing.md, "The noise budget"): the update may be
at most sqrt(2) times as noisy as FedAvg's. SGD's noise temperature is eta * sigma^2 / B
(Mandt et al., JMLR 2017; Smith and Le, ICLR 2018; Jastrzebski et al., 2017): a budget
rho acts on it as a learning rate rho times larger at FedAvg's batch. A learning rate tuned
for FedAvg on the customary powers-of-two grid is known only within a factor sqrt(2) of its
best; rho = sqrt(2) keeps the update's temperature within that resolution of the tuning,
so it changes nothing the user's own tuning could have told apart."""

Allocator = Literal["proportional", "linear", "iterative"]
_Decision = tuple[dict[str, int], dict[str, str]]
"""Each silo's batch size and the reason it got it."""
ALLOCATORS: tuple[str, ...] = ("proportional", "linear", "iterative")
Fit = Literal["robust", "wls"]
FITS: tuple[str, ...] = ("robust", "wls")


class InvalidReportError(ValueError):
    """A silo report that cannot be used (non-finite time, zero batch size, ...)."""


@dataclass(frozen=True)
class SiloReport:
    """What a silo tells the server after a round.

    Parameters
    ----------
    batch_size : int
        Batch size the silo actually used.
    train_time : float
        Seconds of compute for the round's local steps (no waiting, no transfer).
    samples : int | None (default: None)
        Samples processed in the round (``batch_size * local_steps``); ``None`` means
        ``batch_size``.
    cpu_percent : float | None (default: None)
        CPU utilisation of the silo's machine during the round.
    memory_percent : float | None (default: None)
        Memory utilisation of the silo's machine.
    max_batch_size : int | None (default: None)
        Largest batch size the silo can hold in memory (x_o).
    fixed_time : float | None (default: None)
        Seconds of per-round work that does not depend on the batch size and is not in
        ``train_time``, e.g. encrypting and decrypting the model (``he-time``). The linear
        allocator adds it to the silo's fixed cost b_i.
    """

    batch_size: int
    train_time: float
    samples: int | None = None
    cpu_percent: float | None = None
    memory_percent: float | None = None
    max_batch_size: int | None = None
    fixed_time: float | None = None

    def validate(self) -> None:
        """Raise :class:`InvalidReportError` if the report cannot feed the estimators."""
        _check_count("batch size", self.batch_size)
        if not _finite(self.train_time) or self.train_time <= 0:
            raise InvalidReportError(
                f"train time must be finite and positive, got {self.train_time!r}"
            )
        if self.samples is not None:
            _check_count("samples processed", self.samples)
        if self.max_batch_size is not None:
            _check_count("max batch size", self.max_batch_size)
        if self.fixed_time is not None and (not _finite(self.fixed_time) or self.fixed_time < 0):
            raise InvalidReportError(
                f"fixed time must be finite and non-negative, got {self.fixed_time!r}"
            )
        if not math.isfinite(self.speed):
            raise InvalidReportError(
                f"speed {self.batch_size!r} samples in {self.train_time!r} s is not finite"
            )

    @property
    def speed(self) -> float:
        """Samples processed per second of compute."""
        samples = self.batch_size if self.samples is None else self.samples
        return float(samples) / float(self.train_time)

    @property
    def steps(self) -> float:
        """Local steps implied by the report (samples / batch size)."""
        return 1.0 if self.samples is None else float(self.samples) / float(self.batch_size)


@dataclass
class _SiloState:
    estimator: SpeedEstimator
    history: deque[tuple[int, float]]
    max_batch_size: int | None = None
    steps: float = 1.0
    fixed_time: float | None = None
    last: dict[str, Any] = field(default_factory=dict)
    reports: int = 0
    # Fixed cost in samples (b / a) of the last robust fit: the prior shape of the next
    # fit, kept across a change reset (a change of capacity scales a and b alike); None
    # until the silo's own batch sizes identified it (then the federation's median is used).
    shape: float | None = None
    # Robust relative residual scale of the last fit with enough observations (None: none).
    noise: float | None = None
    # The run of reports deviating to the same side from the cost line: (batch size,
    # time, speed, log deviation, held back).
    pending: list[tuple[int, float, float, float, bool]] = field(default_factory=list)
    # Level ratio of a change confirmed by the last report (widens its change limit).
    boost: float = 1.0
    fit: CostFit | None = None
    # Batch size up to which the silo's time is flat (find_knee; 0: none), kept across a
    # change reset like the shape (a co-tenant scales the time, not where it bends).
    knee: float = 0.0
    # Its row in the balancer's table of what allocate() needs (BatchSizeBalancer._row).
    index: int = 0


class BatchSizeBalancer:
    """Per-silo speed prediction and batch-size allocation (the BatchSizeManager).

    Parameters
    ----------
    initial_batch_size : int
        B_init: every silo's batch size before any report; the total per round is
        ``X = n * B_init`` for the n silos of the round.
    estimator : str (default: "ema")
        Speed predictor, ``"ema"``, ``"last"``, ``"narx"`` (Sec. 3.2.2; torch is
        needed to train it) or ``"change-ema"`` (EMA restarting at a confirmed change of
        level, :class:`~fl_lbbsp.core.estimators.ChangeAwareEMAEstimator`).
    alpha : float (default: 0.2)
        EMA weight of the latest observation, in (0, 1].
    allocator : {"proportional", "linear", "iterative"} (default: "linear")
        ``"proportional"``: Alg. 1, batch size proportional to predicted speed.
        ``"linear"``: fit ``t_i = a_i * B + b_i`` per silo from its recent
        (batch size, time) pairs, weighted ``(1 - alpha)^age`` like the EMA, and solve the
        min-max exactly; a silo with fewer than two distinct batch sizes in its history
        uses ``a_i = steps / v_i, b_i = 0`` from its predicted speed. A silo's reported
        ``fixed_time`` (encryption, decryption), smoothed like the speed, is added to b_i.
        Use it when a fixed per-round cost (per-step overhead, encryption) is large
        against the per-sample cost, where proportional allocation settles only slowly.
        ``"iterative"``: Alg. 2, moving a few samples per round from the slowest silo
        to the fastest (:class:`~fl_lbbsp.core.iterative.IterativeAllocator`), for
        costs of any monotone shape (GPU saturation, launch overhead).
    min_batch_size : int (default: 1)
        Smallest batch size handed to any silo (see also ``min_batch_fraction``).
    min_batch_fraction : float (default: 0.0)
        A hard floor of every batch size as a fraction of B_init, in [0, 1]: the smallest
        batch size handed out is ``max(min_batch_size, ceil(min_batch_fraction *
        B_init))`` (a silo's memory cap still wins). Earlier versions used a blanket 1/3
        here to protect accuracy; the noise budget (``noise_budget``) does that job now,
        weighted by the silos' data, and costs far less time where capacities differ
        widely. Keep it for a floor of your own (e.g. batch normalisation's smallest
        useful batch).
    noise_budget : float | None (default: sqrt(2), :data:`NOISE_BUDGET`)
        rho: the aggregated update's variance ``sum_i w_i^2 sigma_i^2 / B_i`` (w_i the
        aggregation weights passed to :meth:`allocate`, sigma_i^2 the silos' gradient
        noise, 1 where unknown) stays at most rho times the equal split's, and the
        allocation is the shortest round within that budget
        (:func:`~fl_lbbsp.core.budget.budgeted_minmax`). 1: FedAvg's noise (with equal
        weights, the equal split); larger trades noise for time; ``None``: no budget (the
        paper's Alg. 1). At least 1. Applies to the ``"linear"`` and ``"proportional"``
        allocators; ``"iterative"`` (Alg. 2) keeps its own steps. Where weights are the
        batch sizes (gradient aggregation in cluster mode) the noise does not depend on
        the split: pass ``budget=False`` to :meth:`allocate`.
    max_batch_size : int | None (default: None)
        Largest batch size handed to any silo; a silo's reported memory cap lowers it.
    history : int (default: 20)
        Number of recent (batch size, time) pairs kept per silo for the linear fit.
    min_fit_spread : float (default: 0.1)
        Batch sizes closer than this fraction count as the same for the fits: the robust
        fit takes a slope only from pairs further apart (closer ones measure the noise),
        and the ``"wls"`` fit needs its recent batch sizes to spread by this fraction of
        their mean (otherwise the silo's predicted speed is used).
    max_change_ratio : float | None (default: 2.0)
        If set (> 1), a silo's next batch size stays within ``[B / r, B * r]`` of the batch
        size B it last reported (B_init before its first report), so one noisy or false
        report, the first one included, cannot swing it. After a change of level confirmed
        by ``change_confirm`` reports the silo's limit widens by the confirmed ratio of its
        speed (at most ``r^2`` more, so ``r^3`` in all) for one allocation, so that a real
        change is followed at once (with a fixed cost a speed change of 3x can call for a
        batch size change of 6x). The limit is dropped
        for a round in which it would make the total unreachable. ``None``: no limit.
    fit : {"robust", "wls"} (default: "robust")
        Cost fit of the ``"linear"`` allocator. ``"robust"``:
        :func:`~fl_lbbsp.core.allocators.fit_robust_cost` over the ``history`` window
        (Theil-Sen slope over batch sizes that really differ, median level, shrunk toward
        the silo's last known shape, proportional at first), which does not chase
        per-round jitter. ``"wls"``: the weighted least-squares fit of earlier versions
        (:func:`~fl_lbbsp.core.allocators.fit_linear_cost`, weights ``(1 - alpha)^age``),
        a silo without two distinct batch sizes using its predicted speed.
    change_sigmas : float | None (default: 2.5)
        Change detection: a report whose time deviates from the silo's prediction
        by more than ``max(log(1 + change_threshold), change_sigmas * noise)`` in log
        (``noise`` the fit's robust relative residual scale) is held back; once
        ``change_confirm`` reports in a row deviate to the same side, the silo's speed
        estimate and cost-fit history restart from them (a co-tenant came or went). A
        deviation that is not confirmed (a one-round spike) is dropped and changes
        nothing. A report is compared with the silo's earlier reports at nearly the same
        batch size (within ``min_fit_spread``, at least 2), moved along the fitted slope,
        so that a line whose shape is not known yet is not taken for a change; others are
        not tested. ``None``: no detection.
    change_threshold : float (default: 0.2)
        Smallest relative deviation that counts as a possible change, > 0.
    change_confirm : int (default: 2)
        Reports in a row, deviating to the same side, that confirm a change, >= 1.
    common_noise : bool (default: True)
        Take out of a round's reports the slowdown that all its silos share
        (:meth:`report_round`): the round's common factor is the median, over the silos
        whose report lies near their own earlier reports (the same test as the change
        detection's, at least 3 such silos), of the report's deviation from them, and
        every report of the round is divided by it before it reaches the estimators, the
        cost fits and the change detection (median polish, Tukey, "Exploratory Data
        Analysis", 1977, Ch. 11). A factor shared by every silo leaves the min-max split
        unchanged, so it is noise to the balancer: without this, a busy machine or a
        shared cluster slowing every silo for a round or two is confirmed as a change of
        every silo and restarts all their histories. Deviations where a silo has not been
        observed (a batch size moved away from its history) do not count: there a shared
        error of the fitted lines would pass for a shared slowdown. In a round where
        fewer than 3 silos are near their history (the batch sizes just moved), the
        others' fitted lines stand in, and the factor is taken out only beyond
        ``change_threshold``: a shift that large is no error of a line's shape, and the
        silos' reports at their new batch sizes, which no change detection judges yet,
        would otherwise carry it into every history.
    order_tolerance : float | None (default: 0.1)
        Order guard: if silo i's predicted speed (samples it can process in the
        allocation's predicted round time) exceeds silo j's by more than this fraction, i
        gets at least j's batch size; inversions left by the bounds are repaired by moving
        samples from j to i within the bounds. ``None``: no order guard.
    equal_split_guard : bool (default: True)
        An allocation whose predicted round time is not below that of the equal split
        (FedAvg, B_init each) by more than ``equal_split_margin`` is not shipped: the equal
        split is.
    equal_split_margin : float (default: 0.05)
        The largest predicted gain, as a fraction of the equal split's predicted round
        time, that an unequal allocation must show to be shipped: twice the largest
        standard error of a silo's fitted time, at most this (all of it while a silo has
        no noise estimate). Among silos of equal capacity the fits differ by noise alone,
        and an allocation that only chases it would be slower than the equal split; with
        noise-free reports the margin is 0. In [0, 1).
    estimator_options : dict | None (default: None)
        Extra arguments of each silo's estimator (for ``"narx"``: ``warmup``, ...).
    allocator_options : dict | None (default: None)
        Extra arguments of the ``"iterative"`` allocator (``step``, ``window``, ...).
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        estimator: str = "ema",
        alpha: float = 0.2,
        allocator: Allocator = "linear",
        min_batch_size: int = 1,
        min_batch_fraction: float = 0.0,
        noise_budget: float | None = NOISE_BUDGET,
        max_batch_size: int | None = None,
        history: int = 20,
        min_fit_spread: float = 0.1,
        max_change_ratio: float | None = 2.0,
        fit: Fit = "robust",
        change_sigmas: float | None = 2.5,
        change_threshold: float = 0.2,
        change_confirm: int = 2,
        common_noise: bool = True,
        order_tolerance: float | None = 0.1,
        equal_split_guard: bool = True,
        equal_split_margin: float = 0.05,
        estimator_options: dict[str, Any] | None = None,
        allocator_options: dict[str, Any] | None = None,
    ) -> None:
        _check_positive_int("initial_batch_size", initial_batch_size)
        _check_positive_int("min_batch_size", min_batch_size)
        _check_positive_int("history", history)
        if max_batch_size is not None:
            _check_positive_int("max_batch_size", max_batch_size)
            if max_batch_size < min_batch_size:
                raise ValueError(
                    f"max_batch_size {max_batch_size} is below min_batch_size {min_batch_size}"
                )
        if allocator not in ALLOCATORS:
            raise ValueError(f"unknown allocator {allocator!r}; expected one of {ALLOCATORS}")
        self.estimator_options = dict(estimator_options or {})
        self.allocator_options = dict(allocator_options or {})
        # Validates the names and options.
        make_estimator(estimator, alpha=alpha, options=self.estimator_options)
        self._iterative = IterativeAllocator(**self.allocator_options)
        self._stepped: dict[str, int] = {}
        self.initial_batch_size = int(initial_batch_size)
        self.estimator = estimator
        self.alpha = float(alpha)
        self.allocator: Allocator = allocator
        self.min_batch_size = int(min_batch_size)
        self.max_batch_size = None if max_batch_size is None else int(max_batch_size)
        self.history = int(history)
        if not math.isfinite(min_fit_spread) or min_fit_spread < 0:
            raise ValueError(f"min_fit_spread must be >= 0, got {min_fit_spread!r}")
        self.min_fit_spread = float(min_fit_spread)
        if max_change_ratio is not None and (
            isinstance(max_change_ratio, bool)
            or not math.isfinite(max_change_ratio)
            or max_change_ratio <= 1
        ):
            raise ValueError(f"max_change_ratio must be > 1 or None, got {max_change_ratio!r}")
        self.max_change_ratio = None if max_change_ratio is None else float(max_change_ratio)
        if not _real(min_batch_fraction) or not 0.0 <= min_batch_fraction <= 1.0:
            raise ValueError(f"min_batch_fraction must be in [0, 1], got {min_batch_fraction!r}")
        self.min_batch_fraction = float(min_batch_fraction)
        if noise_budget is not None and (
            not _real(noise_budget) or not 1.0 <= noise_budget <= MAX_NOISE_BUDGET
        ):
            raise ValueError(
                f"noise_budget must be in [1, {MAX_NOISE_BUDGET:g}] or None, got {noise_budget!r}"
            )
        self.noise_budget = None if noise_budget is None else float(noise_budget)
        self.last_allocation: dict[str, tuple[int, str]] = {}
        # restarted silos whose next report is not taken yet, by their state's identity
        self._restarted: dict[int, _SiloState] = {}
        """Each silo's batch size and the reason it got it (:data:`ALLOCATION_REASONS`)
        in the last :meth:`allocate`."""
        self.floor = max(
            self.min_batch_size, math.ceil(self.min_batch_fraction * self.initial_batch_size)
        )
        if self.max_batch_size is not None:
            self.floor = min(self.floor, self.max_batch_size)
        if fit not in FITS:
            raise ValueError(f"unknown fit {fit!r}; expected one of {FITS}")
        self.fit: Fit = fit
        if change_sigmas is not None and (not _real(change_sigmas) or change_sigmas < 0):
            raise ValueError(f"change_sigmas must be >= 0 or None, got {change_sigmas!r}")
        self.change_sigmas = None if change_sigmas is None else float(change_sigmas)
        if not _real(change_threshold) or change_threshold <= 0:
            raise ValueError(f"change_threshold must be > 0, got {change_threshold!r}")
        self.change_threshold = float(change_threshold)
        if isinstance(change_confirm, bool) or not isinstance(change_confirm, int | np.integer):
            raise ValueError(f"change_confirm must be an integer >= 1, got {change_confirm!r}")
        if change_confirm < 1:
            raise ValueError(f"change_confirm must be an integer >= 1, got {change_confirm!r}")
        self.change_confirm = int(change_confirm)
        self.common_noise = bool(common_noise)
        self.common_factor = 1.0
        """The common factor taken out of the last round's reports (1: none)."""
        if order_tolerance is not None and (not _real(order_tolerance) or order_tolerance < 0):
            raise ValueError(f"order_tolerance must be >= 0 or None, got {order_tolerance!r}")
        self.order_tolerance = None if order_tolerance is None else float(order_tolerance)
        self.equal_split_guard = bool(equal_split_guard)
        if not _real(equal_split_margin) or not 0.0 <= equal_split_margin < 1.0:
            raise ValueError(f"equal_split_margin must be in [0, 1), got {equal_split_margin!r}")
        self.equal_split_margin = float(equal_split_margin)
        self._silos: dict[str, _SiloState] = {}
        # Known shapes (b / a) by silo row; their median is the prior shape of a silo whose
        # own batch sizes have not identified its shape yet (refreshed by allocate()).
        self._shapes: dict[int, float] = {}
        self._shapes_changed = False
        self._pooled_shape = 0.0
        # One row per silo of what allocate() needs, refreshed with each report; row 0 is
        # the row of a silo that never reported.
        self._index: dict[str, int] = {}
        self._rows = np.array([_NO_ROW] * 8, dtype=np.float64)

    # ------------------------------------------------------------------ reports
    def report(self, silo_id: str, report: SiloReport) -> None:
        """Feed one silo's round report into its estimator, judged alone (no slowdown
        shared with other silos is taken out: feed a whole round with :meth:`report_round`).

        Raises
        ------
        InvalidReportError
            If the report is unusable; the silo's state is then left unchanged.
        """
        report.validate()
        state = self._state(silo_id)
        self._take(state, report, scale=1.0, level=self._near_level(state, report.batch_size))

    def report_round(self, reports: Mapping[str, SiloReport]) -> dict[str, InvalidReportError]:
        """Feed one round's reports, the round's common slowdown taken out of them
        (``common_noise``; the strategies and the cluster coordinator report this way).

        Parameters
        ----------
        reports : mapping of str to SiloReport
            Each reporting silo's report of the round.

        Returns
        -------
        dict of str to InvalidReportError
            The reports that could not be used, by silo (their silos' states are left
            unchanged); the others are fed.
        """
        errors: dict[str, InvalidReportError] = {}
        valid: dict[str, SiloReport] = {}
        for silo, report in reports.items():
            try:
                report.validate()
            except InvalidReportError as err:
                errors[silo] = err
            else:
                valid[silo] = report
        # Each silo's level near its batch size, once: the common factor's and the change
        # detection's reference.
        states = {silo: self._state(silo) for silo in valid}
        levels = {silo: self._near_level(states[silo], r.batch_size) for silo, r in valid.items()}
        scale = self._common_factor(states, valid, levels) if self.common_noise else 1.0
        self.common_factor = scale
        for silo, report in valid.items():
            self._take(states[silo], report, scale=scale, level=levels[silo])
        return errors

    def _common_factor(
        self,
        states: Mapping[str, _SiloState],
        reports: Mapping[str, SiloReport],
        levels: Mapping[str, float | None],
    ) -> float:
        """The round's common factor (``common_noise``): the median deviation of the
        reports from the silos' levels near their batch sizes, where at least 3 silos have
        one; otherwise from those levels or, failing one, the fitted lines, taken only
        beyond ``change_threshold``; 1 with fewer than 3 silos to judge by."""
        deviations = [
            math.log(reports[silo].train_time / level)
            for silo, level in levels.items()
            if level is not None
        ]
        if len(deviations) >= 3:
            return math.exp(float(np.median(deviations)))
        for silo, level in levels.items():
            fit = states[silo].fit
            if level is None and fit is not None:
                line = fit.slope * reports[silo].batch_size + fit.intercept
                deviations.append(math.log(reports[silo].train_time / line))
        if len(deviations) < 3:
            return 1.0
        shift = float(np.median(deviations))
        return math.exp(shift) if abs(shift) > math.log1p(self.change_threshold) else 1.0

    def _take(
        self, state: _SiloState, report: SiloReport, *, scale: float, level: float | None
    ) -> None:
        """Feed a valid report whose time, divided by ``scale``, is the silo's own;
        ``level``: the silo's time near the report's batch size (:meth:`_near_level`)."""
        x, t = int(report.batch_size), float(report.train_time) / scale
        speed = report.speed * scale
        verdict = self._screen(state, x, t, speed, level)
        state.reports += 1
        state.boost = 1.0
        if self._restarted.pop(id(state), None) is not None:
            # the size its cold report led to was start-up, not capacity: let the next
            # allocation move it as far as a confirmed change may
            state.boost = (self.max_change_ratio or 1.0) ** 2
        if verdict == "normal":
            state.estimator.update(
                speed, cpu_percent=report.cpu_percent, memory_percent=report.memory_percent
            )
            state.history.append((x, t))
        elif verdict == "change":
            # A confirmed change: speed estimate and cost-fit history restart from the
            # reports that confirmed it; the fit's shape (b / a) and noise are kept.
            confirmed = list(state.pending)
            state.pending.clear()
            state.estimator = make_estimator(
                self.estimator, alpha=self.alpha, options=self.estimator_options
            )
            for _, _, v, _, _ in confirmed:
                state.estimator.update(v)
            state.history.clear()
            state.history.extend((bx, bt) for bx, bt, _, _, _ in confirmed)
            level = math.exp(abs(math.fsum(e[3] for e in confirmed) / len(confirmed)))
            state.boost = min(level, (self.max_change_ratio or 1.0) ** 2)
        state.steps = report.steps
        if report.max_batch_size is not None:
            state.max_batch_size = int(report.max_batch_size)
        if report.fixed_time is not None:
            new = float(report.fixed_time)
            old = state.fixed_time
            state.fixed_time = new if old is None else self.alpha * new + (1 - self.alpha) * old
        state.last = {k: v for k, v in vars(report).items() if v is not None}
        # The silo's row (with its cost fit) is made as the report arrives, so that
        # allocate() only gathers rows.
        self._row(state)

    def _screen(
        self, state: _SiloState, x: int, t: float, speed: float, level: float | None
    ) -> str:
        """Change detection: ``"normal"``, ``"held"`` (a possible change, kept out of
        the estimate) or ``"change"`` (confirmed; ``state.pending`` holds its reports);
        ``level``: the silo's time near ``x`` from its history (``None``: not judged).

        ``state.pending`` is the current run of reports deviating from the cost line to
        the same side. A change is confirmed by ``change_confirm`` reports in a row beyond
        the single-report limit, or by a longer run whose mean deviation (each clipped at
        the limit, so that one spike cannot carry it) exceeds the limit divided by the
        square root of its length (a CUSUM-like test for a step hidden in the noise)."""
        if self.change_sigmas is None or level is None:
            state.pending.clear()
            return "normal"
        deviation = math.log(t / level)
        noise = 0.0 if state.noise is None else state.noise
        floor = math.log1p(self.change_threshold)
        limit = max(floor, self.change_sigmas * noise)
        run = state.pending
        if run and (run[-1][3] > 0) != (deviation > 0):
            run.clear()
        held = abs(deviation) > limit
        run.append((x, t, speed, deviation, held))
        del run[: -self.history]
        trailing = 0
        for entry in reversed(run):
            if not entry[4]:
                break
            trailing += 1
        if trailing >= self.change_confirm:
            del run[:-trailing]
            return "change"
        if len(run) > self.change_confirm:
            mean = abs(math.fsum(max(-limit, min(limit, e[3])) for e in run)) / len(run)
            if mean > max(floor, limit / math.sqrt(len(run))):
                return "change"
        return "held" if held else "normal"

    def _near_level(self, state: _SiloState, x: int) -> float | None:
        """The silo's time at batch size ``x`` from its reports at nearly the same batch
        size (within ``min_fit_spread``, moved along the fitted slope), at least 2 of
        them, so that an error of the line's shape (a fixed cost not identified yet) does
        not count; ``None`` without a fit or such reports."""
        fit = state.fit
        if fit is None or len(state.history) < 2:
            return None
        reach = self.min_fit_spread * x
        near = [bt + fit.slope * (x - bx) for bx, bt in state.history if abs(bx - x) < reach]
        if len(near) < 2:
            return None
        level = robust_level(near)
        # moved along a steep slope, reports far below x can land at or under zero: no
        # level to judge a time by (the change detection and the common factor take logs)
        return level if math.isfinite(level) and level > 0 else None

    def restart(self, silo_id: str) -> None:
        """Forget what a silo's reports taught its speed estimate and cost history, as
        after a confirmed change (the fit's shape and noise are kept): for a report that
        held start-up rather than capacity (a silo's first round, a rejoin). The
        silo's next report then sets its estimate alone, and the allocation after it may
        move the silo's batch size as far as after a confirmed change (``max_change_ratio``
        cubed). A silo not seen yet: nothing."""
        state = self._silos.get(silo_id)
        if state is None:
            return
        state.estimator = make_estimator(
            self.estimator, alpha=self.alpha, options=self.estimator_options
        )
        state.history.clear()
        state.pending.clear()
        state.boost = 1.0
        self._restarted[id(state)] = state
        self._row(state)  # no history: no cost line (the common factor must not use it)

    def warming_up(self) -> dict[str, tuple[int, int]]:
        """Silos whose estimator still predicts by its EMA warm-up (NARX before its first
        training, Sec. 3.2.2): silo id -> (reports so far, warm-up length)."""
        out = {}
        for silo, state in self._silos.items():
            warmup = getattr(state.estimator, "warmup", None)
            seen = getattr(state.estimator, "observations", None)
            if isinstance(warmup, int) and isinstance(seen, int) and seen < warmup:
                out[silo] = (seen, warmup)
        return out

    def predicted_speed(self, silo_id: str) -> float | None:
        """Predicted samples per second of a silo, ``None`` if it never reported."""
        state = self._silos.get(silo_id)
        return None if state is None else state.estimator.predict()

    def cost_line(self, silo_id: str) -> tuple[float, float] | None:
        """The silo's fitted cost line ``(a, b)``, seconds per unit of batch size and fixed
        seconds per round (its smoothed ``fixed_time`` included), as the linear allocator
        uses it; ``None`` if it never reported or has no fit."""
        state = self._silos.get(silo_id)
        if state is None:
            return None
        row = self._rows[state.index]
        if math.isnan(row[2]):
            return None
        return float(row[2]), float(row[3] + row[4])

    def knee(self, silo_id: str) -> float:
        """Batch size up to which the silo's time is flat, as the allocator uses it (0: a
        line, or not known)."""
        state = self._silos.get(silo_id)
        return 0.0 if state is None else float(self._rows[state.index][8])

    def predicted_round_time(self, sizes: Mapping[str, int]) -> float | None:
        """Predicted round time ``max_i a_i * max(B_i, k_i) + b_i`` of an allocation from
        the silos' cost curves; ``None`` if a silo has none."""
        times = []
        for silo, x in sizes.items():
            line = self.cost_line(silo)
            if line is None:
                return None
            times.append(line[0] * max(x, self.knee(silo)) + line[1])
        return max(times) if times else None

    def fixed_time(self, silo_id: str) -> float | None:
        """Smoothed fixed per-round time of a silo (``he-time``), ``None`` if never reported."""
        state = self._silos.get(silo_id)
        return None if state is None else state.fixed_time

    @property
    def silo_ids(self) -> list[str]:
        """Ids of every silo that has reported at least once."""
        return list(self._silos)

    # --------------------------------------------------------------- allocation
    def total_batch_size(self, num_silos: int) -> int:
        """The fixed total ``X = n * B_init`` for a round with ``num_silos`` silos."""
        return num_silos * self.initial_batch_size

    def allocate(
        self,
        silo_ids: Iterable[str],
        *,
        total: int | None = None,
        weights: Mapping[str, float] | None = None,
        noise: Mapping[str, float] | None = None,
        budget: bool = True,
    ) -> dict[str, int]:
        """Next batch size of each silo in ``silo_ids``, summing to ``n * B_init``.

        The shortest predicted round within the bounds and the noise budget
        (``noise_budget``, :func:`~fl_lbbsp.core.budget.budgeted_minmax`). A silo that never
        reported is predicted at the mean speed of those that did; when none has, every
        silo gets ``B_init``. Memory caps bound the result; if the caps make ``n * B_init``
        unreachable, each capped silo gets its cap and the total is the sum of the caps.
        The sizes do not depend on the order of ``silo_ids`` (ties between equally good
        integer splits are broken by silo id), so the same state gives the same sizes,
        e.g. after resuming from a checkpoint; the result lists the silos in the order
        given. Why each silo got its size is in :attr:`last_allocation`.

        Parameters
        ----------
        silo_ids : iterable of str
            The silos of the round.
        total : int | None (default: None)
            The total X to split; ``None``: ``n * B_init``. A strategy passes the total of
            the whole federation when some silos are gone, so that the others take their
            share and the global batch stays the same.
        weights : Mapping[str, float] | None (default: None)
            The weight the server aggregates each silo's update with (its dataset size:
            normalised here); a silo missing gets the median of the others'; ``None``:
            equal weights.
        noise : Mapping[str, float] | None (default: None)
            Each silo's gradient-noise variance sigma_i^2 where it reports one (any common
            unit); a silo missing gets the median of the others'; ``None``: equal.
        budget : bool (default: True)
            ``False``: no noise budget for this allocation (the update's noise does not
            depend on the split, e.g. gradients weighted by batch size in cluster mode).
        """
        order = list(dict.fromkeys(silo_ids))
        ids = sorted(order)
        sizes, reasons = self._allocate(
            ids,
            total,
            _per_silo(ids, weights, "weights"),
            _per_silo(ids, noise, "noise"),
            self.noise_budget if budget else None,
        )
        self.last_allocation = {silo: (sizes[silo], reasons[silo]) for silo in order}
        return {silo: sizes[silo] for silo in order}

    def _allocate(
        self,
        ids: list[str],
        total: int | None,
        weights: np.ndarray | None,
        noise: np.ndarray | None,
        rho: float | None,
    ) -> _Decision:
        if not ids:
            return {}, {}
        if self._shapes_changed:
            self._pooled_shape = float(np.median(list(self._shapes.values())))
            self._shapes_changed = False
        n = len(ids)
        # The silos' rows are gathered at once; the rest is vectorised.
        rows = self._rows[np.fromiter(map(self._index.get, ids, repeat(0)), np.intp, count=n)]
        hard_upper = self._uppers(rows[:, 0])
        # The floor yields to a silo's memory cap (min_batch_size does not).
        hard_lower = np.minimum(float(self.floor), hard_upper)
        if total is not None:
            _check_positive_int("total", total)
        wanted = self.total_batch_size(n) if total is None else total
        total = int(np.clip(wanted, hard_lower.sum(), hard_upper.sum()))
        lower, upper = self._change_limits(rows[:, 1], rows[:, 6], total, hard_lower, hard_upper)

        def named(sizes: np.ndarray, why: Sequence[str] | str) -> _Decision:
            reasons = [why] * n if isinstance(why, str) else list(why)
            return (
                dict(zip(ids, sizes.tolist(), strict=True)),
                dict(zip(ids, reasons, strict=True)),
            )

        speeds = None
        if self.allocator == "linear":
            a, b, unfitted = self._linear_costs(rows)
            # Predicted speeds are needed only for the silos without a fitted cost.
            speeds = self._speeds(ids, only=unfitted.tolist()) if unfitted.size else None
            if unfitted.size and speeds is None:  # no silo reported yet
                return named(_equal_split(total, hard_lower, hard_upper), "no-report")
            if speeds is not None:
                a[unfitted] /= speeds
            knee = rows[:, 8].copy()
            knee[unfitted] = 0.0
        else:
            speeds = self._speeds(ids)
            if speeds is None:
                return named(_equal_split(total, hard_lower, hard_upper), "no-report")
            if self.allocator == "iterative":
                given = self._iterate(ids, total, lower, upper, speeds)
                return named(np.array([given[i] for i in ids], dtype=np.int64), "iterative")
            a, b, knee = 1.0 / speeds, np.zeros(n), np.zeros(n)
        result = budgeted_minmax(
            a, b, total, knee=knee, lower=lower, upper=upper, weights=weights, noise=noise,
            rho=rho, rounding="remainder" if self.allocator == "proportional" else "time",
        )  # fmt: skip
        reasons = self._bound_reasons(result, lower, upper, hard_lower, hard_upper, rows[:, 0])
        margin = self._margin(rows[:, 7]) if self.equal_split_guard else 0.0
        # Under a binding budget, unequal weights order the batch sizes by weight too: the
        # order of speeds is then not the order to keep.
        weighted = result.binds and weights is not None and np.ptp(weights) > 0
        sizes = self._guard(
            result.sizes, a, b, knee, total, lower, upper, hard_lower, hard_upper, margin,
            round_time=None if weighted else result.round_time, order=not weighted,
        )  # fmt: skip
        if (
            self.equal_split_guard
            and np.array_equal(sizes, _equal_split(total, hard_lower, hard_upper))
            and not np.array_equal(sizes, result.sizes)
        ):
            return named(sizes, "equal-split")
        moved = (sizes != result.sizes).tolist()
        reasons = ["order" if m else r for m, r in zip(moved, reasons, strict=True)]
        if rho is not None and not np.array_equal(sizes, result.sizes):
            # The order guard moved samples: the budget still holds afterwards.
            c = noise_costs(n, weights, noise)
            budget_ = rho * float(np.sum(c)) * n / total
            enforce_budget(sizes, c, budget_, lower=np.maximum(np.ceil(lower), 1), upper=upper)
        return named(sizes, reasons)

    def _bound_reasons(
        self,
        result: Allocation,
        lower: np.ndarray,
        upper: np.ndarray,
        hard_lower: np.ndarray,
        hard_upper: np.ndarray,
        caps: np.ndarray,
    ) -> list[str]:
        """The solver's reasons with its bounds named: ``floor`` (the hard floor),
        ``memory-cap`` (the silo's reported cap), ``max-batch-size`` or ``change-limit``."""
        out = []
        for i, why in enumerate(result.reasons):
            if why == "lower":
                why = "change-limit" if lower[i] > hard_lower[i] else "floor"
            elif why == "upper":
                if upper[i] < hard_upper[i]:
                    why = "change-limit"
                else:
                    why = "memory-cap" if caps[i] <= hard_upper[i] else "max-batch-size"
            out.append(why)
        return out

    def _margin(self, errors: np.ndarray) -> float:
        """The predicted gain over the equal split an allocation must show: twice the
        largest standard error of a silo's fitted time (its fit's relative noise over the
        square root of its reports; ``errors``, a column of the silos' rows), at most
        ``equal_split_margin``, which applies while a silo has no noise estimate yet."""
        if not errors.size or np.isnan(errors).any():
            return self.equal_split_margin
        return min(self.equal_split_margin, 2.0 * float(errors.max()))

    def _guard(
        self,
        sizes: np.ndarray,
        a: np.ndarray,
        b: np.ndarray,
        knee: np.ndarray,
        total: int,
        lower: np.ndarray,
        upper: np.ndarray,
        hard_lower: np.ndarray,
        hard_upper: np.ndarray,
        margin: float,
        *,
        round_time: float | None = None,
        order: bool = True,
    ) -> np.ndarray:
        """The order guard (``order``; at ``round_time``), then the equal-split guard (a
        predicted gain of at least ``margin``), on the predicted cost curves a, b, knee."""
        x = sizes.astype(np.int64)
        if order and self.order_tolerance is not None and len(x) > 1:
            x = order_guard(
                x, a, b, self.order_tolerance, lower=lower, upper=upper, round_time=round_time
            )
        if self.equal_split_guard:
            equal = _equal_split(total, hard_lower, hard_upper)
            slowest = np.max(hinge_times(a, b, knee, x))
            if slowest >= (1.0 - margin) * np.max(hinge_times(a, b, knee, equal)):
                return equal
        return x

    # ------------------------------------------------------------ serialisation
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (configuration and every silo's estimator)."""
        return {
            "config": {
                "initial_batch_size": self.initial_batch_size,
                "estimator": self.estimator,
                "alpha": self.alpha,
                "allocator": self.allocator,
                "min_batch_size": self.min_batch_size,
                "min_batch_fraction": self.min_batch_fraction,
                "noise_budget": self.noise_budget,
                "max_batch_size": self.max_batch_size,
                "history": self.history,
                "min_fit_spread": self.min_fit_spread,
                "max_change_ratio": self.max_change_ratio,
                "fit": self.fit,
                "change_sigmas": self.change_sigmas,
                "change_threshold": self.change_threshold,
                "change_confirm": self.change_confirm,
                "common_noise": self.common_noise,
                "order_tolerance": self.order_tolerance,
                "equal_split_guard": self.equal_split_guard,
                "equal_split_margin": self.equal_split_margin,
                "estimator_options": self.estimator_options,
                "allocator_options": self.allocator_options,
            },
            "iterative": {"allocator": self._iterative.state(), "stepped": self._stepped},
            "pooled_shape": {"value": self._pooled_shape, "stale": self._shapes_changed},
            "silos": {
                silo: {
                    "estimator": state.estimator.state(),
                    "history": [list(pair) for pair in state.history],
                    "max_batch_size": state.max_batch_size,
                    "steps": state.steps,
                    "fixed_time": state.fixed_time,
                    "last": state.last,
                    "reports": state.reports,
                    "shape": state.shape,
                    "noise": state.noise,
                    "pending": [list(p) for p in state.pending],
                    "boost": state.boost,
                    "fit": None if state.fit is None else _fit_state(state.fit),
                    "knee": state.knee,
                }
                for silo, state in self._silos.items()
            },
        }

    def to_json(self) -> str:
        """Serialise the state to a JSON string."""
        return json.dumps(self.state_dict(), sort_keys=True)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> BatchSizeBalancer:
        """Rebuild a balancer from :meth:`state_dict`; settings missing from an older
        state take their defaults."""
        balancer = cls(**state["config"])
        for silo, saved in state["silos"].items():
            balancer._register(
                str(silo),
                _SiloState(
                    estimator=estimator_from_state(saved["estimator"]),
                    history=deque(
                        ((int(x), float(t)) for x, t in saved["history"]), maxlen=balancer.history
                    ),
                    max_batch_size=saved["max_batch_size"],
                    steps=float(saved["steps"]),
                    fixed_time=saved.get("fixed_time"),
                    last=dict(saved.get("last", {})),
                    reports=int(saved.get("reports", len(saved["history"]))),
                    shape=_optional_float(saved.get("shape")),
                    noise=_optional_float(saved.get("noise")),
                    pending=[
                        (
                            int(p[0]),
                            float(p[1]),
                            float(p[2]),
                            float(p[3]),
                            bool(p[4]) if len(p) > 4 else True,
                        )
                        for p in saved.get("pending", [])
                    ],
                    boost=float(saved.get("boost", 1.0)),
                    fit=None if saved.get("fit") is None else _fit_from_state(saved["fit"]),
                    knee=float(saved.get("knee") or 0.0),
                ),
            )
        if "pooled_shape" in state:
            balancer._pooled_shape = float(state["pooled_shape"]["value"])
            balancer._shapes_changed = bool(state["pooled_shape"]["stale"])
        if "iterative" in state:
            balancer._iterative = IterativeAllocator.from_state(state["iterative"]["allocator"])
            balancer._stepped = {str(k): int(v) for k, v in state["iterative"]["stepped"].items()}
        return balancer

    @classmethod
    def from_json(cls, text: str) -> BatchSizeBalancer:
        """Rebuild a balancer from :meth:`to_json`."""
        return cls.from_state_dict(json.loads(text))

    # ----------------------------------------------------------------- helpers
    def _state(self, silo_id: str) -> _SiloState:
        if silo_id not in self._silos:
            self._register(
                silo_id,
                _SiloState(
                    estimator=make_estimator(
                        self.estimator, alpha=self.alpha, options=self.estimator_options
                    ),
                    history=deque(maxlen=self.history),
                ),
            )
        return self._silos[silo_id]

    def _register(self, silo_id: str, state: _SiloState) -> None:
        """Add a silo and give it a row in the table (its row is made by :meth:`_row`)."""
        self._silos[silo_id] = state
        state.index = len(self._index) + 1
        self._index[silo_id] = state.index
        if state.shape is not None:
            self._shapes[state.index] = state.shape
            self._shapes_changed = True
        if state.index >= len(self._rows):
            grown = np.array([_NO_ROW] * (2 * len(self._rows)), dtype=np.float64)
            grown[: len(self._rows)] = self._rows
            self._rows = grown
        self._row(state, refit=state.fit is None)

    def _uppers(self, caps: np.ndarray) -> np.ndarray:
        """Each silo's largest batch size: the balancer's and its own memory cap (inf)."""
        if self.max_batch_size is not None:
            caps = np.minimum(caps, self.max_batch_size)
        # A cap below min_batch_size cannot be honoured: the minimum wins.
        return np.where(np.isinf(caps), caps, np.maximum(caps, self.min_batch_size))

    def _iterate(
        self,
        ids: list[str],
        total: int,
        lower: np.ndarray,
        upper: np.ndarray,
        speeds: np.ndarray | None,
    ) -> dict[str, int]:
        """Alg. 2: one leader/straggler step per round of fresh reports from every silo."""
        allocator = self._iterative
        if (
            set(ids) != set(allocator.sizes)
            or speeds is None
            or not all(self._reported(i) for i in ids)
        ):
            # First round, or silos joined or left: restart from a proportional split.
            start = proportional(
                np.ones(len(ids)) if speeds is None else speeds, total, lower=lower, upper=upper
            )
            allocator.reset(dict(zip(ids, (int(x) for x in start), strict=True)))
            self._stepped = {i: self._silos[i].reports for i in ids if i in self._silos}
            return {i: allocator.sizes[i] for i in ids}
        fresh = all(self._silos[i].reports > self._stepped.get(i, 0) for i in ids)
        if fresh:
            allocator.update(
                {i: self._silos[i].history[-1][1] for i in ids},
                memory={i: self._silos[i].last.get("memory_percent") for i in ids},
                upper=dict(zip(ids, upper.tolist(), strict=True)),
                lower=dict(zip(ids, lower.tolist(), strict=True)),
            )
            self._stepped = {i: self._silos[i].reports for i in ids}
        return {i: allocator.sizes[i] for i in ids}

    def _reported(self, silo_id: str) -> bool:
        state = self._silos.get(silo_id)
        return state is not None and state.reports > 0

    def _change_limits(
        self,
        last: np.ndarray,
        boost: np.ndarray,
        total: int,
        lower: np.ndarray,
        upper: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Narrow the bounds to ``max_change_ratio`` (times ``boost``, the level ratio of
        a change confirmed by the last report) around each silo's last reported batch size
        (``last``: NaN for a silo that never reported, bounded around B_init).

        The first report is bounded too, around B_init: the equal split every silo ran
        round 1 with is the prior of LB-BSP before any speed is known (Chen et al., IEEE
        TCC 2021, Sec. 3.3: batch sizes in proportion to predicted speeds, all equal
        before the first prediction; FedAvg's split, which the design's benchmarks use as
        the reference), so one report, true or not, moves a silo at most
        ``max_change_ratio`` from it (a silo reporting a thousandth of its time gets
        ``2 * B_init`` in round 2, not most of X). What a silo claims is bounded by the
        round engine's claim checks (:mod:`fl_lbbsp.core.claims`)."""
        ratio = self.max_change_ratio
        if ratio is None:
            return lower, upper
        last = np.where(np.isnan(last), float(self.initial_batch_size), last)
        ratios = ratio * boost
        # A memory cap still wins over the change limit.
        lo = np.minimum(np.maximum(lower, np.ceil(last / ratios)), upper)
        hi = np.maximum(np.minimum(upper, np.floor(last * ratios)), lo)
        if lo.sum() > total or hi.sum() < total:
            return lower, upper
        return lo, hi

    def _speeds(self, ids: Sequence[str], *, only: list[int] | None = None) -> np.ndarray | None:
        """Predicted speed of each silo (of those at the indices ``only``, if given); a
        silo without a prediction gets the mean of the others'. ``None`` if no silo has
        one."""
        silos = self._silos
        if only is not None:
            chosen = [silos.get(ids[k]) for k in only]
            some = [None if st is None else st.estimator.predict() for st in chosen]
            if all(v is not None for v in some):  # no mean over the others needed
                return np.array(some, dtype=np.float64)
            speeds = self._speeds(ids)
            return None if speeds is None else speeds[only]
        states = [silos.get(i) for i in ids]
        predicted = [None if st is None else st.estimator.predict() for st in states]
        known = [v for v in predicted if v is not None]
        if not known:
            return None
        mean = float(np.mean(known))
        return np.array([mean if v is None else v for v in predicted], dtype=np.float64)

    def _row(self, state: _SiloState, *, refit: bool = True) -> None:
        """Refresh the silo's row of the table: memory cap (inf if none), last reported
        batch size (NaN if none), the linear allocator's cost line a, b (NaN, 0 without
        one), its smoothed fixed time (0 if none), its local steps per round and the
        change limit's boost. ``refit=False`` keeps the robust fit restored from a
        checkpoint."""
        a, b, knee = math.nan, 0.0, 0.0
        if not refit and state.fit is not None:
            if self.fit == "robust":
                a, b, knee = state.fit.slope, state.fit.intercept, state.fit.knee
        elif state.history and (self.fit == "robust" or self.change_sigmas is not None):
            xs, ts = zip(*state.history, strict=True)
            # Where the silo's time is flat (a knee), then the line above it.
            state.knee = find_knee(
                xs, ts, knee=state.knee, noise=state.noise, min_relative_spread=self.min_fit_spread
            )
            fit = fit_robust_cost(
                xs,
                ts,
                prior_shape=self._pooled_shape if state.shape is None else state.shape,
                prior_noise=state.noise,
                prior_known=state.shape is not None,
                min_relative_spread=self.min_fit_spread,
                knee=state.knee,
            )
            state.fit = fit
            if state.shape is not None or fit.weight >= 0.5:
                # The silo's own shape, once its batch sizes have identified it.
                state.shape = fit.shape
                self._shapes[state.index] = fit.shape
                self._shapes_changed = True
            if math.isfinite(fit.noise):
                state.noise = fit.noise
            if self.fit == "robust":
                a, b, knee = fit.slope, fit.intercept, fit.knee
        else:
            state.fit = None
        if self.allocator == "linear" and self.fit == "wls" and state.history:
            xs, ts = zip(*state.history, strict=True)
            ages = np.arange(len(xs))[::-1]
            wls = fit_linear_cost(
                xs,
                ts,
                weights=(1.0 - self.alpha) ** ages,
                min_relative_spread=self.min_fit_spread,
            )
            a, b = (math.nan, 0.0) if wls is None else wls
        last = state.last.get("batch_size")
        noise = math.nan if state.noise is None else state.noise
        self._rows[state.index] = (
            math.inf if state.max_batch_size is None else float(state.max_batch_size),
            math.nan if last is None else float(last),
            a,
            b,
            0.0 if state.fixed_time is None else state.fixed_time,
            state.steps,
            state.boost,
            # standard error of the fitted time (NaN: no noise estimate yet)
            noise / math.sqrt(max(1, len(state.history))),
            knee,
        )

    def _linear_costs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-sample cost a_i and fixed cost b_i of each silo, and the silos without a
        fit, whose a_i is ``steps`` still to be divided by the predicted speed v_i (and
        b_i 0). Each b_i includes the silo's smoothed fixed time (``he-time``)."""
        a = rows[:, 2].copy()
        b = rows[:, 3] + rows[:, 4]
        unfitted = np.flatnonzero(np.isnan(a))
        if unfitted.size:
            steps = rows[unfitted, 5]
            unknown = np.isnan(steps)  # silos that never reported: the mean over all
            if unknown.any():
                known = [st.steps for st in self._silos.values()]
                steps[unknown] = float(np.mean(known)) if known else 1.0
            a[unfitted] = steps
        return a, b, unfitted


_NO_ROW = (math.inf, math.nan, math.nan, 0.0, 0.0, math.nan, 1.0, math.nan, 0.0)
"""The row of a silo that never reported."""


def _per_silo(
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


def _equal_split(total: int, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """FedAvg's equal split of ``total`` within the bounds (silos in the order given)."""
    n = len(lower)
    share, extra = divmod(total, n)
    sizes = np.full(n, share, dtype=np.int64)
    sizes[:extra] += 1
    if np.all(sizes >= lower) and np.all(sizes <= upper):
        return sizes
    return proportional(np.ones(n), total, lower=lower, upper=upper)


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
    ``1 / a_i``). Whenever silo i is predicted
    faster than silo j by more than ``tolerance`` (relative) but gets a batch size more
    than one sample smaller (j above its lower bound, i below its upper one), the sizes
    are pooled: the silos are grouped into speed classes spanning a factor
    ``1 + tolerance`` each, and pool-adjacent-violators along the classes (a block holding
    fewer samples per silo than a slower one is merged with it at their mean) makes the
    sizes non-decreasing in speed class; they are then rounded to the same total within
    each silo's bounds. At the min-max
    solution without binding bounds there is no inversion; the guard catches those left
    by the bounds (change limits, caps) and by rounding. Bounds win over the order.

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
    times = a * x + b
    inside = (x > np.asarray(lower)) & (x < np.asarray(upper))
    # The common finish time of the silos no bound holds (the median of their predicted
    # times); all of them when every silo is at a bound.
    if round_time is None:
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
    # Speed classes, from the slowest: a class spans a factor (1 + tolerance), so two
    # silos further apart in speed are in different classes. Along the chain sorted by
    # class, then by size, an inversion can only be between classes.
    classes = np.empty(n, dtype=np.int64)
    current, start = 0, float(speed[by_speed[0]])
    for k in by_speed:
        if speed[k] > start * (1.0 + tolerance):
            current, start = current + 1, float(speed[k])
        classes[k] = current
    order = np.lexsort((x, classes))
    xs = x[order].astype(np.float64)
    # Pool adjacent violators: a block holding fewer samples per silo than the one before
    # it is merged into it. Blocks: [sum of sizes, count].
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


def _fit_state(fit: CostFit) -> dict[str, Any]:
    """A cost fit as JSON (NaN noise as null)."""
    state = asdict(fit)
    state["noise"] = None if math.isnan(fit.noise) else fit.noise
    state["spread"] = list(fit.spread)
    return state


def _fit_from_state(state: dict[str, Any]) -> CostFit:
    low, high = state["spread"]
    return CostFit(
        slope=float(state["slope"]),
        intercept=float(state["intercept"]),
        anchor=float(state["anchor"]),
        level=float(state["level"]),
        noise=math.nan if state.get("noise") is None else float(state["noise"]),
        weight=float(state["weight"]),
        spread=(float(low), float(high)),
        knee=float(state.get("knee") or 0.0),
    )


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _real(value: object) -> bool:
    return (
        isinstance(value, int | float | np.integer | np.floating)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and math.isfinite(float(value))


def _check_count(name: str, value: object) -> None:
    number = float(value) if _finite(value) and not isinstance(value, bool) else math.nan  # type: ignore[arg-type]
    if not (number > 0 and number.is_integer()):
        raise InvalidReportError(f"{name} must be a positive integer, got {value!r}")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


BALANCER_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        name: parameter.default
        for name, parameter in inspect.signature(BatchSizeBalancer.__init__).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
)
"""The balancer's default settings, read from its constructor: the one set of defaults the
strategies (:class:`~fl_lbbsp.strategies.config.BalancingConfig`) also use."""
