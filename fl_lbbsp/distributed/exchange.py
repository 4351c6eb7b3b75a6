"""The coordinator's collectives and what they carry: one all_gather of the ranks'
windows every k iterations and, should the ranks ever disagree on the sizes in force,
rank 0's state to all; the reports received and the cost of balancing.

A failed collective (a peer died or cannot be reached) raises :class:`RankFailureError`,
naming the rank, the iteration and the backend's error.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "Exchange",
    "Gathering",
    "Overhead",
    "RankFailureError",
    "RankReport",
    "Row",
    "fingerprint",
]

log = logging.getLogger("fl_lbbsp")

T = TypeVar("T")


class Row(IntEnum):
    """The fields of the row each rank sends in the exchange, by index."""

    TIME = 0  # seconds of compute summed over the window
    SAMPLES = 1  # samples of the window
    SIZE = 2  # the batch size in force
    COUNT = 3  # iterations of the window
    EXCHANGE = 4  # seconds this rank spent in the last exchange
    WALL = 5  # wall seconds of the window
    SQUARE = 6  # sum of the squared per-iteration seconds
    PRINT = 7  # checksum of the sizes in force and k (fingerprint)


def fingerprint(sizes: Sequence[int], every: int) -> float:
    """A 32-bit checksum of the sizes in force and k (exact in a float64), sent with the
    times so that the ranks check they decided alike."""
    return float(zlib.crc32(struct.pack(f"<{len(sizes) + 1}q", *sizes, every)))


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


class Gathering:
    """An all_gather under way (:meth:`Exchange.start`); :meth:`rows` waits for it."""

    def __init__(
        self, exchange: Exchange, work: Any, parts: list[torch.Tensor], iteration: int
    ) -> None:
        self._exchange = exchange
        self._work = work
        self._parts = parts
        self.iteration = iteration

    def rows(self) -> list[list[float]]:
        """Every rank's row, in rank order, once the gather is done.

        Raises
        ------
        RankFailureError
            When a peer rank is gone.
        """
        if self._work is not None:
            work, self._work = self._work, None
            self._exchange.call("exchange of compute times", self.iteration, work.wait)
        rows: list[list[float]] = torch.stack(self._parts).cpu().tolist()
        return rows


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

    def call(self, what: str, iteration: int, collective: Callable[[], T]) -> T:
        """Run ``collective``; a RuntimeError (a peer rank gone) becomes a
        :class:`RankFailureError` naming this rank, ``what`` and the iteration.

        Raises
        ------
        RankFailureError
            When the collective fails.
        """
        try:
            return collective()
        except RuntimeError as err:
            message = (
                f"rank {self.rank}: the {what} of iteration {iteration} failed, a peer "
                f"rank is gone or unreachable ({' '.join(str(err).split())[:300]}); exiting "
                "so that torchrun --max-restarts restarts the group from the last checkpoint"
            )
            log.error(message)
            raise RankFailureError(message) from err

    def start(self, row: list[float], *, iteration: int) -> Gathering:
        """Start gathering every rank's row (float64, the same length on every rank) in the
        background; :meth:`Gathering.rows` waits for it.

        Raises
        ------
        RankFailureError
            When a peer rank is gone.
        """
        mine = torch.tensor(row, dtype=torch.float64, device=self.device)
        if not self.distributed:
            return Gathering(self, None, [mine], iteration)
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        work = self.call(
            "exchange of compute times",
            iteration,
            lambda: dist.all_gather(parts, mine, group=self.group, async_op=True),
        )
        return Gathering(self, work, parts, iteration)

    def gather(self, row: list[float], *, iteration: int) -> list[list[float]]:
        """Every rank's row, in rank order, at once (:meth:`start` and wait).

        Raises
        ------
        RankFailureError
            When a peer rank is gone.
        """
        return self.start(row, iteration=iteration).rows()

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
        self.call(
            "broadcast of rank 0's balancer",
            iteration,
            lambda: dist.broadcast_object_list(
                holder, src=source, group=self.group, device=self.device
            ),
        )
        result: dict[str, Any] = holder[0]
        return result
