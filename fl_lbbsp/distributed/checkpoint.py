"""Checkpoints of the LB-BSP coordinator: the balancer's state, the sizes in force and the
iteration, to resume after an elastic restart (with the same ranks or another world)."""

from __future__ import annotations

import math
from typing import Any

from ..core.balancer import BatchSizeBalancer
from .cadence import Cadence
from .decision import Decision
from .exchange import Gathering
from .gate import HoldGate, WindowTally

__all__ = ["STATE_VERSION", "Checkpointed"]

STATE_VERSION = 1
"""The version of :meth:`Checkpointed.state_dict`'s layout."""


class Checkpointed:
    """The checkpoint side of :class:`~fl_lbbsp.distributed.coordinator.LBBSPCoordinator`:
    :meth:`state_dict` and :meth:`load_state_dict`."""

    decision: Decision
    gate: HoldGate
    cadence: Cadence
    iteration: int
    rank_ids: tuple[str, ...]
    _world: int
    _sizes: tuple[int, ...]
    _window: WindowTally
    warm_up: int
    _warm_up: int
    _gathering: Gathering | None

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the balancer's, the sizes and the iteration."""
        return {
            "version": STATE_VERSION,
            "balancer": self.decision.balancer.state_dict(),
            "iteration": self.iteration,
            "sizes": list(self._sizes),
            "rank_ids": list(self.rank_ids),
            "every": self.cadence.base,  # k before the backoff, which a resume starts anew
            "total": self.decision.total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (after an elastic restart, say).

        With the same ranks the sizes continue where they were; with another world
        (torchrun restarted fewer or more ranks) the balancer splits the same global
        batch X over the ranks of the new world, those it knows at their predicted speeds.

        Raises
        ------
        ValueError
            On a state of another version, or sizes that cannot feed the ranks.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported coordinator state version {state.get('version')!r}")
        self.decision.balancer = BatchSizeBalancer.from_state_dict(state["balancer"])
        self.iteration = int(state["iteration"])
        self.decision.total = int(state["total"])
        if self.decision.total < self._world:
            raise ValueError(
                f"a global batch of {self.decision.total} cannot feed {self._world} ranks"
            )
        self._window = WindowTally()
        self._warm_up = self.warm_up
        self.gate.reset()
        self._gathering = None
        self.cadence.restart(int(state.get("every", 1)))
        saved = tuple(int(x) for x in state["sizes"])
        if tuple(state["rank_ids"]) == self.rank_ids and sum(saved) == self.decision.total:
            self._sizes = saved
        else:
            self._sizes = self.decision.allocate()
        if any(not math.isfinite(x) or x <= 0 for x in self._sizes):
            raise ValueError(f"invalid batch sizes in the state: {self._sizes}")
