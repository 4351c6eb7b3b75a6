"""The balancer's state model: what :meth:`BatchSizeBalancer.state_dict
<fl_lbbsp.core.balancer.BatchSizeBalancer.state_dict>` holds (every silo's record, the silo
model's own :class:`~fl_lbbsp.core.silo.state.SiloModel`, which also defines the bounds and
value types the other parts' state models share; the iterative allocator and the pooled
shape, the balancer's settings against :class:`~fl_lbbsp.core.settings.BalancingConfig`),
as types and ranges. A checkpoint validates the balancer's
state with it (:class:`~fl_lbbsp.core.round.engine.EngineState`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from ..contract import SILO_ID_PATTERN
from .allocation.iterative import Iterative
from .settings import BalancingConfig
from .silo.state import MAX_BATCH_SIZE, MAX_ENTRIES, Batch, Count, OpenRecord, Seconds, SiloModel

__all__ = ["MAX_BATCH_SIZE", "MAX_SILOS", "BalancerState", "NodeId", "SiloId"]

MAX_SILOS = 100_000
"""Most silos a checkpoint may describe when no federation size is configured."""

SiloId = Annotated[str, StringConstraints(pattern=f"^{SILO_ID_PATTERN}$")]
NodeId = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,20}$")]


class IterativeAllocatorState(OpenRecord):
    """The iterative allocator's state: its settings (the allocator itself) and its
    state machine's."""

    config: Iterative
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
    silos: dict[SiloId, SiloModel] = Field(default_factory=dict, max_length=MAX_SILOS)

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
