"""The plan side of LB-BSP on torch.distributed: what this rank runs in an iteration, how
its compute is timed and how its gradient is weighted.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021: Sec. 3.1 (per-worker batch sizes) and Sec. 3.4 (weighted
gradient aggregation, g = sum_i B_i g_i / X, equal to the gradient of the global batch).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .clock import ComputeClock

__all__ = ["RankPlan"]


class RankPlan:
    """What this rank runs in an iteration, how its compute is timed and its gradient
    weighted: the plan side of :class:`~fl_lbbsp.distributed.coordinator.LBBSPCoordinator`,
    which decides the sizes.

    Notes
    -----
    Call :meth:`begin` before drawing an iteration's batch and :meth:`step` after the
    optimiser step. The compute time of a rank is measured from :meth:`begin` to the
    moment its last parameter gradient is accumulated (:meth:`register`), its last
    gradient bucket is ready (the communication hook) or it calls
    :meth:`all_reduce_gradients`: the wait for slower peers is not in it. Without a
    process group (a single process) it runs as a world of one.
    """

    group: dist.ProcessGroup | None
    _rank: int
    _world: int
    _sizes: tuple[int, ...]
    _clock: ComputeClock
    _comm_hook: bool

    # ---------------------------------------------------------------- the plan
    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._world

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every rank's batch size of the current iteration, in rank order."""
        return self._sizes

    @property
    def batch_size(self) -> int:
        """This rank's batch size B_rank of the current iteration."""
        return self._sizes[self._rank]

    @property
    def offset(self) -> int:
        """Where this rank's slice starts in the iteration's global batch."""
        return sum(self._sizes[: self._rank])

    @property
    def weight(self) -> float:
        """B_rank / X: this rank's weight in the gradient aggregate (the weights sum to 1)."""
        return self.batch_size / sum(self._sizes)

    @property
    def loss_scale(self) -> float:
        """n B_rank / X: the factor on this rank's mean loss that turns DDP's mean of the
        ranks' gradients into their batch-size-weighted mean (exactly 1 on equal sizes)."""
        return self._world * self.batch_size / sum(self._sizes)

    # ----------------------------------------------------------------- timing
    def begin(self, *, samples: int | None = None) -> None:
        """Mark the start of an iteration's compute (before its batch is drawn).

        Parameters
        ----------
        samples : int | None (default: None)
            Samples of the batch about to be computed, if already known.

        Raises
        ------
        ValueError
            When ``samples`` is not this rank's batch size (a loader that drew ahead of
            the plan).
        """
        if samples is not None and samples != self.batch_size:
            raise ValueError(
                f"rank {self._rank}: a batch of {samples} samples, but the plan gives "
                f"{self.batch_size} (did the loader draw ahead? use num_workers=0)"
            )
        self._clock.begin()

    def mark_computed(self) -> None:
        """Mark the end of this rank's local compute (the hooks call it per gradient or
        bucket; the last call counts)."""
        self._clock.mark()

    def compute_time(self) -> float | None:
        """Seconds from :meth:`begin` to the end of local compute, ``None`` if unknown."""
        return self._clock.wall()

    def compute_cpu_time(self) -> float | None:
        """CPU seconds this process used from :meth:`begin` to the end of local compute
        (``None`` if unknown, and unless the coordinator was made with ``cpu_time=True``):
        without the waits for a core, the rank's own work where ranks share a host's
        cores, to scale when emulating a slower machine
        (:func:`~fl_lbbsp.clients.emulation.emulated_time`); not for real heterogeneity."""
        return self._clock.cpu()

    @property
    def began_at(self) -> float | None:
        """``time.perf_counter()`` at the last :meth:`begin` (``None`` before it, or after
        :meth:`step`)."""
        return self._clock.began_at

    # ----------------------------------------------------------- aggregation
    def register(
        self, model: DistributedDataParallel, *, comm_hook: bool = False
    ) -> DistributedDataParallel:
        """Measure this rank's compute on a DDP model and return the model.

        Default: a hook on every parameter marks the end of local compute (its last
        gradient accumulated, before DDP waits for its peers); DDP keeps its own
        all-reduce, and :meth:`scale_loss` weights the gradient. ``comm_hook=True``:
        :func:`~fl_lbbsp.distributed.hooks.weighted_allreduce_hook` instead, a Python
        communication hook that scales each bucket by B_rank / X before an all-reduce
        sum and marks the end of compute (for a loss that cannot be scaled; slower than
        DDP's built-in all-reduce); :meth:`scale_loss` then leaves the loss as it is.
        The model registered last is the one timed.
        """
        self._clock.detach()
        if comm_hook:
            from .hooks import weighted_allreduce_hook

            model.register_comm_hook(self, weighted_allreduce_hook)
        else:
            self._clock.attach(model)
        self._comm_hook = comm_hook
        return model

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times :attr:`loss_scale` (n B_rank / X), to call before ``backward``:
        DDP's all-reduce then averages ``n B_r / X g_r`` into ``sum_r B_r / X g_r``, the
        global batch's gradient (Sec. 3.4). The loss itself while the sizes are equal, or
        when a communication hook weights the gradient."""
        scale = self.loss_scale
        return loss if scale == 1.0 or self._comm_hook else loss * scale

    def all_reduce_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Weighted all-reduce of the gradients of ``parameters`` in place, for a model
        not wrapped in DDP (and a loss not scaled): grad <- sum_r (B_r / X) grad_r
        (Sec. 3.4). Marks the end of local compute first."""
        from .hooks import weighted_all_reduce_

        self.mark_computed()
        weighted_all_reduce_(parameters, weight=self.weight, group=self.group)
