"""Speed estimators: predict every silo's sample-processing speed for the next round.

An estimator is an object from one registry (:data:`ESTIMATORS`): its settings are its
fields (``EMA(alpha=0.2)``, ``Last()``, ``ChangeAwareEMA(threshold=0.2)``,
``NARX(warmup=500)``), and the silos' state lives in columns it declares
(:meth:`SpeedEstimator.fresh`: one row per silo), which it updates for many silos at once
(:meth:`SpeedEstimator.update`) and predicts from (:meth:`SpeedEstimator.predict`). One
silo is a table of one row (:class:`Predictor`). Adding an estimator is one class with
``@register``. Strings with option dicts (the CLI's, a run config's) are parsed once, at
that boundary, by :func:`parse_estimator`.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.2.2 (last value, EMA, NARX in :mod:`.narx`) and Sec. 3.5 (EMA for
cross-silo FL). :class:`ChangeAwareEMA` is ours: an EMA that restarts at a change of
level confirmed by the one change detector (:mod:`.detector`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, MutableMapping
from typing import Any, ClassVar, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..registry import Registry
from .detector import new_runs, observe_run

__all__ = [
    "EMA",
    "ESTIMATORS",
    "ChangeAwareEMA",
    "Last",
    "MachineUse",
    "Predictor",
    "SpeedEstimator",
    "estimator_from_state",
    "parse_estimator",
    "register",
    "registered",
]

State = MutableMapping[str, np.ndarray]
"""An estimator's columns, by name: one row per silo."""

Alpha = Field(default=0.2, gt=0, le=1, allow_inf_nan=False)
"""An EMA's weight of the latest observation, in (0, 1]."""


class MachineUse(NamedTuple):
    """The machine's use during a round, per silo (percent; NaN: not measured)."""

    cpu: np.ndarray
    memory: np.ndarray


class SpeedEstimator(BaseModel, ABC):
    """An estimator of every silo's speed: its settings are the fields, its silos' state
    the columns of :meth:`fresh`.

    A subclass sets ``name`` (its key in :data:`ESTIMATORS`), and defines :meth:`update`;
    the others have defaults for a state of one column ``value`` (the prediction, NaN
    before any observation).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: ClassVar[str]
    uses_machine: ClassVar[bool] = False
    """Whether :meth:`update` reads the machine's use (else it is not gathered)."""

    def fresh(self, rows: int) -> dict[str, np.ndarray]:
        """The columns of ``rows`` silos never observed."""
        return {"value": np.full(rows, np.nan)}

    @abstractmethod
    def update(
        self, state: State, rows: np.ndarray, speeds: np.ndarray, use: MachineUse | None
    ) -> None:
        """Feed one speed (samples per second, positive) to each of ``rows`` (distinct),
        and the machine's use during its round where :attr:`uses_machine`."""

    def predict(self, state: State, rows: np.ndarray) -> np.ndarray:
        """The predicted speeds of ``rows`` (NaN: no observation yet)."""
        out: np.ndarray = state["value"][rows]
        return out

    def restart(self, state: State, rows: np.ndarray) -> None:
        """Forget what ``rows`` observed."""
        for name, values in self.fresh(len(rows)).items():
            state[name][rows] = values

    def silo_state(self, state: State, row: int) -> dict[str, Any]:
        """Row ``row``'s state as JSON (with the settings), read back by :meth:`load`."""
        value = float(state["value"][row])
        return {"name": self.name, **self.model_dump(), "value": _none(value)}

    def load(self, state: State, row: int, saved: Mapping[str, Any]) -> None:
        """Put a :meth:`silo_state` into row ``row``."""
        value = saved.get("value")
        state["value"][row] = math.nan if value is None else _speed(value)

    def warming_up(self, state: State, row: int) -> tuple[int, int] | None:
        """``(observations, warm-up)`` of a silo still in a warm-up; ``None``: none."""
        return None


ESTIMATORS: Registry[SpeedEstimator] = Registry("speed estimator")
"""Every estimator by name."""
register = ESTIMATORS.register
"""Add an estimator class to :data:`ESTIMATORS` under its ``name`` (a decorator)."""
registered = ESTIMATORS.registered
""":func:`register` a class for the duration of a ``with`` block."""


@register
class Last(SpeedEstimator):
    """Memoryless predictor: the next speed is the last one observed.

    Reference: Chen et al., IEEE TCC 2021, Sec. 3.2.2 and Table 3 ("memoryless").
    """

    name = "last"

    def update(
        self, state: State, rows: np.ndarray, speeds: np.ndarray, use: MachineUse | None
    ) -> None:
        """The last speed observed."""
        state["value"][rows] = speeds


@register
class EMA(SpeedEstimator):
    """Exponential moving average of the observed speed.

    ``v_hat <- alpha * v + (1 - alpha) * v_hat``; the first observation initialises it.

    Parameters
    ----------
    alpha : float (default: 0.2)
        Weight of the latest observation, in (0, 1]. ``alpha=1`` is the last value.

    Reference: Chen et al., IEEE TCC 2021, Sec. 3.5 and Table 3 (EMA, alpha = 0.2).
    """

    name = "ema"
    alpha: float = Alpha

    def update(
        self, state: State, rows: np.ndarray, speeds: np.ndarray, use: MachineUse | None
    ) -> None:
        """Blend each speed into its silo's average."""
        value, alpha = state["value"], self.alpha
        old = value[rows]
        value[rows] = np.where(np.isnan(old), speeds, alpha * speeds + (1.0 - alpha) * old)


@register
class ChangeAwareEMA(SpeedEstimator):
    """EMA that restarts at a confirmed change of level and ignores transient spikes.

    While observations stay within ``threshold`` (relative) of the average it is the
    EMA with weight ``alpha``. An observation further away is held back, and the average
    is left as it is; once ``confirm`` observations in a row lie beyond the threshold on
    the same side, the average restarts at their mean (a co-tenant arrived or left). A
    deviation that is not confirmed (a spike) never enters the average. ``confirm=1``
    restarts at every large deviation. The test is the one change detector
    (:func:`~fl_lbbsp.core.silo.detector.observe_run`) on relative deviations, with a run
    of ``confirm`` (no CUSUM).

    It targets what EMA(0.2) is worst at on a non-dedicated machine: after a step change
    of speed an EMA needs about ``1 / alpha`` observations to catch up, a last-value
    predictor follows every spike; this one lags ``confirm`` observations behind a step
    and ignores shorter bursts.

    Parameters
    ----------
    alpha : float (default: 0.2)
        Weight of the latest observation in the EMA, in (0, 1].
    threshold : float (default: 0.2)
        Relative deviation ``|v - average| / average`` beyond which an observation counts
        as a possible change; set it above the speed's usual noise.
    confirm : int (default: 2)
        Observations in a row beyond the threshold, on the same side, that confirm a
        change.

    Reference: change-point detection with a restart of the smoother, in the spirit of
    Page, "Continuous inspection schemes", Biometrika 41 (1954) (CUSUM), applied to the
    EMA speed predictor of Chen et al., IEEE TCC 2021, Sec. 3.5; the spike robustness is
    the behaviour Sec. 5.4.1 (Fig. 11) credits NARX with.
    """

    name = "change-ema"
    alpha: float = Alpha
    threshold: float = Field(default=0.2, gt=0, allow_inf_nan=False)
    confirm: int = Field(default=2, ge=1)

    def fresh(self, rows: int) -> dict[str, np.ndarray]:
        """The average and the run of held observations."""
        return {"value": np.full(rows, np.nan), **new_runs(rows, self.confirm)}

    def update(
        self, state: State, rows: np.ndarray, speeds: np.ndarray, use: MachineUse | None
    ) -> None:
        """Blend each speed into its average, hold it back as a possible change, or
        restart the average at a confirmed change."""
        value = state["value"]
        old = value[rows]
        first = np.isnan(old)
        value[rows[first]] = speeds[first]
        seen = ~first
        r, v, old = rows[seen], speeds[seen], old[seen]
        if not r.size:
            return
        deviation = (v - old) / old
        held = np.abs(deviation) > self.threshold
        zeros = np.zeros(r.size)
        confirmed = observe_run(
            state, r, (zeros, zeros, v, deviation), held, limit=self.threshold, floor=0.0,
            confirm=self.confirm,
        )  # fmt: skip
        n = state["n"][r]
        inside = np.arange(self.confirm) < n[:, None]
        with np.errstate(all="ignore"):
            mean = np.where(inside, state["speed"][r], 0.0).sum(axis=1) / n
        blended = np.where(held, old, self.alpha * v + (1.0 - self.alpha) * old)
        value[r] = np.where(confirmed, mean, blended)
        state["n"][r[confirmed]] = 0

    def silo_state(self, state: State, row: int) -> dict[str, Any]:
        """The average and the held observations not confirmed yet (``pending``)."""
        n = int(state["n"][row])
        held = state["held"][row, :n].tolist()
        trailing = next((k for k in range(n) if all(held[k:])), n)
        pending = state["speed"][row, trailing:n].tolist()
        return {**super().silo_state(state, row), "pending": pending}

    def load(self, state: State, row: int, saved: Mapping[str, Any]) -> None:
        """The average and its pending observations (their deviations from it)."""
        super().load(state, row, saved)
        pending = [_speed(v) for v in saved.get("pending", ())]
        if len(pending) >= self.confirm:
            raise ValueError(f"{len(pending)} pending observations, confirm is {self.confirm}")
        value = float(state["value"][row])
        n = len(pending)
        state["speed"][row, :n] = pending
        state["dev"][row, :n] = [(v - value) / value for v in pending]
        state["held"][row, :n] = True
        state["n"][row] = n


def parse_estimator(
    name: str, *, alpha: float = 0.2, options: Mapping[str, Any] | None = None
) -> SpeedEstimator:
    """The estimator ``name`` of :data:`ESTIMATORS` with ``options`` (and ``alpha``, where
    it has one): the boundary where a CLI's or a run config's strings become an object.

    Raises
    ------
    ValueError
        On an unknown name or a bad option (one line naming it).
    """
    fields = dict(options or {})
    if "alpha" in ESTIMATORS.lookup(name).model_fields:
        fields.setdefault("alpha", alpha)
    return ESTIMATORS.build(name, fields)


def estimator_from_state(saved: Mapping[str, Any]) -> SpeedEstimator:
    """The estimator of a :meth:`SpeedEstimator.silo_state` (its settings)."""
    cls = ESTIMATORS.lookup(saved.get("name"))
    return cls(**{k: saved[k] for k in cls.model_fields if k in saved})


class Predictor:
    """One silo's predictor: an estimator over a table of one row.

    Parameters
    ----------
    estimator : SpeedEstimator
        The estimator.
    """

    def __init__(self, estimator: SpeedEstimator) -> None:
        self.estimator = estimator
        self.columns = estimator.fresh(1)
        self._row = np.zeros(1, dtype=np.intp)

    def update(
        self, speed: float, *, cpu_percent: float | None = None,
        memory_percent: float | None = None,
    ) -> None:  # fmt: skip
        """Feed the speed of a round (samples per second, finite and positive) and the
        machine's CPU and memory use during it (percent; ``None``: not measured)."""
        use = MachineUse(_unknown(cpu_percent), _unknown(memory_percent))
        self.estimator.update(self.columns, self._row, np.array([_speed(speed)]), use)

    def predict(self) -> float | None:
        """The predicted speed of the next round (``None``: no observation yet)."""
        return _none(float(self.estimator.predict(self.columns, self._row)[0]))

    def state(self) -> dict[str, Any]:
        """The state as JSON (:meth:`SpeedEstimator.silo_state`)."""
        return self.estimator.silo_state(self.columns, 0)

    @classmethod
    def from_state(cls, saved: Mapping[str, Any]) -> Predictor:
        """Rebuild from :meth:`state`."""
        predictor = cls(estimator_from_state(saved))
        predictor.estimator.load(predictor.columns, 0, saved)
        return predictor


def _speed(speed: object) -> float:
    value = float(speed) if isinstance(speed, int | float | np.number) else math.nan
    if isinstance(speed, bool) or not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"speed must be a finite positive number, got {speed!r}")
    return value


def _none(value: float) -> float | None:
    return None if math.isnan(value) else value


def _unknown(value: float | None) -> np.ndarray:
    return np.array([math.nan if value is None else float(value)])
