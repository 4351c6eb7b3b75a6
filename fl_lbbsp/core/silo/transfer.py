"""Each silo's per-round transfer time, learned from what the server observes.

The server knows when it sent a silo its instruction and when the reply arrived; the silo
reports the seconds it computed (``train-time``, plus ``he-time`` in encrypted mode). The
rest, the gap, is the round's messaging: the model's two transfers over the silo's link,
its start-up (slower on a slower machine), plus what every silo pays alike (Flower's
polling). :class:`TransferTimes` keeps a window of each silo's gaps and takes a low order
statistic of it, so that a one-off delay (a retransmission, a paused process, a poll that
just missed) does not move it: a delay only ever adds to a gap, and the lower quartile of
the window stays put until most of the window is delayed. What the silos pay alike does
not move a split (the allocation equalises finishing times, and a cost every silo shares
shifts them all), and a difference within the messaging's jitter is noise, so a silo's
lower quartile counts, above the smallest silo's, where it lies beyond a typical silo's
upper quartile (:meth:`TransferTimes.excess`): a silo behind a slow link gets its extra seconds as
a fixed per-round cost, exactly as ``he-time`` is one, and a smaller batch so that it
finishes with the others. The server balances what the user waits for: the seconds from
sending each silo its instruction to receiving its reply.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.5, note 6 (the communication time measured
explicitly and added to the load-tuning algorithm); the robust estimate is an order
statistic (Huber, "Robust Statistics", 1981, Ch. 3).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping

__all__ = ["TransferTimes"]


class TransferTimes:
    """A window of each silo's gaps (observed minus claimed seconds) and its lower quartile.

    Parameters
    ----------
    window : int (default: 8)
        Gaps kept per silo (the newest).
    min_gaps : int (default: 4)
        Gaps a silo needs before its transfer time is estimated (quartiles of fewer say
        little).
    """

    def __init__(self, *, window: int = 8, min_gaps: int = 4) -> None:
        for name, value in (("window", window), ("min_gaps", min_gaps)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if min_gaps > window:
            raise ValueError(f"min_gaps {min_gaps} is more than the window {window}")
        self.window = window
        self.min_gaps = min_gaps
        self._gaps: dict[str, deque[float]] = {}

    def observe(self, gaps: Mapping[str, float]) -> None:
        """Add one round's gap of each silo (non-finite ones are skipped; negative ones,
        a clock's jitter, count as 0)."""
        for silo, gap in gaps.items():
            if math.isfinite(gap):
                kept = self._gaps.setdefault(silo, deque(maxlen=self.window))
                kept.append(max(0.0, float(gap)))

    def quartiles(self, silo: str) -> tuple[float, float] | None:
        """The lower and upper quartile of the silo's window (the order statistics
        ``sorted[(n - 1) // 4]`` and ``sorted[3 (n - 1) // 4]``, no interpolation);
        ``None``: fewer than :attr:`min_gaps` gaps yet."""
        kept = self._gaps.get(silo)
        if not kept or len(kept) < self.min_gaps:
            return None
        ordered = sorted(kept)
        n = len(ordered)
        return ordered[(n - 1) // 4], ordered[3 * (n - 1) // 4]

    def estimate(self, silo: str) -> float | None:
        """The silo's transfer time: the lower quartile of its window; ``None``: fewer
        than :attr:`min_gaps` gaps yet."""
        found = self.quartiles(silo)
        return None if found is None else found[0]

    def excess(self, silos: Iterable[str]) -> dict[str, float]:
        """Each silo's transfer time beyond what every silo pays, where the messaging's
        jitter cannot explain it.

        The level every silo pays at least is the smallest lower quartile of the silos'
        windows. A silo's lower quartile above it is a cost it pays every round and the
        others do not (a slow link, a slower start-up), but only when it also lies above a
        typical silo's upper quartile (the median of the silos' upper quartiles, which a
        minority of slow links does not move): a difference within the jitter (Flower's
        SuperNode polls every few seconds) is noise and counts 0; one beyond it counts
        whole, from the shared level. Silos without enough gaps yet are left out."""
        known = {s: q for s in silos if (q := self.quartiles(s)) is not None}
        if not known:
            return {}
        shared = min(low for low, _ in known.values())
        typical = statistics.median(high for _, high in known.values())
        return {s: low - shared if low > typical else 0.0 for s, (low, _) in known.items()}

    def forget(self, silo: str) -> None:
        """Drop a silo's window (it came back on another node, or its link changed)."""
        self._gaps.pop(silo, None)
