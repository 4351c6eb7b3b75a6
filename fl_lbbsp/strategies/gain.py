"""What the balanced split saved against the equal split (FedAvg), told and spent.

A Flower user sets ``num-server-rounds`` and gets the same rounds sooner. At the end of a
run :func:`report_gain` logs the rounds' time beside what the equal split would have needed
for them (:func:`~fl_lbbsp.core.round.equal_split.equal_split_time`, from the silos' cost
curves) and puts both in Flower's ``Result``; with ``spend_saved_time``,
:func:`spend_saved` first runs as many more rounds as the saving buys
(:func:`~fl_lbbsp.core.round.equal_split.rounds_saved`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.serverapp.strategy import Result

from ..contract import EQUAL_SPLIT_TIME, WALL_CLOCK_TIME
from ..core.round.equal_split import equal_split_time, rounds_saved
from .later_rounds import LaterRounds, merge_results

__all__ = ["report_gain", "spend_saved"]

log = logging.getLogger("fl_lbbsp")

Rounds = Sequence[tuple[float, Mapping[str, int]]]
"""Each train round's time and the batch size sent to each silo (``TrainRound.taken``)."""
CostLine = Callable[[str], tuple[float, float] | None]
"""A silo's cost line ``(a, b)``, ``None`` without one (``BatchSizeBalancer.cost_line``)."""


def spend_saved(
    loop: LaterRounds,
    result: Result,
    *,
    taken: Rounds,
    cost_line: CostLine,
    scheme: str,
    after: int,
    **options: Any,
) -> Result:
    """``result`` followed by the rounds ``after + 1 ..`` that the rounds ``taken`` saved
    on the equal split (FedAvg), as many as fit at their mean time
    (:func:`~fl_lbbsp.core.round.equal_split.rounds_saved`), run by ``loop``; one INFO
    line says how many and why. ``options``: ``loop.run``'s other keywords."""
    more, saved, equal = rounds_saved(taken, cost_line)
    if more == 0:
        why = (
            "the equal split's time is unknown (no round timed in this run)"
            if equal is None
            else f"the {len(taken)} rounds run took {equal - saved:.1f} s against the "
            f"equal split's predicted {equal:.1f} s, under half a round saved"
        )
        log.info("[%s] spend_saved_time: no extra round: %s", scheme, why)
        return result
    log.info(
        "[%s] spending the %.1f s saved on %d more round%s (the equal split's predicted "
        "time for the %d rounds run: %.1f s)",
        scheme, saved, more, "s" * (more > 1), len(taken), equal,
    )  # fmt: skip
    loop.round_offset = after
    later = loop.run(initial_arrays=result.arrays, num_rounds=more, evaluate_first=False, **options)
    return merge_results(result, later)


def report_gain(result: Result, *, taken: Rounds, cost_line: CostLine) -> None:
    """Log the train rounds' time (each its wall time, or its slowest silo's reported
    round where that is longer: emulated times not waited out) beside what the equal
    split (FedAvg) would have needed for them, predicted from the silos' cost curves
    (:func:`~fl_lbbsp.core.round.equal_split.equal_split_time`), and put both in the last
    round's train metrics of ``result`` (``wall-clock-time``, ``equal-split-time``)."""
    if not taken:
        return
    spent = sum(wall for wall, _ in taken)
    equal = equal_split_time(taken, cost_line)
    log.info(
        "%d rounds took %.1f s (wall time, start-up included); the equal split (FedAvg) "
        "would have needed about %s s for the same rounds (a prediction: each round's wall "
        "time with its slowest compute swapped for the equal split's on the silos' cost "
        "curves, as good as those curves)",
        len(taken),
        spent,
        "n/a" if equal is None else f"{equal:.1f}",
    )
    metrics = result.train_metrics_clientapp
    if metrics:
        last = metrics[max(metrics)]
        last[WALL_CLOCK_TIME] = spent
        if equal is not None:
            last[EQUAL_SPLIT_TIME] = equal
