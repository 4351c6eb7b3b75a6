"""A rank's compute time: from the start of its iteration to its last gradient.

The end is the moment the rank's last parameter gradient is accumulated (a hook on every
parameter, :meth:`ComputeClock.attach`), before DDP waits for the all-reduce of slower
peers: what the balancer needs is this rank's own work, not the iteration's wall time.

The wall clock (``perf_counter``) is all a mark reads by default. The process's CPU clock
(``process_time``, for emulating slower machines) is read only when asked for
(``cpu=True``): it sums every thread of the process, and in a rank whose backend threads
are busy one read can take milliseconds (measured on a 2-core VM under load: a median of
1 us, a tenth of the reads in a backward over 1 ms). Even then a mark reads it only
where it can be the iteration's last (from the fewest marks any iteration has had on),
not once per parameter.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ComputeClock"]


class ComputeClock:
    """Wall (and, with ``cpu=True``, CPU) seconds from :meth:`begin` to the last
    :meth:`mark`.

    Parameters
    ----------
    cpu : bool (default: False)
        Also read the process's CPU clock (:meth:`cpu`); ``False``: :meth:`cpu` is
        ``None`` and the CPU clock is never read.
    """

    def __init__(self, *, cpu: bool = False) -> None:
        self.measures_cpu = bool(cpu)
        self._began: float | None = None
        self._computed: float | None = None
        self._began_cpu: float | None = None
        self._computed_cpu: float | None = None
        self._handles: list[RemovableHandle] = []
        self._marks = 0  # marks since the last begin
        self._fewest: int | None = None  # the fewest marks an iteration has had

    def begin(self) -> None:
        """Start an iteration's clock (and forget the last end)."""
        if self._marks and (self._fewest is None or self._marks < self._fewest):
            self._fewest = self._marks
        self._marks = 0
        self._computed = None
        self._computed_cpu = None
        self._began_cpu = time.process_time() if self.measures_cpu else None
        self._began = time.perf_counter()

    def mark(self) -> None:
        """Mark the end of local compute so far (the last call of an iteration counts).

        With ``cpu=True`` the CPU clock is read from the n-th mark of the iteration on, n
        the fewest marks an iteration has had (every mark until one iteration is done):
        the last mark of an iteration is one of those unless it has fewer marks than any
        iteration before it (its :meth:`cpu` is then ``None``)."""
        self._computed = time.perf_counter()
        self._marks += 1
        if self.measures_cpu and (self._fewest is None or self._marks >= self._fewest):
            self._computed_cpu = time.process_time()

    def stop(self) -> None:
        """End the iteration: :attr:`began_at` is ``None`` until the next :meth:`begin`."""
        self._began = None

    def attach(self, module: nn.Module) -> None:
        """Call :meth:`mark` whenever a gradient of ``module``'s parameters is accumulated
        (the last one ends the rank's backward, before DDP's wait for its peers)."""

        def marked(_: torch.Tensor) -> None:
            self.mark()

        self._fewest = None
        for parameter in module.parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_post_accumulate_grad_hook(marked))

    def detach(self) -> None:
        """Remove the hooks of :meth:`attach`."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._fewest = None

    @property
    def began_at(self) -> float | None:
        """``time.perf_counter()`` at the last :meth:`begin` (``None`` after :meth:`stop`)."""
        return self._began

    def wall(self) -> float | None:
        """Seconds from :meth:`begin` to the last :meth:`mark`, ``None`` if unknown."""
        if self._began is None or self._computed is None:
            return None
        return self._computed - self._began

    def cpu(self) -> float | None:
        """CPU seconds of this process from :meth:`begin` to the last :meth:`mark`
        (``None`` if unknown, or without ``cpu=True``)."""
        if self._began_cpu is None or self._computed_cpu is None:
            return None
        return self._computed_cpu - self._began_cpu
