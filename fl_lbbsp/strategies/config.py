"""Validated configuration of the LB-BSP strategies (errors name the field and value).

The strategies keep plain keyword-only constructors; each builds these models from its
keywords, so a bad value raises :class:`pydantic.ValidationError` (a ``ValueError``) that
names the keyword and the value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..core.balancer import BALANCER_DEFAULTS

__all__ = [
    "BalancingConfig",
    "EncryptedClusterConfig",
    "EncryptionConfig",
    "ParameterServerConfig",
    "ServerConfig",
]


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
    min_batch_fraction : float (default: 1/3)
        Floor of every batch size as a fraction of B_init, in [0, 1].
    max_batch_size : int | None (default: None)
        Largest batch size handed out (silos may report lower memory caps).
    max_change_ratio : float | None (default: 2.0)
        A silo's batch size changes by at most this factor from one round to the next, its
        first report included (relative to B_init), unless a change of its speed was
        confirmed; ``None``: no limit.
    fit : {"robust", "wls"} (default: "robust")
        Cost fit of the linear allocator.
    change_sigmas : float | None (default: 2.5)
        Change detection threshold in robust noise scales; ``None``: no detection.
    change_threshold : float (default: 0.2)
        Smallest relative deviation that counts as a possible change.
    change_confirm : int (default: 2)
        Reports that confirm a change.
    order_tolerance : float | None (default: 0.1)
        Order guard tolerance; ``None``: no order guard.
    equal_split_guard : bool (default: True)
        Never ship an allocation predicted no faster than the equal split.
    equal_split_margin : float (default: 0.05)
        Predicted gain over the equal split an allocation must show to be shipped.
    estimator_options, allocator_options : dict (default: {})
        Extra arguments of the estimator and of the iterative allocator.

    Every balancer default is :data:`fl_lbbsp.core.balancer.BALANCER_DEFAULTS`, the
    defaults of :class:`~fl_lbbsp.core.BatchSizeBalancer` (see it for the details).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_batch_size: int = Field(gt=0, strict=True)
    local_steps: int = Field(gt=0, strict=True)
    lr: float = Field(gt=0, allow_inf_nan=False)
    balance: bool = True
    estimator: Literal["ema", "last", "narx", "change-ema"] = BALANCER_DEFAULTS["estimator"]
    alpha: float = Field(default=BALANCER_DEFAULTS["alpha"], gt=0, le=1)
    allocator: Literal["linear", "proportional", "iterative"] = BALANCER_DEFAULTS["allocator"]
    min_batch_size: int = Field(default=BALANCER_DEFAULTS["min_batch_size"], gt=0, strict=True)
    min_batch_fraction: float = Field(default=BALANCER_DEFAULTS["min_batch_fraction"], ge=0, le=1)
    max_batch_size: int | None = Field(default=BALANCER_DEFAULTS["max_batch_size"], gt=0)
    max_change_ratio: float | None = Field(
        default=BALANCER_DEFAULTS["max_change_ratio"], gt=1, allow_inf_nan=False
    )
    fit: Literal["robust", "wls"] = BALANCER_DEFAULTS["fit"]
    change_sigmas: float | None = Field(
        default=BALANCER_DEFAULTS["change_sigmas"], ge=0, allow_inf_nan=False
    )
    change_threshold: float = Field(
        default=BALANCER_DEFAULTS["change_threshold"], gt=0, allow_inf_nan=False
    )
    change_confirm: int = Field(default=BALANCER_DEFAULTS["change_confirm"], ge=1, strict=True)
    order_tolerance: float | None = Field(
        default=BALANCER_DEFAULTS["order_tolerance"], ge=0, allow_inf_nan=False
    )
    equal_split_guard: bool = BALANCER_DEFAULTS["equal_split_guard"]
    equal_split_margin: float = Field(
        default=BALANCER_DEFAULTS["equal_split_margin"], ge=0, lt=1, allow_inf_nan=False
    )
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


class ReplyLimits(BaseModel):
    """What a strategy accepts in a round's replies (:mod:`fl_lbbsp.strategies.validation`).

    Parameters
    ----------
    min_train_silos : int (default: 1)
        Fewest valid replies a round needs; with fewer the round is skipped.
    max_num_examples : int | None (default: None)
        Largest ``num-examples`` a reply may claim; ``None``: 2**53.
    max_reply_bytes : int | None (default: None)
        Largest reply in bytes; ``None``: four times the model sent plus 1 MiB.
    extra_metric_keys : tuple of str | None (default: the shipped silo apps' extras)
        Metrics accepted beyond the contract's; ``None`` accepts any.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_train_silos: int = Field(default=1, ge=1, strict=True)
    max_num_examples: int | None = Field(default=None, gt=0, strict=True)
    max_reply_bytes: int | None = Field(default=None, gt=0, strict=True)
    extra_metric_keys: tuple[str, ...] | None = None

    @field_validator("extra_metric_keys", mode="before")
    @classmethod
    def _key_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(f"expected an iterable of key names, not the string {value!r}")
        return None if value is None else tuple(value)


class ServerConfig(BaseModel):
    """Settings of a Message-API LB-BSP strategy beyond balancing: round deadlines, reply
    polling, node sampling, telemetry and checkpoints.

    Parameters
    ----------
    deadline_margin : float | None (default: 3.0)
        Round deadline = this multiple (>= 1) of the predicted round time; ``None``: no
        deadline.
    deadline_floor : float (default: 30.0)
        Shortest round deadline in seconds, positive.
    deadline_ceiling : float (default: 3600.0)
        Longest round deadline in seconds, at least ``deadline_floor``.
    poll_interval : float | None (default: 0.1)
        Seconds between two pulls for replies, positive; ``None``: the Grid's own loop.
    fraction_train, fraction_evaluate : float (default: 1.0)
        Share of the available nodes sampled for training / evaluation, in [0, 1].
    min_train_nodes, min_evaluate_nodes, min_available_nodes : int (default: 2)
        As in :class:`flwr.serverapp.strategy.FedAvg`, non-negative.
    telemetry_path : Path | None (default: None)
        JSON-lines telemetry file.
    checkpoint_dir : Path | None (default: None)
        Folder for one checkpoint per finished round; ``start`` resumes from it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    deadline_margin: float | None = Field(default=3.0, ge=1.0, allow_inf_nan=False)
    deadline_floor: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    deadline_ceiling: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    poll_interval: float | None = Field(default=0.1, gt=0, allow_inf_nan=False)
    fraction_train: float = Field(default=1.0, ge=0, le=1)
    fraction_evaluate: float = Field(default=1.0, ge=0, le=1)
    min_train_nodes: int = Field(default=2, ge=0)
    min_evaluate_nodes: int = Field(default=2, ge=0)
    min_available_nodes: int = Field(default=2, ge=0)
    telemetry_path: Path | None = None
    checkpoint_dir: Path | None = None

    @model_validator(mode="after")
    def _deadline_order(self) -> ServerConfig:
        if self.deadline_ceiling < self.deadline_floor:
            raise ValueError(
                f"deadline_ceiling ({self.deadline_ceiling!r}) is below deadline_floor "
                f"({self.deadline_floor!r})"
            )
        return self


class ParameterServerConfig(BaseModel):
    """The parameter server's update in cluster mode.

    Parameters
    ----------
    momentum : float (default: 0.0)
        SGD momentum, in [0, 1).
    aggregation : {"weighted", "naive"} (default: "weighted")
        Gradients weighted by batch size (Sec. 3.4), or their plain (biased) mean.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    momentum: float = Field(default=0.0, ge=0, lt=1)
    aggregation: Literal["weighted", "naive"] = "weighted"


class EncryptionConfig(BaseModel):
    """How the encrypted strategy announces and checks the silos' weights.

    Parameters
    ----------
    initial_weight_total : float | None (default: None)
        Positive total S announced before any silo reported its dataset size; ``None``:
        the number of sampled silos.
    weight_tolerance : float (default: 1e-6)
        Relative tolerance of the weight check, in (0, 1).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_weight_total: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    weight_tolerance: float = Field(default=1e-6, gt=0, lt=1)


class EncryptedClusterConfig(BaseModel):
    """The encrypted parameter server's history of aggregates and its evaluation.

    Parameters
    ----------
    max_history : int (default: 32)
        Aggregates kept for workers that fall behind, positive.
    evaluate_every : int | None (default: None)
        Federated evaluation after every this many iterations (positive); ``None``: never.
    aggregation : {"weighted"} (default: "weighted")
        Encrypted gradients are weighted by batch size only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_history: int = Field(default=32, ge=1, strict=True)
    evaluate_every: int | None = Field(default=None, ge=1, strict=True)
    aggregation: Literal["weighted"] = "weighted"
