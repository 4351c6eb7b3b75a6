"""Round deadlines: how long the server waits for a round's replies.

A round's deadline is the predicted round time times a margin, clipped to
``[floor, ceiling]``. The predicted round time is the slowest silo's predicted compute
time (``B_i * tau / v_i`` from the balancer's speed predictions) plus the messaging
overhead seen in recent complete rounds (wall time minus the slowest reported compute).
Replies that miss the deadline are left out of the round; their silos keep their estimates.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the balancer imports the settings, which import the claims and this
    from ..balancer import BatchSizeBalancer

__all__ = [
    "DeadlinePolicy",
    "OverheadTracker",
    "StragglerWatch",
    "honest_gap",
    "predicted_compute_time",
    "predicted_times",
]

log = logging.getLogger("fl_lbbsp")


@dataclass(frozen=True)
class DeadlinePolicy:
    """How long a round may take: ``clip(margin * predicted, floor, ceiling)``.

    The strategies build it from their validated
    :class:`~fl_lbbsp.strategies.config.ServerConfig` (``deadline_margin``,
    ``deadline_floor``, ``deadline_ceiling``).

    Parameters
    ----------
    margin : float | None (default: 3.0)
        Multiple of the predicted round time granted; ``None`` switches deadlines off
        (every round waits up to the ``timeout`` given to ``start``).
    floor : float (default: 30.0)
        Shortest deadline in seconds.
    ceiling : float (default: 3600.0)
        Longest deadline in seconds; also the deadline while nothing can be predicted
        (round 1). The ``timeout`` given to ``start`` caps it too.
    overhead_rounds : int (default: 3)
        The messaging overhead is the largest seen in this many recent complete rounds.
    ideal_multiple : float (default: 10.0)
        The deadline is at most this multiple of the ideal round (the total work split
        by the predicted speeds, plus the overhead), however slow the plan's slowest
        silo: one silo cannot make everybody's rounds long.
    slow_ratio : float (default: 3.0)
        A silo predicted more than this many times slower than the median of the others at
        the batch size it is given (the split could not even it out: it is at its floor) is
        reported once and held there; the round's deadline stops waiting for it.
    """

    margin: float | None = 3.0
    floor: float = 30.0
    ceiling: float = 3600.0
    overhead_rounds: int = 3
    ideal_multiple: float = 10.0
    slow_ratio: float = 3.0

    def timeout(
        self, predicted: float | None, *, cap: float | None = None, ideal: float | None = None
    ) -> float | None:
        """Deadline for a round predicted to take ``predicted`` seconds.

        Parameters
        ----------
        predicted : float | None
            Predicted round time; ``None`` when unknown (the ceiling applies).
        cap : float | None (default: None)
            Upper bound from the caller (``start``'s ``timeout``).
        ideal : float | None (default: None)
            The ideal round time (T* with the predicted speeds, plus the overhead): the
            deadline is at most ``ideal_multiple`` times it (never below ``floor``).

        Returns
        -------
        float | None
            Seconds to wait for replies; ``cap`` when deadlines are off.
        """
        if self.margin is None:
            return cap
        ceiling = self.ceiling if cap is None else min(self.ceiling, cap)
        if predicted is None:
            return ceiling
        if ideal is not None:
            ceiling = min(ceiling, max(self.ideal_multiple * ideal, self.floor))
        return min(max(self.margin * predicted, self.floor), ceiling)


class OverheadTracker:
    """Messaging overhead of recent complete rounds (wall time minus slowest compute).

    Parameters
    ----------
    rounds : int
        How many recent observations are kept; the prediction is their maximum.
    seen : Iterable[float] (default: ())
        Observations to start from (:attr:`seen` of a checkpointed tracker).
    """

    def __init__(self, rounds: int, seen: Iterable[float] = ()) -> None:
        self._seen: deque[float] = deque((float(s) for s in seen), maxlen=rounds)

    @property
    def seen(self) -> list[float]:
        """The kept observations, oldest first."""
        return list(self._seen)

    def observe(self, wall: float, slowest_compute: float) -> None:
        """Record one complete round."""
        self._seen.append(max(0.0, wall - slowest_compute))

    def predict(self) -> float:
        """Overhead to add to the predicted compute time (0 before any observation)."""
        return max(self._seen, default=0.0)


def honest_gap(gaps: Iterable[float]) -> float | None:
    """The largest gap between observed and claimed time that an honest silo of the
    round showed, as far as ``f`` liars cannot raise it: the ``(f + 1)``-th largest of
    ``gaps`` (negative ones as 0), with ``f = max(1, (n - 1) // 3)`` of ``n`` silos (fewer
    than a third lying, one at least; a silo that under-reports widens its own gap). With
    two silos it is the smaller gap; with one, its own. ``None``: no gap."""
    ordered = sorted((max(0.0, g) for g in gaps), reverse=True)
    if not ordered:
        return None
    liars = max(1, (len(ordered) - 1) // 3)
    return ordered[min(liars, len(ordered) - 1)]


def predicted_times(
    balancer: BatchSizeBalancer, sizes: Mapping[str, int], local_steps: int
) -> dict[str, float] | None:
    """Each silo's predicted time of a round: ``B_i * tau / v_i + f_i``.

    ``f_i`` is the silo's smoothed fixed per-round time (``he-time`` in encrypted mode, 0
    otherwise). A silo without a speed prediction counts at the mean predicted speed of
    the others; ``None`` when no silo has one.
    """
    speeds = {silo: balancer.predicted_speed(silo) for silo in sizes}
    known = [v for v in speeds.values() if v is not None and v > 0]
    if not known:
        return None
    mean = sum(known) / len(known)
    return {
        silo: sizes[silo] * local_steps / (v if v is not None and v > 0 else mean)
        + (balancer.fixed_time(silo) or 0.0)
        for silo, v in speeds.items()
    }


def predicted_compute_time(
    balancer: BatchSizeBalancer, sizes: Mapping[str, int], local_steps: int
) -> float | None:
    """Slowest predicted silo time of a round (:func:`predicted_times`); ``None`` when
    no silo has a speed prediction."""
    times = predicted_times(balancer, sizes, local_steps)
    return None if not times else max(times.values())


class StragglerWatch:
    """Silos the split cannot bring to the others' pace, so that the deadline stops
    waiting for them.

    A silo is a straggler once it has been held at its batch-size floor and predicted
    more than ``ratio`` times slower than the median of the others in ``rounds`` plans in
    a row (one cold or noisy round is not a straggler); never when most silos are "slow"
    (that is the federation's pace). Each is reported once.

    Parameters
    ----------
    ratio : float
        How many times the others' median a straggler's predicted time exceeds.
    rounds : int (default: 3)
        Plans in a row it must do so.
    """

    def __init__(self, *, ratio: float, rounds: int = 3) -> None:
        self.ratio = ratio
        self.rounds = rounds
        self._streak: dict[str, int] = {}
        self.reported: set[str] = set()

    def judge(self, times: Mapping[str, float], at_floor: Set[str]) -> set[str]:
        """The stragglers of a plan: ``times`` each silo's predicted round, ``at_floor``
        the silos the allocation held at their floor."""
        if len(times) < 2:
            return set()
        slow = set()
        for silo, t in times.items():
            middle = float(np.median([v for s, v in times.items() if s != silo]))
            held = silo in at_floor and t > self.ratio * middle
            streak = self._streak[silo] = self._streak.get(silo, 0) + 1 if held else 0
            if streak >= self.rounds:
                slow.add(silo)
        if len(slow) * 2 >= len(times):
            return set()
        for silo in sorted(slow - self.reported):
            self.reported.add(silo)
            others = float(np.median([v for s, v in times.items() if s not in slow]))
            log.warning(
                "silo %s is predicted %.3g s a round at its batch-size floor, more than %g "
                "x the others' %.3g s, for %d rounds: it is held there and the round's "
                "deadline no longer waits for it",
                silo,
                times[silo],
                self.ratio,
                others,
                self.rounds,
            )
        return slow
