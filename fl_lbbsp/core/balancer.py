"""The balancer: LB-BSP's BatchSizeManager, keyed by a stable silo id.

A small facade over the parts: each round the strategy passes every silo's report
(:class:`~fl_lbbsp.core.silo.reports.SiloReport`) to :meth:`BatchSizeBalancer.report_round`,
which takes the round's shared slowdown out (:func:`~fl_lbbsp.core.slowdown.shared_slowdown`)
and feeds each silo's model (:mod:`.silo_model`: estimator, history window, cost fit,
change detector), then asks :meth:`BatchSizeBalancer.allocate` for the next batch sizes,
which the allocation pipeline decides, with a reason per silo (:mod:`.allocation`). The
total ``X = n * B_init`` is kept every round, so the global batch (and with it
convergence) matches plain BSP / FedAvg.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 4 (BatchSizeManager, Alg. 3), Alg. 1, Sec. 3.5.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .allocation import pipeline as allocation
from .allocation.budget import Allocation
from .allocation.iterative import IterativeAllocator, IterativeStep
from .allocation.pipeline import ALLOCATION_REASONS, Decision, order_guard, per_silo
from .balancer_settings import ALLOCATORS, FITS, AllocationSettings, Allocator, Fit, ModelSettings
from .settings import BALANCER_DEFAULTS, MAX_NOISE_BUDGET, NOISE_BUDGET
from .silo.estimators import SpeedEstimator, parse_estimator
from .silo.model import SiloModel, SiloTable
from .silo.reports import InvalidReportError, SiloReport, report_columns

__all__ = [
    "ALLOCATION_REASONS",
    "ALLOCATORS",
    "BALANCER_DEFAULTS",
    "FITS",
    "MAX_NOISE_BUDGET",
    "NOISE_BUDGET",
    "Allocation",
    "BatchSizeBalancer",
    "InvalidReportError",
    "SiloReport",
    "order_guard",
]

_KNOBS = BALANCER_DEFAULTS  # every default declared once (BalancingKnobs)


class BatchSizeBalancer:
    """Per-silo speed prediction and batch-size allocation (the BatchSizeManager).

    Every default is the knob's in :class:`~fl_lbbsp.core.settings.BalancingKnobs`
    (:data:`BALANCER_DEFAULTS`), which documents each at length, as does
    docs/balancing.md; each part's module says how it acts.

    Parameters
    ----------
    initial_batch_size : int
        B_init: every silo's batch size before any report; ``X = n * B_init``.
    estimator : SpeedEstimator | str
        Speed predictor, an object of the registry
        (:data:`~fl_lbbsp.core.silo.estimators.ESTIMATORS`: ``EMA(alpha=0.2)``,
        ``Last()``, ``ChangeAwareEMA(...)``, ``NARX(...)``, torch trains it), or its name,
        parsed with ``alpha`` and ``estimator_options``
        (:func:`~fl_lbbsp.core.silo.estimators.parse_estimator`).
    alpha : float
        EMA weight of the latest observation, in (0, 1] (of the estimator named by a
        string, and of each silo's fixed time).
    allocator : {"proportional", "linear", "iterative"}
        Alg. 1 (proportional to speed); the exact min-max over fitted cost lines
        ``t = a * max(x, k) + b`` (fixed costs such as encryption in b); Alg. 2
        (:class:`~fl_lbbsp.core.allocation.iterative.IterativeAllocator`).
    min_batch_size : int
        Smallest batch size handed out.
    min_batch_fraction : float
        A hard floor ``ceil(min_batch_fraction * B_init)``, in [0, 1] (a memory cap
        wins); the noise budget protects accuracy, this is for a floor of your own.
    noise_budget : float | None
        rho: the update's variance ``sum_i w_i^2 sigma_i^2 / B_i`` at most rho times the
        equal split's (:func:`~fl_lbbsp.core.allocation.budget.budgeted_minmax`); ``None``: none.
    max_batch_size : int | None
        Largest batch size handed out; a silo's reported memory cap lowers it.
    history : int
        Reports kept per silo for the cost fit and the change detection.
    min_fit_spread : float
        Batch sizes closer than this fraction count as the same for the fits.
    max_change_ratio : float | None
        A silo's next batch size stays within ``[B / r, B * r]`` of the one it last
        reported (B_init before), widened after a confirmed change
        (:func:`~fl_lbbsp.core.allocation.pipeline.change_limits`); ``None``: no limit.
    fit : {"robust", "wls"}
        Cost fit: :func:`~fl_lbbsp.core.silo.costfit.fit_robust_cost` or weighted least squares.
    change_sigmas : float | None
        Change detection (:func:`~fl_lbbsp.core.silo.detector.observe_run`): a report beyond
        ``max(log(1 + change_threshold), change_sigmas * noise)`` of the silo's level is
        held; ``None``: no detection.
    change_threshold : float
        Smallest relative deviation that counts as a possible change, > 0.
    change_confirm : int
        Held reports in a row, to the same side, that confirm a change, >= 1.
    common_noise : bool
        :meth:`report_round` takes the slowdown all its silos share out of the reports
        (:func:`~fl_lbbsp.core.slowdown.shared_slowdown`).
    order_tolerance : float | None
        The order guard (:func:`~fl_lbbsp.core.allocation.pipeline.order_guard`); ``None``: off.
    equal_split_guard : bool
        Ship the equal split instead of an allocation not predicted faster than it.
    equal_split_margin : float
        The largest gain the equal-split guard asks for, in [0, 1).
    estimator_options : dict | None
        Settings of the estimator named by a string (``warmup``, ``threshold``, ...).
    allocator_options : dict | None
        Extra arguments of the ``"iterative"`` allocator.

    Raises
    ------
    ValueError
        On a setting out of its range (the message names it).
    """

    def __init__(
        self,
        *,
        initial_batch_size: int,
        estimator: SpeedEstimator | str = _KNOBS["estimator"],
        alpha: float = _KNOBS["alpha"],
        allocator: Allocator = _KNOBS["allocator"],
        min_batch_size: int = _KNOBS["min_batch_size"],
        min_batch_fraction: float = _KNOBS["min_batch_fraction"],
        noise_budget: float | None = _KNOBS["noise_budget"],
        max_batch_size: int | None = _KNOBS["max_batch_size"],
        history: int = _KNOBS["history"],
        min_fit_spread: float = _KNOBS["min_fit_spread"],
        max_change_ratio: float | None = _KNOBS["max_change_ratio"],
        fit: Fit = _KNOBS["fit"],
        change_sigmas: float | None = _KNOBS["change_sigmas"],
        change_threshold: float = _KNOBS["change_threshold"],
        change_confirm: int = _KNOBS["change_confirm"],
        common_noise: bool = _KNOBS["common_noise"],
        order_tolerance: float | None = _KNOBS["order_tolerance"],
        equal_split_guard: bool = _KNOBS["equal_split_guard"],
        equal_split_margin: float = _KNOBS["equal_split_margin"],
        estimator_options: dict[str, Any] | None = None,
        allocator_options: dict[str, Any] | None = None,
    ) -> None:
        self.allocation_settings = AllocationSettings(
            initial_batch_size, allocator, min_batch_size, min_batch_fraction, max_batch_size,
            noise_budget, max_change_ratio, order_tolerance, equal_split_guard,
            equal_split_margin,
        )  # fmt: skip
        if isinstance(estimator, str):
            estimator = parse_estimator(estimator, alpha=alpha, options=estimator_options)
        elif estimator_options:
            raise ValueError("estimator_options are for an estimator named by a string")
        self.speed_estimator = estimator
        # the estimator by name and settings (what a checkpoint's config holds)
        options = estimator.model_dump(exclude_defaults=True)
        if options.get("alpha") == alpha:
            del options["alpha"]
        self.estimator_options = options
        self.model_settings = ModelSettings(
            estimator, float(alpha), history, float(min_fit_spread),
            fit, allocator == "linear" and fit == "wls", change_sigmas, change_threshold,
            change_confirm, max_change_ratio,
        )  # fmt: skip
        self.allocator_options = dict(allocator_options or {})
        self._iterative = IterativeStep(IterativeAllocator(**self.allocator_options))
        self.initial_batch_size, self.estimator = int(initial_batch_size), estimator.name
        self.alpha, self.allocator, self.fit = float(alpha), allocator, fit
        self.min_batch_size, self.history = int(min_batch_size), int(history)
        self.max_batch_size = None if max_batch_size is None else int(max_batch_size)
        self.min_fit_spread = float(min_fit_spread)
        self.min_batch_fraction = float(min_batch_fraction)
        self.max_change_ratio, self.noise_budget = _floats(max_change_ratio, noise_budget)
        self.floor = self.allocation_settings.floor
        self.change_sigmas, self.order_tolerance = _floats(change_sigmas, order_tolerance)
        self.change_threshold, self.change_confirm = float(change_threshold), int(change_confirm)
        self.common_noise, self.equal_split_guard = bool(common_noise), bool(equal_split_guard)
        self.equal_split_margin = float(equal_split_margin)
        self.common_factor = 1.0
        """The common factor taken out of the last round's reports (1: none)."""
        self.last_allocation: dict[str, tuple[int, str]] = {}
        """Each silo's batch size and the reason it got it (:data:`ALLOCATION_REASONS`)
        in the last :meth:`allocate`."""
        self._table = SiloTable(self.model_settings)
        self._silos = self._table.models

    # ------------------------------------------------------------------ reports
    def report(self, silo_id: str, report: SiloReport) -> None:
        """Feed one silo's round report, judged alone (no slowdown shared with other
        silos is taken out: feed a whole round with :meth:`report_round`).

        Raises
        ------
        InvalidReportError
            If the report is unusable; the silo's state is then left unchanged.
        """
        report.validate()
        self._table.take_round({silo_id: report})

    def report_round(self, reports: Mapping[str, SiloReport]) -> dict[str, InvalidReportError]:
        """Feed one round's reports, the round's shared slowdown taken out of them
        (``common_noise``); return the unusable reports by silo (their silos' states are
        left unchanged), the others are fed."""
        silos, given = list(reports), list(reports.values())
        columns, bad = report_columns(given)
        errors = {silos[k]: err for k, err in bad.items()}
        if errors:
            silos = [silos[k] for k in columns.position.tolist()]
            given = [given[k] for k in columns.position.tolist()]
        table = self._table
        self.common_factor = table.take_columns(silos, given, columns, shared=self.common_noise)
        return errors

    def restart(self, silo_id: str) -> None:
        """Forget what a silo's reports taught its estimate and window, as after a
        confirmed change (shape and noise kept): for a report that held start-up rather
        than capacity (a first round, a rejoin). The allocation after its next report may
        move it as far as after a confirmed change. A silo not seen yet: nothing."""
        self._table.restart(silo_id)

    # ------------------------------------------------------------ predictions
    def warming_up(self) -> dict[str, tuple[int, int]]:
        """Silos whose estimator still predicts by its EMA warm-up (NARX before its first
        training, Sec. 3.2.2): silo id -> (reports so far, warm-up length)."""
        return self._table.warming_up()

    def predicted_speed(self, silo_id: str) -> float | None:
        """Predicted samples per second of a silo, ``None`` if it never reported."""
        return self._table.predict(silo_id)

    def cost_line(self, silo_id: str) -> tuple[float, float] | None:
        """The silo's cost line ``(a, b)`` as the linear allocator uses it (its smoothed
        ``fixed_time`` in b); ``None`` if it never reported or has no fit."""
        return self._table.cost_line(silo_id)

    def knee(self, silo_id: str) -> float:
        """Batch size up to which the silo's time is flat, as the allocator uses it (0: a
        line, or not known)."""
        return self._table.knee(silo_id)

    def predicted_round_time(self, sizes: Mapping[str, int]) -> float | None:
        """Predicted round time ``max_i a_i * max(B_i, k_i) + b_i`` of an allocation;
        ``None`` if a silo has no cost curve."""
        times = []
        for silo, x in sizes.items():
            line = self.cost_line(silo)
            if line is None:
                return None
            times.append(line[0] * max(x, self.knee(silo)) + line[1])
        return max(times) if times else None

    def fixed_time(self, silo_id: str) -> float | None:
        """Smoothed fixed per-round time of a silo (``he-time``), ``None`` if never reported."""
        return self._table.fixed_time(silo_id)

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
        held: Mapping[str, int] | None = None,
        caps: Mapping[str, int] | None = None,
    ) -> dict[str, int]:
        """Next batch size of each silo in ``silo_ids`` (:func:`~.allocation.allocate`),
        summing to ``total`` (``None``: ``n * B_init``) where the memory caps allow;
        independent of the order of ``silo_ids`` and listed in it. Why each silo got its
        size is in :attr:`last_allocation`.

        Parameters
        ----------
        silo_ids : iterable of str
            The silos of the round.
        total : int | None (default: None)
            The total X to split (a strategy passes the whole federation's when some silos
            are gone, so that the others take their share).
        weights, noise : Mapping[str, float] | None (default: None)
            Each silo's aggregation weight and gradient-noise variance (a silo missing:
            the median of the others'); ``None``: equal.
        budget : bool (default: True)
            ``False``: no noise budget (the noise does not depend on the split, e.g.
            gradients weighted by batch size in cluster mode).
        held : Mapping[str, int] | None (default: None)
            The sizes in force, when a gate held them: kept (reason ``held``).
        caps : Mapping[str, int] | None (default: None)
            Memory caps the caller learned (a silo that ran out of memory), beside those
            the silos report; a silo missing: no such cap.

        Raises
        ------
        ValueError
            On a total, weight or noise that is not positive.
        """
        order = list(dict.fromkeys(silo_ids))
        ids = sorted(order)
        decision: Decision = allocation.allocate(
            ids, self._table, self.allocation_settings, iterative=self._iterative,
            total=total, weights=per_silo(ids, weights, "weights"),
            noise=per_silo(ids, noise, "noise"), rho=self.noise_budget if budget else None,
            held=held,
            caps=None if not caps else [caps.get(i, float("inf")) for i in ids],
        )  # fmt: skip
        sizes, reasons = decision.sizes, decision.reasons
        given = list(map(sizes.__getitem__, order))
        why = map(reasons.__getitem__, order)
        self.last_allocation = dict(zip(order, zip(given, why, strict=True), strict=True))
        return dict(zip(order, given, strict=True))

    # ------------------------------------------------------------ serialisation
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (configuration and every silo's model)."""
        table = self._table
        return {
            "config": {
                name: getattr(self, name) for name in ("initial_batch_size", *BALANCER_DEFAULTS)
            },
            "iterative": self._iterative.state(),
            "pooled_shape": {"value": table.pooled_shape, "stale": table.shapes_changed},
            "silos": {silo: model.state() for silo, model in self._silos.items()},
        }

    def to_json(self) -> str:
        """Serialise the state to a JSON string."""
        return json.dumps(self.state_dict(), sort_keys=True)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> BatchSizeBalancer:
        """Rebuild a balancer from :meth:`state_dict`; settings missing from an older
        state take their defaults."""
        balancer = cls(**state["config"])
        table = balancer._table
        for silo, saved in state["silos"].items():
            table.register(str(silo), SiloModel.model_validate(saved))
        if "pooled_shape" in state:
            table.pooled_shape = float(state["pooled_shape"]["value"])
            table.shapes_changed = bool(state["pooled_shape"]["stale"])
        if "iterative" in state:
            balancer._iterative = IterativeStep.from_state(state["iterative"])
        return balancer

    @classmethod
    def from_json(cls, text: str) -> BatchSizeBalancer:
        """Rebuild a balancer from :meth:`to_json`."""
        return cls.from_state_dict(json.loads(text))


def _floats(*values: float | None) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)
