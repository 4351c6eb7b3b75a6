"""One silo's model as a record: the checkpoint form of a row of the silo table.

The balancer keeps every silo's state in the columns of one table
(:class:`~fl_lbbsp.core.silo.model.SiloTable`); a :class:`SiloModel` is one silo's
state taken out of it (its estimator, history window, change detector's run, cost fit)
as objects, to save (:meth:`SiloModel.state`, the balancer's checkpoint format) and to
restore (:meth:`SiloModel.from_state`, put back with
:meth:`~fl_lbbsp.core.silo.model.SiloTable.register`).

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 4 (the BatchSizeManager's per-worker state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from .costfit import CostFit

__all__ = ["Observation", "SiloModel"]


class Observation(NamedTuple):
    """One report in a silo's history window."""

    batch_size: int
    time: float


@dataclass
class SiloModel:
    """What the balancer knows of one silo.

    Parameters
    ----------
    estimator : dict
        Its speed estimator's state
        (:meth:`~fl_lbbsp.core.silo.estimators.SpeedEstimator.silo_state`).
    history : list of Observation
        The window of recent normal reports, for the cost fit.
    pending : list of list
        The change detector's run of reports deviating to the same side, each
        ``[batch size, time, speed, deviation, held]``.
    max_batch_size : int | None (default: None)
        Its reported memory cap.
    steps : float (default: 1.0)
        Local steps per round (samples / batch size) of its last report.
    fixed_time : float | None (default: None)
        Smoothed fixed per-round seconds (``he-time``).
    last : dict (default: {})
        Its last report's fields.
    reports : int (default: 0)
        Reports taken.
    shape : float | None (default: None)
        Fixed cost in samples (b / a) of its last fit, once its own batch sizes identified
        it; kept across a change (a co-tenant scales a and b alike).
    noise : float | None (default: None)
        Robust relative residual scale of its last fit with enough reports.
    boost : float (default: 1.0)
        Level ratio of a change confirmed by its last report (widens its change limit).
    fit : CostFit | None (default: None)
        Its last robust fit.
    knee : float (default: 0.0)
        Batch size up to which its time is flat (0: none), kept across a change.
    index : int (default: 0)
        Its row in the :class:`SiloTable`.
    """

    estimator: dict[str, Any]
    history: list[Observation]
    pending: list[list[Any]] = field(default_factory=list)
    max_batch_size: int | None = None
    steps: float = 1.0
    fixed_time: float | None = None
    last: dict[str, Any] = field(default_factory=dict)
    reports: int = 0
    shape: float | None = None
    noise: float | None = None
    boost: float = 1.0
    fit: CostFit | None = None
    knee: float = 0.0
    index: int = 0

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state (the balancer's checkpoint format)."""
        return {
            "estimator": self.estimator,
            "history": [list(pair) for pair in self.history],
            "max_batch_size": self.max_batch_size,
            "steps": self.steps,
            "fixed_time": self.fixed_time,
            "last": self.last,
            "reports": self.reports,
            "shape": self.shape,
            "noise": self.noise,
            "pending": self.pending,
            "boost": self.boost,
            "fit": None if self.fit is None else _fit_state(self.fit),
            "knee": self.knee,
        }

    @classmethod
    def from_state(cls, saved: Mapping[str, Any]) -> SiloModel:
        """Rebuild from :meth:`state`; fields missing from an older state take defaults
        (a pending report without its ``held`` flag: held)."""
        pending = [
            [int(p[0]), float(p[1]), float(p[2]), float(p[3]), bool(p[4]) if len(p) > 4 else True]
            for p in saved.get("pending", [])
        ]
        return cls(
            estimator=dict(saved["estimator"]),
            history=[Observation(int(x), float(t)) for x, t in saved["history"]],
            pending=pending,
            max_batch_size=saved["max_batch_size"],
            steps=float(saved["steps"]),
            fixed_time=saved.get("fixed_time"),
            last=dict(saved.get("last", {})),
            reports=int(saved.get("reports", len(saved["history"]))),
            shape=_optional_float(saved.get("shape")),
            noise=_optional_float(saved.get("noise")),
            boost=float(saved.get("boost", 1.0)),
            fit=None if saved.get("fit") is None else _fit_from_state(saved["fit"]),
            knee=float(saved.get("knee") or 0.0),
        )


def _fit_state(fit: CostFit) -> dict[str, Any]:
    """A cost fit as JSON (NaN noise as null)."""
    state = asdict(fit)
    state["noise"] = None if math.isnan(fit.noise) else fit.noise
    state["spread"] = list(fit.spread)
    return state


def _fit_from_state(state: Mapping[str, Any]) -> CostFit:
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
