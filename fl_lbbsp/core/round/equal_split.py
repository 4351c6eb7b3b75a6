"""What the equal split (FedAvg) would have cost: the wall time of the same rounds had every
silo been sent ``X / n``, predicted from the silos' cost curves.

A Flower user sets ``num-server-rounds`` and gets the same rounds sooner; this is the time
they would have waited without LB-BSP. Each round's wall time is kept as it was (its
messaging, its noise) and only the compute part is swapped: the round's slowest predicted
time under the split sent, ``max_i (a_i B_i + b_i)``, is replaced by the slowest under the
equal split of the same total, ``max_i (a_i X / n + b_i)``, with each silo's cost line
``(a_i, b_i)`` as the allocation uses it (its fixed per-round costs, ``he-time`` and
transfer, in ``b_i``). A round with a silo without a cost line counts as it was.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.1 (the BSP round time is the slowest worker's, and
LB-BSP's gain the difference to the balanced one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

__all__ = ["equal_split_time", "rounds_saved"]


def equal_split_time(
    rounds: Sequence[tuple[float, Mapping[str, int]]],
    cost_line: Callable[[str], tuple[float, float] | None],
) -> float | None:
    """The predicted wall time of ``rounds`` under the equal split.

    Parameters
    ----------
    rounds : sequence of (float, Mapping[str, int])
        Each round's wall time in seconds and the batch size sent to each silo.
    cost_line : callable
        A silo's cost line ``(a, b)`` (seconds per sample of the round, fixed seconds),
        ``None`` when it has none.

    Returns
    -------
    float | None
        Seconds; ``None`` for no round.
    """
    if not rounds:
        return None
    total = 0.0
    for wall, sizes in rounds:
        lines = {silo: cost_line(silo) for silo in sizes}
        if not sizes or any(line is None for line in lines.values()):
            total += wall
            continue
        equal = sum(sizes.values()) / len(sizes)
        sent = max(a * sizes[s] + b for s, (a, b) in _known(lines).items())
        even = max(a * equal + b for a, b in _known(lines).values())
        total += max(0.0, wall - sent + even)
    return total


def rounds_saved(
    rounds: Sequence[tuple[float, Mapping[str, int]]],
    cost_line: Callable[[str], tuple[float, float] | None],
) -> tuple[int, float, float | None]:
    """How many more rounds the time ``rounds`` saved on the equal split buys.

    At the rounds' mean wall time, as many as fit in the equal split's predicted time
    (:func:`equal_split_time`), none predicted to overshoot it by more than half a round:
    ``floor(saved / mean + 1/2)``.

    Returns
    -------
    tuple of (int, float, float | None)
        The rounds, the seconds saved (0 when the equal split's time is unknown) and the
        equal split's predicted time (``None``: unknown, no round).
    """
    equal = equal_split_time(rounds, cost_line)
    spent = sum(wall for wall, _ in rounds)
    saved = 0.0 if equal is None else equal - spent
    if saved <= 0 or spent <= 0:
        return 0, saved, equal
    return math.floor(saved * len(rounds) / spent + 0.5), saved, equal


def _known(lines: Mapping[str, tuple[float, float] | None]) -> dict[str, tuple[float, float]]:
    return {s: line for s, line in lines.items() if line is not None}
