"""The settings a silo's model takes.

:class:`~fl_lbbsp.core.settings.BalancingKnobs` declares every setting (its meaning,
default and bounds); :class:`~fl_lbbsp.core.balancer.BatchSizeBalancer` takes that model
and hands a silo's model (:mod:`.silo.model`) :class:`ModelSettings`, the allocation
(:mod:`.allocation`) the knobs themselves.

Reference: the BatchSizeManager's settings, Chen et al., "Accelerating Distributed
Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .silo.estimators import SpeedEstimator

__all__ = ["Fit", "ModelSettings"]

Fit = Literal["robust", "wls"]


@dataclass(frozen=True)
class ModelSettings:
    """What a silo's model takes of :class:`~fl_lbbsp.core.settings.Tuning` (each field
    documented and checked there, ``alpha`` also the ``wls`` fit's decay), with the speed
    estimator it names and ``wls``: whether the weighted least-squares line is also made
    (the linear allocator with ``fit="wls"``)."""

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

    @property
    def max_boost(self) -> float:
        """The most a confirmed change (or a restart) widens the change limit by."""
        return (self.max_change_ratio or 1.0) ** 2
