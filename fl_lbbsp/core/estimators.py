"""Speed estimators: predict a silo's sample-processing speed for the next round.

Every estimator follows :class:`SpeedEstimator`: ``update`` with the speed observed in a
round (samples per second), ``predict`` the speed of the next one. The state of each is a
small JSON-able dict so the balancer can checkpoint and resume.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.2.2 (last value, EMA, NARX in :mod:`.narx`) and Sec. 3.5 (EMA for
cross-silo FL).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ESTIMATORS",
    "EMAEstimator",
    "LastValueEstimator",
    "SpeedEstimator",
    "estimator_from_state",
    "make_estimator",
]


def _check_speed(speed: float) -> float:
    value = float(speed)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"speed must be a finite positive number, got {speed!r}")
    return value


@runtime_checkable
class SpeedEstimator(Protocol):
    """Protocol of a per-silo speed predictor."""

    name: str

    def update(
        self,
        speed: float,
        *,
        cpu_percent: float | None = None,
        memory_percent: float | None = None,
    ) -> None:
        """Record the speed (samples per second) observed in the last round, and the
        machine's CPU and memory use during it (used by predictors that model them)."""

    def predict(self) -> float | None:
        """Predicted speed for the next round, ``None`` before any observation."""

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state, restored by :func:`estimator_from_state`."""


class LastValueEstimator:
    """Memoryless predictor: the next speed is the last one observed.

    Reference: Chen et al., IEEE TCC 2021, Sec. 3.2.2 and Table 3 ("memoryless").
    """

    name = "last"

    def __init__(self, *, value: float | None = None) -> None:
        self._value = None if value is None else _check_speed(value)

    def update(
        self,
        speed: float,
        *,
        cpu_percent: float | None = None,
        memory_percent: float | None = None,
    ) -> None:
        """Record the speed observed in the last round (CPU and memory are ignored)."""
        self._value = _check_speed(speed)

    def predict(self) -> float | None:
        """Return the last observed speed."""
        return self._value

    def state(self) -> dict[str, Any]:
        """Return the JSON-serialisable state."""
        return {"name": self.name, "value": self._value}


class EMAEstimator:
    """Exponential moving average of the observed speed.

    ``v_hat <- alpha * v + (1 - alpha) * v_hat``; the first observation initialises it.

    Parameters
    ----------
    alpha : float (default: 0.2)
        Weight of the latest observation, in (0, 1]. ``alpha=1`` is the last value.
    value : float | None (default: None)
        Current average, to resume from a checkpoint.

    Reference: Chen et al., IEEE TCC 2021, Sec. 3.5 and Table 3 (EMA, alpha = 0.2).
    """

    name = "ema"

    def __init__(self, *, alpha: float = 0.2, value: float | None = None) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self._value = None if value is None else _check_speed(value)

    def update(
        self,
        speed: float,
        *,
        cpu_percent: float | None = None,
        memory_percent: float | None = None,
    ) -> None:
        """Blend the speed observed in the last round into the average (CPU and memory
        are ignored)."""
        value = _check_speed(speed)
        if self._value is None:
            self._value = value
        else:
            self._value = self.alpha * value + (1.0 - self.alpha) * self._value

    def predict(self) -> float | None:
        """Return the moving average, ``None`` before any observation."""
        return self._value

    def state(self) -> dict[str, Any]:
        """Return the JSON-serialisable state."""
        return {"name": self.name, "alpha": self.alpha, "value": self._value}


ESTIMATORS = ("ema", "last", "narx")


def make_estimator(
    name: str, *, alpha: float = 0.2, options: dict[str, Any] | None = None
) -> SpeedEstimator:
    """Build an estimator by name.

    Parameters
    ----------
    name : str
        ``"ema"``, ``"last"`` or ``"narx"``.
    alpha : float (default: 0.2)
        EMA weight of the latest observation (``"ema"``, and ``"narx"`` before warm-up).
    options : dict | None (default: None)
        Extra keyword arguments of the estimator (for ``"narx"``: ``warmup``, ``hidden``,
        ...; see :class:`~fl_lbbsp.core.narx.NARXEstimator`).
    """
    extra = dict(options or {})
    if name == "ema":
        return EMAEstimator(alpha=alpha, **extra)
    if name == "last":
        return LastValueEstimator(**extra)
    if name == "narx":
        from .narx import NARXEstimator

        return NARXEstimator(alpha=alpha, **extra)
    raise ValueError(f"unknown speed estimator {name!r}; expected one of {ESTIMATORS}")


def estimator_from_state(state: dict[str, Any]) -> SpeedEstimator:
    """Rebuild an estimator from :meth:`SpeedEstimator.state`."""
    value = state.get("value")
    if state["name"] == "ema":
        return EMAEstimator(alpha=float(state["alpha"]), value=value)
    if state["name"] == "last":
        return LastValueEstimator(value=value)
    if state["name"] == "narx":
        from .narx import NARXEstimator

        return NARXEstimator.from_state(state)
    raise ValueError(f"unknown speed estimator {state['name']!r} in saved state")
