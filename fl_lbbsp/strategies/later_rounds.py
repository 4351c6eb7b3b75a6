"""Rounds numbered on: :class:`LaterRounds` runs Flower's own round loop
(:meth:`flwr.serverapp.strategy.Strategy.start`) over a strategy's rounds after a given
one, as a resumed run (:class:`~fl_lbbsp.strategies.checkpointing.Checkpointing`) and the
extra rounds of ``spend_saved_time`` need; :func:`merge_results` joins two runs' results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

__all__ = ["METRICS", "EvaluateFn", "LaterRounds", "merge_results"]

log = logging.getLogger("fl_lbbsp")

METRICS = ("train_metrics_clientapp", "evaluate_metrics_clientapp", "evaluate_metrics_serverapp")
"""The per-round fields of Flower's ``Result``."""
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
"""Flower's ``evaluate_fn``: the global model's metrics of a round (``None``: none)."""


class LaterRounds(Strategy):
    """``strategy``'s rounds numbered on from ``round_offset``: :meth:`run` is Flower's
    round loop over rounds ``round_offset + 1 ..``, as a resumed run
    (:class:`~fl_lbbsp.strategies.checkpointing.Checkpointing`) and the extra rounds of
    ``spend_saved_time`` run them.

    Parameters
    ----------
    strategy : Strategy
        The wrapped strategy; it sees the run's round numbers.
    round_offset : int (default: 0)
        Rounds done before the first of these.
    """

    def __init__(self, strategy: Strategy, *, round_offset: int = 0) -> None:
        self.strategy, self.round_offset = strategy, round_offset

    def summary(self) -> None:
        """The wrapped strategy's summary; for later rounds, from which they are numbered."""
        if not self.round_offset:
            return self.strategy.summary()
        log.info("rounds numbered on after round %d (Flower's log counts them from 1)",
                 self.round_offset)  # fmt: skip

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's, in the run's round numbers."""
        return self.strategy.configure_train(server_round + self.round_offset, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's, in the run's round numbers."""
        return self.strategy.aggregate_train(server_round + self.round_offset, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's, in the run's round numbers."""
        round_ = server_round + self.round_offset
        return self.strategy.configure_evaluate(round_, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The wrapped strategy's, in the run's round numbers."""
        return self.strategy.aggregate_evaluate(server_round + self.round_offset, replies)

    def run(
        self,
        *,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        evaluate_first: bool = True,
    ) -> Result:
        """Flower's round loop (:meth:`flwr.serverapp.strategy.Strategy.start`) over
        ``num_rounds`` rounds after ``round_offset``: its ``Result`` and ``evaluate_fn``
        in the run's round numbers (``initial_arrays`` evaluated as round
        ``round_offset`` only if ``evaluate_first``)."""
        shift = self.round_offset

        def shifted(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            assert evaluate_fn is not None
            if server_round == 0 and not evaluate_first:
                return None
            return evaluate_fn(server_round + shift, arrays)

        run = super().start(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=None if evaluate_fn is None else shifted,
        )
        return Result(
            arrays=run.arrays,
            **{name: {r + shift: m for r, m in getattr(run, name).items()} for name in METRICS},
        )


def merge_results(first: Result, later: Result) -> Result:
    """``first`` followed by ``later`` (rounds numbered on): one ``Result``, with
    ``later``'s model unless it aggregated none."""
    metrics = {name: {**getattr(first, name), **getattr(later, name)} for name in METRICS}
    return Result(arrays=later.arrays if len(later.arrays) else first.arrays, **metrics)
