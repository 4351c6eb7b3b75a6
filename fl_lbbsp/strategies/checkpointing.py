"""Checkpointing as a strategy wrapper: it owns the round offset of a resumed run.

:class:`Checkpointing` wraps a strategy as Flower's differential-privacy wrappers do
(``DifferentialPrivacyServerSideFixedClipping(strategy, ...)``): Flower's round loop
(:meth:`flwr.serverapp.strategy.Strategy.start`) drives the wrapper, which passes every
call to the wrapped strategy and writes a checkpoint after each training round
(:func:`~fl_lbbsp.strategies.checkpoint.save_checkpoint`). Started on a folder that holds
a checkpoint of round k, it restores the wrapped strategy from it and runs rounds
k+1 .. ``num_rounds``: Flower's loop counts from 1, and the wrapper alone adds k to every
round number the wrapped strategy, ``evaluate_fn`` and the returned ``Result`` see (its
own "[ROUND i/n]" log lines still count from 1). :meth:`LBBSPFedAvg.start
<fl_lbbsp.strategies.LBBSPFedAvg.start>` wraps itself in one when it has a
``checkpoint_dir``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from .checkpoint import CheckpointStore, ResumePoint, resume_from, save_checkpoint

if TYPE_CHECKING:
    from .fedavg import LBBSPFedAvg

__all__ = ["Checkpointing", "EvaluateFn"]


log = logging.getLogger("fl_lbbsp")

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
"""Flower's ``evaluate_fn``: the global model's metrics of a round (``None``: none)."""


class Checkpointing(Strategy):
    """Checkpoint ``strategy`` after every training round; resume it from the newest one.

    Parameters
    ----------
    strategy : LBBSPFedAvg
        The wrapped strategy: its ``checkpoint_settings``, ``checkpoint_state`` and
        ``load_checkpoint_state`` are what a checkpoint holds and restores.
    store : CheckpointStore
        Where the checkpoints are written and the newest is resumed from.

    Notes
    -----
    A checkpoint of round k holds the round's new global model (the model sent, when the
    round aggregated nothing) and the wrapped strategy's state once the round is
    aggregated; a round that stops the run (:class:`~fl_lbbsp.strategies.NoUpdateError`)
    writes none, so a rerun repeats it.
    """

    def __init__(self, strategy: LBBSPFedAvg, *, store: CheckpointStore) -> None:
        self.strategy = strategy
        self.store = store
        self.round_offset = 0
        """Rounds done before this run started (the resumed checkpoint's round)."""
        self._sent: ArrayRecord | None = None

    def __repr__(self) -> str:
        return f"Checkpointing({self.strategy!r}, store={self.store.directory})"

    def summary(self) -> None:
        """The wrapped strategy's summary, and where the checkpoints go."""
        self.strategy.summary()
        log.info("checkpoints: every round in %s", self.store.directory)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's, in the run's round numbers."""
        self._sent = arrays
        return self.strategy.configure_train(server_round + self.round_offset, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's; then the round's checkpoint (a write that fails is
        logged, and the run goes on)."""
        server_round += self.round_offset
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        model = arrays if arrays is not None else self._sent
        if model is not None:
            try:
                save_checkpoint(self.store, self.strategy, server_round, model)
            except OSError as err:
                log.error("round %d: checkpoint not written: %s", server_round, err)
        return arrays, metrics

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

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        *,
        resume: ResumePoint | None = None,
    ) -> Result:
        """Flower's round loop, resumed after the newest valid checkpoint.

        As :meth:`flwr.serverapp.strategy.Strategy.start`. The run resumes from
        ``resume`` (a checkpoint of this store already validated and restored into the
        strategy, as a runner resolves it before round 1), else from the newest
        checkpoint in the store, validated and restored here. On a resume from round k
        the checkpoint's model replaces ``initial_arrays``, ``evaluate_fn`` first
        evaluates it as round k, and rounds k+1 .. ``num_rounds`` run; nothing runs when
        k is already ``num_rounds``.

        Raises
        ------
        CheckpointError, CheckpointInvalidError
            As :func:`~fl_lbbsp.strategies.checkpoint.resume_from`.
        """
        if resume is None:
            resume = resume_from(self.strategy, store=self.store, initial_arrays=initial_arrays)
        if resume is not None:
            checkpoint, self.round_offset = resume.checkpoint, resume.checkpoint.server_round
            initial_arrays = checkpoint.arrays
            dropped = self.strategy.telemetry.drop_rounds_after(self.round_offset)
            log.info(
                "[%s] resuming from %s: round %d of %d done; the initial arrays passed to "
                "start are ignored%s",
                self.strategy.scheme,
                checkpoint.path,
                self.round_offset,
                num_rounds,
                f"; {dropped} telemetry events of later rounds removed" if dropped else "",
            )
            if self.round_offset >= num_rounds:
                return Result(arrays=checkpoint.arrays)
        shift = self.round_offset

        def shifted(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            assert evaluate_fn is not None
            return evaluate_fn(server_round + shift, arrays)

        result = super().start(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds - shift,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=None if evaluate_fn is None else shifted,
        )
        return Result(
            arrays=result.arrays,
            **{
                name: {r + shift: m for r, m in getattr(result, name).items()}
                for name in (
                    "train_metrics_clientapp",
                    "evaluate_metrics_clientapp",
                    "evaluate_metrics_serverapp",
                )
            },
        )
