"""Round deadlines: how long the server waits for a round's replies.

A round's deadline is the predicted round time times a margin, clipped to
``[floor, ceiling]``. The predicted round time is the slowest silo's predicted compute
time (``B_i * tau / v_i`` from the balancer's speed predictions) plus the messaging
overhead seen in recent complete rounds (wall time minus the slowest reported compute).
Replies that miss the deadline are left out of the round; their silos keep their estimates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .balancer import BatchSizeBalancer

__all__ = ["DeadlinePolicy", "OverheadTracker", "predicted_compute_time"]


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


def predicted_compute_time(
    balancer: BatchSizeBalancer, sizes: Mapping[str, int], local_steps: int
) -> float | None:
    """Slowest predicted silo time of a round: ``max_i B_i * tau / v_i + f_i``.

    ``f_i`` is the silo's smoothed fixed per-round time (``he-time`` in encrypted mode, 0
    otherwise). A silo without a speed prediction counts at the mean predicted speed of
    the others; ``None`` when no silo has one.
    """
    speeds = {silo: balancer.predicted_speed(silo) for silo in sizes}
    known = [v for v in speeds.values() if v is not None and v > 0]
    if not known:
        return None
    mean = sum(known) / len(known)
    return max(
        sizes[silo] * local_steps / (v if v is not None and v > 0 else mean)
        + (balancer.fixed_time(silo) or 0.0)
        for silo, v in speeds.items()
    )
