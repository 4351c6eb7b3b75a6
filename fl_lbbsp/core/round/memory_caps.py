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
from typing import Any

__all__ = ["MemoryCaps"]

log = logging.getLogger(__name__)


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

    def state_dict(self) -> dict[str, Any]:
        """The caps and completed sizes (JSON values)."""
        return {"caps": dict(self.caps), "completed": dict(self.completed)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (an empty mapping: nothing learned).

        Raises
        ------
        ValueError
            On a cap or size that is not a positive integer.
        """
        loaded = []
        for name in ("caps", "completed"):
            table = {str(s): v for s, v in dict(state.get(name, {})).items()}
            bad = {s: v for s, v in table.items() if type(v) is not int or v < 1}
            if bad:
                raise ValueError(f"memory caps: {name} must be positive integers, got {bad}")
            loaded.append(table)
        self.caps, self.completed = loaded
