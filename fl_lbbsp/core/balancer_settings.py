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

    Each value is :class:`~fl_lbbsp.core.settings.Tuning`'s, checked there.
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

    @property
    def max_boost(self) -> float:
        """The most a confirmed change (or a restart) widens the change limit by."""
        return (self.max_change_ratio or 1.0) ** 2
