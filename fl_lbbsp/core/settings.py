"""Validated settings of the balancer: the one declaration of every balancing knob.

A user sets a few (:class:`BalancingKnobs`: whether to balance, the noise budget, the
batch-size bounds; :class:`BalancingConfig` adds the round, B_init, tau and eta); every
other knob is :class:`Tuning`'s, nested in them as ``tuning``. Each field is declared once,
with its meaning (the docstring under it), its default and its bounds; everything else
takes them from there: every strategy validates its keywords with
:class:`BalancingConfig`, the simulation and cluster runs nest the knobs
(:class:`~fl_lbbsp.runs.config.RunSettings`), the CLI makes one flag of each
(:mod:`fl_lbbsp.cli_flags`), the balancer takes the model itself
(:class:`~fl_lbbsp.core.balancer.BatchSizeBalancer`) and the claim checker
:meth:`BalancingConfig.claim_bounds`. A tuning knob may also be given by its name where
the user-level ones are (``BalancingKnobs(allocator="proportional")``): it joins
``tuning``. Pure pydantic, importing of the core only the estimator registry
(:mod:`.silo.estimators`). A bad value raises
:class:`pydantic.ValidationError` (a ``ValueError``) naming the knob and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .allocation.pipeline import ALLOCATORS, Allocator, Iterative
from .registry import Registry
from .silo.estimators import ESTIMATORS, SpeedEstimator, parse_estimator

__all__ = [
    "BALANCER_DEFAULTS",
    "CLAIM_SETTINGS",
    "MAX_NOISE_BUDGET",
    "NOISE_BUDGET",
    "BalancingConfig",
    "BalancingKnobs",
    "IterativeSettings",
    "ReplyLimits",
    "Tuning",
    "balancing_config",
]

IterativeSettings = Iterative
"""Alg. 2's settings: the fields of the ``iterative`` allocator."""

MAX_NOISE_BUDGET = 1e6
"""Largest noise budget accepted (a finite stand-in for no budget: ``None``)."""
NOISE_BUDGET = math.sqrt(2.0)
"""The default noise budget rho (docs/balancing.md, "The noise budget"): the update may be
at most sqrt(2) times as noisy as FedAvg's. SGD's noise temperature is eta * sigma^2 / B
(Mandt et al., JMLR 2017; Smith and Le, ICLR 2018; Jastrzebski et al., 2017): a budget
rho acts on it as a learning rate rho times larger at FedAvg's batch. A learning rate tuned
for FedAvg on the customary powers-of-two grid is known only within a factor sqrt(2) of its
best; rho = sqrt(2) keeps the update's temperature within that resolution of the tuning,
so it changes nothing the user's own tuning could have told apart."""


class Tuning(BaseModel):
    """Every knob a user rarely sets: the estimator, the allocator, the cost fits, the
    change detection, the guards and the bounds on the silos' claims (docs/balancing.md
    explains each part)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    estimator: str = "ema"
    """Speed predictor, by its name in the estimator registry: ema, last, narx or
    change-ema (an EMA restarting at a confirmed change of level), or one registered with
    fl_lbbsp.core.silo.estimators.register; an estimator object (``EMA(alpha=0.3)``) is
    taken too, held as its name and its settings (``estimator_options``)."""
    alpha: float = Field(default=0.2, gt=0, le=1)
    """EMA weight of the latest observation, in (0, 1]."""
    allocator: str = "linear"
    """Allocator, by its name in the allocator registry: proportional (Alg. 1), linear
    (also fits each silo's fixed cost) or iterative (Alg. 2, cluster mode), or one
    registered with fl_lbbsp.core.allocation.allocators.register; an allocator object
    (``Iterative(window=1)``) is taken too, held as its name and its settings
    (``allocator_options``)."""
    min_batch_fraction: float = Field(default=0.0, ge=0, le=1)
    """A hard floor of every batch size as a fraction of B_init, in [0, 1] (a memory or
    batch-normalisation floor of your own); the noise budget is the usual bound."""
    history: int = Field(default=20, ge=1, strict=True)
    """Reports per silo the cost fits look back on."""
    min_fit_spread: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    """Smallest relative spread of a silo's batch sizes for its own cost fit (below it the
    federation's pooled shape is used)."""
    max_change_ratio: float | None = Field(default=2.0, gt=1, allow_inf_nan=False)
    """A silo's batch size changes by at most this factor from one round to the next, its
    first report included (from B_init), unless a change of its speed was confirmed (then
    up to the cube); none: no limit."""
    fit: Literal["robust", "wls"] = "robust"
    """Cost fit of the linear allocator."""
    change_sigmas: float | None = Field(default=2.5, ge=0, allow_inf_nan=False)
    """Change detection threshold in robust noise scales; none: no detection."""
    change_threshold: float = Field(default=0.2, gt=0, allow_inf_nan=False)
    """Smallest relative deviation that counts as a possible change."""
    change_confirm: int = Field(default=2, ge=1, strict=True)
    """Reports that confirm a change."""
    common_noise: bool = True
    """Take the slowdown shared by every silo of a round out of its reports."""
    order_tolerance: float | None = Field(default=0.1, ge=0, allow_inf_nan=False)
    """Order guard tolerance (a faster silo never gets a smaller batch beyond it); none: no
    order guard."""
    equal_split_guard: bool = True
    """Never ship an allocation predicted no faster than the equal split, like with like:
    the equal split's predicted round is the largest of the silos' noisy estimates, so the
    allocation's is taken as the expected largest of its silos' noisy times (each silo's
    standard error of its fitted time)."""
    equal_split_margin: float = Field(default=0.05, ge=0, lt=1, allow_inf_nan=False)
    """Predicted gain over the equal split an allocation must show to be shipped, as a
    fraction of the equal split's round: twice the largest standard error of a silo's
    fitted time, at most this (all of it while a silo has no noise estimate yet; 0 with
    noise-free reports)."""
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    """Settings of the estimator named by ``estimator`` (NARX ``warmup``, ``train_every``,
    ...), ``alpha`` where it has one and they do not set it."""
    allocator_options: dict[str, Any] = Field(default_factory=dict)
    """Settings of the allocator named by ``allocator`` (Alg. 2's ``step``, ``window``,
    ...)."""
    max_dataset_size: int | None = Field(default=10_000_000, gt=0, strict=True)
    """Bounded claims (fl_lbbsp.security.claims): the largest num-examples (the
    aggregation weight in FL) a silo may claim; a silo's size is pinned at its first
    accepted report and a reply claiming another is rejected. Ten million samples is beyond
    a cross-silo dataset of today (ImageNet-1k holds 1.28 million) and keeps a 10**9 grab
    out; raise it for larger silos, or declare the sizes (a declared size is configuration,
    not a claim, and is not capped). none: no cap beyond max_num_examples."""
    check_times: bool | None = None
    """Cross-check each reply's train-time (plus he-time) against the wall time the server
    observed between sending the silo its instruction and receiving its reply: a claim the
    observation contradicts is replaced by it, with one warning. None: on where silos
    really wait, i.e. on Flower's own grids (a deployment, the Simulation Engine), off on
    any other (the in-process grid, a test's), where silos run one after the other or
    report emulated times no wall time can confirm; the simulation runner also switches it
    off for emulation without waits or with a cost model. True / False: on / off."""
    time_tolerance: float = Field(default=2.0, gt=1, allow_inf_nan=False)
    """How far a claimed time may be from the observed one before it counts as
    contradicted: the claim plus the messaging overhead (the largest gap an honest silo
    showed in recent rounds) times this below the observation, or the claim above the
    observation times this; > 1. A liar gains at most this factor of speed."""
    min_claimed_time: float = Field(default=1e-6, gt=0, allow_inf_nan=False)
    """Smallest claimed time in seconds: a claim below it is clipped to it, with a
    warning."""
    max_claimed_time: float = Field(default=86400.0, gt=0, allow_inf_nan=False)
    """Largest claimed time in seconds (train-time; he-time up to it): a claim above it is
    clipped to it, with a warning."""

    @model_validator(mode="before")
    @classmethod
    def _parts_by_name(cls, data: Any) -> Any:
        """An estimator or allocator object becomes its name and its settings (an
        estimator's ``alpha`` left out where it is the knob's); Alg. 2's default settings
        beside another allocator, which every state held before the registry, are
        dropped."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for part, kind in (("estimator", SpeedEstimator), ("allocator", Allocator)):
            given = data.get(part)
            if not isinstance(given, kind):
                continue
            if data.get(f"{part}_options"):
                raise ValueError(f"{part}_options are for an {part} named by a string")
            options = given.model_dump()
            if part == "estimator" and options.get("alpha") == data.get(
                "alpha", cls.model_fields["alpha"].default
            ):
                del options["alpha"]
            data |= {part: given.name, f"{part}_options": options}
        named = data.get("allocator", "linear")
        if named != Iterative.name and data.get("allocator_options") == Iterative().model_dump():
            data["allocator_options"] = {}  # (a state written before the registry)
        return data

    @field_validator("estimator", "allocator")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        registry: Registry[Any] = ESTIMATORS if info.field_name == "estimator" else ALLOCATORS
        registry.lookup(name)
        return name

    @field_validator("estimator_options", "allocator_options", mode="before")
    @classmethod
    def _no_options(cls, value: Any) -> Any:
        """``None``: none; a model (``IterativeSettings(window=1)``): its fields."""
        if isinstance(value, BaseModel):
            return value.model_dump()
        return {} if value is None else dict(value) if isinstance(value, Mapping) else value

    @field_validator("estimator_options")
    @classmethod
    def _options_taken(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Refuse an option the estimator does not take, or a bad one."""
        if "estimator" in info.data and "alpha" in info.data:  # (else those are refused)
            parse_estimator(info.data["estimator"], alpha=info.data["alpha"], options=options)
        return options

    @field_validator("allocator_options")
    @classmethod
    def _settings_taken(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Refuse a setting the allocator does not take, or a bad one."""
        if "allocator" in info.data:  # (else its name is refused)
            ALLOCATORS.build(info.data["allocator"], options)
        return options

    def batch_allocator(self) -> Allocator:
        """The allocator these settings name: ``allocator`` with ``allocator_options``."""
        return ALLOCATORS.build(self.allocator, self.allocator_options)

    def speed_estimator(self) -> SpeedEstimator:
        """The estimator these settings name: ``estimator`` with ``estimator_options`` and
        ``alpha`` (:func:`~fl_lbbsp.core.silo.estimators.parse_estimator`)."""
        return parse_estimator(self.estimator, alpha=self.alpha, options=self.estimator_options)

    @model_validator(mode="after")
    def _claimed_times(self) -> Tuning:
        if self.max_claimed_time <= self.min_claimed_time:
            raise ValueError(
                f"max_claimed_time ({self.max_claimed_time}) is not above min_claimed_time "
                f"({self.min_claimed_time})"
            )
        return self


class BalancingKnobs(BaseModel):
    """The knobs a user sets: whether to balance, the noise budget and the batch-size
    bounds; every other is :attr:`tuning`'s. A simulated run nests these
    (:attr:`fl_lbbsp.runs.config.RunSettings.balancing`); :class:`BalancingConfig` adds the
    round (B_init, tau, eta)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    balance: bool = True
    """``False`` keeps B_init for every silo (plain FedAvg), with the same telemetry."""
    noise_budget: float | None = Field(
        default=NOISE_BUDGET, ge=1, le=MAX_NOISE_BUDGET, allow_inf_nan=False
    )
    """rho: the aggregated update may be at most rho times as noisy as FedAvg's
    (sum_i w_i^2 / B_i with the aggregation weights w_i, against the equal split's); the
    allocation is the shortest round within it. 1: FedAvg's noise; larger trades noise for
    time; none: no budget. In [1, 1e6]; the default sqrt(2) is explained in
    docs/balancing.md."""
    min_batch_size: int = Field(default=1, gt=0, strict=True)
    """Smallest batch size handed out."""
    max_batch_size: int | None = Field(default=None, gt=0)
    """Largest batch size handed out (silos may report lower memory caps); none: no cap."""
    tuning: Tuning = Field(default_factory=Tuning)
    """Every other knob (:class:`Tuning`)."""

    @model_validator(mode="before")
    @classmethod
    def _tuning_by_name(cls, data: Any) -> Any:
        """Tuning knobs given by name (``allocator="iterative"``) join ``tuning``, winning
        over it."""
        if not isinstance(data, dict) or not set(data) & set(Tuning.model_fields):
            return data
        given = data.get("tuning")
        tuning = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
        named = {k: data[k] for k in data if k in Tuning.model_fields}
        rest = {k: v for k, v in data.items() if k not in Tuning.model_fields}
        return {**rest, "tuning": {**tuning, **named}}

    @model_validator(mode="after")
    def _bounds(self) -> BalancingKnobs:
        if self.max_batch_size is not None and self.max_batch_size < self.min_batch_size:
            raise ValueError(
                f"max_batch_size ({self.max_batch_size}) is below min_batch_size "
                f"({self.min_batch_size})"
            )
        return self

    def bounds_problem(self, initial_batch_size: int) -> str | None:
        """Why B_init cannot be every silo's batch size under these bounds (``None``: it
        can): below ``min_batch_size``, or above ``max_batch_size``, where X = n * B_init
        could never be handed out."""
        if initial_batch_size < self.min_batch_size:
            return (
                f"initial_batch_size ({initial_batch_size}) is below min_batch_size "
                f"({self.min_batch_size})"
            )
        if self.max_batch_size is not None and initial_batch_size > self.max_batch_size:
            return (
                f"initial_batch_size ({initial_batch_size}) is above max_batch_size "
                f"({self.max_batch_size}): X = n * B_init could never be handed out"
            )
        return None

    def floor(self, initial_batch_size: int) -> int:
        """The hard floor of every batch size: ``max(min_batch_size, ceil(
        min_batch_fraction * B_init))``, at most ``max_batch_size``."""
        fraction = math.ceil(self.tuning.min_batch_fraction * initial_batch_size)
        floor = max(self.min_batch_size, fraction)
        return floor if self.max_batch_size is None else min(floor, self.max_batch_size)


class BalancingConfig(BalancingKnobs):
    """Round configuration and balancer settings of an LB-BSP strategy: the round
    (B_init, tau, eta, documented under each field) and the knobs of
    :class:`BalancingKnobs` (a :class:`Tuning` field by its name too)."""

    initial_batch_size: int = Field(gt=0, strict=True)
    """B_init, every silo's batch size in round 1; the total X = n * B_init."""
    local_steps: int = Field(gt=0, strict=True)
    """Local SGD steps tau, the same for all silos."""
    lr: float = Field(gt=0, allow_inf_nan=False)
    """Learning rate eta, the same for all silos."""

    @model_validator(mode="after")
    def _round_bounds(self) -> BalancingConfig:
        if (problem := self.bounds_problem(self.initial_batch_size)) is not None:
            raise ValueError(problem)
        return self

    def claim_bounds(self) -> dict[str, Any]:
        """The keywords of :class:`~fl_lbbsp.security.claims.ClaimChecker` these settings give:
        its bounds on the silos' claims (``max_dataset_size``, ``tolerance``, ``min_time``,
        ``max_time``)."""
        t = self.tuning
        return {
            "max_dataset_size": t.max_dataset_size,
            "tolerance": t.time_tolerance,
            "min_time": t.min_claimed_time,
            "max_time": t.max_claimed_time,
        }


CLAIM_SETTINGS = frozenset(
    {"max_dataset_size", "check_times", "time_tolerance", "min_claimed_time", "max_claimed_time"}
)
"""The :class:`Tuning` fields that bound the silos' claims: they change nothing for an
honest silo, so a checkpoint written under other bounds may be resumed."""

BALANCER_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        name: field.get_default(call_default_factory=True)
        for model in (BalancingKnobs, Tuning)
        for name, field in model.model_fields.items()
        if name not in {"balance", "tuning", *CLAIM_SETTINGS}
    }
)
"""Every balancer knob's default by name (B_init aside), read from the models: for code
that reports the balancer's settings."""


class ReplyLimits(BaseModel):
    """What a strategy accepts in a round's replies (:mod:`fl_lbbsp.security.screening`).

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


def balancing_config(
    *, initial_batch_size: int, local_steps: int, lr: float, **options: Any
) -> BalancingConfig:
    """Validate a strategy's balancing keywords (the fields of :class:`BalancingKnobs`,
    a :class:`Tuning` field by its name too).

    ``balancing`` (a :class:`BalancingKnobs`, or a mapping of its fields) gives knobs as
    one value, a keyword winning over it; ``balancer_options`` (a dict of further
    settings, as earlier versions took) is merged in, a keyword given both ways being an
    error.
    """
    given = options.pop("balancing", None)
    base = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
    extra = dict(options.pop("balancer_options", None) or {})
    both = sorted(set(extra) & set(options))
    if both:
        raise ValueError(f"{', '.join(both)} given both as a keyword and in balancer_options")
    return BalancingConfig.model_validate(
        {**base, **options, **extra, "initial_batch_size": initial_batch_size}
        | {"local_steps": local_steps, "lr": lr}
    )
