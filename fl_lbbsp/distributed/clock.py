"""A rank's compute time: from the start of its iteration to its last gradient.

The end is the moment the rank's last parameter gradient is accumulated (a hook on every
parameter, :meth:`ComputeClock.attach`), before DDP waits for the all-reduce of slower
peers: what the balancer needs is this rank's own work, not the iteration's wall time.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ComputeClock"]


class ComputeClock:
    """Wall and CPU seconds from :meth:`begin` to the last :meth:`mark`."""

    def __init__(self) -> None:
        self._began: float | None = None
        self._computed: float | None = None
        self._began_cpu: float | None = None
        self._computed_cpu: float | None = None
        self._handles: list[RemovableHandle] = []

    def begin(self) -> None:
        """Start an iteration's clock (and forget the last end)."""
        self._computed = None
        self._computed_cpu = None
        self._began_cpu = time.process_time()
        self._began = time.perf_counter()

    def mark(self) -> None:
        """Mark the end of local compute so far (the last call of an iteration counts)."""
        self._computed = time.perf_counter()
        self._computed_cpu = time.process_time()

    def stop(self) -> None:
        """End the iteration: :attr:`began_at` is ``None`` until the next :meth:`begin`."""
        self._began = None

    def attach(self, module: nn.Module) -> None:
        """Call :meth:`mark` whenever a gradient of ``module``'s parameters is accumulated
        (the last one ends the rank's backward, before DDP's wait for its peers)."""

        def marked(_: torch.Tensor) -> None:
            self.mark()

        for parameter in module.parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_post_accumulate_grad_hook(marked))

    def detach(self) -> None:
        """Remove the hooks of :meth:`attach`."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @property
    def attached(self) -> bool:
        """Whether :meth:`attach` hooks are installed."""
        return bool(self._handles)

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
        """CPU seconds of this process from :meth:`begin` to the last :meth:`mark`."""
        if self._began_cpu is None or self._computed_cpu is None:
            return None
        return self._computed_cpu - self._began_cpu
