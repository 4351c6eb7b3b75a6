"""Validated configuration of the LB-BSP strategies (errors name the field and value)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["BalancingConfig"]


class BalancingConfig(BaseModel):
    """Round configuration and balancer settings of an LB-BSP strategy.

    Parameters
    ----------
    initial_batch_size : int
        B_init, every silo's batch size in round 1; the total X = n * B_init.
    local_steps : int
        Local SGD steps tau, the same for all silos.
    lr : float
        Learning rate eta, the same for all silos.
    balance : bool (default: True)
        ``False`` keeps B_init for every silo (plain FedAvg), with the same telemetry.
    estimator : {"ema", "last", "narx", "change-ema"} (default: "ema")
        Speed predictor (``"change-ema"``: EMA restarting at a confirmed change of level).
    alpha : float (default: 0.2)
        EMA weight of the latest observation, in (0, 1].
    allocator : {"linear", "proportional", "iterative"} (default: "linear")
        ``"proportional"`` is Alg. 1; ``"linear"`` also fits each silo's fixed cost;
        ``"iterative"`` is Alg. 2.
    min_batch_size : int (default: 1)
        Smallest batch size handed out.
    max_batch_size : int | None (default: None)
        Largest batch size handed out (silos may report lower memory caps).
    max_change_ratio : float | None (default: 2.0)
        After its first report, a silo's batch size changes by at most this factor from one
        round to the next (one noisy or false report cannot swing it); ``None``: no limit.
    estimator_options, allocator_options : dict (default: {})
        Extra arguments of the estimator and of the iterative allocator.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_batch_size: int = Field(gt=0, strict=True)
    local_steps: int = Field(gt=0, strict=True)
    lr: float = Field(gt=0, allow_inf_nan=False)
    balance: bool = True
    estimator: Literal["ema", "last", "narx", "change-ema"] = "ema"
    alpha: float = Field(default=0.2, gt=0, le=1)
    allocator: Literal["linear", "proportional", "iterative"] = "linear"
    min_batch_size: int = Field(default=1, gt=0, strict=True)
    max_batch_size: int | None = Field(default=None, gt=0)
    max_change_ratio: float | None = Field(default=2.0, gt=1, allow_inf_nan=False)
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    allocator_options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> BalancingConfig:
        if self.max_batch_size is not None and self.max_batch_size < self.min_batch_size:
            raise ValueError(
                f"max_batch_size ({self.max_batch_size}) is below min_batch_size "
                f"({self.min_batch_size})"
            )
        if self.initial_batch_size < self.min_batch_size:
            raise ValueError(
                f"initial_batch_size ({self.initial_batch_size}) is below min_batch_size "
                f"({self.min_batch_size})"
            )
        return self
