"""The settings each part of the balancer takes, checked once.

:class:`~fl_lbbsp.core.settings.BalancingKnobs` declares every setting (its meaning,
default and bounds); :class:`~fl_lbbsp.core.balancer.BatchSizeBalancer` takes them as
keywords and hands each
part the ones it uses: a silo's model (:mod:`.silo_model`) takes :class:`ModelSettings`,
the allocation (:mod:`.allocation`) :class:`AllocationSettings`. Both check their values
when made, so a bad keyword raises ``ValueError`` naming it. Neither has defaults.

Reference: the BatchSizeManager's settings, Chen et al., "Accelerating Distributed
Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .settings import MAX_NOISE_BUDGET
from .silo.estimators import SpeedEstimator
from .silo.reports import check_positive_int, is_real

__all__ = [
    "ALLOCATORS",
    "FITS",
    "AllocationSettings",
    "Allocator",
    "Fit",
    "ModelSettings",
]

Allocator = Literal["proportional", "linear", "iterative"]
ALLOCATORS: tuple[str, ...] = ("proportional", "linear", "iterative")
Fit = Literal["robust", "wls"]
FITS: tuple[str, ...] = ("robust", "wls")


@dataclass(frozen=True)
class ModelSettings:
    """The settings a silo's model uses.

    Parameters
    ----------
    estimator : SpeedEstimator
        The speed estimator (:mod:`~fl_lbbsp.core.silo.estimators`).
    alpha : float
        EMA weight of a silo's newest fixed time (and the ``wls`` fit's decay).
    history : int
        Reports kept in the window.
    min_fit_spread : float
        Batch sizes closer than this fraction count as the same.
    fit : {"robust", "wls"}
        The cost fit the allocation uses.
    wls : bool
        Whether the weighted least-squares line is also made (linear allocator, ``wls``).
    change_sigmas : float | None
        Change detection limit in noise scales; ``None``: no detection.
    change_threshold : float
        Smallest relative deviation that counts as a possible change.
    change_confirm : int
        Held reports in a row that confirm a change.
    max_change_ratio : float | None
        The allocation's change limit (a confirmed change widens it, at most squared).

    Raises
    ------
    ValueError
        On a value out of its range (the message names the setting).
    """

    estimator: SpeedEstimator
    alpha: float
    history: int
    min_fit_spread: float
    fit: Fit
    wls: bool
    change_sigmas: float | None
    change_threshold: float
    change_confirm: int
    max_change_ratio: float | None

    def __post_init__(self) -> None:
        check_positive_int("history", self.history)
        spread = self.min_fit_spread
        if not math.isfinite(spread) or spread < 0:
            raise ValueError(f"min_fit_spread must be >= 0, got {spread!r}")
        _check_ratio(self.max_change_ratio)
        if self.fit not in FITS:
            raise ValueError(f"unknown fit {self.fit!r}; expected one of {FITS}")
        sigmas = self.change_sigmas
        if sigmas is not None and (not is_real(sigmas) or sigmas < 0):
            raise ValueError(f"change_sigmas must be >= 0 or None, got {sigmas!r}")
        if not is_real(self.change_threshold) or self.change_threshold <= 0:
            raise ValueError(f"change_threshold must be > 0, got {self.change_threshold!r}")
        confirm = self.change_confirm
        if isinstance(confirm, bool) or not isinstance(confirm, int | np.integer) or confirm < 1:
            raise ValueError(f"change_confirm must be an integer >= 1, got {confirm!r}")

    @property
    def max_boost(self) -> float:
        """The most a confirmed change (or a restart) widens the change limit by."""
        return (self.max_change_ratio or 1.0) ** 2


@dataclass(frozen=True)
class AllocationSettings:
    """The settings the allocation uses.

    Parameters
    ----------
    initial_batch_size : int
        B_init; the total is ``n * B_init`` unless given.
    allocator : {"proportional", "linear", "iterative"}
        The allocator.
    min_batch_size : int
        Smallest batch size (wins over a lower memory cap).
    min_batch_fraction : float
        The hard floor as a fraction of B_init (yields to a memory cap).
    max_batch_size : int | None
        Largest batch size.
    noise_budget : float | None
        rho (``None``: none).
    max_change_ratio : float | None
        The change limit (``None``: none).
    order_tolerance : float | None
        The order guard's tolerance (``None``: no order guard).
    equal_split_guard : bool
        Whether the equal-split guard runs.
    equal_split_margin : float
        The equal-split guard's largest margin.

    Raises
    ------
    ValueError
        On a value out of its range (the message names the setting).
    """

    initial_batch_size: int
    allocator: Allocator
    min_batch_size: int
    min_batch_fraction: float
    max_batch_size: int | None
    noise_budget: float | None
    max_change_ratio: float | None
    order_tolerance: float | None
    equal_split_guard: bool
    equal_split_margin: float

    def __post_init__(self) -> None:
        check_positive_int("initial_batch_size", self.initial_batch_size)
        check_positive_int("min_batch_size", self.min_batch_size)
        top = self.max_batch_size
        if top is not None:
            check_positive_int("max_batch_size", top)
            if top < self.min_batch_size:
                raise ValueError(
                    f"max_batch_size {top} is below min_batch_size {self.min_batch_size}"
                )
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"unknown allocator {self.allocator!r}; expected one of {ALLOCATORS}")
        _check_ratio(self.max_change_ratio)
        fraction = self.min_batch_fraction
        if not is_real(fraction) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"min_batch_fraction must be in [0, 1], got {fraction!r}")
        rho = self.noise_budget
        if rho is not None and (not is_real(rho) or not 1.0 <= rho <= MAX_NOISE_BUDGET):
            raise ValueError(
                f"noise_budget must be in [1, {MAX_NOISE_BUDGET:g}] or None, got {rho!r}"
            )
        tolerance = self.order_tolerance
        if tolerance is not None and (not is_real(tolerance) or tolerance < 0):
            raise ValueError(f"order_tolerance must be >= 0 or None, got {tolerance!r}")
        margin = self.equal_split_margin
        if not is_real(margin) or not 0.0 <= margin < 1.0:
            raise ValueError(f"equal_split_margin must be in [0, 1), got {margin!r}")

    @property
    def floor(self) -> int:
        """The hard floor ``max(min_batch_size, ceil(min_batch_fraction * B_init))``, at
        most ``max_batch_size``."""
        floor = max(
            self.min_batch_size, math.ceil(self.min_batch_fraction * self.initial_batch_size)
        )
        return floor if self.max_batch_size is None else min(floor, self.max_batch_size)


def _check_ratio(ratio: float | None) -> None:
    if ratio is not None and (isinstance(ratio, bool) or not math.isfinite(ratio) or ratio <= 1):
        raise ValueError(f"max_change_ratio must be > 1 or None, got {ratio!r}")
