"""How long a planned round may take: its ideal and predicted time, stragglers, deadline.

The part of the round engine (:class:`~fl_lbbsp.core.round.engine.RoundEngine`) that times a
plan: the ideal compute time of a perfect split (``tau * X / sum v``), the silos the split
could not bring to the others' pace (:class:`~fl_lbbsp.core.round.deadline.StragglerWatch`: the
deadline does not wait for them), the predicted round time and the deadline
(:class:`~fl_lbbsp.core.round.deadline.DeadlinePolicy`), never below what a cold round showed
until a warm round has taught the messaging overhead.
"""

from __future__ import annotations

import math

from ..balancer import BatchSizeBalancer
from ..settings import BalancingConfig
from .deadline import (
    DeadlinePolicy,
    OverheadTracker,
    StragglerWatch,
    predicted_compute_time,
    predicted_times,
)
from .state import RoundState

__all__ = ["RoundTiming"]


class RoundTiming:
    """The timing of :class:`~fl_lbbsp.core.round.engine.RoundEngine`'s plans (a part of it,
    over its balancer, deadline policy, overhead and straggler watch)."""

    config: BalancingConfig
    balancer: BatchSizeBalancer
    deadline: DeadlinePolicy
    overhead: OverheadTracker
    stragglers: StragglerWatch
    _unlearned_wall: float | None

    def time_plan(self, state: RoundState, *, timeout_cap: float | None) -> None:
        """Set the planned round's ``ideal``, ``slow``, ``predicted`` and ``deadline``.

        Parameters
        ----------
        state : RoundState
            The round, its instructions planned.
        timeout_cap : float | None
            The longest any round may wait (``start``'s ``timeout``).
        """
        speeds = [self.balancer.predicted_speed(silo) for silo in state.shares]
        if speeds and all(v is not None and v > 0 for v in speeds):
            state.ideal = self.config.local_steps * state.total / math.fsum(v for v in speeds if v)
        state.slow = self._slow_silos(state)
        state.predicted = predicted_compute_time(
            self.balancer,
            {s: b for s, b in state.shares.items() if s not in state.slow},
            self.config.local_steps,
        )
        state.deadline = self.deadline.timeout(
            self.predicted_round_time(state),
            cap=timeout_cap,
            # the ideal bounds a balanced plan only: FedAvg's split commits to its slowest
            ideal=(
                state.ideal + self.overhead.predict()
                if state.ideal is not None and self.config.balance
                else None
            ),
        )
        state.deadline = self._not_below_seen(state.deadline, timeout_cap)

    def _not_below_seen(self, deadline: float | None, cap: float | None) -> float | None:
        """Until a warm round has taught the messaging overhead, no deadline shorter than
        ``margin`` times the wall time of the last round that could not (a cold first
        round holds start-up, which must not become the overhead, but is what the next
        round may well take again: a ClientApp process started per round)."""
        wall, margin = self._unlearned_wall, self.deadline.margin
        if deadline is None or margin is None or wall is None or self.overhead.seen:
            return deadline
        ceiling = self.deadline.ceiling if cap is None else min(self.deadline.ceiling, cap)
        return min(ceiling, max(deadline, margin * wall))

    def _slow_silos(self, state: RoundState) -> set[str]:
        """The plan's stragglers (:class:`~fl_lbbsp.core.round.deadline.StragglerWatch`); none
        without balancing (FedAvg's split holds no silo at a floor)."""
        if not self.config.balance:
            return set()
        times = predicted_times(self.balancer, state.shares, self.config.local_steps)
        if times is None:
            return set()
        why = self.balancer.last_allocation
        return self.stragglers.judge(
            times, {silo for silo, (_, reason) in why.items() if reason == "floor"}
        )

    def predicted_round_time(self, state: RoundState) -> float | None:
        """Predicted seconds of the planned round (``None``: nothing predicted yet)."""
        shares = {s: b for s, b in state.shares.items() if s not in state.slow}
        compute = predicted_compute_time(self.balancer, shares, self.config.local_steps)
        return None if compute is None else compute + self.overhead.predict()
