"""The settings a silo's model takes.

:class:`~fl_lbbsp.core.settings.BalancingKnobs` declares every setting (its meaning,
default and bounds); :class:`~fl_lbbsp.core.balancer.BatchSizeBalancer` takes that model
and hands a silo's model (:mod:`.silo.model`) :class:`ModelSettings`, the allocation
(:mod:`.allocation`) the knobs themselves.

Reference: the BatchSizeManager's settings, Chen et al., "Accelerating Distributed
Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .silo.estimators import SpeedEstimator
from .silo.reports import check_positive_int, is_real

__all__ = ["FITS", "Fit", "ModelSettings"]

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


def _check_ratio(ratio: float | None) -> None:
    if ratio is not None and (isinstance(ratio, bool) or not math.isfinite(ratio) or ratio <= 1):
        raise ValueError(f"max_change_ratio must be > 1 or None, got {ratio!r}")
