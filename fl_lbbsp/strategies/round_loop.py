"""Flower's round loop, started with its arguments as one value.

:meth:`flwr.serverapp.strategy.Strategy.start` takes seven arguments (the grid, the
initial model, the rounds, the timeout, the train and evaluate configs, ``evaluate_fn``).
The LB-BSP strategies change some of them before Flower's loop runs: the grid (behind the
round deadlines), the initial model and the rounds (a resumed run), ``evaluate_fn`` (the
round offset). :class:`StartCall` carries the arguments of one call, and
:class:`RoundLoop` is a strategy whose ``start`` hands them to :meth:`RoundLoop.run_rounds`
as one; :class:`~fl_lbbsp.strategies.EngineStrategy` and the wrapper
:class:`~fl_lbbsp.strategies.checkpointing.Checkpointing` are such strategies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from .checkpoint import ResumePoint

__all__ = ["EvaluateFn", "RoundLoop", "StartCall"]

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
"""Flower's ``evaluate_fn``: the global model's metrics of a round (``None``: none)."""


@dataclass(frozen=True, kw_only=True)
class StartCall:
    """The arguments of one call of Flower's round loop, with its defaults.

    Attributes
    ----------
    grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn :
        As in :meth:`flwr.serverapp.strategy.Strategy.start`.
    """

    grid: Grid
    initial_arrays: ArrayRecord
    num_rounds: int = 3
    timeout: float = 3600
    train_config: ConfigRecord | None = None
    evaluate_config: ConfigRecord | None = None
    evaluate_fn: EvaluateFn | None = None

    def but(self, **changes: Any) -> StartCall:
        """This call with ``changes`` (the fields' names) in place of some arguments."""
        return replace(self, **changes)

    def on(self, start: Callable[..., Result]) -> Result:
        """Call ``start`` (a round loop, e.g. a strategy's ``start``) with these arguments."""
        return start(**{f.name: getattr(self, f.name) for f in fields(self)})


class RoundLoop(Strategy):
    """A strategy whose ``start`` hands its arguments to :meth:`run_rounds` as one
    :class:`StartCall`."""

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
        """As :meth:`flwr.serverapp.strategy.Strategy.start`; ``resume``: the checkpoint
        the run resumes from, already validated and restored into the strategy
        (:func:`~fl_lbbsp.strategies.checkpoint.resume_from`). See :meth:`run_rounds`."""
        call = StartCall(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
        )
        return self.run_rounds(call, resume=resume)

    def flower_rounds(self, call: StartCall) -> Result:
        """Flower's own round loop (the base strategy's ``start``) on ``call``."""
        return call.on(super().start)

    def run_rounds(self, call: StartCall, *, resume: ResumePoint | None = None) -> Result:
        """Run the rounds of ``call`` (from ``resume``, if given).

        Raises
        ------
        NotImplementedError
            In a strategy that does not say how it runs its rounds.
        """
        raise NotImplementedError(f"{type(self).__name__} does not say how it runs its rounds")
