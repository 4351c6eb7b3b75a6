"""The slowdown a round's silos share: a pure function of their reports.

A factor that slows every silo of a round alike (a busy machine, a shared cluster)
leaves the min-max split unchanged, so it is noise to the balancer: without taking it
out, one slow round would be confirmed as a change of every silo and restart all their
histories. The round's common factor is the median, over the silos whose report lies
near their own earlier reports (at least 3 of them), of the report's deviation from them;
every report of the round is divided by it before it reaches the silos' models (median
polish, Tukey, "Exploratory Data Analysis", 1977, Ch. 11). Deviations where a silo has
not been observed (a batch size moved away from its history) do not count: a shared error
of the fitted lines would pass for a shared slowdown there. In a round where fewer than 3
silos are near their history, the others' fitted lines stand in, and the factor is taken
out only beyond the change threshold: a shift that large is no error of a line's shape.

Reference: the per-round noise of non-dedicated workers, Chen et al., "Accelerating
Distributed Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 3.2 and 5.4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["MIN_SILOS", "shared_slowdown"]

MIN_SILOS = 3
"""Fewest silos to judge a round's shared slowdown by."""


def shared_slowdown(
    times: Sequence[float],
    levels: Sequence[float | None],
    lines: Sequence[float | None],
    *,
    threshold: float,
) -> float:
    """The round's common factor (1: none).

    Parameters
    ----------
    times : sequence of float
        Each silo's reported time (positive).
    levels : sequence of float or None
        Each silo's time near its batch size from its earlier reports
        (:meth:`~fl_lbbsp.core.silo.model.SiloTable.near_levels`); ``None``: none.
    lines : sequence of float or None
        Each silo's fitted cost line at its batch size; ``None``: no line. Used only
        where fewer than :data:`MIN_SILOS` silos have a level.
    threshold : float
        Relative shift below which a factor from fitted lines is not taken out.

    Returns
    -------
    float
        The median deviation's factor: from the levels where at least
        :data:`MIN_SILOS` silos have one, else from levels and lines beyond
        ``threshold``; 1 with fewer than :data:`MIN_SILOS` silos to judge by.
    """
    deviations = [
        math.log(t / level) for t, level in zip(times, levels, strict=True) if level is not None
    ]
    if len(deviations) >= MIN_SILOS:
        return math.exp(float(np.median(deviations)))
    for t, level, line in zip(times, levels, lines, strict=True):
        if level is None and line is not None:
            deviations.append(math.log(t / line))
    if len(deviations) < MIN_SILOS:
        return 1.0
    shift = float(np.median(deviations))
    return math.exp(shift) if abs(shift) > math.log1p(threshold) else 1.0
