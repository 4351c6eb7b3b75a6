"""Memory caps learned from silos that ran out of memory.

A silo that cannot hold the batch size it was sent fails its round with an error reply
that names the size (:class:`~fl_lbbsp.contract.BatchSizeOutOfMemoryError`). Sending the
same size again would fail again, round after round, and the silo would be shut out of
the run. The server instead caps that silo from the next round on, at a size known to
fit: the largest batch size it has completed a round with below the one that failed
(memory grows with the batch size, so that size fits again); when it has completed none,
half the size that failed, so that a silo failing from its first round is at a fitting
size after a few halvings. The cap only falls: a silo's memory does not grow back during a
run. It joins the memory cap a silo may report itself (``max-batch-size``) as an upper
bound of the allocation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..balancer_state import MAX_SILOS, SiloId
from ..silo.state import Batch

__all__ = ["MemoryCaps", "MemoryState"]

log = logging.getLogger(__name__)


class MemoryState(BaseModel):
    """The learned caps (:meth:`MemoryCaps.state_dict`, a checkpoint's).

    Parameters
    ----------
    caps : dict of str to int (default: {})
        Silo id -> its learned cap (a batch size).
    completed : dict of str to int (default: {})
        Silo id -> the largest batch size it completed a round with.
    """

    model_config = ConfigDict(extra="forbid")

    caps: dict[SiloId, Batch] = Field(default_factory=dict, max_length=MAX_SILOS)
    completed: dict[SiloId, Batch] = Field(default_factory=dict, max_length=MAX_SILOS)


class MemoryCaps:
    """Per-silo batch-size caps learned from out-of-memory failures."""

    def __init__(self) -> None:
        self.caps: dict[str, int] = {}
        """The learned cap of each silo that has run out of memory."""
        self.completed: dict[str, int] = {}
        """The largest batch size each silo has completed a round with."""

    def ran(self, silo: str, batch_size: int) -> None:
        """Note that ``silo`` completed a round at ``batch_size``."""
        if batch_size > self.completed.get(silo, 0):
            self.completed[silo] = int(batch_size)

    def failed(self, silo: str, batch_size: int) -> int:
        """Note that ``silo`` ran out of memory at ``batch_size``; return its cap (see the
        module): the largest completed size below ``batch_size``, else half of it (at
        least 1), never above a cap learned before."""
        done = self.completed.get(silo, 0)
        cap = done if 0 < done < batch_size else max(1, batch_size // 2)
        cap = min(cap, self.caps.get(silo, cap))
        self.caps[silo] = cap
        log.warning(
            "silo %s ran out of memory at batch size %d: capped at %d from the next round",
            silo, batch_size, cap,
        )  # fmt: skip
        return cap

    def state_dict(self) -> MemoryState:
        """The caps and completed sizes."""
        return MemoryState(caps=dict(self.caps), completed=dict(self.completed))

    def load_state_dict(self, state: MemoryState | Mapping[str, object]) -> None:
        """Restore :meth:`state_dict` (a mapping is validated as a :class:`MemoryState`).

        Raises
        ------
        pydantic.ValidationError
            On a cap or size that is not a positive integer.
        """
        state = MemoryState.model_validate(state)
        self.caps, self.completed = dict(state.caps), dict(state.completed)
