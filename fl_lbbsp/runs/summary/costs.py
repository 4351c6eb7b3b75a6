"""The cost lines T* is computed from: this machine's measured compute cost of a round
(:func:`fit_cost_line`), or a cost model's exact one (:func:`modelled_cost_line`), one
line for every run of a comparison (:func:`run_cost_lines`), and each silo's emulated
slowdown in a round (:func:`slowdowns_at`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ...clients.emulation import CostModel, SlowdownSchedule
from ...contract import STEP_BATCH_SIZE
from ...core import fit_linear_cost, ideal_round_time, linear_minmax_continuous

__all__ = [
    "CostLine",
    "Events",
    "fit_cost_line",
    "modelled_cost_line",
    "run_cost_lines",
    "slowdowns_at",
    "train_events",
]

Events = Sequence[dict[str, Any]]


class CostLine:
    """This machine's measured compute cost of a round: ``t = a * B + b`` (seconds).

    Silo i, emulated ``k_i`` times slower, costs ``k_i * (a * B + b)``.
    """

    def __init__(self, a: float, b: float, *, fitted: bool = True) -> None:
        self.a, self.b = a, b
        self.fitted = fitted
        """False when the runs had one batch size only: a line through the origin."""

    def ideal(self, slowdowns: Sequence[float], total: int, *, min_batch_size: int = 1) -> float:
        """Ideal round time with a_i = k_i a, b_i = k_i b.

        ``T* = (X + sum b_i/a_i) / sum 1/a_i`` (shared/DESIGN.md) when every silo's share
        at T* is at least ``min_batch_size``; otherwise the exact min-max with that lower
        bound (a silo cannot run less than one sample per step).
        """
        k = np.asarray(slowdowns, dtype=np.float64)
        a, b = k * self.a, k * self.b
        t_star = ideal_round_time(a, b, total)
        if np.all((t_star - b) / a >= min_batch_size):
            return t_star
        x, _ = linear_minmax_continuous(a, b, float(total), lower=np.full(len(k), min_batch_size))
        return float(np.max(a * x + b))


def train_events(events: Events) -> list[dict[str, Any]]:
    """The ``train`` events of a run's telemetry."""
    return [e for e in events if e.get("event") == "train"]


def fit_cost_line(*runs: Events) -> CostLine:
    """Fit the unemulated ``compute-time`` against batch size over every silo and round.

    Every silo runs on this same machine, so their real (unemulated) compute times lie on
    one line. A silo that ran other than the configured tau steps (scheme ``lbbsp-tau``:
    ``samples-processed / step-batch-size`` steps) counts at ``tau / steps`` times its
    time, so that the line is the cost of tau steps at every batch size. Runs where every
    silo used one batch size give ``b = 0`` through the origin (nothing tells the fixed
    cost apart). Each silo's first report is left out where it has later ones: it holds
    its process's one-off start-up (the server takes it as provisional too), not its cost.
    """
    xs, ts = [], []
    for events in runs:
        tau = _local_steps(events)
        rounds = train_events(events)
        seen: set[str] = set()
        for event in rounds:
            for name, silo in event["silos"].items():
                first = name not in seen
                seen.add(name)
                if first and len(rounds) > 1:
                    continue
                if "compute-time" in silo and "batch-size" in silo:
                    x = float(silo.get(STEP_BATCH_SIZE, silo["batch-size"]))
                    steps = float(silo.get("samples-processed") or x * (tau or 1)) / x
                    xs.append(x)
                    ts.append(float(silo["compute-time"]) * (tau or steps) / steps)
    fit = fit_linear_cost(xs, ts)
    if fit is None:
        a = float(np.sum(ts) / np.sum(xs))
        return CostLine(a, 0.0, fitted=False)
    return CostLine(*fit)


def _local_steps(events: Events) -> int | None:
    config = next((e for e in events if e.get("event") == "config"), {})
    steps = config.get("local_steps")
    return None if steps is None else int(steps)


def modelled_cost_line(events: Events) -> CostLine | None:
    """The exact cost line of a run whose silos report a cost model's time
    (``cost_model`` ``"m,b"`` in its config): ``t = tau * (m * B + b)``; ``None`` for a
    run of measured times."""
    config = next((e for e in events if e.get("event") == "config"), {})
    text = config.get("cost_model")
    if not text:
        return None
    cost = CostModel.parse(str(text))
    tau = int(config.get("local_steps") or 1)
    return CostLine(tau * cost.per_sample, tau * cost.fixed)


def run_cost_lines(runs: dict[str, Events]) -> tuple[CostLine, dict[str, CostLine]]:
    """The one cost line every run of a comparison is measured against.

    Silos that report a cost model's time (:func:`modelled_cost_line`) give the exact
    line. Otherwise the line is fitted once on the real (unemulated) compute times of
    every scheme's silo-rounds, so that all schemes of one comparison share one T* and
    their ratios compare. Returns the line and, for convenience, the same line under
    every run's name.
    """
    modelled = [modelled_cost_line(events) for events in runs.values()]
    if modelled and all(line is not None for line in modelled):
        line = cast(CostLine, modelled[0])
    else:
        line = fit_cost_line(*runs.values())
    return line, dict.fromkeys(runs, line)


def slowdowns_at(config: dict[str, Any], server_round: int) -> list[float]:
    """Each silo's emulated slowdown in ``server_round``, from a run's config event
    (``speeds``, ``time_dilation`` and, where set, ``slowdown_schedules``)."""
    speeds = config.get("speeds")
    silos = int(config["silos"])
    dilation = float(config.get("time_dilation") or 1.0)
    base = [dilation] * silos if not speeds else [dilation * max(speeds) / s for s in speeds]
    schedules = config.get("slowdown_schedules") or ["1"] * silos
    return [
        k * SlowdownSchedule.parse(text).factor(server_round)
        for k, text in zip(base, schedules, strict=True)
    ]
