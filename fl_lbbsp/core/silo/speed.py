"""The basic speed estimators: the protocol, the last value and the EMA.

Split from :mod:`.estimators` so that the NARX predictor (:mod:`.narx`, which falls back
to an EMA during its warm-up) and the estimator factory import them without a cycle.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.2.2 (last value, EMA) and Sec. 3.5 (EMA for cross-silo FL).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, TypedDict, Unpack, runtime_checkable

__all__ = ["EMAEstimator", "LastValueEstimator", "MachineUse", "SpeedEstimator", "check_speed"]


def check_speed(speed: float) -> float:
    value = float(speed)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"speed must be a finite positive number, got {speed!r}")
    return value


class MachineUse(TypedDict, total=False):
    """The machine's use during a round, the keywords of :meth:`SpeedEstimator.update`
    after the speed (read by predictors that model it, ignored by the others).

    Parameters
    ----------
    cpu_percent : float | None
        CPU use in percent; ``None`` or absent: not measured.
    memory_percent : float | None
        Memory use in percent; ``None`` or absent: not measured.
    """

    cpu_percent: float | None
    memory_percent: float | None


@runtime_checkable
class SpeedEstimator(Protocol):
    """Protocol of a per-silo speed predictor."""

    name: str

    def update(self, speed: float, **use: Unpack[MachineUse]) -> None:
        """Record the speed (samples per second) observed in the last round, and the
        machine's CPU and memory use during it (:class:`MachineUse`; used by predictors
        that model them)."""

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
        self._value = None if value is None else check_speed(value)

    def update(self, speed: float, **use: Unpack[MachineUse]) -> None:
        """Record the speed observed in the last round (CPU and memory are ignored)."""
        self._value = check_speed(speed)

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
        self._value = None if value is None else check_speed(value)

    def update(self, speed: float, **use: Unpack[MachineUse]) -> None:
        """Blend the speed observed in the last round into the average (CPU and memory
        are ignored)."""
        value = check_speed(speed)
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
