"""Validated settings of the round engine: one type for the balancer, one set of defaults.

Every strategy (Message API, legacy API, cluster mode) takes these settings as keywords
and validates them here, so a bad value raises :class:`pydantic.ValidationError` (a
``ValueError``) that names the keyword and the value. The defaults are
:data:`fl_lbbsp.core.balancer.BALANCER_DEFAULTS`, read from the balancer's constructor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .balancer import BALANCER_DEFAULTS, MAX_NOISE_BUDGET, BatchSizeBalancer
from .claims import ClaimChecker

__all__ = [
    "CLAIM_SETTINGS",
    "BalancingConfig",
    "BalancingOptions",
    "ReplyLimits",
    "balancing_config",
    "make_balancer",
    "make_claim_checker",
]


class BalancingOptions(TypedDict, total=False):
    """The balancing keywords every strategy takes (``**balancing``); see
    :class:`BalancingConfig` for each one's meaning and default."""

    balance: bool
    estimator: str
    alpha: float
    allocator: str
    min_batch_size: int
    min_batch_fraction: float
    noise_budget: float | None
    max_batch_size: int | None
    max_change_ratio: float | None
    fit: str
    change_sigmas: float | None
    change_threshold: float
    change_confirm: int
    common_noise: bool
    order_tolerance: float | None
    equal_split_guard: bool
    equal_split_margin: float
    estimator_options: dict[str, Any] | None
    allocator_options: dict[str, Any] | None
    balancer_options: dict[str, Any] | None
    max_dataset_size: int | None
    check_times: bool | None
    time_tolerance: float
    min_claimed_time: float
    max_claimed_time: float


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
    min_batch_fraction : float (default: 0.0)
        A hard floor of every batch size as a fraction of B_init, in [0, 1] (a memory or
        batch-normalisation floor of your own). The blanket 1/3 of earlier versions is
        replaced by ``noise_budget``.
    noise_budget : float | None (default: sqrt(2) ~ 1.414)
        rho: the aggregated update may be at most rho times as noisy as FedAvg's
        (``sum_i w_i^2 / B_i`` with the aggregation weights w_i, against the equal
        split's); the allocation is the shortest round within it. 1: FedAvg's noise;
        larger trades noise for time; ``None``: no budget. In [1, 1e6]. Why sqrt(2):
        :data:`fl_lbbsp.core.balancer.NOISE_BUDGET` and docs/balancing.md.
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
    common_noise : bool (default: True)
        Take the slowdown shared by every silo of a round out of its reports.
    order_tolerance : float | None (default: 0.1)
        Order guard tolerance; ``None``: no order guard.
    equal_split_guard : bool (default: True)
        Never ship an allocation predicted no faster than the equal split.
    equal_split_margin : float (default: 0.05)
        Predicted gain over the equal split an allocation must show to be shipped.
    estimator_options, allocator_options : dict (default: {})
        Extra arguments of the estimator and of the iterative allocator.
    max_dataset_size : int | None (default: 10_000_000)
        Bounded claims (:mod:`fl_lbbsp.core.claims`): the largest ``num-examples`` (the
        aggregation weight in FL) a silo may claim; a silo's size is pinned at its first
        accepted report and a reply claiming another is rejected. Ten million samples is
        beyond a cross-silo dataset of today (ImageNet-1k holds 1.28 million) and keeps a
        ``10**9`` grab out by default; raise it for larger silos, or declare the sizes
        (a declared size is configuration, not a claim, and is not capped). ``None``: no
        cap beyond ``max_num_examples``.
    check_times : bool | None (default: None)
        Cross-check each reply's ``train-time`` (plus ``he-time``) against the wall time
        the server observed between sending the silo its instruction and receiving its
        reply: a claim the observation contradicts is replaced by it, with one warning.
        ``None``: on where silos really wait, i.e. on Flower's own grids (a deployment,
        the Simulation Engine), off on any other (the in-process grid, a test's), where
        silos run one after the other or report emulated times no wall time can
        confirm; the simulation runner also switches it off for emulation without waits
        (``emulate_wait=False``, a cost model). ``True`` / ``False``: on / off
        everywhere.
    time_tolerance : float (default: 2.0)
        How far a claim may be from the observation before it counts as contradicted:
        the claim plus the messaging overhead (the largest gap, jitter included, an
        honest silo showed in recent rounds) times ``time_tolerance`` below the
        observation, or the claim above ``observed * time_tolerance``; > 1. A liar thus
        gains at most this factor of speed, once its true time exceeds about this
        factor times the messaging overhead.
    min_claimed_time, max_claimed_time : float (default: 1e-6, 86400.0)
        Finite positive bounds of a claimed time in seconds (``train-time``; ``he-time``
        up to ``max_claimed_time``): a claim outside is clipped to them with a warning,
        whether or not times are observed.

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
    noise_budget: float | None = Field(
        default=BALANCER_DEFAULTS["noise_budget"], ge=1, le=MAX_NOISE_BUDGET, allow_inf_nan=False
    )
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
    common_noise: bool = BALANCER_DEFAULTS["common_noise"]
    order_tolerance: float | None = Field(
        default=BALANCER_DEFAULTS["order_tolerance"], ge=0, allow_inf_nan=False
    )
    equal_split_guard: bool = BALANCER_DEFAULTS["equal_split_guard"]
    equal_split_margin: float = Field(
        default=BALANCER_DEFAULTS["equal_split_margin"], ge=0, lt=1, allow_inf_nan=False
    )
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    allocator_options: dict[str, Any] = Field(default_factory=dict)
    max_dataset_size: int | None = Field(default=10_000_000, gt=0, strict=True)
    check_times: bool | None = None
    time_tolerance: float = Field(default=2.0, gt=1, allow_inf_nan=False)
    min_claimed_time: float = Field(default=1e-6, gt=0, allow_inf_nan=False)
    max_claimed_time: float = Field(default=86400.0, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _bounds(self) -> BalancingConfig:
        if self.max_claimed_time <= self.min_claimed_time:
            raise ValueError(
                f"max_claimed_time ({self.max_claimed_time}) is not above min_claimed_time "
                f"({self.min_claimed_time})"
            )
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
    """What a strategy accepts in a round's replies (:mod:`fl_lbbsp.core.screening`).

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


def make_balancer(config: BalancingConfig) -> BatchSizeBalancer:
    """The balancer of a strategy with these settings (one place for every strategy)."""
    return BatchSizeBalancer(
        initial_batch_size=config.initial_batch_size,
        estimator=config.estimator,
        alpha=config.alpha,
        allocator=config.allocator,
        min_batch_size=config.min_batch_size,
        min_batch_fraction=config.min_batch_fraction,
        noise_budget=config.noise_budget,
        max_batch_size=config.max_batch_size,
        max_change_ratio=config.max_change_ratio,
        fit=config.fit,
        change_sigmas=config.change_sigmas,
        change_threshold=config.change_threshold,
        change_confirm=config.change_confirm,
        common_noise=config.common_noise,
        order_tolerance=config.order_tolerance,
        equal_split_guard=config.equal_split_guard,
        equal_split_margin=config.equal_split_margin,
        estimator_options=config.estimator_options,
        allocator_options=config.allocator_options,
    )


CLAIM_SETTINGS = frozenset(
    {"max_dataset_size", "check_times", "time_tolerance", "min_claimed_time", "max_claimed_time"}
)
"""The :class:`BalancingConfig` fields that bound the silos' claims: they change nothing
for an honest silo, so a checkpoint written under other bounds may be resumed."""


def make_claim_checker(
    config: BalancingConfig,
    *,
    overhead_rounds: int = 3,
    declared_sizes: Mapping[str, int] | None = None,
) -> ClaimChecker:
    """The bounds on the silos' claims of a strategy with these settings.

    Parameters
    ----------
    config : BalancingConfig
        The settings (``max_dataset_size``, ``time_tolerance``, ``min_claimed_time``,
        ``max_claimed_time``).
    overhead_rounds : int (default: 3)
        Recent rounds whose messaging overhead is kept (the deadline policy's).
    declared_sizes : Mapping[str, int] | None (default: None)
        Silo id -> dataset size declared beforehand (a silo registry); later ones can be
        added with :meth:`~fl_lbbsp.core.claims.ClaimChecker.declare`.
    """
    return ClaimChecker(
        max_dataset_size=config.max_dataset_size,
        tolerance=config.time_tolerance,
        min_time=config.min_claimed_time,
        max_time=config.max_claimed_time,
        overhead_rounds=overhead_rounds,
        declared_sizes=declared_sizes,
    )


def balancing_config(
    *, initial_batch_size: int, local_steps: int, lr: float, **options: Any
) -> BalancingConfig:
    """Validate a strategy's balancing keywords (:class:`BalancingOptions`).

    ``None`` for ``estimator_options`` / ``allocator_options`` means none;
    ``balancer_options`` (a dict of further settings, as earlier versions took) is merged
    in, a keyword given both ways being an error.
    """
    extra = dict(options.pop("balancer_options", None) or {})
    both = sorted(set(extra) & set(options))
    if both:
        raise ValueError(f"{', '.join(both)} given both as a keyword and in balancer_options")
    settings = {**options, **extra}
    for key in ("estimator_options", "allocator_options"):
        if settings.get(key, 0) is None:
            settings[key] = {}
    return BalancingConfig(
        initial_batch_size=initial_batch_size, local_steps=local_steps, lr=lr, **settings
    )
