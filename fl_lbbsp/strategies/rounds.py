"""Round logic shared by the Message-API strategy and the legacy-API adapter.

Both strategies turn a silo's reply metrics into a :class:`~fl_lbbsp.core.SiloReport`, feed
it to the same :class:`~fl_lbbsp.core.BatchSizeBalancer`, ask it for the next batch sizes
and log / record the round the same way; only the Flower types around them differ.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from ..contract import RecordKeys
from ..core import BatchSizeBalancer, InvalidReportError, SiloReport, idle_fraction
from ..telemetry import TelemetryWriter
from .config import BalancingConfig

__all__ = [
    "allocate_batch_sizes",
    "balancer_from_config",
    "feed_balancer",
    "format_silos",
    "log_round",
    "missing",
    "natural_key",
    "silo_report",
    "silo_round_time",
]

log = logging.getLogger("fl_lbbsp")

K = TypeVar("K")


def balancer_from_config(config: BalancingConfig) -> BatchSizeBalancer:
    """The balancer a strategy with these settings uses (one place for both APIs)."""
    return BatchSizeBalancer(
        initial_batch_size=config.initial_batch_size,
        estimator=config.estimator,
        alpha=config.alpha,
        allocator=config.allocator,
        min_batch_size=config.min_batch_size,
        min_batch_fraction=config.min_batch_fraction,
        max_batch_size=config.max_batch_size,
        max_change_ratio=config.max_change_ratio,
        fit=config.fit,
        change_sigmas=config.change_sigmas,
        change_threshold=config.change_threshold,
        change_confirm=config.change_confirm,
        order_tolerance=config.order_tolerance,
        equal_split_guard=config.equal_split_guard,
        equal_split_margin=config.equal_split_margin,
        estimator_options=config.estimator_options,
        allocator_options=config.allocator_options,
    )


def allocate_batch_sizes(
    balancer: BatchSizeBalancer,
    config: BalancingConfig,
    silo_of: Mapping[K, str],
    *,
    total: int | None = None,
) -> dict[K, int]:
    """Next batch size of each client key (node id, cid) from its silo's prediction.

    Parameters
    ----------
    balancer : BatchSizeBalancer
        The strategy's balancer.
    config : BalancingConfig
        The strategy's settings; ``balance=False`` gives B_init to everyone.
    silo_of : Mapping
        Client key (a node id or a legacy cid) -> stable silo id.
    total : int | None (default: None)
        The total X to split; ``None``: ``n * B_init`` for the n clients given.
    """
    if not config.balance:
        return {key: config.initial_batch_size for key in silo_of}
    # Only an estimator with a warm-up (NARX) has anything to say; no scan otherwise.
    warming = balancer.warming_up() if config.estimator == "narx" else {}
    if warming:
        seen, warmup = min(warming.values())
        log.info(
            "%s: %d silo(s) still predicted by the EMA warm-up (%d of %d reports; "
            "set the estimator's warmup to train sooner)",
            config.estimator,
            len(warming),
            seen,
            warmup,
        )
    sizes = balancer.allocate(silo_of.values(), total=total)
    return {key: sizes[silo] for key, silo in silo_of.items()}


def silo_report(
    metrics: Mapping[str, Any], *, keys: RecordKeys, sent_batch_size: int | None
) -> SiloReport:
    """The balancer report in a silo's reply metrics, values as sent (validated later).

    Parameters
    ----------
    metrics : Mapping[str, Any]
        The reply's MetricRecord (Message API) or FitRes metrics (legacy API).
    keys : RecordKeys
        Names of the metric entries.
    sent_batch_size : int | None
        Batch size the server sent, used when the silo does not report one.
    """
    cap = metrics.get(keys.max_batch_size)
    return SiloReport(
        batch_size=metrics.get(keys.batch_size, sent_batch_size or 0),
        train_time=metrics.get(keys.train_time, math.nan),
        samples=metrics.get(keys.samples_processed),
        cpu_percent=metrics.get(keys.cpu_percent),
        memory_percent=metrics.get(keys.memory_percent),
        max_batch_size=cap if cap else None,
        fixed_time=metrics.get(keys.he_time),
    )


def feed_balancer(
    balancer: BatchSizeBalancer,
    silo: str,
    metrics: Mapping[str, Any],
    *,
    keys: RecordKeys,
    sent_batch_size: int | None,
) -> dict[str, Any]:
    """Report one silo's round to the balancer; return its telemetry record.

    An unusable report (non-finite time, zero batch size, ...) is left out of balancing
    with a warning and ``invalid-report`` in the record; the silo keeps its estimate.
    """
    record: dict[str, Any] = {k: v for k, v in metrics.items() if not isinstance(v, list)}
    record["batch-size-sent"] = sent_batch_size
    try:
        balancer.report(silo, silo_report(metrics, keys=keys, sent_batch_size=sent_batch_size))
    except InvalidReportError as err:
        log.warning("round report of silo %s left out of balancing: %s", silo, err)
        record["invalid-report"] = str(err)
    record["predicted-speed"] = balancer.predicted_speed(silo)
    return record


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
    """One log line and one telemetry ``train`` event for a finished round.

    Parameters
    ----------
    scheme : str
        ``"lbbsp"`` or ``"fedavg"``.
    server_round : int
        The round.
    silos : Mapping[str, Mapping[str, Any]]
        Silo id -> telemetry record (from :func:`feed_balancer`).
    keys : RecordKeys
        Names of the metric entries.
    total_batch_size : int
        Sum of the batch sizes sent this round.
    wall : float | None
        Seconds from sending the round to aggregating it, if measured.
    telemetry : TelemetryWriter
        Where the event goes.
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
    busy = [float(r["busy-time"]) for r in silos.values() if "busy-time" in r]
    # Server wall time beyond the longest silo's own busy time: messaging, scheduling.
    overhead = None if wall is None or not busy else max(wall - max(busy), 0.0)
    order = sorted(silos, key=natural_key)
    log.info(
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


def silo_round_time(record: Mapping[str, Any], keys: RecordKeys) -> float:
    """A silo's reported round: ``train-time`` plus ``he-time`` (encrypted mode) if any."""
    return float(record[keys.train_time]) + float(record.get(keys.he_time, 0.0))


def natural_key(silo: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key for silo ids in natural order: ``2`` before ``10``, ``silo-2`` before
    ``silo-10`` (digit runs compare as numbers, the rest as text)."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.split(r"(\d+)", silo)
        if part
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
        Numeric value per silo (``None`` or missing values are shown as ``n/a``).
    spec : str (default: "")
        Format spec of each value, e.g. ``".3f"``.
    limit : int (default: 20)
        Most silos listed one by one.
    largest : int (default: 3)
        Silos named in the summary beyond ``limit``.
    largest_label : str (default: "largest")
        What the summary calls them.
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


def missing(sent: Iterable[K], replied: Iterable[K]) -> list[K]:
    """Keys that were sent a message but gave no usable reply, in sending order."""
    got = set(replied)
    return [key for key in sent if key not in got]
