"""Checkpointing as a strategy wrapper: it owns the round offset of a resumed run.

:class:`Checkpointing` wraps a strategy as Flower's differential-privacy wrappers do
(``DifferentialPrivacyServerSideFixedClipping(strategy, ...)``): Flower's round loop
(:meth:`flwr.serverapp.strategy.Strategy.start`) drives the wrapper, which passes every
call to the wrapped strategy and writes a checkpoint after each training round
(:func:`~fl_lbbsp.strategies.checkpoint.save_checkpoint`). Started on a folder that holds
a checkpoint of round k, it restores the wrapped strategy from it and runs rounds
k+1 .. ``num_rounds``: Flower's loop counts from 1, and the wrapper alone adds k to every
round number the wrapped strategy, ``evaluate_fn`` and the returned ``Result`` see (its
own "[ROUND i/n]" log lines still count from 1).

:meth:`LBBSPFedAvg.start <fl_lbbsp.strategies.LBBSPFedAvg.start>` wraps itself in one
when it has a ``checkpoint_dir``; the file format is
:mod:`fl_lbbsp.strategies.checkpoint_file`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from .checkpoint import Checkpointable, CheckpointStore, ResumePoint, resume_from, save_checkpoint

__all__ = ["Checkpointing", "EvaluateFn"]

log = logging.getLogger("fl_lbbsp")

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
"""Flower's ``evaluate_fn``: the global model's metrics of a round (``None``: none)."""


class CheckpointableStrategy(Checkpointable, Protocol):
    """A Flower strategy that offers its state to be checkpointed."""

    def summary(self) -> None:
        """Log the strategy's settings."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """As :meth:`flwr.serverapp.strategy.Strategy.configure_train`."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """As :meth:`flwr.serverapp.strategy.Strategy.aggregate_train`."""

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """As :meth:`flwr.serverapp.strategy.Strategy.configure_evaluate`."""

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """As :meth:`flwr.serverapp.strategy.Strategy.aggregate_evaluate`."""


class Checkpointing(Strategy):
    """Checkpoint ``strategy`` after every training round; resume it from the newest one.

    Parameters
    ----------
    strategy : CheckpointableStrategy
        The wrapped strategy (an :class:`~fl_lbbsp.strategies.LBBSPFedAvg`): its
        ``checkpoint_settings``, ``checkpoint_state`` and ``load_checkpoint_state`` are
        what a checkpoint holds and restores.
    store : CheckpointStore
        Where the checkpoints are written and the newest is resumed from (unless
        ``start`` is given the checkpoint of ``store`` the run resumes from, already
        validated and restored into ``strategy``, as a runner resolves it before round 1:
        :func:`~fl_lbbsp.strategies.checkpoint.resume_from`).

    Notes
    -----
    A checkpoint of round k holds the round's new global model (the model sent, when the
    round aggregated nothing) and the wrapped strategy's state once the round is
    aggregated; a round that stops the run (:class:`~fl_lbbsp.strategies.NoUpdateError`)
    writes none, so a rerun repeats it. Nothing in a checkpoint is obeyed before
    :func:`~fl_lbbsp.strategies.checkpoint.resume_point` has validated it.
    """

    def __init__(self, strategy: CheckpointableStrategy, *, store: CheckpointStore) -> None:
        super().__init__()
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
        return self.strategy.configure_evaluate(
            server_round + self.round_offset, arrays, config, grid
        )

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
        ``resume``, else from the newest checkpoint in the store, validated and restored
        here. On a resume from round k the checkpoint's model replaces
        ``initial_arrays``, ``evaluate_fn`` first evaluates it as round k, and rounds
        k+1 .. ``num_rounds`` run; nothing runs when k is already ``num_rounds``.

        Raises
        ------
        CheckpointError
            The newest readable checkpoint belongs to another strategy or settings, or
            no checkpoint file is readable.
        CheckpointInvalidError
            Its contents fail validation, or the wrapped strategy cannot restore them.
        """
        if resume is None:
            resume = resume_from(self.strategy, store=self.store, initial_arrays=initial_arrays)
        done = 0
        if resume is not None:
            checkpoint = resume.checkpoint
            done = checkpoint.server_round
            initial_arrays = checkpoint.arrays
            dropped = self.strategy.telemetry.drop_rounds_after(done)
            log.info(
                "[%s] resuming from %s: round %d of %d done; the initial arrays passed to "
                "start are ignored%s",
                self.strategy.scheme,
                checkpoint.path,
                done,
                num_rounds,
                f"; {dropped} telemetry events of later rounds removed" if dropped else "",
            )
            if done >= num_rounds:
                return Result(arrays=checkpoint.arrays)
        self.round_offset = done
        result = super().start(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds - done,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=None if evaluate_fn is None else self._shifted(evaluate_fn),
        )
        return Result(
            arrays=result.arrays,
            train_metrics_clientapp=self._shift_keys(result.train_metrics_clientapp),
            evaluate_metrics_clientapp=self._shift_keys(result.evaluate_metrics_clientapp),
            evaluate_metrics_serverapp=self._shift_keys(result.evaluate_metrics_serverapp),
        )

    def _shifted(self, fn: EvaluateFn) -> EvaluateFn:
        return lambda server_round, arrays: fn(server_round + self.round_offset, arrays)

    def _shift_keys(self, metrics: dict[int, MetricRecord]) -> dict[int, MetricRecord]:
        return {server_round + self.round_offset: m for server_round, m in metrics.items()}
