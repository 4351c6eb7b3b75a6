"""What a round's outcome tells the user: loud failure, one line per decision, Result.

A strategy that plugs into someone else's Flower app must not fail silently there:

- a reply rejected for a reason that will repeat is logged once per silo and cause, with
  the fix; later ones go to DEBUG (the telemetry keeps every one);
- a run whose first round, or ``max_empty_rounds`` rounds in a row, aggregate no update
  stops with :class:`NoUpdateError`, so ``flwr run`` and ``fl-lbbsp`` exit non-zero
  instead of ending "completed" with the model they started from;
- each round's decision is one line through Flower's own logger (visible in
  ``flwr run --stream``), and Flower's ``Result`` gets per-silo batch sizes and
  predicted speeds instead of a weighted mean of ``batch-size``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import MetricRecord

from ..contract import PREDICTED_SPEED, SILO_APP_METRICS, TRAIN_LOSS, RecordKeys, silo_metric
from ..core.round.state import Node, RoundState, natural_key
from ..security.screening import contract_metric_keys
from ..telemetry import TelemetryWriter
from .rounds import format_silos, log_round

__all__ = [
    "NoUpdateError",
    "batch_size_metrics",
    "RoundOutcomes",
    "log_decision",
    "round_metrics",
    "route_to_flower",
    "warn_overridden_lr",
]

log = logging.getLogger("fl_lbbsp")
FLOWER_LOGGER = logging.getLogger("flwr")
"""Flower's logger, by its name (the object itself is not public API)."""

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


class NoUpdateError(RuntimeError):
    """The run aggregated no update in its first round, or in ``max_empty_rounds``
    rounds in a row: every reply was rejected or missing. The message says why."""


class RoundOutcomes:
    """Rejections logged once per silo and cause; rounds without an update counted.

    Parameters
    ----------
    max_empty_rounds : int
        Rounds in a row without an aggregated update that stop the run (the first
        round of a run stops it alone).
    """

    def __init__(self, *, max_empty_rounds: int) -> None:
        self.max_empty_rounds = max_empty_rounds
        self.rounds = 0
        self.empty = 0
        self._seen: set[tuple[str, str]] = set()

    def first_time(self, silo: str, reason: str) -> bool:
        """Whether this silo's rejection for this cause (the reason with its numbers
        taken out) is new; it is noted."""
        cause = (silo, _NUMBER.sub("#", reason))
        if cause in self._seen:
            return False
        self._seen.add(cause)
        return True

    def close(self, state: RoundState, *, aggregated: bool, skipped: str | None) -> None:
        """Count the round; raise when the run aggregates nothing.

        Raises
        ------
        NoUpdateError
            The run's first round, or ``max_empty_rounds`` in a row, had no update.
        """
        first = self.rounds == 0
        self.rounds += 1
        if aggregated:
            self.empty = 0
            return
        self.empty += 1
        if not first and self.empty < self.max_empty_rounds:
            return
        causes = sorted({f"{r['silo']}: {r['reason']}" for r in state.rejected})
        missed = "no reply arrived in time" if not state.reports and not causes else ""
        why = "; ".join(causes[:5]) or missed or (skipped or "no valid update")
        when = (
            "the first round"
            if first
            else f"{self.empty} rounds in a row (max_empty_rounds={self.max_empty_rounds})"
        )
        raise NoUpdateError(
            f"round {state.server_round}: no update aggregated in {when}, so the model "
            f"would never change; stopping. Why: {why}"
        )


def route_to_flower() -> None:
    """Send the ``fl_lbbsp`` logger's records to Flower's console handler when nobody
    configured logging (a ServerApp under ``flwr run``): otherwise its warnings would
    go through Python's last-resort handler and its INFO lines nowhere."""
    ours = logging.getLogger("fl_lbbsp")
    if ours.handlers or logging.getLogger().handlers:
        return
    for handler in FLOWER_LOGGER.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)
    ours.propagate = False


def log_decision(
    *,
    scheme: str,
    state: RoundState,
    keys: RecordKeys,
    rejected: Sequence[Mapping[str, Any]],
    telemetry: TelemetryWriter,
    wall: float | None,
    extra: Mapping[str, Any],
    silo_id: Callable[[Node], str] | None = None,
) -> None:
    """A closed round's telemetry event and DEBUG line (:func:`~.rounds.log_round`, with
    ``extra`` and ``rejected``), then its one line through Flower's logger: per-silo batch
    sizes (by the ids ``silo_id`` gives), the round time, predicted and ideal, the idle
    fraction, the silos left out with why (``rejected``, ``extra["missed"]``) and those
    that did not train as instructed (not balanced, their updates aggregated)."""
    log_round(
        scheme=scheme,
        server_round=state.server_round,
        silos=state.reports,
        keys=keys,
        total_batch_size=state.total,
        wall=wall,
        telemetry=telemetry,
        extra={**extra, "rejected": rejected},
    )
    left_out = {str(r["silo"]): f"rejected: {r['reason']}" for r in rejected}
    left_out.update({silo: "no reply in time" for silo in extra["missed"]})
    # aggregated, but its time is not a measure of its speed: not left out
    unbalanced = sorted((s for s, r in state.reports.items() if "misuse" in r), key=natural_key)
    shares = (
        state.shares
        if silo_id is None
        else {silo_id(node): ins.share for node, ins in state.instructions.items()}
    )
    order = sorted(shares, key=natural_key)
    times = [
        float(r[keys.train_time])
        for r in state.reports.values()
        if "invalid-report" not in r and isinstance(r.get(keys.train_time), int | float)
    ]
    idle = 1 - sum(times) / len(times) / max(times) if times and max(times) > 0 else None
    took = _seconds(max(times)) if times else "n/a"
    out = "; ".join(f"{silo} ({why})" for silo, why in sorted(left_out.items())) or "none"
    balanced = (
        f" | not balanced: {' '.join(unbalanced)} (did not train as instructed, see its "
        "warning; its update is aggregated)"
        if unbalanced
        else ""
    )
    FLOWER_LOGGER.info(
        "[%s] round %d: B %s | round time %s, predicted %s, ideal %s | idle %s | left out: %s%s",
        scheme,
        state.server_round,
        format_silos({s: shares[s] for s in order}),
        took,
        _seconds(state.predicted),
        _seconds(state.ideal),
        "n/a" if idle is None else f"{100 * idle:.1f}%",
        out,
        balanced,
    )


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g} s"


EPOCH_KEYS = ("local-epochs", "epochs")
"""Train-config entries of Flower's app templates for the epochs a silo trains a round,
which LB-BSP's tau replaces."""


def warn_overridden_lr(
    config: Mapping[str, Any],
    *,
    keys: RecordKeys,
    lr: float,
    owner: object,
    local_steps: int | None = None,
) -> None:
    """Warn when the app's own train config (``start(train_config=...)``) sets the learning
    rate to another value than the strategy's: every silo trains with the strategy's ``lr``
    (eta is the same for all in LB-BSP), so the app's would be overridden without a word.
    Likewise, in one warning, a ``batch-size`` (each silo is sent its own B_i) or a
    ``local-steps`` other than the strategy's, and a ``local-epochs`` (or ``epochs``): tau
    = ``local_steps`` steps replace them."""
    overridden = []
    if (batch := config.get(keys.batch_size)) is not None:
        overridden.append(f"{keys.batch_size}={batch} (each silo is sent its own batch size)")
    if (steps := config.get(keys.local_steps)) is not None and steps != local_steps:
        why = f"every silo runs the strategy's local-steps={local_steps}"
        overridden.append(f"{keys.local_steps}={steps} ({why})")
    overridden += [
        f"{key}={config[key]} (every silo runs local-steps={local_steps} steps instead, "
        "drawn through plan.loader / plan.batch_sampler)"
        for key in EPOCH_KEYS
        if key in config
    ]
    if overridden:
        FLOWER_LOGGER.warning(
            "%s: the train config's %s %s overridden",
            type(owner).__name__,
            ", ".join(overridden),
            "is" if len(overridden) == 1 else "are",
        )
    theirs = config.get(keys.lr)
    if isinstance(theirs, int | float) and not isinstance(theirs, bool) and theirs != lr:
        FLOWER_LOGGER.warning(
            "%s: the train config's %s=%s is overridden: every silo trains with the "
            "strategy's lr=%s (give the strategy lr=%s to use yours)",
            type(owner).__name__,
            keys.lr,
            theirs,
            lr,
            theirs,
        )


def batch_size_metrics(
    state: RoundState, *, keys: RecordKeys, silo_id: Callable[[Node], str] | None = None
) -> dict[str, int]:
    """``batch-size/<silo>`` for every silo sent a batch size this round, named by the
    stable id its node reported (``silo_id``, the engine's) where known."""
    return {
        silo_metric(keys.batch_size, silo_id(node) if silo_id is not None else ins.silo): int(
            ins.share
        )
        for node, ins in state.instructions.items()
    }


def round_metrics(
    aggregated: MetricRecord | None,
    *,
    state: RoundState,
    keys: RecordKeys,
    silo_id: Callable[[Node], str] | None = None,
) -> MetricRecord:
    """The round's MetricRecord for Flower's ``Result``: the app's own metrics as
    ``train_metrics_aggr_fn`` aggregated them, without the contract's nor our per-silo
    timings (their mean means nothing; ``train-loss`` stays), plus ``batch-size/<silo>``
    (:func:`batch_size_metrics`) and ``predicted-speed/<silo>`` (samples per second) for
    every silo the balancer predicts."""
    contract = contract_metric_keys(keys) | (set(SILO_APP_METRICS) - {TRAIN_LOSS})
    record: dict[str, Any] = {
        key: value for key, value in (aggregated or {}).items() if key not in contract
    }
    record.update(batch_size_metrics(state, keys=keys, silo_id=silo_id))
    for silo, report in state.reports.items():
        speed = report.get(PREDICTED_SPEED)
        if isinstance(speed, int | float):
            record[silo_metric(PREDICTED_SPEED, silo)] = float(speed)
    return MetricRecord(record)
