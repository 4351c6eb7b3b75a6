"""Weighted gradient aggregation on torch.distributed: a DDP communication hook and an
explicit all-reduce.

Rank r computes the gradient g_r of the mean loss over its B_r samples; the aggregate
``g = sum_r (B_r / X) g_r`` with ``X = sum_r B_r`` is the gradient of the mean loss over
the whole global batch, whatever the split. DDP's default hook computes the plain mean
``sum_r g_r / n``, which over-weights the small batches when the sizes differ.

Reference: Chen et al., "Accelerating Distributed Learning in Non-Dedicated
Environments", IEEE TCC 2021, Sec. 3.4 (weighted gradient aggregation, Eq. 6).
"""

# No "from __future__ import annotations": DDP checks the hook's annotations at runtime
# (the bucket must be annotated GradBucket, the result Future[Tensor]).
from collections.abc import Iterable
from typing import Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

__all__ = ["WeightedHookState", "weighted_all_reduce_", "weighted_allreduce_hook"]


class WeightedHookState(Protocol):
    """What the hook needs from its state (an :class:`LBBSPCoordinator` provides it)."""

    group: dist.ProcessGroup | None

    @property
    def weight(self) -> float:
        """B_rank / X of the batch whose gradient is being reduced."""
        ...

    def mark_computed(self) -> None:
        """Called as each bucket is ready; the last call ends the rank's local compute."""
        ...


def weighted_allreduce_hook(
    state: WeightedHookState, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: scale the bucket by B_rank / X, then all-reduce (sum).

    Register it with ``ddp_model.register_comm_hook(coordinator, weighted_allreduce_hook)``
    (or ``coordinator.register(ddp_model)``). Works with gloo and NCCL.

    Parameters
    ----------
    state : WeightedHookState
        The coordinator: its current :attr:`weight` and the process group.
    bucket : torch.distributed.GradBucket
        DDP's flattened gradient bucket.
    """
    state.mark_computed()
    tensor = bucket.buffer()
    tensor.mul_(state.weight)
    work = dist.all_reduce(tensor, group=state.group, async_op=True)
    assert work is not None
    future: torch.futures.Future[list[torch.Tensor]] = work.get_future()
    return future.then(lambda done: done.value()[0])


def weighted_all_reduce_(
    parameters: Iterable[torch.Tensor],
    *,
    weight: float,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Replace each parameter's gradient by ``sum_r weight_r grad_r`` over the ranks, in
    place, in one flattened all-reduce (for models not wrapped in DDP).

    Parameters
    ----------
    parameters : iterable of Tensor
        The parameters; those without a gradient are skipped (on every rank alike).
    weight : float
        This rank's B_rank / X.
    group : ProcessGroup | None (default: None)
        Process group; ``None``: the default group.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads]).mul_(weight)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flat, group=group)
    start = 0
    for g in grads:
        count = g.numel()
        g.copy_(flat[start : start + count].view_as(g))
        start += count
