"""The balancer: LB-BSP's BatchSizeManager, keyed by a stable silo id.

A small facade over the parts: each round the strategy passes every silo's report
(:class:`~fl_lbbsp.core.silo.reports.SiloReport`) to :meth:`BatchSizeBalancer.report_round`,
which takes the round's shared slowdown out (:func:`~fl_lbbsp.core.slowdown.shared_slowdown`)
and feeds each silo's model (:mod:`.silo.model`: estimator, history window, cost fit,
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
from .allocation.pipeline import Decision, per_silo
from .settings import BALANCER_DEFAULTS, BalancingKnobs
from .silo.model import SiloModel, SiloTable
from .silo.reports import InvalidReportError, SiloReport, check_positive_int, report_columns

__all__ = [
    "BALANCER_DEFAULTS",
    "BatchSizeBalancer",
    "InvalidReportError",
    "SiloReport",
]


class BatchSizeBalancer:
    """Per-silo speed prediction and batch-size allocation (the BatchSizeManager).

    Parameters
    ----------
    initial_batch_size : int
        B_init: every silo's batch size before any report; ``X = n * B_init``.
    knobs : BalancingKnobs | None (default: None)
        The noise budget, the batch-size bounds and the
        :class:`~fl_lbbsp.core.settings.Tuning` (estimator, allocator, fits, change
        detection, guards), each documented where it is declared and in docs/balancing.md;
        a strategy's :class:`~fl_lbbsp.core.settings.BalancingConfig` is one. ``None``: the
        defaults.

    Raises
    ------
    ValueError
        If ``initial_batch_size`` is not a positive integer.
    """

    def __init__(self, *, initial_batch_size: int, knobs: BalancingKnobs | None = None) -> None:
        check_positive_int("initial_batch_size", initial_batch_size)
        self.initial_batch_size = int(initial_batch_size)
        self.knobs = knobs or BalancingKnobs()
        self.tuning = t = self.knobs.tuning
        self.floor = self.knobs.floor(self.initial_batch_size)
        """The hard floor of every batch size (:meth:`BalancingKnobs.floor`)."""
        self.noise_budget = self.knobs.noise_budget
        self.speed_estimator = t.speed_estimator()
        """The speed estimator (:meth:`~fl_lbbsp.core.settings.Tuning.speed_estimator`)."""
        self.allocator = t.batch_allocator()
        """The allocator (:meth:`~fl_lbbsp.core.settings.Tuning.batch_allocator`)."""
        self._allocation = self.allocator.start()
        self.common_factor = 1.0
        """The common factor taken out of the last round's reports (1: none)."""
        self.last_allocation: dict[str, tuple[int, str]] = {}
        """Each silo's batch size and the reason it got it
        (:data:`~.allocation.pipeline.ALLOCATION_REASONS`) in the last :meth:`allocate`."""
        wls = self.allocator.fits_lines and t.fit == "wls"
        self._table = SiloTable(t, estimator=self.speed_estimator, wls=wls)
        self._silos = self._table.models

    def report(self, silo_id: str, report: SiloReport) -> None:
        """Feed one silo's round report, judged alone (no slowdown shared with other
        silos is taken out: feed a whole round with :meth:`report_round`).

        Raises
        ------
        InvalidReportError
            If the report is unusable; the silo's state is then left unchanged.
        """
        columns, errors = report_columns([report])
        if errors:
            raise errors[0]
        self._table.take_columns([silo_id], [report], columns)

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
        shared = self.tuning.common_noise
        self.common_factor = table.take_columns(silos, given, columns, shared=shared)
        return errors

    def restart(self, silo_id: str) -> None:
        """Forget what a silo's reports taught its estimate and window, as after a
        confirmed change (shape and noise kept): for a report that held start-up rather
        than capacity (a first round, a rejoin). The allocation after its next report may
        move it as far as after a confirmed change. A silo not seen yet: nothing."""
        self._table.restart(silo_id)

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
            ids, self._table, self.knobs, self.allocator,
            initial_batch_size=self.initial_batch_size, state=self._allocation,
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

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (configuration and every silo's model)."""
        table = self._table
        knobs = self.knobs.model_dump(mode="json", include=set(BalancingKnobs.model_fields))
        saved = self.allocator.save(self._allocation)
        return {
            "config": {"initial_batch_size": self.initial_batch_size, **knobs},
            **({} if saved is None else {"iterative": saved}),
            "pooled_shape": {"value": table.pooled_shape, "stale": table.shapes_changed},
            "silos": {silo: model.state() for silo, model in self._silos.items()},
        }

    def to_json(self) -> str:
        """Serialise the state to a JSON string."""
        return json.dumps(self.state_dict(), sort_keys=True)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> BatchSizeBalancer:
        """Rebuild a balancer from :meth:`state_dict`; settings missing from an older
        state take their defaults (an older state's flat tuning knobs join ``tuning``)."""
        config = dict(state["config"])
        b_init = config.pop("initial_batch_size")
        balancer = cls(initial_batch_size=b_init, knobs=BalancingKnobs.model_validate(config))
        table = balancer._table
        for silo, saved in state["silos"].items():
            table.register(str(silo), SiloModel.model_validate(saved))
        if "pooled_shape" in state:
            table.pooled_shape = float(state["pooled_shape"]["value"])
            table.shapes_changed = bool(state["pooled_shape"]["stale"])
        if state.get("iterative") is not None:  # the allocator's (Alg. 2's, by its old key)
            balancer._allocation = balancer.allocator.load(state["iterative"])
        return balancer

    @classmethod
    def from_json(cls, text: str) -> BatchSizeBalancer:
        """Rebuild a balancer from :meth:`to_json`."""
        return cls.from_state_dict(json.loads(text))
