"""Emulate a silo k times slower than the machine it runs on.

After computing for ``t`` seconds the silo waits ``(k - 1) * t`` and reports ``k * t``
(shared/DESIGN.md, "Emulated heterogeneity"). Every figure that relies on it is labelled
emulated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["SlowdownSchedule", "emulate_slowdown"]


class SlowdownSchedule:
    """Slowdown factor k per round: a constant, or ``"ROUND:K,ROUND:K"`` steps.

    ``"4"`` is k = 4 in every round; ``"1:1,10:4"`` is k = 1 from round 1 and k = 4 from
    round 10 on (a co-tenant arriving). Before the first listed round k is 1.

    Parameters
    ----------
    steps : dict of int to float
        First round -> slowdown factor from that round on; every factor >= 1.
    """

    def __init__(self, steps: dict[int, float]) -> None:
        if not steps:
            raise ValueError("a slowdown schedule needs at least one step")
        for rnd, k in steps.items():
            if rnd < 1:
                raise ValueError(f"slowdown schedule rounds start at 1, got {rnd}")
            if not math.isfinite(k) or k < 1:
                raise ValueError(f"slowdown factor must be a finite number >= 1, got {k!r}")
        self.steps = dict(sorted(steps.items()))

    @classmethod
    def parse(cls, value: str | float | int) -> SlowdownSchedule:
        """Parse ``4``, ``"4"`` or ``"1:1,10:4"``; ValueError names a bad value."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls({1: float(value)})
        text = str(value).strip()
        try:
            if ":" not in text:
                return cls({1: float(text)})
            steps: dict[int, float] = {}
            for item in text.split(","):
                rnd, k = item.split(":")
                steps[int(rnd)] = float(k)
            return cls(steps)
        except ValueError as err:
            raise ValueError(
                f"invalid slowdown {value!r}: expected a factor like '4' or a schedule "
                f"like '1:1,10:4' ({err})"
            ) from None

    def factor(self, server_round: int) -> float:
        """Slowdown factor k in ``server_round``."""
        k = 1.0
        for rnd, value in self.steps.items():
            if server_round >= rnd:
                k = value
        return k

    def __str__(self) -> str:
        if list(self.steps) == [1]:
            return f"{self.steps[1]:g}"
        return ",".join(f"{r}:{k:g}" for r, k in self.steps.items())


def emulate_slowdown(
    compute_time: float, factor: float, *, sleep: Callable[[float], None] = time.sleep
) -> float:
    """Wait ``(factor - 1) * compute_time`` and return the emulated time ``factor * t``."""
    if factor > 1.0:
        sleep((factor - 1.0) * compute_time)
    return factor * compute_time
