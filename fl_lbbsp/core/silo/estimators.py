"""Speed estimators: predict a silo's sample-processing speed for the next round.

Every estimator follows :class:`SpeedEstimator`: ``update`` with the speed observed in a
round (samples per second), ``predict`` the speed of the next one. The state of each is a
small JSON-able dict so the balancer can checkpoint and resume.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated Environments",
IEEE TCC 2021, Sec. 3.2.2 (last value, EMA, NARX in :mod:`.narx`) and Sec. 3.5 (EMA for
cross-silo FL). :class:`ChangeAwareEMAEstimator` is ours: an EMA that restarts at a
confirmed change of level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Unpack

from .change import ChangeDetector, Deviation
from .speed import EMAEstimator, LastValueEstimator, MachineUse, SpeedEstimator, check_speed

__all__ = [
    "ESTIMATORS",
    "ChangeAwareEMAEstimator",
    "EMAEstimator",
    "LastValueEstimator",
    "MachineUse",
    "SpeedEstimator",
    "estimator_from_state",
    "make_estimator",
]


class ChangeAwareEMAEstimator:
    """EMA that restarts at a confirmed change of level and ignores transient spikes.

    While observations stay within ``threshold`` (relative) of the average it is the
    EMA with weight ``alpha``. An observation further away is held back, and the average
    is left as it is; once ``confirm`` observations in a row lie beyond the threshold on
    the same side, the average restarts at their mean (a co-tenant arrived or left). A
    deviation that is not confirmed (a spike) never enters the average. ``confirm=1``
    restarts at every large deviation. The test is the balancer's own change detector
    (:class:`~fl_lbbsp.core.silo.change.ChangeDetector`) on relative deviations, without its
    CUSUM test.

    It targets what EMA(0.2) is worst at on a non-dedicated machine: after a step change
    of speed an EMA needs about ``1 / alpha`` observations to catch up, a last-value
    predictor follows every spike; this one lags ``confirm`` observations behind a step
    and ignores shorter bursts, at the cost of a few comparisons per update.

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
    value : float | None (default: None)
        Current average, to resume from a checkpoint.
    pending : sequence of float (default: ())
        Deviating observations not confirmed yet, to resume from a checkpoint.

    Reference: change-point detection with a restart of the smoother, in the spirit of
    Page, "Continuous inspection schemes", Biometrika 41 (1954) (CUSUM), applied to the
    EMA speed predictor of Chen et al., IEEE TCC 2021, Sec. 3.5; the spike robustness is
    the behaviour Sec. 5.4.1 (Fig. 11) credits NARX with.
    """

    name = "change-ema"

    def __init__(
        self,
        *,
        alpha: float = 0.2,
        threshold: float = 0.2,
        confirm: int = 2,
        value: float | None = None,
        pending: Sequence[float] = (),
    ) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int | float)
            or not math.isfinite(threshold)
            or threshold <= 0
        ):
            raise ValueError(f"threshold must be a finite positive number, got {threshold!r}")
        if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 1:
            raise ValueError(f"confirm must be an integer >= 1, got {confirm!r}")
        self.alpha = float(alpha)
        self.threshold = float(threshold)
        self.confirm = confirm
        self._value = None if value is None else check_speed(value)
        held = [check_speed(v) for v in pending]
        if len(held) >= confirm:
            raise ValueError(f"{len(held)} pending observations, confirm is {confirm}")
        self._detector = ChangeDetector(confirm=confirm, window=confirm, cusum=False)
        self._detector.run = [Deviation(0, 0.0, v, self._deviation(v), True) for v in held]

    def _deviation(self, speed: float) -> float:
        """Relative deviation of ``speed`` from the average (0 before any)."""
        return 0.0 if self._value is None else (speed - self._value) / self._value

    def update(self, speed: float, **use: Unpack[MachineUse]) -> None:
        """Blend the speed into the average, hold it back as a possible change, or
        restart the average at a confirmed change (CPU and memory are ignored)."""
        value = check_speed(speed)
        if self._value is None:
            self._value = value
            return
        deviation = self._deviation(value)
        entry = Deviation(0, 0.0, value, deviation, abs(deviation) > self.threshold)
        verdict = self._detector.observe(entry, limit=self.threshold)
        if verdict == "normal":
            self._value = self.alpha * value + (1.0 - self.alpha) * self._value
        elif verdict == "change":
            confirmed = self._detector.take()
            self._value = math.fsum(e.speed for e in confirmed) / len(confirmed)

    def predict(self) -> float | None:
        """Return the average, ``None`` before any observation."""
        return self._value

    def state(self) -> dict[str, Any]:
        """Return the JSON-serialisable state."""
        return {
            "name": self.name,
            "alpha": self.alpha,
            "threshold": self.threshold,
            "confirm": self.confirm,
            "value": self._value,
            "pending": [e.speed for e in self._detector.held()],
        }


ESTIMATORS = ("ema", "last", "narx", "change-ema")


def make_estimator(
    name: str, *, alpha: float = 0.2, options: dict[str, Any] | None = None
) -> SpeedEstimator:
    """Build an estimator by name.

    Parameters
    ----------
    name : str
        ``"ema"``, ``"last"``, ``"narx"`` or ``"change-ema"``.
    alpha : float (default: 0.2)
        EMA weight of the latest observation (``"ema"``, ``"change-ema"``, and ``"narx"``
        before warm-up).
    options : dict | None (default: None)
        Extra keyword arguments of the estimator (for ``"narx"``: ``warmup``, ``hidden``,
        ...; see :class:`~fl_lbbsp.core.silo.narx.NARXEstimator`; for ``"change-ema"``:
        ``threshold``, ``confirm``).
    """
    extra = dict(options or {})
    if name == "ema":
        return EMAEstimator(alpha=alpha, **extra)
    if name == "last":
        return LastValueEstimator(**extra)
    if name == "change-ema":
        return ChangeAwareEMAEstimator(alpha=alpha, **extra)
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
    if state["name"] == "change-ema":
        return ChangeAwareEMAEstimator(
            alpha=float(state["alpha"]),
            threshold=float(state["threshold"]),
            confirm=int(state["confirm"]),
            value=value,
            pending=[float(v) for v in state["pending"]],
        )
    if state["name"] == "narx":
        from .narx import NARXEstimator

        return NARXEstimator.from_state(state)
    raise ValueError(f"unknown speed estimator {state['name']!r} in saved state")
