"""The round's log line and telemetry event, the same for every strategy.

The decisions are the round engine's (:mod:`fl_lbbsp.core.round.engine`); this module only
shows them: one telemetry ``train`` event per round and a DEBUG line of every silo's
times (the round's one INFO line is :func:`~fl_lbbsp.strategies.outcomes.log_decision`'s,
readable for any number of silos).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from ..contract import BUSY_TIME, RecordKeys
from ..core import BatchSizeBalancer, idle_fraction
from ..core.round.engine import RoundEngine
from ..core.round.state import natural_key, silo_round_time
from ..core.settings import BalancingConfig
from ..telemetry import TelemetryWriter

__all__ = ["EngineView", "format_silos", "log_round", "natural_key"]

log = logging.getLogger("fl_lbbsp")


class EngineView:
    """What both Flower adapters show of their :class:`~fl_lbbsp.core.round.engine.RoundEngine`."""

    engine: RoundEngine

    @property
    def config(self) -> BalancingConfig:
        """B_init, tau, eta and the balancer's settings."""
        return self.engine.config

    @property
    def balancer(self) -> BatchSizeBalancer:
        """The engine's balancer."""
        return self.engine.balancer

    @property
    def min_train_silos(self) -> int:
        """Fewest valid replies a round needs."""
        return self.engine.limits.min_train_silos

    def silo_id(self, node: int | str) -> str:
        """The stable silo id last reported by ``node`` (``node-<id>``, or a legacy
        client's cid, before that)."""
        return self.engine.silo_id(node)


def log_round(
    *,
    scheme: str,
    server_round: int,
    silos: Mapping[str, Mapping[str, Any]],
    keys: RecordKeys,
    total_batch_size: int,
    wall: float | None,
    telemetry: TelemetryWriter,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """One telemetry ``train`` event for a finished round, and a DEBUG line with every
    silo's train-time and the wall time (the round's INFO line is
    :func:`~fl_lbbsp.strategies.outcomes.log_decision`'s).

    Parameters
    ----------
    silos : Mapping[str, Mapping[str, Any]]
        Silo id -> its report (the round's telemetry record).
    total_batch_size : int
        Sum of the batch sizes sent this round.
    wall : float | None
        Seconds from sending the round to aggregating it, if measured.
    extra : Mapping[str, Any] | None (default: None)
        More fields for the telemetry event (deadline, silos that missed it, ...).
    """
    # A silo's round: its compute plus, in encrypted mode, encryption and decryption.
    times = [
        silo_round_time(r, keys)
        for r in silos.values()
        if "invalid-report" not in r and keys.train_time in r
    ]
    round_time = max(times) if times else None
    idle = idle_fraction(times) if times else None
    busy = [float(r[BUSY_TIME]) for r in silos.values() if BUSY_TIME in r]
    # Server wall time beyond the longest silo's own busy time: messaging, scheduling.
    overhead = None if wall is None or not busy else max(wall - max(busy), 0.0)
    order = sorted(silos, key=natural_key)
    log.debug(
        "[%s] round %d | B: %s | train-time (s): %s | round time %s s | idle %s | wall %s s",
        scheme,
        server_round,
        format_silos({s: silos[s].get(keys.batch_size) for s in order}),
        format_silos(
            {s: silos[s].get(keys.train_time) for s in order},
            spec=".3f",
            largest_label="slowest",
        ),
        "n/a" if round_time is None else f"{round_time:.3f}",
        "n/a" if idle is None else f"{100 * idle:.1f}%",
        "n/a" if wall is None else f"{wall:.2f}",
    )
    telemetry.write(
        {
            "event": "train",
            "scheme": scheme,
            "round": server_round,
            "round_time": round_time,
            "idle_fraction": idle,
            "wall_time": wall,
            "overhead": overhead,
            "total_batch_size": int(total_batch_size),
            "silos": {s: dict(silos[s]) for s in order},
            **(extra or {}),
        }
    )


def format_silos(
    values: Mapping[str, Any],
    *,
    spec: str = "",
    limit: int = 20,
    largest: int = 3,
    largest_label: str = "largest",
) -> str:
    """Per-silo values for a log line, readable for any number of silos.

    Up to ``limit`` silos: ``silo=value`` in natural order (:func:`natural_key`). Beyond:
    ``N silos: min / median / max`` and the ``largest`` silos with the largest values
    (e.g. the slowest, for times).

    Parameters
    ----------
    values : Mapping[str, Any]
        Numeric value per silo (``None`` is shown as ``n/a``).
    spec : str (default: "")
        Format spec of each value, e.g. ``".3f"``.
    largest_label : str (default: "largest")
        What the summary calls the ``largest`` silos it names.
    """

    def show(value: Any) -> str:
        if value is None:
            return "n/a"
        return format(value, "g" if not spec and isinstance(value, float) else spec)

    order = sorted(values, key=natural_key)
    if len(order) <= limit:
        return " ".join(f"{s}={show(values[s])}" for s in order)
    known = [s for s in order if isinstance(values[s], int | float) and math.isfinite(values[s])]
    if not known:
        return f"{len(order)} silos, no values"
    numbers = sorted(values[s] for s in known)
    half = len(numbers) // 2
    middle = numbers[half] if len(numbers) % 2 else (numbers[half - 1] + numbers[half]) / 2
    top = sorted(known, key=lambda s: (-float(values[s]), natural_key(s)))[:largest]
    return (
        f"{len(order)} silos: min {show(numbers[0])} / median {show(middle)} / "
        f"max {show(numbers[-1])}; {largest_label}: "
        + " ".join(f"{s}={show(values[s])}" for s in top)
    )
