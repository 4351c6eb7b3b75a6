"""One silo's model as a record: the state a row of the silo table saves and restores.

The balancer keeps every silo's state in the columns of one table
(:class:`~fl_lbbsp.core.silo.model.SiloTable`); a :class:`SiloModel` is one silo's
state taken out of it (its estimator, history window, change detector's run, cost fit).
It is at once what :meth:`~fl_lbbsp.core.balancer.BatchSizeBalancer.state_dict` holds for
the silo (:meth:`SiloModel.state`) and the checkpoint's schema of it (a checkpoint's silo
is validated by :meth:`SiloModel.model_validate`, with the bounds below), and it is put
back into the table by :meth:`~fl_lbbsp.core.silo.model.SiloTable.register`. Adding a
scalar field is one edit here: a field marked :class:`Column` is a column of the table of
its own name (:mod:`.columns` reads the marks). Known fields are validated, unknown ones
kept (later versions may add state).

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 4 (the BatchSizeManager's per-worker state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .estimators import ESTIMATORS

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_ENTRIES",
    "Batch",
    "Column",
    "Count",
    "EstimatorState",
    "FitState",
    "LastReport",
    "Observation",
    "OpenRecord",
    "Seconds",
    "SiloModel",
]

MAX_BATCH_SIZE = 10_000_000
"""Largest batch size a state may hold (a sanity bound, far above any real one)."""
MAX_SPEED = 1e15
"""Largest speed (samples per second) a state may hold; the smallest is its inverse."""
MAX_COUNT = 10**9
"""Largest count (reports, steps, versions) a state may hold."""
MAX_ENTRIES = 100_000
"""Longest list (history, pending reports, overheads) a state may hold."""
MAX_SECONDS = 1e7
"""Longest time (a round, an overhead: 115 days) a state may hold."""

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False, strict=True)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
Speed = Annotated[float, Field(ge=1 / MAX_SPEED, le=MAX_SPEED, allow_inf_nan=False, strict=True)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE, strict=True)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]
Entry = tuple[
    Batch, Seconds, Speed, Annotated[float, Field(allow_inf_nan=False, strict=True)],
    Annotated[bool, Field(strict=True)],
]  # fmt: skip
"""An entry of the change detector's run: batch size, time, speed, deviation, held."""


@dataclass(frozen=True, kw_only=True)
class Column:
    """Marks a scalar field of :class:`SiloModel` as a silo-table column of its name, of
    ``kind`` (``int``, ``float``); a new row holds the field's default (``None``: NaN)."""

    kind: type[int] | type[float]


class Observation(NamedTuple):
    """One report in a silo's history window."""

    batch_size: int
    time: float


class OpenRecord(BaseModel):
    """Known fields validated, unknown ones kept."""

    model_config = ConfigDict(extra="allow")


class EstimatorState(OpenRecord):
    """A silo's speed estimator
    (:meth:`~fl_lbbsp.core.silo.estimators.SpeedEstimator.silo_state`): its name, the
    current speed (samples per second) and, where the estimator has them, its smoothing
    and held-back observations."""

    name: str
    value: Speed | None = None
    alpha: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False, strict=True)
    pending: list[Speed] | None = Field(default=None, max_length=MAX_ENTRIES)

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        ESTIMATORS.lookup(value)
        return value


class LastReport(OpenRecord):
    """The last report the balancer took from a silo (empty before its first)."""

    batch_size: int = Field(default=0, ge=0, le=MAX_BATCH_SIZE, strict=True)
    train_time: Seconds = 0.0
    samples: float = Field(default=0.0, ge=0, allow_inf_nan=False, strict=True)


class FitState(OpenRecord):
    """A silo's cost curve ``t = slope * max(x, knee) + intercept`` (see
    :class:`~fl_lbbsp.core.silo.costfit.CostFit`)."""

    slope: Positive
    intercept: Seconds
    anchor: Positive
    level: Positive
    noise: Seconds | None = None
    weight: float = Field(ge=0, le=1, allow_inf_nan=False, strict=True)
    spread: tuple[Positive, Positive]
    knee: Seconds = 0.0

    @model_validator(mode="after")
    def _ordered(self) -> FitState:
        low, high = self.spread
        if low > high or high > MAX_BATCH_SIZE:
            raise ValueError(f"spread {[low, high]} is not 0 < low <= high <= {MAX_BATCH_SIZE}")
        return self


class SiloModel(OpenRecord):
    """What the balancer knows of one silo.

    Parameters
    ----------
    estimator : EstimatorState
        Its speed estimator's state.
    history : list of (int, float) (default: [])
        The window of recent normal reports (batch size, seconds), for the cost fit.
    max_batch_size : int | None (default: None)
        Its reported memory cap.
    steps : float (default: 1.0)
        Local steps per round (samples / batch size) of its last report.
    fixed_time : float | None (default: None)
        Smoothed fixed per-round seconds (``he-time``).
    last : LastReport | None (default: None)
        Its last report's fields.
    reports : int (default: 0)
        Reports taken.
    shape : float | None (default: None)
        Fixed cost in samples (b / a) of its last fit, once its own batch sizes identified
        it; kept across a change (a co-tenant scales a and b alike).
    noise : float | None (default: None)
        Robust relative residual scale of its last fit with enough reports.
    pending : list of (int, float, float, float, bool) (default: [])
        The change detector's run, each ``[batch size, time, speed, deviation, held]``
        (an older entry without ``held``: held).
    boost : float (default: 1.0)
        Level ratio of a change confirmed by its last report (widens its change limit).
    fit : FitState | None (default: None)
        Its last robust fit.
    knee : float (default: 0.0)
        Batch size up to which its time is flat (0: none), kept across a change.
    """

    estimator: EstimatorState
    history: list[tuple[Batch, Seconds]] = Field(default_factory=list, max_length=MAX_ENTRIES)
    max_batch_size: Annotated[Batch | None, Column(kind=int)] = None
    steps: Annotated[float, Column(kind=float)] = Field(
        default=1.0, gt=0, le=MAX_BATCH_SIZE, allow_inf_nan=False, strict=True
    )
    fixed_time: Annotated[Seconds | None, Column(kind=float)] = None
    last: LastReport | None = None
    reports: Annotated[Count, Column(kind=int)] = 0
    shape: Annotated[Seconds | None, Column(kind=float)] = None
    noise: Annotated[Seconds | None, Column(kind=float)] = None
    pending: list[Entry] = Field(default_factory=list, max_length=MAX_ENTRIES)
    boost: Annotated[Positive, Column(kind=float)] = 1.0
    fit: FitState | None = None
    knee: Annotated[float, Column(kind=float)] = Field(
        default=0.0, ge=0, le=MAX_BATCH_SIZE, allow_inf_nan=False
    )

    @field_validator("pending", mode="before")
    @classmethod
    def _held(cls, value: Any) -> Any:
        """An older entry, without its held-back flag, was held."""
        if not isinstance(value, list):
            return value
        return [[*e, True] if isinstance(e, list | tuple) and len(e) == 4 else e for e in value]

    def state(self) -> dict[str, Any]:
        """The JSON form (what a checkpoint holds; the fields given, no defaults added)."""
        return self.model_dump(mode="json", exclude_unset=True)
