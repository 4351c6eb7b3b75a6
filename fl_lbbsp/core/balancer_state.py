"""The balancer's state model: what :meth:`BatchSizeBalancer.state_dict
<fl_lbbsp.core.balancer.BatchSizeBalancer.state_dict>` holds (every silo's estimator,
history, cost fit, pending reports and change limit, the iterative allocator and the
pooled shape, the balancer's settings against
:class:`~fl_lbbsp.core.settings.BalancingConfig`), as types and ranges, and the bounds and
value types the other parts' state models share. A checkpoint validates the balancer's
state with it (:class:`~fl_lbbsp.core.round.engine.EngineState`)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from ..security.identity import SILO_ID_PATTERN
from .settings import BalancingConfig
from .silo.estimators import ESTIMATORS

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_COUNT",
    "MAX_ENTRIES",
    "MAX_SECONDS",
    "MAX_SILOS",
    "MAX_SPEED",
    "BalancerState",
    "Batch",
    "Count",
    "NodeId",
    "OpenRecord",
    "Positive",
    "Seconds",
    "SiloId",
    "Speed",
]

MAX_SILOS = 100_000
"""Most silos a checkpoint may describe when no federation size is configured."""
MAX_BATCH_SIZE = 10_000_000
"""Largest batch size a checkpoint may hold (a sanity bound, far above any real one)."""
MAX_SPEED = 1e15
"""Largest speed (samples per second) a checkpoint may hold; the smallest is its inverse."""
MAX_COUNT = 10**9
"""Largest count (reports, steps, versions) a checkpoint may hold."""
MAX_ENTRIES = 100_000
"""Longest list (history, pending reports, overheads) a checkpoint may hold."""
MAX_SECONDS = 1e7
"""Longest time (a round, an overhead: 115 days) a checkpoint may hold."""


SiloId = Annotated[str, StringConstraints(pattern=f"^{SILO_ID_PATTERN}$")]
NodeId = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,20}$")]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False, strict=True)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
Speed = Annotated[float, Field(ge=1 / MAX_SPEED, le=MAX_SPEED, allow_inf_nan=False, strict=True)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE, strict=True)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]


class OpenRecord(BaseModel):
    """Known fields validated, unknown ones kept."""

    model_config = ConfigDict(extra="allow")


class EstimatorState(OpenRecord):
    """A silo's speed estimator: its name, the current speed (samples per second) and,
    where the estimator has them, its smoothing and held-back observations."""

    name: Literal[ESTIMATORS]  # type: ignore[valid-type]
    value: Speed | None = None
    alpha: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False, strict=True)
    pending: list[Speed] | None = Field(default=None, max_length=MAX_ENTRIES)


class LastReport(OpenRecord):
    """The last report the balancer took from a silo (empty before its first)."""

    batch_size: int = Field(default=0, ge=0, le=MAX_BATCH_SIZE, strict=True)
    train_time: Seconds = 0.0
    samples: float = Field(default=0.0, ge=0, allow_inf_nan=False, strict=True)


class FitState(OpenRecord):
    """A silo's cost line ``t = slope * x + intercept`` (see
    :class:`~fl_lbbsp.core.allocation.allocators.CostFit`)."""

    slope: Positive
    intercept: Seconds
    anchor: Positive
    level: Positive
    noise: Seconds | None = None
    weight: float = Field(ge=0, le=1, allow_inf_nan=False, strict=True)
    spread: tuple[Positive, Positive]

    @model_validator(mode="after")
    def _ordered(self) -> FitState:
        low, high = self.spread
        if low > high or high > MAX_BATCH_SIZE:
            raise ValueError(f"spread {[low, high]} is not 0 < low <= high <= {MAX_BATCH_SIZE}")
        return self


class SiloState(OpenRecord):
    """One silo's balancer state."""

    estimator: EstimatorState
    history: list[tuple[Batch, Seconds]] = Field(default_factory=list, max_length=MAX_ENTRIES)
    max_batch_size: Batch | None = None
    steps: float = Field(default=1.0, gt=0, le=MAX_BATCH_SIZE, allow_inf_nan=False, strict=True)
    fixed_time: Seconds | None = None
    last: LastReport | None = None
    reports: Count = 0
    shape: Seconds | None = None
    noise: Seconds | None = None
    pending: list[list[Any]] = Field(default_factory=list, max_length=MAX_ENTRIES)
    boost: Positive = 1.0
    fit: FitState | None = None

    @field_validator("pending")
    @classmethod
    def _pending(cls, value: list[list[Any]]) -> list[list[Any]]:
        # (batch size, time, speed, log deviation[, held back])
        for i, entry in enumerate(value):
            if len(entry) not in (4, 5):
                raise ValueError(f"entry {i} has {len(entry)} values, expected 4 or 5")
            batch, seconds, speed, deviation, *held = entry
            if not (_integer(batch) and 1 <= batch <= MAX_BATCH_SIZE):
                raise ValueError(
                    f"entry {i}: batch size {batch!r:.40} out of [1, {MAX_BATCH_SIZE}]"
                )
            if not (_real(seconds) and 0 <= seconds <= MAX_SECONDS):
                raise ValueError(f"entry {i}: time {seconds!r:.40} out of [0, {MAX_SECONDS:g}]")
            if not (_real(speed) and 1 / MAX_SPEED <= speed <= MAX_SPEED):
                raise ValueError(f"entry {i}: speed {speed!r:.40} out of range")
            if not _real(deviation) or any(not isinstance(h, bool) for h in held):
                raise ValueError(f"entry {i}: deviation or held-back flag of the wrong type")
        return value


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class IterativeConfig(OpenRecord):
    """The iterative allocator's settings.

    See :class:`~fl_lbbsp.core.allocation.iterative.IterativeAllocator`.
    """

    step: int = Field(ge=1, le=MAX_BATCH_SIZE, strict=True)
    window: int = Field(ge=1, le=MAX_ENTRIES, strict=True)
    fine_step: int = Field(ge=1, le=MAX_BATCH_SIZE, strict=True)
    fine_window: int = Field(ge=1, le=MAX_ENTRIES, strict=True)
    memory_limit: float = Field(gt=0, le=100, allow_inf_nan=False, strict=True)
    refast_ratio: float | None = Field(gt=1, allow_inf_nan=False, strict=True)


class IterativeAllocatorState(OpenRecord):
    """The iterative allocator's state."""

    config: IterativeConfig
    phase: Literal["fast", "fine"]
    sizes: dict[SiloId, Batch] = Field(max_length=MAX_SILOS)
    times: list[dict[SiloId, Seconds]] = Field(max_length=MAX_ENTRIES)
    removable: SiloId | None = None


class IterativeState(OpenRecord):
    """The iterative allocator and the silos it stepped."""

    allocator: IterativeAllocatorState
    stepped: dict[SiloId, Count] = Field(max_length=MAX_SILOS)


class PooledShape(OpenRecord):
    """The federation's pooled cost shape (fixed cost in samples)."""

    value: Seconds
    stale: bool = Field(strict=True)


class BalancerState(OpenRecord):
    """The balancer's state: its settings and every silo's."""

    config: dict[str, Any]
    iterative: IterativeState | None = None
    pooled_shape: PooledShape | None = None
    silos: dict[SiloId, SiloState] = Field(default_factory=dict, max_length=MAX_SILOS)

    @field_validator("config")
    @classmethod
    def _config(cls, value: dict[str, Any]) -> dict[str, Any]:
        # The settings the strategies validate their keywords with (an unknown one is
        # refused), and a history the checkpoint can hold.
        history = _settings(value).tuning.history
        if history > MAX_ENTRIES:
            raise ValueError(f"history {history!r:.40} is over {MAX_ENTRIES}")
        return value

    @model_validator(mode="after")
    def _boosts(self) -> BalancerState:
        ratio = _settings(self.config).tuning.max_change_ratio
        top = max(1.0, float(ratio) ** 2) if ratio is not None else 1.0
        for silo, state in self.silos.items():
            if not 1.0 <= state.boost <= top * (1 + 1e-9):
                raise ValueError(
                    f"silos.{silo}.boost {state.boost:.4g} is outside [1, {top:g}] "
                    "(max_change_ratio ** 2)"
                )
        return self


def _settings(config: dict[str, Any]) -> BalancingConfig:
    """A checkpointed balancer's settings (its ``config``), validated."""
    return BalancingConfig.model_validate({"local_steps": 1, "lr": 1.0, **config})
