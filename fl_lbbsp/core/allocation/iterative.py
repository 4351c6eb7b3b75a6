"""Iterative leader/straggler batch-size tuning (Alg. 2), for workers whose time is not
proportional to their batch (GPUs: launch overhead, saturation, memory limit).

After every iteration the *leader* (the fastest worker with memory use at most
``memory_limit`` percent and room under its batch cap) and the *straggler* (the slowest)
are picked from the last iteration's times. If the leader finished before the straggler
in each of the last ``window`` iterations, ``step`` samples move from the straggler to
the leader; otherwise, if the leader was ever slower than the straggler in the recorded
history (an oscillation: a former leader is now the straggler or the reverse), the
*fine-tune* phase starts: step 1, window 20. The total never changes. A straggler whose
batch is at or below the step cannot give any more: the warning names it (the paper's
advice: remove it, the cluster is faster without it).

One addition of ours, ``refast_ratio``: in the fine-tune phase, when the straggler has
been at least that many times slower than the leader over a whole fine window (a
worker's capacity changed), the fast phase starts again, so a new equilibrium is
reached in tens of iterations rather than one sample per iteration.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.3.2, Alg. 2.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from ..silo.state import MAX_BATCH_SIZE, MAX_ENTRIES
from .allocators import Allocator, Decision, Problem, proportional, register, split_equally

__all__ = ["Iterative", "IterativeAllocator"]

log = logging.getLogger("fl_lbbsp")


@register
class Iterative(Allocator):
    """Alg. 2, the iterative leader/straggler tuning (:class:`IterativeAllocator`; cluster
    mode): one step per round of fresh reports from every silo, from a split
    proportional to the predicted speeds.

    Reference: Chen et al., IEEE TCC 2021, Sec. 3.3.2, Alg. 2.
    """

    name = "iterative"
    step: int = Field(default=5, ge=1, le=MAX_BATCH_SIZE, strict=True)
    """Samples moved per iteration in the fast-approach phase (Delta)."""
    window: int = Field(default=5, ge=1, le=MAX_ENTRIES, strict=True)
    """Observation window D of the fast-approach phase."""
    fine_step: int = Field(default=1, ge=1, le=MAX_BATCH_SIZE, strict=True)
    """Step of the fine-tune phase."""
    fine_window: int = Field(default=20, ge=1, le=MAX_ENTRIES, strict=True)
    """Observation window of the fine-tune phase."""
    memory_limit: float = Field(default=95.0, gt=0, le=100)
    """A worker using more memory than this (percent) is never the leader."""
    refast_ratio: float | None = Field(default=1.5, gt=1, allow_inf_nan=False)
    """Back to the fast phase when the straggler/leader time ratio stayed at or above this
    over a whole fine window; ``None`` keeps the fine phase for good (the paper's Alg. 2
    exactly)."""

    def allocate(self, problem: Problem) -> Decision:
        """One step of Alg. 2 per round of fresh reports from every silo (reason
        ``iterative``), restarting from a split proportional to the predicted speeds when
        silos join or leave; the equal split before any report (``no-report``)."""
        ids, bounds, table = problem.ids, problem.bounds, problem.table
        speeds = table.speeds(ids)
        if speeds is None:
            return Decision.of(ids, split_equally(bounds), "no-report")
        alg: IterativeAllocator = problem.state
        counts = table.report_counts(ids)
        if set(ids) != set(alg.sizes) or not all(counts.get(i, 0) > 0 for i in ids):
            # First round, or silos joined or left: restart from a proportional split.
            start = proportional(speeds, bounds.total, lower=bounds.lower, upper=bounds.upper)
            alg.reset(dict(zip(ids, (int(x) for x in start), strict=True)))
            alg.stepped = counts
        # A silo restarted since its last report has no time to step on: hold the sizes.
        elif all(counts[i] > alg.stepped.get(i, 0) for i in ids) and all(
            n > 0 for n in table.window_sizes(ids).values()
        ):
            alg.update(
                table.newest(ids, "time"),
                memory=table.newest(ids, "memory_percent"),
                upper=dict(zip(ids, bounds.upper.tolist(), strict=True)),
                lower=dict(zip(ids, bounds.lower.tolist(), strict=True)),
            )
            alg.stepped = counts
        return Decision.of(ids, np.array([alg.sizes[i] for i in ids], dtype=np.int64), "iterative")

    def start(self) -> IterativeAllocator:
        """The state machine at the start."""
        return IterativeAllocator(**self.model_dump())

    def save(self, state: Any) -> dict[str, Any]:
        """The state machine and each silo's report count at its last step."""
        return {"allocator": state.state(), "stepped": dict(state.stepped)}

    def load(self, saved: dict[str, Any]) -> IterativeAllocator:
        """The state of a :meth:`save`."""
        alg = IterativeAllocator.from_state(saved["allocator"])
        alg.stepped = {str(k): int(v) for k, v in saved["stepped"].items()}
        return alg


class IterativeAllocator:
    """State machine of Alg. 2 over named workers.

    Parameters
    ----------
    **options
        The fields of :class:`Iterative` (``step``, ``window``, ``fine_step``,
        ``fine_window``, ``memory_limit``, ``refast_ratio``), each at its default unless
        given.

    Raises
    ------
    ValueError
        On an option out of its range or unknown (the message names it).
    """

    def __init__(self, **options: Any) -> None:
        self.settings = Iterative(**options)
        self.phase = "fast"
        self.sizes: dict[str, int] = {}
        window = max(self.settings.window, self.settings.fine_window)
        self._times: deque[dict[str, float]] = deque(maxlen=window)
        self.removable: str | None = None
        self.stepped: dict[str, int] = {}
        """Each worker's report count at the last step (kept by :class:`Iterative`)."""

    @property
    def step(self) -> int:
        """Current step size Delta."""
        return self.settings.step if self.phase == "fast" else self.settings.fine_step

    @property
    def window(self) -> int:
        """Current observation window D."""
        return self.settings.window if self.phase == "fast" else self.settings.fine_window

    def reset(self, sizes: Mapping[str, int]) -> None:
        """Start from ``sizes`` (workers joined or left): forget the times, keep the phase."""
        self.sizes = {k: int(v) for k, v in sizes.items()}
        self._times.clear()
        self.removable = None

    def update(
        self,
        times: Mapping[str, float],
        *,
        memory: Mapping[str, float | None] | None = None,
        upper: Mapping[str, float] | None = None,
        lower: Mapping[str, float] | None = None,
    ) -> dict[str, int]:
        """One step of Alg. 2 after an iteration with the current :attr:`sizes`.

        Parameters
        ----------
        times : mapping of str to float
            Each worker's batch processing time in the iteration just finished.
        memory : mapping of str to float | None | None (default: None)
            Each worker's memory use in percent (``None``: unknown, eligible as leader).
        upper, lower : mapping of str to float | None (default: None)
            Per-worker batch-size bounds (memory cap, minimum); a worker at its cap is
            never the leader, and no move takes a worker below its minimum.

        Returns
        -------
        dict of str to int
            The batch sizes of the next iteration (same total).
        """
        if set(times) != set(self.sizes):
            raise ValueError(
                f"times are for {sorted(times)} but the allocation is for {sorted(self.sizes)}"
            )
        self._times.append({k: float(v) for k, v in times.items()})
        memory = memory or {}
        upper = upper or {}
        lower = lower or {}
        step = self.step
        eligible = [
            w
            for w in self.sizes
            if (memory.get(w) is None or float(memory[w]) <= self.settings.memory_limit)  # type: ignore[arg-type]
            and self.sizes[w] + step <= upper.get(w, math.inf)
        ]
        straggler = max(self.sizes, key=lambda w: (times[w], w))
        if not eligible:
            return dict(self.sizes)
        leader = min(eligible, key=lambda w: (times[w], w))
        if leader == straggler:
            return dict(self.sizes)
        if self.sizes[straggler] <= step or self.sizes[straggler] - step < lower.get(straggler, 1):
            if self.removable != straggler:
                log.warning(
                    "worker %s is the straggler with batch size %d <= step %d: it cannot give "
                    "more samples; the cluster would be faster without it (remove it)",
                    straggler,
                    self.sizes[straggler],
                    step,
                )
            self.removable = straggler
            return dict(self.sizes)
        self.removable = None
        recent = list(self._times)[-self.window :]
        if len(recent) >= self.window and all(
            t[leader] < t[straggler] for t in recent if leader in t and straggler in t
        ):
            ratio = self.settings.refast_ratio
            if (
                self.phase == "fine"
                and ratio is not None
                and all(t[straggler] >= ratio * t[leader] for t in recent)
            ):
                self.phase = "fast"
                step = self.step
            self.sizes[leader] += step
            self.sizes[straggler] -= step
        elif self.phase == "fast" and any(
            t[leader] > t[straggler] for t in self._times if leader in t and straggler in t
        ):
            self.phase = "fine"
        return dict(self.sizes)

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state."""
        return {
            "config": self.settings.model_dump(),
            "phase": self.phase,
            "sizes": dict(self.sizes),
            "times": [dict(t) for t in self._times],
            "removable": self.removable,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> IterativeAllocator:
        """Rebuild from :meth:`state`."""
        allocator = cls(**state["config"])
        allocator.phase = str(state["phase"])
        allocator.sizes = {str(k): int(v) for k, v in state["sizes"].items()}
        allocator._times.extend({str(k): float(v) for k, v in t.items()} for t in state["times"])
        removable = state.get("removable")
        allocator.removable = None if removable is None else str(removable)
        return allocator
