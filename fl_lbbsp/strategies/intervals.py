"""The replies' own compute intervals: what the claim check observes, and a pool too small.

Every silo round reports when its compute started and ended on its own clock
(``compute-start``, ``compute-end``). The server checks a claimed ``train-time`` against
that interval (:func:`observed_time`), bounded by the wall time it waited, not against the
wall time alone: a Simulation Engine pool of fewer Ray actors than silos runs them one
after the other, and the last one's wall time holds the others' too.

The same intervals tell when the silos queued (:func:`queued`), worth one warning with the
fix (size the pool): the round times add up and LB-BSP's gain shrinks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..contract import COMPUTE_END, COMPUTE_START

__all__ = ["POOL_FIX", "max_overlap", "observed_time", "queued", "reply_interval"]

POOL_FIX = (
    "round times add up and LB-BSP's gain shrinks. On Flower's Simulation Engine the Ray "
    "pool holds fewer actors than sampled silos: give each silo one. Flower 1.42 takes "
    'whole CPUs: flwr run --federation-config "num-supernodes=<silos> '
    'client-resources-num-cpus=1 init-args-num-cpus=<silos>"; 1.41 takes fractions in '
    "pyproject.toml's [tool.flwr.federations.<name>]: options.num-supernodes = <silos>, "
    "options.backend.client-resources.num-cpus = <cores / silos>. Under deploy-local's "
    "compute lock the silos take turns by design"
)
"""How to give every sampled silo an actor, named by the warning :func:`queued` feeds."""

SPAN_FACTOR = 1.5
"""The round's span must exceed the longest interval by this factor to count as queued
(a silo starting late by a little is messaging, not a queue)."""
MIN_COVER = 0.5
"""The share of the round's span the intervals must cover to count as queued: computes
that follow each other fill the span, computes of a few milliseconds between ClientApp
start-ups of seconds do not (that round's time is the start-ups', which a pool does not
change)."""


def reply_interval(metrics: Mapping[str, Any]) -> tuple[float, float] | None:
    """The reply's ``(compute-start, compute-end)``, or ``None`` when it reports none or
    an interval that is not finite or ends before it starts."""
    start, end = metrics.get(COMPUTE_START), metrics.get(COMPUTE_END)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (start, end)):
        return None
    begin, finish = float(start), float(end)  # type: ignore[arg-type]
    if not (math.isfinite(begin) and math.isfinite(finish)) or finish < begin:
        return None
    return begin, finish


def observed_time(metrics: Mapping[str, Any], wall: float | None) -> float | None:
    """What the claim check observes for a reply: the length of its own interval, at most
    the ``wall`` time the server waited for it; ``wall`` itself when the reply reports no
    interval (a silo of another implementation). ``None``: neither."""
    interval = reply_interval(metrics)
    if interval is None:
        return wall
    length = interval[1] - interval[0]
    return length if wall is None else min(length, wall)


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals open at one moment (an end and a start at the same instant do not
    overlap); at least 1 for any interval, an empty one included."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    open_now = most = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return max(most, 1) if intervals else 0


def queued(intervals: Sequence[tuple[float, float]]) -> int | None:
    """The most silos that ran at a time when the round's silos queued: fewer of them
    overlapped than there are, the round spanned over :data:`SPAN_FACTOR` times its
    longest interval, and the intervals cover :data:`MIN_COVER` of that span at least.
    ``None``: they ran side by side, or apart but the gaps between them, not the
    computes, made the round (or fewer than two intervals)."""
    if len(intervals) < 2:
        return None
    longest = max(e - s for s, e in intervals)
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    most = max_overlap(intervals)
    if most < len(intervals) and span > SPAN_FACTOR * longest:
        covered, reach = 0.0, -math.inf  # the union's length: intervals sorted by start
        for start, end in sorted(intervals):
            covered += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        if covered >= MIN_COVER * span:
            return most
    return None
