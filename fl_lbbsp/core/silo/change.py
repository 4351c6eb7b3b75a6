"""The one change detector: a run of deviations to the same side confirms a change of level.

A silo's speed on a non-dedicated machine moves two ways: per-round jitter and spikes
(a garbage collection, a burst of traffic), which a predictor must ignore, and lasting
steps (a co-tenant arrives or leaves), which it must follow at once. The detector tells
them apart from the deviations of the observations from the current level: a deviation
beyond the single-observation limit is *held* (kept out of the estimate); ``confirm``
held deviations in a row, to the same side, confirm a change, and with ``cusum`` a longer
run whose mean deviation (each clipped at the limit, so that one spike cannot carry it)
exceeds the limit divided by the square root of its length confirms one too (a step
hidden in the noise). A deviation to the other side ends the run.

Two users share it: the balancer's silo model (:mod:`.silo_model`, log deviations of a
report's time from the silo's cost line, with ``cusum``) and the change-aware EMA
(:class:`~fl_lbbsp.core.silo.estimators.ChangeAwareEMAEstimator`, relative deviations of a
speed from its average, without).

Reference: Page, "Continuous inspection schemes", Biometrika 41 (1954) (CUSUM), applied
to the per-worker speed prediction of LB-BSP (Chen et al., "Accelerating Distributed
Learning in Non-Dedicated Environments", IEEE TCC 2021, Sec. 3.2 and 3.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ChangeDetector", "Deviation", "Verdict"]

Verdict = Literal["normal", "held", "change"]
"""What one observation is: ``normal`` (feed it), ``held`` (a possible change, kept out
of the estimate) or ``change`` (a confirmed change: :attr:`ChangeDetector.run` holds the
observations that confirmed it)."""


@dataclass(frozen=True)
class Deviation:
    """One observation in the current run.

    Parameters
    ----------
    batch_size : int
        Batch size of the report (0 where not known: an estimator sees speeds only).
    time : float
        Its time (0 where not known).
    speed : float
        Its speed (samples per second).
    deviation : float
        Its deviation from the level (log ratio or relative; the sign says the side).
    held : bool
        Whether it lay beyond the single-observation limit.
    """

    batch_size: int
    time: float
    speed: float
    deviation: float
    held: bool

    def to_list(self) -> list[float | int | bool]:
        """The checkpoint form ``[batch size, time, speed, deviation, held]``."""
        return [self.batch_size, self.time, self.speed, self.deviation, self.held]

    @classmethod
    def from_list(cls, saved: list[float | int | bool]) -> Deviation:
        """Rebuild from :meth:`to_list` (an older form without ``held``: held)."""
        held = bool(saved[4]) if len(saved) > 4 else True
        return cls(int(saved[0]), float(saved[1]), float(saved[2]), float(saved[3]), held)


@dataclass
class ChangeDetector:
    """Tell a lasting change of level from a spike, one deviation at a time.

    Parameters
    ----------
    confirm : int
        Held deviations in a row, to the same side, that confirm a change (>= 1).
    window : int
        Longest run kept (the oldest observations drop out).
    cusum : bool (default: True)
        Also confirm a change by a run longer than ``confirm`` whose mean clipped
        deviation exceeds ``max(floor, limit / sqrt(len(run)))``.
    run : list of Deviation (default: [])
        The current run of deviations to the same side (to resume from a checkpoint).
    """

    confirm: int
    window: int
    cusum: bool = True
    run: list[Deviation] = field(default_factory=list)

    def observe(self, entry: Deviation, *, limit: float, floor: float = 0.0) -> Verdict:
        """Add an observation (its ``held`` judged against ``limit`` by the caller) and
        say what it is.

        Parameters
        ----------
        entry : Deviation
            The observation.
        limit : float
            The single-observation limit (the CUSUM test clips deviations at it).
        floor : float (default: 0.0)
            Smallest mean deviation the CUSUM test counts as a change.
        """
        run = self.run
        if run and (run[-1].deviation > 0) != (entry.deviation > 0):
            run.clear()
        run.append(entry)
        del run[: -self.window]
        trailing = 0
        for held in reversed(run):
            if not held.held:
                break
            trailing += 1
        if trailing >= self.confirm:
            del run[:-trailing]
            return "change"
        if self.cusum and len(run) > self.confirm:
            mean = abs(math.fsum(max(-limit, min(limit, e.deviation)) for e in run)) / len(run)
            if mean > max(floor, limit / math.sqrt(len(run))):
                return "change"
        return "held" if entry.held else "normal"

    def held(self) -> list[Deviation]:
        """The held observations at the end of the run (not confirmed yet)."""
        out: list[Deviation] = []
        for entry in reversed(self.run):
            if not entry.held:
                break
            out.append(entry)
        return out[::-1]

    def take(self) -> list[Deviation]:
        """The run (after ``change``: the observations that confirmed it), emptied."""
        run, self.run = self.run, []
        return run

    def clear(self) -> None:
        """Forget the run."""
        self.run.clear()
