"""The coordinator's collectives and what they carry: one all_gather of the ranks'
windows every k iterations and, should the ranks ever disagree on the sizes in force,
rank 0's state to all; the reports received and the cost of balancing.

A failed collective (a peer died or cannot be reached) raises :class:`RankFailureError`,
naming the rank, the iteration and the backend's error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = ["Exchange", "Overhead", "RankFailureError", "RankReport"]

log = logging.getLogger("fl_lbbsp")

T = TypeVar("T")


class RankFailureError(RuntimeError):
    """A collective of the balancer failed: a peer rank died or cannot be reached.

    The message names this rank, the iteration and the backend's error. Let it end the
    process: ``torchrun --max-restarts N`` then restarts the group, and the job resumes
    from its last checkpoint (:meth:`LBBSPCoordinator.load_state_dict`).
    """


@dataclass(frozen=True)
class RankReport:
    """One rank's figures over the last balancing window, as every rank received them.

    Parameters
    ----------
    batch_size : int
        Its batch size in the window.
    compute_time : float
        Seconds of compute summed over the window's iterations (as reported: emulated
        slowdowns included).
    samples : int
        Samples processed in the window.
    iterations : int
        Iterations in the window.
    """

    batch_size: int
    compute_time: float
    samples: int
    iterations: int


@dataclass(frozen=True)
class Overhead:
    """What balancing costs: the exchange of times and the decision.

    Parameters
    ----------
    seconds : float
        Wall time this rank spent in :meth:`LBBSPCoordinator.step` exchanging times
        (one all_gather) and deciding the sizes, summed; it includes waiting for ranks
        that reached the exchange later.
    cost : float
        The exchanges' own cost, summed: for each, the shortest time any rank spent in it
        (the last rank to arrive waits for nobody), learnt at the next exchange; this
        rank's own time for the latest one.
    rebalances : int
        How many times it ran.
    iterations : int
        Iterations stepped.
    """

    seconds: float
    cost: float
    rebalances: int
    iterations: int

    @property
    def per_rebalance(self) -> float:
        """Mean cost of one exchange in seconds (0 before the first)."""
        return self.cost / self.rebalances if self.rebalances else 0.0

    @property
    def per_iteration(self) -> float:
        """Cost per iteration, amortised over every iteration (0 before the first)."""
        return self.cost / self.iterations if self.iterations else 0.0


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class Exchange:
    """This rank's place in the group and the two collectives the coordinator runs.

    Parameters
    ----------
    group : ProcessGroup | None
        Process group of the ranks; ``None``: the default group.
    device : torch.device | None
        Device of the tensors exchanged; ``None``: the current CUDA device under NCCL,
        else the CPU.

    Notes
    -----
    Without an initialised process group it is a world of one: :meth:`gather` returns
    this rank's row, :meth:`adopt` its own state.
    """

    def __init__(self, *, group: dist.ProcessGroup | None, device: torch.device | None) -> None:
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world = dist.get_world_size(group) if self.distributed else 1
        if device is None:
            nccl = self.distributed and dist.get_backend(group) == "nccl"
            device = (
                torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
            )
        self.device = device

    def _run(self, what: str, iteration: int, call: Callable[[], T]) -> T:
        try:
            return call()
        except RuntimeError as err:
            message = (
                f"rank {self.rank}: the {what} of iteration {iteration} failed, a peer "
                f"rank is gone or unreachable ({' '.join(str(err).split())[:300]}); exiting "
                "so that torchrun --max-restarts restarts the group from the last checkpoint"
            )
            log.error(message)
            raise RankFailureError(message) from err

    def gather(self, row: list[float], *, iteration: int) -> list[list[float]]:
        """Every rank's row (float64, the same length on every rank), in rank order.

        Raises
        ------
        RankFailureError
            When a peer rank is gone.
        """
        if not self.distributed:
            return [row]
        mine = torch.tensor(row, dtype=torch.float64, device=self.device)
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        self._run(
            "exchange of compute times",
            iteration,
            lambda: dist.all_gather(parts, mine, group=self.group),
        )
        return torch.stack(parts).cpu().tolist()

    def adopt(self, state: dict[str, Any], *, iteration: int) -> dict[str, Any]:
        """Rank 0's ``state`` on every rank (a picklable object, broadcast).

        Raises
        ------
        RankFailureError
            When a peer rank is gone.
        """
        if not self.distributed:
            return state
        holder: list[Any] = [state]
        source = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        self._run(
            "broadcast of rank 0's balancer",
            iteration,
            lambda: dist.broadcast_object_list(
                holder, src=source, group=self.group, device=self.device
            ),
        )
        result: dict[str, Any] = holder[0]
        return result
